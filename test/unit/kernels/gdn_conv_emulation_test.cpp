//===- gdn_conv_emulation_test.cpp - conv kernels on the host -*- C++ -*-===//
//
// The GDN short-conv CUDA kernel bodies (kernels/cuda/gdn/gdn_conv_kernels.cuh)
// compiled for the host with a small shim (bf16 as bits, the launch builtins as
// globals, every grid block and thread run in turn), so CI without a GPU
// checks their index logic: the windowed kernels equal the per-element ones
// bit for bit (the same fp32 sums in the same order), and both match the
// float64 reference kernels. The first windowed version failed on the H200
// with a window initialised one place off; this test fails on that version.
// What the host cannot check (device rounding of exp, memory and launch
// limits) stays with test/unit/kernels/gdn_cuda_test.cpp on the GPU.
//
//===----------------------------------------------------------------------===//
#include "gdn_conv_reference.h"
#include "kernels/cuda/gdn/gdn_layout.h"
#include "kernels/kernels.h"
#include "packed_documents.h"
#include "random_data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

using namespace ap::kernels;

namespace {

//===----------------------------------------------------------------------===//
// The shim the kernel bodies are written against.
//===----------------------------------------------------------------------===//

struct bf {
  uint16_t bits;
};
inline float b2f(bf x) {
  uint32_t u = uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
/// Round to nearest even, as __float2bfloat16_rn (inputs here are finite).
inline bf f2b(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf{uint16_t(u >> 16)};
}
inline float sigmoidf_(float x) { return 1.f / (1.f + std::exp(-x)); }

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};
Dim3 blockIdx, threadIdx, blockDim, gridDim;
using ap::kernels::gdncuda::kConvRows;
using std::min;

#define __global__ static
#define __device__ static
#define __forceinline__ inline
#define __restrict__
// The staged backward's phases only (its kernel wrapper needs shared memory
// and barriers): stagedBackward below runs them phase by phase.
#define AP_GDN_CONV_HOST_EMULATION
#include "kernels/cuda/gdn/gdn_conv_kernels.cuh"
#undef __restrict__
#undef __global__
#undef __device__
#undef __forceinline__

/// Runs `body` once per thread of a grid (x, y) of blocks of `threads`.
template <typename F> void launch(Dim3 grid, unsigned threads, F &&body) {
  gridDim = grid;
  blockDim = Dim3{threads, 1, 1};
  for (blockIdx.y = 0; blockIdx.y < std::max(1u, grid.y); ++blockIdx.y)
    for (blockIdx.x = 0; blockIdx.x < grid.x; ++blockIdx.x)
      for (threadIdx.x = 0; threadIdx.x < threads; ++threadIdx.x)
        body();
}

struct Outputs {
  std::vector<bf> y, dx;
  std::vector<float> partial; ///< dw partials [row block][channel][K]
};

struct Problem {
  int B, T, C, K;
  long N() const { return long(B) * T; }
  long rowBlocks() const { return (N() + kConvRows - 1) / kConvRows; }
  std::vector<bf> x, w, dy;

