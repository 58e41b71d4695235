//===- cuda_backend.cpp - CUDA runtime backend ------------------*- C++ -*-===//
//
// Streams, events, the arena allocation, pinned memory and the cuBLASLt
// handle on a real GPU. All five streams are non-blocking so that nothing
// implicitly orders them against the legacy default stream: the only
// ordering is what the compiled schedule expresses with events.
//
//===----------------------------------------------------------------------===//
#include "runtime/backend.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/error.h"
#include "runtime/nvtx.h"

#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

namespace ap::rt {
namespace {

class CudaBackend final : public Backend {
public:
  explicit CudaBackend(int deviceIndex) : device_(deviceIndex) {
    AP_CUDA_CHECK(cudaSetDevice(device_));
    // Creates the context now, so later calls cannot fail for that reason
    // and the memory baseline the Device takes excludes nothing of ours.
    AP_CUDA_CHECK(cudaFree(nullptr));
    AP_CUDA_CHECK(cudaGetDeviceProperties(&props_, device_));
    AP_CUDA_CHECK(cudaDeviceGetAttribute(
        &smCount_, cudaDevAttrMultiProcessorCount, device_));
    // All streams at one priority: the compute stream at the greatest
    // priority measured no gain beside side-stream recompute (the block
    // scheduler does not preempt running CTAs; bench/notes/training.md).
    for (cudaStream_t &s : streams_)
      AP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    AP_CUBLAS_CHECK(cublasLtCreate(&cublasLt_));
  }

  ~CudaBackend() override {
    // Destructors must not throw; report and go on releasing.
    cudaDeviceSynchronize();
    if (cublasLt_)
      cublasLtDestroy(cublasLt_);
    for (cudaEvent_t e : events_)
      cudaEventDestroy(e);
    for (cudaEvent_t e : timers_)
      cudaEventDestroy(e);
    for (cudaStream_t s : streams_)
      if (s)
        cudaStreamDestroy(s);
  }

  DeviceKind kind() const override { return DeviceKind::Cuda; }
  std::string description() const override {
    return detail::concat("cuda: ", props_.name, " (sm_", props_.major,
                          props_.minor, ", ", smCount_, " SMs, ",
                          props_.totalGlobalMem >> 30, " GiB, device ", device_,
                          ")");
  }
  std::string deviceName() const override { return props_.name; }

  void *allocateDevice(size_t bytes) override {
    void *p = nullptr;
    AP_CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  }
  void freeDevice(void *ptr) override { AP_CUDA_CHECK(cudaFree(ptr)); }
  void *allocatePinned(size_t bytes) override {
    void *p = nullptr;
    AP_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
    return p;
  }
  void freePinned(void *ptr) override { AP_CUDA_CHECK(cudaFreeHost(ptr)); }

  uint32_t createTimer() override {
    cudaEvent_t e = nullptr;
    AP_CUDA_CHECK(cudaEventCreate(&e)); // timing enabled
    timers_.push_back(e);
    return static_cast<uint32_t>(timers_.size() - 1);
  }
  void recordTimer(uint32_t timer, Stream stream) override {
    AP_CUDA_CHECK(cudaEventRecord(timers_.at(timer), native(stream)));
  }
  double timerSeconds(uint32_t from, uint32_t to) override {
    float ms = 0;
    AP_CUDA_CHECK(cudaEventElapsedTime(&ms, timers_.at(from), timers_.at(to)));
    return double(ms) * 1e-3;
  }

  uint32_t createEvent() override {
    cudaEvent_t e = nullptr;
    AP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.push_back(e);
    return static_cast<uint32_t>(events_.size() - 1);
  }
  void recordEvent(uint32_t event, Stream stream) override {
    AP_CUDA_CHECK(cudaEventRecord(events_.at(event), native(stream)));
  }
  void waitEvent(Stream stream, uint32_t event) override {
    AP_CUDA_CHECK(cudaStreamWaitEvent(native(stream), events_.at(event), 0));
  }
  void synchronizeEvent(uint32_t event) override {
    AP_CUDA_CHECK(cudaEventSynchronize(events_.at(event)));
  }
  bool queryEvent(uint32_t event) override {
    cudaError_t status = cudaEventQuery(events_.at(event));
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError(); // NotReady is an answer, not an error.
      return false;
    }
    AP_CUDA_CHECK(status);
    return true;
  }
  void synchronizeStream(Stream stream) override {
    AP_CUDA_CHECK(cudaStreamSynchronize(native(stream)));
  }
  void synchronize() override { AP_CUDA_CHECK(cudaDeviceSynchronize()); }

