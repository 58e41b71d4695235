//===- MemoryTimeline.cpp - device bytes live at each op of a step --------===//

#include "passes/analysis/MemoryTimeline.h"

#include "dialect/train/TrainOps.h"
#include "passes/analysis/GraphSummary.h"
#include "passes/analysis/KernelWorkspace.h"
#include "passes/analysis/SavedActivations.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

#include <algorithm>
#include <optional>

using namespace mlir;
using namespace ap::train;

namespace {

/// Index of the last body point whose op starts before `t`, and not before
/// `atLeast` (the buffer is held while the op at that index runs).
unsigned lastPointStartingBefore(const StreamSimulation &sim, double t,
                                 unsigned bodyBegin, unsigned atLeast) {
  // Ops start in non-decreasing time order.
  auto it =
      std::partition_point(sim.ops.begin(), sim.ops.end(),
                           [&](const SimulatedOp &s) { return s.start < t; });
  unsigned n = static_cast<unsigned>(it - sim.ops.begin());
  unsigned last = n == 0 ? bodyBegin : bodyBegin + n - 1;
  return std::max(last, atLeast);
}

/// The offloaded value a wait result is a device copy of.
Value throughWaits(Value v) {
  while (auto wait = v.getDefiningOp<WaitOp>()) {
    auto reload = wait.getInput().getDefiningOp<ReloadOp>();
    auto offload =
        reload ? reload.getHost().getDefiningOp<OffloadOp>() : OffloadOp();
    if (!offload)
      break;
    v = offload.getInput();
  }
  return v;
}

/// The forward value (or block argument) whose bytes `v` holds: through
/// views (unless `throughViews` is false), waits, reloads and recompute
/// clones.
Value originalOf(Value v,
                 const llvm::DenseMap<Operation *, Operation *> &clones,
                 bool throughViews = true) {
  while (Operation *def = v.getDefiningOp()) {
    if (isa<WaitOp>(def) || (throughViews && isa<ReshapeOp>(def))) {
      v = def->getOperand(0);
    } else if (auto reload = dyn_cast<ReloadOp>(def)) {
      auto offload = reload.getHost().getDefiningOp<OffloadOp>();
      if (!offload)
        break;
      v = offload.getInput();
    } else if (Operation *fwd = clones.lookup(def)) {
      v = fwd->getResult(cast<OpResult>(v).getResultNumber());
    } else {
      break;
    }
  }
  return v;
}

/// The forward output a fused recompute's backward (train-fuse-recompute)
/// rebuilds: the op of that kind, not a clone, on the same forward inputs
/// (the backward's leading operands, through waits, reloads and clones but
/// not views); null when there is none.
Value forwardOfFused(Operation *grad, Block &body,
                     const llvm::DenseMap<Operation *, Operation *> &clones) {
  StringRef name;
  unsigned inputs = 0;
  if (isa<SwiGLUGradOp>(grad))
    name = SwiGLUOp::getOperationName(), inputs = 2;
  else if (isa<RMSNormGradRebuildOp>(grad))
    name = RMSNormOp::getOperationName(), inputs = 2;
  else if (isa<GatedRMSNormGradOp>(grad))
    name = GatedRMSNormOp::getOperationName(), inputs = 3;
  else
    return Value();
  // Not through views: the forward op reads the view itself.
  SmallVector<Value> forwardInputs;
  for (Value in : grad->getOperands().take_front(inputs))
    forwardInputs.push_back(originalOf(in, clones, /*throughViews=*/false));
  // The forward op reads the first input, so it is among that value's
  // users; the earliest match in the body wins, as a scan from the top
  // would find, without scanning the body per backward (the placement
  // search measures thousands of placed bodies).
  Operation *found = nullptr;
  for (Operation *op : forwardInputs.front().getUsers())
    if (op->getBlock() == &body && op->getName().getStringRef() == name &&
        !op->hasAttr(kRecomputedAttrName) &&
        llvm::equal(op->getOperands(), forwardInputs) &&
        (!found || op->isBeforeInBlock(found)))
      found = op;
  return found ? found->getResult(0) : Value();
}

/// The microbatch loop body of `@train_step`, or null.
Block *stepBody(ModuleOp module) {
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (!step || step.getBody().empty())
    return nullptr;
  for (Operation &op : step.getBody().front())
    if (auto loop = dyn_cast<MicrobatchLoopOp>(op))
      return &loop.getBody().front();
  return nullptr;
}

/// Undoes train-fuse-recompute on an unplaced body (clones and waits
/// already replaced): the backward loses its output and each split linear
/// backward is one train.linear_grad of the forward activation again (or of
/// the forward's reshape of it), at its dx op's place. The erased ops are
/// those fusedRecomputes lists.
void unfuseRecompute(Block &body) {
  const llvm::DenseMap<Operation *, Operation *> noClones;
  for (FusedRecompute f : fusedRecomputes(body)) {
    Value forward = forwardOfFused(f.grad, body, noClones);
    if (!forward)
      continue;
    OpBuilder b(f.grad);
    auto whole = [&](LinearInputGradOp dx, LinearGradOp dw, ReshapeOp view) {
      Value input = forward;
      if (view)
        for (Operation *user : forward.getUsers())
          if (auto r = dyn_cast<ReshapeOp>(user);
              r && r.getType() == view.getType())
            input = r.getResult();
      Operation *at = dx ? dx.getOperation() : dw.getOperation();
      b.setInsertionPoint(at);
      auto l =
          LinearGradOp::create(b, at->getLoc(), dx ? dx.getType() : Type(),
                               input, dx ? dx.getWeight() : dw.getWeight(),
                               dx ? dx.getResultGrad() : dw.getResultGrad(),
                               dw ? dw.getWeightGradAttr() : nullptr,
                               dx ? dx.getScope() : dw.getScope());
      if (dx) {
        dx.getResult().replaceAllUsesWith(l.getInputGrad());
        dx.erase();
      }
      if (dw)
        dw.erase();
    };
    llvm::SetVector<Operation *> views;
    for (FusedLinear l : f.linears) {
      whole(l.dx, l.dw, l.view);
      if (l.view)
        views.insert(l.view);
    }
    for (Operation *view : views)
      view->erase();
    if (f.unpairedDx)
      whole(f.unpairedDx, LinearGradOp(), ReshapeOp());
    b.setInsertionPoint(f.grad);
    if (auto grad = dyn_cast<SwiGLUGradOp>(f.grad)) {
      auto plain = SwiGLUGradOp::create(
          b, grad.getLoc(), grad.getGateGrad().getType(),
          grad.getUpGrad().getType(), Type(), grad.getGate(), grad.getUp(),
          grad.getResultGrad(), grad.getScope());
      grad.getGateGrad().replaceAllUsesWith(plain.getGateGrad());
      grad.getUpGrad().replaceAllUsesWith(plain.getUpGrad());
    } else if (auto norm = dyn_cast<RMSNormGradRebuildOp>(f.grad)) {
      auto plain = RMSNormGradOp::create(
          b, norm.getLoc(), norm.getInputGrad().getType(), norm.getInput(),
          norm.getWeight(), norm.getRstd(), norm.getResultGrad(),
          norm.getZeroCenteredAttr(), norm.getWeightGradAttr(),
          norm.getScope());
      norm.getInputGrad().replaceAllUsesWith(plain.getInputGrad());
    } else {
      auto gated = cast<GatedRMSNormGradOp>(f.grad);
      auto plain = GatedRMSNormGradOp::create(
          b, gated.getLoc(), gated.getInputGrad().getType(),
          gated.getGateGrad().getType(), Type(), gated.getInput(),
          gated.getGate(), gated.getWeight(), gated.getRstd(),
          gated.getResultGrad(), gated.getWeightGradAttr(), gated.getScope());
      gated.getInputGrad().replaceAllUsesWith(plain.getInputGrad());
      gated.getGateGrad().replaceAllUsesWith(plain.getGateGrad());
    }
    f.grad->erase();
  }
}

void unplaceWith(Block &body,
                 const llvm::DenseMap<Operation *, Operation *> &originals) {
  for (Operation &op : body)
    if (auto wait = dyn_cast<WaitOp>(op))
      wait.getResult().replaceAllUsesWith(throughWaits(wait.getResult()));
  for (auto [clone, fwd] : originals)
    for (auto [c, f] : llvm::zip(clone->getResults(), fwd->getResults()))
      c.replaceAllUsesWith(f);
  unfuseRecompute(body);
  SmallVector<Operation *> dead;
  for (Operation &op : llvm::reverse(body))
    if (isa<WaitOp, ReloadOp, OffloadOp>(op) || originals.count(&op))
      dead.push_back(&op);
  for (Operation *op : dead)
    op->erase();
  // With the clones gone nothing hosts side-stream work, and a host's
  // SM-sparing form (CostModel, sideHostScale) is not the unplaced step's.
  for (Operation &op : body)
    op.removeDiscardableAttr(kSideHostAttrName);
}

} // namespace

