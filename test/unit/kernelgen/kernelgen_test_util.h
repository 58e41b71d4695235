//===- kernelgen_test_util.h - shared helpers of the kernelgen tests -*- C++
//-*-===//
//
// Seeded storage buffers, bitwise comparison and the reference RMSNorm
// forward, shared by the host (JIT) and GPU (driver API) tests of the
// generated kernels.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TEST_UNIT_KERNELGEN_KERNELGEN_TEST_UTIL_H
#define ACTPLACE_TEST_UNIT_KERNELGEN_KERNELGEN_TEST_UTIL_H

#include "kernelgen/KernelGen.h"
#include "kernels/kernels.h"
#include "test/unit/kernels/random_data.h"

#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <vector>

namespace ap::kernelgen::test {

using namespace ap::kernels;
namespace kg = ap::kernelgen;
using I = int64_t;

inline DType dtypeOf(kg::ElemType t) {
  return t == kg::ElemType::BF16 ? DType::BF16 : DType::F32;
}
inline size_t bytesOf(kg::ElemType t) {
  return t == kg::ElemType::BF16 ? 2 : 4;
}

/// n storage elements of seeded N(0, s^2) values, in bf16 or f32 bytes, with
/// a few specials (signed zero, a value that rounds to even in bf16, a
/// denormal, an overflow to infinity) where n allows.
inline std::vector<uint8_t> randomStorage(kg::ElemType t, size_t n,
                                          uint64_t seed, double s = 1.0,
                                          bool specials = true) {
  std::vector<double> v = ap::test::randn(n, seed, s);
  if (specials && n >= 8) {
    v[1] = -0.0;
    v[3] = 1.00390625; // exactly between two bf16 values: ties to even
    v[5] = 1e-40;      // denormal in f32
    v[7] = 3.3e38;     // rounds to +inf in bf16
  }
  std::vector<uint8_t> out(n * bytesOf(t));
  for (size_t i = 0; i < n; ++i) {
    float f = float(v[i]);
    if (t == kg::ElemType::BF16) {
      bf16 b(f);
      std::memcpy(out.data() + 2 * i, &b.bits, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &f, 4);
    }
  }
  return out;
}

/// Bitwise equality of two byte buffers, naming the first differing element.
inline ::testing::AssertionResult sameBits(const std::vector<uint8_t> &want,
                                           const std::vector<uint8_t> &got,
                                           size_t elemBytes, const char *what) {
  if (want.size() != got.size())
    return ::testing::AssertionFailure()
           << what << ": " << got.size() << " bytes, expected " << want.size();
  for (size_t i = 0; i < want.size(); i += elemBytes)
    if (std::memcmp(want.data() + i, got.data() + i, elemBytes) != 0) {
      uint32_t w = 0, g = 0;
      std::memcpy(&w, want.data() + i, elemBytes);
      std::memcpy(&g, got.data() + i, elemBytes);
      std::ostringstream os;
      os << what << ": element " << i / elemBytes << " has bits 0x" << std::hex
         << g << ", the reference 0x" << w;
      return ::testing::AssertionFailure() << os.str();
    }
  return ::testing::AssertionSuccess();
}

inline const KernelContext kHost{};

/// The bytes of an f32 buffer, for sameBits.
inline std::vector<uint8_t> rawBytes(const std::vector<float> &f) {
  std::vector<uint8_t> b(f.size() * sizeof(float));
  std::memcpy(b.data(), f.data(), b.size());
  return b;
}

/// The reference RMSNorm forward of a [rows, dim] x with row stride xs into
/// a contiguous y and rstd.
inline Status referenceRmsNorm(kg::ElemType t, const void *x, const void *w,
                               void *y, float *rstd, I rows, I dim, I xs,
                               bool zc) {
  RmsNormForwardArgs a;
  a.dtype = dtypeOf(t);
  a.x = x;
  a.w = w;
  a.y = y;
  a.rstd = rstd;
  a.rows = rows;
  a.dim = dim;
  a.xStride = xs;
  a.eps = 1e-6;
  a.zeroCentered = zc;
  return rmsNormForward(kHost, a);
}

} // namespace ap::kernelgen::test

#endif // ACTPLACE_TEST_UNIT_KERNELGEN_KERNELGEN_TEST_UTIL_H
