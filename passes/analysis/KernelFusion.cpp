//===- KernelFusion.cpp - residual add + RMSNorm pairs --------------------===//
#include "passes/analysis/KernelFusion.h"

#include "dialect/exec/ExecDialect.h"
#include "dialect/exec/KernelSignatures.h"

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;

namespace ap {
namespace {

RankedTensorType tensorOf(Value v) {
  auto b = dyn_cast<exec::BufferType>(v.getType());
  return b ? b.getTensor() : RankedTensorType();
}

/// bf16 and f32: the storage types of the generated kernels.
bool generatedStorage(RankedTensorType t) {
  return t && t.hasStaticShape() &&
         (t.getElementType().isBF16() || t.getElementType().isF32());
}

/// `first` runs right before `second`: same block and stream, nothing but
/// buffer declarations between (no event, copy, view or other kernel).
bool backToBack(exec::KernelOp first, exec::KernelOp second) {
  if (first.getStream() != second.getStream() ||
      first->getBlock() != second->getBlock() ||
      !first->isBeforeInBlock(second))
    return false;
  for (Operation *op = first->getNextNode(); op && op != second.getOperation();
       op = op->getNextNode())
    if (!isa<exec::BufferOp>(op))
      return false;
  return true;
}

/// The pair (add, norm) fuses (KernelFusion.h).
bool fuses(exec::KernelOp add, exec::KernelOp norm) {
  if (add.getInputs().size() != 2 || add.getOutputs().size() != 1 ||
      norm.getInputs().size() != 2 || norm.getOutputs().size() != 2)
    return false;
  Value h = add.getOutputs()[0];
  if (norm.getInputs()[0] != h || !backToBack(add, norm))
    return false;
  RankedTensorType th = tensorOf(h), tw = tensorOf(norm.getInputs()[1]);
  if (!generatedStorage(th) || !tw || !tw.hasStaticShape())
    return false;
  for (Value v : {add.getInputs()[0], add.getInputs()[1], norm.getOutputs()[0]})
    if (tensorOf(v) != th)
      return false;
  int64_t dim = tw.getNumElements();
  return dim > 0 && th.getNumElements() % dim == 0 &&
         th.getShape().back() == dim;
}

} // namespace

AddNormFusion::AddNormFusion(exec::StepOp step) {
  step->walk([&](exec::KernelOp norm) {
    if (norm.getCallee() != "train.rms_norm" || norm.getInputs().empty())
      return;
    // The add writing the norm's x (buffers are written through output
    // operands): a user of x that lists it as an output.
    Value x = norm.getInputs()[0];
    exec::KernelOp add;
    for (Operation *user : x.getUsers())
      if (auto k = dyn_cast<exec::KernelOp>(user))
        if (k.getCallee() == "train.add" &&
            llvm::is_contained(k.getOutputs(), x))
          add = k;
    if (!add)
      return;
    if (!fuses(add, norm)) {
      ++rejected_;
      return;
    }
    RankedTensorType th = tensorOf(x);
    int64_t bytes =
        th.getNumElements() * (th.getElementType().isBF16() ? 2 : 4);
    pairs_.push_back({add, norm, bytes});
  });
}

NormGradAddFusion::NormGradAddFusion(exec::StepOp step) {
  step->walk([&](exec::KernelOp add) {
    if (add.getCallee() != "train.add" || add.getInputs().size() != 2 ||
        add.getOutputs().size() != 1)
      return;
    for (unsigned k = 0; k < 2; ++k) {
      Value dx = add.getInputs()[k], other = add.getInputs()[1 - k];
      if (dx == other)
        continue;
      exec::KernelOp norm;
      for (Operation *user : dx.getUsers())
        if (auto kop = dyn_cast<exec::KernelOp>(user))
          if (kop.getCallee() == "train.rms_norm_grad" &&
              !kop.getOutputs().empty() && kop.getOutputs()[0] == dx)
            norm = kop;
      if (!norm)
        continue;
      auto fusable = [&] {
        unsigned grads = exec::numGradOutputs(norm.getArgs());
        if (norm.getInputs().size() != 4 ||
            norm.getOutputs().size() != grads + 1)
          return false;
        // dx: written by the norm, read by the add, nothing else.
        for (Operation *user : dx.getUsers())
          if (user != norm.getOperation() && user != add.getOperation())
            return false;
        if (!backToBack(norm, add))
          return false;
        RankedTensorType t = tensorOf(dx), tw = tensorOf(norm.getInputs()[1]);
        if (!generatedStorage(t) || !tw || !tw.hasStaticShape() ||
            tensorOf(other) != t || tensorOf(add.getOutputs()[0]) != t)
          return false;
        int64_t dim = tw.getNumElements();
        return dim > 0 && t.getShape().back() == dim;
      };
      if (!fusable()) {
        ++rejected_;
        continue;
      }
      RankedTensorType t = tensorOf(dx);
      pairs_.push_back(
          {norm, add, other,
           t.getNumElements() * (t.getElementType().isBF16() ? 2 : 4)});
      return;
    }
  });
}

int64_t NormGradAddFusion::savedBytes() const {
  int64_t total = 0;
  for (const Pair &p : pairs_)
    total += 2 * p.dxBytes;
  return total;
}

int64_t AddNormFusion::savedBytes() const {
  int64_t total = 0;
  for (const Pair &p : pairs_)
    total += p.hBytes;
  return total;
}

} // namespace ap
