//===- PrintMemoryTimeline.cpp - train-print-memory-timeline --------------===//
// Placeholder while the memory-timeline analysis is written: fails loudly.

#include "passes/Passes.h"

namespace ap {
#define GEN_PASS_DEF_TRAINPRINTMEMORYTIMELINE
#include "passes/Passes.h.inc"
} // namespace ap

namespace {
struct TrainPrintMemoryTimelinePass
    : ap::impl::TrainPrintMemoryTimelineBase<TrainPrintMemoryTimelinePass> {
  using Base::Base;
  void runOnOperation() override {
    getOperation().emitError() << "train-print-memory-timeline is not "
                                  "implemented yet";
    signalPassFailure();
  }
};
} // namespace
