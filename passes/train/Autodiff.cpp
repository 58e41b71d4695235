//===- Autodiff.cpp - train-autodiff --------------------------------------===//
//
// Builds the training step from the one-microbatch forward graph. The
// reverse sweep asks every forward op for its backward through
// DifferentiableOpInterface and sums gradient contributions of values with
// several consumers; gradients of slices that tile a value exactly become one
// concat instead of zero-padded partial sums (GDN's q, k, v slices of the
// conv output), so no full-size zero tensors appear.
//
//===----------------------------------------------------------------------===//

#include "dialect/train/TrainOps.h"
#include "passes/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"

namespace ap {
#define GEN_PASS_DEF_TRAINAUTODIFF
#include "passes/train/TrainPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::train;

namespace {

bool isFloatTensor(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && isa<FloatType>(t.getElementType());
}

/// Gradient contributions per value, combined when the value's producer is
/// differentiated (all consumers come later in forward order, so by then
/// every contribution exists).
class GradientMap {
public:
  void add(Value v, Value grad) { contributions[v].push_back(grad); }
  bool has(Value v) const { return contributions.count(v); }

  /// The total gradient of `v`, built at `b`'s insertion point.
  Value get(OpBuilder &b, Value v, ScopeAttr scope) {
    auto it = contributions.find(v);
    if (it == contributions.end())
      return nullptr;
    SmallVector<Value> &parts = it->second;
    if (parts.size() == 1)
      return parts.front();
    Value total = tryConcatOfSliceGrads(b, v, parts, scope);
    if (!total) {
      total = parts.front();
      for (Value p : llvm::drop_begin(parts))
        total = AddOp::create(b, v.getLoc(), total.getType(), total, p, scope);
    }
    parts.assign({total});
    return total;
  }

private:
  /// When the contributions are slice_grads of one dim that tile `v`
  /// exactly, their sum is the concat of the sliced gradients.
  static Value tryConcatOfSliceGrads(OpBuilder &b, Value v,
                                     ArrayRef<Value> parts, ScopeAttr scope) {
    SmallVector<SliceGradOp> slices;
    for (Value p : parts) {
      auto s = p.getDefiningOp<SliceGradOp>();
      if (!s || (!slices.empty() && s.getDim() != slices[0].getDim()))
        return nullptr;
      slices.push_back(s);
    }
    llvm::sort(slices, [](SliceGradOp a, SliceGradOp c) {
      return a.getOffset() < c.getOffset();
    });
    int64_t dim = slices[0].getDim(), next = 0;
    for (SliceGradOp s : slices) {
      if (s.getOffset() != next)
        return nullptr;
      next +=
          cast<RankedTensorType>(s.getResultGrad().getType()).getDimSize(dim);
    }
    if (next != cast<RankedTensorType>(v.getType()).getDimSize(dim))
      return nullptr;
    SmallVector<Value> pieces;
    for (SliceGradOp s : slices)
      pieces.push_back(s.getResultGrad());
    Value concat =
        ConcatOp::create(b, v.getLoc(), v.getType(), pieces, dim, scope);
    for (SliceGradOp s : slices)
      s->erase();
    return concat;
  }

  llvm::MapVector<Value, SmallVector<Value>> contributions;
};

struct TrainAutodiffPass : ap::impl::TrainAutodiffBase<TrainAutodiffPass> {
  using Base::Base;