llvm::DenseMap<Operation *, Operation *>
ap::train::recomputedOriginals(Block &body) {
  llvm::DenseMap<Operation *, Operation *> forwardOf;
  auto sameAttrs = [](Operation *a, Operation *b) {
    for (NamedAttribute attr : a->getAttrs()) {
      if (attr.getName() == kRecomputedAttrName ||
          attr.getName() == kSideStreamAttrName ||
          attr.getName() == kPlacementAttrName)
        continue;
      if (b->getAttr(attr.getName()) != attr.getValue())
        return false;
    }
    return true;
  };
  // A clone reads what its forward op read, or the reload of it, or the
  // clone of its producer.
  auto matches = [&](Operation *clone, Operation *fwd) {
    if (fwd->getName() != clone->getName() || fwd == clone ||
        fwd->hasAttr(kRecomputedAttrName) || !sameAttrs(clone, fwd) ||
        fwd->getNumOperands() != clone->getNumOperands())
      return false;
    for (auto [c, f] : llvm::zip(clone->getOperands(), fwd->getOperands())) {
      if (throughWaits(c) == f)
        continue;
      Operation *cp = c.getDefiningOp();
      if (!cp || forwardOf.lookup(cp) != f.getDefiningOp() ||
          cast<OpResult>(c).getResultNumber() !=
              cast<OpResult>(f).getResultNumber())
        return false;
    }
    return true;
  };
  // The forward op a clone matches reads, as its first operand, either
  // what the clone's first operand is through waits or the forward op of
  // that operand's recompute clone; so candidates are looked up by name and
  // first operand instead of scanning the body per clone (the placement
  // search measures thousands of placed bodies). Each bucket is in body
  // order and the earliest match of the (at most two) buckets wins, as a
  // scan from the top would find.
  llvm::DenseMap<Operation *, unsigned> position;
  llvm::DenseMap<std::pair<OperationName, Value>, SmallVector<Operation *, 1>>
      byFirstOperand;
  auto firstOperand = [](Operation *op) {
    return op->getNumOperands() ? op->getOperand(0) : Value();
  };
  unsigned index = 0;
  for (Operation &fwd : body) {
    position[&fwd] = index++;
    if (!fwd.hasAttr(kRecomputedAttrName))
      byFirstOperand[{fwd.getName(), firstOperand(&fwd)}].push_back(&fwd);
  }
  for (Operation &op : body) {
    if (!op.hasAttr(kRecomputedAttrName))
      continue;
    SmallVector<Value, 2> keys{Value()};
    if (Value c = firstOperand(&op)) {
      keys[0] = throughWaits(c);
      if (Operation *cp = c.getDefiningOp())
        if (Operation *f = forwardOf.lookup(cp))
          keys.push_back(f->getResult(cast<OpResult>(c).getResultNumber()));
    }
    Operation *found = nullptr;
    for (Value key : keys) {
      auto it = byFirstOperand.find({op.getName(), key});
      if (it == byFirstOperand.end())
        continue;
      for (Operation *fwd : it->second)
        if (matches(&op, fwd)) {
          if (!found || position[fwd] < position[found])
            found = fwd;
          break;
        }
    }
    if (found)
      forwardOf[&op] = found;
  }
  return forwardOf;
}

