//===- TrainOps.cpp - train dialect operations ----------------------------===//
//
// Verifiers for the shape relations ODS constraints cannot express. Every
// message names the operand (by its ODS name), the dimension, what was
// expected and what was found, so a user reading a failed import or a
// hand-written graph knows which value to fix.
//
//===----------------------------------------------------------------------===//

#include "dialect/train/TrainOps.h"

#include <limits>

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace ap::train;

namespace {
/// Largest head dimension the kernels implement (docs/model-math.md;
/// docs/architecture.md 6).
constexpr int64_t kMaxHeadDim = 256;
/// The GDN chunk size the kernels implement.
constexpr int64_t kGdnChunkSize = 64;
/// Longest causal short convolution the kernels implement.
constexpr int64_t kMaxConvKernel = 8;

/// Small helper for dimension and element-type checks with uniform messages.
class Checker {
public:
  explicit Checker(Operation *op) : op(op) {}

  /// `name` dim `d` must equal `expected`; `why` says where the expectation
  /// comes from ("the input's last dimension K").
  LogicalResult dim(StringRef name, Type type, unsigned d, int64_t expected,
                    StringRef why) {
    int64_t got = cast<RankedTensorType>(type).getDimSize(d);
    if (got == expected)
      return success();
    return op->emitOpError() << name << " dimension " << d << " is " << got
                             << ", expected " << expected << " (" << why << ")";
  }

  /// The element types of `name` and `refName` must agree.
  LogicalResult sameElement(StringRef name, Type type, StringRef refName,
                            Type refType) {
    Type a = cast<ShapedType>(type).getElementType();
    Type b = cast<ShapedType>(refType).getElementType();
    if (a == b)
      return success();
    return op->emitOpError()
           << name << " has element type " << a << ", expected " << b
           << " (the element type of " << refName << ")";
  }

  /// `name` must have exactly `refType`.
  LogicalResult sameType(StringRef name, Type type, StringRef refName,
                         Type refType) {
    if (type == refType)
      return success();
    return op->emitOpError() << name << " has type " << type << ", expected "
                             << refType << " (the type of " << refName << ")";
  }

  LogicalResult positive(StringRef attr, double value) {
    if (value > 0.0)
      return success();
    return op->emitOpError()
           << "attribute '" << attr << "' must be positive, got " << value;
  }

private:
  Operation *op;
};

/// The GDN ops (forward and backward) run the kernels' one chunk size.
LogicalResult verifyGdnChunkSize(Operation *op, int64_t chunkSize) {
  if (chunkSize == kGdnChunkSize)
    return success();
  return op->emitOpError() << "chunk_size is " << chunkSize << ", expected "
                           << kGdnChunkSize
                           << " (the chunk size the GDN kernels implement)";
}

int64_t dimOf(Value v, unsigned d) {
  return cast<RankedTensorType>(v.getType()).getDimSize(d);
}
} // namespace

//===----------------------------------------------------------------------===//
// ParamRefOp
//===----------------------------------------------------------------------===//

LogicalResult ParamRefOp::verifySymbolUses(SymbolTableCollection &symbolTable) {
  auto param =
      symbolTable.lookupNearestSymbolFrom<ParamOp>(*this, getParamAttr());
  if (!param)
    return emitOpError() << "refers to '" << getParam()
                         << "', which is not a train.param in scope";
  if (param.getType() != getType())
    return emitOpError() << "result type " << getType()
                         << " does not match the declared type "
                         << param.getType() << " of parameter '" << getParam()
                         << "'";
  return success();
}

//===----------------------------------------------------------------------===//
// Embedding, linear, norms
//===----------------------------------------------------------------------===//

/// `vocab_parallel` splits the vocabulary over tensor-parallel ranks: the
/// module must be one rank's part of such a split.
static LogicalResult verifyVocabParallel(Operation *op, bool vocabParallel) {
  if (!vocabParallel)
    return success();
  auto module = op->getParentOfType<ModuleOp>();
  auto tp = module ? module->getAttrOfType<IntegerAttr>(kTensorParallelAttrName)
                   : IntegerAttr();
  if (!tp || tp.getInt() < 2)
    return op->emitOpError()
           << "vocab_parallel needs a module split over tensor-parallel "
              "ranks ('"
           << kTensorParallelAttrName << "' of at least 2), got "
           << (tp ? std::to_string(tp.getInt()) : std::string("none"));
  return success();
}

