//===- host_backend.cpp - CPU backend, thread streams -----------*- C++ -*-===//
//
// The host backend gives the CPU the same semantics as CUDA streams and
// events: each stream is one worker thread draining a FIFO queue, an event is
// a completion counter per record, and "device" memory is a separate
// allocation. Nothing here is synchronous by accident: if generated code
// forgets a wait, the two streams really run concurrently and
// ThreadSanitizer sees the race.
//
//===----------------------------------------------------------------------===//
#include "runtime/backend.h"
#include "runtime/error.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace ap::rt {
namespace {

/// The first failure raised by a task on any worker; rethrown on the driving
/// thread at the next synchronisation, like a sticky CUDA error, but cleared
/// once reported so a test can go on.
class ErrorSlot {
public:
  void report(std::string message) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (first_.empty())
      first_ = std::move(message);
  }
  void rethrow() {
    std::string message;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      message.swap(first_);
    }
    if (!message.empty())
      throw Error("host backend: " + message);
  }

private:
  std::mutex mutex_;
  std::string first_;
};

/// One stream: a thread running tasks strictly in enqueue order.
class Worker {
public:
  Worker(Stream stream, ErrorSlot &errors) : stream_(stream), errors_(errors) {
    thread_ = std::thread([this] { run(); });
  }
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }

  void enqueue(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(task));
      ++enqueued_;
    }
    wake_.notify_one();
  }

  /// Blocks until every task enqueued before the call has finished.
  void drain() {
    std::unique_lock<std::mutex> lock(mutex_);
    uint64_t target = enqueued_;
    done_.wait(lock, [&] { return finished_ >= target; });
  }

private:
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty())
          return; // stop_ and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        task();
      } catch (const std::exception &e) {
        errors_.report(std::string("stream ") + streamName(stream_) + ": " +
                       e.what());
      } catch (...) {
        errors_.report(std::string("stream ") + streamName(stream_) +
                       ": unknown exception in a task");
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++finished_;
      }
      done_.notify_all();
    }
  }

  Stream stream_;
  ErrorSlot &errors_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0;
  uint64_t finished_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

/// Completion counters of all events. `recorded_` is touched only by the
/// driving thread; `completed_` by workers and readers under `mutex_`, which
/// is also what gives a waiter happens-before on the recorder's writes.
class EventTable {
public:
  uint32_t create() {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_.push_back(0);
    recorded_.push_back(0);
    return static_cast<uint32_t>(recorded_.size() - 1);
  }
  uint64_t nextRecord(uint32_t e) { return ++recorded_.at(e); }
  uint64_t latestRecord(uint32_t e) const { return recorded_.at(e); }
  void complete(uint32_t e, uint64_t generation) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      completed_[e] = std::max(completed_[e], generation);
    }
    changed_.notify_all();
  }
  void waitFor(uint32_t e, uint64_t generation) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return completed_[e] >= generation; });
  }
  bool reached(uint32_t e, uint64_t generation) {
    std::lock_guard<std::mutex> lock(mutex_);
    return completed_[e] >= generation;
  }

private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<uint64_t> completed_;
  std::vector<uint64_t> recorded_;
};

/// Timer marks: the steady-clock time at which a stream's worker reached
/// each record. Written by workers, read by the driving thread after a
/// synchronisation; the mutex also covers growth of the table.
class TimerTable {
public:
  uint32_t create() {
    std::lock_guard<std::mutex> lock(mutex_);
    marks_.emplace_back();
    return static_cast<uint32_t>(marks_.size() - 1);
  }
  void mark(uint32_t t) {
    auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mutex_);
    marks_.at(t) = now;
  }
  double seconds(uint32_t from, uint32_t to) {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::chrono::duration<double>(marks_.at(to) - marks_.at(from))
        .count();
  }

private:
  std::mutex mutex_;
  std::deque<std::chrono::steady_clock::time_point> marks_;
};

void *alignedAllocate(size_t bytes, const char *what) {
  constexpr size_t kAlign = 4096;
  size_t rounded =
      std::max<size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  void *p = std::aligned_alloc(kAlign, rounded);
  if (!p)
    fail("host backend: cannot allocate ", bytes, " bytes of ", what);
  return p;
}