Value ap::train::rebuiltOutputOf(Operation *op) {
  if (auto grad = dyn_cast_or_null<SwiGLUGradOp>(op))
    return grad.getOutput();
  if (auto norm = dyn_cast_or_null<RMSNormGradRebuildOp>(op))
    return norm.getOutput();
  if (auto gated = dyn_cast_or_null<GatedRMSNormGradOp>(op))
    return gated.getOutput();
  return Value();
}

bool ap::train::isRebuiltActivation(Value v) {
  return v && v == rebuiltOutputOf(v.getDefiningOp());
}

SmallVector<FusedRecompute> ap::train::fusedRecomputes(Block &body) {
  SmallVector<FusedRecompute> found;
  for (Operation &op : body) {
    FusedRecompute f;
    f.grad = &op;
    f.output = rebuiltOutputOf(&op);
    if (!f.output) {
      // A SwiGLU whose down projection is frozen: the dx op is still split,
      // with no dW and no output.
      auto grad = dyn_cast<SwiGLUGradOp>(op);
      f.unpairedDx =
          grad ? grad.getResultGrad().getDefiningOp<LinearInputGradOp>()
               : LinearInputGradOp();
      if (!f.unpairedDx)
        continue;
    }
    // The dW-only linear backwards reading the output (or a reshape of it),
    // each with the dx op of the same weight and dy.
    auto addReaders = [&](Value x, ReshapeOp view) {
      for (Operation *user : x.getUsers()) {
        auto dw = dyn_cast<LinearGradOp>(user);
        if (!dw || dw.getInputGrad() || dw.getInput() != x)
          continue;
        LinearInputGradOp dx;
        for (Operation *u : dw.getResultGrad().getUsers())
          if (auto cand = dyn_cast<LinearInputGradOp>(u);
              cand && cand.getWeight() == dw.getWeight())
            dx = cand;
        f.linears.push_back({dx, dw, view});
      }
    };
    if (f.output) {
      addReaders(f.output, ReshapeOp());
      for (Operation *user : f.output.getUsers())
        if (auto view = dyn_cast<ReshapeOp>(user))
          addReaders(view.getResult(), view);
    }
    found.push_back(f);
  }
  return found;
}

