//===- nccl_comm.cpp - Cuda-backend collectives over NCCL -----------------===//
//
// Collectives are enqueued on the caller's cudaStream_t (the runtime's comm
// stream) and return at once. The communicator belongs to the device that is
// current when it is created. Bit reproducibility across runs holds for a
// fixed world size and NCCL configuration; set NCCL_ALGO/NCCL_PROTO to pin
// the algorithm when comparing runs on different topologies.
//
// A rank that dies or hangs would leave the others blocked inside NCCL
// kernels forever, so every communicator has a watchdog thread (NCCL's own
// asynchronous error plus a timeout on each enqueued collective, as
// PyTorch's process groups do): on an error, or a collective that has not
// completed ACTPLACE_COMM_TIMEOUT seconds (default 600) after it was
// enqueued, it names the communicator and what happened on stderr, aborts
// the communicator and ends the process with exit status 1.
//
//===----------------------------------------------------------------------===//
#include "runtime/collectives.h"

#include "runtime/cuda/cuda_check.h"
#include "runtime/error.h"

#if defined(ACTPLACE_HAVE_NCCL)
#include <nccl.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ap::rt {

#if defined(ACTPLACE_HAVE_NCCL)
namespace {

using ap::kernels::Backend;
using ap::kernels::DType;

/// Throws ap::rt::Error naming the failing NCCL call and NCCL's own last
/// message, which usually says which rank or transport failed.
#define AP_NCCL_CHECK(call)                                                    \
  do {                                                                         \
    ncclResult_t apNcclRc_ = (call);                                           \
    if (apNcclRc_ != ncclSuccess)                                              \
      ::ap::rt::fail(                                                          \
          "NCCL: ", #call, " failed: ", ncclGetErrorString(apNcclRc_), " (",   \
          ncclGetLastError(nullptr), ") at ", __FILE__, ":", __LINE__);        \
  } while (0)

ncclDataType_t ncclType(DType t) {
  switch (t) {
  case DType::BF16:
    return ncclBfloat16;
  case DType::F32:
    return ncclFloat32;
  case DType::F64:
    return ncclFloat64;
  case DType::I32:
    return ncclInt32;
  }
  fail("NCCL: unsupported dtype ", int(t));
}

/// Seconds a collective may stay incomplete before the watchdog aborts:
/// ACTPLACE_COMM_TIMEOUT when set to a positive number, else 600.
double commTimeoutSeconds() {
  if (const char *v = std::getenv("ACTPLACE_COMM_TIMEOUT")) {
    char *end = nullptr;
    double s = std::strtod(v, &end);
    if (end != v && *end == '\0' && s > 0)
      return s;
    fail("NCCL: ACTPLACE_COMM_TIMEOUT='", v,
         "' (expected a positive number of seconds)");
  }
  return 600;
}

/// Watches one communicator: its collectives, each marked by an event
/// recorded after it on its stream, and NCCL's asynchronous error. Events
/// are reused once complete. Invariant: `pending_` is in enqueue order per
/// communicator, so the oldest incomplete collective is at its front.
class NcclWatchdog {
public:
  NcclWatchdog(ncclComm_t comm, int rank, int size)
      : comm_(comm), rank_(rank), size_(size), timeout_(commTimeoutSeconds()) {
    AP_CUDA_CHECK(cudaGetDevice(&device_));
    thread_ = std::thread([this] { run(); });
  }
  ~NcclWatchdog() {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    for (auto &p : pending_)
      cudaEventDestroy(p.event);
    for (cudaEvent_t e : free_)
      cudaEventDestroy(e);
  }

