//===- workspace_test.cpp - the kernels' workspace queries ------*- C++ -*-===//
//
// kernels/workspace.cpp is the one definition of the scratch every kernel
// asks for; the compiler's memory plan calls it for the CUDA backend
// (passes/analysis/KernelWorkspace.cpp). These tests pin the CUDA sizes at a
// few shapes to the figures the cost model planned before it called the
// queries (its own copies of the formulas, worked out by hand in the
// comments), check that the host backend needs none, and that the queries
// without a backend, which the kernel tests and benchmarks use, answer for
// the kernels this binary has.
//
//===----------------------------------------------------------------------===//
#include "kernels/kernels.h"
#include "kernels/reference/dense/dense_internal.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

using namespace ap::kernels;

namespace {

#ifdef ACTPLACE_HAVE_CUDA
constexpr Backend kBuilt = Backend::Cuda;
#else
constexpr Backend kBuilt = Backend::Host;
#endif

constexpr size_t kGemm = size_t(32) << 20;

LmHeadCrossEntropyArgs lmHead(int64_t tokens, int64_t vocab, int64_t chunk) {
  LmHeadCrossEntropyArgs a;
  a.tokens = tokens;
  a.vocab = vocab;
  a.dim = 1024;
  a.chunkTokens = chunk;
  return a;
}

AttentionBackwardArgs attention(int32_t B, int32_t T, int32_t Hq, int32_t Hkv,
                                int32_t Dqk, int32_t Dv) {
  AttentionBackwardArgs a;
  a.shape = {B, T, Hq, Hkv, Dqk, Dv, 0.0625};
  return a;
}

GdnChunkArgs gdnChunk(int64_t B, int64_t T, int32_t Hk, int32_t Hv, int32_t dk,
                      int32_t dv) {
  GdnChunkArgs a;
  a.batch = B;
  a.seqLen = T;
  a.keyHeads = Hk;
  a.valueHeads = Hv;
  a.keyDim = dk;
  a.valueDim = dv;
  return a;
}

// The LM head's chunk buffers, c = min(chunk_tokens, tokens) rows:
// align256(c V 2) (the bf16 logits, overwritten by their gradient) +
// align256(12 c), what plans reserve for it; the full query adds the
// 32 MiB GEMM workspace.
TEST(WorkspaceQueries, LmHeadCudaMatchesFormerPlan) {
  // c = 1024, V = 248320: 508559360 + 12288.
  EXPECT_EQ(lmHeadCrossEntropyChunkWorkspaceBytes(Backend::Cuda,
                                                  lmHead(8192, 248320, 1024)),
            508571648u);
  // c = 100 (fewer tokens than a chunk), V = 1000: align256(200000) =
  // 200192, align256(1200) = 1280.
  EXPECT_EQ(lmHeadCrossEntropyChunkWorkspaceBytes(Backend::Cuda,
                                                  lmHead(100, 1000, 1024)),
            201472u);
  EXPECT_EQ(
      lmHeadCrossEntropyWorkspaceBytes(Backend::Cuda, lmHead(100, 1000, 1024)),
      201472u + kGemm);
  EXPECT_EQ(linearWorkspaceBytes(Backend::Cuda), kGemm);
}

// The attention backward (StoredDs): align256(N Hq 4) for D, under GQA
// align256(N Hq Dqk 4) + align256(N Hq Dv 4), then align256(chunk * perPair)
// with perPair = tiles (tiles + 1) / 2 * 64 * 64 * 2, tiles = ceil(T / 64),
// and chunk the (batch, head) pairs per launch of at most 256 MiB, spread
// evenly: the cost model's attentionBackwardWorkspace.
TEST(WorkspaceQueries, AttentionBackwardMatchesFormerPlan) {
  // MHA, N = 4096, Hq = 16: D = 262144; tiles = 64, perPair = 17039360, 15
  // pairs fit 256 MiB, 16 pairs: 2 launches of 8 -> 136314880.
  EXPECT_EQ(
      attentionBackwardWorkspaceBytes(attention(1, 4096, 16, 16, 128, 128)),
      136577024u);
  // GQA, N = 200, Hq = 8: D = align256(6400) = 6400; partials
  // 2 * 1638400; tiles = 2, perPair = 24576, all 16 pairs in one launch:
  // 393216.
  EXPECT_EQ(attentionBackwardWorkspaceBytes(attention(2, 100, 8, 2, 256, 256)),
            3676416u);
  // GQA, N = 32768, Hq = 32: D = 4194304, partials 536870912 + 268435456;
  // tiles = 128, perPair = 67633152, 3 pairs fit, 128 pairs in 43 launches
  // of at most 3: 202899456.
  EXPECT_EQ(attentionBackwardWorkspaceBytes(attention(4, 8192, 32, 4, 128, 64)),
            1012400128u);
}

// The chunked gated delta rule. The cost model's gdnWorkspace had W, U,
// Vnew (bf16, rows = B Hv NT 64) and the fp32 states h (B Hv NT dk dv),
// backward dh, fp32 dVnew, dQ, dK, dW. The kernel's carve-up
// (kernels/cuda/gdn/gdn_chunk.cu) also holds the bf16 64x64 P tile of every
// chunk, rows * 64 * 2 bytes, which that copy lacked: the plan was short by
// that much, and the query states it.
TEST(WorkspaceQueries, GdnChunkIsFormerPlanPlusPTiles) {
  // B = 1, T = 4096, Hv = 32, dk = dv = 128: rows = 131072,
  // states = 33554432. Forward 33554432 + 2 * 33554432 + 134217728 =
  // 234881024; backward adds 134217728 + 67108864 + 3 * 67108864 =
  // 637534208. P: 131072 * 128 = 16777216.
  GdnChunkArgs qwen = gdnChunk(1, 4096, 16, 32, 128, 128);
  EXPECT_EQ(gdnChunkForwardWorkspaceBytes(Backend::Cuda, qwen),
            234881024u + 16777216u);
  EXPECT_EQ(gdnChunkBackwardWorkspaceBytes(Backend::Cuda, qwen),
            637534208u + 16777216u);
  // B = 2, T = 100 (NT = 2, padded), Hv = 4, dk = 32, dv = 48: rows = 1024,
  // states = 24576; forward 65536 + 2 * 98304 + 98304 = 360448, backward
  // 1048576; P 131072.
  GdnChunkArgs small = gdnChunk(2, 100, 2, 4, 32, 48);
  EXPECT_EQ(gdnChunkForwardWorkspaceBytes(Backend::Cuda, small),
            360448u + 131072u);
  EXPECT_EQ(gdnChunkBackwardWorkspaceBytes(Backend::Cuda, small),
            1048576u + 131072u);
}

// Qwen3.5-0.8B at 32768 and 131072 tokens per sequence (B = 1): the sizes
// pass 2^31 and 2^32 bytes, so a 32-bit product anywhere would show. Each
// figure is the region list above worked out in 64 bits by hand.
TEST(WorkspaceQueries, LongContextQwenShapes) {
  // GDN chunk, Hk = Hv = 16, dk = dv = 128. T = 32768: NT = 512, rows =
  // 16 * 512 * 64 = 524288, states = 16 * 512 * 128 * 128 = 134217728.
  // Forward: W, U, Vnew 3 * 134217728, P 67108864, h 536870912. Backward
  // adds dh 536870912, dVnew 268435456, dQ, dK, dW 3 * 268435456.
  GdnChunkArgs t32 = gdnChunk(1, 32768, 16, 16, 128, 128);
  EXPECT_EQ(gdnChunkForwardWorkspaceBytes(Backend::Cuda, t32),
            uint64_t(1006632960));
  EXPECT_EQ(gdnChunkBackwardWorkspaceBytes(Backend::Cuda, t32),
            uint64_t(2617245696));
  // T = 131072: four times each region.
  GdnChunkArgs t128 = gdnChunk(1, 131072, 16, 16, 128, 128);
  EXPECT_EQ(gdnChunkForwardWorkspaceBytes(Backend::Cuda, t128),
            uint64_t(4026531840));
  EXPECT_EQ(gdnChunkBackwardWorkspaceBytes(Backend::Cuda, t128),
            uint64_t(10468982784));
  // Short conv over q, k, v (6144 channels, kernel 4): 1024 runs of 128
  // tokens, one fp32 [6144][4] partial each.
  GdnConvArgs conv;
  conv.batch = 1;
  conv.seqLen = 131072;
  conv.channels = 6144;
  conv.kernelSize = 4;
  EXPECT_EQ(gdnConvBackwardWorkspaceBytes(Backend::Cuda, conv),
            uint64_t(1024) * 6144 * 4 * 4);
  // Gated norm, 131072 x 16 rows of 128: 16 rows per pass, 128 passes per
  // block, 1024 fp32 partial rows.
  GdnGatedNormArgs norm;
  norm.tokens = 131072;
  norm.heads = 16;
  norm.dim = 128;
  EXPECT_EQ(gdnGatedNormBackwardWorkspaceBytes(Backend::Cuda, norm),
            uint64_t(1024) * 128 * 4);
  // RMSNorm over 131072 rows of 1024: 8 rows per pass, 16 passes, 1024
  // partial rows.
  RmsNormBackwardArgs rms;
  rms.rows = 131072;
  rms.dim = 1024;
  EXPECT_EQ(rmsNormBackwardWorkspaceBytes(Backend::Cuda, rms),
            uint64_t(1024) * 1024 * 4);
  // The LM head's chunk buffers do not grow with the tokens.
  EXPECT_EQ(lmHeadCrossEntropyChunkWorkspaceBytes(Backend::Cuda,
                                                  lmHead(131072, 248320, 1024)),
            508571648u);
}

// Attention backward at long T: one (batch, head) pair's dS tiles grow as
// T^2 (tiles (tiles + 1) / 2 * 8 KiB: 1 GiB at T = 32768, 16 GiB at
// 131072), so where one pair outgrows the 256 MiB StoredDs cap (T > 16320)
// the default algorithm recomputes dQ and the scratch is linear in T: D
// (N Hq 4) plus the GQA partials (N Hq (Dqk + Dv) 4).
TEST(WorkspaceQueries, AttentionBackwardLinearInLongT) {
  auto algo = [](int32_t T) {
    return detail::attentionBackwardDefaultAlgo(
        attention(1, T, 8, 2, 256, 256).shape);
  };
  EXPECT_EQ(algo(4096), AttentionBackwardAlgo::StoredDs);
  EXPECT_EQ(algo(16320), AttentionBackwardAlgo::StoredDs); // 255 tiles
  EXPECT_EQ(algo(16384), AttentionBackwardAlgo::RecomputeDq);
  EXPECT_EQ(algo(131072), AttentionBackwardAlgo::RecomputeDq);
  // T = 32768: D 1048576, partials 2 * 268435456.
  EXPECT_EQ(
      attentionBackwardWorkspaceBytes(attention(1, 32768, 8, 2, 256, 256)),
      uint64_t(537919488));
  // T = 131072: D 4194304, partials 2 * 1073741824.
  EXPECT_EQ(
      attentionBackwardWorkspaceBytes(attention(1, 131072, 8, 2, 256, 256)),
      uint64_t(2151677952));
  // StoredDs on request still sizes its tiles in 64 bits: at T = 131072,
  // 2048 * 2049 / 2 tiles of 8192 bytes for the one pair a launch holds.
  EXPECT_EQ(detail::attentionStoredDsChunk(
                attention(1, 131072, 8, 2, 256, 256).shape),
            1);
  EXPECT_EQ(detail::attentionBackwardWorkspaceBytesFor(
                attention(1, 131072, 8, 2, 256, 256).shape,
                AttentionBackwardAlgo::StoredDs),
            uint64_t(2151677952) + uint64_t(2048) * 2049 / 2 * 8192);
  // Up to the cap nothing changes: T = 4096 (the earlier figure above).
  EXPECT_EQ(
      attentionBackwardWorkspaceBytes(attention(1, 4096, 16, 16, 128, 128)),
      136577024u);
}

// The cross-entropy gradient kernel puts a chunk's rows on grid.y, which
// CUDA caps at 65535; longer chunks stride.
TEST(LaunchShapes, CrossEntropyGradRowsWithinGridLimit) {
  EXPECT_EQ(ref::ceGradGridRows(1), 1);
  EXPECT_EQ(ref::ceGradGridRows(1024), 1024);
  EXPECT_EQ(ref::ceGradGridRows(65535), 65535);
  EXPECT_EQ(ref::ceGradGridRows(65536), 65535);
  EXPECT_EQ(ref::ceGradGridRows(131072), 65535);
}

// Shapes the dialect accepts can need more than 64 bits count: the sizes
// stop at SIZE_MAX instead of wrapping into a small number.
TEST(WorkspaceQueries, SaturateInsteadOfWrapping) {
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  // N Hq 4 = 2^60 2^20 4 = 2^82 bytes for D alone.
  EXPECT_EQ(attentionBackwardWorkspaceBytes(
                attention(1 << 30, 1 << 30, 1 << 20, 1 << 20, 64, 64)),
            kMax);
  EXPECT_EQ(gdnChunkBackwardWorkspaceBytes(
                Backend::Cuda, gdnChunk(int64_t(1) << 40, int64_t(1) << 20, 256,
                                        256, 256, 256)),
            kMax);
  EXPECT_EQ(lmHeadCrossEntropyWorkspaceBytes(
                Backend::Cuda,
                lmHead(int64_t(1) << 62, int64_t(1) << 62, int64_t(1) << 62)),
            kMax);
}

// The host reference kernels take no workspace; the grad norm's query
// answers its partials on both backends (a generated grad norm on the host
// keeps them there).
TEST(WorkspaceQueries, HostNeedsNone) {
  EXPECT_EQ(linearWorkspaceBytes(Backend::Host), 0u);
  RmsNormBackwardArgs rms;
  rms.rows = 4096;
  rms.dim = 2048;
  EXPECT_EQ(rmsNormBackwardWorkspaceBytes(Backend::Host, rms), 0u);
  EXPECT_GT(rmsNormBackwardWorkspaceBytes(Backend::Cuda, rms), 0u);
  EXPECT_EQ(lmHeadCrossEntropyWorkspaceBytes(Backend::Host,
                                             lmHead(8192, 248320, 1024)),
            0u);
  EXPECT_EQ(lmHeadCrossEntropyChunkWorkspaceBytes(Backend::Host,
                                                  lmHead(8192, 248320, 1024)),
            0u);
  GradTensor t{nullptr, 1 << 20};
  GradNormArgs gn;
  gn.tensors = &t;
  gn.numTensors = 1;
  // 2^20 elements in blocks of 65536: 16 partial sums in double.
  EXPECT_EQ(gradNormWorkspaceBytes(Backend::Cuda, gn), 16u * 8u);
  EXPECT_EQ(gradNormWorkspaceBytes(Backend::Host, gn), 16u * 8u);
  GdnChunkArgs qwen = gdnChunk(1, 4096, 16, 32, 128, 128);
  EXPECT_EQ(gdnChunkForwardWorkspaceBytes(Backend::Host, qwen), 0u);
  EXPECT_EQ(gdnChunkBackwardWorkspaceBytes(Backend::Host, qwen), 0u);
  GdnConvArgs conv;
  conv.batch = 1;
  conv.seqLen = 4096;
  conv.channels = 6144;
  conv.kernelSize = 4;
  EXPECT_EQ(gdnConvBackwardWorkspaceBytes(Backend::Host, conv), 0u);
  // One fp32 [6144][4] dw partial per 128 tokens: 32 partials.
  EXPECT_EQ(gdnConvBackwardWorkspaceBytes(Backend::Cuda, conv),
            32u * 6144u * 4u * 4u);
  GdnGatedNormArgs norm;
  norm.tokens = 4096;
  norm.heads = 32;
  norm.dim = 128;
  EXPECT_EQ(gdnGatedNormBackwardWorkspaceBytes(Backend::Host, norm), 0u);
  EXPECT_GT(gdnGatedNormBackwardWorkspaceBytes(Backend::Cuda, norm), 0u);
  GdnGatesArgs gates;
  EXPECT_EQ(gdnGatesBackwardWorkspaceBytes(Backend::Host, gates), 0u);
  EXPECT_EQ(gdnGatesBackwardWorkspaceBytes(Backend::Cuda, gates), 0u);
}

// The GDN queries without a backend (the kernel tests and benchmarks size
// their workspaces with them) answer for the kernels this binary has: the
// CUDA figure in a build with them, the host's 0 otherwise. The CUDA entries
// themselves check ctx.workspaceBytes against the Backend::Cuda forms
// (kernels/cuda/gdn/gdn_chunk.cu, gdn_ops.cu; dense.cu for the dense ones).
TEST(WorkspaceQueries, BackendlessFormsAnswerForTheBuiltKernels) {
  GdnChunkArgs qwen = gdnChunk(1, 4096, 16, 32, 128, 128);
  EXPECT_EQ(gdnChunkForwardWorkspaceBytes(qwen),
            gdnChunkForwardWorkspaceBytes(kBuilt, qwen));
  EXPECT_EQ(gdnChunkBackwardWorkspaceBytes(qwen),
            gdnChunkBackwardWorkspaceBytes(kBuilt, qwen));
  GdnConvArgs conv;
  conv.batch = 2;
  conv.seqLen = 1000;
  conv.channels = 512;
  conv.kernelSize = 4;
  EXPECT_EQ(gdnConvBackwardWorkspaceBytes(conv),
            gdnConvBackwardWorkspaceBytes(kBuilt, conv));
  GdnGatedNormArgs norm;
  norm.tokens = 1000;
  norm.heads = 8;
  norm.dim = 2048; // wider than the register-tiled rows
  EXPECT_EQ(gdnGatedNormBackwardWorkspaceBytes(norm),
            gdnGatedNormBackwardWorkspaceBytes(kBuilt, norm));
  // 8000 rows in blocks of 64: 125 fp32 partial rows of 2048.
  EXPECT_EQ(gdnGatedNormBackwardWorkspaceBytes(Backend::Cuda, norm),
            125u * 2048u * 4u);
}

} // namespace
