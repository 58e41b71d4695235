//===- TrainDifferentiation.cpp - backward of every train op --------------===//
//
// DifferentiableOpInterface for the forward ops: which intermediates each
// backward reads (made explicit results) and how its backward ops are built.
// Formulas: docs/model-math.md. Backward ops carry the forward op's
// scope, so the values they read are that scope's saved activations.
//
//===----------------------------------------------------------------------===//

#include "dialect/train/TrainOps.h"

#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace ap::train;

#include "dialect/train/TrainInterfaces.cpp.inc"

namespace {
RankedTensorType f32Like(Type t, ArrayRef<int64_t> shape) {
  return RankedTensorType::get(shape, Float32Type::get(t.getContext()));
}

/// Shape of one statistic per normalised row.
RankedTensorType rowStatType(Value input) {
  auto t = cast<RankedTensorType>(input.getType());
  return f32Like(t, t.getShape().drop_back());
}

/// Replaces `oldOp` by `newOp` (whose leading results correspond) and erases
/// it.
Operation *replaceWith(Operation *oldOp, Operation *newOp) {
  for (auto [o, n] : llvm::zip(oldOp->getResults(), newOp->getResults()))
    o.replaceAllUsesWith(n);
  oldOp->erase();
  return newOp;
}

Type typeIf(bool needed, Value v) { return needed ? v.getType() : Type(); }

/// Shared tail of single-input ops with an optional weight gradient: nothing
/// to build when neither the input nor the weight needs a gradient.
bool nothingNeeded(bool inputNeedsGrad, FlatSymbolRefAttr weightGrad) {
  return !inputNeedsGrad && !weightGrad;
}

/// For ops without weight gradients: when no operand needs a gradient,
/// appends a null gradient per operand and returns true.
bool noOperandNeedsGrad(ArrayRef<bool> needsGrad,
                        SmallVectorImpl<Value> &operandGrads) {
  if (llvm::any_of(needsGrad, [](bool n) { return n; }))
    return false;
  operandGrads.append(needsGrad.size(), Value());
  return true;
}

/// Appends grads[i] for operands that need it, null for the others (and
/// for trailing operands without a gradient result).
void appendNeeded(ArrayRef<bool> needsGrad, ValueRange grads,
                  SmallVectorImpl<Value> &operandGrads) {
  for (auto [i, needed] : llvm::enumerate(needsGrad))
    operandGrads.push_back(needed && i < grads.size() ? grads[i] : Value());
}
} // namespace

//===----------------------------------------------------------------------===//
// Embedding, linear, norms
//===----------------------------------------------------------------------===//

LogicalResult EmbeddingOp::buildBackward(
    OpBuilder &b, ArrayRef<Value> resultGrads, ArrayRef<bool>,
    function_ref<FlatSymbolRefAttr(Value)> paramGradSymbol,
    SmallVectorImpl<Value> &operandGrads) {
  if (FlatSymbolRefAttr sym = paramGradSymbol(getTable()))
    EmbeddingGradOp::create(b, getLoc(), getTokens(), resultGrads[0], sym,
                            getScope(), getVocabParallelAttr());
  operandGrads.append({Value(), Value()});
  return success();
}

LogicalResult
LinearOp::buildBackward(OpBuilder &b, ArrayRef<Value> resultGrads,
                        ArrayRef<bool> needsGrad,
                        function_ref<FlatSymbolRefAttr(Value)> paramGradSymbol,
                        SmallVectorImpl<Value> &operandGrads) {
  FlatSymbolRefAttr sym = paramGradSymbol(getWeight());
  if (needsGrad[1])
    return emitOpError() << "weight needs a gradient but is not a parameter "
                            "reference; autodiff only trains parameters";
  Value dx;
  if (!nothingNeeded(needsGrad[0], sym))
    dx = LinearGradOp::create(b, getLoc(), typeIf(needsGrad[0], getInput()),
                              getInput(), getWeight(), resultGrads[0], sym,
                              getScope())
             .getInputGrad();
  operandGrads.append({dx, Value()});
  return success();
}

