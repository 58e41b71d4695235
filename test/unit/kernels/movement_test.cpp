//===- movement_test.cpp - copyRows, sumRepeats, convertDType ------*- C++
//-*-===//
//
// The data-movement kernels behind slice, concat, expand (and its backward)
// and the storage <-> acc staging. Host: against index arithmetic written out
// here. CUDA (skipped without a GPU): bitwise equal to the host reference,
// outputs poisoned first, at odd sizes and offsets that force every access
// width, and at the MLA expand shape of the Qwen-sized hybrid model.
//
//===----------------------------------------------------------------------===//
#include "kernels/kernels.h"
#include "test/unit/kernels/random_data.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#if defined(ACTPLACE_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

using namespace ap::kernels;

namespace {

using ap::test::randomBytes;

std::vector<bf16> randomBf16(size_t n, uint64_t seed) {
  ap::test::Vec v = ap::test::randn(n, seed);
  std::vector<bf16> r(n);
  for (size_t i = 0; i < n; ++i)
    r[i] = bf16(float(v[i]));
  return r;
}

TEST(Movement, CopyRowsSliceConcatExpand) {
  const int64_t outer = 5, dimX = 7, inner = 3, eb = 2;
  std::vector<uint8_t> x = randomBytes(size_t(outer * dimX * inner * eb), 1);
  // slice rows [2, 6) of the middle dim
  std::vector<uint8_t> y(size_t(outer * 4 * inner * eb), 0xAB);
  CopyRowsArgs a;
  a.src = x.data() + 2 * inner * eb;
  a.dst = y.data();
  a.outer = outer;
  a.rowBytes = 4 * inner * eb;
  a.srcPitch = dimX * inner * eb;
  a.dstPitch = a.rowBytes;
  ASSERT_EQ(copyRows(KernelContext{}, a), Status::Ok);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < 4 * inner * eb; ++j)
      ASSERT_EQ(y[size_t(o * 4 * inner * eb + j)],
                x[size_t(o * dimX * inner * eb + 2 * inner * eb + j)]);
  // expand: 3 copies of each row
  std::vector<uint8_t> e(size_t(outer * 3 * dimX * eb), 0);
  a = CopyRowsArgs{};
  a.src = x.data();
  a.dst = e.data();
  a.outer = outer;
  a.rowBytes = dimX * eb;
  a.srcPitch = dimX * eb;
  a.dstPitch = 3 * dimX * eb;
  a.repeats = 3;
  ASSERT_EQ(copyRows(KernelContext{}, a), Status::Ok);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t r = 0; r < 3; ++r)
      ASSERT_EQ(0, std::memcmp(&e[size_t((o * 3 + r) * dimX * eb)],
                               &x[size_t(o * dimX * eb)], size_t(dimX * eb)));
  // Pitches smaller than the row are rejected.
  a.dstPitch = dimX * eb;
  EXPECT_EQ(copyRows(KernelContext{}, a), Status::InvalidArgument);
}

TEST(Movement, SumRepeatsIsTheExpandAdjoint) {
  // <expand(x), dy> == <x, sumRepeats(dy)> in double, exactly for small ints.
  const int64_t outer = 4, n = 5, inner = 6;
  std::vector<double> x(size_t(outer * inner)), dy(size_t(outer * n * inner));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = double(int(i * 7 % 11) - 5);
  for (size_t i = 0; i < dy.size(); ++i)
    dy[i] = double(int(i * 5 % 13) - 6);
  std::vector<double> ex(dy.size()), dx(x.size(), 99);
  CopyRowsArgs c;
  c.src = x.data();
  c.dst = ex.data();
  c.outer = outer;
  c.rowBytes = inner * 8;
  c.srcPitch = inner * 8;
  c.dstPitch = n * inner * 8;
  c.repeats = n;
  ASSERT_EQ(copyRows(KernelContext{}, c), Status::Ok);
  SumRepeatsArgs s;
  s.dtype = DType::F64;
  s.x = dy.data();
  s.y = dx.data();
  s.outer = outer;
  s.repeats = n;
  s.inner = inner;
  ASSERT_EQ(sumRepeats(KernelContext{}, s), Status::Ok);
  double lhs = 0, rhs = 0;
  for (size_t i = 0; i < ex.size(); ++i)
    lhs += ex[i] * dy[i];
  for (size_t i = 0; i < x.size(); ++i)
    rhs += x[i] * dx[i];
  EXPECT_EQ(lhs, rhs);
}

TEST(Movement, ConvertRoundsToNearestEven) {
  // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1).
  // 1 + 3 * 2^-8 rounds up to 1 + 2^-6.
  std::vector<float> x = {1.f + 1.f / 256, 1.f + 3.f / 256, -2.5f, 0.f};
  std::vector<bf16> y(x.size());
  ConvertArgs a;
  a.from = DType::F32;
  a.to = DType::BF16;
  a.x = x.data();
  a.y = y.data();
  a.n = int64_t(x.size());
  ASSERT_EQ(convertDType(KernelContext{}, a), Status::Ok);
  EXPECT_EQ(float(y[0]), 1.f);
  EXPECT_EQ(float(y[1]), 1.f + 1.f / 64);
  EXPECT_EQ(float(y[2]), -2.5f);
  EXPECT_EQ(float(y[3]), 0.f);
  std::vector<double> back(x.size());
  a.from = DType::BF16;
  a.to = DType::F64;
  a.x = y.data();
  a.y = back.data();
  ASSERT_EQ(convertDType(KernelContext{}, a), Status::Ok);
  EXPECT_EQ(back[1], 1.0 + 1.0 / 64);
}

