//===- packed_sequences_test.cpp - documents packed in one row -*- C++ -*-===//
//
// The host kernels with docStart (kernels/kernels.h, "Packed sequences"):
// every op that mixes tokens along the sequence (short conv, chunked gated
// delta rule and its naive oracle, RoPE, attention), forward and backward,
// at F32 and BF16 storage, gives bit for bit what the same op gives on each
// document alone as its own [1, L] row with docStart null. Also the contract
// check (InvalidArgument), a Cuda call in a build without the cuda kernels
// (Unsupported), and documentStarts on hand-written rows. The cuda kernels'
// packed calls are checked on the GPU (gdn_cuda_test, attention_cuda_test,
// dense_cuda_test).
//
//===----------------------------------------------------------------------===//
#include "kernels/kernels.h"
#include "random_data.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

using namespace ap::kernels;

namespace {

using ap::test::randn;
using ap::test::uniform;
using ap::test::unitRows;
using ap::test::Vec;

KernelContext host() { return KernelContext{}; }
KernelContext cudaCtx() {
  KernelContext c;
  c.backend = Backend::Cuda;
  return c;
}

template <class S> constexpr DType dtypeOf() {
  return std::is_same_v<S, bf16> ? DType::BF16 : DType::F32;
}
template <class S> const char *nameOf() {
  return std::is_same_v<S, bf16> ? "bf16" : "f32";
}

/// v in storage S (bf16 through float).
template <class S> std::vector<S> store(const Vec &v) {
  std::vector<S> r(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    r[i] = S(float(v[i]));
  return r;
}

/// Elements [first * per, (first + count) * per) of v.
template <class E>
std::vector<E> part(const std::vector<E> &v, int64_t first, int64_t count,
                    int64_t per) {
  return std::vector<E>(v.begin() + first * per,
                        v.begin() + (first + count) * per);
}

/// a and b hold the same bits (bf16 has no ==, and -0 vs 0 counts).
template <class E>
void expectBitwise(const std::vector<E> &a, const std::vector<E> &b,
                   const std::string &what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(E)) != 0) {
      ADD_FAILURE() << what << ": first difference at element " << i << " of "
                    << a.size() << " (" << double(toFloat(a[i])) << " vs "
                    << double(toFloat(b[i])) << ")";
      return;
    }
}

/// Rows of B x T tokens and their documents.
struct Packing {
  struct Doc {
    int64_t b, t0, len;
    bool first, last; ///< the row's first / last document
    std::string str() const {
      return "row " + std::to_string(b) + " document at " + std::to_string(t0) +
             " (" + std::to_string(len) + " tokens)";
    }
  };
  int64_t B, T;
  std::vector<int32_t> docStart; ///< [B, T]
  std::vector<Doc> docs;         ///< in token order
  Packing(int64_t seq, const std::vector<std::vector<int64_t>> &starts)
      : B(int64_t(starts.size())), T(seq), docStart(size_t(B * T)) {
    for (int64_t b = 0; b < B; ++b) {
      const auto &s = starts[size_t(b)];
      for (size_t d = 0; d < s.size(); ++d) {
        int64_t end = d + 1 < s.size() ? s[d + 1] : T;
        docs.push_back({b, s[d], end - s[d], d == 0, d + 1 == s.size()});
        for (int64_t t = s[d]; t < end; ++t)
          docStart[size_t(b * T + t)] = int32_t(s[d]);
      }
    }
  }
};

/// Row 0: documents of 37, 69 (a full chunk and 5 tokens), 93 and 1 tokens,
/// so that GDN chunks of the documents straddle the row's chunks of 64; row
/// 1: one document.
Packing standardPacking() { return Packing(200, {{0, 37, 106, 199}, {0}}); }

//===----------------------------------------------------------------------===//
// Short conv
//===----------------------------------------------------------------------===//

constexpr int64_t kConvC = 5, kConvK = 4;

template <class S> struct ConvRun {
  std::vector<S> y, dx;
  std::vector<float> dw;
};