  void runOnOperation() override;

private:
  /// Values that depend on a trainable parameter: only they need gradients.
  static llvm::DenseSet<Value> valuesNeedingGrad(Block &body);
  LogicalResult differentiate(Block &body, YieldOp yield);
  bool decays(ParamOp param) const;
};

llvm::DenseSet<Value> TrainAutodiffPass::valuesNeedingGrad(Block &body) {
  llvm::DenseSet<Value> needs;
  for (Operation &op : body) {
    if (auto ref = dyn_cast<ParamRefOp>(op)) {
      auto param = SymbolTable::lookupNearestSymbolFrom<ParamOp>(
          ref, ref.getParamAttr());
      if (param && !param.getFrozen())
        needs.insert(ref.getResult());
      continue;
    }
    if (llvm::any_of(op.getOperands(),
                     [&](Value v) { return needs.contains(v); }))
      for (Value r : op.getResults())
        if (isFloatTensor(r))
          needs.insert(r);
  }
  return needs;
}

LogicalResult TrainAutodiffPass::differentiate(Block &body, YieldOp yield) {
  // Forward ops whose backward will run return their saved intermediates.
  llvm::DenseSet<Value> needs = valuesNeedingGrad(body);
  SmallVector<Operation *> forward;
  for (Operation &op : body.without_terminator())
    forward.push_back(&op);
  OpBuilder b(&getContext());
  for (Operation *&op : forward) {
    auto diff = dyn_cast<DifferentiableOpInterface>(op);
    bool depends = llvm::any_of(op->getOperands(),
                                [&](Value v) { return needs.contains(v); });
    if (!diff || !depends)
      continue;
    // The replacement's results stand for the old ones from here on.
    SmallVector<Value> oldResults(op->getResults());
    op = diff.withSavedResults(b);
    for (auto [o, n] : llvm::zip(oldResults, op->getResults()))
      if (needs.contains(o))
        needs.insert(n);
  }
  needs = valuesNeedingGrad(body);

  auto paramGradSymbol = [&](Value v) -> FlatSymbolRefAttr {
    auto ref = v.getDefiningOp<ParamRefOp>();
    if (!ref || !needs.contains(v))
      return nullptr;
    return ref.getParamAttr();
  };

  GradientMap grads;
  SmallVector<Operation *> fusedLosses;
  b.setInsertionPoint(yield);
  for (Operation *op : llvm::reverse(forward)) {
    if (isa<ParamRefOp>(op))
      continue;
    bool isLoss = isa<LMHeadCrossEntropyOp>(op);
    bool reachesLoss = isLoss || llvm::any_of(op->getResults(), [&](Value r) {
                         return grads.has(r);
                       });
    bool dependsOnTrainable = llvm::any_of(
        op->getOperands(), [&](Value v) { return needs.contains(v); });
    if (!reachesLoss || !dependsOnTrainable)
      continue;
    auto diff = dyn_cast<DifferentiableOpInterface>(op);
    if (!diff)
      return op->emitOpError() << "has no backward (it does not implement "
                                  "DifferentiableOpInterface)";
    auto scope = op->getAttrOfType<ScopeAttr>("scope");
    SmallVector<Value> resultGrads;
    for (Value r : op->getResults())
      resultGrads.push_back(grads.get(b, r, scope));
    SmallVector<bool> operandNeedsGrad;
    for (Value v : op->getOperands())
      operandNeedsGrad.push_back(needs.contains(v) && isFloatTensor(v) &&
                                 !v.getDefiningOp<ParamRefOp>());
    SmallVector<Value> operandGrads;
    auto loss = dyn_cast<LMHeadCrossEntropyOp>(op);
    if (loss && fuseLossGrad) {
      // The loss sum's seed is the constant 1, so its gradient needs nothing
      // the rest of the backward makes: one op where the loss was computes
      // both, each chunk's logits once instead of twice. The loss op goes
      // after the walk (its results are still keys of `needs`).
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPoint(loss);
      auto fused = LMHeadCrossEntropyWithGradOp::create(
          b, loss.getLoc(), loss.getLossSum().getType(),
          loss.getTokenCount().getType(), loss.getHidden().getType(),
          loss.getHidden(), loss.getWeight(), loss.getLabels(),
          loss.getChunkTokensAttr(), loss.getIgnoreIndexAttr(),
          paramGradSymbol(loss.getWeight()), loss.getScope(),
          loss.getVocabParallelAttr());
      loss.getLossSum().replaceAllUsesWith(fused.getLossSum());
      loss.getTokenCount().replaceAllUsesWith(fused.getTokenCount());
      operandGrads.append(
          {operandNeedsGrad[0] ? fused.getHiddenGrad() : Value(), Value(),
           Value()});
      fusedLosses.push_back(loss);
    } else if (failed(diff.buildBackward(b, resultGrads, operandNeedsGrad,
                                         paramGradSymbol, operandGrads))) {
      return failure();
    }
    for (auto [v, g] : llvm::zip(op->getOperands(), operandGrads))
      if (g)
        grads.add(v, g);
  }
  for (Operation *loss : fusedLosses)
    loss->erase();
  return success();
}

bool TrainAutodiffPass::decays(ParamOp param) const {
  if (cast<ShapedType>(param.getType()).getRank() <= 1)
    return false;
  SmallVector<std::string> patterns(noDecay.begin(), noDecay.end());
  if (patterns.empty())
    patterns = {"norm", "A_log", "dt_bias"};
  return llvm::none_of(patterns, [&](const std::string &p) {
    return param.getSymName().contains(p);
  });
}

void TrainAutodiffPass::runOnOperation() {
  ModuleOp module = getOperation();
  auto forward = module.lookupSymbol<func::FuncOp>("forward");
  if (!forward) {
    module.emitError() << "train-autodiff expects a func.func @forward "
                          "(one microbatch's forward graph, as "
                          "actplace-import writes it)";
    return signalPassFailure();
  }
  if (module.lookupSymbol("train_step")) {
    module.emitError() << "module already has @train_step: train-autodiff "
                          "runs once";
    return signalPassFailure();
  }
  if (forward.isExternal()) {
    forward.emitError() << "@forward is a declaration: train-autodiff needs "
                           "its body (the forward graph)";
    return signalPassFailure();
  }
  FunctionType fwdType = forward.getFunctionType();
  auto tokType = dyn_cast_or_null<RankedTensorType>(
      fwdType.getNumInputs() == 2 ? fwdType.getInput(0) : Type());
  if (!tokType || fwdType.getInput(1) != tokType || tokType.getRank() != 2 ||
      !tokType.getElementType().isInteger(32) || fwdType.getNumResults() != 2) {
    forward.emitError() << "@forward must take (tokens, labels) of one "
                           "microbatch [B, T] and return (loss_sum, "
                           "token_count)";
    return signalPassFailure();
  }
  int64_t microBatches = 1;
  if (auto mb = module->getAttrOfType<IntegerAttr>(kMicroBatchesAttrName))
    microBatches = mb.getInt();

  MLIRContext *ctx = &getContext();
  Location loc = forward.getLoc();
  OpBuilder b(ctx);
  b.setInsertionPointAfter(forward);
  SmallVector<int64_t> stepShape{microBatches};
  llvm::append_range(stepShape, tokType.getShape());
  auto stepTok = RankedTensorType::get(stepShape, tokType.getElementType());
  auto f32 = RankedTensorType::get({}, b.getF32Type());
  auto i32 = RankedTensorType::get({}, b.getI32Type());
  auto step = func::FuncOp::create(
      b, loc, "train_step", b.getFunctionType({stepTok, stepTok}, {f32, f32}));
  step.setArgAttr(0, "train.input", b.getStringAttr("tokens"));
  step.setArgAttr(1, "train.input", b.getStringAttr("labels"));
  Block *entry = step.addEntryBlock();
  b.setInsertionPointToStart(entry);
  auto loop = MicrobatchLoopOp::create(b, loc, f32, i32, entry->getArgument(0),
                                       entry->getArgument(1));
  Block *body = new Block();
  loop.getBody().push_back(body);
  body->addArguments({tokType, tokType}, {loc, loc});

  // The forward graph becomes the loop body.
  IRMapping mapping;
  for (auto [from, to] :
       llvm::zip(forward.getArguments(), body->getArguments()))
    mapping.map(from, to);
  OpBuilder bodyBuilder = OpBuilder::atBlockEnd(body);
  YieldOp yield;
  for (Operation &op : forward.getBody().front()) {
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      yield = YieldOp::create(bodyBuilder, ret.getLoc(),
                              ValueRange{mapping.lookup(ret.getOperand(0)),
                                         mapping.lookup(ret.getOperand(1))});
      continue;
    }
    bodyBuilder.clone(op, mapping);
  }
  if (!yield) {
    forward.emitError() << "@forward has no return";
    return signalPassFailure();
  }
  if (failed(differentiate(*body, yield)))
    return signalPassFailure();

  // Gradient finalisation and the optimizer.
  b.setInsertionPointAfter(loop);
  Value norm = FinalizeGradsOp::create(b, loc, f32, loop.getTokenCount(),
                                       b.getF64FloatAttr(maxGradNorm));
  Value lr = LRScheduleOp::create(
      b, loc, f32, b.getF64FloatAttr(maxLr), b.getF64FloatAttr(minLr),
      b.getI64IntegerAttr(warmupSteps), b.getI64IntegerAttr(totalSteps));
  for (ParamOp param : module.getOps<ParamOp>()) {
    if (param.getFrozen())
      continue;
    AdamWOp::create(b, loc, FlatSymbolRefAttr::get(param.getSymNameAttr()), lr,
                    b.getF64FloatAttr(decays(param) ? weightDecay : 0.0),
                    b.getF64FloatAttr(beta1), b.getF64FloatAttr(beta2),
                    b.getF64FloatAttr(adamEps));
  }
  Value loss =
      LossMeanOp::create(b, loc, f32, loop.getLossSum(), loop.getTokenCount());
  func::ReturnOp::create(b, loc, ValueRange{loss, norm});
  forward.erase();
}

} // namespace