void ap::train::unplace(Block &body) {
  unplaceWith(body, recomputedOriginals(body));
}

MemoryTimeline MemoryTimeline::compute(ModuleOp module, const CostModel &cost,
                                       const DataParallelOptions &dp,
                                       Detail detail) {
  MemoryTimeline tl;
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (!step || step.getBody().empty())
    return tl;

  // Constant categories.
  int64_t params = 0, grads = 0, optimizer = 0;
  for (auto param : module.getOps<ParamOp>()) {
    auto type = cast<ShapedType>(param.getType());
    params += tensorBytes(type);
    if (!param.getFrozen()) {
      grads += 4 * type.getNumElements();
      optimizer += 12 * type.getNumElements();
    }
  }

  // Program order: the function's ops with the loop replaced by its body.
  MicrobatchLoopOp loop;
  {
    size_t points = 0;
    for (Operation &op : step.getBody().front())
      points += isa<MicrobatchLoopOp>(op)
                    ? op.getRegion(0).front().getOperations().size()
                    : 1;
    tl.pts.reserve(points);
    tl.index.reserve(points);
  }
  for (Operation &op : step.getBody().front()) {
    if (auto l = dyn_cast<MicrobatchLoopOp>(op)) {
      loop = l;
      tl.bodyFirst = tl.pts.size();
      for (Operation &inner : l.getBody().front()) {
        tl.index[&inner] = tl.pts.size();
        tl.pts.push_back({&inner});
      }
      continue;
    }
    tl.index[&op] = tl.pts.size();
    tl.pts.push_back({&op});
  }
  // Zero3: this rank's shards, and the windows' gathered weights and grad
  // buffers where they are live.
  std::optional<ZeroLayout> zero;
  if (dp.zero3()) {
    zero = ZeroLayout::of(module, loop ? &loop.getBody().front() : nullptr,
                          dp.ranks, dp.gatherMaxInflight, dp.bf16MainGrads);
    params = zero->paramBytes;
    grads = zero->gradBytes;
    optimizer = zero->optimizerBytes;
  }
  for (MemoryPoint &p : tl.pts) {
    p.params = params;
    p.grads = grads;
    p.optimizer = optimizer;
    p.workspace = kernelWorkspaceBytes(p.op, kPlannedBackend);
  }
  if (zero) {
    auto hold = [&](Operation *from, Operation *to, int64_t bytes,
                    bool weights) {
      for (unsigned i = tl.index.lookup(from), e = tl.index.lookup(to); i <= e;
           ++i) {
        MemoryPoint &p = tl.pts[i];
        (weights ? p.params : p.grads) += bytes;
        (weights ? p.gatheredParams : p.gradWindows) += bytes;
      }
    };
    for (const ZeroWindow &w : zero->gathers)
      hold(w.gatherBefore, w.last, w.bytes, /*weights=*/true);
    for (const ZeroWindow &w : zero->reductions)
      hold(w.first, w.last, w.bytes, /*weights=*/false);
  }

  if (loop) {
    tl.numMicroBatches =
        cast<ShapedType>(loop.getTokens().getType()).getDimSize(0);
    Block &body = loop.getBody().front();
    tl.sim = StreamSimulation::simulate(body, cost);
    const unsigned begin = tl.bodyFirst;
    const unsigned end = begin + tl.sim.ops.size() - 1;
    // Originals and scopes only for the full timeline; the origin also
    // where heldAcrossBackwardBytes counts toward the peak.
    const bool full = detail == Detail::Full;
    const bool origins =
        full || pipelineInflight(module, tl.numMicroBatches) > 1;
    const llvm::DenseMap<Operation *, Operation *> clones =
        origins ? recomputedOriginals(body)
                : llvm::DenseMap<Operation *, Operation *>();

    // Point index of the body op that holds `user` (users may sit in
    // nested regions).
    auto useIndex = [&](Operation *user) -> int {
      Operation *anc = body.findAncestorOpInBlock(*user);
      return anc ? static_cast<int>(tl.index.lookup(anc)) : -1;
    };

    // One buffer per root value, in definition order.
    auto addBuffer = [&](Value root, unsigned first, std::string scope) {
      if (!isa<RankedTensorType>(root.getType()))
        return;
      ActivationBuffer buf;
      buf.value = root;
      buf.scope = std::move(scope);
      buf.bytes = tensorBytes(root.getType());
      buf.first = first;
      if (full) {
        // A fused recompute's output copies the forward value, as a
        // clone's result does.
        Value rebuilt = isRebuiltActivation(root)
                            ? forwardOfFused(root.getDefiningOp(), body, clones)
                            : Value();
        buf.original = rebuilt ? rebuilt : originalOf(root, clones);
      }
      if (origins) {
        if (root.getDefiningOp<ReloadOp>())
          buf.origin = ActivationBuffer::Origin::Reload;
        else if (clones.count(root.getDefiningOp()) ||
                 isRebuiltActivation(root))
          buf.origin = ActivationBuffer::Origin::Recompute;
      }
      // Walk the root and its aliases (reshape / wait results) for uses.
      unsigned lastDevice = first;
      double d2hEnd = -1;
      int offloadIdx = -1;
      SmallVector<Value> worklist{root};
      while (!worklist.empty()) {
        Value v = worklist.pop_back_val();
        for (OpOperand &use : v.getUses()) {
          Operation *user = use.getOwner();
          int idx = useIndex(user);
          if (idx < 0)
            continue;
          if (isa<OffloadOp>(user)) {
            const SimulatedCopy *copy = tl.sim.copyOf(user);
            d2hEnd = std::max(d2hEnd, copy ? copy->holdEnd : 0.0);
            offloadIdx = std::max(offloadIdx, idx);
            continue;
          }
          lastDevice = std::max(lastDevice, static_cast<unsigned>(idx));
          if (isa<ReshapeOp, WaitOp>(user) && user->getOperand(0) == v)
            worklist.push_back(user->getResult(0));
          else if (!user->getDiscardableAttr(kRecomputedAttrName))
            buf.readByStep = true;
        }
      }
      buf.last = lastDevice;
      buf.lastUse = lastDevice;
      if (offloadIdx >= 0) {
        unsigned afterCopy = lastPointStartingBefore(
            tl.sim, d2hEnd, begin,
            std::max<unsigned>(lastDevice, static_cast<unsigned>(offloadIdx)));
        buf.last = std::min(afterCopy, end);
        buf.offloaded = true;
      }
      tl.bufs.push_back(std::move(buf));
    };

    {
      size_t values = body.getNumArguments();
      for (Operation &op : body)
        values += op.getNumResults();
      tl.bufs.reserve(values);
    }
    for (BlockArgument arg : body.getArguments())
      addBuffer(arg, begin, "inputs");
    for (Operation &op : body) {
      // Views and waits alias an existing buffer; param_ref results are
      // parameters.
      if (isa<ReshapeOp, WaitOp, ParamRefOp>(op))
        continue;
      std::string scope = full ? scopeKey(&op) : std::string();
      for (Value r : op.getResults())
        addBuffer(r, tl.index.lookup(&op), scope);
    }

    // Activations that may leave the device and come back.
    if (full) {
      llvm::MapVector<Value, SmallVector<unsigned, 2>> byOriginal;
      for (auto [i, b] : llvm::enumerate(tl.bufs))
        byOriginal[b.original].push_back(i);
      for (auto &entry : byOriginal)
        if (entry.second.size() > 1)
          tl.returningGroups.push_back(std::move(entry.second));
    }

    // Difference arrays keep this linear in ops + buffers.
    SmallVector<int64_t> act(tl.pts.size() + 1, 0), host(tl.pts.size() + 1, 0);
    for (const ActivationBuffer &b : tl.bufs) {
      act[b.first] += b.bytes;
      act[b.last + 1] -= b.bytes;
    }
    // Pinned slots: from the offload to the end of the last H2D reading it.
    for (Operation &op : body) {
      auto offload = dyn_cast<OffloadOp>(op);
      if (!offload)
        continue;
      unsigned first = tl.index.lookup(&op);
      unsigned last = end;
      bool reloaded = false;
      double h2dEnd = 0;
      unsigned lastReload = first;
      for (Operation *user : offload.getHost().getUsers()) {
        if (!isa<ReloadOp>(user))
          continue;
        int idx = useIndex(user);
        if (idx < 0)
          continue;
        reloaded = true;
        lastReload = std::max(lastReload, static_cast<unsigned>(idx));
        if (const SimulatedCopy *copy = tl.sim.copyOf(user))
          h2dEnd = std::max(h2dEnd, copy->end);
      }
      if (reloaded)
        last = std::min(
            lastPointStartingBefore(tl.sim, h2dEnd, begin, lastReload), end);
      int64_t bytes = tensorBytes(offload.getInput().getType());
      host[first] += bytes;
      host[last + 1] -= bytes;
    }
    int64_t runAct = 0, runHost = 0;
    for (unsigned i = 0; i < tl.pts.size(); ++i) {
      runAct += act[i];
      runHost += host[i];
      tl.pts[i].activations = runAct;
      tl.pts[i].pinnedHost = runHost;
    }
  }

  // Peaks: the first point reaching the maximum.
  for (unsigned i = 0; i < tl.pts.size(); ++i) {
    const MemoryPoint &p = tl.pts[i];
    if (tl.peakIdx < 0 || p.total() > tl.pts[tl.peakIdx].total())
      tl.peakIdx = i;
    if (tl.actPeakIdx < 0 || p.activations > tl.pts[tl.actPeakIdx].activations)
      tl.actPeakIdx = i;
    if (tl.hostPeakIdx < 0 || p.pinnedHost > tl.pts[tl.hostPeakIdx].pinnedHost)
      tl.hostPeakIdx = i;
  }
  return tl;
}

