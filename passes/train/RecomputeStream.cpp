//===- RecomputeStream.cpp - train-recompute-stream -----------------------===//
//
// Moves recompute onto the side stream, ahead of its use, beside kernels
// that leave SMs idle. train-recompute puts each clone right before its
// first backward use, where it runs on the compute stream and adds its full
// time to the step. Some backward kernels keep only a fraction of the GPU
// busy: the GDN chunk backward's sequential state passes run about 32 CTAs
// on a 132-SM H200 at one sequence. A GEMM issued on a second stream
// while they run, asked to use part of the SMs, finishes there almost for
// free (bench/notes/runtime.md, "Side-stream recompute").
//
// A run of consecutive clones is the recompute of one first use (a conv
// and its L2 norms, the two projections of an MLP input). The run moves,
// as a whole and in order, to right before the nearest earlier backward op
// with side capacity (CostModel::sideCapacity > 0). Its GEMMs and what
// reads their results are marked `train.side_stream`; the rest (the norm
// that feeds the projections) stays on the compute stream, only earlier. The
// clones keep their inputs and kernels, so the bits are those of recompute on
// the compute stream. The exec lowering puts marked kernels on the side stream;
// the stream schedule orders them after their inputs' writers and the first use
// after them.
//
// The price is memory: the recomputed values live from the earlier op to
// their use (about one layer longer); the memory timeline counts it.
//
//===----------------------------------------------------------------------===//

#include "dialect/train/TrainOps.h"
#include "passes/Passes.h"
#include "passes/analysis/PlacementConfig.h"
#include "passes/analysis/SavedActivations.h"

#include "mlir/IR/Remarks.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallPtrSet.h"

namespace ap {
#define GEN_PASS_DEF_TRAINRECOMPUTESTREAM
#include "passes/train/TrainPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::train;

namespace {

/// Ops that lower to one kernel call on their own stream: the ones the side
/// stream can take. Views (reshape) go along with their run. Data movement
/// (slice, concat, expand) and ops that stage operands in the driver's
/// scratch (the gates, the chunk forward's beta) are issued by the runner
/// on the compute stream (codegen/EmitCpp.cpp refuses them on the side
/// stream), so a run that contains one stays there.
bool sideStreamCapable(Operation *op) {
  return !isa<SliceOp, ConcatOp, ExpandOp, GDNGatesOp, GatedDeltaRuleOp>(op);
}

struct TrainRecomputeStreamPass
    : ap::impl::TrainRecomputeStreamBase<TrainRecomputeStreamPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    PlacementConfig cfg = AP_PLACEMENT_CONFIG();
    if (failed(cfg.validate([&] { return module.emitError(); })))
      return signalPassFailure();
    if (cfg.recomputeStream != RecomputeStream::Side)
      return markAllAnalysesPreserved();
    FailureOr<CostModel> cost = cfg.costModel(module);
    if (failed(cost))
      return signalPassFailure();
    SavedActivations saved = SavedActivations::orderOnly(module);
    if (!saved.valid())
      return signalPassFailure();

    Block *body = saved.getBody();
    SmallVector<Operation *> order;
    for (Operation &op : *body)
      order.push_back(&op);
    DenseMap<Operation *, int64_t> pos;
    for (auto [i, op] : llvm::enumerate(order))
      pos[op] = int64_t(i);
    // The first backward op: clones sit after it; anchors may not precede
    // it (a forward op's idle SMs are not the backward's).
    int64_t bwdStart = int64_t(order.size());
    for (auto [i, op] : llvm::enumerate(order))
      if (!op->hasAttr(kRecomputedAttrName) &&
          saved.indexOf(op) >= saved.backwardStart()) {
        bwdStart = int64_t(i);
        break;
      }

    // Runs of consecutive clones in the backward, in program order.
    SmallVector<SmallVector<Operation *>> runs;
    for (int64_t i = bwdStart; i < int64_t(order.size()); ++i) {
      if (!order[i]->hasAttr(kRecomputedAttrName))
        continue;
      if (i == 0 || !order[i - 1]->hasAttr(kRecomputedAttrName) || runs.empty())
        runs.emplace_back();
      runs.back().push_back(order[i]);
    }

    int moved = 0, stayed = 0;
    for (SmallVector<Operation *> &run : runs) {
      if (!llvm::all_of(run, sideStreamCapable)) {
        ++stayed;
        continue;
      }
      // The nearest earlier backward op with side capacity.
      Operation *anchor = nullptr;
      for (int64_t i = pos[run.front()] - 1; i >= bwdStart; --i)
        if (!order[i]->hasAttr(kRecomputedAttrName) &&
            cost->sideCapacity(order[i]) > 0) {
          anchor = order[i];
          break;
        }
      // Every operand from outside the run must be defined before the
      // anchor (forward values are; a reload issued later is not).
      auto availableAt = [&](Value v, int64_t at) {
        Operation *def = v.getDefiningOp();
        if (!def || def->getBlock() != body)
          return true;
        return llvm::is_contained(run, def) || pos[def] < at;
      };
      if (!anchor || !llvm::all_of(run, [&](Operation *op) {
            return llvm::all_of(op->getOperands(), [&](Value v) {
              return availableAt(v, pos[anchor]);
            });
          })) {
        ++stayed;
        continue;
      }
      // GEMMs, and what reads their results, go to the side stream; the
      // rest of the run (a norm feeding the projections) moves along on
      // the compute stream, where a memory-bound kernel costs its few
      // microseconds. On the side stream such kernels would take SM slots
      // next to the host's CTAs (they ask for no SM target). A choice of
      // least interference, not a measured gain: the 60 % placement
      // measured the same step time within noise either way
      // (bench/notes/training.md).
      OpBuilder b(module.getContext());
      anchor->setAttr(kSideHostAttrName, b.getUnitAttr());
      llvm::SmallPtrSet<Operation *, 8> onSide;
      for (Operation *op : run) {
        bool side =
            isa<LinearOp>(op) || llvm::any_of(op->getOperands(), [&](Value v) {
              return onSide.contains(v.getDefiningOp());
            });
        op->moveBefore(anchor);
        if (side) {
          onSide.insert(op);
          op->setAttr(kSideStreamAttrName, b.getUnitAttr());
        }
        // Now before the anchor: later runs, whose anchors are not earlier,
        // may read it.
        pos[op] = pos[anchor] - 1;
      }
      ++moved;
      Scope scope = Scope::of(run.front());
      remark::passed(run.front()->getLoc(),
                     remark::RemarkOpts::name("recompute-stream")
                         .category("actplace-placement")
                         .subCategory(scope.str()))
          << ("recompute of " + scope.str() + " (" +
              std::to_string(run.size()) + " ops, " +
              std::to_string(onSide.size()) +
              " on the side stream) issued before " +
              anchor->getName().getStringRef() + " of " +
              Scope::of(anchor).str())
                 .str();
    }
    if (!runs.empty())
      remark::analysis(module.getLoc(),
                       remark::RemarkOpts::name("recompute-stream")
                           .category("actplace-placement"))
          << (std::to_string(moved) + " of " + std::to_string(runs.size()) +
              " recompute runs on the side stream, " + std::to_string(stayed) +
              " on the compute stream");
  }
};
} // namespace
