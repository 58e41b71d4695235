//===- device_test.cpp - Device tests ---------------------------*- C++ -*-===//
#include "runtime/device.h"
#include "runtime/nvtx.h"
#include "runtime_test_util.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

using namespace ap::rt;
using namespace ap::rt::test;

namespace {

using DeviceTest = BackendTest;

TEST_P(DeviceTest, ArenaIsAllocatedOnceAlignedAndBoundsChecked) {
  EXPECT_RT_ERROR(device->at(0, 1), "before allocateArena");
  device->allocateArena(1000, 512);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(device->arenaBase()) % 256, 0u);
  EXPECT_EQ(device->planBytes(), 1000u);
  EXPECT_EQ(device->at(0, 1000), device->arenaBase());
  EXPECT_EQ(device->at(256, 16), device->arenaBase() + 256);
  EXPECT_RT_ERROR(device->at(999, 2), "outside the planned 1000 bytes");
  EXPECT_RT_ERROR(device->at(2000), "outside");
  EXPECT_TRUE(device->inArena(device->arenaBase() + 10, 990));
  EXPECT_FALSE(device->inArena(device->arenaBase() + 10, 991));
  EXPECT_FALSE(device->inArena(device->arenaBase() - 1, 1));
  // The workspace follows the plan at the next 256-byte boundary.
  EXPECT_EQ(device->workspace(), device->arenaBase() + 1024);
  EXPECT_RT_ERROR(device->allocateArena(10), "allocated once per run");
  device->sampleMemory();
  EXPECT_GE(device->devicePeakBytes(), 1024u + 512u);
  if (GetParam() == DeviceKind::Host)
    EXPECT_EQ(device->devicePeakBytes(), 1024u + 512u);
}

/// A fresh device of `kind` (quiet).
std::unique_ptr<Device> deviceOf(DeviceKind kind) {
  DeviceOptions options;
  options.device = kind;
  options.quiet = true;
  return std::make_unique<Device>(options);
}

/// Holds the compute stream `holdUs` microseconds (a host function that
/// spins), records an event after the hold, makes the side stream wait for
/// it and returns the microseconds until the side stream is done.
double sideWaitMicros(Device &d, int holdUs) {
  EventId e = d.createEvent();
  auto t0 = std::chrono::steady_clock::now();
  if (holdUs > 0)
    d.hostCallback(Stream::Compute, [holdUs] {
      auto until =
          std::chrono::steady_clock::now() + std::chrono::microseconds(holdUs);
      while (std::chrono::steady_clock::now() < until) {
      }
    });
  d.record(e, Stream::Compute);
  d.wait(Stream::Side, e);
  d.synchronize(Stream::Side);
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now() - t0)
      .count();
}

// The side stream's SM target is the program's share of the SMs (75 %
// until set); a share outside 1..100 is refused naming it. Host kernels
// get no target.
TEST_P(DeviceTest, SideSmPercentSetsTheSideTarget) {
  bool cuda = GetParam() == DeviceKind::Cuda;
  auto d = deviceOf(GetParam());
  EXPECT_EQ(d->sideSmPercent(), 75);
  auto side = d->kernelContext(Stream::Side);
  EXPECT_EQ(side.smTarget, cuda ? side.smCount * 3 / 4 : 0);
  for (int32_t percent : {40, 100, 1}) {
    d->setSideSmPercent(percent);
    EXPECT_EQ(d->sideSmPercent(), percent);
    side = d->kernelContext(Stream::Side);
    EXPECT_EQ(side.smTarget,
              cuda ? std::max(1, side.smCount * percent / 100) : 0)
        << percent;
    EXPECT_EQ(d->kernelContext(Stream::Compute).smTarget, 0);
  }
  EXPECT_RT_ERROR(d->setSideSmPercent(0), "side-stream SM share 0 %");
  EXPECT_RT_ERROR(d->setSideSmPercent(101), "expected 1 to 100");
  EXPECT_EQ(d->sideSmPercent(), 1);
}