/// Forward and backward of the short conv over `batch` rows of T tokens;
/// dw starts at dw0.
template <class S>
ConvRun<S> runConv(int64_t batch, int64_t T, const std::vector<S> &x,
                   const std::vector<S> &w, const std::vector<S> &dy,
                   const std::vector<float> &dw0, const int32_t *docStart) {
  ConvRun<S> r{std::vector<S>(x.size()), std::vector<S>(x.size()), dw0};
  GdnConvArgs a;
  a.dtype = dtypeOf<S>();
  a.batch = batch;
  a.seqLen = T;
  a.channels = kConvC;
  a.kernelSize = int32_t(kConvK);
  a.x = x.data();
  a.w = w.data();
  a.y = r.y.data();
  a.dy = dy.data();
  a.dx = r.dx.data();
  a.dw = r.dw.data();
  a.docStart = docStart;
  EXPECT_EQ(gdnConvForward(host(), a), Status::Ok);
  EXPECT_EQ(gdnConvBackward(host(), a), Status::Ok);
  return r;
}

template <class S> void convPacked() {
  SCOPED_TRACE(nameOf<S>());
  const Packing P = standardPacking();
  const int64_t T = P.T, C = kConvC, K = kConvK;
  auto x = store<S>(randn(size_t(P.B * T * C), 1));
  auto w = store<S>(randn(size_t(C * K), 2, 0.5));
  auto dy = store<S>(randn(x.size(), 3));
  std::vector<float> dw0 = store<float>(randn(size_t(C * K), 4));
  ConvRun<S> packed = runConv(P.B, T, x, w, dy, dw0, P.docStart.data());
  // y and dx: each document alone.
  for (const auto &d : P.docs) {
    SCOPED_TRACE(d.str());
    const int64_t row = d.b * T + d.t0;
    ConvRun<S> one =
        runConv(1, d.len, part(x, row, d.len, C), w, part(dy, row, d.len, C),
                std::vector<float>(size_t(C * K)), nullptr);
    expectBitwise(part(packed.y, row, d.len, C), one.y, "y");
    expectBitwise(part(packed.dx, row, d.len, C), one.dx, "dx");
  }
  // dw sums token contributions in token order (rows, then tokens) onto
  // dw0. A document's run with dy zero but at one token gives that token's
  // contribution exactly (the others are zeros), so adding those in token
  // order rebuilds the packed sum bit for bit. This takes the kernel's
  // products as rounded before they are added, as the host build compiles
  // them (no contraction into fused multiply-adds).
  std::vector<float> expect(size_t(C * K), 0.f);
  for (const auto &d : P.docs) {
    const int64_t row = d.b * T + d.t0;
    auto xd = part(x, row, d.len, C);
    for (int64_t t = 0; t < d.len; ++t) {
      std::vector<S> dyt(size_t(d.len * C), S(0.f));
      for (int64_t c = 0; c < C; ++c)
        dyt[size_t(t * C + c)] = dy[size_t((row + t) * C + c)];
      ConvRun<S> one = runConv(1, d.len, xd, w, dyt,
                               std::vector<float>(size_t(C * K)), nullptr);
      for (size_t i = 0; i < expect.size(); ++i)
        expect[i] += one.dw[i];
    }
  }
  for (size_t i = 0; i < expect.size(); ++i)
    expect[i] = dw0[i] + expect[i];
  expectBitwise(packed.dw, expect, "dw");
}

TEST(PackedSequences, ShortConvF32) { convPacked<float>(); }
TEST(PackedSequences, ShortConvBf16) { convPacked<bf16>(); }

//===----------------------------------------------------------------------===//
// Chunked gated delta rule and the naive oracle
//===----------------------------------------------------------------------===//

constexpr int32_t kHk = 1, kHv = 2, kDk = 8, kDv = 4;
constexpr int64_t kState = int64_t(kDk) * kDv; ///< per (row, value head)

template <class S> struct GdnIn {
  std::vector<S> q, k, v, dO;
  std::vector<float> g, beta;
  std::vector<float> h0, dFinal; ///< empty: null
};