int MemoryTimeline::indexOf(Operation *op) const {
  auto it = index.find(op);
  return it == index.end() ? -1 : static_cast<int>(it->second);
}

int64_t MemoryTimeline::heldAcrossBackwardBytes() const {
  if (bufs.empty() || pts.empty())
    return 0;
  // The first backward op of the body, as a program-order point.
  Block *body = nullptr;
  for (const MemoryPoint &p : pts)
    if (p.op && isa<MicrobatchLoopOp>(p.op->getParentOp())) {
      body = p.op->getBlock();
      break;
    }
  if (!body)
    return 0;
  std::optional<unsigned> boundary;
  for (Operation &op : *body)
    if (SavedActivations::isBackwardOp(&op)) {
      int at = indexOf(&op);
      if (at >= 0)
        boundary = unsigned(at);
      break;
    }
  if (!boundary)
    return 0;
  int64_t held = 0;
  for (const ActivationBuffer &b : bufs)
    if (b.origin == ActivationBuffer::Origin::Computed && !b.offloaded &&
        b.first < *boundary && b.lastUse >= *boundary)
      held += b.bytes;
  return held;
}

int64_t MemoryTimeline::peakBytes() const {
  return peakIdx < 0 ? 0 : pts[peakIdx].total();
}
int64_t MemoryTimeline::workspaceRegionPeakBytes() const {
  int64_t rest = 0, workspace = 0;
  for (const MemoryPoint &p : pts) {
    rest = std::max(rest, p.total() - p.workspace);
    workspace = std::max(workspace, p.workspace);
  }
  return rest + workspace;
}
Operation *MemoryTimeline::peakOp() const {
  return peakIdx < 0 ? nullptr : pts[peakIdx].op;
}
int64_t MemoryTimeline::activationPeakBytes() const {
  return actPeakIdx < 0 ? 0 : pts[actPeakIdx].activations;
}
Operation *MemoryTimeline::activationPeakOp() const {
  return actPeakIdx < 0 ? nullptr : pts[actPeakIdx].op;
}
int64_t MemoryTimeline::pinnedHostPeakBytes() const {
  return hostPeakIdx < 0 ? 0 : pts[hostPeakIdx].pinnedHost;
}

