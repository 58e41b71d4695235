//===- KernelFusion.h - which kernels one generated kernel runs -*- C++ -*-===//
//
// Decides which exec.kernel calls of a step run as one generated kernel
// (kernelgen, docs/kernelgen.md). Today one group: a residual add whose sum
// h = a + b the next kernel normalizes, `train.add` then `train.rms_norm` of
// its output, becomes `train.add_rms_norm` (kernelgen's AddRmsNormForward):
// one pass over the rows that stores h and normalizes it from the stored
// bits, so y and rstd are those of the two kernels while h is not read back
// from memory. Fusion never changes arithmetic, so placements keep their
// bits (docs/kernelgen.md, "Determinism and numerics").
//
// A pair fuses when:
//   - the norm reads the add's output as its x, in the same block, on the
//     same stream, with only buffer declarations (exec.buffer) between the
//     two (no event, copy, view or other kernel: nothing else may see h
//     between them, and no order changes);
//   - both are element types a generated kernel stores (bf16, f32), the
//     same for a, b, h and y, and h has the norm's [rows, dim] extent.
// Run before exec-plan-memory: the fused call reads a, b and w while it
// writes h, y and rstd, so the plan never puts an output over an input.
//
// The price: per fused pair one read of h less (its bytes) and one launch
// less; the pass records both on exec.step for the compile's report.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_KERNELFUSION_H
#define ACTPLACE_PASSES_ANALYSIS_KERNELFUSION_H

#include "dialect/exec/ExecOps.h"
#include "kernelgen/KernelAbi.h"

#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <vector>

namespace ap {

/// The pairs a fusion found in one step, in program order, and the pairs it
/// saw that do not fuse (for the statistics).
template <class PairT> class FusionPairs {
public:
  using Pair = PairT;
  const std::vector<Pair> &pairs() const { return pairs_; }
  int64_t rejected() const { return rejected_; }

protected:
  std::vector<Pair> pairs_;
  int64_t rejected_ = 0;
};

struct AddNormPair {
  exec::KernelOp add, norm;
  /// Bytes of h: the read the fused kernel saves.
  int64_t hBytes = 0;
};

/// The fusable residual add + RMSNorm pairs of one step.
class AddNormFusion : public FusionPairs<AddNormPair> {
public:
  explicit AddNormFusion(exec::StepOp step);
  /// Bytes of every saved read of h in one pass over the step's text (a
  /// pair inside the microbatch loop counts once).
  int64_t savedBytes() const;
};

/// The fusable RMSNorm backward + residual add pairs of one step: a
/// `train.rms_norm_grad` whose dx only a `train.add` reads, the residual
/// stream's gradient dh = other + dx, becomes `train.rms_norm_grad_add`
/// (kernelgen's RmsNormBackward with addResidual): the row kernel adds the
/// other addend to its gradient rounded to storage, as the add would read
/// it, so dh keeps its bits while dx is neither stored nor read back.
///
/// A pair fuses when:
///   - the norm has its gradient dx as its only non-grad result (no rebuilt
///     y) and the add reads dx as one of its two inputs, the other not dx;
///   - dx is used by nothing else (no copy, view, wait or other kernel);
///   - the two are in the same block, on the same stream, with only buffer
///     declarations between them;
///   - dx, the other addend and the sum are bf16 or f32 of one type whose
///     last extent is the norm weight's.
/// The price: per pair one write and one read of dx less and one launch
/// less.
struct NormGradAddPair {
  exec::KernelOp norm, add;
  /// The add's other input (the residual stream's incoming gradient).
  mlir::Value other;
  /// Bytes of dx: each of the write and the read the fused kernel saves.
  int64_t dxBytes = 0;
};
class NormGradAddFusion : public FusionPairs<NormGradAddPair> {
public:
  explicit NormGradAddFusion(exec::StepOp step);
  /// Bytes of every saved write and read of dx in one pass over the step's
  /// text.
  int64_t savedBytes() const;
};

/// The chains of residual adds whose sum an RMSNorm backward reads as dy:
/// s1 = a0 + a1, s2 = s1 + a2, ..., dy = s_m (the gradient of a value
/// several kernels read, summed in the order the backward formed it). The
/// backward (`train.rms_norm_grad`, or a `train.rms_norm_grad_add` that
/// NormGradAddFusion made) becomes one call over the m + 1 addends
/// (`train.rms_norm_grad_sum`, or the `_add` call with them in dy's place),
/// kernelgen's RmsNormBackward with dyAddends: the kernel forms each sum
/// where dy is read, rounded to storage as the add stores it, so dy keeps
/// its bits while no sum is written or read back.
///
/// An add joins the chain when:
///   - it is a `train.add` with two inputs and one output, the sum, which
///     nothing but the next kernel of the chain reads (no copy, view, wait
///     or other kernel);
///   - it runs right before that kernel: same block and stream, only buffer
///     declarations between;
///   - its inputs and sum are the backward's dy type (bf16 or f32) and
///     shape.
/// At most kernelgen::kMaxDyAddends addends (3 adds): a longer chain keeps its
/// earlier sum stored, as an addend. Since an add's two operands commute (one
/// f32 addition, then the rounding), which input of an add carries the chain
/// does not matter.
/// The price: per fused add one write and one read of its sum less and one
/// launch less.
struct DySumChain {
  /// The backward reading dy.
  exec::KernelOp norm;
  /// The adds, in program (and summation) order.
  llvm::SmallVector<exec::KernelOp, 3> adds;
  /// dy's addends in summation order: the first add's two inputs, then
  /// each later add's other input.
  llvm::SmallVector<mlir::Value, 4> addends;
  /// Bytes of one sum (dy's bytes).
  int64_t sumBytes = 0;
};
class DySumFusion : public FusionPairs<DySumChain> {
public:
  explicit DySumFusion(exec::StepOp step);
  /// The adds of every chain.
  int64_t adds() const;
  /// Bytes of every saved write and read of an intermediate sum in one pass
  /// over the step's text.
  int64_t savedBytes() const;
};

} // namespace ap

#endif // ACTPLACE_PASSES_ANALYSIS_KERNELFUSION_H