Operation *RMSNormOp::withSavedResults(OpBuilder &b) {
  if (getRstd())
    return *this;
  b.setInsertionPoint(*this);
  auto op = RMSNormOp::create(b, getLoc(), getResult().getType(),
                              rowStatType(getInput()), getInput(), getWeight(),
                              getEpsAttr(), getZeroCenteredAttr(), getScope());
  return replaceWith(*this, op);
}

LogicalResult
RMSNormOp::buildBackward(OpBuilder &b, ArrayRef<Value> resultGrads,
                         ArrayRef<bool> needsGrad,
                         function_ref<FlatSymbolRefAttr(Value)> paramGradSymbol,
                         SmallVectorImpl<Value> &operandGrads) {
  FlatSymbolRefAttr sym = paramGradSymbol(getWeight());
  Value dx;
  if (!nothingNeeded(needsGrad[0], sym))
    dx = RMSNormGradOp::create(b, getLoc(), typeIf(needsGrad[0], getInput()),
                               getInput(), getWeight(), getRstd(),
                               resultGrads[0], getZeroCenteredAttr(), sym,
                               getScope())
             .getInputGrad();
  operandGrads.append({dx, Value()});
  return success();
}

Operation *GatedRMSNormOp::withSavedResults(OpBuilder &b) {
  if (getRstd())
    return *this;
  b.setInsertionPoint(*this);
  auto op = GatedRMSNormOp::create(
      b, getLoc(), getResult().getType(), rowStatType(getInput()), getInput(),
      getGate(), getWeight(), getEpsAttr(), getScope());
  return replaceWith(*this, op);
}

LogicalResult GatedRMSNormOp::buildBackward(
    OpBuilder &b, ArrayRef<Value> resultGrads, ArrayRef<bool> needsGrad,
    function_ref<FlatSymbolRefAttr(Value)> paramGradSymbol,
    SmallVectorImpl<Value> &operandGrads) {
  FlatSymbolRefAttr sym = paramGradSymbol(getWeight());
  if (!needsGrad[0] && !needsGrad[1] && !sym) {
    operandGrads.append(3, Value());
    return success();
  }
  auto op = GatedRMSNormGradOp::create(
      b, getLoc(), getInput().getType(), getGate().getType(),
      /*output=*/Type(), getInput(), getGate(), getWeight(), getRstd(),
      resultGrads[0], sym, getScope());
  appendNeeded(needsGrad, op->getResults(), operandGrads);
  return success();
}

Operation *L2NormOp::withSavedResults(OpBuilder &b) {
  if (getRstd())
    return *this;
  b.setInsertionPoint(*this);
  auto op = L2NormOp::create(b, getLoc(), getResult().getType(),
                             rowStatType(getInput()), getInput(), getEpsAttr(),
                             getScope());
  return replaceWith(*this, op);
}

LogicalResult L2NormOp::buildBackward(OpBuilder &b, ArrayRef<Value> resultGrads,
                                      ArrayRef<bool> needsGrad,
                                      function_ref<FlatSymbolRefAttr(Value)>,
                                      SmallVectorImpl<Value> &operandGrads) {
  // The backward reads the normalised output, which the recurrence saves
  // anyway: one saved value serves both scopes' needs.
  Value dx;
  if (needsGrad[0])
    dx = L2NormGradOp::create(b, getLoc(), getInput().getType(), getResult(),
                              getRstd(), resultGrads[0], getScope());
  operandGrads.push_back(dx);
  return success();
}

//===----------------------------------------------------------------------===//
// GDN
//===----------------------------------------------------------------------===//

LogicalResult ShortConvOp::buildBackward(
    OpBuilder &b, ArrayRef<Value> resultGrads, ArrayRef<bool> needsGrad,
    function_ref<FlatSymbolRefAttr(Value)> paramGradSymbol,
    SmallVectorImpl<Value> &operandGrads) {
  FlatSymbolRefAttr sym = paramGradSymbol(getWeight());
  Value dx;
  // The backward reads every channel group's gradient.
  for (auto [i, g] : llvm::enumerate(resultGrads))
    if (!g)
      return emitOpError() << "result #" << i
                           << " has no gradient; the conv backward needs one "
                              "for every result";
  if (!nothingNeeded(needsGrad[0], sym))
    dx = ShortConvGradOp::create(b, getLoc(), typeIf(needsGrad[0], getInput()),
                                 getInput(), getWeight(), resultGrads,
                                 getDocStarts(), sym, getScope())
             .getInputGrad();
  operandGrads.append({dx, Value()});
  if (getDocStarts())
    operandGrads.push_back(Value());
  return success();
}