class HostBackend final : public Backend {
public:
  HostBackend() {
    for (int s = 0; s < kNumStreams; ++s)
      workers_.push_back(
          std::make_unique<Worker>(static_cast<Stream>(s), errors_));
  }
  ~HostBackend() override {
    for (auto &w : workers_)
      w->drain();
    workers_.clear();
  }

  DeviceKind kind() const override { return DeviceKind::Host; }
  std::string description() const override {
    return "host: CPU, one worker thread per stream (compute, d2h, h2d, comm, "
           "side)";
  }
  std::string deviceName() const override { return "CPU"; }

  void *allocateDevice(size_t bytes) override {
    void *p = alignedAllocate(bytes, "host-backend device memory");
    // Fresh device memory reads as NaN (all bits set) rather than as zeros
    // or stale data, so a read before the first write cannot pass silently.
    std::memset(p, 0xff, bytes);
    return p;
  }
  void freeDevice(void *ptr) override { std::free(ptr); }
  void *allocatePinned(size_t bytes) override {
    return alignedAllocate(bytes, "pinned host memory");
  }
  void freePinned(void *ptr) override { std::free(ptr); }

  uint32_t createEvent() override { return events_.create(); }
  void recordEvent(uint32_t event, Stream stream) override {
    uint64_t generation = events_.nextRecord(event);
    worker(stream).enqueue(
        [this, event, generation] { events_.complete(event, generation); });
  }
  void waitEvent(Stream stream, uint32_t event) override {
    uint64_t generation = events_.latestRecord(event);
    if (generation == 0)
      return;
    worker(stream).enqueue(
        [this, event, generation] { events_.waitFor(event, generation); });
  }
  void synchronizeEvent(uint32_t event) override {
    uint64_t generation = events_.latestRecord(event);
    if (generation != 0)
      events_.waitFor(event, generation);
    errors_.rethrow();
  }
  bool queryEvent(uint32_t event) override {
    bool done = events_.reached(event, events_.latestRecord(event));
    errors_.rethrow();
    return done;
  }
  void synchronizeStream(Stream stream) override {
    worker(stream).drain();
    errors_.rethrow();
  }
  void synchronize() override {
    for (auto &w : workers_)
      w->drain();
    errors_.rethrow();
  }

  void copyAsync(void *dst, const void *src, size_t bytes, CopyKind,
                 Stream stream) override {
    worker(stream).enqueue([dst, src, bytes] {
      if (bytes)
        std::memcpy(dst, src, bytes);
    });
  }
  void memsetAsync(void *dst, int value, size_t bytes, Stream stream) override {
    worker(stream).enqueue(
        [dst, value, bytes] { std::memset(dst, value, bytes); });
  }
  void launch(Stream stream, const char *name, KernelFn fn,
              const kernels::KernelContext &ctx) override {
    std::string opName = name ? name : "?";
    worker(stream).enqueue([fn = std::move(fn), ctx, opName] {
      kernels::Status status = fn(ctx);
      if (status != kernels::Status::Ok)
        fail("kernel '", opName, "' returned ", kernelStatusName(status));
    });
  }
  void hostCallback(Stream stream, std::function<void()> fn) override {
    worker(stream).enqueue(std::move(fn));
  }

  uint32_t createTimer() override { return timers_.create(); }
  void recordTimer(uint32_t timer, Stream stream) override {
    worker(stream).enqueue([this, timer] { timers_.mark(timer); });
  }
  double timerSeconds(uint32_t from, uint32_t to) override {
    return timers_.seconds(from, to);
  }

  void *nativeStream(Stream) const override { return nullptr; }
  void *cublasLtHandle() const override { return nullptr; }
  int32_t smCount() const override { return 0; }
  std::optional<uint64_t> deviceMemoryUsed() override { return std::nullopt; }
  std::optional<uint64_t> deviceMemoryFree() override { return std::nullopt; }

private:
  Worker &worker(Stream stream) { return *workers_[static_cast<int>(stream)]; }

  ErrorSlot errors_;
  EventTable events_;
  TimerTable timers_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

} // namespace

std::unique_ptr<Backend> createHostBackend() {
  return std::make_unique<HostBackend>();
}

} // namespace ap::rt