// Every stream has the same priority (the compute stream at the greatest
// priority measured no gain); the host backend has none.
TEST_P(DeviceTest, StreamsShareOnePriority) {
  auto d = deviceOf(GetParam());
  for (Stream s : {Stream::D2H, Stream::H2D, Stream::Comm, Stream::Side})
    EXPECT_EQ(d->backend().streamPriority(s),
              d->backend().streamPriority(Stream::Compute))
        << streamName(s);
}

// The first-launch wait is off until the program asks for it (side work
// issued after its host): then compute kernels get an event to record after
// their first launch (cuda only) and each side-stream wait also waits for
// it; side work still runs after the events it waits for.
TEST_P(DeviceTest, SideAfterFirstLaunchIsTheProgramsChoice) {
  bool cuda = GetParam() == DeviceKind::Cuda;
  auto d = deviceOf(GetParam());
  EXPECT_EQ(d->kernelContext(Stream::Compute).firstLaunchDone, nullptr);
  d->enableSideAfterFirstLaunch();
  d->enableSideAfterFirstLaunch(); // once is enough
  EXPECT_EQ(d->kernelContext(Stream::Compute).firstLaunchDone != nullptr, cuda);
  EXPECT_EQ(d->kernelContext(Stream::Side).firstLaunchDone, nullptr);
  // The side stream still waits for its own event (here: a compute-stream
  // hold of 2 ms), whether or not a kernel recorded the first-launch event.
  d->allocateArena(4096, 0);
  EXPECT_GE(sideWaitMicros(*d, 2000), 2000.0);
}
TEST_P(DeviceTest, PeakMemoryReflectsTheArena) {
  const uint64_t plan = 256ull << 20;
  device->allocateArena(plan, 1 << 20);
  device->sampleMemory();
  uint64_t peak = device->devicePeakBytes();
  EXPECT_GE(peak, plan + (1 << 20));
  // cuda: measured with cudaMemGetInfo, so allocation granularity and
  // library allocations add a little, never hundreds of MiB.
  EXPECT_LE(peak, plan + (128ull << 20));
  if (GetParam() == DeviceKind::Host) {
    // Fresh host "device" memory reads as all-ones (NaN), never as zeros.
    auto *bytes = static_cast<unsigned char *>(device->at(0, 64));
    for (int i = 0; i < 64; ++i)
      ASSERT_EQ(bytes[i], 0xff);
  }
  device->resetPeak();
  EXPECT_EQ(device->devicePeakBytes(), 0u);
}

TEST_P(DeviceTest, KernelContextCarriesBackendStreamAndWorkspace) {
  device->allocateArena(4096, 8192);
  auto compute = device->kernelContext(Stream::Compute);
  auto d2h = device->kernelContext(Stream::D2H);
  EXPECT_EQ(compute.workspace, device->workspace());
  EXPECT_EQ(compute.workspaceBytes, 8192u);
  EXPECT_EQ(d2h.workspace, nullptr);
  EXPECT_EQ(d2h.workspaceBytes, 0u);
  if (GetParam() == DeviceKind::Cuda) {
    EXPECT_EQ(compute.backend, ap::kernels::Backend::Cuda);
    EXPECT_NE(compute.stream, nullptr);
    EXPECT_NE(compute.stream, d2h.stream);
    EXPECT_NE(compute.cublasLt, nullptr);
    EXPECT_GT(compute.smCount, 0);
  } else {
    EXPECT_EQ(compute.backend, ap::kernels::Backend::Host);
    EXPECT_EQ(compute.stream, nullptr);
    EXPECT_EQ(compute.smCount, 0);
  }
}