  void copyAsync(void *dst, const void *src, size_t bytes, CopyKind kind,
                 Stream stream) override {
    cudaMemcpyKind k = cudaMemcpyDefault;
    switch (kind) {
    case CopyKind::HostToDevice:
      k = cudaMemcpyHostToDevice;
      break;
    case CopyKind::DeviceToHost:
      k = cudaMemcpyDeviceToHost;
      break;
    case CopyKind::DeviceToDevice:
      k = cudaMemcpyDeviceToDevice;
      break;
    case CopyKind::HostToHost:
      k = cudaMemcpyHostToHost;
      break;
    }
    AP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, native(stream)));
  }
  void memsetAsync(void *dst, int value, size_t bytes, Stream stream) override {
    AP_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, native(stream)));
  }
  void launch(Stream, const char *name, KernelFn fn,
              const kernels::KernelContext &ctx) override {
    kernels::Status status = fn(ctx);
    if (status != kernels::Status::Ok)
      fail("kernel '", name ? name : "?", "' returned ",
           kernelStatusName(status));
  }
  void hostCallback(Stream stream, std::function<void()> fn) override {
    auto *heap = new std::function<void()>(std::move(fn));
    cudaError_t status = cudaLaunchHostFunc(
        native(stream),
        [](void *user) {
          auto *f = static_cast<std::function<void()> *>(user);
          (*f)();
          delete f;
        },
        heap);
    if (status != cudaSuccess)
      delete heap;
    AP_CUDA_CHECK(status);
  }

  int streamPriority(Stream stream) const override {
    int p = 0;
    AP_CUDA_CHECK(cudaStreamGetPriority(native(stream), &p));
    return p;
  }
  void *nativeStream(Stream stream) const override {
    return streams_[static_cast<int>(stream)];
  }
  void *nativeEvent(uint32_t event) const override { return events_.at(event); }
  void *cublasLtHandle() const override { return cublasLt_; }
  int32_t smCount() const override { return smCount_; }
  std::optional<uint64_t> deviceMemoryUsed() override {
    size_t freeBytes = 0, totalBytes = 0;
    AP_CUDA_CHECK(cudaMemGetInfo(&freeBytes, &totalBytes));
    return static_cast<uint64_t>(totalBytes - freeBytes);
  }
  std::optional<uint64_t> deviceMemoryFree() override {
    size_t freeBytes = 0, totalBytes = 0;
    AP_CUDA_CHECK(cudaMemGetInfo(&freeBytes, &totalBytes));
    return static_cast<uint64_t>(freeBytes);
  }

private:
  cudaStream_t native(Stream stream) const {
    return streams_[static_cast<int>(stream)];
  }

  int device_;
  cudaDeviceProp props_{};
  int smCount_ = 0;
  cudaStream_t streams_[kNumStreams] = {};
  std::vector<cudaEvent_t> events_;
  std::vector<cudaEvent_t> timers_;
  cublasLtHandle_t cublasLt_ = nullptr;
};

} // namespace

int visibleCudaDevices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> createCudaBackend(int deviceIndex,
                                           std::string *whyNot) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    if (whyNot)
      *whyNot = detail::concat(
          "cudaGetDeviceCount failed: ", cudaGetErrorName(status), ", ",
          cudaGetErrorString(status));
    return nullptr;
  }
  if (count == 0 || deviceIndex < 0 || deviceIndex >= count) {
    if (whyNot)
      *whyNot = detail::concat("no CUDA device ", deviceIndex, " (", count,
                               " visible)");
    return nullptr;
  }
  try {
    return std::make_unique<CudaBackend>(deviceIndex);
  } catch (const Error &e) {
    if (whyNot)
      *whyNot = e.what();
    return nullptr;
  }
}

} // namespace ap::rt
