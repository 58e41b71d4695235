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

#include <cstdint>
#include <vector>

namespace ap {

/// The fusable residual add + RMSNorm pairs of one step, in program order.
class AddNormFusion {
public:
  struct Pair {
    exec::KernelOp add, norm;
    /// Bytes of h: the read the fused kernel saves.
    int64_t hBytes = 0;
  };

  explicit AddNormFusion(exec::StepOp step);

  const std::vector<Pair> &pairs() const { return pairs_; }
  /// Bytes of every saved read of h in one pass over the step's text (a
  /// pair inside the microbatch loop counts once).
  int64_t savedBytes() const;
  /// add + rms_norm pairs seen that do not fuse, for the statistics.
  int64_t rejected() const { return rejected_; }

private:
  std::vector<Pair> pairs_;
  int64_t rejected_ = 0;
};

} // namespace ap

#endif // ACTPLACE_PASSES_ANALYSIS_KERNELFUSION_H