TEST_P(DeviceTest, SideStreamHasItsOwnWorkspaceAndAnSmTarget) {
  device->allocateArena(4096, 8192, 2048);
  // Tail layout: [plan | compute workspace | side workspace].
  EXPECT_EQ(device->workspace(), device->arenaBase() + 4096);
  EXPECT_EQ(device->sideWorkspace(), device->arenaBase() + 4096 + 8192);
  EXPECT_EQ(device->sideWorkspaceBytes(), 2048u);
  auto compute = device->kernelContext(Stream::Compute);
  auto side = device->kernelContext(Stream::Side);
  EXPECT_EQ(compute.workspace, device->workspace());
  EXPECT_EQ(compute.workspaceBytes, 8192u);
  EXPECT_EQ(compute.smTarget, 0);
  EXPECT_EQ(side.workspace, device->sideWorkspace());
  EXPECT_EQ(side.workspaceBytes, 2048u);
  EXPECT_EQ(side.backend, compute.backend);
  EXPECT_EQ(side.cublasLt, compute.cublasLt);
  EXPECT_EQ(side.smCount, compute.smCount);
  for (Stream s : {Stream::D2H, Stream::H2D, Stream::Comm}) {
    EXPECT_EQ(device->kernelContext(s).workspace, nullptr) << streamName(s);
    EXPECT_EQ(device->kernelContext(s).smTarget, 0) << streamName(s);
  }
  if (GetParam() == DeviceKind::Cuda) {
    EXPECT_NE(side.stream, nullptr);
    EXPECT_NE(side.stream, compute.stream);
    EXPECT_EQ(side.smTarget, side.smCount * 3 / 4);
    EXPECT_GT(side.smTarget, 0);
    EXPECT_LT(side.smTarget, side.smCount);
  } else {
    EXPECT_EQ(side.stream, nullptr);
    EXPECT_EQ(side.smTarget, 0);
  }
  device->sampleMemory();
  EXPECT_GE(device->devicePeakBytes(), 4096u + 8192u + 2048u);
  if (GetParam() == DeviceKind::Host)
    EXPECT_EQ(device->devicePeakBytes(), 4096u + 8192u + 2048u);
}

TEST_P(DeviceTest, SideWorkspaceCanBeThePlansRegion) {
  device->allocateArena(8192);
  EXPECT_EQ(device->sideWorkspace(), nullptr);
  EXPECT_EQ(device->kernelContext(Stream::Side).workspace, nullptr);
  EXPECT_RT_ERROR(device->useSideWorkspaceInArena(100, 256),
                  "side workspace at arena offset 100 is not 256-byte aligned");
  EXPECT_RT_ERROR(device->useSideWorkspaceInArena(7936, 512), "outside");
  device->useWorkspaceInArena(4096, 2048);
  device->useSideWorkspaceInArena(6144, 2048);
  auto compute = device->kernelContext(Stream::Compute);
  auto side = device->kernelContext(Stream::Side);
  EXPECT_EQ(compute.workspace, device->at(4096));
  EXPECT_EQ(side.workspace, device->at(6144));
  EXPECT_EQ(side.workspaceBytes, 2048u);
}

// Compute produces, side transforms, compute consumes: ordered only by the
// events between them, every round.
TEST_P(DeviceTest, SideStreamWorkIsOrderedByEventsWithCompute) {
  const size_t n = 16 << 20;
  device->allocateArena(3 * n, 0, 4096);
  char *a = static_cast<char *>(device->at(0, n));
  char *b = static_cast<char *>(device->at(n, n));
  char *c = static_cast<char *>(device->at(2 * n, n));
  EventId produced = device->createEvent(), recomputed = device->createEvent();
  auto seen = std::make_shared<ap::kernels::KernelContext>();
  std::vector<uint8_t> host(n);
  for (int round = 0; round < 6; ++round) {
    int value = 0x20 + round;
    device->memsetAsync(a, value, n, Stream::Compute);
    device->record(produced, Stream::Compute);
    SyncPoint p = device->lastRecord(produced);
    EXPECT_FALSE(device->orderedBefore(p, Stream::Side));
    device->wait(Stream::Side, produced);
    EXPECT_TRUE(device->orderedBefore(p, Stream::Side));
    device->launch(Stream::Side, "side/probe",
                   [seen](const ap::kernels::KernelContext &ctx) {
                     *seen = ctx;
                     return ap::kernels::Status::Ok;
                   });
    device->copyAsync(b, a, n, CopyKind::DeviceToDevice, Stream::Side);
    device->record(recomputed, Stream::Side);
    device->wait(Stream::Compute, recomputed);
    EXPECT_EQ(device->lastRecord(recomputed).stream, Stream::Side);
    device->copyAsync(c, b, n, CopyKind::DeviceToDevice, Stream::Compute);
    device->copyToHostSync(host.data(), c, n, Stream::Compute);
    size_t bad = 0;
    for (uint8_t v : host)
      bad += v != value;
    ASSERT_EQ(bad, 0u) << "round " << round;
  }
  device->synchronize();
  EXPECT_EQ(seen->workspace, device->sideWorkspace());
  EXPECT_EQ(seen->workspaceBytes, 4096u);
  EXPECT_EQ(seen->stream, device->kernelContext(Stream::Side).stream);
  EXPECT_EQ(rangeDepth(), 0);
}

