//===- streams_tsan_test.cpp - Streams under TSan ---------------*- C++ -*-===//
//
// Built twice: as a normal test and against a -fsanitize=thread build of the
// runtime's host sources. The host backend's streams are real threads, so
// these tests are only race-free if events really order the work: each test
// hands plain (non-atomic) memory from one stream's task to another's
// through an event, and TSan reports a race if the event did not establish
// happens-before.
//
//===----------------------------------------------------------------------===//
#include "runtime/device.h"
#include "runtime/offload.h"
#include "runtime/pinned_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

using namespace ap::rt;

namespace {

std::unique_ptr<Device> hostDevice() {
  DeviceOptions options;
  options.device = DeviceKind::Host;
  return std::make_unique<Device>(options);
}

// Tasks on different streams hand a plain buffer around a ring of all five
// streams; each reads what the previous one wrote and writes its own value.
TEST(HostStreams, EventsHandOffPlainMemoryAroundAllStreams) {
  auto dev = hostDevice();
  std::vector<uint64_t> buf(4096, 0);
  const Stream ring[kNumStreams] = {Stream::Compute, Stream::D2H, Stream::H2D,
                                    Stream::Comm, Stream::Side};
  std::vector<EventId> events;
  for (int i = 0; i < kNumStreams; ++i)
    events.push_back(dev->createEvent());
  std::atomic<int> mismatches{0};
  uint64_t expect = 0;
  for (int round = 0; round < 200; ++round) {
    for (int k = 0; k < kNumStreams; ++k) {
      Stream s = ring[k];
      if (round + k > 0)
        dev->wait(s, events[(k + kNumStreams - 1) % kNumStreams]);
      uint64_t before = expect, after = expect + 1;
      dev->hostCallback(s, [&buf, &mismatches, before, after] {
        for (uint64_t &v : buf) {
          if (v != before)
            mismatches.fetch_add(1, std::memory_order_relaxed);
          v = after;
        }
      });
      dev->record(events[k], s);
      expect = after;
    }
  }
  dev->synchronize();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(buf[0], expect); // read after synchronize(): ordered too
}

// Streams really run at the same time: a task on compute can only finish
// once a task on d2h ran, so a serialising backend would time out here.
TEST(HostStreams, StreamsRunConcurrently) {
  auto dev = hostDevice();
  std::mutex m;
  std::condition_variable cv;
  bool d2hRan = false;
  std::atomic<bool> sawIt{false};
  dev->hostCallback(Stream::Compute, [&] {
    std::unique_lock<std::mutex> lock(m);
    sawIt = cv.wait_for(lock, std::chrono::seconds(20), [&] { return d2hRan; });
  });
  dev->hostCallback(Stream::D2H, [&] {
    std::lock_guard<std::mutex> lock(m);
    d2hRan = true;
    cv.notify_all();
  });
  dev->synchronize();
  EXPECT_TRUE(sawIt.load());
}

// --op-times timers: workers on all five streams write their marks while
// the host thread keeps creating timers (the table grows under them); the
// host reads every span after a synchronisation. Race-free only if the
// table's lock covers both.
TEST(HostStreams, TimersMarkedByWorkersWhileTheTableGrows) {
  auto dev = hostDevice();
  Backend &b = dev->backend();
  std::vector<std::pair<uint32_t, uint32_t>> spans;
  for (int round = 0; round < 200; ++round) {
    auto stream = static_cast<Stream>(round % kNumStreams);
    uint32_t start = b.createTimer();
    b.recordTimer(start, stream);
    dev->hostCallback(stream, [] {});
    uint32_t end = b.createTimer();
    b.recordTimer(end, stream);
    spans.emplace_back(start, end);
  }
  dev->synchronize();
  for (auto [start, end] : spans)
    EXPECT_GE(b.timerSeconds(start, end), 0.0);
}

// Copies are tasks too: a D2H reading device memory that a compute-stream
// kernel wrote, ordered by an event, in many small rounds.
TEST(HostStreams, KernelThenCopyOrderedByEvent) {
  auto dev = hostDevice();
  const size_t n = 1 << 16;
  dev->allocateArena(n * sizeof(float));
  auto *x = static_cast<float *>(dev->at(0, n * sizeof(float)));
  std::vector<float> host(n);
  EventId written = dev->createEvent(), copied = dev->createEvent();
  for (int round = 0; round < 50; ++round) {
    dev->wait(Stream::Compute, copied); // WAR: the previous copy read x
    dev->launch(Stream::Compute, "fill",
                [x, n, round](const ap::kernels::KernelContext &) {
                  for (size_t i = 0; i < n; ++i)
                    x[i] = float(round) + float(i) * 0.5f;
                  return ap::kernels::Status::Ok;
                });
    dev->record(written, Stream::Compute);
    dev->wait(Stream::D2H, written);
    dev->copyAsync(host.data(), x, n * sizeof(float), CopyKind::DeviceToHost,
                   Stream::D2H);
    dev->record(copied, Stream::D2H);
    dev->synchronize(copied);
    ASSERT_EQ(host[7], float(round) + 3.5f);
    ASSERT_EQ(host[n - 1], float(round) + float(n - 1) * 0.5f);
  }
}

// The offload engine end to end with many slots and microbatches, no host
// synchronisation inside the step: pinned memory written by the d2h thread
// and read by the h2d thread, device memory reused by compute.
TEST(HostStreams, OffloadEngineRoundTripsWithoutRaces) {
  auto dev = hostDevice();
  constexpr int kValues = 8;
  constexpr size_t kBytes = 64 * 1024;
  dev->allocateArena(kValues * kBytes);
  PinnedLayout layout;
  layout.totalBytes = kValues * kBytes;
  for (int i = 0; i < kValues; ++i)
    layout.slots.push_back({i * kBytes, kBytes});
  PinnedPool pool(*dev, layout);
  OffloadEngine engine(*dev, pool);
  std::vector<EventId> produced, d2h, h2d;
  std::vector<OffloadEngine::ScopeId> scopes;
  for (int i = 0; i < kValues; ++i) {
    produced.push_back(dev->createEvent());
    d2h.push_back(dev->createEvent());
    h2d.push_back(dev->createEvent());
    scopes.push_back(engine.scope("L" + std::to_string(i) + ".gdn_core_attn"));
  }
  EventId clobbered = dev->createEvent();
  std::atomic<int> bad{0};
  for (int step = 0; step < 3; ++step) {
    for (int mb = 0; mb < 4; ++mb) {
      int tag = step * 16 + mb;
      for (int i = 0; i < kValues; ++i) {
        auto *v = static_cast<uint32_t *>(dev->at(i * kBytes, kBytes));
        dev->launch(Stream::Compute, "produce",
                    [v, i, tag](const ap::kernels::KernelContext &) {
                      for (size_t k = 0; k < kBytes / 4; ++k)
                        v[k] = uint32_t(tag * 1000003 + i * 7919 + k);
                      return ap::kernels::Status::Ok;
                    });
        dev->record(produced[i], Stream::Compute);
        engine.offload(scopes[i], i, v, kBytes, produced[i], d2h[i]);
      }
      for (int i = 0; i < kValues; ++i) { // reuse of the device memory
        auto *v = static_cast<uint32_t *>(dev->at(i * kBytes, kBytes));
        dev->wait(Stream::Compute, d2h[i]);
        dev->memsetAsync(v, 0, kBytes, Stream::Compute);
      }
      // The reloads overwrite that memory: the h2d stream must wait for its
      // last user (the schedule's job, not the engine's).
      dev->record(clobbered, Stream::Compute);
      dev->wait(Stream::H2D, clobbered);
      for (int i = kValues - 1; i >= 0; --i) {
        auto *v = static_cast<uint32_t *>(dev->at(i * kBytes, kBytes));
        engine.reload(scopes[i], i, v, kBytes, d2h[i], h2d[i]);
        dev->wait(Stream::Compute, h2d[i]);
        dev->launch(Stream::Compute, "consume",
                    [v, i, tag, &bad](const ap::kernels::KernelContext &) {
                      for (size_t k = 0; k < kBytes / 4; ++k)
                        if (v[k] != uint32_t(tag * 1000003 + i * 7919 + k)) {
                          bad.fetch_add(1);
                          break;
                        }
                      return ap::kernels::Status::Ok;
                    });
      }
    }
    dev->synchronize();
    pool.assertNoneInUse("step " + std::to_string(step));
    (void)pool.stats();
  }
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(engine.counters("L3.gdn_core_attn").d2hCount, 12u);
  EXPECT_EQ(engine.counters("L3.gdn_core_attn").h2dBytes, 12u * kBytes);
}

// Device teardown with work still queued drains it first.
TEST(HostStreams, ShutdownDrainsQueuedWork) {
  auto counter = std::make_shared<std::atomic<int>>(0);
  {
    auto dev = hostDevice();
    for (int i = 0; i < 100; ++i)
      dev->hostCallback(static_cast<Stream>(i % kNumStreams), [counter] {
        std::this_thread::sleep_for(std::chrono::microseconds(10));
        counter->fetch_add(1);
      });
  }
  EXPECT_EQ(counter->load(), 100);
}

} // namespace