/// Packed sequences: `docStarts` (train.doc_starts), where present, is
/// [B, T] of `x` [B, T, ...].
static LogicalResult verifyDocStarts(Checker &c, Value docStarts, Type x) {
  if (!docStarts)
    return success();
  auto t = cast<RankedTensorType>(x);
  if (failed(c.dim("doc_starts", docStarts.getType(), 0, t.getDimSize(0),
                   "the batch B")) ||
      failed(c.dim("doc_starts", docStarts.getType(), 1, t.getDimSize(1),
                   "the sequence length T")))
    return failure();
  return success();
}

LogicalResult DocStartsOp::verify() {
  Checker c(*this);
  if (failed(c.sameType("result", getType(), "tokens", getTokens().getType())))
    return failure();
  int64_t sep = getSeparator();
  if (sep < 0 || sep > std::numeric_limits<int32_t>::max())
    return emitOpError() << "separator is " << sep
                         << ", expected a token id in [0, 2^31)";
  return success();
}

LogicalResult EmbeddingOp::verify() {
  Checker c(*this);
  if (failed(verifyVocabParallel(*this, getVocabParallel())))
    return failure();
  Type res = getType();
  if (failed(c.sameElement("result", res, "table", getTable().getType())) ||
      failed(c.dim("result", res, 0, dimOf(getTokens(), 0),
                   "tokens dimension 0, the batch")) ||
      failed(c.dim("result", res, 1, dimOf(getTokens(), 1),
                   "tokens dimension 1, the sequence length")) ||
      failed(c.dim("result", res, 2, dimOf(getTable(), 1),
                   "table dimension 1, the hidden size")))
    return failure();
  return success();
}

LogicalResult LinearOp::verify() {
  Checker c(*this);
  auto in = getInput().getType();
  auto res = getType();
  if (in.getRank() < 1)
    return emitOpError() << "input must have rank >= 1, got " << in;
  int64_t k = in.getDimSize(in.getRank() - 1);
  if (failed(c.sameElement("weight", getWeight().getType(), "input", in)) ||
      failed(c.sameElement("result", res, "input", in)) ||
      failed(c.dim("weight", getWeight().getType(), 1, k,
                   "the input's last dimension K; weight is [O, K]")))
    return failure();
  if (res.getRank() != in.getRank())
    return emitOpError() << "result rank " << res.getRank()
                         << " must equal input rank " << in.getRank();
  for (int64_t d = 0; d + 1 < in.getRank(); ++d)
    if (failed(c.dim("result", res, d, in.getDimSize(d),
                     "the input's leading dimensions")))
      return failure();
  return c.dim("result", res, res.getRank() - 1, dimOf(getWeight(), 0),
               "weight dimension 0, the output features O");
}

/// Shared by the RMSNorm family: result type equals input type, the weight
/// spans the last dimension, eps is positive.
static LogicalResult verifyLastDimNorm(Operation *op, Value input, Value weight,
                                       Type result, double eps) {
  Checker c(op);
  auto in = cast<RankedTensorType>(input.getType());
  if (in.getRank() < 1)
    return op->emitOpError() << "input must have rank >= 1, got " << in;
  if (failed(c.sameType("result", result, "input", in)) ||
      failed(c.sameElement("weight", weight.getType(), "input", in)) ||
      failed(c.dim("weight", weight.getType(), 0,
                   in.getDimSize(in.getRank() - 1),
                   "the input's last dimension, which is normalised")))
    return failure();
  return c.positive("eps", eps);
}

/// A saved per-row statistic (rstd) has the input's shape without its last
/// dimension.
static LogicalResult verifyRowStatistic(Operation *op, StringRef name,
                                        Value stat, Value input) {
  if (!stat)
    return success();
  auto in = cast<RankedTensorType>(input.getType());
  auto st = cast<RankedTensorType>(stat.getType());
  if (st.getShape() != in.getShape().drop_back())
    return op->emitOpError()
           << name << " has type " << st << ", expected the input shape "
           << "without its last dimension (one value per normalised row)";
  return success();
}

