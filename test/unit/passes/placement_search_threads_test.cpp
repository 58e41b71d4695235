//===- placement_search_threads_test.cpp - the search beside others
//--------===//
//
// Placement searches may run side by side in one MLIRContext (the micro-batch
// sizes of actplace-compile --global-batch-tokens) and share its diagnostic
// handlers. A search drops the diagnostics of the threads placing its
// candidates (a rejected candidate is skipped silently), and only those:
// another thread's error still reaches the handlers below.
//
//===----------------------------------------------------------------------===//
#include "passes/analysis/PlacementSearch.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Location.h"
#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

TEST(PlacementSearchThreads, DropsOnlyThePlacingThreadsDiagnostics) {
  mlir::MLIRContext ctx;
  std::mutex mutex;
  std::vector<std::string> seen;
  mlir::ScopedDiagnosticHandler outer(&ctx, [&](mlir::Diagnostic &d) {
    std::lock_guard<std::mutex> lock(mutex);
    seen.push_back(d.str());
    return mlir::success();
  });
  auto emit = [&](const char *text) {
    mlir::emitError(mlir::UnknownLoc::get(&ctx)) << text;
  };
  {
    mlir::ScopedDiagnosticHandler drop(&ctx, ap::train::dropPlacingDiagnostics);
    // A worker placing a candidate, and a thread that is not (another
    // search lowering its choice) at the same time.
    std::thread placing([&] {
      ap::train::PlacingThread p;
      emit("rejected candidate");
    });
    std::thread other([&] { emit("lowering failed"); });
    placing.join();
    other.join();
    // This thread: placing (nested marks end where they began), then not.
    {
      ap::train::PlacingThread p;
      std::optional<ap::train::PlacingThread> nested;
      nested.emplace();
      nested.reset();
      emit("rejected on the caller's thread");
    }
    emit("after placing");
  }
  emit("no search");
  EXPECT_EQ(seen, (std::vector<std::string>{"lowering failed", "after placing",
                                            "no search"}));
}

// A cache's placements carry the peak of one measure (the timeline's, or
// with the workspace region): a search with the other measure is refused
// before it reads the module or the cache.
TEST(PlacementSearchCache, RefusesTheOtherPeakMeasure) {
  mlir::MLIRContext ctx;
  std::vector<std::string> seen;
  mlir::ScopedDiagnosticHandler handler(&ctx, [&](mlir::Diagnostic &d) {
    seen.push_back(d.str());
    return mlir::success();
  });
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::ModuleOp::create(mlir::UnknownLoc::get(&ctx));
  ap::train::PlacementGoal goal;
  goal.kind = ap::train::PlacementGoal::Kind::MemoryBudget;
  goal.value = 1e9;
  goal.workspaceRegion = false;
  ap::train::PlacementSearchCache cache;
  cache.workspaceRegion = true;
  auto result = ap::train::searchPlacement(
      *module, ap::train::PlacementConfig(), goal, {}, &cache,
      ap::train::PlacementSearchDepth::Screen);
  EXPECT_TRUE(mlir::failed(result));
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], "placement search: a cache of placements judged with the "
                     "workspace region reused by a search without it (a "
                     "compiler bug)");
  EXPECT_TRUE(cache.placed.empty());
  EXPECT_EQ(cache.workspaceRegion, std::optional<bool>(true));
}

} // namespace
