//===- long_shapes.h - helpers of the long-sequence kernel tests -*- C++
//-*-===//
//
// The CUDA kernel tests at the Qwen3.5-0.8B long-context shapes (32768 and
// 131072 tokens per sequence; their gtest names contain "Long", so
// --gtest_filter='*Long*' runs them alone): fills fast enough for hundreds
// of millions of elements, counts of non-finite values in raw bf16 / fp32
// outputs, error accumulators for float64 checks on slices, a parallel loop
// for those checks, and a device workspace between guard bands (a kernel
// must stay inside what its workspace query asked for).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TEST_UNIT_KERNELS_LONG_SHAPES_H
#define ACTPLACE_TEST_UNIT_KERNELS_LONG_SHAPES_H

#include "kernels/kernels.h"

#if defined(ACTPLACE_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace ap::test {

/// Calls f(i) for every i in [0, n) on all host threads; f must be safe to
/// call concurrently for different i.
template <class F> void parallelFor(size_t n, F &&f) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next++) < n;)
      f(i);
  };
  size_t threads =
      std::min<size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t)
    pool.emplace_back(worker);
  worker();
  for (std::thread &t : pool)
    t.join();
}

/// splitmix64: a counter-based stream, so a block of a fill can start
/// anywhere (fills are split in blocks over the threads and give the same
/// values whatever the thread count).
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
/// Element i of stream `seed`, uniform in [lo, hi).
inline double uniformAt(uint64_t seed, size_t i, double lo, double hi) {
  const uint64_t b = splitmix64(seed * 0x632BE59BD9B4E019ull + i);
  return lo + (hi - lo) * (double(b >> 11) * 0x1.0p-53);
}

/// n values of T (bf16 or float) uniform in [lo, hi), filled in parallel.
template <class T>
std::vector<T> fastUniform(size_t n, uint64_t seed, double lo, double hi) {
  std::vector<T> v(n);
  constexpr size_t kBlock = size_t(1) << 20;
  parallelFor((n + kBlock - 1) / kBlock, [&](size_t blk) {
    const size_t end = std::min(n, (blk + 1) * kBlock);
    for (size_t i = blk * kBlock; i < end; ++i)
      v[i] = T(float(uniformAt(seed, i, lo, hi)));
  });
  return v;
}

/// Non-finite elements among n raw bf16 (2 bytes each) or fp32 values: the
/// kernel tests poison outputs with 0xFF bytes (NaN), so a count above 0
/// names elements left unwritten or computed as inf/NaN.
inline size_t nonFiniteBf16(const void *p, size_t n) {
  const uint16_t *u = static_cast<const uint16_t *>(p);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i)
    bad += (u[i] & 0x7f80u) == 0x7f80u;
  return bad;
}
inline size_t nonFiniteF32(const void *p, size_t n) {
  const uint32_t *u = static_cast<const uint32_t *>(p);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i)
    bad += (u[i] & 0x7f800000u) == 0x7f800000u;
  return bad;
}

/// Element i of raw bf16 / fp32 bytes (as read back from a device).
inline double bfAt(const std::vector<unsigned char> &raw, size_t i) {
  uint16_t b;
  std::memcpy(&b, raw.data() + 2 * i, 2);
  return ap::kernels::bf16::toFloat(b);
}
inline double f32At(const std::vector<unsigned char> &raw, size_t i) {
  float f;
  std::memcpy(&f, raw.data() + 4 * i, 4);
  return f;
}

/// max |got - ref| / max |ref| and the Frobenius ratio over every pair
/// added; merge() combines accumulators of slices (in any order: max and
/// sums of squares).
struct ErrAcc {
  double maxErr = 0, maxRef = 0, sumErr2 = 0, sumRef2 = 0;
  size_t nonFinite = 0, count = 0;
  void add(double got, double ref) {
    ++count;
    if (!std::isfinite(got)) {
      ++nonFinite;
      return;
    }
    const double e = got - ref;
    maxErr = std::max(maxErr, std::fabs(e));
    maxRef = std::max(maxRef, std::fabs(ref));
    sumErr2 += e * e;
    sumRef2 += ref * ref;
  }
  void merge(const ErrAcc &o) {
    maxErr = std::max(maxErr, o.maxErr);
    maxRef = std::max(maxRef, o.maxRef);
    sumErr2 += o.sumErr2;
    sumRef2 += o.sumRef2;
    nonFinite += o.nonFinite;
    count += o.count;
  }
  /// max |err| / max |ref| (inf with a non-finite value).
  double rel() const {
    return nonFinite ? INFINITY : maxErr / std::max(maxRef, 1e-300);
  }
  double frob() const {
    return nonFinite ? INFINITY
                     : std::sqrt(sumErr2 / std::max(sumRef2, 1e-300));
  }
};

#if defined(ACTPLACE_HAVE_CUDA)
/// A device workspace of `bytes` between two guard bands of kGuard bytes
/// filled with 0xA5; poison() fills the workspace itself with 0xFF (NaN) and
/// rewrites the bands. intact() is false when a kernel wrote outside the
/// workspace it was given, i.e. used more than its workspace query.
struct GuardedWorkspace {
  static constexpr size_t kGuard = size_t(1) << 20; // keeps 256-byte alignment
  unsigned char *base = nullptr;
  size_t bytes = 0;
  explicit GuardedWorkspace(size_t n) : bytes(n) {
    if (cudaMalloc(&base, n + 2 * kGuard) != cudaSuccess)
      base = nullptr;
  }
  ~GuardedWorkspace() { cudaFree(base); }
  GuardedWorkspace(const GuardedWorkspace &) = delete;
  void *p() const { return base ? base + kGuard : nullptr; }
  void poison() const {
    cudaMemset(base, 0xA5, kGuard);
    cudaMemset(base + kGuard, 0xFF, bytes);
    cudaMemset(base + kGuard + bytes, 0xA5, kGuard);
  }
  bool intact() const {
    std::vector<unsigned char> band(kGuard);
    for (size_t off : {size_t(0), kGuard + bytes}) {
      if (cudaMemcpy(band.data(), base + off, kGuard, cudaMemcpyDeviceToHost) !=
          cudaSuccess)
        return false;
      for (unsigned char c : band)
        if (c != 0xA5)
          return false;
    }
    return true;
  }
};
#endif

} // namespace ap::test

#endif // ACTPLACE_TEST_UNIT_KERNELS_LONG_SHAPES_H
