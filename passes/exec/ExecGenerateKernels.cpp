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
      // Kernel ordinals of each microbatch loop body before the fusion: a
      // D2H's done_by_kernel names a kernel by its ordinal there.
      SmallVector<std::pair<Block *, SmallVector<Operation *>>> before;
      for (MicrobatchLoopOp loop : step.getBody().getOps<MicrobatchLoopOp>()) {
        Block &body = loop.getBody().front();
        SmallVector<Operation *> kernels;
        for (Operation &op : body)
          if (isa<KernelOp>(op))
            kernels.push_back(&op);
        before.push_back({&body, std::move(kernels)});
      }
      // The fused kernel that replaced each erased add and norm.
      DenseMap<Operation *, Operation *> replacedBy;
      for (ap::AddNormFusion::Pair p : fusion.pairs()) {
        b.setInsertionPoint(p.norm);
        Value ins[] = {p.add.getInputs()[0], p.add.getInputs()[1],
                       p.norm.getInputs()[1]};
        Value outs[] = {p.add.getOutputs()[0], p.norm.getOutputs()[0],
                        p.norm.getOutputs()[1]};
        auto fused = KernelOp::create(b, p.norm.getLoc(), "train.add_rms_norm",
                                      ValueRange(ins), ValueRange(outs),
                                      /*workspace=*/0, p.norm.getArgs(),
                                      p.norm.getStream());
        replacedBy[p.add] = fused;
        replacedBy[p.norm] = fused;
        p.norm.erase();
        p.add.erase();
        ++numFused;
      }
      // Renumber done_by_kernel to name the same kernel (for an erased one,
      // the fused kernel that does its work); without this every later
      // ordinal would name a kernel one further on per fused pair before it,
      // and the memory plan would hold offloaded bytes that much longer.
      for (auto &[body, kernels] : before) {
        DenseMap<Operation *, int64_t> ordinalAfter;
        for (Operation &op : *body)
          if (isa<KernelOp>(op))
            ordinalAfter[&op] = int64_t(ordinalAfter.size());
        for (D2HOp d2h : body->getOps<D2HOp>()) {
          std::optional<uint64_t> k = d2h.getDoneByKernel();
          if (!k || *k >= kernels.size())
            continue;
          Operation *now = replacedBy.lookup(kernels[*k]);
          d2h.setDoneByKernelAttr(b.getI64IntegerAttr(
              ordinalAfter.lookup(now ? now : kernels[*k])));
        }
      }
      step->setAttr(kFusedAddNormAttr,
                    b.getI64IntegerAttr(int64_t(fusion.pairs().size())));
      step->setAttr(kFusedSavedBytesAttr,
                    b.getI64IntegerAttr(fusion.savedBytes()));
    }
  }
};
} // namespace