LogicalResult RMSNormOp::verify() {
  if (failed(verifyRowStatistic(*this, "rstd", getRstd(), getInput())))
    return failure();
  return verifyLastDimNorm(*this, getInput(), getWeight(),
                           getResult().getType(), getEps().convertToDouble());
}

LogicalResult GatedRMSNormOp::verify() {
  Checker c(*this);
  if (failed(c.sameType("gate", getGate().getType(), "input",
                        getInput().getType())) ||
      failed(verifyRowStatistic(*this, "rstd", getRstd(), getInput())))
    return failure();
  return verifyLastDimNorm(*this, getInput(), getWeight(),
                           getResult().getType(), getEps().convertToDouble());
}

LogicalResult L2NormOp::verify() {
  Checker c(*this);
  if (failed(c.sameType("result", getResult().getType(), "input",
                        getInput().getType())) ||
      failed(verifyRowStatistic(*this, "rstd", getRstd(), getInput())))
    return failure();
  return c.positive("eps", getEps().convertToDouble());
}

//===----------------------------------------------------------------------===//
// GDN
//===----------------------------------------------------------------------===//

LogicalResult ShortConvOp::verify() {
  Checker c(*this);
  auto in = getInput().getType();
  auto w = getWeight().getType();
  if (getOutputs().empty())
    return emitOpError() << "has no results, expected at least 1";
  int64_t channels = 0;
  for (auto [i, r] : llvm::enumerate(getOutputs())) {
    auto t = cast<RankedTensorType>(r.getType());
    std::string name = "result #" + std::to_string(i);
    if (failed(c.sameElement(name, t, "input", in)) ||
        failed(c.dim(name, t, 0, in.getDimSize(0), "the input's batch B")) ||
        failed(c.dim(name, t, 1, in.getDimSize(1),
                     "the input's sequence length T")))
      return failure();
    // An empty group (0 channels) fails the shared shape rule first.
    channels += t.getDimSize(2);
  }
  if (channels != in.getDimSize(2))
    return emitOpError() << "results have " << channels
                         << " channels in all, expected the input's "
                         << in.getDimSize(2);
  if (failed(c.sameElement("weight", w, "input", in)) ||
      failed(c.dim("weight", w, 0, in.getDimSize(2),
                   "the input's channels C; weight is [C, Kc]")))
    return failure();
  int64_t kc = w.getDimSize(1);
  if (kc < 1 || kc > kMaxConvKernel)
    return emitOpError() << "weight dimension 1 (the kernel size Kc) is " << kc
                         << ", expected 1 to " << kMaxConvKernel;
  return verifyDocStarts(c, getDocStarts(), in);
}

LogicalResult GDNGatesOp::verify() {
  Checker c(*this);
  auto a = getA().getType();
  int64_t heads = a.getDimSize(2);
  if (failed(c.sameType("b", getB().getType(), "a", a)) ||
      failed(c.dim("A_log", getALog().getType(), 0, heads,
                   "the value heads Hv, a's dimension 2")) ||
      failed(c.dim("dt_bias", getDtBias().getType(), 0, heads,
                   "the value heads Hv, a's dimension 2")))
    return failure();
  for (auto [name, t] :
       {std::pair<StringRef, RankedTensorType>{"g", getG().getType()},
        {"beta", getBeta().getType()}})
    for (unsigned d = 0; d < 3; ++d)
      if (failed(c.dim(name, t, d, a.getDimSize(d), "a's shape [B, T, Hv]")))
        return failure();
  return success();
}