  /// Marks the collective just enqueued on `stream`.
  void enqueued(cudaStream_t stream) {
    std::lock_guard<std::mutex> g(m_);
    cudaEvent_t e;
    if (!free_.empty()) {
      e = free_.back();
      free_.pop_back();
    } else {
      AP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    AP_CUDA_CHECK(cudaEventRecord(e, stream));
    pending_.push_back({e, Clock::now()});
  }

private:
  using Clock = std::chrono::steady_clock;
  struct Pending {
    cudaEvent_t event;
    Clock::time_point since;
  };

  void run() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(m_);
    while (
        !cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stop_; })) {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess &&
          async != ncclSuccess && async != ncclInProgress)
        abortProcess(std::string("reports an asynchronous error: ") +
                     ncclGetErrorString(async) + " (" +
                     ncclGetLastError(comm_) + ")");
      while (!pending_.empty() &&
             cudaEventQuery(pending_.front().event) == cudaSuccess) {
        free_.push_back(pending_.front().event);
        pending_.pop_front();
      }
      if (!pending_.empty()) {
        double waited =
            std::chrono::duration<double>(Clock::now() - pending_.front().since)
                .count();
        if (waited > timeout_)
          abortProcess("a collective enqueued " +
                       std::to_string(int64_t(waited)) +
                       " s ago has not completed (ACTPLACE_COMM_TIMEOUT is " +
                       std::to_string(int64_t(timeout_)) + " s)");
      }
    }
  }

  [[noreturn]] void abortProcess(const std::string &what) {
    std::cerr << "error: NCCL: the communicator of rank " << rank_ << " of "
              << size_ << " " << what
              << ": another rank failed or hangs, or the network broke; "
                 "aborting the communicator and exiting"
              << std::endl;
    // ncclCommAbort may itself wait for the stuck work: it gets a few
    // seconds on a thread of its own, then the process ends regardless.
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread([c = comm_, done] {
      ncclCommAbort(c);
      done->store(true);
    }).detach();
    for (int i = 0; i < 50 && !done->load(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::_Exit(1);
  }

  ncclComm_t comm_;
  int rank_, size_, device_ = 0;
  double timeout_;
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_;
  std::thread thread_;
};

class NcclCommunicator final : public Communicator {
public:
  explicit NcclCommunicator(ncclComm_t comm) : comm_(comm) {
    AP_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    AP_NCCL_CHECK(ncclCommCount(comm_, &size_));
    watchdog_ = std::make_unique<NcclWatchdog>(comm_, rank_, size_);
  }
  ~NcclCommunicator() override {
    watchdog_.reset();
    if (barrierBuf_)
      cudaFree(barrierBuf_);
    if (barrierStream_)
      cudaStreamDestroy(barrierStream_);
    if (comm_)
      ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::Cuda; }
  const char *kind() const override { return "nccl"; }

  void allReduceSum(const void *send, void *recv, size_t count, DType dtype,
                    void *stream) override {
    AP_NCCL_CHECK(ncclAllReduce(send, recv, count, ncclType(dtype), ncclSum,
                                comm_, cudaStream_t(stream)));
    mark(cudaStream_t(stream));
  }
  void reduceScatterSum(const void *send, void *recv, size_t recvCount,
                        DType dtype, void *stream) override {
    AP_NCCL_CHECK(ncclReduceScatter(send, recv, recvCount, ncclType(dtype),
                                    ncclSum, comm_, cudaStream_t(stream)));
    mark(cudaStream_t(stream));
  }
  void reduceScatterSumAdd(void *send, void *recv, size_t recvCount,
                           DType dtype, void *stream) override {
    // In place (NCCL's rule: the output is the rank's own block of the
    // input), then the block is added into recv on the same stream.
    char *block = static_cast<char *>(send) +
                  size_t(rank_) * recvCount * dtypeBytes(dtype);
    AP_NCCL_CHECK(ncclReduceScatter(send, block, recvCount, ncclType(dtype),
                                    ncclSum, comm_, cudaStream_t(stream)));
    mark(cudaStream_t(stream));
    cudaAddInto(dtype, recv, block, recvCount, stream);
  }
  void reduceScatterSumAddBf16(float *send, ap::kernels::bf16 *recv,
                               size_t recvCount, void *stream) override {
    // The F32 sum in place inside `send`, then read with the bf16 shard and
    // rounded once into it.
    float *block = send + size_t(rank_) * recvCount;
    AP_NCCL_CHECK(ncclReduceScatter(send, block, recvCount, ncclFloat32,
                                    ncclSum, comm_, cudaStream_t(stream)));
    mark(cudaStream_t(stream));
    cudaAddIntoBf16(recv, block, recvCount, stream);
  }
  void allGather(const void *send, void *recv, size_t sendCount, DType dtype,
                 void *stream) override {
    AP_NCCL_CHECK(ncclAllGather(send, recv, sendCount, ncclType(dtype), comm_,
                                cudaStream_t(stream)));
    mark(cudaStream_t(stream));
  }
  void broadcast(void *buf, size_t count, DType dtype, int root,
                 void *stream) override {
    if (root < 0 || root >= size_)
      fail("NCCL: broadcast root ", root, " outside a ", size_,
           "-rank communicator");
    AP_NCCL_CHECK(ncclBroadcast(buf, buf, count, ncclType(dtype), root, comm_,
                                cudaStream_t(stream)));
    mark(cudaStream_t(stream));
  }
  void send(const void *buf, size_t count, DType dtype, int peer,
            void *stream) override {
    checkPeer(peer, "send");
    AP_NCCL_CHECK(ncclSend(buf, count, ncclType(dtype), peer, comm_,
                           cudaStream_t(stream)));
    mark(cudaStream_t(stream));
  }
  void recv(void *buf, size_t count, DType dtype, int peer,
            void *stream) override {
    checkPeer(peer, "recv");
    AP_NCCL_CHECK(ncclRecv(buf, count, ncclType(dtype), peer, comm_,
                           cudaStream_t(stream)));
    mark(cudaStream_t(stream));
  }

  void groupStart() override {
    if (inGroup_)
      fail("NCCL: a group is already open");
    AP_NCCL_CHECK(ncclGroupStart());
    inGroup_ = true;
    groupStreams_.clear();
  }
  void groupEnd() override {
    if (!inGroup_)
      fail("NCCL: a group end without a start");
    inGroup_ = false;
    AP_NCCL_CHECK(ncclGroupEnd());
    // The group's collectives are enqueued now: the watchdog's marks go
    // after them.
    for (cudaStream_t s : groupStreams_)
      watchdog_->enqueued(s);
    groupStreams_.clear();
  }

  void barrier() override { (void)allTrue(true); }

  bool allTrue(bool value) override {
    // A one-element min-reduction on a private stream, waited for on the
    // host.
    if (!barrierStream_) {
      AP_CUDA_CHECK(
          cudaStreamCreateWithFlags(&barrierStream_, cudaStreamNonBlocking));
      AP_CUDA_CHECK(cudaMalloc(&barrierBuf_, sizeof(int32_t)));
    }
    int32_t v = value ? 1 : 0;
    AP_CUDA_CHECK(cudaMemcpyAsync(barrierBuf_, &v, sizeof(v),
                                  cudaMemcpyHostToDevice, barrierStream_));
    AP_NCCL_CHECK(ncclAllReduce(barrierBuf_, barrierBuf_, 1, ncclInt32, ncclMin,
                                comm_, barrierStream_));
    mark(barrierStream_);
    AP_CUDA_CHECK(cudaMemcpyAsync(&v, barrierBuf_, sizeof(v),
                                  cudaMemcpyDeviceToHost, barrierStream_));
    AP_CUDA_CHECK(cudaStreamSynchronize(barrierStream_));
    return v != 0;
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    ncclComm_t sub = nullptr;
    AP_NCCL_CHECK(ncclCommSplit(comm_, color, key, &sub, nullptr));
    if (!sub)
      fail("NCCL: ncclCommSplit returned no communicator for color ", color);
    return std::make_unique<NcclCommunicator>(sub);
  }

private:
  /// The watchdog's mark after a collective enqueued on `s` (in a group:
  /// at its end).
  void mark(cudaStream_t s) {
    if (!inGroup_) {
      watchdog_->enqueued(s);
      return;
    }
    if (std::find(groupStreams_.begin(), groupStreams_.end(), s) ==
        groupStreams_.end())
      groupStreams_.push_back(s);
  }

  void checkPeer(int peer, const char *what) const {
    if (peer < 0 || peer >= size_ || peer == rank_)
      fail("NCCL: ", what, " peer ", peer, " is not another rank of this ",
           size_, "-rank communicator (this is rank ", rank_, ")");
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<NcclWatchdog> watchdog_;
  /// Inside groupStart/groupEnd: NCCL enqueues at the end, so the
  /// watchdog marks the streams used then.
  bool inGroup_ = false;
  std::vector<cudaStream_t> groupStreams_;
  cudaStream_t barrierStream_ = nullptr;
  void *barrierBuf_ = nullptr;
};

} // namespace

std::unique_ptr<Communicator> createNcclWorldCommunicator(
    const LaunchInfo &launch,
    const std::function<void(void *, size_t)> &shareId) {
  int devices = 0;
  AP_CUDA_CHECK(cudaGetDeviceCount(&devices));
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (launch.rank == 0)
    AP_NCCL_CHECK(ncclGetUniqueId(&id));
  if (launch.worldSize > 1) {
    if (!shareId)
      fail("NCCL: ", launch.worldSize,
           " ranks but no way to share the NCCL unique id");
    shareId(&id, sizeof(id));
  }
  ncclComm_t comm = nullptr;
  AP_NCCL_CHECK(ncclCommInitRank(&comm, launch.worldSize, id, launch.rank));
  return std::make_unique<NcclCommunicator>(comm);
}

#else // !ACTPLACE_HAVE_NCCL

std::unique_ptr<Communicator>
createNcclWorldCommunicator(const LaunchInfo &,
                            const std::function<void(void *, size_t)> &) {
  fail("collectives: this build has CUDA but no NCCL; the cuda backend "
       "cannot create communicators");
}

#endif

} // namespace ap::rt
