//===- accumulate.cu - recv += add on a stream (reduce-scatter add) -------===//
//
// The add half of NcclCommunicator::reduceScatterSumAdd: NCCL reduces the
// ranks' blocks in place, then this kernel adds this rank's block into the
// shard, in float, rounded once to the dtype (the host communicators'
// detail::addInto does the same per element, so both backends give a
// sharded main grad the same two roundings: the sum, then the add). A bf16
// main-grad shard (reduceScatterSumAddBf16) takes the F32 block: the shard
// widened, the block added in float, rounded once to bf16, as
// detail::addIntoBf16.
//
//===----------------------------------------------------------------------===//
#include "runtime/collectives.h"

#include "runtime/cuda/cuda_check.h"
#include "runtime/error.h"

#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace ap::rt {

namespace {

__global__ void addF32(float *recv, const float *add, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    recv[i] = __fadd_rn(recv[i], add[i]);
}

__global__ void addBf16(__nv_bfloat16 *recv, const __nv_bfloat16 *add,
                        size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    recv[i] = __float2bfloat16_rn(
        __fadd_rn(__bfloat162float(recv[i]), __bfloat162float(add[i])));
}

__global__ void addF32IntoBf16(__nv_bfloat16 *recv, const float *add,
                               size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    recv[i] = __float2bfloat16_rn(__fadd_rn(__bfloat162float(recv[i]), add[i]));
}

/// A grid-stride loop's grid: it depends on the count only.
unsigned gridOf(size_t count) {
  return unsigned(std::min<size_t>((count + 255) / 256, 4096));
}

} // namespace

void cudaAddIntoBf16(ap::kernels::bf16 *recv, const float *add, size_t count,
                     void *stream) {
  if (count == 0)
    return;
  addF32IntoBf16<<<gridOf(count), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<__nv_bfloat16 *>(recv), add, count);
  AP_CUDA_CHECK(cudaGetLastError());
}

void cudaAddInto(ap::kernels::DType dtype, void *recv, const void *add,
                 size_t count, void *stream) {
  if (count == 0)
    return;
  size_t blocks = gridOf(count);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
  case ap::kernels::DType::F32:
    addF32<<<unsigned(blocks), 256, 0, s>>>(
        static_cast<float *>(recv), static_cast<const float *>(add), count);
    break;
  case ap::kernels::DType::BF16:
    addBf16<<<unsigned(blocks), 256, 0, s>>>(
        static_cast<__nv_bfloat16 *>(recv),
        static_cast<const __nv_bfloat16 *>(add), count);
    break;
  default:
    fail("collectives: reduceScatterSumAdd of dtype ", int(dtype),
         " on the GPU (F32 or BF16)");
  }
  AP_CUDA_CHECK(cudaGetLastError());
}

} // namespace ap::rt
