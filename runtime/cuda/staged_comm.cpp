//===- staged_comm.cpp - Device collectives staged through MPI
//-------------===//
//
// A cuda-backend communicator that moves device buffers through pinned host
// memory and runs each collective over MPI (fixed-order sums): several
// ranks where NCCL cannot run them, above all two ranks sharing one GPU
// (NCCL refuses two ranks on one device). Each call waits for the caller's
// stream, copies the inputs device-to-host, runs the host collective,
// copies the result back on the same stream and waits for it, so the
// staging buffers are free again when it returns. Every rank gets the MPI
// sum's bits and the run keeps its memory plan; the copies and the
// blocking make it slow: it checks bits and peaks, not speed.
//
//===----------------------------------------------------------------------===//
#include "runtime/collectives.h"

#include "runtime/cuda/cuda_check.h"
#include "runtime/error.h"

#include <cuda_runtime.h>

namespace ap::rt {

#if defined(ACTPLACE_HAVE_MPI)
namespace {

using ap::kernels::Backend;
using ap::kernels::DType;

/// Pinned host memory grown on demand (a staged collective of the step's
/// largest buffer sets its size on the first step).
class PinnedStage {
public:
  ~PinnedStage() {
    if (ptr_)
      cudaFreeHost(ptr_);
  }
  void *get(size_t bytes) {
    if (bytes > bytes_) {
      if (ptr_)
        AP_CUDA_CHECK(cudaFreeHost(ptr_));
      ptr_ = nullptr;
      AP_CUDA_CHECK(cudaHostAlloc(&ptr_, bytes, cudaHostAllocDefault));
      bytes_ = bytes;
    }
    return ptr_;
  }

private:
  void *ptr_ = nullptr;
  size_t bytes_ = 0;
};

class StagedCommunicator final : public Communicator {
public:
  explicit StagedCommunicator(std::unique_ptr<Communicator> host)
      : host_(std::move(host)) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  Backend backend() const override { return Backend::Cuda; }
  const char *kind() const override { return "mpi-staged"; }

  void allReduceSum(const void *send, void *recv, size_t count, DType dtype,
                    void *stream) override {
    size_t bytes = count * dtypeBytes(dtype);
    void *h = in_.get(bytes);
    toHost(h, send, bytes, stream);
    host_->allReduceSum(h, h, count, dtype, nullptr);
    toDevice(recv, h, bytes, stream);
  }
  void reduceScatterSum(const void *send, void *recv, size_t recvCount,
                        DType dtype, void *stream) override {
    size_t bytes = recvCount * dtypeBytes(dtype);
    void *hin = in_.get(bytes * size_t(size()));
    void *hout = out_.get(bytes);
    toHost(hin, send, bytes * size_t(size()), stream);
    host_->reduceScatterSum(hin, hout, recvCount, dtype, nullptr);
    toDevice(recv, hout, bytes, stream);
  }
  void reduceScatterSumAdd(void *send, void *recv, size_t recvCount,
                           DType dtype, void *stream) override {
    // recv is staged too: the host communicator adds into the staged copy,
    // which goes back whole.
    size_t bytes = recvCount * dtypeBytes(dtype);
    void *hin = in_.get(bytes * size_t(size()));
    void *hout = out_.get(bytes);
    toHost(hin, send, bytes * size_t(size()), stream);
    toHost(hout, recv, bytes, stream);
    host_->reduceScatterSumAdd(hin, hout, recvCount, dtype, nullptr);
    toDevice(recv, hout, bytes, stream);
  }
  void reduceScatterSumAddBf16(float *send, ap::kernels::bf16 *recv,
                               size_t recvCount, void *stream) override {
    // As above: the F32 blocks and the bf16 shard staged, the shard back.
    size_t full = recvCount * sizeof(float) * size_t(size());
    size_t shard = recvCount * sizeof(ap::kernels::bf16);
    auto *hin = static_cast<float *>(in_.get(full));
    auto *hout = static_cast<ap::kernels::bf16 *>(out_.get(shard));
    toHost(hin, send, full, stream);
    toHost(hout, recv, shard, stream);
    host_->reduceScatterSumAddBf16(hin, hout, recvCount, nullptr);
    toDevice(recv, hout, shard, stream);
  }
  void allGather(const void *send, void *recv, size_t sendCount, DType dtype,
                 void *stream) override {
    size_t bytes = sendCount * dtypeBytes(dtype);
    void *hin = in_.get(bytes);
    void *hout = out_.get(bytes * size_t(size()));
    toHost(hin, send, bytes, stream);
    host_->allGather(hin, hout, sendCount, dtype, nullptr);
    toDevice(recv, hout, bytes * size_t(size()), stream);
  }
  void broadcast(void *buf, size_t count, DType dtype, int root,
                 void *stream) override {
    size_t bytes = count * dtypeBytes(dtype);
    void *h = in_.get(bytes);
    toHost(h, buf, bytes, stream);
    host_->broadcast(h, count, dtype, root, nullptr);
    toDevice(buf, h, bytes, stream);
  }
  void send(const void *buf, size_t count, DType dtype, int peer,
            void *stream) override {
    size_t bytes = count * dtypeBytes(dtype);
    void *h = in_.get(bytes);
    toHost(h, buf, bytes, stream);
    host_->send(h, count, dtype, peer, nullptr);
  }
  void recv(void *buf, size_t count, DType dtype, int peer,
            void *stream) override {
    size_t bytes = count * dtypeBytes(dtype);
    void *h = in_.get(bytes);
    host_->recv(h, count, dtype, peer, nullptr);
    toDevice(buf, h, bytes, stream);
  }
  void barrier() override { host_->barrier(); }
  bool allTrue(bool value) override { return host_->allTrue(value); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    return std::make_unique<StagedCommunicator>(host_->split(color, key));
  }
  Communicator *hostCommunicator() override { return host_.get(); }

private:
  static cudaStream_t native(void *stream) {
    return static_cast<cudaStream_t>(stream);
  }
  /// After the stream's earlier work (which wrote `dev`).
  static void toHost(void *host, const void *dev, size_t bytes, void *stream) {
    AP_CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost,
                                  native(stream)));
    AP_CUDA_CHECK(cudaStreamSynchronize(native(stream)));
  }
  /// Waits for the copy, so the staging buffer may be reused.
  static void toDevice(void *dev, const void *host, size_t bytes,
                       void *stream) {
    AP_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice,
                                  native(stream)));
    AP_CUDA_CHECK(cudaStreamSynchronize(native(stream)));
  }

  std::unique_ptr<Communicator> host_;
  PinnedStage in_, out_;
};

} // namespace

std::unique_ptr<Communicator>
createStagedMpiCommunicator(std::unique_ptr<Communicator> host) {
  if (host->backend() != Backend::Host)
    fail("collectives: mpi-staged wraps a host communicator, got '",
         host->kind(), "'");
  return std::make_unique<StagedCommunicator>(std::move(host));
}
#endif

} // namespace ap::rt