template <class S> struct GdnOut {
  std::vector<S> o, tMat, dq, dk, dv, oNaive;
  std::vector<float> fin, gCum, dg, dbeta, dh0, finNaive;
};

/// Chunk forward, chunk backward and the naive forward over `batch` rows of
/// T tokens.
template <class S>
GdnOut<S> runGdn(int64_t batch, int64_t T, const GdnIn<S> &in,
                 const int32_t *docStart) {
  const size_t N = size_t(batch * T), St = size_t(batch * kHv * kState);
  GdnOut<S> r;
  r.o.resize(N * kHv * kDv);
  r.oNaive.resize(r.o.size());
  r.tMat.resize(N * kHv * kGdnChunk);
  r.dq.resize(in.q.size());
  r.dk.resize(in.k.size());
  r.dv.resize(in.v.size());
  r.fin.resize(St);
  r.finNaive.resize(St);
  r.dh0.resize(St);
  r.gCum.resize(N * kHv);
  r.dg.resize(N * kHv);
  r.dbeta.resize(N * kHv);
  GdnChunkArgs a;
  a.dtype = dtypeOf<S>();
  a.batch = batch;
  a.seqLen = T;
  a.keyHeads = kHk;
  a.valueHeads = kHv;
  a.keyDim = kDk;
  a.valueDim = kDv;
  a.scale = float(1.0 / std::sqrt(double(kDk)));
  a.q = in.q.data();
  a.k = in.k.data();
  a.v = in.v.data();
  a.g = in.g.data();
  a.beta = in.beta.data();
  a.initialState = in.h0.empty() ? nullptr : in.h0.data();
  a.o = r.o.data();
  a.finalState = r.fin.data();
  a.gCum = r.gCum.data();
  a.tMat = r.tMat.data();
  a.dO = in.dO.data();
  a.dFinalState = in.dFinal.empty() ? nullptr : in.dFinal.data();
  a.dq = r.dq.data();
  a.dk = r.dk.data();
  a.dv = r.dv.data();
  a.dg = r.dg.data();
  a.dbeta = r.dbeta.data();
  a.dInitialState = r.dh0.data();
  a.docStart = docStart;
  EXPECT_EQ(gdnChunkForward(host(), a), Status::Ok);
  EXPECT_EQ(gdnChunkBackward(host(), a), Status::Ok);
  a.o = r.oNaive.data();
  a.finalState = r.finNaive.data();
  EXPECT_EQ(gdnRecurrentForwardReference(a), Status::Ok);
  return r;
}

template <class S> void gdnPacked() {
  SCOPED_TRACE(nameOf<S>());
  const Packing P = standardPacking();
  const int64_t T = P.T;
  const size_t N = size_t(P.B * T);
  GdnIn<S> in;
  in.q = store<S>(unitRows(N * kHk, kDk, 11));
  in.k = store<S>(unitRows(N * kHk, kDk, 12));
  in.v = store<S>(randn(N * kHv * kDv, 13));
  in.dO = store<S>(randn(N * kHv * kDv, 14));
  in.g = store<float>(uniform(N * kHv, 15, -0.6, -0.01));
  in.beta = store<float>(uniform(N * kHv, 16, 0.1, 0.95));
  in.h0 = store<float>(randn(size_t(P.B * kHv * kState), 17, 0.3));
  in.dFinal = store<float>(randn(in.h0.size(), 18, 0.3));
  GdnOut<S> packed = runGdn(P.B, T, in, P.docStart.data());
  const int64_t stRow = kHv * kState;
  for (const auto &d : P.docs) {
    SCOPED_TRACE(d.str());
    const int64_t row = d.b * T + d.t0;
    // The document alone: the row's initial state if it is the row's first
    // document, the row's final-state gradient if it is its last.
    GdnIn<S> one;
    one.q = part(in.q, row, d.len, kHk * kDk);
    one.k = part(in.k, row, d.len, kHk * kDk);
    one.v = part(in.v, row, d.len, kHv * kDv);
    one.dO = part(in.dO, row, d.len, kHv * kDv);
    one.g = part(in.g, row, d.len, kHv);
    one.beta = part(in.beta, row, d.len, kHv);
    if (d.first)
      one.h0 = part(in.h0, d.b, 1, stRow);
    if (d.last)
      one.dFinal = part(in.dFinal, d.b, 1, stRow);
    GdnOut<S> s = runGdn(1, d.len, one, nullptr);
    expectBitwise(part(packed.o, row, d.len, kHv * kDv), s.o, "o");
    expectBitwise(part(packed.gCum, row, d.len, kHv), s.gCum, "gCum");
    expectBitwise(part(packed.tMat, row, d.len, kHv * kGdnChunk), s.tMat,
                  "tMat");
    expectBitwise(part(packed.dq, row, d.len, kHk * kDk), s.dq, "dq");
    expectBitwise(part(packed.dk, row, d.len, kHk * kDk), s.dk, "dk");
    expectBitwise(part(packed.dv, row, d.len, kHv * kDv), s.dv, "dv");
    expectBitwise(part(packed.dg, row, d.len, kHv), s.dg, "dg");
    expectBitwise(part(packed.dbeta, row, d.len, kHv), s.dbeta, "dbeta");
    expectBitwise(part(packed.oNaive, row, d.len, kHv * kDv), s.oNaive,
                  "naive o");
    if (d.first)
      expectBitwise(part(packed.dh0, d.b, 1, stRow), s.dh0, "dInitialState");
    if (d.last) {
      expectBitwise(part(packed.fin, d.b, 1, stRow), s.fin, "finalState");
      expectBitwise(part(packed.finNaive, d.b, 1, stRow), s.finNaive,
                    "naive finalState");
    }
  }
}

