//===- backend.h - Backend interface: cuda and host -------------*- C++ -*-===//
//
// The runtime has one API and two backends (docs/architecture.md section 5). A
// Backend is the thin, backend-specific layer under ap::rt::Device: it owns the
// native streams, events and allocations and executes copies and kernel
// launches. Everything that must behave identically on both backends (event
// generations, ordering checks, the arena, NVTX, memory statistics) lives in
// Device, above this interface, so generated code cannot tell them apart.
//
// cuda: CUDA runtime streams/events, cudaMalloc, cudaHostAlloc, cuBLASLt.
// host: every stream is a worker thread draining a FIFO queue, events are
//       completion flags, copies are memcpy tasks and "device" memory is a
//       separate allocation. The asynchrony is real: a missing wait is a real
//       data race, which is what the ThreadSanitizer test binaries look for.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_BACKEND_H
#define ACTPLACE_RUNTIME_BACKEND_H

#include "kernels/kernels.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace ap::rt {

/// Which backend executes the step.
enum class DeviceKind : int32_t { Host = 0, Cuda = 1 };

/// "host" / "cuda".
const char *deviceKindName(DeviceKind kind);
/// Parses "host" or "cuda"; nullopt for anything else.
std::optional<DeviceKind> parseDeviceKind(std::string_view text);

/// The runtime's fixed set of streams (docs/architecture.md section 3, exec
/// dialect; the values are those of ap::exec::Stream). Side is a second compute
/// stream: recompute kernels issued early so that they overlap compute
/// kernels that leave SMs idle.
enum class Stream : uint8_t {
  Compute = 0,
  D2H = 1,
  H2D = 2,
  Comm = 3,
  Side = 4
};
inline constexpr int kNumStreams = 5;
/// "compute" / "d2h" / "h2d" / "comm" / "side".
const char *streamName(Stream stream);

/// Direction of a copy. Both backends accept any direction on any stream;
/// the direction documents intent and lets the cuda backend pick the
/// cudaMemcpyKind without pointer queries.
enum class CopyKind : uint8_t {
  HostToDevice,
  DeviceToHost,
  DeviceToDevice,
  HostToHost
};

/// A kernel invocation as generated code writes it: a callable that calls one
/// kernel entry with the context the runtime provides. On the host backend it
/// runs later on the stream's worker thread, so it must capture by value.
using KernelFn = std::function<kernels::Status(const kernels::KernelContext &)>;

/// "Ok", "InvalidArgument", ...
const char *kernelStatusName(kernels::Status status);

/// Backend-specific operations. Event ids are dense indices handed out by
/// createEvent(). All methods are called from the one host thread that drives
/// the step (Device serialises nothing itself).
class Backend {
public:
  virtual ~Backend();

  virtual DeviceKind kind() const = 0;
  /// One line for logs, e.g. "cuda: NVIDIA H200 (sm_90, 132 SMs, 140 GiB)".
  virtual std::string description() const = 0;
  /// The name of the device that runs the work, for metrics lines: the GPU's
  /// name on cuda (e.g. "NVIDIA H200"), "CPU" on host.
  virtual std::string deviceName() const = 0;

  /// Device memory (cudaMalloc on cuda). Called once per run for the arena.
  virtual void *allocateDevice(size_t bytes) = 0;
  virtual void freeDevice(void *ptr) = 0;
  /// Page-locked host memory (cudaHostAlloc on cuda, aligned memory on host).
  virtual void *allocatePinned(size_t bytes) = 0;
  virtual void freePinned(void *ptr) = 0;

  virtual uint32_t createEvent() = 0;
  /// Marks the point after all work enqueued so far on `stream`.
  virtual void recordEvent(uint32_t event, Stream stream) = 0;
  /// Work enqueued on `stream` after this call starts only after the latest
  /// record of `event` (at the time of this call) completed. No-op if the
  /// event was never recorded, as in CUDA.
  virtual void waitEvent(Stream stream, uint32_t event) = 0;
  virtual void synchronizeEvent(uint32_t event) = 0;
  /// True when the latest record of `event` completed (or none exists).
  virtual bool queryEvent(uint32_t event) = 0;
  virtual void synchronizeStream(Stream stream) = 0;
  virtual void synchronize() = 0;

  /// Timers (--op-times): stream-ordered timestamps that nothing waits on.
  /// Ids are dense, separate from event ids. recordTimer marks the point
  /// after all work enqueued so far on `stream`; timerSeconds(a, b) is the
  /// time from a's mark to b's, valid once both completed (after a
  /// synchronisation).
  virtual uint32_t createTimer() = 0;
  virtual void recordTimer(uint32_t timer, Stream stream) = 0;
  virtual double timerSeconds(uint32_t from, uint32_t to) = 0;

  virtual void copyAsync(void *dst, const void *src, size_t bytes,
                         CopyKind kind, Stream stream) = 0;
  virtual void memsetAsync(void *dst, int value, size_t bytes,
                           Stream stream) = 0;
  /// Runs `fn(ctx)` in stream order. The cuda backend calls it at once on the
  /// calling thread (the kernel entry enqueues on ctx.stream) and throws on a
  /// non-Ok status; the host backend runs it on the stream's worker and
  /// reports a failure at the next synchronisation.
  virtual void launch(Stream stream, const char *name, KernelFn fn,
                      const kernels::KernelContext &ctx) = 0;
  /// Enqueues a host callback in stream order (cudaLaunchHostFunc on cuda).
  virtual void hostCallback(Stream stream, std::function<void()> fn) = 0;

  /// cudaStream_t of `stream` on cuda, null on host.
  virtual void *nativeStream(Stream stream) const = 0;
  /// cudaEvent_t of `event` on cuda (for kernels that record it themselves:
  /// KernelContext::firstLaunchDone), null on host.
  virtual void *nativeEvent(uint32_t) const { return nullptr; }
  /// cublasLtHandle_t on cuda, null on host.
  virtual void *cublasLtHandle() const = 0;
  virtual int32_t smCount() const = 0;
  /// The stream's scheduling priority (cudaStreamGetPriority: lower runs
  /// first); 0 on host.
  virtual int streamPriority(Stream) const { return 0; }
  /// Bytes of device memory in use on the device (cudaMemGetInfo: total -
  /// free) or nullopt where the backend cannot measure it (host).
  virtual std::optional<uint64_t> deviceMemoryUsed() = 0;
  /// Bytes of device memory free now (cudaMemGetInfo) or nullopt where the
  /// backend has no device memory of its own (host).
  virtual std::optional<uint64_t> deviceMemoryFree() = 0;
};

/// The host backend (always available).
std::unique_ptr<Backend> createHostBackend();

/// The cuda backend, or null with `*whyNot` set when no GPU/driver is usable
/// or the runtime was built without CUDA.
std::unique_ptr<Backend> createCudaBackend(int deviceIndex,
                                           std::string *whyNot);

/// CUDA devices visible to this process (0 without CUDA or a driver).
int visibleCudaDevices();

/// Chooses a backend: `requested` = nullopt (`--device auto`) means cuda when
/// a GPU is usable, else host, and `*notice` then says why it fell back
/// (empty when no fallback happened). A cuda request on a machine without a
/// usable GPU throws Error naming the reason.
std::unique_ptr<Backend> createBackend(std::optional<DeviceKind> requested,
                                       int deviceIndex, std::string *notice);

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_BACKEND_H
