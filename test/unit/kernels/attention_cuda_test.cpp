//===- attention_cuda_test.cpp - CUDA attention vs the CPU reference ------===//
//
// On a GPU: the CUDA kernels against the reference (same bf16 inputs, fp32
// math) at the model shapes (Qwen3.5 GQA 8/2 heads x 256 and MLA 192/128 at
// T = 4096) and at small awkward shapes (T not a tile multiple, GQA, every
// supported head-dim pair), the latter also on the portable mma.sync kernels
// where the default is the sm_90a wgmma path. Outputs are poisoned with NaN
// before each call, and a second run must reproduce every bit. Skipped without
// a usable GPU.
//
// Bounds (bf16 storage; the kernels round P and dS to bf16 for the tensor
// cores, the reference keeps them in fp32):
//   o, dq, dk, dv: ||got - ref||_F <= 1e-2 ||ref||_F (o: 5e-3)
//                  and max |got - ref| <= 3e-2 max |ref|
//   lse (fp32):    max |got - ref| <= 1e-4
//
//===----------------------------------------------------------------------===//
#include "kernels/kernels.h"
#include "long_shapes.h"
#include "packed_documents.h"

#include <gtest/gtest.h>

#ifdef ACTPLACE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace ap::kernels;

namespace {

#ifdef ACTPLACE_HAVE_CUDA

#define CUDA_OK(call)                                                          \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_);     \
  } while (0)

bool haveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct Case {
  const char *name;
  int B, T, Hq, Hkv, Dqk, Dv;
  double scale;
};

struct DevBuf {
  void *p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t bytes) : n(bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess)
      p = nullptr;
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf &) = delete;
  DevBuf &operator=(const DevBuf &) = delete;
};

/// A cuda KernelContext on the default stream with `ws` as its workspace
/// and the device's SM count.
KernelContext gpuContext(void *ws, size_t wsBytes) {
  KernelContext gpu;
  gpu.backend = Backend::Cuda;
  gpu.workspace = ws;
  gpu.workspaceBytes = wsBytes;
  cudaDeviceGetAttribute(&gpu.smCount, cudaDevAttrMultiProcessorCount, 0);
  return gpu;
}

/// Forward args over the given buffers (host or device).
AttentionForwardArgs forwardArgsOf(const AttentionShape &s, const void *q,
                                   const void *k, const void *v, void *o,
                                   void *lse) {
  AttentionForwardArgs a;
  a.shape = s;
  a.q = q;
  a.k = k;
  a.v = v;
  a.o = o;
  a.lse = lse;
  return a;
}

/// Device copies of q, k, v, dO and the outputs o, lse, dq, dk, dv of one
/// attention shape (B, T, Hq, Hkv, Dqk, Dv); `ok` is false when an
/// allocation or upload failed.
struct AttnDevice {
  DevBuf q, k, v, o, lse, dO, dq, dk, dv;
  bool ok = true;
  AttnDevice(const AttentionShape &s, const std::vector<bf16> &hq,
             const std::vector<bf16> &hk, const std::vector<bf16> &hv,
             const std::vector<bf16> &hdO)
      : q(hq.size() * 2), k(hk.size() * 2), v(hv.size() * 2),
        o(size_t(s.batch) * s.seqLen * s.numQHeads * s.headDimV * 2),
        lse(size_t(s.batch) * s.numQHeads * s.seqLen * 4), dO(hdO.size() * 2),
        dq(q.n), dk(k.n), dv(v.n) {
    for (DevBuf *b : {&q, &k, &v, &o, &lse, &dO, &dq, &dk, &dv})
      ok = ok && b->p;
    ok = ok && o.n == dO.n &&
         cudaMemcpy(q.p, hq.data(), q.n, cudaMemcpyHostToDevice) ==
             cudaSuccess &&
         cudaMemcpy(k.p, hk.data(), k.n, cudaMemcpyHostToDevice) ==
             cudaSuccess &&
         cudaMemcpy(v.p, hv.data(), v.n, cudaMemcpyHostToDevice) ==
             cudaSuccess &&
         cudaMemcpy(dO.p, hdO.data(), dO.n, cudaMemcpyHostToDevice) ==
             cudaSuccess;
  }
  AttentionForwardArgs forwardArgs(const AttentionShape &s,
                                   AttentionKernels kernels) const {
    AttentionForwardArgs a = forwardArgsOf(s, q.p, k.p, v.p, o.p, lse.p);
    a.kernels = kernels;
    return a;
  }
  AttentionBackwardArgs backwardArgs(const AttentionShape &s,
                                     AttentionKernels kernels) const {
    AttentionBackwardArgs a;
    a.shape = s;
    a.kernels = kernels;
    a.q = q.p;
    a.k = k.p;
    a.v = v.p;
    a.o = o.p;
    a.lse = lse.p;
    a.dO = dO.p;
    a.dq = dq.p;
    a.dk = dk.p;
    a.dv = dv.p;
    return a;
  }
  /// NaN (0xFF bytes) in every output.
  bool poisonOutputs() const {
    for (const DevBuf *b : {&o, &lse, &dq, &dk, &dv})
      if (cudaMemset(b->p, 0xff, b->n) != cudaSuccess)
        return false;
    return true;
  }
};