  Problem(int B, int T, int C, int K, uint64_t seed) : B(B), T(T), C(C), K(K) {
    auto bits = [](const ap::test::Vec &v) {
      std::vector<bf> r(v.size());
      for (size_t i = 0; i < v.size(); ++i)
        r[i] = f2b(float(v[i]));
      return r;
    };
    x = bits(ap::test::randn(size_t(N()) * C, seed));
    w = bits(ap::test::randn(size_t(C) * K, seed + 1, 0.5));
    dy = bits(ap::test::randn(size_t(N()) * C, seed + 2));
  }
  Outputs empty() const {
    return {std::vector<bf>(x.size(), bf{0xffff}),
            std::vector<bf>(x.size(), bf{0xffff}),
            std::vector<float>(size_t(rowBlocks()) * C * K, NAN)};
  }
};

/// The conv output in groups of `widths` channels, each its own buffer
/// (GdnConvArgs split output), and back.
using Groups = std::vector<std::vector<bf>>;
Groups scatter(const std::vector<bf> &dense, long N,
               const std::vector<int> &widths) {
  int C = 0;
  for (int w : widths)
    C += w;
  Groups g;
  for (int s = 0, c0 = 0; s < int(widths.size()); c0 += widths[s++]) {
    g.emplace_back(size_t(N) * widths[s]);
    for (long t = 0; t < N; ++t)
      for (int c = 0; c < widths[s]; ++c)
        g[s][size_t(t) * widths[s] + c] = dense[size_t(t) * C + c0 + c];
  }
  return g;
}
std::vector<bf> gather(const Groups &g, long N,
                       const std::vector<int> &widths) {
  int C = 0;
  for (int w : widths)
    C += w;
  std::vector<bf> dense(size_t(N) * C);
  for (int s = 0, c0 = 0; s < int(widths.size()); c0 += widths[s++])
    for (long t = 0; t < N; ++t)
      for (int c = 0; c < widths[s]; ++c)
        dense[size_t(t) * C + c0 + c] = g[s][size_t(t) * widths[s] + c];
  return dense;
}
template <typename P, typename G>
ConvGroups<P> groupsOf(G &g, const std::vector<int> &widths) {
  ConvGroups<P> r{};
  r.n = int(widths.size());
  for (int s = 0; s < r.n; ++s) {
    r.ptr[s] = g[s].data();
    r.start[s + 1] = r.start[s] + widths[s];
  }
  return r;
}

/// Runs `kernels(y, dy)` on the conv output laid out in groups of `widths`
/// channels (empty: dense) and returns the outputs in the dense layout.
template <typename F>
Outputs inLayout(const Problem &p, std::vector<int> widths, F &&kernels) {
  if (widths.empty())
    widths = {p.C};
  Outputs o = p.empty();
  Groups yg = scatter(o.y, p.N(), widths);
  const Groups dyg = scatter(p.dy, p.N(), widths);
  kernels(groupsOf<bf *>(yg, widths), groupsOf<const bf *>(dyg, widths), o);
  o.y = gather(yg, p.N(), widths);
  return o;
}

/// The launches of gdn_ops.cu's per-element path (with `ds`, packed
/// documents: kernels/kernels.h docStart).
Outputs perElement(const Problem &p, std::vector<int> widths = {},
                   const int *ds = nullptr) {
  long N = p.N();
  return inLayout(
      p, widths,
      [&](ConvGroups<bf *> y, ConvGroups<const bf *> dy, Outputs &o) {
        unsigned blocks = unsigned((N * p.C + 255) / 256);
        launch({blocks, 1}, 256, [&] {
          convFwdKernel(N, p.T, p.C, p.K, p.x.data(), p.w.data(), y, ds);
        });
        launch({blocks, 1}, 256, [&] {
          convDxKernel(N, p.T, p.C, p.K, p.x.data(), p.w.data(), dy,
                       o.dx.data(), ds);
        });
        launch({unsigned(p.rowBlocks()), unsigned((p.C + 127) / 128)}, 128,
               [&] {
                 convDwPartialKernel(N, p.T, p.C, p.K, p.x.data(), p.w.data(),
                                     dy, o.partial.data(), ds);
               });
      });
}

/// The launches of gdn_ops.cu's windowed path (the default); the backward
/// loads `Ahead` tokens ahead (the library: kConvBwdAhead).
template <int Ahead = kConvBwdAhead>
Outputs windowed(const Problem &p, std::vector<int> widths = {}) {
  long N = p.N();
  return inLayout(
      p, widths,
      [&](ConvGroups<bf *> y, ConvGroups<const bf *> dy, Outputs &o) {
        unsigned channelBlocks = unsigned((p.C + 127) / 128);
        withKernelSize(p.K, [&](auto k) {
          constexpr int K = decltype(k)::value;
          launch(
              {channelBlocks, unsigned((N + kConvFwdRows - 1) / kConvFwdRows)},
              128, [&] {
                convWindowFwdKernel<K>(N, p.T, p.C, p.x.data(), p.w.data(), y);
              });
          launch({channelBlocks, unsigned(p.rowBlocks())}, 128, [&] {
            convWindowBwdKernel<K, Ahead>(N, p.T, p.C, p.x.data(), p.w.data(),
                                          dy, o.dx.data(), o.partial.data());
          });
        });
      });
}

/// The staged forward and backward (GdnConvKernels::Staged) as gdn_ops.cu
/// launches them: every thread of a block runs a phase before any
/// runs the next, as the kernel's barriers order them, each block with its
/// own shared memory (poisoned, so a read of what no phase wrote shows).
/// p.C and every group's width are multiples of kConvStagedChannels.
Outputs staged(const Problem &p, std::vector<int> widths = {}) {
  long N = p.N();
  return inLayout(
      p, widths,
      [&](ConvGroups<bf *> y, ConvGroups<const bf *> dy, Outputs &o) {
        withKernelSize(p.K, [&](auto k) {
          constexpr int K = decltype(k)::value;
          std::vector<unsigned char> smem(size_t(ConvStagedTile<K>::smemBytes));
          for (unsigned by = 0; by < unsigned(p.rowBlocks()); ++by)
            for (int bx = 0; bx < p.C / kConvStagedChannels; ++bx) {
              std::fill(smem.begin(), smem.end(), 0xff);
              const ConvColumn<bf *> yc = columnOf(y, bx * kConvStagedChannels);
              for (int phase = 0; phase < 2; ++phase)
                for (int tid = 0; tid < kConvStagedThreads; ++tid)
                  convStagedFwdPhase<K>(phase, tid, bx, int(by), N, p.T, p.C,
                                        p.x.data(), p.w.data(), yc.p, yc.stride,
                                        smem.data());
            }
          for (unsigned by = 0; by < unsigned(p.rowBlocks()); ++by)
            for (int bx = 0; bx < p.C / kConvStagedChannels; ++bx) {
              std::fill(smem.begin(), smem.end(), 0xff);
              const ConvColumn<const bf *> dyc =
                  columnOf(dy, bx * kConvStagedChannels);
              for (int phase = 0; phase < 3; ++phase)
                for (int tid = 0; tid < kConvStagedThreads; ++tid)
                  convStagedBwdPhase<K>(phase, tid, bx, int(by), N, p.T, p.C,
                                        p.x.data(), p.w.data(), dyc.p,
                                        dyc.stride, o.dx.data(),
                                        o.partial.data(), smem.data());
            }
        });
      });
}

bool sameBits(const Outputs &a, const Outputs &b) {
  return std::memcmp(a.y.data(), b.y.data(), a.y.size() * sizeof(bf)) == 0 &&
         std::memcmp(a.dx.data(), b.dx.data(), a.dx.size() * sizeof(bf)) == 0 &&
         std::memcmp(a.partial.data(), b.partial.data(),
                     a.partial.size() * sizeof(float)) == 0;
}

/// Shapes whose token runs cross sequence starts (T below a run of 32 or
/// 128 tokens, T not a multiple of it, T < K, starts inside a group of
/// kConvAhead prefetched tokens), every kernel size the
/// windowed path instantiates, channel counts that are odd and span two
/// blocks of 128.
struct Shape {
  int B, T, C, K;
};
const Shape kShapes[] = {{3, 5, 37, 4},   {2, 3, 130, 4},  {4, 77, 130, 1},
                         {2, 200, 37, 2}, {3, 45, 64, 3},  {2, 300, 33, 8},
                         {1, 7, 5, 8},    {2, 700, 40, 4}, {1, 129, 3, 4},
                         {5, 33, 16, 5},  {1, 34, 9, 3},   {3, 6, 7, 2}};

TEST(GdnConvEmulation, WindowedEqualsPerElementBitwise) {
  for (const Shape &s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T
                                      << " C=" << s.C << " K=" << s.K);
    Problem p(s.B, s.T, s.C, s.K, 7);
    EXPECT_TRUE(sameBits(perElement(p), windowed(p)));
  }
}