TEST_P(DeviceTest, CopiesRoundTripThroughTheArena) {
  const size_t n = 3 << 20;
  device->allocateArena(2 * n);
  auto src = randomBytes(n, 7);
  std::vector<uint8_t> back(n, 0);
  char *a = static_cast<char *>(device->at(0, n));
  char *b = static_cast<char *>(device->at(n, n));
  device->copyAsync(a, src.data(), n, CopyKind::HostToDevice, Stream::Compute);
  device->copyAsync(b, a, n, CopyKind::DeviceToDevice, Stream::Compute);
  device->copyToHostSync(back.data(), b, n, Stream::Compute);
  EXPECT_EQ(back, src);
}

// A chain through all four streams, each link ordered only by an event: the
// value read at the end must be the one written at the start, every round.
TEST_P(DeviceTest, EventsOrderWorkAcrossAllStreams) {
  const size_t n = 32 << 20;
  device->allocateArena(3 * n);
  char *a = static_cast<char *>(device->at(0, n));
  char *b = static_cast<char *>(device->at(n, n));
  char *c = static_cast<char *>(device->at(2 * n, n));
  EventId e1 = device->createEvent(), e2 = device->createEvent(),
          e3 = device->createEvent(), e4 = device->createEvent();
  std::vector<uint8_t> host(n);
  for (int round = 0; round < 6; ++round) {
    int value = 0x10 + round;
    device->memsetAsync(a, value, n, Stream::Compute);
    device->record(e1, Stream::Compute);
    device->wait(Stream::H2D, e1);
    device->copyAsync(b, a, n, CopyKind::DeviceToDevice, Stream::H2D);
    device->record(e2, Stream::H2D);
    device->wait(Stream::Comm, e2);
    device->copyAsync(c, b, n, CopyKind::DeviceToDevice, Stream::Comm);
    device->record(e3, Stream::Comm);
    device->wait(Stream::D2H, e3);
    device->copyAsync(host.data(), c, n, CopyKind::DeviceToHost, Stream::D2H);
    device->record(e4, Stream::D2H);
    device->synchronize(e4);
    EXPECT_TRUE(device->query(e4));
    size_t bad = 0;
    for (uint8_t v : host)
      bad += v != value;
    ASSERT_EQ(bad, 0u) << "round " << round;
    // Before the next round's memset reuses `a`, compute must wait for the
    // copy that read it; e4 completed on the host, which orders everything.
  }
}

TEST_P(DeviceTest, TimersMeasureStreamOrderSpansWithoutWaiting) {
  Backend &b = device->backend();
  uint32_t t0 = b.createTimer(), t1 = b.createTimer(), t2 = b.createTimer();
  EXPECT_EQ(t1, t0 + 1);
  Gate gate;
  auto before = std::chrono::steady_clock::now();
  b.recordTimer(t0, Stream::Compute);
  device->hostCallback(Stream::Compute, gate.waiter());
  device->hostCallback(Stream::Compute, [] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  });
  // Recording did not wait for the blocked stream: the host got here
  // (otherwise the gate below would never open).
  b.recordTimer(t1, Stream::Compute);
  b.recordTimer(t2, Stream::Compute);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  gate.open();
  device->synchronize(Stream::Compute);
  double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - before)
          .count();
  // t0 -> t1 holds at least the 30 ms sleep that ran between the marks,
  // and both marks lie inside the host's window around them.
  double span = b.timerSeconds(t0, t1);
  EXPECT_GE(span, 0.030);
  EXPECT_LE(span, wall);
  // Nothing ran between t1 and t2: far less than the sleep (a loaded CI
  // machine may still preempt the worker for a few ms).
  EXPECT_GE(b.timerSeconds(t1, t2), 0.0);
  EXPECT_LT(b.timerSeconds(t1, t2), 0.025);
}