LogicalResult GatedDeltaRuleOp::verify() {
  Checker c(*this);
  auto q = getQ().getType();
  auto v = getV().getType();
  if (failed(c.sameType("k", getK().getType(), "q", q)) ||
      failed(c.sameElement("v", v, "q", q)) ||
      failed(c.sameType("result", getResult().getType(), "v", v)) ||
      failed(c.dim("v", v, 0, q.getDimSize(0), "q's batch B")) ||
      failed(c.dim("v", v, 1, q.getDimSize(1), "q's sequence length T")))
    return failure();
  int64_t hk = q.getDimSize(2), dk = q.getDimSize(3);
  int64_t hv = v.getDimSize(2), dv = v.getDimSize(3);
  if (hv % hk != 0)
    return emitOpError() << "value heads Hv = " << hv
                         << " (v dimension 2) must be a multiple of key heads "
                            "Hk = "
                         << hk << " (q dimension 2)";
  if (dk > kMaxHeadDim || dv > kMaxHeadDim)
    return emitOpError() << "head dims dk = " << dk << ", dv = " << dv
                         << " exceed the supported maximum " << kMaxHeadDim;
  for (auto [name, t] :
       {std::pair<StringRef, RankedTensorType>{"g", getG().getType()},
        {"beta", getBeta().getType()}})
    for (unsigned d = 0; d < 3; ++d)
      if (failed(c.dim(name, t, d, v.getDimSize(d), "v's [B, T, Hv]")))
        return failure();
  if (!getSaved().empty()) {
    auto gt = getG().getType();
    SmallVector<int64_t> tShape(v.getShape().take_front(3));
    tShape.push_back(getChunkSize());
    auto expectedT = RankedTensorType::get(tShape, v.getElementType());
    if (getSaved().size() != 2 || getSaved()[0].getType() != gt ||
        getSaved()[1].getType() != expectedT)
      return emitOpError() << "saved results must be (g_cumsum: " << gt
                           << ", T: " << expectedT << ")";
  }
  if (failed(verifyGdnChunkSize(*this, getChunkSize())) ||
      failed(verifyDocStarts(c, getDocStarts(), q)))
    return failure();
  return c.positive("scale", getScale().convertToDouble());
}