TEST(PackedSequences, GdnChunkAndNaiveF32) { gdnPacked<float>(); }
TEST(PackedSequences, GdnChunkAndNaiveBf16) { gdnPacked<bf16>(); }

//===----------------------------------------------------------------------===//
// RoPE
//===----------------------------------------------------------------------===//

constexpr int64_t kRopeHeads = 2, kRopeDim = 16;

/// ropeForward (backward = false) or ropeBackward of x.
template <class S>
std::vector<S> runRope(int64_t batch, int64_t T, const std::vector<S> &x,
                       bool backward, const int32_t *docStart) {
  std::vector<S> y(x.size());
  RopeArgs a;
  a.dtype = dtypeOf<S>();
  a.x = x.data();
  a.y = y.data();
  a.batch = batch;
  a.seq = T;
  a.heads = kRopeHeads;
  a.headDim = kRopeDim;
  a.offset = 4;
  a.rotaryDim = 8;
  a.theta = 1e4;
  a.docStart = docStart;
  EXPECT_EQ(backward ? ropeBackward(host(), a) : ropeForward(host(), a),
            Status::Ok);
  return y;
}

template <class S> void ropePacked() {
  SCOPED_TRACE(nameOf<S>());
  const Packing P = standardPacking();
  const int64_t T = P.T, per = kRopeHeads * kRopeDim;
  auto x = store<S>(randn(size_t(P.B * T * per), 21));
  for (bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "backward" : "forward");
    std::vector<S> packed = runRope(P.B, T, x, backward, P.docStart.data());
    for (const auto &d : P.docs) {
      SCOPED_TRACE(d.str());
      const int64_t row = d.b * T + d.t0;
      expectBitwise(
          part(packed, row, d.len, per),
          runRope(1, d.len, part(x, row, d.len, per), backward, nullptr), "y");
    }
  }
}

TEST(PackedSequences, RopeF32) { ropePacked<float>(); }
TEST(PackedSequences, RopeBf16) { ropePacked<bf16>(); }

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

constexpr int32_t kHq = 4, kHkv = 2, kDqk = 8, kDvAtt = 6;

template <class S> struct AttnRun {
  std::vector<S> o, dq, dk, dv;
  std::vector<float> lse; ///< [B, Hq, T]
};

