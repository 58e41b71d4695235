//===- bench_specs.h - the kernels kernelgen_bench times --------*- C++ -*-===//
//
// The group specs whose PTX kernelgen_bench loads, as the Qwen3.5-0.8B step
// uses them (bf16 storage; the norms' weight gradients accumulated): shared
// by the bench and its build-time PTX generator (bench_ptx.cpp), so the
// bench binary links no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_BENCH_KERNELGEN_BENCH_SPECS_H
#define ACTPLACE_BENCH_KERNELGEN_BENCH_SPECS_H

#include "kernelgen/KernelAbi.h"

#include <vector>

namespace ap::kernelgen::bench {

/// Spec of `kind` with the step's choices: bf16, zero-centred RMSNorm with
/// rstd and dw, no recomputed y, not packed.
inline GroupSpec stepSpec(GroupKind kind) {
  GroupSpec s;
  s.kind = kind;
  s.dtype = ElemType::BF16;
  s.recomputeY = false;
  return s;
}

/// stepSpec(kind) for rows of `dim` elements, with the rows a warp and,
/// for the norm backwards, the register path that the step's code
/// generation picks (rowsPerWarpFor, rowInRegistersFor).
inline GroupSpec stepSpec(GroupKind kind, int64_t dim) {
  GroupSpec s = stepSpec(kind);
  s.rowsPerWarp = rowsPerWarpFor(s, dim);
  if (hasDwRowInRegisters(kind))
    s.rowInRegisters = rowInRegistersFor(s, dim);
  return s;
}

inline std::vector<GroupSpec> benchSpecs() {
  std::vector<GroupSpec> all;
  // The row-wise groups at the bench's row lengths (hidden 1024, q/k norms
  // 256, GDN heads 128).
  for (GroupKind k : {GroupKind::RmsNormForward, GroupKind::AddRmsNormForward,
                      GroupKind::L2NormForward, GroupKind::L2NormBackward,
                      GroupKind::GatedNormForward})
    for (int64_t dim : {1024, 256, 128}) {
      GroupSpec s = stepSpec(k, dim);
      bool seen = false;
      for (const GroupSpec &o : all)
        seen = seen || (o.kind == s.kind && o.rowsPerWarp == s.rowsPerWarp);
      if (!seen)
        all.push_back(s);
    }
  for (GroupKind k : {GroupKind::RmsNormBackward, GroupKind::GatedNormBackward,
                      GroupKind::SwiGluForward, GroupKind::SwiGluBackward,
                      GroupKind::SigmoidGateForward,
                      GroupKind::SigmoidGateBackward, GroupKind::RopeForward,
                      GroupKind::RopeBackward, GroupKind::ResidualAdd})
    all.push_back(stepSpec(k));
  // One row a warp read once into registers (the hidden size's forwards).
  for (GroupKind k :
       {GroupKind::RmsNormForward, GroupKind::AddRmsNormForward}) {
    GroupSpec keep = stepSpec(k);
    keep.rowInRegisters = true;
    all.push_back(keep);
  }
  // The norm backwards of narrow rows in registers, dw partials too (the
  // q/k norms' 256, the GDN heads' 128).
  all.push_back(stepSpec(GroupKind::RmsNormBackward, 256));
  all.push_back(stepSpec(GroupKind::GatedNormBackward, 128));
  GroupSpec fused = stepSpec(GroupKind::RmsNormBackward);
  fused.addResidual = true;
  all.push_back(fused);
  // and with the chain of adds forming dy (the MLP norm's 2 addends, the
  // GDN layers' input norm's 4).
  for (int addends : {2, kMaxDyAddends}) {
    fused.dyAddends = addends;
    all.push_back(fused);
  }
  return all;
}

} // namespace ap::kernelgen::bench

#endif // ACTPLACE_BENCH_KERNELGEN_BENCH_SPECS_H
