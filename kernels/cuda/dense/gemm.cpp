//===- gemm.cpp - dense CUDA kernels: cuBLASLt GEMM -----------------*- C++
//-*-===//
//
// Every linear layer's GEMM through cuBLASLt: bf16 A/B, FP32 compute and
// scale, bf16 or fp32 D. The heuristic runs once per shape key with a fixed
// workspace limit and 256-byte alignment assumed for every operand (the
// runtime's buffers are 256-byte aligned), never with the actual pointers, and
// the chosen algorithm is cached: placement cannot change which algorithm
// runs. cuBLASLt results are bitwise reproducible for a fixed algorithm on a
// fixed GPU (its split-K reductions are ordered), so the GEMMs are
// deterministic.
//
// A context with an SM target (the side stream's) runs the same algorithm
// through a second descriptor that also carries
// CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: the GEMM's persistent CTAs then
// leave SMs to the compute stream's kernel beside it. The heuristic never
// sees that descriptor, so the target cannot change the algorithm or a bit
// of the result.
//
//===----------------------------------------------------------------------===//
#include "kernels/cuda/dense/dense_cuda.h"

#include <cublasLt.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#define AP_CUBLAS_CHECK(call)                                                  \
  do {                                                                         \
    cublasStatus_t apSt_ = (call);                                             \
    if (apSt_ != CUBLAS_STATUS_SUCCESS) {                                      \
      std::fprintf(stderr, "actplace dense: %s failed: status %d (%s:%d)\n",   \
                   #call, int(apSt_), __FILE__, __LINE__);                     \
      return ::ap::kernels::Status::BackendError;                              \
    }                                                                          \
  } while (0)

namespace ap::kernels::cuda {
namespace {

using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int, bool, int>;

/// A cached GEMM: descriptors and the algorithm. Everything but `targeted`
/// is immutable once built; `targeted` grows under gPlanMutex.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  /// `desc` plus CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, per SM target.
  std::map<int32_t, cublasLtMatmulDesc_t> targeted;
  ~Plan() {
    for (auto &[target, t] : targeted)
      cublasLtMatmulDescDestroy(t);
    if (d)
      cublasLtMatrixLayoutDestroy(d);
    if (b)
      cublasLtMatrixLayoutDestroy(b);
    if (a)
      cublasLtMatrixLayoutDestroy(a);
    if (desc)
      cublasLtMatmulDescDestroy(desc);
  }
};

std::mutex gPlanMutex;
std::map<Key, std::unique_ptr<Plan>> gPlans;

/// Sets the operation attributes of `desc`; with smTarget > 0 also the SM
/// count target (a run-time hint, never given to the heuristic).
Status setDescAttributes(cublasLtMatmulDesc_t desc, const GemmShape &s,
                         int32_t smTarget) {
  cublasOperation_t opA = s.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opB = s.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
  AP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
      desc, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)));
  AP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
      desc, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)));
  if (smTarget > 0)
    AP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &smTarget,
        sizeof(smTarget)));
  return Status::Ok;
}

/// The descriptor of `p` with SM target `smTarget`, built on first use.
/// Caller holds gPlanMutex.
Status targetedDesc(const GemmShape &s, int32_t smTarget, Plan &p,
                    cublasLtMatmulDesc_t &out) {
  auto it = p.targeted.find(smTarget);
  if (it != p.targeted.end()) {
    out = it->second;
    return Status::Ok;
  }
  cublasLtMatmulDesc_t desc = nullptr;
  AP_CUBLAS_CHECK(
      cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  if (Status st = setDescAttributes(desc, s, smTarget); st != Status::Ok) {
    cublasLtMatmulDescDestroy(desc);
    return st;
  }
  p.targeted.emplace(smTarget, desc);
  out = desc;
  return Status::Ok;
}

Status buildPlan(cublasLtHandle_t handle, const GemmShape &s, Plan &p) {
  AP_CUBLAS_CHECK(
      cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  if (Status st = setDescAttributes(p.desc, s, 0); st != Status::Ok)
    return st;
  // Stored (pre-op) shapes, column-major.
  uint64_t aRows = s.transA ? s.k : s.m, aCols = s.transA ? s.m : s.k;
  uint64_t bRows = s.transB ? s.n : s.k, bCols = s.transB ? s.k : s.n;
  cudaDataType_t dt = s.dType == GemmType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  AP_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, aRows, aCols, s.lda));
  AP_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, bRows, bCols, s.ldb));
  AP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, dt, s.m, s.n, s.ldd));

  cublasLtMatmulPreference_t pref = nullptr;
  AP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::unique_ptr<void, void (*)(void *)> prefGuard(pref, [](void *q) {
    cublasLtMatmulPreferenceDestroy(static_cast<cublasLtMatmulPreference_t>(q));
  });
  uint64_t ws = ref::kCudaGemmWorkspaceBytes;
  uint32_t align = 256;
  AP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    AP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align,
                                                         sizeof(align)));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  AP_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(
      handle, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &returned));
  if (returned < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr,
                 "actplace dense: no cuBLASLt algorithm for m=%lld n=%lld "
                 "k=%lld\n",
                 (long long)s.m, (long long)s.n, (long long)s.k);
    return Status::BackendError;
  }
  p.algo = result.algo;
  p.workspace = result.workspaceSize;
  return Status::Ok;
}

} // namespace