template <class S>
AttnRun<S> runAttention(int64_t batch, int64_t T, const std::vector<S> &q,
                        const std::vector<S> &k, const std::vector<S> &v,
                        const std::vector<S> &dO, const int32_t *docStart) {
  AttnRun<S> r;
  r.o.resize(dO.size());
  r.lse.resize(size_t(batch * kHq * T));
  r.dq.resize(q.size());
  r.dk.resize(k.size());
  r.dv.resize(v.size());
  AttentionShape sh;
  sh.batch = int32_t(batch);
  sh.seqLen = int32_t(T);
  sh.numQHeads = kHq;
  sh.numKvHeads = kHkv;
  sh.headDimQk = kDqk;
  sh.headDimV = kDvAtt;
  sh.softmaxScale = 0.3;
  AttentionForwardArgs f;
  f.dtype = dtypeOf<S>();
  f.shape = sh;
  f.q = q.data();
  f.k = k.data();
  f.v = v.data();
  f.o = r.o.data();
  f.lse = r.lse.data();
  f.docStart = docStart;
  EXPECT_EQ(attentionForward(host(), f), Status::Ok);
  AttentionBackwardArgs b;
  b.dtype = dtypeOf<S>();
  b.shape = sh;
  b.q = q.data();
  b.k = k.data();
  b.v = v.data();
  b.o = r.o.data();
  b.lse = r.lse.data();
  b.dO = dO.data();
  b.dq = r.dq.data();
  b.dk = r.dk.data();
  b.dv = r.dv.data();
  b.docStart = docStart;
  EXPECT_EQ(attentionBackward(host(), b), Status::Ok);
  return r;
}

template <class S> void attentionPacked() {
  SCOPED_TRACE(nameOf<S>());
  const Packing P = standardPacking();
  const int64_t T = P.T, N = P.B * T;
  auto q = store<S>(randn(size_t(N * kHq * kDqk), 31));
  auto k = store<S>(randn(size_t(N * kHkv * kDqk), 32));
  auto v = store<S>(randn(size_t(N * kHkv * kDvAtt), 33));
  auto dO = store<S>(randn(size_t(N * kHq * kDvAtt), 34));
  AttnRun<S> packed = runAttention(P.B, T, q, k, v, dO, P.docStart.data());
  for (const auto &d : P.docs) {
    SCOPED_TRACE(d.str());
    const int64_t row = d.b * T + d.t0;
    AttnRun<S> s = runAttention(1, d.len, part(q, row, d.len, kHq * kDqk),
                                part(k, row, d.len, kHkv * kDqk),
                                part(v, row, d.len, kHkv * kDvAtt),
                                part(dO, row, d.len, kHq * kDvAtt), nullptr);
    expectBitwise(part(packed.o, row, d.len, kHq * kDvAtt), s.o, "o");
    std::vector<float> lse; // the document's [Hq, L] out of [B, Hq, T]
    for (int64_t h = 0; h < kHq; ++h) {
      auto l = part(packed.lse, (d.b * kHq + h) * T + d.t0, d.len, 1);
      lse.insert(lse.end(), l.begin(), l.end());
    }
    expectBitwise(lse, s.lse, "lse");
    expectBitwise(part(packed.dq, row, d.len, kHq * kDqk), s.dq, "dq");
    expectBitwise(part(packed.dk, row, d.len, kHkv * kDqk), s.dk, "dk");
    expectBitwise(part(packed.dv, row, d.len, kHkv * kDvAtt), s.dv, "dv");
  }
}

TEST(PackedSequences, AttentionF32) { attentionPacked<float>(); }
TEST(PackedSequences, AttentionBf16) { attentionPacked<bf16>(); }

//===----------------------------------------------------------------------===//
// The contract check and the Cuda backend
//===----------------------------------------------------------------------===//

/// Valid f32 arguments of every op taking docStart, over 2 rows of 8 tokens.
struct AllOps {
  static constexpr int64_t B = 2, T = 8, N = B * T;
  /// Every input (large enough for each), and one buffer per output.
  std::vector<float> in = std::vector<float>(size_t(N * 64), 0.25f);
  std::vector<std::vector<float>> outs =
      std::vector<std::vector<float>>(18, std::vector<float>(in.size()));
  GdnConvArgs conv;
  GdnChunkArgs chunk;
  RopeArgs rope;
  AttentionForwardArgs attnF;
  AttentionBackwardArgs attnB;

