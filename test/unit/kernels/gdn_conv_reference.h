//===- gdn_conv_reference.h - float64 short conv for tests ---*- C++ -*-===//
//
// The reference kernels' float64 short conv + SiLU, forward and backward, on
// host vectors: the oracle of the CUDA conv tests and of their host
// emulation.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TEST_UNIT_KERNELS_GDN_CONV_REFERENCE_H
#define ACTPLACE_TEST_UNIT_KERNELS_GDN_CONV_REFERENCE_H

#include "kernels/kernels.h"
#include "random_data.h"

#include <gtest/gtest.h>

namespace ap::test {

/// y, dx, and dw accumulated onto its given start, for x [B, T, C] and
/// w [C, K]; a failed call is a test failure.
inline void convReferenceF64(int B, int T, int C, int K, const Vec &x,
                             const Vec &w, const Vec &dy, Vec &y, Vec &dx,
                             Vec &dw) {
  using namespace ap::kernels;
  y.assign(x.size(), 0.0);
  dx.assign(x.size(), 0.0);
  GdnConvArgs r;
  r.dtype = DType::F64;
  r.batch = B;
  r.seqLen = T;
  r.channels = C;
  r.kernelSize = K;
  r.x = x.data();
  r.w = w.data();
  r.y = y.data();
  r.dy = dy.data();
  r.dx = dx.data();
  r.dw = dw.data();
  ASSERT_EQ(gdnConvForward(KernelContext{}, r), Status::Ok);
  ASSERT_EQ(gdnConvBackward(KernelContext{}, r), Status::Ok);
}

} // namespace ap::test

#endif // ACTPLACE_TEST_UNIT_KERNELS_GDN_CONV_REFERENCE_H