TEST_P(DeviceTest, QueryAndSynchronizeReflectCompletion) {
  Gate gate;
  EventId e = device->createEvent();
  EXPECT_TRUE(device->query(e)); // never recorded: nothing to wait for
  device->hostCallback(Stream::Compute, gate.waiter());
  device->record(e, Stream::Compute);
  EXPECT_EQ(device->generation(e), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(device->query(e));
  gate.open();
  device->synchronize(e);
  EXPECT_TRUE(device->query(e));
}

TEST_P(DeviceTest, OrderingClocksAreTransitive) {
  EventId e = device->createEvent(), f = device->createEvent(),
          g = device->createEvent();
  EXPECT_RT_ERROR(device->lastRecord(e), "never recorded");
  Gate gate; // keeps everything incomplete so only the clocks can answer
  device->hostCallback(Stream::Compute, gate.waiter());
  device->record(e, Stream::Compute);
  SyncPoint p = device->lastRecord(e);
  EXPECT_EQ(p.stream, Stream::Compute);
  EXPECT_EQ(p.generation, 1u);
  EXPECT_TRUE(device->orderedBefore(p, Stream::Compute));
  EXPECT_FALSE(device->orderedBefore(p, Stream::D2H));
  EXPECT_FALSE(device->completed(p));
  device->wait(Stream::D2H, e);
  EXPECT_TRUE(device->orderedBefore(p, Stream::D2H));
  EXPECT_FALSE(device->orderedBefore(p, Stream::H2D));
  device->record(f, Stream::D2H);
  device->wait(Stream::H2D, f); // H2D after f after e
  EXPECT_TRUE(device->orderedBefore(p, Stream::H2D));
  EXPECT_FALSE(device->orderedBefore(p, Stream::Comm));
  // A later record of e does not make the first one ordered anywhere new.
  device->record(e, Stream::Compute);
  EXPECT_FALSE(device->orderedBefore(p, Stream::Comm));
  gate.open();
  device->synchronize(e);
  EXPECT_TRUE(device->completed(p));
  // What the host saw complete orders every stream.
  EXPECT_TRUE(device->orderedBefore(p, Stream::Comm));
  device->record(g, Stream::Comm);
  EXPECT_EQ(device->lastRecord(g).tick, 1u);
}

TEST_P(DeviceTest, FailedKernelIsReportedWithItsName) {
  device->allocateArena(256, 256);
  EXPECT_RT_ERROR(
      {
        device->launch(Stream::Compute, "L3.gdn_core_attn/fwd",
                       [](const ap::kernels::KernelContext &) {
                         return ap::kernels::Status::InvalidArgument;
                       });
        device->synchronize();
      },
      "kernel 'L3.gdn_core_attn/fwd' returned InvalidArgument");
  // Reported once, then the device is usable again.
  device->synchronize();
  EXPECT_EQ(rangeDepth(), 0);
}

TEST_P(DeviceTest, LaunchPassesTheContextInStreamOrder) {
  device->allocateArena(1 << 20, 4096);
  auto seen = std::make_shared<ap::kernels::KernelContext>();
  char *buf = static_cast<char *>(device->at(0, 1 << 20));
  device->memsetAsync(buf, 0x5a, 1 << 20, Stream::Compute);
  device->launch(Stream::Compute, "probe",
                 [seen](const ap::kernels::KernelContext &ctx) {
                   *seen = ctx;
                   return ap::kernels::Status::Ok;
                 });
  device->synchronize();
  EXPECT_EQ(seen->workspace, device->workspace());
  EXPECT_EQ(seen->workspaceBytes, 4096u);
  EXPECT_EQ(seen->stream, device->kernelContext(Stream::Compute).stream);
  EXPECT_EQ(rangeDepth(), 0);
}

TEST_P(DeviceTest, NullCopiesAndUnknownEventsAreErrors) {
  EXPECT_RT_ERROR(device->copyAsync(nullptr, this, 8, CopyKind::HostToHost,
                                    Stream::Compute),
                  "null pointer");
  EXPECT_RT_ERROR(device->record(static_cast<EventId>(42), Stream::Compute),
                  "unknown event 42");
}

AP_RT_INSTANTIATE_BACKENDS(DeviceTest);

TEST(DeviceSelection, CudaRequestWithoutAGpuIsAnError) {
  DeviceOptions options;
  options.device = DeviceKind::Cuda;
  options.quiet = true;
  if (cudaUsable()) {
    Device dev(options);
    EXPECT_EQ(dev.kind(), DeviceKind::Cuda);
    EXPECT_TRUE(dev.notice().empty());
  } else {
    EXPECT_RT_ERROR(Device dev(options), "--device cuda: no usable GPU (");
    EXPECT_RT_ERROR(Device dev(options), "--device auto to fall back");
  }
}

TEST(DeviceSelection, AutoPicksCudaOnlyWhenUsableAndSaysWhenItFallsBack) {
  DeviceOptions options;
  options.quiet = true;
  Device dev(options);
  EXPECT_EQ(dev.kind(), cudaUsable() ? DeviceKind::Cuda : DeviceKind::Host);
  EXPECT_FALSE(dev.description().empty());
  EXPECT_FALSE(dev.deviceName().empty());
  if (cudaUsable()) {
    EXPECT_TRUE(dev.notice().empty());
  } else {
    EXPECT_EQ(dev.deviceName(), "CPU");
    EXPECT_NE(dev.notice().find("--device auto: no usable GPU ("),
              std::string::npos)
        << dev.notice();
    EXPECT_NE(dev.notice().find("falling back to the host backend"),
              std::string::npos);
  }
}

TEST(DeviceSelection, HostRequestNeverTouchesCuda) {
  DeviceOptions options;
  options.device = DeviceKind::Host;
  Device dev(options);
  EXPECT_EQ(dev.kind(), DeviceKind::Host);
  EXPECT_TRUE(dev.notice().empty());
}

TEST(DeviceSelection, MissingCudaDeviceSaysWhy) {
  std::string why;
  EXPECT_EQ(createCudaBackend(1000, &why), nullptr);
  EXPECT_FALSE(why.empty());
}

TEST(DeviceSelection, NamesParse) {
  EXPECT_EQ(parseDeviceKind("cuda"), DeviceKind::Cuda);
  EXPECT_EQ(parseDeviceKind("host"), DeviceKind::Host);
  EXPECT_EQ(parseDeviceKind("gpu"), std::nullopt);
  EXPECT_STREQ(streamName(Stream::D2H), "d2h");
  EXPECT_STREQ(streamName(Stream::Side), "side");
  EXPECT_EQ(static_cast<int>(Stream::Side), 4); // ap::exec::Stream::Side
  EXPECT_EQ(kNumStreams, 5);
  EXPECT_STREQ(deviceKindName(DeviceKind::Cuda), "cuda");
}

TEST(Nvtx, RangesBalanceAndUnderflowIsAnError) {
  EXPECT_EQ(rangeDepth(), 0);
  {
    ScopedRange outer("L0.attn_norm");
    rangePush("inner");
    EXPECT_EQ(rangeDepth(), 2);
    rangePop();
  }
  EXPECT_EQ(rangeDepth(), 0);
  EXPECT_RT_ERROR(rangePop(), "without a matching rangePush");
#if defined(ACTPLACE_HAVE_NVTX)
  EXPECT_TRUE(rangesReachNvtx());
#endif
}

} // namespace