  AllOps() {
    int next = 0;
    auto out = [&] { return outs.at(size_t(next++)).data(); };
    conv.dtype = DType::F32;
    conv.batch = B;
    conv.seqLen = T;
    conv.channels = 3;
    conv.kernelSize = 4;
    conv.x = conv.w = conv.dy = in.data();
    conv.y = out();
    conv.dx = out();
    conv.dw = out();
    chunk.dtype = DType::F32;
    chunk.batch = B;
    chunk.seqLen = T;
    chunk.keyHeads = chunk.valueHeads = 1;
    chunk.keyDim = chunk.valueDim = 4;
    chunk.scale = 0.5f;
    chunk.q = chunk.k = chunk.v = chunk.g = chunk.dO = in.data();
    chunk.beta = in.data();
    chunk.o = out();
    chunk.gCum = out();
    chunk.tMat = out();
    chunk.dq = out();
    chunk.dk = out();
    chunk.dv = out();
    chunk.dg = out();
    chunk.dbeta = out();
    rope.dtype = DType::F32;
    rope.x = in.data();
    rope.y = out();
    rope.batch = B;
    rope.seq = T;
    rope.heads = 1;
    rope.headDim = 8;
    rope.rotaryDim = 8;
    AttentionShape sh;
    sh.batch = B;
    sh.seqLen = T;
    sh.numQHeads = sh.numKvHeads = 1;
    sh.headDimQk = sh.headDimV = 4;
    sh.softmaxScale = 0.5;
    attnF.dtype = attnB.dtype = DType::F32;
    attnF.shape = attnB.shape = sh;
    attnF.q = attnF.k = attnF.v = in.data();
    attnF.o = out();
    attnF.lse = out();
    attnB.q = attnB.k = attnB.v = attnB.o = attnB.lse = attnB.dO = in.data();
    attnB.dq = out();
    attnB.dk = out();
    attnB.dv = out();
  }
  void setDocStart(const int32_t *d) {
    conv.docStart = chunk.docStart = rope.docStart = d;
    attnF.docStart = attnB.docStart = d;
  }
  /// Every entry's status on ctx, each with its name; the naive oracle on
  /// the host only; on cuda the GDN chunk and attention entries alone,
  /// which answer Unsupported before touching a buffer where the build has
  /// no cuda kernels.
  std::vector<std::pair<std::string, Status>> run(const KernelContext &ctx) {
    std::vector<std::pair<std::string, Status>> r = {
        {"gdnChunkForward", gdnChunkForward(ctx, chunk)},
        {"gdnChunkBackward", gdnChunkBackward(ctx, chunk)},
        {"attentionForward", attentionForward(ctx, attnF)},
        {"attentionBackward", attentionBackward(ctx, attnB)}};
    if (ctx.backend == Backend::Host) {
      r.push_back({"gdnConvForward", gdnConvForward(ctx, conv)});
      r.push_back({"gdnConvBackward", gdnConvBackward(ctx, conv)});
      r.push_back({"ropeForward", ropeForward(ctx, rope)});
      r.push_back({"ropeBackward", ropeBackward(ctx, rope)});
      r.push_back({"gdnRecurrentForwardReference",
                   gdnRecurrentForwardReference(chunk)});
    }
    return r;
  }
};

TEST(PackedSequences, ValidDocStartRuns) {
  AllOps ops;
  // Row 0: documents at 0, 3 and 4; row 1: one document.
  std::vector<int32_t> ds = {0, 0, 0, 3, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0};
  ASSERT_TRUE(docStartValid(ds.data(), AllOps::B, AllOps::T));
  ops.setDocStart(ds.data());
  for (const auto &[name, st] : ops.run(host()))
    EXPECT_EQ(st, Status::Ok) << name;
}

