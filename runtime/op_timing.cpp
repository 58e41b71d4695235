//===- op_timing.cpp - --op-times and --op-timeline -------------*- C++ -*-===//
//
// See op_timing.h. The StepRunner members that time launches (launchOn,
// waitCopy, collectOpTimes) and the files the two flags write.
//
//===----------------------------------------------------------------------===//
#include "runtime/op_timing.h"
#include "runtime/json.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

namespace ap::rt {

using kernels::KernelContext;
using kernels::Status;

void StepRunner::launchOn(Stream stream, const char *name, KernelFn fn) {
  // Only these two streams have a kernel workspace.
  if (stream != Stream::Compute && stream != Stream::Side)
    fail("kernel '", name ? name : "?", "' launched on the ",
         streamName(stream), " stream (kernels run on compute or side)");
  if (!opTimes) {
    dev.launch(stream, name, std::move(fn));
    return;
  }
  if (opTimesInStream) {
    // Nothing waits: the kernel runs back to back with its neighbours, as
    // in an untimed step, and the timers read its span on the stream.
    size_t used = 2 * pendingOpTimes_.size();
    while (timers_.size() < used + 2)
      timers_.push_back(dev.backend().createTimer());
    PendingOpTime p{name, timers_[used], timers_[used + 1], stream};
    dev.backend().recordTimer(p.start, stream);
    dev.launch(stream, name, std::move(fn));
    dev.backend().recordTimer(p.end, stream);
    pendingOpTimes_.push_back(std::move(p));
    return;
  }
  // Everything enqueued before on the stream is done, so the wait below
  // covers this kernel alone (plus one empty wait, subtracted).
  dev.synchronize(stream);
  auto t0 = std::chrono::steady_clock::now();
  dev.launch(stream, name, std::move(fn));
  dev.synchronize(stream);
  double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  OpTime &t = (*opTimes)[name];
  t.count += 1;
  t.seconds += std::max(0.0, s - syncSeconds);
}

void StepRunner::waitCopy(const char *name, EventId event) {
  // Wait mode synchronises around every launch, so copies have all the time
  // they need there: only the stream mode measures stalls.
  if (!opTimes || !opTimesInStream) {
    dev.wait(Stream::Compute, event);
    return;
  }
  size_t used = 2 * pendingOpTimes_.size();
  while (timers_.size() < used + 2)
    timers_.push_back(dev.backend().createTimer());
  PendingOpTime p{name, timers_[used], timers_[used + 1], Stream::Compute};
  dev.backend().recordTimer(p.start, Stream::Compute);
  dev.wait(Stream::Compute, event);
  dev.backend().recordTimer(p.end, Stream::Compute);
  pendingOpTimes_.push_back(std::move(p));
}

void StepRunner::collectOpTimes() {
  for (const PendingOpTime &p : pendingOpTimes_) {
    OpTime &t = (*opTimes)[p.name];
    t.count += 1;
    t.seconds += dev.backend().timerSeconds(p.start, p.end);
  }
  if (timeline && opTimesInStream) {
    // Spans against one timer, so launches on different streams share a
    // time axis; shifted so that the earliest starts at 0.
    timeline->clear();
    double earliest = 0;
    uint32_t origin =
        pendingOpTimes_.empty() ? 0 : pendingOpTimes_.front().start;
    for (const PendingOpTime &p : pendingOpTimes_) {
      double start = dev.backend().timerSeconds(origin, p.start);
      timeline->push_back({p.name, p.stream, start,
                           start + dev.backend().timerSeconds(p.start, p.end)});
      earliest = std::min(earliest, start);
    }
    for (TimelineEntry &e : *timeline) {
      e.startS -= earliest;
      e.endS -= earliest;
    }
    std::stable_sort(timeline->begin(), timeline->end(),
                     [](const TimelineEntry &a, const TimelineEntry &b) {
                       return a.startS < b.startS;
                     });
  }
  pendingOpTimes_.clear();
}

namespace {

/// Writes `text` to `path`; a failure names the flag that asked for it.
void writeWholeFile(const std::string &path, const std::string &text,
                    const char *flag) {
  std::FILE *f = std::fopen(path.c_str(), "w");
  bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f && std::fclose(f) != 0)
    ok = false;
  if (!ok)
    fail(flag, ": cannot write '", path, "'");
}

} // namespace

double emptyLaunchSeconds(Device &dev) {
  std::vector<double> samples;
  for (int i = 0; i < 51; ++i) {
    dev.synchronize(Stream::Compute);
    auto t0 = std::chrono::steady_clock::now();
    dev.launch(Stream::Compute, "empty",
               [](const KernelContext &) { return Status::Ok; });
    dev.synchronize(Stream::Compute);
    samples.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count());
  }
  std::nth_element(samples.begin(), samples.begin() + 25, samples.end());
  return samples[25];
}

void writeOpTimes(const std::string &path,
                  const std::map<std::string, StepRunner::OpTime> &times,
                  int64_t steps, double syncSeconds, const std::string &mode,
                  Device &dev) {
  Json ops = Json::object();
  for (const auto &[label, t] : times)
    ops[label] = {{"count", t.count}, {"seconds", t.seconds}};
  Json doc = {{"steps", steps},
              {"mode", mode},
              {"sync_seconds", syncSeconds},
              {"device", dev.kind() == DeviceKind::Cuda ? "cuda" : "host"},
              {"ops", ops}};
  writeWholeFile(path, dumpJson(doc, "--op-times " + path, 2) + "\n",
                 "--op-times");
}

void writeOpTimeline(const std::string &path,
                     const std::vector<StepRunner::TimelineEntry> &launches,
                     int64_t step, Device &dev) {
  // Microseconds to the nanosecond: finer digits are timer noise.
  auto us = [](double seconds) { return std::round(seconds * 1e9) / 1e3; };
  Json list = Json::array();
  for (const StepRunner::TimelineEntry &e : launches)
    list.push_back({{"label", e.name},
                    {"stream", streamName(e.stream)},
                    {"start_us", us(e.startS)},
                    {"end_us", us(e.endS)}});
  Json doc = {{"step", step},
              {"device", dev.kind() == DeviceKind::Cuda ? "cuda" : "host"},
              {"launches", list}};
  writeWholeFile(path, dumpJson(doc, "--op-timeline " + path, 2) + "\n",
                 "--op-timeline");
}

} // namespace ap::rt
