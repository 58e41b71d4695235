//===- PlanBudget.cpp - train-plan-budget ---------------------------------===//
//
// Chooses which leaves to recompute and which to offload for one goal
// (PlacementSearch.h) and places the module with that choice, running the
// same passes as train-placement-pipeline. The search's moves go to the log
// so a user can see why each leaf was chosen and reuse the options.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/analysis/PlacementConfig.h"
#include "passes/analysis/PlacementSearch.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/raw_ostream.h"

namespace ap {
#define GEN_PASS_DEF_TRAINPLANBUDGET
#include "passes/train/TrainPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::train;

namespace {

struct TrainPlanBudgetPass
    : ap::impl::TrainPlanBudgetBase<TrainPlanBudgetPass> {
  using Base::Base;
  void runOnOperation() override;
};

void TrainPlanBudgetPass::runOnOperation() {
  ModuleOp module = getOperation();
  PlacementConfig cfg = AP_PLACEMENT_CONFIG();
  auto goal =
      PlacementGoal::fromOptions(activationCut, memoryBudget, stepBudget);
  if (!goal) {
    module.emitError() << "train-plan-budget: "
                       << llvm::toString(goal.takeError());
    return signalPassFailure();
  }

  std::unique_ptr<llvm::ToolOutputFile> file;
  llvm::raw_ostream *log = nullptr;
  if (logFile == "-") {
    log = &llvm::errs();
  } else if (!logFile.empty()) {
    std::string err;
    file = openOutputFile(logFile, &err);
    if (!file) {
      module.emitError() << "train-plan-budget: cannot write log-file '"
                         << logFile << "': " << err;
      return signalPassFailure();
    }
    log = &file->os();
  }
  if (log)
    *log << "placement search: " << goal->str() << ", cost model "
         << (cfg.profile.empty() ? std::string("H200 defaults") : cfg.profile)
         << "\n";
  int step = 0, start = -1;
  FailureOr<PlacementSearchResult> result =
      searchPlacement(module, cfg, *goal, [&](const PlacementSearchStep &s) {
        if (!log)
          return;
        if (s.start != start) {
          start = s.start;
          step = 0;
          *log << s.descent << ":\n";
        }
        *log << llvm::formatv("  {0,2}. {1}: {2}\n", ++step, s.move,
                              s.after.summary());
      });
  if (failed(result))
    return signalPassFailure();
  const PlacementChoice &best = result->best;
  if (log) {
    *log << "chose: "
         << (best.options().empty() ? std::string("nothing placed")
                                    : best.options())
         << " (" << best.summary() << "; descent " << result->start + 1 << ", "
         << result->evaluations << " placements evaluated)\n";
    log->flush();
  }
  if (file)
    file->keep();
  if (!result->goalMet) {
    module.emitError() << "train-plan-budget: " << goal->str()
                       << " is not reachable; the best placement found "
                       << best.summary()
                       << (best.options().empty()
                               ? ""
                               : " (" + best.options() + ")");
    return signalPassFailure();
  }

  OpPassManager place(ModuleOp::getOperationName());
  addPlacementPasses(place, cfg, best.offload, best.recompute);
  if (failed(runPipeline(place, module)))
    return signalPassFailure();
}

} // namespace
