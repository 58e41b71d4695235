//===- PrintSummary.cpp - train-print-summary -----------------------------===//

#include "passes/Passes.h"
#include "passes/analysis/GraphSummary.h"

#include "llvm/Support/raw_ostream.h"

namespace ap {
#define GEN_PASS_DEF_TRAINPRINTSUMMARY
#include "passes/train/TrainPasses.h.inc"
} // namespace ap

namespace {
struct TrainPrintSummaryPass
    : ap::impl::TrainPrintSummaryBase<TrainPrintSummaryPass> {
  using Base::Base;

  void runOnOperation() override {
    ap::train::GraphSummary summary(getOperation());
    summary.print(toStderr ? llvm::errs() : llvm::outs());
    markAllAnalysesPreserved();
  }
};
} // namespace