LogicalResult GDNGatesOp::buildBackward(
    OpBuilder &b, ArrayRef<Value> resultGrads, ArrayRef<bool> needsGrad,
    function_ref<FlatSymbolRefAttr(Value)> paramGradSymbol,
    SmallVectorImpl<Value> &operandGrads) {
  FlatSymbolRefAttr aLogSym = paramGradSymbol(getALog());
  FlatSymbolRefAttr dtSym = paramGradSymbol(getDtBias());
  if (!needsGrad[0] && !needsGrad[1] && !aLogSym && !dtSym) {
    operandGrads.append(4, Value());
    return success();
  }
  if (!resultGrads[0] || !resultGrads[1])
    return emitOpError() << "needs gradients for both g and beta; one of them "
                            "does not reach the loss";
  auto op = GDNGatesGradOp::create(
      b, getLoc(), getA().getType(), getB().getType(), getA(), getALog(),
      getDtBias(), getG(), getBeta(), resultGrads[0], resultGrads[1], aLogSym,
      dtSym, getScope());
  appendNeeded(needsGrad, op->getResults(), operandGrads);
  return success();
}

Operation *GatedDeltaRuleOp::withSavedResults(OpBuilder &b) {
  if (!getSaved().empty())
    return *this;
  b.setInsertionPoint(*this);
  auto v = getV().getType();
  SmallVector<int64_t> tShape(v.getShape().take_front(3));
  tShape.push_back(getChunkSize());
  Type saved[] = {getG().getType(),
                  RankedTensorType::get(tShape, v.getElementType())};
  auto op = GatedDeltaRuleOp::create(
      b, getLoc(), getResult().getType(), TypeRange(saved), getQ(), getK(),
      getV(), getG(), getBeta(), getDocStarts(), getScaleAttr(),
      getChunkSizeAttr(), getScope());
  return replaceWith(*this, op);
}