LogicalResult GatedDeltaRuleGradOp::verify() {
  // The cost model and the memory timeline count chunks as T / chunk_size.
  Checker c(*this);
  if (failed(verifyGdnChunkSize(*this, getChunkSize())) ||
      failed(verifyDocStarts(c, getDocStarts(), getQ().getType())))
    return failure();
  return c.positive("scale", getScale().convertToDouble());
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

/// RoPE and its backward: x and y of one type, the rotary dims within the
/// head, theta > 0, the document starts [B, T].
static LogicalResult verifyRoPE(Operation *op, Value x, Value y,
                                int64_t rotaryDim, double theta,
                                Value docStarts) {
  Checker c(op);
  if (failed(c.sameType("result", y.getType(), "input", x.getType())))
    return failure();
  int64_t headDim = cast<RankedTensorType>(x.getType()).getDimSize(3);
  if (rotaryDim <= 0 || rotaryDim % 2 != 0 || rotaryDim > headDim)
    return op->emitOpError() << "rotary_dim is " << rotaryDim
                             << ", expected an even number in [2, " << headDim
                             << "] (the head dim)";
  if (failed(verifyDocStarts(c, docStarts, x.getType())))
    return failure();
  return c.positive("theta", theta);
}

LogicalResult RoPEOp::verify() {
  return verifyRoPE(*this, getInput(), getResult(), getRotaryDim(),
                    getTheta().convertToDouble(), getDocStarts());
}

LogicalResult RoPEGradOp::verify() {
  return verifyRoPE(*this, getResultGrad(), getInputGrad(), getRotaryDim(),
                    getTheta().convertToDouble(), getDocStarts());
}

LogicalResult AttentionOp::verify() {
  Checker c(*this);
  auto q = getQ().getType();
  auto k = getK().getType();
  auto v = getV().getType();
  if (failed(c.sameElement("k", k, "q", q)) ||
      failed(c.sameElement("v", v, "q", q)) ||
      failed(c.sameElement("result", getResult().getType(), "q", q)))
    return failure();
  if (Value lse = getLse()) {
    auto expected = RankedTensorType::get(
        {q.getDimSize(0), q.getDimSize(2), q.getDimSize(1)},
        Float32Type::get(getContext()));
    if (failed(c.sameType("lse", lse.getType(), "[B, Hq, T] f32", expected)))
      return failure();
  }
  for (auto [name, t] :
       {std::pair<StringRef, RankedTensorType>{"k", k}, {"v", v}})
    if (failed(c.dim(name, t, 0, q.getDimSize(0), "q's batch B")) ||
        failed(c.dim(name, t, 1, q.getDimSize(1), "q's sequence length T")))
      return failure();
  if (failed(c.dim("v", v, 2, k.getDimSize(2), "k's heads Hkv")) ||
      failed(c.dim("k", k, 3, q.getDimSize(3), "q's head dim Dqk")))
    return failure();
  int64_t hq = q.getDimSize(2), hkv = k.getDimSize(2);
  if (hq % hkv != 0)
    return emitOpError() << "query heads Hq = " << hq
                         << " must be a multiple of key/value heads Hkv = "
                         << hkv << " (grouped-query attention)";
  if (q.getDimSize(3) > kMaxHeadDim || v.getDimSize(3) > kMaxHeadDim)
    return emitOpError() << "head dims Dqk = " << q.getDimSize(3)
                         << ", Dv = " << v.getDimSize(3)
                         << " exceed the supported maximum " << kMaxHeadDim;
  auto res = getResult().getType();
  if (failed(c.dim("result", res, 0, q.getDimSize(0), "q's batch B")) ||
      failed(c.dim("result", res, 1, q.getDimSize(1), "q's sequence length")) ||
      failed(c.dim("result", res, 2, hq, "q's heads Hq")) ||
      failed(c.dim("result", res, 3, v.getDimSize(3), "v's head dim Dv")) ||
      failed(verifyDocStarts(c, getDocStarts(), q)))
    return failure();
  return c.positive("scale", getScale().convertToDouble());
}

LogicalResult AttentionGradOp::verify() {
  Checker c(*this);
  return verifyDocStarts(c, getDocStarts(), getQ().getType());
}

LogicalResult ShortConvGradOp::verify() {
  Checker c(*this);
  return verifyDocStarts(c, getDocStarts(), getInput().getType());
}

//===----------------------------------------------------------------------===//
// Parameters and tensor parallelism
//===----------------------------------------------------------------------===//

LogicalResult ParamOp::verify() {
  std::optional<uint64_t> dim = getTpDim();
  std::optional<ArrayRef<int64_t>> segments = getTpSegments();
  if (dim.has_value() != segments.has_value())
    return emitOpError() << "needs both 'tp_dim' and 'tp_segments' (a split "
                            "parameter) or neither (a replicated one)";
  if (getTpGradSum() && (dim || tensorParallelSize(*this) < 2))
    return emitOpError() << "'tp_grad_sum' belongs on a replicated parameter "
                            "of a module with '"
                         << kTensorParallelAttrName << "' of at least 2";
  if (!dim)
    return success();
  auto type = cast<RankedTensorType>(getType());
  if (int64_t(*dim) >= type.getRank())
    return emitOpError() << "split dimension " << *dim << " is not below the "
                         << "rank " << type.getRank() << " of " << type;
  int64_t tp = tensorParallelSize(*this);
  if (tp < 2)
    return emitOpError() << "is split, but the module's '"
                         << kTensorParallelAttrName
                         << "' is 1 or absent (a split parameter needs at "
                            "least 2 tensor-parallel ranks)";
  if (segments->empty())
    return emitOpError() << "split with no segments";
  int64_t whole = 0;
  for (int64_t s : *segments) {
    // Bounded like any tensor extent, so that their sum cannot overflow.
    if (s <= 0 || s > ap::kMaxTensorBytes || s % tp != 0)
      return emitOpError() << "segment extent " << s
                           << " is not a positive multiple of the "
                              "tensor-parallel size "
                           << tp;
    whole += s;
  }
  int64_t local = type.getDimSize(*dim);
  if (whole / tp != local)
    return emitOpError() << "dimension " << *dim << " is " << local
                         << ", expected " << whole / tp
                         << " (the segments' extents " << whole << " / " << tp
                         << " tensor-parallel ranks)";
  return success();
}

static LogicalResult verifyTensorParallelOp(Operation *op) {
  if (tensorParallelSize(op) < 2)
    return op->emitOpError()
           << "needs a module with '" << kTensorParallelAttrName
           << "' of at least 2 (the tensor-parallel group it sums over)";
  return success();
}

/// Sequence parallelism: `shard` is [1, N/T, rest...] of `whole` [B, T,
/// rest...] with N = B x T over T ranks.
static LogicalResult verifyTokenShard(Operation *op, RankedTensorType whole,
                                      RankedTensorType shard) {
  if (failed(verifyTensorParallelOp(op)))
    return failure();
  auto module = op->getParentOfType<ModuleOp>();
  if (!module || !module->hasAttr(kSequenceParallelAttrName))
    return op->emitOpError()
           << "needs a module with '" << kSequenceParallelAttrName << "'";
  int64_t tp = tensorParallelSize(op);
  if (whole.getElementType() != shard.getElementType() ||
      whole.getRank() != shard.getRank() || whole.getRank() < 2)
    return op->emitOpError() << "shard " << shard << " and whole " << whole
                             << " differ in element type or rank";
  int64_t tokens = whole.getDimSize(0) * whole.getDimSize(1);
  if (tokens % tp != 0 || shard.getDimSize(0) != 1 ||
      shard.getDimSize(1) != tokens / tp)
    return op->emitOpError()
           << "shard " << shard << " must be [1, " << tokens / tp
           << ", ...]: " << tokens << " tokens over " << tp
           << " tensor-parallel ranks"
           << (tokens % tp ? " (not a whole number each)" : "");
  for (int64_t d = 2; d < whole.getRank(); ++d)
    if (whole.getDimSize(d) != shard.getDimSize(d))
      return op->emitOpError() << "shard " << shard << " and whole " << whole
                               << " differ in dimension " << d;
  return success();
}

LogicalResult SequenceParallelGatherOp::verify() {
  return verifyTokenShard(*this, getType(), getInput().getType());
}

LogicalResult SequenceParallelScatterOp::verify() {
  return verifyTokenShard(*this, getInput().getType(), getType());
}

LogicalResult SequenceParallelShardOp::verify() {
  return verifyTokenShard(*this, getInput().getType(), getType());
}

LogicalResult TensorParallelCopyOp::verify() {
  return verifyTensorParallelOp(*this);
}

LogicalResult TensorParallelReduceOp::verify() {
  return verifyTensorParallelOp(*this);
}

//===----------------------------------------------------------------------===//
// Views
//===----------------------------------------------------------------------===//

LogicalResult ReshapeOp::verify() {
  Checker c(*this);
  auto in = getInput().getType();
  if (failed(c.sameElement("result", getType(), "input", in)))
    return failure();
  if (in.getNumElements() != getType().getNumElements())
    return emitOpError() << "result has " << getType().getNumElements()
                         << " elements, expected " << in.getNumElements()
                         << " (the input's)";
  return success();
}

LogicalResult SliceOp::verify() {
  Checker c(*this);
  auto in = getInput().getType();
  auto res = getType();
  int64_t dim = getDim();
  if (dim < 0 || dim >= in.getRank())
    return emitOpError() << "dim is " << dim << ", expected 0 to "
                         << in.getRank() - 1;
  if (res.getRank() != in.getRank())
    return emitOpError() << "result rank " << res.getRank()
                         << " must equal input rank " << in.getRank();
  if (failed(c.sameElement("result", res, "input", in)))
    return failure();
  for (int64_t d = 0; d < in.getRank(); ++d)
    if (d != dim && failed(c.dim("result", res, d, in.getDimSize(d),
                                 "the input's extent outside the sliced dim")))
      return failure();
  int64_t offset = getOffset(), size = res.getDimSize(dim);
  if (offset < 0 || offset + size > in.getDimSize(dim))
    return emitOpError() << "slice [" << offset << ", " << offset + size
                         << ") of dimension " << dim
                         << " is outside the input's extent "
                         << in.getDimSize(dim);
  return success();
}

LogicalResult ConcatOp::verify() {
  Checker c(*this);
  if (getInputs().empty())
    return emitOpError() << "needs at least one input";
  auto res = getType();
  int64_t dim = getDim();
  if (dim < 0 || dim >= res.getRank())
    return emitOpError() << "dim is " << dim << ", expected 0 to "
                         << res.getRank() - 1;
  int64_t total = 0;
  for (auto [i, v] : llvm::enumerate(getInputs())) {
    auto t = cast<RankedTensorType>(v.getType());
    std::string name = "input #" + std::to_string(i);
    if (t.getRank() != res.getRank())
      return emitOpError() << name << " has rank " << t.getRank()
                           << ", expected " << res.getRank();
    if (failed(c.sameElement(name, t, "result", res)))
      return failure();
    for (int64_t d = 0; d < res.getRank(); ++d)
      if (d != dim && failed(c.dim(name, t, d, res.getDimSize(d),
                                   "the result's extent outside dim")))
        return failure();
    total += t.getDimSize(dim);
  }
  return c.dim("result", res, dim, total, "the sum of the inputs' extents");
}

LogicalResult ExpandOp::verify() {
  Checker c(*this);
  auto in = getInput().getType();
  auto res = getType();
  if (in.getRank() != res.getRank())
    return emitOpError() << "result rank " << res.getRank()
                         << " must equal input rank " << in.getRank();
  if (failed(c.sameElement("result", res, "input", in)))
    return failure();
  for (int64_t d = 0; d < in.getRank(); ++d)
    if (in.getDimSize(d) != 1 && in.getDimSize(d) != res.getDimSize(d))
      return emitOpError() << "input dimension " << d << " is "
                           << in.getDimSize(d) << ", expected 1 or "
                           << res.getDimSize(d) << " (the result's)";
  return success();
}

//===----------------------------------------------------------------------===//
// Loss
//===----------------------------------------------------------------------===//

/// The operands both LM head ops share: hidden [B, T, D], weight [V, D] of
/// its element type, labels [B, T], chunk_tokens >= 1.
template <typename OpTy>
static LogicalResult verifyLMHeadOperands(OpTy op, Checker &c) {
  auto h = op.getHidden().getType();
  if (failed(c.sameElement("weight", op.getWeight().getType(), "hidden", h)) ||
      failed(c.dim("weight", op.getWeight().getType(), 1, h.getDimSize(2),
                   "hidden's size D; weight is [V, D]")) ||
      failed(c.dim("labels", op.getLabels().getType(), 0, h.getDimSize(0),
                   "hidden's batch B")) ||
      failed(c.dim("labels", op.getLabels().getType(), 1, h.getDimSize(1),
                   "hidden's sequence length T")))
    return failure();
  if (op.getChunkTokens() < 1)
    return op.emitOpError() << "chunk_tokens is " << op.getChunkTokens()
                            << ", expected at least 1";
  return success();
}

LogicalResult LMHeadCrossEntropyOp::verify() {
  Checker c(*this);
  if (failed(verifyLMHeadOperands(*this, c)) ||
      failed(verifyVocabParallel(*this, getVocabParallel())))
    return failure();
  auto h = getHidden().getType();
  if (Value lse = getLse()) {
    auto expected = RankedTensorType::get({h.getDimSize(0), h.getDimSize(1)},
                                          Float32Type::get(getContext()));
    if (failed(c.sameType("lse", lse.getType(), "[B, T] f32", expected)))
      return failure();
  }
  return success();
}

/// The LM head's backward forms: its operands, and a hidden gradient of
/// the hidden state's type.
template <typename OpTy> static LogicalResult verifyLMHeadGrad(OpTy op) {
  Checker c(op);
  if (failed(verifyLMHeadOperands(op, c)) ||
      failed(verifyVocabParallel(op, op.getVocabParallel())))
    return failure();
  return c.sameType("hidden_grad", op.getHiddenGrad().getType(),
                    "hidden's type", op.getHidden().getType());
}

LogicalResult LMHeadCrossEntropyWithGradOp::verify() {
  return verifyLMHeadGrad(*this);
}

LogicalResult LMHeadCrossEntropyGradOp::verify() {
  return verifyLMHeadGrad(*this);
}

LogicalResult EmbeddingGradOp::verify() {
  return verifyVocabParallel(*this, getVocabParallel());
}

//===----------------------------------------------------------------------===//
// Backward ops: main-grad effects
//===----------------------------------------------------------------------===//

namespace {
/// The FP32 main-grad buffers that backward ops accumulate into.
struct MainGradResource : public SideEffects::Resource::Base<MainGradResource> {
  StringRef getName() final { return "train.main_grads"; }
};
} // namespace

/// Ops with a gradient symbol write main grads; without one they are pure.
template <typename OpTy>
static void accumulateEffects(
    OpTy op, ArrayRef<Attribute> gradSymbols,
    SmallVectorImpl<SideEffects::EffectInstance<MemoryEffects::Effect>>
        &effects) {
  for (Attribute sym : gradSymbols)
    if (sym) {
      effects.emplace_back(MemoryEffects::Read::get(), MainGradResource::get());
      effects.emplace_back(MemoryEffects::Write::get(),
                           MainGradResource::get());
      return;
    }
}

#define AP_ACCUMULATING_EFFECTS(OP, ...)                                       \
  void OP::getEffects(                                                         \
      SmallVectorImpl<SideEffects::EffectInstance<MemoryEffects::Effect>>      \
          &effects) {                                                          \
    accumulateEffects(*this, {__VA_ARGS__}, effects);                          \
  }
AP_ACCUMULATING_EFFECTS(EmbeddingGradOp, getWeightGradAttr())
AP_ACCUMULATING_EFFECTS(LinearGradOp, getWeightGradAttr())
AP_ACCUMULATING_EFFECTS(RMSNormGradOp, getWeightGradAttr())
AP_ACCUMULATING_EFFECTS(RMSNormGradRebuildOp, getWeightGradAttr())
AP_ACCUMULATING_EFFECTS(GatedRMSNormGradOp, getWeightGradAttr())
AP_ACCUMULATING_EFFECTS(ShortConvGradOp, getWeightGradAttr())
AP_ACCUMULATING_EFFECTS(GDNGatesGradOp, getALogGradAttr(), getDtBiasGradAttr())
AP_ACCUMULATING_EFFECTS(LMHeadCrossEntropyGradOp, getWeightGradAttr())
AP_ACCUMULATING_EFFECTS(LMHeadCrossEntropyWithGradOp, getWeightGradAttr())
#undef AP_ACCUMULATING_EFFECTS

//===----------------------------------------------------------------------===//
// Placement
//===----------------------------------------------------------------------===//

LogicalResult OffloadOp::verify() {
  if (getHost().getType().getTensor() != getInput().getType())
    return emitOpError() << "host type " << getHost().getType()
                         << " must hold the input type "
                         << getInput().getType();
  return success();
}

LogicalResult ReloadOp::verify() {
  if (getHost().getType().getTensor() != getResult().getType())
    return emitOpError() << "result type " << getResult().getType()
                         << " must be the type the host slot holds, "
                         << getHost().getType().getTensor();
  if (!getHost().getDefiningOp<OffloadOp>())
    return emitOpError() << "must reload the result of a train.offload";
  for (Operation *user : getResult().getUsers())
    if (!isa<WaitOp>(user))
      return emitOpError() << "result may only be used by train.wait (the "
                              "consumer must wait for the copy), found "
                           << user->getName();
  return success();
}

LogicalResult WaitOp::verify() {
  if (!getInput().getDefiningOp<ReloadOp>())
    return emitOpError() << "must wait on the result of a train.reload";
  if (getInput().getType() != getResult().getType())
    return emitOpError() << "result type must equal the reloaded type";
  return success();
}

//===----------------------------------------------------------------------===//
// Step structure
//===----------------------------------------------------------------------===//

LogicalResult MicrobatchLoopOp::verify() {
  auto tok = getTokens().getType();
  if (getLabels().getType() != tok)
    return emitOpError() << "labels have type " << getLabels().getType()
                         << ", expected " << tok << " (the type of tokens)";
  Block &body = getBody().front();
  auto mb =
      RankedTensorType::get(tok.getShape().drop_front(), tok.getElementType());
  if (body.getNumArguments() != 2 || body.getArgument(0).getType() != mb ||
      body.getArgument(1).getType() != mb)
    return emitOpError() << "body must take one microbatch's tokens and "
                            "labels, two arguments of type "
                         << mb;
  return success();
}

LogicalResult YieldOp::verify() {
  // A stage without the LM head yields nothing; otherwise the loss sum and
  // the token count, in that order.
  if (getValues().empty())
    return success();
  auto isScalar = [](Value v, Type elt) {
    auto t = dyn_cast<RankedTensorType>(v.getType());
    return t && t.getRank() == 0 && t.getElementType() == elt;
  };
  Builder b(getContext());
  if (getValues().size() != 2 || !isScalar(getValues()[0], b.getF32Type()) ||
      !isScalar(getValues()[1], b.getI32Type()))
    return emitOpError() << "yields " << getValues().size()
                         << " values; expected none (a pipeline stage "
                            "without the loss) or the loss sum "
                            "(tensor<f32>) and the token count (tensor<i32>)";
  return success();
}

#define GET_OP_CLASSES
#include "dialect/train/TrainOps.cpp.inc"