std::vector<bf16> randomBf16(size_t n, std::mt19937 &rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<bf16> x(n);
  for (auto &e : x)
    e = bf16(nd(rng));
  return x;
}

template <typename T> std::vector<double> widen(const std::vector<T> &x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = toFloat(x[i]);
  return y;
}

/// Asserts every value finite (the poison is NaN) and within the bounds.
void compare(const std::string &what, const std::vector<double> &got,
             const std::vector<double> &ref, double frobTol, double maxTol) {
  double num = 0, den = 0, maxErr = 0, maxRef = 0;
  size_t nonFinite = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++nonFinite;
      continue;
    }
    double e = got[i] - ref[i];
    num += e * e;
    den += ref[i] * ref[i];
    maxErr = std::max(maxErr, std::fabs(e));
    maxRef = std::max(maxRef, std::fabs(ref[i]));
  }
  EXPECT_EQ(nonFinite, 0u) << what << ": outputs left unwritten (NaN poison)";
  if (den == 0.0) {
    // Exactly zero gradients (T = 1: one visible key, dS = 0) must come out
    // exactly zero.
    std::printf("  %-4s reference all zero; max-abs %.3e\n", what.c_str(),
                maxErr);
    EXPECT_EQ(maxErr, 0.0) << what;
    return;
  }
  const double frob = std::sqrt(num / den);
  std::printf("  %-4s rel-Frobenius %.3e  max-abs %.3e  (max|ref| %.3e)\n",
              what.c_str(), frob, maxErr, maxRef);
  EXPECT_LE(frob, frobTol) << what;
  EXPECT_LE(maxErr, maxTol * maxRef) << what;
}