/// Packed sequences: a row of documents starting at 0, 37, 106 and 199
/// through the per-element kernels (the path packed rows take) gives each
/// document's y and dx bitwise as the same kernels give them for that
/// document alone as a row, and its dw partials sum to the documents' own
/// within fp32 rounding.
TEST(GdnConvEmulation, PackedDocumentsAsRows) {
  const ap::test::PackedRow &row = ap::test::kPackedRow200;
  const int T = row.T, C = 37, K = 4;
  const std::vector<int32_t> ds = row.docStart();
  Problem p(1, T, C, K, 41);
  Outputs packed = perElement(p, {}, ds.data());
  std::vector<double> dwPacked(size_t(C) * K, 0.0), dwDocs(dwPacked.size(), 0);
  for (size_t i = 0; i < packed.partial.size(); ++i)
    dwPacked[i % dwPacked.size()] += packed.partial[i];
  for (size_t d = 0; d < row.documents(); ++d) {
    const int t0 = row.starts[d], L = row.length(d);
    const size_t off = size_t(t0) * C, n = size_t(L) * C;
    Problem one(1, L, C, K, 42);
    one.w = p.w;
    std::copy_n(p.x.begin() + off, n, one.x.begin());
    std::copy_n(p.dy.begin() + off, n, one.dy.begin());
    Outputs alone = perElement(one);
    EXPECT_EQ(
        std::memcmp(alone.y.data(), packed.y.data() + off, n * sizeof(bf)), 0)
        << "y of the document at " << t0;
    EXPECT_EQ(
        std::memcmp(alone.dx.data(), packed.dx.data() + off, n * sizeof(bf)), 0)
        << "dx of the document at " << t0;
    for (size_t i = 0; i < alone.partial.size(); ++i)
      dwDocs[i % dwDocs.size()] += alone.partial[i];
  }
  for (size_t i = 0; i < dwDocs.size(); ++i)
    EXPECT_NEAR(dwPacked[i], dwDocs[i], 1e-4 * (1 + std::fabs(dwDocs[i])))
        << "dw " << i;
}

