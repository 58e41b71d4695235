//===- PrintSavedActivations.cpp - train-print-saved-activations ----------===//

#include "passes/Passes.h"
#include "passes/analysis/SavedActivations.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <map>

namespace ap {
#define GEN_PASS_DEF_TRAINPRINTSAVEDACTIVATIONS
#include "passes/train/TrainPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::train;

namespace {
struct TrainPrintSavedActivationsPass
    : ap::impl::TrainPrintSavedActivationsBase<TrainPrintSavedActivationsPass> {
  using Base::Base;

  void runOnOperation() override {
    SavedActivations saved(getOperation());
    if (!saved.valid())
      return signalPassFailure();
    llvm::raw_ostream &os = llvm::outs();
    os << llvm::formatv("saved activations: {0} values, {1} bytes ({2:F2} "
                        "MiB) per microbatch; backward starts at #{3}\n",
                        saved.values().size(), saved.totalBytes(),
                        saved.totalBytes() / (1024.0 * 1024.0),
                        saved.backwardStart());
    std::map<std::string, int64_t> byScope;
    for (const SavedActivation &s : saved.values()) {
      std::string what;
      if (s.producer)
        what = (s.producer->getName().getStringRef() + " result " +
                llvm::Twine(cast<OpResult>(s.value).getResultNumber()))
                   .str();
      else
        what = "block argument " +
               std::to_string(cast<BlockArgument>(s.value).getArgNumber());
      std::string needed;
      for (const Scope &n : s.neededBy)
        needed += (needed.empty() ? "" : ",") + n.str();
      os << llvm::formatv("#{0} {1} {2} {3} {4} bytes uses #{5}..#{6} "
                          "needed-by {7}\n",
                          s.defIndex, what, s.scope.str(), s.value.getType(),
                          s.bytes, s.firstUse, s.lastUse, needed);
      byScope[s.scope.str()] += s.bytes;
    }
    os << "bytes by producing scope:\n";
    for (const auto &[scope, bytes] : byScope)
      os << "  " << scope << ": " << bytes << "\n";
    markAllAnalysesPreserved();
  }
};
} // namespace
