//===- pipeline_nccl.cpp - Pipeline links over NCCL -------------*- C++ -*-===//
//
// The cuda form of runtime/pipeline.h: one communicator (a duplicate of the
// pipeline group) and one internal stream per direction of traffic, "down"
// (stage s to s + 1: activations) and "up" (s + 1 to s: their gradients).
// NCCL runs the operations of one communicator in issue order, so a send
// to the next stage and a receive from it, in different directions, never
// queue behind each other. A send copies its bytes into a device staging
// buffer on the comm stream (the arena buffer may be reused after it, as
// on the host backend) and the direction's stream sends from there; the
// comm stream does not wait for it. A receive runs on the direction's
// stream after the comm stream's earlier work, and the comm stream waits
// for it. Staging buffers are allocated on first use and reused once their
// send completed, so a steady state allocates nothing; they are device
// memory beside the planned arena.
//
//===----------------------------------------------------------------------===//
#include "runtime/pipeline.h"

#include "runtime/cuda/cuda_check.h"
#include "runtime/error.h"

#include <cuda_runtime.h>

#include <vector>

namespace ap::rt {

namespace {

using kernels::DType;

class NcclLinks final : public PipelineLinks {
public:
  NcclLinks(Device &dev, Communicator &pp)
      : dev_(dev), stage_(pp.rank()), stages_(pp.size()) {
    // Collective over the pipeline group, in the same order on every stage.
    down_ = pp.split(0, stage_);
    up_ = pp.split(0, stage_);
    for (Direction *d : {&downDir_, &upDir_}) {
      AP_CUDA_CHECK(
          cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
      AP_CUDA_CHECK(
          cudaEventCreateWithFlags(&d->issued, cudaEventDisableTiming));
      AP_CUDA_CHECK(
          cudaEventCreateWithFlags(&d->arrived, cudaEventDisableTiming));
    }
  }
  ~NcclLinks() override {
    for (Direction *d : {&downDir_, &upDir_}) {
      cudaStreamSynchronize(d->stream);
      cudaEventDestroy(d->issued);
      cudaEventDestroy(d->arrived);
      cudaStreamDestroy(d->stream);
    }
    for (Staging &s : staging_) {
      cudaEventDestroy(s.ready);
      cudaEventDestroy(s.sent);
      dev_.backend().freeDevice(s.ptr);
    }
  }

  void send(const void *src, uint64_t bytes, PipelinePeer peer) override {
    int to = rankOf(peer, "send to");
    DType dt;
    size_t n = pipelineElements(bytes, dt, "pipeline send");
    bool next = peer == PipelinePeer::Next;
    Direction &d = next ? downDir_ : upDir_;
    Communicator &c = next ? *down_ : *up_;
    Staging &s = stage(bytes);
    cudaStream_t comm = cudaStream_t(dev_.nativeStream(Stream::Comm));
    AP_CUDA_CHECK(
        cudaMemcpyAsync(s.ptr, src, bytes, cudaMemcpyDeviceToDevice, comm));
    AP_CUDA_CHECK(cudaEventRecord(s.ready, comm));
    AP_CUDA_CHECK(cudaStreamWaitEvent(d.stream, s.ready, 0));
    c.send(s.ptr, n, dt, to, d.stream);
    AP_CUDA_CHECK(cudaEventRecord(s.sent, d.stream));
  }

  void recv(void *dst, uint64_t bytes, PipelinePeer peer) override {
    int from = rankOf(peer, "receive from");
    DType dt;
    size_t n = pipelineElements(bytes, dt, "pipeline recv");
    // From the next stage: its gradients travel up; from the previous
    // one: activations travel down.
    bool next = peer == PipelinePeer::Next;
    Direction &d = next ? upDir_ : downDir_;
    Communicator &c = next ? *up_ : *down_;
    cudaStream_t comm = cudaStream_t(dev_.nativeStream(Stream::Comm));
    AP_CUDA_CHECK(cudaEventRecord(d.issued, comm));
    AP_CUDA_CHECK(cudaStreamWaitEvent(d.stream, d.issued, 0));
    c.recv(dst, n, dt, from, d.stream);
    AP_CUDA_CHECK(cudaEventRecord(d.arrived, d.stream));
    AP_CUDA_CHECK(cudaStreamWaitEvent(comm, d.arrived, 0));
  }

  void drain() override {
    dev_.synchronize(Stream::Comm);
    for (Direction *d : {&downDir_, &upDir_}) {
      cudaError_t e = cudaStreamSynchronize(d->stream);
      if (e != cudaSuccess)
        fail("pipeline: stage ", stage_, ": a transfer toward stage ",
             d == &downDir_ ? stage_ + 1 : stage_ - 1,
             " failed: ", cudaGetErrorString(e));
    }
  }

private:
  struct Direction {
    cudaStream_t stream = nullptr;
    cudaEvent_t issued = nullptr, arrived = nullptr;
  };
  struct Staging {
    void *ptr = nullptr;
    uint64_t bytes = 0;
    cudaEvent_t ready = nullptr, sent = nullptr;
  };

  int rankOf(PipelinePeer peer, const char *what) const {
    return pipelineNeighbour(stage_, stages_, peer, what);
  }

  /// A staging buffer of at least `bytes` whose last send completed.
  Staging &stage(uint64_t bytes) {
    for (Staging &s : staging_) {
      if (s.bytes < bytes)
        continue;
      cudaError_t q = cudaEventQuery(s.sent);
      if (q == cudaSuccess)
        return s;
      if (q != cudaErrorNotReady)
        AP_CUDA_CHECK(q);
    }
    Staging s;
    s.bytes = bytes;
    s.ptr = dev_.backend().allocateDevice(size_t(bytes));
    AP_CUDA_CHECK(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming));
    AP_CUDA_CHECK(cudaEventCreateWithFlags(&s.sent, cudaEventDisableTiming));
    staging_.push_back(s);
    return staging_.back();
  }

  Device &dev_;
  int stage_, stages_;
  std::unique_ptr<Communicator> down_, up_;
  Direction downDir_, upDir_;
  std::vector<Staging> staging_;
};

} // namespace

std::unique_ptr<PipelineLinks> createNcclPipelineLinks(Device &dev,
                                                       Communicator &pp) {
  return std::make_unique<NcclLinks>(dev, pp);
}

} // namespace ap::rt
