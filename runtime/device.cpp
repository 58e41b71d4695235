//===- device.cpp - Streams, events, arena, ordering clocks -----*- C++ -*-===//
#include "runtime/device.h"

#include "runtime/error.h"
#include "runtime/nvtx.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace ap::rt {

void Device::enableSideAfterFirstLaunch() {
  if (firstLaunchDone_ || kind() != DeviceKind::Cuda)
    return;
  firstLaunchEvent_ = createEvent();
  firstLaunchDone_ = backend_->nativeEvent(
      static_cast<uint32_t>(firstLaunchEvent_)); // null on host: no effect
}

void Device::setSideSmPercent(int32_t percent) {
  if (percent < 1 || percent > 100)
    fail("device: side-stream SM share ", percent,
         " %: expected 1 to 100 (percent of the SMs)");
  sideSmPercent_ = percent;
}

Device::Device(const DeviceOptions &options) {
  int index = options.deviceIndex;
  if (options.shareDevices && options.device != DeviceKind::Host)
    if (int count = visibleCudaDevices(); count > 0)
      index %= count;
  backend_ = createBackend(options.device, index, &notice_);
  if (!notice_.empty() && !options.quiet)
    std::fprintf(stderr, "%s\n", notice_.c_str());
  initMemoryBaseline();
}

Device::Device(std::unique_ptr<Backend> backend)
    : backend_(std::move(backend)) {
  if (!backend_)
    fail("device: null backend");
  initMemoryBaseline();
}

Device::~Device() {
  try {
    backend_->synchronize();
  } catch (const std::exception &e) {
    std::fprintf(stderr, "actplace: error pending at device shutdown: %s\n",
                 e.what());
  }
  if (allocation_) {
    try {
      backend_->freeDevice(allocation_);
    } catch (const std::exception &e) {
      std::fprintf(stderr, "actplace: %s\n", e.what());
    }
  }
}

void Device::initMemoryBaseline() {
  baselineBytes_ = backend_->deviceMemoryUsed();
}

//===----------------------------------------------------------------------===//
// Arena
//===----------------------------------------------------------------------===//

void Device::allocateArena(uint64_t planBytes, uint64_t workspaceBytes,
                           uint64_t sideWorkspaceBytes) {
  if (allocation_)
    fail("device: the arena is allocated once per run (already ", planBytes_,
         " + ", workspaceBytes_, " + ", sideWorkspaceBytes_, " bytes)");
  uint64_t planRounded = alignUp(planBytes, kDeviceAlignment);
  uint64_t wsRounded = alignUp(workspaceBytes, kDeviceAlignment);
  uint64_t total =
      planRounded + wsRounded + alignUp(sideWorkspaceBytes, kDeviceAlignment);
  // A zero-byte plan still gets a real allocation so arenaBase() is valid.
  allocation_ =
      backend_->allocateDevice(std::max<uint64_t>(total, kDeviceAlignment));
  arena_ = static_cast<char *>(allocation_);
  if (reinterpret_cast<uintptr_t>(arena_) % kDeviceAlignment != 0)
    fail("device: arena allocation is not ", kDeviceAlignment, "-byte aligned");
  planBytes_ = planBytes;
  workspace_ = arena_ + planRounded;
  workspaceBytes_ = workspaceBytes;
  sideWorkspace_ = workspace_ + wsRounded;
  sideWorkspaceBytes_ = sideWorkspaceBytes;
  sampleMemory();
}

namespace {
/// The arena address of a workspace region at `offset`, checked aligned.
char *alignedRegion(const Device &dev, uint64_t offset, uint64_t bytes,
                    const char *what) {
  char *p = static_cast<char *>(dev.at(offset, bytes));
  if (reinterpret_cast<uintptr_t>(p) % kDeviceAlignment != 0)
    fail("device: ", what, " at arena offset ", offset, " is not ",
         kDeviceAlignment, "-byte aligned");
  return p;
}
} // namespace

void Device::useWorkspaceInArena(uint64_t offset, uint64_t bytes) {
  workspace_ = alignedRegion(*this, offset, bytes, "workspace");
  workspaceBytes_ = bytes;
}