#if defined(ACTPLACE_HAVE_CUDA)
bool gpuPresent() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct DevBuf {
  void *p = nullptr;
  size_t n;
  explicit DevBuf(size_t bytes) : n(bytes) {
    if (cudaMalloc(&p, bytes + 64) != cudaSuccess)
      p = nullptr;
    cudaMemset(p, 0xFF, bytes + 64); // poison (bf16 NaN pattern)
  }
  ~DevBuf() { cudaFree(p); }
  char *c() { return static_cast<char *>(p); }
};

template <class T> std::vector<T> down(const void *p, size_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

TEST(MovementCuda, CopyRowsMatchesHostAtEveryWidth) {
  if (!gpuPresent())
    GTEST_SKIP() << "no GPU";
  KernelContext gpu;
  gpu.backend = Backend::Cuda;
  // (rowBytes, srcPitch, dstPitch, src offset, dst offset, outer): words of
  // 16, 8, 4, 2, 1 bytes; then rows of 16-byte words that take several
  // unrolled steps per thread (8192 bytes: 512 words), a word count that is
  // no power of two, and many short rows that share a block.
  const int64_t cases[][6] = {{256, 512, 256, 0, 0, 37},
                              {40, 48, 40, 8, 0, 37},
                              {12, 20, 12, 4, 4, 37},
                              {6, 10, 6, 2, 0, 37},
                              {3, 7, 3, 1, 5, 37},
                              {8192, 12288, 8192, 0, 0, 37},
                              {16 * 37, 16 * 40, 16 * 37, 16, 32, 37},
                              {32, 64, 32, 0, 0, 3001},
                              {4096, 12288, 4096, 4096, 0, 513}};
  for (const auto &cs : cases) {
    const int64_t outer = cs[5], repeats = 3;
    int64_t srcBytes = outer * cs[1] + cs[3],
            dstBytes = outer * cs[2] * repeats + cs[4];
    std::vector<uint8_t> hx = randomBytes(size_t(srcBytes), uint64_t(cs[0]));
    std::vector<uint8_t> want(size_t(dstBytes), 0xFF);
    CopyRowsArgs a;
    a.outer = outer;
    a.rowBytes = cs[0];
    a.srcPitch = cs[1];
    a.dstPitch = cs[2] * repeats;
    a.repeats = repeats;
    a.src = hx.data() + cs[3];
    a.dst = want.data() + cs[4];
    ASSERT_EQ(copyRows(KernelContext{}, a), Status::Ok);
    DevBuf x{size_t(srcBytes)}, y{size_t(dstBytes)};
    cudaMemcpy(x.p, hx.data(), hx.size(), cudaMemcpyHostToDevice);
    a.src = x.c() + cs[3];
    a.dst = y.c() + cs[4];
    ASSERT_EQ(copyRows(gpu, a), Status::Ok);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(down<uint8_t>(y.p, size_t(dstBytes)), want)
        << "rowBytes " << cs[0];
  }
}

TEST(MovementCuda, SumRepeatsAndConvertBitwiseEqualHost) {
  if (!gpuPresent())
    GTEST_SKIP() << "no GPU";
  KernelContext gpu;
  gpu.backend = Backend::Cuda;
  // The MLA rotary key of the hybrid model: [B*T, 16 heads, 64] from
  // [B*T, 1, 64], 4096 tokens.
  const int64_t outer = 4096, n = 16, inner = 64;
  std::vector<bf16> dy = randomBf16(size_t(outer * n * inner), 3);
  std::vector<bf16> want(size_t(outer * inner));
  SumRepeatsArgs s;
  s.dtype = DType::BF16;
  s.x = dy.data();
  s.y = want.data();
  s.outer = outer;
  s.repeats = n;
  s.inner = inner;
  ASSERT_EQ(sumRepeats(KernelContext{}, s), Status::Ok);
  DevBuf x(dy.size() * 2), y(want.size() * 2);
  cudaMemcpy(x.p, dy.data(), dy.size() * 2, cudaMemcpyHostToDevice);
  s.x = x.p;
  s.y = y.p;
  for (int run = 0; run < 2; ++run) {
    cudaMemset(y.p, 0xFF, want.size() * 2);
    ASSERT_EQ(sumRepeats(gpu, s), Status::Ok);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<bf16> got = down<bf16>(y.p, want.size());
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 2))
        << "run " << run;
  }
  // f32 -> bf16 -> f32 on the device equals the host conversion bitwise.
  ap::test::Vec r = ap::test::randn(100003, 4, 30.0);
  std::vector<float> f(r.begin(), r.end());
  std::vector<bf16> hb(f.size());
  ConvertArgs c;
  c.from = DType::F32;
  c.to = DType::BF16;
  c.x = f.data();
  c.y = hb.data();
  c.n = int64_t(f.size());
  ASSERT_EQ(convertDType(KernelContext{}, c), Status::Ok);
  DevBuf df(f.size() * 4), db(f.size() * 2), df2(f.size() * 4);
  cudaMemcpy(df.p, f.data(), f.size() * 4, cudaMemcpyHostToDevice);
  c.x = df.p;
  c.y = db.p;
  ASSERT_EQ(convertDType(gpu, c), Status::Ok);
  c.from = DType::BF16;
  c.to = DType::F32;
  c.x = db.p;
  c.y = df2.p;
  ASSERT_EQ(convertDType(gpu, c), Status::Ok);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<bf16> gb = down<bf16>(db.p, f.size());
  ASSERT_EQ(0, std::memcmp(gb.data(), hb.data(), hb.size() * 2));
  std::vector<float> g2 = down<float>(df2.p, f.size());
  for (size_t i = 0; i < f.size(); ++i)
    ASSERT_EQ(g2[i], float(hb[i])) << i;
}
#endif

} // namespace