std::map<std::string, int64_t>
MemoryTimeline::activationsByScope(Operation *at) const {
  std::map<std::string, int64_t> result;
  int i = indexOf(at);
  if (i < 0)
    return result;
  for (const ActivationBuffer &b : bufs)
    if (b.first <= static_cast<unsigned>(i) &&
        static_cast<unsigned>(i) <= b.last)
      result[b.scope] += b.bytes;
  return result;
}

SmallVector<OffDeviceValue> MemoryTimeline::offDeviceAt(unsigned point) const {
  SmallVector<OffDeviceValue> result;
  for (const SmallVector<unsigned, 2> &group : returningGroups) {
    // On the device while any of its buffers holds it; off when it was
    // there before and a later buffer brings it back for the step.
    bool onDevice = false, wasThere = false, neededLater = false;
    const ActivationBuffer *next = nullptr;
    unsigned leftAfter = 0;
    for (unsigned b : group) {
      const ActivationBuffer &buf = bufs[b];
      if (buf.first <= point && point <= buf.last) {
        onDevice = true;
        break;
      }
      if (buf.last < point) {
        wasThere = true;
        leftAfter = std::max(leftAfter, buf.last);
        continue;
      }
      neededLater |= buf.readByStep;
      if (!next || buf.first < next->first)
        next = &buf;
    }
    if (onDevice || !wasThere || !neededLater)
      continue;
    const ActivationBuffer &own = bufs[group.front()];
    result.push_back({own.original, own.scope, own.bytes, next->origin,
                      leftAfter, next->first});
  }
  return result;
}