void Device::useSideWorkspaceInArena(uint64_t offset, uint64_t bytes) {
  sideWorkspace_ = alignedRegion(*this, offset, bytes, "side workspace");
  sideWorkspaceBytes_ = bytes;
}

void *Device::at(uint64_t offset, uint64_t bytes) const {
  if (!arena_)
    fail("device: arena used before allocateArena()");
  if (offset > planBytes_ || bytes > planBytes_ - offset)
    fail("device: arena range [", offset, ", ", offset + bytes,
         ") outside the planned ", planBytes_, " bytes");
  return arena_ + offset;
}

bool Device::inArena(const void *ptr, uint64_t bytes) const {
  if (!arena_ || !ptr)
    return false;
  auto p = reinterpret_cast<uintptr_t>(ptr);
  auto base = reinterpret_cast<uintptr_t>(arena_);
  return p >= base && p - base <= planBytes_ &&
         bytes <= planBytes_ - (p - base);
}

//===----------------------------------------------------------------------===//
// Events and ordering
//===----------------------------------------------------------------------===//

void Device::merge(Clock &into, const Clock &from) {
  for (int i = 0; i < kNumStreams; ++i)
    into[i] = std::max(into[i], from[i]);
}

Device::EventState &Device::state(EventId event) {
  auto i = static_cast<uint32_t>(event);
  if (i >= events_.size())
    fail("device: unknown event ", i, " (", events_.size(), " created)");
  return events_[i];
}
const Device::EventState &Device::state(EventId event) const {
  return const_cast<Device *>(this)->state(event);
}

EventId Device::createEvent() {
  uint32_t id = backend_->createEvent();
  if (id != events_.size())
    fail("device: backend event ids out of step");
  events_.emplace_back();
  return static_cast<EventId>(id);
}

void Device::record(EventId event, Stream stream) {
  EventState &ev = state(event);
  Clock &clock = streamClock_[static_cast<int>(stream)];
  // What the host has seen complete was complete before this record was
  // enqueued, so the record is ordered after it too.
  merge(clock, hostClock_);
  ++clock[static_cast<int>(stream)];
  ev.generation += 1;
  ev.stream = stream;
  ev.tick = clock[static_cast<int>(stream)];
  ev.clock = clock;
  backend_->recordEvent(static_cast<uint32_t>(event), stream);
}

void Device::wait(Stream stream, EventId event) {
  EventState &ev = state(event);
  if (ev.generation == 0)
    return;
  merge(streamClock_[static_cast<int>(stream)], ev.clock);
  backend_->waitEvent(stream, static_cast<uint32_t>(event));
  // Recorded inside a kernel, not through record(): an ordering the clocks
  // do not know of, which only makes the side stream later.
  if (stream == Stream::Side && firstLaunchDone_)
    backend_->waitEvent(stream, static_cast<uint32_t>(firstLaunchEvent_));
}

void Device::synchronize(EventId event) {
  EventState &ev = state(event);
  backend_->synchronizeEvent(static_cast<uint32_t>(event));
  merge(hostClock_, ev.clock);
}

bool Device::query(EventId event) {
  EventState &ev = state(event);
  bool done = backend_->queryEvent(static_cast<uint32_t>(event));
  if (done)
    merge(hostClock_, ev.clock);
  return done;
}

void Device::synchronize(Stream stream) {
  backend_->synchronizeStream(stream);
  merge(hostClock_, streamClock_[static_cast<int>(stream)]);
}

void Device::synchronize() {
  backend_->synchronize();
  for (const Clock &c : streamClock_)
    merge(hostClock_, c);
}

uint64_t Device::generation(EventId event) const {
  return state(event).generation;
}

SyncPoint Device::lastRecord(EventId event) const {
  const EventState &ev = state(event);
  if (ev.generation == 0)
    fail("device: event ", static_cast<uint32_t>(event), " was never recorded");
  return SyncPoint{event, ev.generation, ev.stream, ev.tick};
}

