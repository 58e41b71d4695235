//===- pipeline.cpp - Pipeline links: host and staged forms ------*- C++
//-*-===//
//
// See pipeline.h. The NCCL form is in runtime/cuda/pipeline_nccl.cpp.
//
//===----------------------------------------------------------------------===//
#include "runtime/pipeline.h"

#include "runtime/error.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ap::rt {

using kernels::DType;

PipelineLinks::~PipelineLinks() = default;

size_t pipelineElements(uint64_t bytes, DType &dtype, const char *what) {
  if (bytes == 0)
    fail(what, ": a message of 0 bytes");
  if (bytes % 4 == 0) {
    dtype = DType::I32;
    return size_t(bytes / 4);
  }
  if (bytes % 2 == 0) {
    dtype = DType::BF16;
    return size_t(bytes / 2);
  }
  fail(what, ": a message of ", bytes,
       " bytes (expected a whole number of 2-byte elements)");
}

int pipelineNeighbour(int stage, int stages, PipelinePeer peer,
                      const char *what) {
  int r = peer == PipelinePeer::Prev ? stage - 1 : stage + 1;
  if (r < 0 || r >= stages)
    fail("pipeline: stage ", stage, " of ", stages, " has no ",
         peer == PipelinePeer::Prev ? "previous" : "next", " stage to ", what);
  return r;
}

namespace {

const char *peerName(PipelinePeer p) {
  return p == PipelinePeer::Prev ? "the previous stage" : "the next stage";
}

/// One thread sending the messages queued for one neighbour, in order,
/// with the communicator's blocking send.
class Sender {
public:
  Sender(Communicator &comm, int peer, int stage, PipelinePeer side)
      : comm_(comm), peer_(peer), stage_(stage), side_(side) {
    thread_ = std::thread([this] { run(); });
  }
  ~Sender() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void push(std::vector<char> message) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(message));
      ++queued_;
    }
    wake_.notify_all();
  }
  /// Waits for every queued message; rethrows the first failure (once).
  void drain() {
    std::string error;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [&] { return sent_ >= queued_; });
      error.swap(error_);
    }
    if (!error.empty())
      fail("pipeline: stage ", stage_, ": a send to ", peerName(side_),
           " (stage ", peer_, ") failed: ", error);
  }

private:
  void run() {
    for (;;) {
      std::vector<char> m;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty())
          return;
        m = std::move(queue_.front());
        queue_.pop_front();
      }
      std::string error;
      try {
        DType dt;
        size_t n = pipelineElements(m.size(), dt, "pipeline send");
        comm_.send(m.data(), n, dt, peer_, nullptr);
      } catch (const std::exception &e) {
        error = e.what();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error.empty() && error_.empty())
          error_ = error;
        ++sent_;
      }
      done_.notify_all();
    }
  }

  Communicator &comm_;
  int peer_, stage_;
  PipelinePeer side_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<std::vector<char>> queue_;
  uint64_t queued_ = 0, sent_ = 0;
  std::string error_;
  bool stop_ = false;
  std::thread thread_;
};

/// The host backend and the staged cuda form: bytes through host memory,
/// the communicator's blocking calls, a sender thread per neighbour.
class HostLinks final : public PipelineLinks {
public:
  HostLinks(Device &dev, Communicator &host)
      : dev_(dev), comm_(host), stage_(host.rank()) {
    if (stage_ > 0)
      senders_[0] = std::make_unique<Sender>(host, stage_ - 1, stage_,
                                             PipelinePeer::Prev);
    if (stage_ + 1 < host.size())
      senders_[1] = std::make_unique<Sender>(host, stage_ + 1, stage_,
                                             PipelinePeer::Next);
  }
  ~HostLinks() override {
    // The comm stream may still hold send tasks that push to the senders.
    try {
      dev_.synchronize(Stream::Comm);
    } catch (...) {
    }
  }

  void send(const void *src, uint64_t bytes, PipelinePeer peer) override {
    Sender *s = sender(peer, "send to");
    DType dt;
    pipelineElements(bytes, dt, "pipeline send");
    if (dev_.kind() == DeviceKind::Host) {
      // On the comm stream's worker, in its order: the copy out of the
      // arena is the send as far as the stream is concerned.
      dev_.hostCallback(Stream::Comm, [s, src, bytes] {
        const char *p = static_cast<const char *>(src);
        s->push(std::vector<char>(p, p + bytes));
      });
      return;
    }
    // Staged: the comm stream's earlier work (its waits included) done,
    // the bytes come to host memory here.
    std::vector<char> m(bytes);
    dev_.copyToHostSync(m.data(), src, bytes, Stream::Comm);
    s->push(std::move(m));
  }

  void recv(void *dst, uint64_t bytes, PipelinePeer peer) override {
    int from = rankOf(peer, "receive from");
    DType dt;
    size_t n = pipelineElements(bytes, dt, "pipeline recv");
    Communicator *comm = &comm_;
    if (dev_.kind() == DeviceKind::Host) {
      dev_.hostCallback(Stream::Comm, [comm, dst, n, dt, from] {
        comm->recv(dst, n, dt, from, nullptr);
      });
      return;
    }
    std::vector<char> m(bytes);
    comm->recv(m.data(), n, dt, from, nullptr);
    dev_.copyAsync(dst, m.data(), bytes, CopyKind::HostToDevice, Stream::Comm);
    // The staging buffer goes with this call.
    dev_.synchronize(Stream::Comm);
  }

  void drain() override {
    // Every send task has run (and queued its message) once the comm
    // stream is idle.
    dev_.synchronize(Stream::Comm);
    for (auto &s : senders_)
      if (s)
        s->drain();
  }

private:
  int rankOf(PipelinePeer peer, const char *what) const {
    return pipelineNeighbour(stage_, comm_.size(), peer, what);
  }
  Sender *sender(PipelinePeer peer, const char *what) {
    rankOf(peer, what);
    return senders_[int(peer)].get();
  }

  Device &dev_;
  Communicator &comm_;
  int stage_;
  std::unique_ptr<Sender> senders_[2];
};

} // namespace

std::unique_ptr<PipelineLinks> createPipelineLinks(Device &dev,
                                                   Communicator &pp) {
  if (Communicator *host = pp.hostCommunicator())
    return std::make_unique<HostLinks>(dev, *host);
#if defined(ACTPLACE_HAVE_CUDA)
  return createNcclPipelineLinks(dev, pp);
#else
  fail("pipeline: communicator '", pp.kind(),
       "' moves no host memory and this build has no CUDA");
#endif
}

} // namespace ap::rt
