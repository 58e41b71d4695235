//===- cuda_check.h - Status checks for CUDA runtime calls ------*- C++ -*-===//
//
// Every CUDA runtime and cuBLASLt call in the runtime goes through one of
// these macros, so a failure names the call, the error and the source line.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_CUDA_CUDA_CHECK_H
#define ACTPLACE_RUNTIME_CUDA_CUDA_CHECK_H

#include "runtime/error.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

/// Throws ap::rt::Error naming `call` when it does not return cudaSuccess.
#define AP_CUDA_CHECK(call)                                                    \
  do {                                                                         \
    cudaError_t apCudaStatus_ = (call);                                        \
    if (apCudaStatus_ != cudaSuccess)                                          \
      ::ap::rt::fail("CUDA: ", #call,                                          \
                     " failed: ", cudaGetErrorName(apCudaStatus_), " (",       \
                     cudaGetErrorString(apCudaStatus_), ") at ", __FILE__,     \
                     ":", __LINE__);                                           \
  } while (0)

/// Throws ap::rt::Error naming `call` when it does not return
/// CUBLAS_STATUS_SUCCESS.
#define AP_CUBLAS_CHECK(call)                                                  \
  do {                                                                         \
    cublasStatus_t apCublasStatus_ = (call);                                   \
    if (apCublasStatus_ != CUBLAS_STATUS_SUCCESS)                              \
      ::ap::rt::fail("cuBLASLt: ", #call, " failed with status ",              \
                     static_cast<int>(apCublasStatus_), " at ", __FILE__, ":", \
                     __LINE__);                                                \
  } while (0)

#endif // ACTPLACE_RUNTIME_CUDA_CUDA_CHECK_H
