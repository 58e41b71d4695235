//===- ExecGenerateKernels.cpp - exec-generate-kernels --------------------===//
//
// Marks the step for generated kernels and applies AddNormFusion: each
// fusable residual add + RMSNorm pair becomes one train.add_rms_norm call.
//
//===----------------------------------------------------------------------===//

#include "dialect/exec/ExecDialect.h"
#include "dialect/exec/ExecOps.h"
#include "passes/Passes.h"
#include "passes/analysis/KernelFusion.h"

#include "mlir/IR/Builders.h"

namespace ap {
#define GEN_PASS_DEF_EXECGENERATEKERNELS
#include "passes/exec/ExecPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::exec;

namespace {
struct ExecGenerateKernelsPass
    : ap::impl::ExecGenerateKernelsBase<ExecGenerateKernelsPass> {
  using Base::Base;

  void runOnOperation() override {
    for (StepOp step : getOperation().getOps<StepOp>()) {
      OpBuilder b(step);
      step->setAttr(kKernelsAttr, b.getStringAttr("generated"));
      if (!ops.empty()) {
        SmallVector<Attribute> names;
        for (const std::string &name : ops)
          names.push_back(b.getStringAttr(name));
        step->setAttr(kGeneratedOpsAttr, b.getArrayAttr(names));
      }
      if (!fuse)
        continue;
      ap::AddNormFusion fusion(step);
      numRejected += fusion.rejected();
      for (ap::AddNormFusion::Pair p : fusion.pairs()) {
        b.setInsertionPoint(p.norm);
        Value ins[] = {p.add.getInputs()[0], p.add.getInputs()[1],
                       p.norm.getInputs()[1]};
        Value outs[] = {p.add.getOutputs()[0], p.norm.getOutputs()[0],
                        p.norm.getOutputs()[1]};
        KernelOp::create(b, p.norm.getLoc(), "train.add_rms_norm",
                         ValueRange(ins), ValueRange(outs),
                         /*workspace=*/0, p.norm.getArgs(), p.norm.getStream());
        p.norm.erase();
        p.add.erase();
        ++numFused;
      }
      step->setAttr(kFusedAddNormAttr,
                    b.getI64IntegerAttr(int64_t(fusion.pairs().size())));
      step->setAttr(kFusedSavedBytesAttr,
                    b.getI64IntegerAttr(fusion.savedBytes()));
    }
  }
};
} // namespace