LogicalResult
GatedDeltaRuleOp::buildBackward(OpBuilder &b, ArrayRef<Value> resultGrads,
                                ArrayRef<bool> needsGrad,
                                function_ref<FlatSymbolRefAttr(Value)>,
                                SmallVectorImpl<Value> &operandGrads) {
  if (noOperandNeedsGrad(needsGrad, operandGrads))
    return success();
  auto op = GatedDeltaRuleGradOp::create(
      b, getLoc(), getQ().getType(), getK().getType(), getV().getType(),
      getG().getType(), getBeta().getType(), getQ(), getK(), getV(),
      getGCumsum(), getBeta(), getChunkT(), resultGrads[0], getDocStarts(),
      getScaleAttr(), getChunkSizeAttr(), getScope());
  appendNeeded(needsGrad, op->getResults(), operandGrads);
  return success();
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

LogicalResult RoPEOp::buildBackward(OpBuilder &b, ArrayRef<Value> resultGrads,
                                    ArrayRef<bool> needsGrad,
                                    function_ref<FlatSymbolRefAttr(Value)>,
                                    SmallVectorImpl<Value> &operandGrads) {
  Value dx;
  if (needsGrad[0])
    dx = RoPEGradOp::create(b, getLoc(), getInput().getType(), resultGrads[0],
                            getDocStarts(), getRotaryDimAttr(), getThetaAttr(),
                            getScope());
  operandGrads.push_back(dx);
  if (getDocStarts())
    operandGrads.push_back(Value());
  return success();
}

Operation *AttentionOp::withSavedResults(OpBuilder &b) {
  if (getLse())
    return *this;
  b.setInsertionPoint(*this);
  auto q = getQ().getType();
  auto lse = f32Like(q, {q.getDimSize(0), q.getDimSize(2), q.getDimSize(1)});
  auto op = AttentionOp::create(b, getLoc(), getResult().getType(), lse, getQ(),
                                getK(), getV(), getDocStarts(), getScaleAttr(),
                                getScope());
  return replaceWith(*this, op);
}

LogicalResult AttentionOp::buildBackward(OpBuilder &b,
                                         ArrayRef<Value> resultGrads,
                                         ArrayRef<bool> needsGrad,
                                         function_ref<FlatSymbolRefAttr(Value)>,
                                         SmallVectorImpl<Value> &operandGrads) {
  if (noOperandNeedsGrad(needsGrad, operandGrads))
    return success();
  auto op = AttentionGradOp::create(
      b, getLoc(), getQ().getType(), getK().getType(), getV().getType(), getQ(),
      getK(), getV(), getResult(), getLse(), resultGrads[0], getDocStarts(),
      getScaleAttr(), getScope());
  appendNeeded(needsGrad, op->getResults(), operandGrads);
  return success();
}

LogicalResult
OutputGateOp::buildBackward(OpBuilder &b, ArrayRef<Value> resultGrads,
                            ArrayRef<bool> needsGrad,
                            function_ref<FlatSymbolRefAttr(Value)>,
                            SmallVectorImpl<Value> &operandGrads) {
  if (noOperandNeedsGrad(needsGrad, operandGrads))
    return success();
  auto op = OutputGateGradOp::create(b, getLoc(), getInput().getType(),
                                     getGate().getType(), getInput(), getGate(),
                                     resultGrads[0], getScope());
  appendNeeded(needsGrad, op->getResults(), operandGrads);
  return success();
}

//===----------------------------------------------------------------------===//
// MLP, residual, views
//===----------------------------------------------------------------------===//

LogicalResult SwiGLUOp::buildBackward(OpBuilder &b, ArrayRef<Value> resultGrads,
                                      ArrayRef<bool> needsGrad,
                                      function_ref<FlatSymbolRefAttr(Value)>,
                                      SmallVectorImpl<Value> &operandGrads) {
  if (noOperandNeedsGrad(needsGrad, operandGrads))
    return success();
  auto op = SwiGLUGradOp::create(
      b, getLoc(), getGate().getType(), getUp().getType(),
      /*output=*/Type(), getGate(), getUp(), resultGrads[0], getScope());
  appendNeeded(needsGrad, op->getResults(), operandGrads);
  return success();
}

LogicalResult AddOp::buildBackward(OpBuilder &, ArrayRef<Value> resultGrads,
                                   ArrayRef<bool> needsGrad,
                                   function_ref<FlatSymbolRefAttr(Value)>,
                                   SmallVectorImpl<Value> &operandGrads) {
  operandGrads.append({needsGrad[0] ? resultGrads[0] : Value(),
                       needsGrad[1] ? resultGrads[0] : Value()});
  return success();
}

// Megatron's f and g: each one's backward is the other.
LogicalResult
TensorParallelCopyOp::buildBackward(OpBuilder &b, ArrayRef<Value> resultGrads,
                                    ArrayRef<bool> needsGrad,
                                    function_ref<FlatSymbolRefAttr(Value)>,
                                    SmallVectorImpl<Value> &operandGrads) {
  Value dx;
  if (needsGrad[0])
    dx = TensorParallelReduceOp::create(b, getLoc(), getType(), resultGrads[0],
                                        getScope());
  operandGrads.push_back(dx);
  return success();
}

LogicalResult
TensorParallelReduceOp::buildBackward(OpBuilder &, ArrayRef<Value> resultGrads,
                                      ArrayRef<bool> needsGrad,
                                      function_ref<FlatSymbolRefAttr(Value)>,
                                      SmallVectorImpl<Value> &operandGrads) {
  operandGrads.push_back(needsGrad[0] ? resultGrads[0] : Value());
  return success();
}

LogicalResult SequenceParallelGatherOp::buildBackward(
    OpBuilder &b, ArrayRef<Value> resultGrads, ArrayRef<bool> needsGrad,
    function_ref<FlatSymbolRefAttr(Value)>,
    SmallVectorImpl<Value> &operandGrads) {
  Value dx;
  if (needsGrad[0])
    dx = SequenceParallelScatterOp::create(b, getLoc(), getInput().getType(),
                                           resultGrads[0], getScope());
  operandGrads.push_back(dx);
  return success();
}

LogicalResult SequenceParallelScatterOp::buildBackward(
    OpBuilder &b, ArrayRef<Value> resultGrads, ArrayRef<bool> needsGrad,
    function_ref<FlatSymbolRefAttr(Value)>,
    SmallVectorImpl<Value> &operandGrads) {
  Value dx;
  if (needsGrad[0])
    dx = SequenceParallelGatherOp::create(b, getLoc(), getInput().getType(),
                                          resultGrads[0], getScope());
  operandGrads.push_back(dx);
  return success();
}

LogicalResult ReshapeOp::buildBackward(OpBuilder &b,
                                       ArrayRef<Value> resultGrads,
                                       ArrayRef<bool> needsGrad,
                                       function_ref<FlatSymbolRefAttr(Value)>,
                                       SmallVectorImpl<Value> &operandGrads) {
  Value dx;
  if (needsGrad[0])
    dx = ReshapeOp::create(b, getLoc(), getInput().getType(), resultGrads[0],
                           getScope());
  operandGrads.push_back(dx);
  return success();
}

LogicalResult SliceOp::buildBackward(OpBuilder &b, ArrayRef<Value> resultGrads,
                                     ArrayRef<bool> needsGrad,
                                     function_ref<FlatSymbolRefAttr(Value)>,
                                     SmallVectorImpl<Value> &operandGrads) {
  Value dx;
  if (needsGrad[0])
    dx = SliceGradOp::create(b, getLoc(), getInput().getType(), resultGrads[0],
                             getDimAttr(), getOffsetAttr(), getScope());
  operandGrads.push_back(dx);
  return success();
}

LogicalResult ConcatOp::buildBackward(OpBuilder &b, ArrayRef<Value> resultGrads,
                                      ArrayRef<bool> needsGrad,
                                      function_ref<FlatSymbolRefAttr(Value)>,
                                      SmallVectorImpl<Value> &operandGrads) {
  int64_t offset = 0;
  for (auto [i, input] : llvm::enumerate(getInputs())) {
    auto t = cast<RankedTensorType>(input.getType());
    Value dx;
    if (needsGrad[i])
      dx = SliceOp::create(b, getLoc(), t, resultGrads[0], getDimAttr(),
                           b.getI64IntegerAttr(offset), getScope());
    operandGrads.push_back(dx);
    offset += t.getDimSize(getDim());
  }
  return success();
}

LogicalResult ExpandOp::buildBackward(OpBuilder &b, ArrayRef<Value> resultGrads,
                                      ArrayRef<bool> needsGrad,
                                      function_ref<FlatSymbolRefAttr(Value)>,
                                      SmallVectorImpl<Value> &operandGrads) {
  Value dx;
  if (needsGrad[0])
    dx = ExpandGradOp::create(b, getLoc(), getInput().getType(), resultGrads[0],
                              getScope());
  operandGrads.push_back(dx);
  return success();
}

//===----------------------------------------------------------------------===//
// Loss
//===----------------------------------------------------------------------===//

Operation *LMHeadCrossEntropyOp::withSavedResults(OpBuilder &b) {
  if (getLse())
    return *this;
  b.setInsertionPoint(*this);
  auto h = getHidden().getType();
  auto op = LMHeadCrossEntropyOp::create(
      b, getLoc(), getLossSum().getType(), getTokenCount().getType(),
      f32Like(h, {h.getDimSize(0), h.getDimSize(1)}), getHidden(), getWeight(),
      getLabels(), getChunkTokensAttr(), getIgnoreIndexAttr(), getScope(),
      getVocabParallelAttr());
  return replaceWith(*this, op);
}

LogicalResult LMHeadCrossEntropyOp::buildBackward(
    OpBuilder &b, ArrayRef<Value>, ArrayRef<bool> needsGrad,
    function_ref<FlatSymbolRefAttr(Value)> paramGradSymbol,
    SmallVectorImpl<Value> &operandGrads) {
  // The loss sum is the seed: its gradient is 1 by construction.
  FlatSymbolRefAttr sym = paramGradSymbol(getWeight());
  Value dh;
  if (needsGrad[0] || sym) {
    dh = LMHeadCrossEntropyGradOp::create(
        b, getLoc(), getHidden().getType(), getHidden(), getWeight(),
        getLabels(), getLse(), getChunkTokensAttr(), getIgnoreIndexAttr(), sym,
        getScope(), getVocabParallelAttr());
  }
  operandGrads.append({needsGrad[0] ? dh : Value(), Value(), Value()});
  return success();
}