#if defined(__SANITIZE_THREAD__)
#include <sys/wait.h>
#include <unistd.h>

namespace {
/// The racy schedule: a compute-stream "kernel" writes a buffer and a reload
/// overwrites it on the h2d stream without waiting for it.
void racyReload() {
  auto dev = hostDevice();
  dev->allocateArena(16 << 12);
  std::vector<uint8_t> host(1 << 12, 7);
  for (int round = 0; round < 16; ++round) {
    auto *v = static_cast<uint64_t *>(dev->at(round << 12, 1 << 12));
    dev->launch(Stream::Compute, "write",
                [v](const ap::kernels::KernelContext &) {
                  for (int k = 0; k < 512; ++k)
                    v[k] = uint64_t(k);
                  return ap::kernels::Status::Ok;
                });
    // Missing: dev->wait(Stream::H2D, <event recorded after the write>).
    dev->copyAsync(v, host.data(), 1 << 12, CopyKind::HostToDevice,
                   Stream::H2D);
  }
  dev->synchronize();
}

// The point of the host backend: without the wait the two streams really
// race and ThreadSanitizer reports it (TSan build only). TSan detection is
// not certain for every single run (about 1 in 100 runs saw none here), so
// the racy schedule runs in up to five child processes and one report is
// required. Named *DeathTest so gtest runs it first, while the process has
// one thread and fork() is safe under TSan.
TEST(HostStreamsDeathTest, MissingWaitIsReportedAsADataRace) {
  bool reported = false;
  for (int attempt = 0; attempt < 5 && !reported; ++attempt) {
    std::fprintf(
        stderr, "[ expected ] a ThreadSanitizer data race report may follow\n");
    std::fflush(nullptr); // the child exits through exit(): no doubled output
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      racyReload();
      // exit(), not _exit(): TSan turns a reported race into exit code 66
      // at exit when halt_on_error is off.
      std::exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    // TSan's exitcode (66): at the report with halt_on_error=1 (as ctest
    // sets it), else at exit.
    reported = WIFEXITED(status) && WEXITSTATUS(status) == 66;
  }
  EXPECT_TRUE(reported) << "a missing wait went unnoticed by ThreadSanitizer";
}
} // namespace
#endif