PlacementMemoryDelta
PlacementMemoryDelta::compute(ModuleOp placed, const CostModel &cost,
                              const DataParallelOptions &dp) {
  PlacementMemoryDelta d;
  d.unplacedOwner = placed.clone();
  ModuleOp unplaced = *d.unplacedOwner;

  // The clone has the same ops in the same order; pair them before unplace
  // erases the placement ops and recompute clones from it.
  SmallVector<Operation *> placedOps, unplacedOps;
  placed->walk([&](Operation *op) { placedOps.push_back(op); });
  unplaced->walk([&](Operation *op) { unplacedOps.push_back(op); });
  llvm::DenseSet<Operation *> erased;
  Block *body = stepBody(unplaced);
  llvm::DenseMap<Operation *, Operation *> originals;
  if (body) {
    originals = recomputedOriginals(*body);
    for (Operation &op : *body)
      if (isa<OffloadOp, ReloadOp, WaitOp>(op) || originals.count(&op))
        erased.insert(&op);
    for (FusedRecompute f : fusedRecomputes(*body)) {
      erased.insert(f.grad);
      if (f.unpairedDx)
        erased.insert(f.unpairedDx);
      for (FusedLinear l : f.linears) {
        if (l.dx)
          erased.insert(l.dx);
        erased.insert(l.dw);
        if (l.view)
          erased.insert(l.view);
      }
    }
  }
  for (auto [p, u] : llvm::zip_equal(placedOps, unplacedOps)) {
    if (erased.count(u))
      continue;
    d.unplacedOp[p] = u;
    for (auto [pr, ur] : llvm::zip(p->getResults(), u->getResults()))
      d.placedValueOf[ur] = pr;
    for (auto [pReg, uReg] : llvm::zip(p->getRegions(), u->getRegions()))
      for (auto [pBlock, uBlock] : llvm::zip(pReg, uReg))
        for (auto [pa, ua] :
             llvm::zip(pBlock.getArguments(), uBlock.getArguments()))
          d.placedValueOf[ua] = pa;
  }
  if (body)
    unplaceWith(*body, originals);

  d.placedTl = MemoryTimeline::compute(placed, cost, dp);
  d.unplacedTl = MemoryTimeline::compute(unplaced, cost, dp);
  d.toUnplaced.assign(d.placedTl.points().size(), -1);
  d.toPlaced.assign(d.unplacedTl.points().size(), -1);
  for (auto [i, p] : llvm::enumerate(d.placedTl.points()))
    if (Operation *u = d.unplacedOp.lookup(p.op)) {
      int j = d.unplacedTl.indexOf(u);
      d.toUnplaced[i] = j;
      if (j >= 0)
        d.toPlaced[j] = i;
    }
  return d;
}

int PlacementMemoryDelta::unplacedPointOf(unsigned placedPoint) const {
  return placedPoint < toUnplaced.size() ? toUnplaced[placedPoint] : -1;
}
int PlacementMemoryDelta::placedPointOf(unsigned unplacedPoint) const {
  return unplacedPoint < toPlaced.size() ? toPlaced[unplacedPoint] : -1;
}
Operation *PlacementMemoryDelta::unplacedOpOf(Operation *placedOp) const {
  return unplacedOp.lookup(placedOp);
}

