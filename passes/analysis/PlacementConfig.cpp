//===- PlacementConfig.cpp - the placement options, validated -------------===//

#include "passes/analysis/PlacementConfig.h"

#include "dialect/train/ModuleNames.h"

#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace ap::train;

LogicalResult
PlacementConfig::validate(function_ref<InFlightDiagnostic()> emitError) {
  offloadLeaves.clear();
  recomputeLeaves.clear();
  auto expand = [&](const std::vector<std::string> &names, StringRef option,
                    std::set<std::string> &out) -> LogicalResult {
    for (const std::string &name : names) {
      SmallVector<StringRef> leaves;
      if (!expandModuleName(name, leaves))
        return emitError() << option << ": unknown module '" << name
                           << "'; expected one of "
                           << knownModuleNamesForDiagnostics();
      for (StringRef leaf : leaves)
        out.insert(leaf.str());
    }
    return success();
  };
  if (failed(expand(offloadModules, "offload-modules", offloadLeaves)) ||
      failed(expand(recomputeModules, "recompute-modules", recomputeLeaves)))
    return failure();
  if (!(fraction >= 0.0 && fraction <= 1.0))
    return emitError() << "fraction must be in [0, 1], got " << fraction;
  if (minOffloadBytes < 0)
    return emitError() << "min-offload-bytes must be >= 0, got "
                       << minOffloadBytes;
  if (maxInflight < 0)
    return emitError() << "max-inflight must be >= 0 (0 = no limit), got "
                       << maxInflight;
  if (dataParallelSize < 1)
    return emitError() << "data-parallel-size must be >= 1 (ranks), got "
                       << dataParallelSize;
  if (gradBucketBytes < 0)
    return emitError() << "grad-bucket-bytes must be >= 0 (0 = one bucket "
                          "per grad), got "
                       << gradBucketBytes;
  if (gatherMaxInflight < 0)
    return emitError() << "gather-max-inflight must be >= 0 (0 = each "
                          "window gathered right before it), got "
                       << gatherMaxInflight;
  if (mainGradDtype == MainGradDtype::BF16 &&
      dataParallel != DataParallelMode::Zero3)
    return emitError() << "main-grad-dtype=bf16 needs data-parallel=zero3 "
                          "(replicated ranks keep f32 main grads)";
  if (prefetchDepth < 0)
    return emitError() << "prefetch-depth must be >= 0 (0 = cost model), got "
                       << prefetchDepth;
  if (offloading() && computeDtype != ComputeDtype::BF16)
    return emitError() << "offload requires compute-dtype=bf16, got '"
                       << computeDtypeName(computeDtype)
                       << "' (placement bit-identity is only established for "
                          "BF16 compute)";
  if (offloading() && cudaGraphs)
    return emitError() << "cuda-graphs=true cannot be combined with offload: "
                          "the copies' pinned slots and events are not "
                          "capturable yet";
  for (const std::string &leaf : offloadLeaves)
    if (recomputeLeaves.count(leaf))
      return emitError() << "module '" << leaf
                         << "' is both offloaded and recomputed; choose one "
                            "(offload-modules and recompute-modules overlap)";
  return success();
}

FailureOr<CostModel> PlacementConfig::costModel(Operation *diagnosticOp) const {
  return CostModel::fromProfile(profile, diagnosticOp);
}

bool PlacementConfig::isRecomputed(Operation *op) const {
  Scope scope = Scope::of(op);
  if (recomputeLeaves.count(scope.leaf))
    return true;
  if (auto l2 = dyn_cast<L2NormOp>(op))
    if (recomputeLeaves.count("gdn_prep")) {
      Operation *src = l2.getInput().getDefiningOp();
      return src && Scope::of(src).leaf == "gdn_prep";
    }
  return false;
}

namespace {
thread_local bool unrecorded = false;
} // namespace

UnrecordedPlacements::UnrecordedPlacements() : before(unrecorded) {
  unrecorded = true;
}
UnrecordedPlacements::~UnrecordedPlacements() { unrecorded = before; }
bool UnrecordedPlacements::recording() { return !unrecorded; }

void ap::train::recordPlacement(Operation *op, unsigned index,
                                StringRef decision) {
  if (unrecorded)
    return;
  MLIRContext *ctx = op->getContext();
  SmallVector<Attribute> entries(op->getNumResults(), StringAttr::get(ctx));
  if (auto old = op->getAttrOfType<ArrayAttr>(kPlacementAttrName))
    for (auto [i, a] : llvm::enumerate(old.getValue()))
      if (i < entries.size())
        entries[i] = a;
  entries[index] = StringAttr::get(ctx, decision);
  op->setAttr(kPlacementAttrName, ArrayAttr::get(ctx, entries));
}