void runCase(const Case &c,
             AttentionKernels kernels = AttentionKernels::Fastest) {
  SCOPED_TRACE(c.name);
  std::printf("[%s] B=%d T=%d Hq=%d Hkv=%d Dqk=%d Dv=%d\n", c.name, c.B, c.T,
              c.Hq, c.Hkv, c.Dqk, c.Dv);
  AttentionShape s;
  s.batch = c.B;
  s.seqLen = c.T;
  s.numQHeads = c.Hq;
  s.numKvHeads = c.Hkv;
  s.headDimQk = c.Dqk;
  s.headDimV = c.Dv;
  s.softmaxScale = c.scale;
  const size_t nQ = size_t(c.B) * c.T * c.Hq * c.Dqk;
  const size_t nK = size_t(c.B) * c.T * c.Hkv * c.Dqk;
  const size_t nV = size_t(c.B) * c.T * c.Hkv * c.Dv;
  const size_t nO = size_t(c.B) * c.T * c.Hq * c.Dv;
  const size_t nL = size_t(c.B) * c.Hq * c.T;

  std::mt19937 rng(1000u + c.T + c.Hq);
  std::vector<bf16> q = randomBf16(nQ, rng), k = randomBf16(nK, rng),
                    v = randomBf16(nV, rng), dO = randomBf16(nO, rng);

  // Reference forward, then reference backward from the GPU's own saved o
  // and lse (checked equal to the reference's first), so the backward
  // comparison isolates the backward kernels.
  std::vector<bf16> oRef(nO), dqRef(nQ), dkRef(nK), dvRef(nV);
  std::vector<float> lseRef(nL);
  KernelContext host;
  AttentionForwardArgs fa = forwardArgsOf(s, q.data(), k.data(), v.data(),
                                          oRef.data(), lseRef.data());
  ASSERT_EQ(attentionForward(host, fa), Status::Ok);

  AttnDevice dev(s, q, k, v, dO);
  ASSERT_TRUE(dev.ok) << "cudaMalloc or upload";
  DevBuf &dOut = dev.o, &dLse = dev.lse, &dDq = dev.dq, &dDk = dev.dk,
         &dDv = dev.dv;
  AttentionBackwardArgs ba = dev.backwardArgs(s, kernels);
  const size_t wsBytes = std::max(detail::attentionBackwardWorkspaceBytesFor(
                                      s, AttentionBackwardAlgo::RecomputeDq),
                                  detail::attentionBackwardWorkspaceBytesFor(
                                      s, AttentionBackwardAlgo::StoredDs));
  ASSERT_GE(wsBytes, attentionBackwardWorkspaceBytes(ba));
  DevBuf ws(std::max<size_t>(wsBytes, 256));
  ASSERT_NE(ws.p, nullptr) << "cudaMalloc";

  const KernelContext gpu = gpuContext(ws.p, wsBytes);

  const AttentionForwardArgs gf = dev.forwardArgs(s, kernels);

  struct Result {
    std::vector<bf16> o, dq, dk, dv;
    std::vector<float> lse;
  };
  auto runGpu = [&](Result &r, AttentionBackwardAlgo algo) {
    // NaN everywhere an output goes, and in the workspace.
    for (DevBuf *b : {&dOut, &dLse, &dDq, &dDk, &dDv, &ws})
      CUDA_OK(cudaMemset(b->p, 0xff, b->n));
    ASSERT_EQ(attentionForward(gpu, gf), Status::Ok);
    ASSERT_EQ(cuda::attentionBackwardWithAlgo(gpu, ba, algo), Status::Ok);
    CUDA_OK(cudaDeviceSynchronize());
    r.o.resize(nO);
    r.lse.resize(nL);
    r.dq.resize(nQ);
    r.dk.resize(nK);
    r.dv.resize(nV);
    CUDA_OK(cudaMemcpy(r.o.data(), dOut.p, nO * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(r.lse.data(), dLse.p, nL * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(r.dq.data(), dDq.p, nQ * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(r.dk.data(), dDk.p, nK * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(r.dv.data(), dDv.p, nV * 2, cudaMemcpyDeviceToHost));
  };
  Result r1, r2;
  runGpu(r1, AttentionBackwardAlgo::RecomputeDq);
  if (::testing::Test::HasFatalFailure())
    return;

  compare("o", widen(r1.o), widen(oRef), 5e-3, 3e-2);
  {
    double maxErr = 0;
    size_t nonFinite = 0;
    for (size_t i = 0; i < nL; ++i) {
      if (!std::isfinite(r1.lse[i]))
        ++nonFinite;
      else
        maxErr = std::max(maxErr, double(std::fabs(r1.lse[i] - lseRef[i])));
    }
    std::printf("  lse  max-abs %.3e\n", maxErr);
    EXPECT_EQ(nonFinite, 0u) << "lse";
    EXPECT_LE(maxErr, 1e-4) << "lse";
  }

  // Reference backward on the GPU's saved o and lse.
  ba.q = q.data();
  ba.k = k.data();
  ba.v = v.data();
  ba.o = r1.o.data();
  ba.lse = r1.lse.data();
  ba.dO = dO.data();
  ba.dq = dqRef.data();
  ba.dk = dkRef.data();
  ba.dv = dvRef.data();
  ASSERT_EQ(attentionBackward(host, ba), Status::Ok);
  const std::vector<double> dqW = widen(dqRef), dkW = widen(dkRef),
                            dvW = widen(dvRef);
  const std::vector<bf16> o1 = r1.o;
  const std::vector<float> lse1 = r1.lse;
  ba = dev.backwardArgs(s, kernels);
  Result first[2];
  const AttentionBackwardAlgo algos[2] = {AttentionBackwardAlgo::RecomputeDq,
                                          AttentionBackwardAlgo::StoredDs};
  for (int a = 0; a < 2; ++a) {
    std::printf(" backward %s\n", a == 0 ? "RecomputeDq" : "StoredDs");
    if (a == 0) {
      first[0] = r1;
    } else {
      runGpu(first[1], algos[1]);
      if (::testing::Test::HasFatalFailure())
        return;
    }
    const Result &ra = first[a];
    compare("dq", widen(ra.dq), dqW, 1e-2, 3e-2);
    compare("dk", widen(ra.dk), dkW, 1e-2, 3e-2);
    compare("dv", widen(ra.dv), dvW, 1e-2, 3e-2);

    // Bitwise run-to-run determinism (outputs re-poisoned in between).
    runGpu(r2, algos[a]);
    if (::testing::Test::HasFatalFailure())
      return;
    EXPECT_EQ(std::memcmp(o1.data(), r2.o.data(), nO * 2), 0) << "o";
    EXPECT_EQ(std::memcmp(lse1.data(), r2.lse.data(), nL * 4), 0) << "lse";
    EXPECT_EQ(std::memcmp(ra.dq.data(), r2.dq.data(), nQ * 2), 0) << "dq";
    EXPECT_EQ(std::memcmp(ra.dk.data(), r2.dk.data(), nK * 2), 0) << "dk";
    EXPECT_EQ(std::memcmp(ra.dv.data(), r2.dv.data(), nV * 2), 0) << "dv";
  }
  // Both algorithms share the dK/dV pass: identical bits.
  EXPECT_EQ(std::memcmp(first[0].dk.data(), first[1].dk.data(), nK * 2), 0);
  EXPECT_EQ(std::memcmp(first[0].dv.data(), first[1].dv.data(), nV * 2), 0);
}

constexpr Case kSmallCases[] = {
    {"gqa-d64-T200", 2, 200, 4, 2, 64, 64, 0.125},
    {"gqa-d256-T200", 2, 200, 4, 1, 256, 256, 0.0625},
    {"mla-T77", 1, 77, 3, 3, 192, 128, 0.0721687836},
    {"mha-d128-T130", 1, 130, 2, 2, 128, 128, 0.0883883476},
    {"gqa-d64-T1", 1, 1, 2, 1, 64, 64, 0.125},
};

TEST(AttentionCuda, SmallAwkwardShapes) {
  if (!haveGpu())
    GTEST_SKIP() << "no usable GPU";
  for (const Case &c : kSmallCases)
    runCase(c);
}

/// The portable mma.sync kernels, which an sm_90a build on an H100/H200 only
/// runs when the call asks for them (AttentionKernels::Portable; elsewhere
/// they are the fastest available and this repeats the test above).
TEST(AttentionCuda, SmallAwkwardShapesPortable) {
  if (!haveGpu())
    GTEST_SKIP() << "no usable GPU";
  for (const Case &c : kSmallCases)
    runCase(c, AttentionKernels::Portable);
}

TEST(AttentionCuda, Qwen35FullAttentionT4096) {
  if (!haveGpu())
    GTEST_SKIP() << "no usable GPU";
  runCase({"qwen3.5-gqa", 1, 4096, 8, 2, 256, 256, 1.0 / 16});
}

TEST(AttentionCuda, MlaV2LiteT4096) {
  if (!haveGpu())
    GTEST_SKIP() << "no usable GPU";
  runCase({"mla-16h", 1, 4096, 16, 16, 192, 128, 1.0 / std::sqrt(192.0)});
}

TEST(AttentionCuda, Mla128HeadsT1024) {
  if (!haveGpu())
    GTEST_SKIP() << "no usable GPU";
  runCase({"mla-128h", 1, 1024, 128, 128, 192, 128, 1.0 / std::sqrt(192.0)});
}

TEST(AttentionCuda, RejectsUnsupported) {
  if (!haveGpu())
    GTEST_SKIP() << "no usable GPU";
  KernelContext gpu;
  gpu.backend = Backend::Cuda;
  AttentionForwardArgs fa;
  fa.shape = {1, 8, 2, 2, 96, 96, 0.1}; // head dim without a kernel
  int dummy = 0;
  fa.q = fa.k = fa.v = &dummy;
  fa.o = fa.lse = &dummy;
  EXPECT_EQ(attentionForward(gpu, fa), Status::Unsupported);
  fa.shape = {1, 8, 2, 2, 64, 64, 0.1};
  fa.dtype = DType::F32; // CUDA kernels are bf16 only
  EXPECT_EQ(attentionForward(gpu, fa), Status::Unsupported);
}

//===----------------------------------------------------------------------===//
// Packed sequences
//===----------------------------------------------------------------------===//

/// Two rows of 200 tokens, row 0 holding documents at 0, 37, 106 and 199
/// (kernels/kernels.h, docStart), row 1 one document. The packed forward and
/// default backward write every output (NaN poison), equal bitwise what the
/// kernels give for each document alone as its own row copied into fresh
/// buffers (o, lse, dq, dk, dv), and the packed o and lse match the host
/// reference of the packed rows within the bounds above.
void runPacked(const Case &c, AttentionKernels kernels) {
  SCOPED_TRACE(c.name);
  const ap::test::PackedRow &row0 = ap::test::kPackedRow200;
  ASSERT_EQ(c.B, 2);
  ASSERT_EQ(c.T, row0.T);
  AttentionShape s{c.B, c.T, c.Hq, c.Hkv, c.Dqk, c.Dv, c.scale};
  const size_t N = size_t(c.B) * c.T;
  const size_t qw = size_t(c.Hq) * c.Dqk, kw = size_t(c.Hkv) * c.Dqk,
               vw = size_t(c.Hkv) * c.Dv, ow = size_t(c.Hq) * c.Dv;
  std::vector<int32_t> ds = row0.docStart();
  ds.resize(N, 0);
  std::mt19937 rng(77u + c.Hq);
  std::vector<bf16> q = randomBf16(N * qw, rng), k = randomBf16(N * kw, rng),
                    v = randomBf16(N * vw, rng), dO = randomBf16(N * ow, rng);
  AttnDevice dev(s, q, k, v, dO);
  ASSERT_TRUE(dev.ok);
  DevBuf dDs(ds.size() * 4);
  CUDA_OK(cudaMemcpy(dDs.p, ds.data(), dDs.n, cudaMemcpyHostToDevice));
  AttentionForwardArgs fa = dev.forwardArgs(s, kernels);
  AttentionBackwardArgs ba = dev.backwardArgs(s, kernels);
  fa.docStart = ba.docStart = static_cast<const int32_t *>(dDs.p);
  const size_t wsBytes =
      std::max<size_t>(attentionBackwardWorkspaceBytes(ba), 256);
  DevBuf ws(wsBytes);
  ASSERT_NE(ws.p, nullptr);
  const KernelContext gpu = gpuContext(ws.p, wsBytes);
  ASSERT_TRUE(dev.poisonOutputs());
  ASSERT_EQ(attentionForward(gpu, fa), Status::Ok);
  ASSERT_EQ(attentionBackward(gpu, ba), Status::Ok);
  CUDA_OK(cudaDeviceSynchronize());
  auto fetch = [](const DevBuf &b) {
    std::vector<unsigned char> h(b.n);
    EXPECT_EQ(cudaMemcpy(h.data(), b.p, b.n, cudaMemcpyDeviceToHost),
              cudaSuccess);
    return h;
  };
  const auto po = fetch(dev.o), plse = fetch(dev.lse), pdq = fetch(dev.dq),
             pdk = fetch(dev.dk), pdv = fetch(dev.dv);
  {
    std::vector<float> lse(N * c.Hq);
    std::memcpy(lse.data(), plse.data(), plse.size());
    size_t bad = 0;
    for (float x : lse)
      bad += !std::isfinite(x);
    EXPECT_EQ(bad, 0u) << "lse has unwritten elements";
  }
  struct Doc {
    int b, start, len;
  };
  std::vector<Doc> docs;
  for (size_t d = 0; d < row0.documents(); ++d)
    docs.push_back({0, row0.starts[d], row0.length(d)});
  docs.push_back({1, 0, c.T});
  for (const Doc &doc : docs) {
    SCOPED_TRACE(::testing::Message()
                 << "document at row " << doc.b << " token " << doc.start);
    const size_t L = size_t(doc.len), tok = size_t(doc.b) * c.T + doc.start;
    AttentionShape one{1, doc.len, c.Hq, c.Hkv, c.Dqk, c.Dv, c.scale};
    auto slice = [&](const std::vector<bf16> &x, size_t w) {
      return std::vector<bf16>(x.begin() + tok * w, x.begin() + (tok + L) * w);
    };
    AttnDevice alone(one, slice(q, qw), slice(k, kw), slice(v, vw),
                     slice(dO, ow));
    ASSERT_TRUE(alone.ok);
    ASSERT_TRUE(alone.poisonOutputs());
    ASSERT_EQ(attentionForward(gpu, alone.forwardArgs(one, kernels)),
              Status::Ok);
    ASSERT_EQ(attentionBackward(gpu, alone.backwardArgs(one, kernels)),
              Status::Ok);
    CUDA_OK(cudaDeviceSynchronize());
    struct Cmp {
      const char *name;
      const DevBuf *alone;
      const std::vector<unsigned char> *packed;
      size_t width;
    };
    for (Cmp m :
         {Cmp{"o", &alone.o, &po, ow}, Cmp{"dq", &alone.dq, &pdq, qw},
          Cmp{"dk", &alone.dk, &pdk, kw}, Cmp{"dv", &alone.dv, &pdv, vw}}) {
      const auto al = fetch(*m.alone);
      EXPECT_TRUE(std::equal(al.begin(), al.end(),
                             m.packed->begin() + tok * m.width * 2))
          << m.name;
    }
    const auto al = fetch(alone.lse);
    for (int h = 0; h < c.Hq; ++h)
      EXPECT_EQ(
          std::memcmp(al.data() + size_t(h) * L * 4,
                      plse.data() +
                          ((size_t(doc.b) * c.Hq + h) * c.T + doc.start) * 4,
                      L * 4),
          0)
          << "lse of head " << h;
  }
  // The host reference of the packed rows.
  std::vector<bf16> oRef(N * ow);
  std::vector<float> lseRef(N * c.Hq), lseGot(N * c.Hq);
  AttentionForwardArgs hf = forwardArgsOf(s, q.data(), k.data(), v.data(),
                                          oRef.data(), lseRef.data());
  hf.docStart = ds.data();
  ASSERT_EQ(attentionForward(KernelContext{}, hf), Status::Ok);
  std::vector<bf16> oGot(N * ow);
  std::memcpy(oGot.data(), po.data(), po.size());
  std::memcpy(lseGot.data(), plse.data(), plse.size());
  compare("o", widen(oGot), widen(oRef), 5e-3, 3e-2);
  double maxErr = 0;
  for (size_t i = 0; i < lseRef.size(); ++i)
    maxErr = std::max(maxErr, double(std::fabs(lseGot[i] - lseRef[i])));
  EXPECT_LE(maxErr, 1e-4) << "lse";
}

TEST(AttentionCuda, PackedDocumentsAsRows) {
  if (!haveGpu())
    GTEST_SKIP() << "no usable GPU";
  const Case cases[] = {
      {"packed-gqa-d256", 2, 200, 4, 2, 256, 256, 0.0625},
      {"packed-mla", 2, 200, 3, 3, 192, 128, 0.0721687836},
  };
  for (const Case &c : cases)
    for (AttentionKernels k :
         {AttentionKernels::Fastest, AttentionKernels::Portable})
      runPacked(c, k);
}

//===----------------------------------------------------------------------===//
// Long sequences: Qwen3.5-0.8B's full attention at 32768 and 131072 tokens
//===----------------------------------------------------------------------===//
//
// Run alone with --gtest_filter='*Long*'. The kernels run on the whole
// sequence (B = 1, 8 q heads / 2 kv heads of 256) from poisoned outputs and
// workspace between guard bands: every output finite, the guards intact
// (no more scratch than the workspace query), a second run the same bits.
// float64 math then checks slices, with the bounds of the tests above:
//   - query rows (first, around tile edges, middle, last) of four q heads:
//     o and lse from their full causal rows, dq from o, lse and dO;
//   - key rows (first, tile edge, middle, last) of both kv heads: dk and dv
//     summed over the group's q heads and every query that sees the key,
//     with P from the GPU's lse and D = dO . o from the GPU's o (the forward
//     rows above check those), as the reference backward above does.

using ap::test::ErrAcc;
using ap::test::fastUniform;
using ap::test::GuardedWorkspace;
using ap::test::nonFiniteBf16;
using ap::test::nonFiniteF32;
using ap::test::parallelFor;

void runLongAttention(int T, bool bothAlgos) {
  constexpr int Hq = 8, Hkv = 2, D = 256, G = Hq / Hkv;
  const double scale = 1.0 / 16;
  SCOPED_TRACE(testing::Message() << "T=" << T);
  AttentionShape s;
  s.batch = 1;
  s.seqLen = T;
  s.numQHeads = Hq;
  s.numKvHeads = Hkv;
  s.headDimQk = D;
  s.headDimV = D;
  s.softmaxScale = scale;
  const size_t N = size_t(T), nQ = N * Hq * D, nK = N * Hkv * D, nL = N * Hq;
  auto q = fastUniform<bf16>(nQ, 11, -1.7, 1.7),
       k = fastUniform<bf16>(nK, 12, -1.7, 1.7),
       v = fastUniform<bf16>(nK, 13, -1.7, 1.7),
       dO = fastUniform<bf16>(nQ, 14, -1.7, 1.7);
  AttnDevice dev(s, q, k, v, dO);
  ASSERT_TRUE(dev.ok) << "cudaMalloc or upload";
  const AttentionForwardArgs fa = dev.forwardArgs(s, AttentionKernels::Fastest);
  const AttentionBackwardArgs ba =
      dev.backwardArgs(s, AttentionKernels::Fastest);
  const AttentionBackwardAlgo def = detail::attentionBackwardDefaultAlgo(s);
  std::vector<AttentionBackwardAlgo> algos = {def};
  if (bothAlgos)
    algos.push_back(def == AttentionBackwardAlgo::StoredDs
                        ? AttentionBackwardAlgo::RecomputeDq
                        : AttentionBackwardAlgo::StoredDs);
  size_t wsBytes = 0;
  for (AttentionBackwardAlgo al : algos)
    wsBytes =
        std::max(wsBytes, detail::attentionBackwardWorkspaceBytesFor(s, al));
  std::printf("[attention long] T=%d default %s, workspace %.2f GB\n", T,
              def == AttentionBackwardAlgo::StoredDs ? "StoredDs"
                                                     : "RecomputeDq",
              wsBytes / 1e9);
  GuardedWorkspace ws(wsBytes);
  ASSERT_NE(ws.p(), nullptr) << "cudaMalloc of " << wsBytes << " bytes";
  const KernelContext gpu = gpuContext(ws.p(), wsBytes);
  auto raw = [](const DevBuf &b) {
    std::vector<unsigned char> r(b.n);
    cudaMemcpy(r.data(), b.p, b.n, cudaMemcpyDeviceToHost);
    return r;
  };
  // Outputs of the default algorithm's first run.
  std::vector<unsigned char> ro, rl, rdq, rdk, rdv;
  for (size_t ai = 0; ai < algos.size(); ++ai)
    for (int run = 0; run < 2; ++run) {
      SCOPED_TRACE(testing::Message()
                   << "algorithm " << int(algos[ai]) << " run " << run);
      ASSERT_TRUE(dev.poisonOutputs());
      ws.poison();
      ASSERT_EQ(attentionForward(gpu, fa), Status::Ok);
      ASSERT_EQ(cuda::attentionBackwardWithAlgo(gpu, ba, algos[ai]),
                Status::Ok);
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_TRUE(ws.intact()) << "wrote outside its workspace";
      auto o = raw(dev.o), l = raw(dev.lse), gq = raw(dev.dq), gk = raw(dev.dk),
           gv = raw(dev.dv);
      if (ai == 0 && run == 0) {
        EXPECT_EQ(nonFiniteBf16(o.data(), nQ), 0u) << "o";
        EXPECT_EQ(nonFiniteF32(l.data(), nL), 0u) << "lse";
        EXPECT_EQ(nonFiniteBf16(gq.data(), nQ), 0u) << "dq";
        EXPECT_EQ(nonFiniteBf16(gk.data(), nK), 0u) << "dk";
        EXPECT_EQ(nonFiniteBf16(gv.data(), nK), 0u) << "dv";
        ro = std::move(o), rl = std::move(l), rdq = std::move(gq),
        rdk = std::move(gk), rdv = std::move(gv);
        continue;
      }
      // The forward, dk and dv are the same bits for both algorithms; dq
      // of the other algorithm differs in summation order only.
      EXPECT_TRUE(o == ro && l == rl) << "forward differs";
      EXPECT_TRUE(gk == rdk && gv == rdv) << "dk/dv differ";
      if (ai == 0)
        EXPECT_TRUE(gq == rdq) << "dq differs between runs";
      else
        EXPECT_EQ(nonFiniteBf16(gq.data(), nQ), 0u) << "dq";
    }
  if (::testing::Test::HasFatalFailure())
    return;

  auto at = [](const std::vector<bf16> &x, size_t i) {
    return double(toFloat(x[i]));
  };
  auto dot = [&](const std::vector<bf16> &a, size_t ia,
                 const std::vector<bf16> &b, size_t ib) {
    double acc = 0;
    for (int c = 0; c < D; ++c)
      acc += at(a, ia + c) * at(b, ib + c);
    return acc;
  };
  const size_t rows[] = {0, 1, 63, 64, 1000, N / 2 + 17, N - 65, N - 2, N - 1};
  const int heads[] = {0, 3, 4, 7};
  struct QTask {
    int h;
    size_t i;
  };
  std::vector<QTask> qt;
  for (int h : heads)
    for (size_t i : rows)
      qt.push_back({h, i});
  // Query rows: o, lse, dq in float64 from the inputs alone.
  std::vector<ErrAcc> eo(qt.size()), edq(qt.size());
  std::vector<double> lseErr(qt.size());
  parallelFor(qt.size(), [&](size_t t) {
    const int h = qt[t].h, hk = h / G;
    const size_t i = qt[t].i, qi = (i * Hq + h) * D;
    std::vector<double> sc(i + 1);
    double m = -INFINITY;
    for (size_t j = 0; j <= i; ++j) {
      sc[j] = scale * dot(q, qi, k, (j * Hkv + hk) * D);
      m = std::max(m, sc[j]);
    }
    double l = 0;
    for (size_t j = 0; j <= i; ++j)
      l += std::exp(sc[j] - m);
    const double lse = m + std::log(l);
    std::vector<double> o(D, 0.0), dq(D, 0.0);
    for (size_t j = 0; j <= i; ++j) {
      const double p = std::exp(sc[j] - lse);
      for (int c = 0; c < D; ++c)
        o[c] += p * at(v, (j * Hkv + hk) * D + c);
    }
    double Di = 0;
    for (int c = 0; c < D; ++c)
      Di += at(dO, qi + c) * o[c];
    for (size_t j = 0; j <= i; ++j) {
      const double p = std::exp(sc[j] - lse);
      const double ds = p * (dot(dO, qi, v, (j * Hkv + hk) * D) - Di);
      for (int c = 0; c < D; ++c)
        dq[c] += scale * ds * at(k, (j * Hkv + hk) * D + c);
    }
    for (int c = 0; c < D; ++c) {
      eo[t].add(ap::test::bfAt(ro, qi + c), o[c]);
      edq[t].add(ap::test::bfAt(rdq, qi + c), dq[c]);
    }
    lseErr[t] = std::fabs(ap::test::f32At(rl, size_t(h) * N + i) - lse);
  });
  // Key rows: dk, dv over the group's q heads and the queries i >= j.
  const size_t keys[] = {0, 1, 64, N / 2, N - 64, N - 1};
  struct KTask {
    int hk;
    size_t j;
  };
  std::vector<KTask> kt;
  for (int hk = 0; hk < Hkv; ++hk)
    for (size_t j : keys)
      kt.push_back({hk, j});
  std::vector<ErrAcc> edk(kt.size()), edv(kt.size());
  parallelFor(kt.size(), [&](size_t t) {
    const int hk = kt[t].hk;
    const size_t j = kt[t].j, kj = (j * Hkv + hk) * D;
    std::vector<double> dk(D, 0.0), dv(D, 0.0);
    for (int h = hk * G; h < (hk + 1) * G; ++h)
      for (size_t i = j; i < N; ++i) {
        const size_t qi = (i * Hq + h) * D;
        const double lse = ap::test::f32At(rl, size_t(h) * N + i);
        const double p = std::exp(scale * dot(q, qi, k, kj) - lse);
        double Di = 0;
        for (int c = 0; c < D; ++c)
          Di += at(dO, qi + c) * ap::test::bfAt(ro, qi + c);
        const double ds = p * (dot(dO, qi, v, kj) - Di);
        for (int c = 0; c < D; ++c) {
          dv[c] += p * at(dO, qi + c);
          dk[c] += scale * ds * at(q, qi + c);
        }
      }
    for (int c = 0; c < D; ++c) {
      edk[t].add(ap::test::bfAt(rdk, kj + c), dk[c]);
      edv[t].add(ap::test::bfAt(rdv, kj + c), dv[c]);
    }
  });
  ErrAcc to, tdq, tdk, tdv;
  double tl = 0;
  for (size_t t = 0; t < qt.size(); ++t) {
    to.merge(eo[t]);
    tdq.merge(edq[t]);
    tl = std::max(tl, lseErr[t]);
  }
  for (size_t t = 0; t < kt.size(); ++t) {
    tdk.merge(edk[t]);
    tdv.merge(edv[t]);
  }
  std::printf("[attention long] T=%d %zu query rows: o frob %.2e max %.2e, "
              "lse max-abs %.2e, dq frob %.2e max %.2e; %zu key rows: dk "
              "frob %.2e max %.2e, dv frob %.2e max %.2e\n",
              T, qt.size(), to.frob(), to.rel(), tl, tdq.frob(), tdq.rel(),
              kt.size(), tdk.frob(), tdk.rel(), tdv.frob(), tdv.rel());
  EXPECT_LE(to.frob(), 5e-3);
  EXPECT_LE(to.rel(), 3e-2);
  EXPECT_LE(tl, 1e-4);
  for (const ErrAcc *e : {&tdq, &tdk, &tdv}) {
    EXPECT_LE(e->frob(), 1e-2);
    EXPECT_LE(e->rel(), 3e-2);
  }
}

/// Both backward algorithms at 32768 tokens (StoredDs then takes 1 GiB of
/// dS tiles per (batch, head) pair, one pair per launch).
TEST(AttentionCuda, LongT32768Qwen35Gqa) {
  if (!haveGpu())
    GTEST_SKIP() << "no usable GPU";
  runLongAttention(32768, true);
}

TEST(AttentionCuda, LongT131072Qwen35Gqa) {
  if (!haveGpu())
    GTEST_SKIP() << "no usable GPU";
  runLongAttention(131072, false);
}

#else

TEST(AttentionCuda, BuiltWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

} // namespace
