//===- dense_cuda.h - dense CUDA kernels: internals ---------------*- C++
//-*-===//
//
// Shared by the CUDA dense sources: the status macros and the cuBLASLt GEMM
// with its per-shape plan cache.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_CUDA_DENSE_DENSE_CUDA_H
#define ACTPLACE_KERNELS_CUDA_DENSE_DENSE_CUDA_H

#include "kernels/reference/dense/dense_internal.h"

#include <cuda_runtime.h>

#include <cstdio>

/// Checks a CUDA runtime call; on failure names the call and returns
/// BackendError from the enclosing function.
#define AP_CUDA_CHECK(call)                                                    \
  do {                                                                         \
    cudaError_t apErr_ = (call);                                               \
    if (apErr_ != cudaSuccess) {                                               \
      std::fprintf(stderr, "actplace dense: %s failed: %s (%s:%d)\n", #call,   \
                   cudaGetErrorString(apErr_), __FILE__, __LINE__);            \
      return ::ap::kernels::Status::BackendError;                              \
    }                                                                          \
  } while (0)

/// Checks the launch of the kernel just issued.
#define AP_CUDA_CHECK_LAUNCH(name) AP_CUDA_CHECK(cudaGetLastError())

namespace ap::kernels::cuda {

/// Element types the GEMM sees.
enum class GemmType : int { BF16, F32 };

/// One column-major cuBLASLt GEMM D = alpha op(A) op(B) + beta D, with A and
/// B in bf16, FP32 compute, D in bf16 or fp32. Everything here is the plan
/// key: the algorithm is fixed per key.
struct GemmShape {
  bool transA = false, transB = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  GemmType dType = GemmType::BF16;
  bool accumulate = false; ///< beta = 1 (D += ...), else beta = 0
};

/// Runs the GEMM on ctx.stream with the workspace slice `workspace` of
/// ref::kCudaGemmWorkspaceBytes bytes; ctx.smTarget > 0 narrows it to about
/// that many SMs with the algorithm (and so the bits) of the untargeted run.
Status gemm(const KernelContext &ctx, const GemmShape &shape, const void *a,
            const void *b, void *d, void *workspace);

} // namespace ap::kernels::cuda

#endif // ACTPLACE_KERNELS_CUDA_DENSE_DENSE_CUDA_H
