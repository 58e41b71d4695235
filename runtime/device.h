//===- device.h - Streams, events, arena ------------------------*- C++ -*-===//
//
// ap::rt::Device is what generated code talks to for everything that is not
// pinned memory or transfers: the five streams (compute, d2h, h2d, comm,
// side), events, the single device arena laid out by the compiler's memory
// plan, kernel workspaces (one for compute, one for side), the cuBLASLt
// handle (through the KernelContext it fills) and measured device memory.
//
// Ordering is tracked above the backend with vector clocks (one counter per
// stream, advanced by each event record): an event record carries the clock
// of its stream, a wait merges it into the waiting stream, and a host
// synchronisation merges it into the host's clock. Asking "is this record
// ordered before what I enqueue on stream S now?" is then four integer
// comparisons. The pinned pool and the offload engine use this to check the
// compiled schedule's invariants on every step, at no measurable cost, and
// the check is transitive (a slot may be reused after a chain of waits, not
// only after a direct one).
//
// Threading: one host thread drives a Device. The backends' workers are
// internal.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_DEVICE_H
#define ACTPLACE_RUNTIME_DEVICE_H

#include "runtime/backend.h"

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ap::rt {

/// Handle of an event created by Device::createEvent().
enum class EventId : uint32_t {};

/// The `generation`-th record of `event`; it was the `tick`-th record on
/// `stream`. Identifies one completion point even after the event is
/// recorded again.
struct SyncPoint {
  EventId event{};
  uint64_t generation = 0;
  Stream stream = Stream::Compute;
  uint64_t tick = 0;
};

/// Buffers handed to kernels are 256-byte aligned (kernels/kernels.h).
inline constexpr uint64_t kDeviceAlignment = 256;
inline constexpr uint64_t alignUp(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

struct DeviceOptions {
  /// nullopt (`--device auto`): cuda when a GPU is usable, else host;
  /// Cuda without a usable GPU is an error.
  std::optional<DeviceKind> device;
  /// CUDA device ordinal (launchers set it from LOCAL_RANK).
  int deviceIndex = 0;
  /// Ranks may share GPUs (collectives staged through MPI): the cuda
  /// backend takes deviceIndex modulo the visible devices.
  bool shareDevices = false;
  /// Do not print the fallback notice on stderr (it is still in notice()).
  bool quiet = false;
};

class Device {
public:
  /// Picks the backend; on a machine without a usable GPU an auto request
  /// (options.device unset) falls back to host and prints notice() on
  /// stderr, a cuda request throws Error.
  explicit Device(const DeviceOptions &options = {});
  /// Uses the given backend (tests).
  explicit Device(std::unique_ptr<Backend> backend);
  /// Waits for all work, then frees the arena. Pinned pools and offload
  /// engines built on this Device must be destroyed first.
  ~Device();
  Device(const Device &) = delete;
  Device &operator=(const Device &) = delete;

  DeviceKind kind() const { return backend_->kind(); }
  std::string description() const { return backend_->description(); }
  /// "CPU" on host, the GPU's name on cuda (metrics lines).
  std::string deviceName() const { return backend_->deviceName(); }
  /// Why the requested backend was not used; empty when it was.
  const std::string &notice() const { return notice_; }
  Backend &backend() { return *backend_; }
  /// cudaStream_t of `stream` on cuda (for NCCL calls on the comm stream),
  /// null on host.
  void *nativeStream(Stream stream) const {
    return backend_->nativeStream(stream);
  }

  //===--- Arena ----------------------------------------------------------===//
  /// Allocates the one device arena: `planBytes` laid out by the compiled
  /// memory plan, followed by `workspaceBytes` of kernel workspace for the
  /// compute stream, then `sideWorkspaceBytes` for the side stream (each at
  /// a 256-byte boundary). Allowed once per Device: steady-state allocation
  /// is a bug (and on cuda a synchronisation point).
  void allocateArena(uint64_t planBytes, uint64_t workspaceBytes = 0,
                     uint64_t sideWorkspaceBytes = 0);
  /// Makes `bytes` at `offset` of the planned region (the plan's own
  /// workspace region) the compute stream's kernel workspace, instead of
  /// the separate tail; the tail is then unused, so callers that use this
  /// pass workspaceBytes = 0 to allocateArena. The range must be in the plan
  /// and 256-byte aligned.
  void useWorkspaceInArena(uint64_t offset, uint64_t bytes);
  /// The same for the side stream's workspace (the plan's side workspace
  /// region); callers pass sideWorkspaceBytes = 0 to allocateArena.
  void useSideWorkspaceInArena(uint64_t offset, uint64_t bytes);
  bool hasArena() const { return arena_ != nullptr; }
  /// Start of the planned region (256-byte aligned).
  char *arenaBase() const { return arena_; }
  uint64_t planBytes() const { return planBytes_; }
  /// `arenaBase() + offset`, checked to lie in the planned region with
  /// `bytes` after it; errors name the offset and the plan size.
  void *at(uint64_t offset, uint64_t bytes = 0) const;
  /// True when [ptr, ptr + bytes) lies inside the planned region.
  bool inArena(const void *ptr, uint64_t bytes) const;
  void *workspace() const { return workspaceBytes_ ? workspace_ : nullptr; }
  uint64_t workspaceBytes() const { return workspaceBytes_; }
  /// The side stream's kernel workspace (null when it has none).
  void *sideWorkspace() const {
    return sideWorkspaceBytes_ ? sideWorkspace_ : nullptr;
  }
  uint64_t sideWorkspaceBytes() const { return sideWorkspaceBytes_; }

  //===--- Streams and events ---------------------------------------------===//
  EventId createEvent();
  /// Records `event` on `stream` (after all work enqueued there so far).
  void record(EventId event, Stream stream);
  /// Work enqueued on `stream` later waits for the latest record of `event`.
  /// Waiting on a never-recorded event is a no-op, as in CUDA.
  void wait(Stream stream, EventId event);
  void synchronize(EventId event);
  /// True when the latest record of `event` completed.
  bool query(EventId event);
  void synchronize(Stream stream);
  /// Waits for all streams; rethrows a failure of earlier asynchronous work.
  void synchronize();
  /// Number of records of `event` so far (0: never recorded).
  uint64_t generation(EventId event) const;
  /// The latest record of `event`; fails if it was never recorded.
  SyncPoint lastRecord(EventId event) const;
  /// True when work enqueued on `stream` from now on is ordered after
  /// `point` by the waits and synchronisations made so far (transitively).
  bool orderedBefore(const SyncPoint &point, Stream stream) const;
  /// True when `point` is known to have completed (may query the backend).
  bool completed(const SyncPoint &point);

  //===--- Work -----------------------------------------------------------===//
  void copyAsync(void *dst, const void *src, uint64_t bytes, CopyKind kind,
                 Stream stream);
  void memsetAsync(void *dst, int value, uint64_t bytes, Stream stream);
  /// Runs one kernel call in `stream` order inside an NVTX range named
  /// `name`; a non-Ok status becomes an Error naming the op (at once on
  /// cuda, at the next synchronisation on host).
  void launch(Stream stream, const char *name, KernelFn fn);
  /// Runs a host function in `stream` order.
  void hostCallback(Stream stream, std::function<void()> fn);
  /// Copies device -> host on `stream` and waits for it (loss readback,
  /// fingerprints): never used on the hot path.
  void copyToHostSync(void *dst, const void *src, uint64_t bytes,
                      Stream stream = Stream::Compute);
  /// The context kernels receive on `stream`: backend, native stream,
  /// cuBLASLt handle, SM count; the compute workspace on compute, the side
  /// workspace and an SM target for GEMMs on side, no workspace elsewhere.
  kernels::KernelContext kernelContext(Stream stream) const;
  /// From now on compute kernels get an event to record after their first,
  /// SM-filling launch (KernelContext::firstLaunchDone; the GDN chunk
  /// backward records it) and each side-stream wait also waits for it:
  /// with side work issued after its host kernel, the side stream starts
  /// once the host's wide pass is done. cuda only (no effect on host); the
  /// program asks for it (Program::sideAfterHostStart).
  void enableSideAfterFirstLaunch();
  /// The share of the SMs, in percent (1 to 100), that side-stream GEMMs
  /// ask cuBLASLt for (KernelContext::smTarget, cuda only; the algorithm
  /// and the bits stay those chosen without a target). The program's
  /// Program::sideSmPercent; 75 until set.
  void setSideSmPercent(int32_t percent);
  int32_t sideSmPercent() const { return sideSmPercent_; }

  //===--- Memory statistics ----------------------------------------------===//
  /// Samples device memory use. cuda: cudaMemGetInfo (total - free) minus the
  /// use measured when the Device was created (so the CUDA context is not
  /// counted, but the arena, cuBLASLt and anything a library allocates is).
  /// host: the bytes of the arena (all "device" memory there is).
  void sampleMemory();
  /// Largest sampled use since creation or the last resetPeak().
  uint64_t devicePeakBytes() const { return peakBytes_; }
  void resetPeak() { peakBytes_ = 0; }

private:
  using Clock = std::array<uint64_t, kNumStreams>;
  struct EventState {
    uint64_t generation = 0;
    Stream stream = Stream::Compute;
    uint64_t tick = 0;
    Clock clock{};
  };
  static void merge(Clock &into, const Clock &from);
  EventState &state(EventId event);
  const EventState &state(EventId event) const;
  void initMemoryBaseline();

  std::unique_ptr<Backend> backend_;
  /// setSideSmPercent: side-stream GEMMs' share of the SMs.
  int32_t sideSmPercent_ = 75;
  /// Once enableSideAfterFirstLaunch() ran on cuda: the event compute
  /// kernels record after their first, SM-filling launch (KernelContext::
  /// firstLaunchDone; the GDN chunk backward) and the side stream waits for
  /// after each of its waits; null otherwise.
  void *firstLaunchDone_ = nullptr;
  EventId firstLaunchEvent_{};
  std::string notice_;
  char *arena_ = nullptr;
  void *allocation_ = nullptr;
  uint64_t planBytes_ = 0;
  char *workspace_ = nullptr;
  uint64_t workspaceBytes_ = 0;
  char *sideWorkspace_ = nullptr;
  uint64_t sideWorkspaceBytes_ = 0;
  std::vector<EventState> events_;
  std::array<Clock, kNumStreams> streamClock_{};
  Clock hostClock_{};
  std::optional<uint64_t> baselineBytes_;
  uint64_t peakBytes_ = 0;
};

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_DEVICE_H
