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

DySumFusion::DySumFusion(exec::StepOp step) {
  step->walk([&](exec::KernelOp norm) {
    StringRef callee = norm.getCallee();
    if ((callee != "train.rms_norm_grad" &&
         callee != "train.rms_norm_grad_add") ||
        norm.getInputs().size() < 4)
      return;
    // Only a backward still reading one dy (not already a chain's).
    size_t dyInputs =
        norm.getInputs().size() - (callee == "train.rms_norm_grad_add" ? 4 : 3);
    if (dyInputs != 1)
      return;
    Value dy = norm.getInputs()[3];
    RankedTensorType t = tensorOf(dy);
    if (!generatedStorage(t))
      return;
    // The add writing `sum` joins the chain read by `reader` (DySumFusion's
    // conditions in KernelFusion.h).
    auto joining = [&](Value sum, exec::KernelOp reader) -> exec::KernelOp {
      exec::KernelOp add;
      for (Operation *user : sum.getUsers()) {
        auto k = dyn_cast<exec::KernelOp>(user);
        if (k && k != reader && k.getCallee() == "train.add" &&
            llvm::is_contained(k.getOutputs(), sum))
          add = k;
      }
      if (!add || add.getInputs().size() != 2 || add.getOutputs().size() != 1 ||
          add.getOutputs()[0] != sum)
        return {};
      for (Operation *user : sum.getUsers())
        if (user != add.getOperation() && user != reader.getOperation())
          return {};
      if (llvm::is_contained(add.getInputs(), sum) ||
          llvm::count(reader.getInputs(), sum) != 1 || !backToBack(add, reader))
        return {};
      for (Value in : add.getInputs())
        if (tensorOf(in) != t)
          return {};
      return add;
    };
    DySumChain chain;
    chain.norm = norm;
    exec::KernelOp reader = norm;
    Value sum = dy;
    // Walk back from dy: each add's other input goes before the addends
    // found so far (it is added later than the chain's earlier sums).
    SmallVector<Value, 4> later;
    while (exec::KernelOp add = joining(sum, reader)) {
      chain.adds.insert(chain.adds.begin(), add);
      Value a = add.getInputs()[0], b = add.getInputs()[1];
      // The input an earlier add of the chain writes, if any and if the
      // chain may grow (3 adds at most).
      Value inner;
      if (chain.adds.size() < size_t(kernelgen::kMaxDyAddends - 1))
        for (Value in : {a, b})
          if (!inner && joining(in, add))
            inner = in;
      if (!inner) {
        chain.addends = {a, b};
        break;
      }
      later.insert(later.begin(), inner == a ? b : a);
      sum = inner;
      reader = add;
    }
    if (chain.adds.empty())
      return;
    chain.addends.append(later.begin(), later.end());
    chain.sumBytes = t.getNumElements() * (t.getElementType().isBF16() ? 2 : 4);
    pairs_.push_back(std::move(chain));
  });
}

int64_t DySumFusion::adds() const {
  int64_t total = 0;
  for (const Pair &c : pairs_)
    total += int64_t(c.adds.size());
  return total;
}

int64_t DySumFusion::savedBytes() const {
  int64_t total = 0;
  for (const Pair &c : pairs_)
    total += 2 * int64_t(c.adds.size()) * c.sumBytes;
  return total;
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
