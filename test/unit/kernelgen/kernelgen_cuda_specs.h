//===- kernelgen_cuda_specs.h - the kernels kernelgen_cuda_test runs -*- C++
//-*-===//
//
// The group specs whose PTX kernelgen_cuda_test loads: shared by the test
// and by the build-time generator that embeds that PTX in it
// (kernelgen_cuda_test_ptx.cpp), so the test binary needs no MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TEST_UNIT_KERNELGEN_KERNELGEN_CUDA_SPECS_H
#define ACTPLACE_TEST_UNIT_KERNELGEN_KERNELGEN_CUDA_SPECS_H

#include "kernelgen/KernelAbi.h"

#include <vector>

namespace ap::kernelgen::test {

inline std::vector<GroupSpec> cudaTestSpecs() {
  std::vector<GroupSpec> all;
  GroupSpec s;
  s.dtype = ElemType::BF16;
  s.kind = GroupKind::SwiGluForward;
  all.push_back(s);
  s.kind = GroupKind::SwiGluBackward;
  s.recomputeY = true;
  all.push_back(s);
  s.kind = GroupKind::ResidualAdd;
  all.push_back(s);
  s.kind = GroupKind::RmsNormForward;
  all.push_back(s);
  s.kind = GroupKind::RmsNormBackward;
  s.accumulateDw = true;
  all.push_back(s);
  s.kind = GroupKind::AddRmsNormForward;
  all.push_back(s);
  s.kind = GroupKind::SigmoidGateForward;
  all.push_back(s);
  s.kind = GroupKind::SigmoidGateBackward;
  all.push_back(s);
  s.kind = GroupKind::L2NormForward;
  all.push_back(s);
  s.kind = GroupKind::L2NormBackward;
  all.push_back(s);
  s.kind = GroupKind::GatedNormForward;
  all.push_back(s);
  s.kind = GroupKind::GatedNormBackward; // with dw and the rebuilt y
  all.push_back(s);
  // Both norm backwards with narrow rows and their dw partials in
  // registers (rowInRegisters, the _k kernels).
  for (GroupKind k :
       {GroupKind::RmsNormBackward, GroupKind::GatedNormBackward}) {
    GroupSpec r = s;
    r.kind = k;
    r.rowInRegisters = true;
    all.push_back(r);
  }
  s.recomputeY = false;
  s.kind = GroupKind::RmsNormBackward; // fused with the residual add
  s.addResidual = true;
  all.push_back(s);
  // and with the chain of three adds forming its dy (GDN layers' input norm)
  s.dyAddends = kMaxDyAddends;
  all.push_back(s);
  s.dyAddends = 1;
  s.addResidual = false;
  s.kind = GroupKind::GdnGatesForward;
  all.push_back(s);
  s.kind = GroupKind::GdnGatesBackward;
  all.push_back(s);
  for (bool packed : {false, true}) {
    s.packed = packed;
    s.kind = GroupKind::RopeForward;
    all.push_back(s);
    s.kind = GroupKind::RopeBackward;
    all.push_back(s);
  }
  s.packed = false;
  // The row-wise groups with 2 and 4 rows a warp (the register path), and
  // with one row a warp kept in registers (rowInRegisters).
  for (GroupKind k : {GroupKind::RmsNormForward, GroupKind::AddRmsNormForward,
                      GroupKind::L2NormForward, GroupKind::L2NormBackward,
                      GroupKind::GatedNormForward})
    for (int rpw : {1, 2, 4}) {
      GroupSpec r;
      r.kind = k;
      r.rowsPerWarp = rpw;
      r.rowInRegisters = rpw == 1;
      all.push_back(r);
    }
  s.kind = GroupKind::AdamW;
  s.dtype = ElemType::F32; // f32 main grads, bf16 compute copy
  s.computeCopy = ElemType::BF16;
  all.push_back(s);
  return all;
}

} // namespace ap::kernelgen::test

#endif // ACTPLACE_TEST_UNIT_KERNELGEN_KERNELGEN_CUDA_SPECS_H
