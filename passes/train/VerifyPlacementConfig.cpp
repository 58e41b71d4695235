//===- VerifyPlacementConfig.cpp - train-verify-placement-config ----------===//

#include "passes/Passes.h"
#include "passes/analysis/PlacementConfig.h"

#include "dialect/train/ModuleNames.h"

#include <set>

namespace ap {
#define GEN_PASS_DEF_TRAINVERIFYPLACEMENTCONFIG
#include "passes/train/TrainPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::train;

namespace {
struct TrainVerifyPlacementConfigPass
    : ap::impl::TrainVerifyPlacementConfigBase<TrainVerifyPlacementConfigPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    PlacementConfig cfg = AP_PLACEMENT_CONFIG();
    if (failed(cfg.validate([&] { return module.emitError(); })))
      return signalPassFailure();

    // Leaves the model has; selecting others is allowed (configs are shared
    // across models) but most likely a mistake. Not for placements that are
    // only measured (UnrecordedPlacements): the placement search lists
    // leaves of the model only, and silences warnings anyway.
    if (!UnrecordedPlacements::recording())
      return markAllAnalysesPreserved();
    std::set<std::string> present;
    module.walk([&](Operation *op) {
      if (auto scope = op->getAttrOfType<ScopeAttr>("scope"))
        present.insert(scope.getModule().str());
    });
    auto warnAbsent = [&](const std::vector<std::string> &names,
                          StringRef option) {
      for (const std::string &name : names) {
        SmallVector<StringRef> leaves;
        expandModuleName(name, leaves);
        if (llvm::none_of(leaves,
                          [&](StringRef l) { return present.count(l.str()); }))
          module.emitWarning() << option << ": module '" << name
                               << "' does not occur in this model; it "
                                  "selects nothing";
      }
    };
    warnAbsent(cfg.offloadModules, "offload-modules");
    warnAbsent(cfg.recomputeModules, "recompute-modules");
    markAllAnalysesPreserved();
  }
};
} // namespace