TEST(PackedSequences, InvalidDocStartIsInvalidArgument) {
  const std::vector<std::vector<int32_t>> bad = {
      // Row 0 does not start at 0.
      {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0},
      // Row 1's token 5 names neither its predecessor's start nor itself.
      {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 3, 3, 3},
      // A start in the future.
      {0, 0, 5, 5, 5, 5, 5, 5, 0, 0, 0, 0, 0, 0, 0, 0},
      // A document that goes back to an earlier start.
      {0, 0, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
      // Negative.
      {0, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    AllOps ops;
    EXPECT_FALSE(docStartValid(bad[i].data(), AllOps::B, AllOps::T)) << i;
    ops.setDocStart(bad[i].data());
    for (const auto &[name, st] : ops.run(host()))
      EXPECT_EQ(st, Status::InvalidArgument) << name << ", case " << i;
  }
}

// Where the cuda kernels are built, a packed Cuda call reads docStart from
// device memory (these are host buffers): the GPU tests cover it there.
#if !defined(ACTPLACE_HAVE_CUDA)
TEST(PackedSequences, CudaBackendWithoutCudaKernelsIsUnsupported) {
  AllOps ops;
  std::vector<int32_t> ds(size_t(AllOps::N), 0);
  ops.setDocStart(ds.data());
  for (const auto &[name, st] : ops.run(cudaCtx()))
    EXPECT_EQ(st, Status::Unsupported) << name;
}
#endif

//===----------------------------------------------------------------------===//
// documentStarts
//===----------------------------------------------------------------------===//

TEST(PackedSequences, DocumentStartsHandWritten) {
  const int32_t sep = 7;
  const int64_t B = 5, T = 6;
  const std::vector<int32_t> tokens = {
      1, 2, 3, 4, 5, 6, // no separator
      1, 7, 2, 3, 4, 7, // one inside, one at the end
      3, 7, 7, 4, 5, 6, // two in a row: a one-token document between
      7, 1, 2, 3, 4, 5, // at the start
      7, 7, 7, 7, 7, 7, // every token
  };
  const std::vector<int32_t> expect = {
      0, 0, 0, 0, 0, 0, //
      0, 0, 2, 2, 2, 2, //
      0, 0, 2, 3, 3, 3, //
      0, 1, 1, 1, 1, 1, //
      0, 1, 2, 3, 4, 5, //
  };
  std::vector<int32_t> ds(tokens.size(), -1);
  DocumentStartsArgs a;
  a.tokens = tokens.data();
  a.docStart = ds.data();
  a.batch = B;
  a.seq = T;
  a.separator = sep;
  ASSERT_EQ(documentStarts(host(), a), Status::Ok);
  EXPECT_EQ(ds, expect);
  EXPECT_TRUE(docStartValid(ds.data(), B, T));

  DocumentStartsArgs bad = a;
  bad.tokens = nullptr;
  EXPECT_EQ(documentStarts(host(), bad), Status::InvalidArgument);
  bad = a;
  bad.docStart = nullptr;
  EXPECT_EQ(documentStarts(host(), bad), Status::InvalidArgument);
  bad = a;
  bad.seq = 0;
  EXPECT_EQ(documentStarts(host(), bad), Status::InvalidArgument);
#if !defined(ACTPLACE_HAVE_CUDA)
  EXPECT_EQ(documentStarts(cudaCtx(), a), Status::Unsupported);
#endif
}

// documentStarts gives the packing the tests above use, from token ids with
// a separator closing each document but the row's last.
TEST(PackedSequences, DocumentStartsOfStandardPacking) {
  const Packing P = standardPacking();
  const int32_t sep = 0;
  std::vector<int32_t> tokens(P.docStart.size());
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = int32_t(1 + i % 50);
  for (const auto &d : P.docs)
    if (!d.last)
      tokens[size_t(d.b * P.T + d.t0 + d.len - 1)] = sep;
  std::vector<int32_t> ds(tokens.size(), -1);
  DocumentStartsArgs a;
  a.tokens = tokens.data();
  a.docStart = ds.data();
  a.batch = P.B;
  a.seq = P.T;
  a.separator = sep;
  ASSERT_EQ(documentStarts(host(), a), Status::Ok);
  EXPECT_EQ(ds, P.docStart);
}

} // namespace
