//===- ExecShardParams.cpp - exec-shard-params ----------------------------===//
//
// Applies ZeroShardPlan: shard persistent parameter buffers, gather each
// window's weights into prefix-viewed transients, zero and reduce-scatter
// each window's gradient buffers into the main-grad shards.
//
//===----------------------------------------------------------------------===//

#include "dialect/exec/ExecOps.h"
#include "passes/Passes.h"
#include "passes/analysis/ZeroShardPlan.h"

#include "llvm/ADT/DenseMap.h"

#include <functional>

namespace ap {
#define GEN_PASS_DEF_EXECSHARDPARAMS
#include "passes/exec/ExecPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::exec;

namespace {
BufferType flatBuffer(MLIRContext *ctx, Type element, int64_t elements) {
  return BufferType::get(ctx, RankedTensorType::get({elements}, element));
}

int64_t bytesOf(BufferType t) { return alignTo256(tensorBytes(t.getTensor())); }

/// A transient buffer of `ranks` shards like `shard`, flat, of `element`.
Value fullBuffer(OpBuilder &b, Location loc, Value shard, int64_t ranks,
                 Type element) {
  RankedTensorType st = cast<BufferType>(shard.getType()).getTensor();
  BufferType ft =
      flatBuffer(b.getContext(), element, st.getNumElements() * ranks);
  return BufferOp::create(b, loc, ft, IntegerAttr(), bytesOf(ft));
}

/// Rewrites the operands of the window's ops that are (views of) one of
/// `replaced`'s keys onto the key's replacement, cloning view chains right
/// before the window's first op (once per window).
void rewriteWindow(const ShardWindow &w,
                   const llvm::DenseMap<Value, Value> &replaced) {
  llvm::DenseMap<Value, Value> remapped(replaced.begin(), replaced.end());
  OpBuilder b(w.first);
  std::function<Value(Value)> remap = [&](Value v) -> Value {
    if (Value r = remapped.lookup(v))
      return r;
    auto view = v.getDefiningOp<ViewOp>();
    if (!view)
      return {};
    Value src = remap(view.getSource());
    if (!src)
      return {};
    Value r =
        ViewOp::create(b, view.getLoc(), view.getType(), src, view.getPrefix());
    remapped[v] = r;
    return r;
  };
  for (Operation *op = w.first;; op = op->getNextNode()) {
    if (!isa<ViewOp>(op))
      for (OpOperand &use : op->getOpOperands())
        if (Value r = remap(use.get()))
          use.set(r);
    if (op == w.last)
      break;
  }
}

struct ExecShardParamsPass
    : ap::impl::ExecShardParamsBase<ExecShardParamsPass> {
  using Base::Base;

  void runOnOperation() override {
    if (gatherMaxInflight < 0) {
      getOperation().emitError()
          << "exec-shard-params: gather-max-inflight "
          << int64_t(gatherMaxInflight)
          << " (expected 0 or more windows gathered ahead)";
      return signalPassFailure();
    }
    for (StepOp step : getOperation().getOps<StepOp>())
      if (failed(shard(step)))
        return signalPassFailure();
  }

  LogicalResult shard(StepOp step) {
    auto mode = step->getAttrOfType<StringAttr>(kDataParallelModeAttr);
    if (!mode || mode.getValue() != "zero3")
      return success();
    ZeroShardPlan plan(step, gatherMaxInflight);
    int64_t n = plan.ranks;
    MLIRContext *ctx = step.getContext();

    // Shards of every parameter buffer, declared where the full ones were.
    llvm::DenseMap<Value, Value> shardOf;
    bool bf16Grads = mainGradDtype == ap::train::MainGradDtype::BF16;
    for (PersistentOp p : plan.sharded) {
      RankedTensorType t = p.getType().getTensor();
      Type element = t.getElementType();
      if (bf16Grads && p.getRole() == BufferRole::MainGrad)
        element = BFloat16Type::get(ctx);
      BufferType st = flatBuffer(ctx, element,
                                 ap::zeroShardElements(t.getNumElements(), n));
      OpBuilder b(p);
      auto s = PersistentOp::create(b, p.getLoc(), st, p.getName(), p.getRole(),
                                    IntegerAttr(), bytesOf(st));
      shardOf[p.getResult()] = s.getResult();
      ++numSharded;
    }

    // Gathered weights, read through prefix views.
    for (const ShardWindow &w : plan.gathers) {
      OpBuilder b(w.gatherBefore);
      llvm::DenseMap<Value, Value> replaced;
      for (PersistentOp p : w.buffers) {
        Value shard = shardOf.lookup(p.getResult());
        Value full = fullBuffer(
            b, p.getLoc(), shard, n,
            cast<BufferType>(shard.getType()).getTensor().getElementType());
        AllGatherOp::create(b, p.getLoc(), shard, full, "dp", Stream::Comm);
        replaced[p.getResult()] =
            ViewOp::create(b, p.getLoc(), p.getType(), full, /*prefix=*/true);
        ++numGathers;
      }
      rewriteWindow(w, replaced);
    }

    // Per-window gradient buffers: zeroed before, reduce-scattered after.
    for (const ShardWindow &w : plan.reductions) {
      OpBuilder b(w.first);
      llvm::DenseMap<Value, Value> replaced;
      SmallVector<std::pair<Value, Value>> scatters;
      for (PersistentOp p : w.buffers) {
        Value shard = shardOf.lookup(p.getResult());
        // The window buffer has the kernels' f32 whatever the shard holds.
        Value full = fullBuffer(b, p.getLoc(), shard, n,
                                p.getType().getTensor().getElementType());
        ZeroOp::create(b, p.getLoc(), full, Stream::Compute);
        replaced[p.getResult()] =
            ViewOp::create(b, p.getLoc(), p.getType(), full, /*prefix=*/true);
        scatters.push_back({full, shard});
      }
      rewriteWindow(w, replaced);
      b.setInsertionPointAfter(w.last);
      for (auto [full, shard] : scatters) {
        ReduceScatterOp::create(b, w.last->getLoc(), full, shard, "dp",
                                Stream::Comm, /*accumulate=*/true);
        ++numReduceScatters;
      }
    }

    // The body's old views of full buffers are dead now (views are pure:
    // any unused one goes); step-level users (the optimizer, clipping) take
    // the shards.
    for (bool erased = true; erased;) {
      erased = false;
      step.walk([&](ViewOp v) {
        if (v->use_empty()) {
          v.erase();
          erased = true;
        }
      });
    }
    for (PersistentOp p : plan.sharded) {
      for (Operation *u : p->getUsers())
        if (u->getParentOfType<MicrobatchLoopOp>() || isa<ViewOp>(u))
          return u->emitError()
                 << "exec-shard-params: a use of parameter buffer '"
                 << p.getName() << "' (" << stringifyBufferRole(p.getRole())
                 << ") outside every window of its layer group";
      p.getResult().replaceAllUsesWith(shardOf.lookup(p.getResult()));
      p.erase();
    }
    return success();
  }
};
} // namespace
