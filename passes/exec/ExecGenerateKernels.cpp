//===- ExecGenerateKernels.cpp - exec-generate-kernels --------------------===//
//
// Marks the step for generated kernels and applies the fusions of
// passes/analysis/KernelFusion.h: residual add + RMSNorm pairs
// (train.add_rms_norm), RMSNorm backward + residual add pairs
// (train.rms_norm_grad_add), then the chains of adds forming an RMSNorm
// backward's dy (train.rms_norm_grad_sum, or the addends of the _add call).
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
      if (!fuse && !fuseNormGradAdd && !fuseDySum)
        continue;
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
      int64_t pairs = 0, savedBytes = 0;
      if (fuse) {
        ap::AddNormFusion fusion(step);
        numRejected += fusion.rejected();
        for (ap::AddNormFusion::Pair p : fusion.pairs()) {
          b.setInsertionPoint(p.norm);
          Value ins[] = {p.add.getInputs()[0], p.add.getInputs()[1],
                         p.norm.getInputs()[1]};
          Value outs[] = {p.add.getOutputs()[0], p.norm.getOutputs()[0],
                          p.norm.getOutputs()[1]};
          auto fused = KernelOp::create(b, p.norm.getLoc(),
                                        "train.add_rms_norm", ValueRange(ins),
                                        ValueRange(outs), /*workspace=*/0,
                                        p.norm.getArgs(), p.norm.getStream());
          replacedBy[p.add] = fused;
          replacedBy[p.norm] = fused;
          p.norm.erase();
          p.add.erase();
          ++numFused;
        }
        pairs = int64_t(fusion.pairs().size());
        savedBytes = fusion.savedBytes();
      }
      int64_t gradPairs = 0, gradSavedBytes = 0;
      if (fuseNormGradAdd) {
        ap::NormGradAddFusion fusion(step);
        for (ap::NormGradAddFusion::Pair p : fusion.pairs()) {
          // At the add: the norm's inputs and the other addend are all
          // written before the norm.
          b.setInsertionPoint(p.add);
          SmallVector<Value> ins(p.norm.getInputs().begin(),
                                 p.norm.getInputs().end());
          ins.push_back(p.other);
          SmallVector<Value> outs{p.add.getOutputs()[0]};
          outs.append(std::next(p.norm.getOutputs().begin()),
                      p.norm.getOutputs().end());
          Value dx = p.norm.getOutputs()[0];
          auto fused = KernelOp::create(
              b, p.add.getLoc(), "train.rms_norm_grad_add", ValueRange(ins),
              ValueRange(outs), p.norm.getWorkspace(), p.norm.getArgs(),
              p.norm.getStream());
          replacedBy[p.add] = fused;
          replacedBy[p.norm] = fused;
          p.norm.erase();
          p.add.erase();
          // dx is gone: its buffer declaration too.
          if (dx.use_empty())
            if (auto buf = dx.getDefiningOp<BufferOp>())
              buf.erase();
          ++numFusedGradAdd;
        }
        gradPairs = int64_t(fusion.pairs().size());
        gradSavedBytes = fusion.savedBytes();
      }
      int64_t sumChains = 0, sumAdds = 0, sumSavedBytes = 0;
      if (fuseDySum) {
        // After the pairs above: a backward they fused with its residual add
        // takes the chain too (one kernel from the addends of dy to the
        // residual stream's gradient).
        ap::DySumFusion fusion(step);
        for (const ap::DySumFusion::Pair &c : fusion.pairs()) {
          KernelOp norm = c.norm;
          bool withAdd = norm.getCallee() == "train.rms_norm_grad_add";
          b.setInsertionPoint(norm);
          // x, w, rstd, dy's addends, then (with the residual add) the
          // other addend.
          SmallVector<Value> ins(norm.getInputs().begin(),
                                 norm.getInputs().begin() + 3);
          ins.append(c.addends.begin(), c.addends.end());
          if (withAdd)
            ins.push_back(norm.getInputs().back());
          auto fused = KernelOp::create(
              b, norm.getLoc(),
              withAdd ? "train.rms_norm_grad_add" : "train.rms_norm_grad_sum",
              ValueRange(ins), norm.getOutputs(), norm.getWorkspace(),
              norm.getArgs(), norm.getStream());
          // Whatever the norm stood for (an earlier fusion's kernels) now
          // runs in the new kernel.
          for (auto &entry : replacedBy)
            if (entry.second == norm.getOperation())
              entry.second = fused;
          replacedBy[norm] = fused;
          SmallVector<Value, 3> sums;
          for (KernelOp add : c.adds) {
            replacedBy[add] = fused;
            sums.push_back(add.getOutputs()[0]);
          }
          norm.erase();
          for (KernelOp add : llvm::reverse(c.adds))
            add.erase();
          // The sums are gone: their buffer declarations too.
          for (Value sum : sums)
            if (sum.use_empty())
              if (auto buf = sum.getDefiningOp<BufferOp>())
                buf.erase();
          ++numFusedDySum;
        }
        sumChains = int64_t(fusion.pairs().size());
        sumAdds = fusion.adds();
        sumSavedBytes = fusion.savedBytes();
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
      if (fuse) {
        step->setAttr(kFusedAddNormAttr, b.getI64IntegerAttr(pairs));
        step->setAttr(kFusedSavedBytesAttr, b.getI64IntegerAttr(savedBytes));
      }
      if (fuseDySum) {
        step->setAttr(kFusedDySumAttr, b.getI64IntegerAttr(sumChains));
        step->setAttr(kFusedDySumAddsAttr, b.getI64IntegerAttr(sumAdds));
        step->setAttr(kFusedDySumSavedBytesAttr,
                      b.getI64IntegerAttr(sumSavedBytes));
      }
      if (fuseNormGradAdd) {
        step->setAttr(kFusedNormGradAddAttr, b.getI64IntegerAttr(gradPairs));
        step->setAttr(kFusedNormGradSavedBytesAttr,
                      b.getI64IntegerAttr(gradSavedBytes));
      }
    }
  }
};
} // namespace
