//===- KernelFusion.cpp - residual add + RMSNorm pairs --------------------===//
#include "passes/analysis/KernelFusion.h"

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

/// The pair (add, norm) fuses (KernelFusion.h).
bool fuses(exec::KernelOp add, exec::KernelOp norm) {
  if (add.getInputs().size() != 2 || add.getOutputs().size() != 1 ||
      norm.getInputs().size() != 2 || norm.getOutputs().size() != 2)
    return false;
  Value h = add.getOutputs()[0];
  if (norm.getInputs()[0] != h || add.getStream() != norm.getStream() ||
      add->getBlock() != norm->getBlock() || !add->isBeforeInBlock(norm))
    return false;
  for (Operation *op = add->getNextNode(); op && op != norm.getOperation();
       op = op->getNextNode())
    if (!isa<exec::BufferOp>(op))
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

int64_t AddNormFusion::savedBytes() const {
  int64_t total = 0;
  for (const Pair &p : pairs_)
    total += p.hBytes;
  return total;
}

} // namespace ap