bool Device::orderedBefore(const SyncPoint &point, Stream stream) const {
  int t = static_cast<int>(point.stream);
  uint64_t known =
      std::max(streamClock_[static_cast<int>(stream)][t], hostClock_[t]);
  return known >= point.tick;
}

bool Device::completed(const SyncPoint &point) {
  if (hostClock_[static_cast<int>(point.stream)] >= point.tick)
    return true;
  const EventState &ev = state(point.event);
  // A later record of the same event on the same stream completes after this
  // one (FIFO), so querying the event still answers for `point`.
  bool sameRecordOrLater = ev.generation == point.generation ||
                           (ev.stream == point.stream && ev.tick >= point.tick);
  return sameRecordOrLater && query(point.event);
}

//===----------------------------------------------------------------------===//
// Work
//===----------------------------------------------------------------------===//

void Device::copyAsync(void *dst, const void *src, uint64_t bytes,
                       CopyKind kind, Stream stream) {
  if (bytes && (!dst || !src))
    fail("device: copy of ", bytes, " bytes on stream ", streamName(stream),
         " with a null pointer");
  backend_->copyAsync(dst, src, bytes, kind, stream);
}

void Device::memsetAsync(void *dst, int value, uint64_t bytes, Stream stream) {
  if (bytes && !dst)
    fail("device: memset of ", bytes, " bytes with a null pointer");
  backend_->memsetAsync(dst, value, bytes, stream);
}

void Device::launch(Stream stream, const char *name, KernelFn fn) {
  ScopedRange range(name ? name : "?");
  backend_->launch(stream, name, std::move(fn), kernelContext(stream));
}

void Device::hostCallback(Stream stream, std::function<void()> fn) {
  backend_->hostCallback(stream, std::move(fn));
}

void Device::copyToHostSync(void *dst, const void *src, uint64_t bytes,
                            Stream stream) {
  copyAsync(dst, src, bytes, CopyKind::DeviceToHost, stream);
  synchronize(stream);
}

kernels::KernelContext Device::kernelContext(Stream stream) const {
  kernels::KernelContext ctx;
  ctx.backend = kind() == DeviceKind::Cuda ? kernels::Backend::Cuda
                                           : kernels::Backend::Host;
  ctx.stream = backend_->nativeStream(stream);
  ctx.cublasLt = backend_->cublasLtHandle();
  ctx.smCount = backend_->smCount();
  // One workspace per stream that runs kernels: kernels on two streams at
  // once would otherwise share scratch.
  if (stream == Stream::Compute && workspaceBytes_) {
    ctx.workspace = workspace_;
    ctx.workspaceBytes = workspaceBytes_;
  }
  if (stream == Stream::Compute)
    ctx.firstLaunchDone = firstLaunchDone_;
  if (stream == Stream::Side) {
    if (sideWorkspaceBytes_) {
      ctx.workspace = sideWorkspace_;
      ctx.workspaceBytes = sideWorkspaceBytes_;
    }
    // Side GEMMs leave the rest of the SMs to the compute stream's kernel
    // they overlap: without a target their persistent CTAs take every SM
    // and the kernel they should hide beside waits. The share is the
    // program's (setSideSmPercent), which the cost model's side capacity
    // was measured under.
    if (kind() == DeviceKind::Cuda)
      ctx.smTarget = std::max(1, ctx.smCount * sideSmPercent_ / 100);
  }
  return ctx;
}

//===----------------------------------------------------------------------===//
// Memory statistics
//===----------------------------------------------------------------------===//

void Device::sampleMemory() {
  uint64_t use = 0;
  if (std::optional<uint64_t> used = backend_->deviceMemoryUsed()) {
    uint64_t base = baselineBytes_.value_or(0);
    use = *used > base ? *used - base : 0;
  } else if (allocation_) {
    use = alignUp(planBytes_, kDeviceAlignment) +
          alignUp(workspaceBytes_, kDeviceAlignment) +
          alignUp(sideWorkspaceBytes_, kDeviceAlignment);
  }
  peakBytes_ = std::max(peakBytes_, use);
}

} // namespace ap::rt
