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
  AttentionForwardArgs fa;
  fa.shape = s;
  fa.q = q.data();
  fa.k = k.data();
  fa.v = v.data();
  fa.o = oRef.data();
  fa.lse = lseRef.data();
  ASSERT_EQ(attentionForward(host, fa), Status::Ok);

  DevBuf dQ(nQ * 2), dK(nK * 2), dV(nV * 2), dOut(nO * 2), dLse(nL * 4),
      dGrad(nO * 2), dDq(nQ * 2), dDk(nK * 2), dDv(nV * 2);
  AttentionBackwardArgs ba;
  ba.shape = s;
  const size_t wsBytes = std::max(detail::attentionBackwardWorkspaceBytesFor(
                                      s, AttentionBackwardAlgo::RecomputeDq),
                                  detail::attentionBackwardWorkspaceBytesFor(
                                      s, AttentionBackwardAlgo::StoredDs));
  ASSERT_GE(wsBytes, attentionBackwardWorkspaceBytes(ba));
  DevBuf ws(std::max<size_t>(wsBytes, 256));
  for (DevBuf *b : {&dQ, &dK, &dV, &dOut, &dLse, &dGrad, &dDq, &dDk, &dDv, &ws})
    ASSERT_NE(b->p, nullptr) << "cudaMalloc";
  CUDA_OK(cudaMemcpy(dQ.p, q.data(), nQ * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dK.p, k.data(), nK * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dV.p, v.data(), nV * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dGrad.p, dO.data(), nO * 2, cudaMemcpyHostToDevice));

  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  KernelContext gpu;
  gpu.backend = Backend::Cuda;
  gpu.stream = nullptr;
  gpu.workspace = ws.p;
  gpu.workspaceBytes = wsBytes;
  gpu.smCount = sms;

  AttentionForwardArgs gf = fa;
  gf.kernels = kernels;
  ba.kernels = kernels;
  gf.q = dQ.p;
  gf.k = dK.p;
  gf.v = dV.p;
  gf.o = dOut.p;
  gf.lse = dLse.p;
  ba.q = dQ.p;
  ba.k = dK.p;
  ba.v = dV.p;
  ba.o = dOut.p;
  ba.lse = dLse.p;
  ba.dO = dGrad.p;
  ba.dq = dDq.p;
  ba.dk = dDk.p;
  ba.dv = dDv.p;

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
  auto restoreDeviceArgs = [&] {
    ba.q = dQ.p;
    ba.k = dK.p;
    ba.v = dV.p;
    ba.o = dOut.p;
    ba.lse = dLse.p;
    ba.dO = dGrad.p;
    ba.dq = dDq.p;
    ba.dk = dDk.p;
    ba.dv = dDv.p;
  };
  restoreDeviceArgs();
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

#else

TEST(AttentionCuda, BuiltWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif

} // namespace