Status gemm(const KernelContext &ctx, const GemmShape &s, const void *a,
            const void *b, void *d, void *workspace) {
  if (!ctx.cublasLt)
    return Status::InvalidArgument;
  auto handle = static_cast<cublasLtHandle_t>(ctx.cublasLt);
  Key key{s.transA, s.transB, s.m,          s.n,          s.k, s.lda,
          s.ldb,    s.ldd,    int(s.dType), s.accumulate, 0};
  int device = 0;
  AP_CUDA_CHECK(cudaGetDevice(&device));
  std::get<10>(key) = device;
  const Plan *plan = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  {
    std::lock_guard<std::mutex> lock(gPlanMutex);
    auto it = gPlans.find(key);
    if (it == gPlans.end()) {
      auto p = std::make_unique<Plan>();
      Status st = buildPlan(handle, s, *p);
      if (st != Status::Ok)
        return st;
      it = gPlans.emplace(key, std::move(p)).first;
    }
    desc = it->second->desc;
    // The algorithm stays the plan's (chosen without a target): only the
    // descriptor cublasLtMatmul runs with carries it.
    if (ctx.smTarget > 0)
      if (Status st = targetedDesc(s, ctx.smTarget, *it->second, desc);
          st != Status::Ok)
        return st;
    plan = it->second.get();
  }
  const float alpha = 1.0f, beta = s.accumulate ? 1.0f : 0.0f;
  AP_CUBLAS_CHECK(cublasLtMatmul(handle, desc, &alpha, a, plan->a, b, plan->b,
                                 &beta, d, plan->d, d, plan->d, &plan->algo,
                                 workspace, plan->workspace,
                                 static_cast<cudaStream_t>(ctx.stream)));
  return Status::Ok;
}

// Row-major y[rows, out] = x[rows, in] W[out, in]^T is, column-major,
// y^T (out x rows) = op_T(W stored in x out) * x^T (in x rows).
Status linearForward(const KernelContext &ctx, const LinearForwardArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  if (!ctx.workspace || ctx.workspaceBytes < ref::kCudaGemmWorkspaceBytes)
    return Status::InvalidArgument;
  GemmShape s;
  s.transA = true;
  s.m = a.out;
  s.n = a.rows;
  s.k = a.in;
  s.lda = a.in;
  s.ldb = a.in;
  s.ldd = a.out;
  return gemm(ctx, s, a.w, a.x, a.y, ctx.workspace);
}

Status linearBackward(const KernelContext &ctx, const LinearBackwardArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  if (!ctx.workspace || ctx.workspaceBytes < ref::kCudaGemmWorkspaceBytes)
    return Status::InvalidArgument;
  if (a.dx) {
    // dx^T (in x rows) = W^T (stored in x out) * dy^T (stored out x rows).
    GemmShape s;
    s.m = a.in;
    s.n = a.rows;
    s.k = a.out;
    s.lda = a.in;
    s.ldb = a.out;
    s.ldd = a.in;
    Status st = gemm(ctx, s, a.w, a.dy, a.dx, ctx.workspace);
    if (st != Status::Ok)
      return st;
  }
  if (a.dw) {
    // dw^T (in x out) += x^T (stored in x rows) * op_T(dy^T stored out x rows).
    GemmShape s;
    s.transB = true;
    s.m = a.in;
    s.n = a.out;
    s.k = a.rows;
    s.lda = a.in;
    s.ldb = a.out;
    s.ldd = a.in;
    s.dType = GemmType::F32;
    s.accumulate = true;
    Status st = gemm(ctx, s, a.x, a.dy, a.dw, ctx.workspace);
    if (st != Status::Ok)
      return st;
  }
  return Status::Ok;
}

} // namespace ap::kernels::cuda