MemoryDeltaAtPoint PlacementMemoryDelta::at(unsigned placedPoint) const {
  using Origin = ActivationBuffer::Origin;
  MemoryDeltaAtPoint r;
  ArrayRef<MemoryPoint> pts = placedTl.points(), upts = unplacedTl.points();
  if (placedPoint >= pts.size())
    return r;
  const MemoryPoint &p = pts[placedPoint];
  r.placedPoint = placedPoint;
  r.placedBytes = p.total();
  r.unplacedPoint = toUnplaced[placedPoint];

  // The unplaced step at the same op, or between the ops around a
  // placement op or recompute clone.
  MemoryPoint u;
  auto liveUnplaced = [&](const ActivationBuffer &b) {
    return b.first <= static_cast<unsigned>(r.unplacedPoint) &&
           static_cast<unsigned>(r.unplacedPoint) <= b.last;
  };
  auto liveInGap = [&](const ActivationBuffer &b) {
    return r.unplacedBefore >= 0 &&
           b.first <= static_cast<unsigned>(r.unplacedBefore) &&
           static_cast<unsigned>(r.unplacedBefore) < b.last;
  };
  bool inGap = r.unplacedPoint < 0;
  if (!inGap) {
    u = upts[r.unplacedPoint];
  } else {
    for (int i = static_cast<int>(placedPoint) - 1; i >= 0; --i)
      if (toUnplaced[i] >= 0) {
        r.unplacedBefore = toUnplaced[i];
        break;
      }
    if (r.unplacedBefore >= 0)
      u = upts[r.unplacedBefore];
    else if (!upts.empty())
      u = upts.front();
    u.workspace = 0;
    u.activations = 0;
    for (const ActivationBuffer &b : unplacedTl.buffers())
      if (liveInGap(b))
        u.activations += b.bytes;
  }
  r.unplacedBytes = u.total();

  r.offDevice = placedTl.offDeviceAt(placedPoint);
  llvm::DenseMap<Value, int64_t> offBytes;
  for (const OffDeviceValue &v : r.offDevice) {
    r.offDeviceBytes += v.bytes;
    offBytes[v.value] += v.bytes;
  }

  // Activation by activation: bytes the unplaced step holds minus bytes the
  // placed one holds, beyond what is off the device.
  llvm::MapVector<Value, int64_t> delta;
  llvm::DenseMap<Value, SmallVector<const ActivationBuffer *, 2>> holding;
  for (const ActivationBuffer &b : unplacedTl.buffers())
    if (inGap ? liveInGap(b) : liveUnplaced(b))
      if (Value key = placedValueOf.lookup(b.value))
        delta[key] += b.bytes;
  for (const ActivationBuffer &b : placedTl.buffers())
    if (b.first <= placedPoint && placedPoint <= b.last) {
      delta[b.original] -= b.bytes;
      holding[b.original].push_back(&b);
    }
  for (auto &[key, bytes] : delta) {
    int64_t other = bytes - offBytes.lookup(key);
    if (other == 0)
      continue;
    MemoryDeltaTerm t;
    t.value = key;
    t.bytes = other;
    const auto &held = holding.lookup(key);
    if (!held.empty())
      t.scope = held.front()->scope;
    if (held.size() > 1) {
      unsigned reloads = llvm::count_if(held, [](const ActivationBuffer *b) {
        return b->origin == Origin::Reload;
      });
      t.term = reloads > 1 ? "reloaded twice (one buffer offloaded twice)"
               : reloads == 1
                   ? "reloaded before the original left"
                   : "recomputed while the original is on the device";
    } else if (held.empty()) {
      t.term = "off the device without a reload or recompute";
    } else if (held.front()->origin == Origin::Recompute) {
      t.term = "recompute temporary";
    } else if (held.front()->origin == Origin::Reload) {
      t.term = "reloaded for recomputed readers";
    } else if (held.front()->offloaded && placedPoint > held.front()->lastUse) {
      t.term = "D2H in flight";
    } else {
      t.term = "held for recomputed readers";
    }
    r.otherTerms.push_back(std::move(t));
  }
  if (int64_t ws = u.workspace - p.workspace)
    r.otherTerms.push_back(
        {inGap ? "workspace of a recompute clone" : "workspace", Value(),
         scopeKey(p.op), ws});
  // Zero3's gathered weights and grad buffers move with the windows (a
  // recompute clone reading a weight can extend one); the shards do not.
  int64_t windows =
      (u.gatheredParams + u.gradWindows) - (p.gatheredParams + p.gradWindows);
  if (int64_t persistent = (u.params + u.grads + u.optimizer) -
                           (p.params + p.grads + p.optimizer) - windows)
    r.otherTerms.push_back({"persistent state", Value(), "", persistent});
  if (windows)
    r.otherTerms.push_back(
        {"gathered weights and grad buffers (zero3)", Value(), "", windows});
  for (const MemoryDeltaTerm &t : r.otherTerms)
    r.otherTermsBytes += t.bytes;
  return r;
}

int64_t ap::train::pipelineInflight(ModuleOp module, int64_t microBatches) {
  auto stages = module->getAttrOfType<IntegerAttr>(kPipelineStagesAttrName);
  auto stage = module->getAttrOfType<IntegerAttr>(kPipelineStageAttrName);
  if (!stages || !stage || stages.getInt() <= 1)
    return 1;
  return std::max<int64_t>(
      1, std::min(stages.getInt() - stage.getInt(), microBatches));
}

int64_t ap::train::stagePeakBytes(ModuleOp module,
                                  const MemoryTimeline &timeline,
                                  bool workspaceRegion) {
  int64_t k = pipelineInflight(module, timeline.microBatches());
  int64_t peak = workspaceRegion ? timeline.workspaceRegionPeakBytes()
                                 : timeline.peakBytes();
  // The held bytes only where other microbatches are in flight (the
  // placement search asks for every placed clone).
  if (k <= 1)
    return peak;
  return peak + (k - 1) * timeline.heldAcrossBackwardBytes();
}