/// The output in groups (q, k, v of the GDN layer: widths that are not
/// multiples of a warp or a block, a group of one channel): the dense
/// layout's bits on both paths, every element written.
TEST(GdnConvEmulation, SplitOutputEqualsDenseBitwise) {
  for (const Shape &s : kShapes) {
    if (s.C < 3)
      continue;
    std::vector<int> widths = {s.C / 3, 1, s.C - s.C / 3 - 1};
    SCOPED_TRACE(::testing::Message()
                 << "B=" << s.B << " T=" << s.T << " C=" << s.C << " K=" << s.K
                 << " groups " << widths[0] << "," << widths[1] << ","
                 << widths[2]);
    Problem p(s.B, s.T, s.C, s.K, 23);
    Outputs dense = windowed(p);
    for (const Outputs &split :
         {windowed(p, widths), windowed<1>(p, widths), perElement(p, widths)}) {
      EXPECT_TRUE(sameBits(dense, split));
      for (const bf &b : split.y)
        ASSERT_NE(b.bits, 0xffff);
    }
  }
}

/// However many tokens the backward loads ahead (sequence starts and the
/// block's end fall anywhere inside a group of them), the bits are the same.
TEST(GdnConvEmulation, BackwardBitsDoNotDependOnTokensAhead) {
  for (const Shape &s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T
                                      << " C=" << s.C << " K=" << s.K);
    Problem p(s.B, s.T, s.C, s.K, 31);
    Outputs one = windowed<1>(p);
    EXPECT_TRUE(sameBits(one, perElement(p)));
    EXPECT_TRUE(sameBits(one, windowed<2>(p)));
    EXPECT_TRUE(sameBits(one, windowed<3>(p)));
    EXPECT_TRUE(sameBits(one, windowed<8>(p)));
  }
}

/// The staged kernels (tiles of 64 channels, x and dpre in shared memory)
/// give the windowed kernels' y, dx and dw partials bit for bit: sequences
/// shorter than a run of kConvRows tokens, starting inside one, longer than
/// one, N not a multiple of it, T < K, several tiles of channels, every
/// kernel size; dense and in groups (the GDN layer's q, k, v).
TEST(GdnConvEmulation, StagedEqualsWindowedBitwise) {
  const Shape shapes[] = {{3, 5, 64, 4},     {2, 200, 128, 4}, {1, 300, 64, 1},
                          {4, 77, 192, 2},   {1, 129, 64, 3},  {2, 3, 64, 8},
                          {1, 1000, 128, 4}, {5, 33, 64, 5},   {1, 2, 64, 4}};
  for (const Shape &s : shapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T
                                      << " C=" << s.C << " K=" << s.K);
    Problem p(s.B, s.T, s.C, s.K, 53);
    const Outputs ref = windowed(p);
    EXPECT_TRUE(sameBits(ref, staged(p)));
    if (s.C >= 3 * kConvStagedChannels) {
      const std::vector<int> widths = {kConvStagedChannels,
                                       s.C - 2 * kConvStagedChannels,
                                       kConvStagedChannels};
      EXPECT_TRUE(sameBits(ref, staged(p, widths)));
    }
  }
}

TEST(GdnConvEmulation, MatchesFloat64Reference) {
  for (const Shape &s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T
                                      << " C=" << s.C << " K=" << s.K);
    Problem p(s.B, s.T, s.C, s.K, 17);
    Outputs o = windowed(p);
    ap::test::Vec x(p.x.size()), w(p.w.size()), dy(p.dy.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = b2f(p.x[i]);
      dy[i] = b2f(p.dy[i]);
    }
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = b2f(p.w[i]);
    ap::test::Vec ry, rdx, rdw(w.size(), 0.0);
    ap::test::convReferenceF64(p.B, p.T, p.C, p.K, x, w, dy, ry, rdx, rdw);
    for (size_t i = 0; i < x.size(); ++i) {
      // bf16 outputs: 2^-9 relative rounding, plus fp32 sums.
      ASSERT_NEAR(b2f(o.y[i]), ry[i], 8e-3 * std::abs(ry[i]) + 1e-5) << i;
      ASSERT_NEAR(b2f(o.dx[i]), rdx[i], 8e-3 * std::abs(rdx[i]) + 1e-4) << i;
    }
    // dw = the partials summed over row blocks in order (sumPartialsKernel).
    for (int c = 0; c < p.C; ++c)
      for (int j = 0; j < p.K; ++j) {
        float sum = 0.f;
        for (long b = 0; b < p.rowBlocks(); ++b)
          sum += o.partial[(size_t(b) * p.C + c) * p.K + j];
        double want = rdw[size_t(c) * p.K + j];
        ASSERT_NEAR(sum, want, 1e-4 * std::abs(want) + 1e-4)
            << "dw c=" << c << " j=" << j;
      }
  }
}

} // namespace
