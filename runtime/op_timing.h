//===- op_timing.h - --op-times and --op-timeline ---------------*- C++ -*-===//
//
// The per-launch timing of the training binary: StepRunner's timed launch
// paths (launchOn, waitCopy and collectOpTimes, declared in trainer.h) are
// defined in op_timing.cpp with the helpers below, which trainMain calls
// around the run loop.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_OP_TIMING_H
#define ACTPLACE_RUNTIME_OP_TIMING_H

#include "runtime/trainer.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ap::rt {

/// Median seconds of an empty launch waited for on the compute stream: what
/// --op-times subtracts from every timed launch.
double emptyLaunchSeconds(Device &dev);

/// --op-times FILE: {"steps", "mode", "sync_seconds", "device", "ops":
/// {label: {"count", "seconds"}}}, sums over the timed steps.
void writeOpTimes(const std::string &path,
                  const std::map<std::string, StepRunner::OpTime> &times,
                  int64_t steps, double syncSeconds, const std::string &mode,
                  Device &dev);

/// --op-timeline FILE: {"step", "device", "launches": [{"label", "stream",
/// "start_us", "end_us"}]}, the last timed step's launches by start.
void writeOpTimeline(const std::string &path,
                     const std::vector<StepRunner::TimelineEntry> &launches,
                     int64_t step, Device &dev);

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_OP_TIMING_H
