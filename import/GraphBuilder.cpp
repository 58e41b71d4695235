//===- GraphBuilder.cpp - model config -> train forward graph -------------===//

#include "import/GraphBuilder.h"

#include "dialect/train/TrainOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"

#include <cmath>

using namespace mlir;
using namespace ap::train;
using namespace ap::import;

namespace {

class GraphEmitter {
public:
  GraphEmitter(MLIRContext &ctx, const ModelConfig &cfg,
               const TrainShape &shape)
      : ctx(ctx), cfg(cfg), shape(shape), b(&ctx), loc(UnknownLoc::get(&ctx)) {
    act = shape.dtype == "f32" ? Type(b.getF32Type()) : Type(b.getBF16Type());
    B = shape.microBatchSize;
    T = shape.seqLen;
    D = cfg.hiddenSize;
    tp = shape.tensorParallel;
    sp = shape.sequenceParallel && tp > 1;
  }

  OwningOpRef<ModuleOp> build();

private:
  // Types and attributes.
  RankedTensorType tensor(ArrayRef<int64_t> dims, Type elt = {}) {
    return RankedTensorType::get(dims, elt ? elt : act);
  }
  ScopeAttr scope(int64_t layer, StringRef leaf) {
    return ScopeAttr::get(&ctx, layer, leaf);
  }
  FloatAttr f64(double v) { return b.getF64FloatAttr(v); }

  // Parameters: declared at module level, referenced where used.
  Value param(StringRef name, ArrayRef<int64_t> dims, InitKind kind,
              double a = 0.0, double c = 0.0, Type elt = {});
  Value linearWeight(StringRef name, int64_t out, int64_t in) {
    return param(name, {out, in}, InitKind::Normal, 0.0, cfg.initializerRange);
  }
  /// A parameter each tensor-parallel rank holds part of: `dims` are the
  /// whole tensor's, split along `dim` whose whole extent is the sum of
  /// `segments` (rank r holds block r of every segment).
  Value splitParam(StringRef name, SmallVector<int64_t> dims, int64_t dim,
                   ArrayRef<int64_t> segments, InitKind kind, double a = 0.0,
                   double c = 0.0, Type elt = {});
  /// A column-parallel projection's weight [out, in]: its output rows split
  /// by `segments`.
  Value columnWeight(StringRef name, ArrayRef<int64_t> segments, int64_t in) {
    int64_t out = 0;
    for (int64_t s : segments)
      out += s;
    return splitParam(name, {out, in}, 0, segments, InitKind::Normal, 0.0,
                      cfg.initializerRange);
  }
  /// A row-parallel projection's weight [out, in]: its input columns split.
  Value rowWeight(StringRef name, int64_t out, int64_t in) {
    return splitParam(name, {out, in}, 1, {in}, InitKind::Normal, 0.0,
                      cfg.initializerRange);
  }
  /// Megatron's f (enter a tensor-parallel region) and g (leave it);
  /// both the identity without tensor parallelism.
  Value tpCopy(Value x, int64_t layer, StringRef leaf) {
    if (tp == 1)
      return x;
    return TensorParallelCopyOp::create(b, loc, x.getType(), x,
                                        scope(layer, leaf));
  }
  Value tpReduce(Value x, int64_t layer, StringRef leaf) {
    if (tp == 1)
      return x;
    return TensorParallelReduceOp::create(b, loc, x.getType(), x,
                                          scope(layer, leaf));
  }
  /// A tensor-parallel region's entry and exit: f and g, or with sequence
  /// parallelism the all-gather of the token shards [1, N/T, d] into
  /// [B, T, d] and the reduce-scatter back.
  Value enterRegion(Value x, int64_t layer, StringRef leaf) {
    if (!sp)
      return tpCopy(x, layer, leaf);
    int64_t d = cast<RankedTensorType>(x.getType()).getShape().back();
    return SequenceParallelGatherOp::create(b, loc, tensor({B, T, d}), x,
                                            scope(layer, leaf));
  }
  Value leaveRegion(Value x, int64_t layer, StringRef leaf) {
    if (!sp)
      return tpReduce(x, layer, leaf);
    return SequenceParallelScatterOp::create(b, loc, residualType(), x,
                                             scope(layer, leaf));
  }
  /// Inside a region entered through sp_gather every rank computes the
  /// replicated values on the whole sequence, and their gradients stay
  /// partial until the gather's reduce-scatter sums them: no f there.
  Value innerCopy(Value x, int64_t layer, StringRef leaf) {
    return sp ? x : tpCopy(x, layer, leaf);
  }
  /// The residual stream: [B, T, D], or this rank's [1, N/T, D] tokens.
  RankedTensorType residualType() {
    return sp ? tensor({1, B * T / tp, D}) : tensor({B, T, D});
  }
  /// Under sequence parallelism a replicated parameter applied to the
  /// rank's tokens only (norms between regions, the embedding, the LM head)
  /// has a partial gradient: summed over the ranks.
  void tokenLocal(StringRef name) {
    if (sp)
      gradSumParams.insert(name);
  }
  Value modelNormWeight(StringRef name, int64_t dim) {
    // (1 + w) norms start at w = 0, plain norms at w = 1: both the identity.
    return param(name, {dim},
                 cfg.zeroCenteredNorms ? InitKind::Zeros : InitKind::Ones);
  }

  // Op helpers.
  Value linear(Value x, Value w, int64_t layer, StringRef leaf) {
    auto xt = cast<RankedTensorType>(x.getType());
    SmallVector<int64_t> dims(xt.getShape());
    dims.back() = cast<RankedTensorType>(w.getType()).getDimSize(0);
    return LinearOp::create(b, loc, tensor(dims), x, w, scope(layer, leaf));
  }
  Value reshape(Value x, ArrayRef<int64_t> dims, int64_t layer,
                StringRef leaf) {
    return ReshapeOp::create(b, loc, tensor(dims), x, scope(layer, leaf));
  }
  Value slice(Value x, int64_t dim, int64_t offset, int64_t size, int64_t layer,
              StringRef leaf) {
    auto xt = cast<RankedTensorType>(x.getType());
    SmallVector<int64_t> dims(xt.getShape());
    dims[dim] = size;
    return SliceOp::create(b, loc, tensor(dims), x, dim, offset,
                           scope(layer, leaf));
  }
  Value rmsNorm(Value x, Value w, bool zeroCentered, int64_t layer,
                StringRef leaf) {
    return RMSNormOp::create(
               b, loc, x.getType(), /*rstd=*/Type(), x, w, f64(cfg.rmsNormEps),
               zeroCentered ? b.getUnitAttr() : UnitAttr(), scope(layer, leaf))
        .getResult();
  }
  Value add(Value x, Value y, int64_t layer, StringRef leaf) {
    return AddOp::create(b, loc, x.getType(), x, y, scope(layer, leaf));
  }

  // Blocks; each returns the new residual stream.
  Value gdnBlock(Value h, int64_t i);
  Value attentionBlock(Value h, int64_t i);
  Value mlaBlock(Value h, int64_t i);
  Value mlpBlock(Value h, int64_t i, bool afterMixer);

  std::string layerName(int64_t i, StringRef rest) {
    return ("model.layers." + llvm::Twine(i) + "." + rest).str();
  }

  MLIRContext &ctx;
  const ModelConfig &cfg;
  const TrainShape &shape;
  OpBuilder b;
  Location loc;
  Type act;
  int64_t B, T, D;
  /// Tensor-parallel ranks: head and channel counts below are per rank.
  int64_t tp = 1;
  /// Sequence parallelism (with tp > 1).
  bool sp = false;
  /// Packed sequences: the train.doc_starts of the microbatch (null when
  /// every row is one sequence).
  Value docStarts;
  /// The replicated parameters ranks apply to their own heads only.
  llvm::StringSet<> gradSumParams;
  ModuleOp module;
  /// Insertion point for parameter declarations (before the function).
  Operation *funcOp = nullptr;
};

Value GraphEmitter::param(StringRef name, ArrayRef<int64_t> dims, InitKind kind,
                          double a, double c, Type elt) {
  RankedTensorType type = tensor(dims, elt);
  bool frozen = llvm::any_of(shape.freezePrefixes, [&](const std::string &p) {
    return name.starts_with(p);
  });
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(funcOp);
    auto init = InitAttr::get(&ctx, kind, llvm::APFloat(a), llvm::APFloat(c));
    ParamOp::create(b, loc, b.getStringAttr(name), TypeAttr::get(type), init,
                    frozen ? b.getUnitAttr() : UnitAttr(), IntegerAttr(),
                    DenseI64ArrayAttr(),
                    gradSumParams.contains(name) ? b.getUnitAttr()
                                                 : UnitAttr());
  }
  return ParamRefOp::create(b, loc, type, FlatSymbolRefAttr::get(&ctx, name));
}

Value GraphEmitter::splitParam(StringRef name, SmallVector<int64_t> dims,
                               int64_t dim, ArrayRef<int64_t> segments,
                               InitKind kind, double a, double c, Type elt) {
  if (tp == 1)
    return param(name, dims, kind, a, c, elt);
  dims[dim] /= tp;
  Value ref = param(name, dims, kind, a, c, elt);
  auto decl = cast<ParamOp>(module.lookupSymbol(name));
  decl.setTpDimAttr(b.getI64IntegerAttr(dim));
  decl.setTpSegmentsAttr(b.getDenseI64ArrayAttr(segments));
  return ref;
}

Value GraphEmitter::gdnBlock(Value h, int64_t i) {
  // Per rank: key heads hk, value heads hv (tensor parallelism splits both,
  // so value head j still reads key head j / (hv / hk)).
  int64_t hkAll = cfg.linearKeyHeads, hvAll = cfg.linearValueHeads;
  int64_t hk = hkAll / tp, hv = hvAll / tp;
  int64_t dk = cfg.linearKeyHeadDim, dv = cfg.linearValueHeadDim;
  // q, k and v channels of the fused projection and the conv, whole.
  SmallVector<int64_t> qkv{hkAll * dk, hkAll * dk, hvAll * dv};
  std::string p = layerName(i, "linear_attn.");

  tokenLocal(layerName(i, "input_layernorm.weight"));
  Value x =
      rmsNorm(h, modelNormWeight(layerName(i, "input_layernorm.weight"), D),
              cfg.zeroCenteredNorms, i, "attn_norm");
  x = enterRegion(x, i, "gdn_in_proj");
  Value mixed = linear(x, columnWeight(p + "in_proj_qkv.weight", qkv, D), i,
                       "gdn_in_proj");
  Value z = linear(x, columnWeight(p + "in_proj_z.weight", {hvAll * dv}, D), i,
                   "gdn_in_proj");
  z = reshape(z, {B, T, hv, dv}, i, "gdn_in_proj");
  Value bLogits = linear(x, columnWeight(p + "in_proj_b.weight", {hvAll}, D), i,
                         "gdn_in_proj");
  Value aLogits = linear(x, columnWeight(p + "in_proj_a.weight", {hvAll}, D), i,
                         "gdn_in_proj");

  Value convW = splitParam(p + "conv1d.weight",
                           {2 * hkAll * dk + hvAll * dv, cfg.linearConvKernel},
                           0, qkv, InitKind::Normal, 0.0, cfg.initializerRange);
  // q, k and v come out of the conv in their own tensors (its split
  // output): no slice copies, and no concat of their gradients.
  auto conv = ShortConvOp::create(
      b, loc,
      TypeRange{tensor({B, T, hk * dk}), tensor({B, T, hk * dk}),
                tensor({B, T, hv * dv})},
      mixed, convW, docStarts, scope(i, "gdn_prep"));
  Value q = reshape(conv.getOutputs()[0], {B, T, hk, dk}, i, "gdn_prep");
  Value k = reshape(conv.getOutputs()[1], {B, T, hk, dk}, i, "gdn_prep");
  Value v = reshape(conv.getOutputs()[2], {B, T, hv, dv}, i, "gdn_prep");

  // The L2 norm eps sits inside the square root (docs/model-math.md 1.2).
  Value qn = L2NormOp::create(b, loc, q.getType(), Type(), q, f64(1e-6),
                              scope(i, "gdn_core_attn"))
                 .getResult();
  Value kn = L2NormOp::create(b, loc, k.getType(), Type(), k, f64(1e-6),
                              scope(i, "gdn_core_attn"))
                 .getResult();
  Type f32 = b.getF32Type();
  Value aLog = splitParam(p + "A_log", {hvAll}, 0, {hvAll},
                          InitKind::LogUniform, 0.01, 16.0, f32);
  Value dtBias = splitParam(p + "dt_bias", {hvAll}, 0, {hvAll}, InitKind::Ones,
                            0.0, 0.0, f32);
  auto gates = GDNGatesOp::create(b, loc, tensor({B, T, hv}, f32),
                                  tensor({B, T, hv}), aLogits, bLogits, aLog,
                                  dtBias, scope(i, "gdn_core_attn"));
  Value o = GatedDeltaRuleOp::create(
                b, loc, v.getType(), TypeRange(), qn, kn, v, gates.getG(),
                gates.getBeta(), docStarts,
                f64(1.0 / std::sqrt(static_cast<double>(dk))),
                b.getI64IntegerAttr(64), scope(i, "gdn_core_attn"))
                .getResult();

  // One norm weight for every head: each rank applies it to its own heads.
  if (tp > 1)
    gradSumParams.insert(p + "norm.weight");
  Value normW = param(p + "norm.weight", {dv}, InitKind::Ones);
  Value yn =
      GatedRMSNormOp::create(b, loc, o.getType(), Type(), o, z, normW,
                             f64(cfg.rmsNormEps), scope(i, "gdn_norm_out"))
          .getResult();
  yn = reshape(yn, {B, T, hv * dv}, i, "gdn_norm_out");
  Value out = linear(yn, rowWeight(p + "out_proj.weight", D, hvAll * dv), i,
                     "gdn_out_proj");
  out = leaveRegion(out, i, "gdn_out_proj");
  return add(h, out, i, "gdn_out_proj");
}

Value GraphEmitter::attentionBlock(Value h, int64_t i) {
  // Per rank: q heads hq, kv heads hkv (query head j reads kv head
  // j / (hq / hkv) on every rank alike).
  int64_t hqAll = cfg.numHeads, hkvAll = cfg.numKvHeads, hd = cfg.headDim;
  int64_t hq = hqAll / tp, hkv = hkvAll / tp;
  std::string p = layerName(i, "self_attn.");
  tokenLocal(layerName(i, "input_layernorm.weight"));
  Value x =
      rmsNorm(h, modelNormWeight(layerName(i, "input_layernorm.weight"), D),
              cfg.zeroCenteredNorms, i, "attn_norm");
  x = enterRegion(x, i, "qkv_linear");

  // With the output gate, q_proj emits [q | gate] per head.
  int64_t qWidth = cfg.attnOutputGate ? 2 * hd : hd;
  Value qg = linear(x, columnWeight(p + "q_proj.weight", {hqAll * qWidth}, D),
                    i, "qkv_linear");
  qg = reshape(qg, {B, T, hq, qWidth}, i, "qkv_linear");
  Value q = cfg.attnOutputGate ? slice(qg, 3, 0, hd, i, "qkv_linear") : qg;
  Value gate =
      cfg.attnOutputGate ? slice(qg, 3, hd, hd, i, "qkv_linear") : Value();
  Value k =
      reshape(linear(x, columnWeight(p + "k_proj.weight", {hkvAll * hd}, D), i,
                     "qkv_linear"),
              {B, T, hkv, hd}, i, "qkv_linear");
  Value v =
      reshape(linear(x, columnWeight(p + "v_proj.weight", {hkvAll * hd}, D), i,
                     "qkv_linear"),
              {B, T, hkv, hd}, i, "qkv_linear");
  // The q and k norms are per head dim, shared by every head.
  if (tp > 1) {
    gradSumParams.insert(p + "q_norm.weight");
    gradSumParams.insert(p + "k_norm.weight");
  }
  q = rmsNorm(q, modelNormWeight(p + "q_norm.weight", hd),
              cfg.zeroCenteredNorms, i, "qkv_linear");
  k = rmsNorm(k, modelNormWeight(p + "k_norm.weight", hd),
              cfg.zeroCenteredNorms, i, "qkv_linear");
  auto rd = b.getI64IntegerAttr(cfg.rotaryDim());
  q = RoPEOp::create(b, loc, q.getType(), q, docStarts, rd, f64(cfg.ropeTheta),
                     scope(i, "qkv_linear"));
  k = RoPEOp::create(b, loc, k.getType(), k, docStarts, rd, f64(cfg.ropeTheta),
                     scope(i, "qkv_linear"));
  Value o = AttentionOp::create(b, loc, tensor({B, T, hq, hd}), Type(), q, k, v,
                                docStarts,
                                f64(1.0 / std::sqrt(static_cast<double>(hd))),
                                scope(i, "core_attn"))
                .getResult();
  if (gate)
    o = OutputGateOp::create(b, loc, o.getType(), o, gate,
                             scope(i, "attn_proj"));
  o = reshape(o, {B, T, hq * hd}, i, "attn_proj");
  Value out =
      linear(o, rowWeight(p + "o_proj.weight", D, hqAll * hd), i, "attn_proj");
  out = leaveRegion(out, i, "attn_proj");
  return add(h, out, i, "attn_proj");
}

Value GraphEmitter::mlaBlock(Value h, int64_t i) {
  // Per rank: n heads. The latent down projections, their norms and the
  // shared rotary key are replicated; the up projections are
  // column-parallel by head and o_proj row-parallel.
  int64_t nAll = cfg.numHeads, n = nAll / tp;
  int64_t dn = cfg.qkNopeHeadDim, dr = cfg.qkRopeHeadDim;
  int64_t dvh = cfg.vHeadDim, kvl = cfg.kvLoraRank;
  std::string p = layerName(i, "self_attn.");
  auto plainNorm = [&](StringRef name, int64_t dim) {
    return param(name, {dim}, InitKind::Ones);
  };
  tokenLocal(layerName(i, "input_layernorm.weight"));
  Value x =
      rmsNorm(h, modelNormWeight(layerName(i, "input_layernorm.weight"), D),
              cfg.zeroCenteredNorms, i, "attn_norm");
  // Sequence parallel: the whole region, the replicated latents included,
  // runs on the gathered sequence; their gradients are partial (each rank's
  // heads) until the gather's reduce-scatter, so their weights' are summed.
  if (sp) {
    x = enterRegion(x, i, "qkv_linear");
    for (StringRef w : {"q_a_proj.weight", "q_a_layernorm.weight",
                        "kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight"})
      gradSumParams.insert(p + w.str());
  }

  // Queries: down projection + latent norm (qkv_linear), up projection and
  // RoPE (mla_up_proj); without q_lora a single projection.
  Value q;
  if (cfg.qLoraRank) {
    Value cq = linear(x, linearWeight(p + "q_a_proj.weight", *cfg.qLoraRank, D),
                      i, "qkv_linear");
    cq = rmsNorm(cq, plainNorm(p + "q_a_layernorm.weight", *cfg.qLoraRank),
                 false, i, "qkv_linear");
    cq = innerCopy(cq, i, "mla_up_proj");
    q = linear(
        cq,
        columnWeight(p + "q_b_proj.weight", {nAll * (dn + dr)}, *cfg.qLoraRank),
        i, "mla_up_proj");
  } else {
    q = linear(innerCopy(x, i, "qkv_linear"),
               columnWeight(p + "q_proj.weight", {nAll * (dn + dr)}, D), i,
               "qkv_linear");
  }
  q = reshape(q, {B, T, n, dn + dr}, i, "mla_up_proj");
  Value qNope = slice(q, 3, 0, dn, i, "mla_up_proj");
  Value qPe = slice(q, 3, dn, dr, i, "mla_up_proj");
  auto rd = b.getI64IntegerAttr(dr);
  qPe = RoPEOp::create(b, loc, qPe.getType(), qPe, docStarts, rd,
                       f64(cfg.ropeTheta), scope(i, "mla_up_proj"));
  Value qFull =
      ConcatOp::create(b, loc, tensor({B, T, n, dn + dr}),
                       ValueRange{qNope, qPe}, 3, scope(i, "mla_up_proj"));

  // Keys and values: compressed latent + shared rotary key (qkv_linear).
  Value kva =
      linear(x, linearWeight(p + "kv_a_proj_with_mqa.weight", kvl + dr, D), i,
             "qkv_linear");
  Value ckv = slice(kva, 2, 0, kvl, i, "qkv_linear");
  Value kPe = reshape(slice(kva, 2, kvl, dr, i, "qkv_linear"), {B, T, 1, dr}, i,
                      "qkv_linear");
  ckv = rmsNorm(ckv, plainNorm(p + "kv_a_layernorm.weight", kvl), false, i,
                "qkv_linear");
  ckv = innerCopy(ckv, i, "mla_up_proj");
  Value kv = linear(
      ckv, columnWeight(p + "kv_b_proj.weight", {nAll * (dn + dvh)}, kvl), i,
      "mla_up_proj");
  kv = reshape(kv, {B, T, n, dn + dvh}, i, "mla_up_proj");
  Value kNope = slice(kv, 3, 0, dn, i, "mla_up_proj");
  Value v = slice(kv, 3, dn, dvh, i, "mla_up_proj");
  kPe = RoPEOp::create(b, loc, kPe.getType(), kPe, docStarts, rd,
                       f64(cfg.ropeTheta), scope(i, "mla_up_proj"));
  // Every rank's heads read the shared rotary key: its gradient is summed.
  kPe = innerCopy(kPe, i, "mla_up_proj");
  kPe = ExpandOp::create(b, loc, tensor({B, T, n, dr}), kPe,
                         scope(i, "mla_up_proj"));
  Value kFull =
      ConcatOp::create(b, loc, tensor({B, T, n, dn + dr}),
                       ValueRange{kNope, kPe}, 3, scope(i, "mla_up_proj"));

  Value o = AttentionOp::create(
                b, loc, tensor({B, T, n, dvh}), Type(), qFull, kFull, v,
                docStarts, f64(1.0 / std::sqrt(static_cast<double>(dn + dr))),
                scope(i, "core_attn"))
                .getResult();
  o = reshape(o, {B, T, n * dvh}, i, "attn_proj");
  Value out =
      linear(o, rowWeight(p + "o_proj.weight", D, nAll * dvh), i, "attn_proj");
  out = leaveRegion(out, i, "attn_proj");
  return add(h, out, i, "attn_proj");
}

Value GraphEmitter::mlpBlock(Value h, int64_t i, bool afterMixer) {
  int64_t interAll = cfg.intermediateSize;
  std::string p = layerName(i, "mlp.");
  // An MLP-only layer's norm is its input norm.
  std::string normName =
      layerName(i, afterMixer ? "post_attention_layernorm.weight"
                              : "input_layernorm.weight");
  tokenLocal(normName);
  Value x = rmsNorm(h, modelNormWeight(normName, D), cfg.zeroCenteredNorms, i,
                    "mlp_norm");
  x = enterRegion(x, i, "mlp_fc1");
  Value gate = linear(x, columnWeight(p + "gate_proj.weight", {interAll}, D), i,
                      "mlp_fc1");
  Value up = linear(x, columnWeight(p + "up_proj.weight", {interAll}, D), i,
                    "mlp_fc1");
  Value a =
      SwiGLUOp::create(b, loc, gate.getType(), gate, up, scope(i, "mlp_act"));
  Value out =
      linear(a, rowWeight(p + "down_proj.weight", D, interAll), i, "mlp_fc2");
  out = leaveRegion(out, i, "mlp_fc2");
  return add(h, out, i, "mlp_fc2");
}

OwningOpRef<ModuleOp> GraphEmitter::build() {
  OwningOpRef<ModuleOp> owned = ModuleOp::create(loc);
  module = *owned;
  std::string name = !shape.modelName.empty() ? shape.modelName : cfg.name;
  if (!name.empty())
    module->setAttr(kModelNameAttrName, b.getStringAttr(name));
  module->setAttr(kMicroBatchesAttrName,
                  b.getI64IntegerAttr(shape.microBatches));
  if (tp > 1)
    module->setAttr(kTensorParallelAttrName, b.getI64IntegerAttr(tp));
  if (sp)
    module->setAttr(kSequenceParallelAttrName, b.getUnitAttr());
  SmallVector<NamedAttribute> fields;
  for (const auto &[field, value] : cfg.computeFields())
    fields.push_back(b.getNamedAttr(field, b.getStringAttr(value)));
  module->setAttr(kModelConfigAttrName, b.getDictionaryAttr(fields));

  b.setInsertionPointToEnd(module.getBody());
  auto tokensType = RankedTensorType::get({B, T}, b.getI32Type());
  auto lossType = RankedTensorType::get({}, b.getF32Type());
  auto countType = RankedTensorType::get({}, b.getI32Type());
  auto func = func::FuncOp::create(
      b, loc, "forward",
      b.getFunctionType({tokensType, tokensType}, {lossType, countType}));
  func.setArgAttr(0, "train.input", b.getStringAttr("tokens"));
  func.setArgAttr(1, "train.input", b.getStringAttr("labels"));
  funcOp = func;
  Block *body = func.addEntryBlock();
  b.setInsertionPointToStart(body);

  // Tensor parallelism splits the vocabulary (Megatron's vocab-parallel
  // embedding and LM head): each rank holds a block of the table's rows,
  // looks up the ids of its rows and sums the ranks' lookups as a
  // row-parallel projection does (with sequence parallelism the sum is a
  // reduce-scatter onto the rank's tokens). The ids are the whole
  // microbatch's on every rank.
  Value tokens = body->getArgument(0), labels = body->getArgument(1);
  // Packed sequences: the documents' starts, from the separators in the
  // ids, for every op that mixes tokens along the sequence (the ids are
  // the whole microbatch's on every tensor-parallel rank, so the starts
  // are too).
  if (shape.documentSeparator >= 0)
    docStarts = DocStartsOp::create(
        b, loc, tokens.getType(), tokens,
        b.getI64IntegerAttr(shape.documentSeparator), scope(-1, "embedding"));
  tokenLocal("model.norm.weight");
  Value embed = tp > 1 ? splitParam("model.embed_tokens.weight",
                                    {cfg.vocabSize, D}, 0, {cfg.vocabSize},
                                    InitKind::Normal, 0.0, cfg.initializerRange)
                       : param("model.embed_tokens.weight", {cfg.vocabSize, D},
                               InitKind::Normal, 0.0, cfg.initializerRange);
  Value h = EmbeddingOp::create(b, loc, tensor({B, T, D}), tokens, embed,
                                scope(-1, "embedding"),
                                tp > 1 ? b.getUnitAttr() : UnitAttr());
  h = leaveRegion(h, -1, "embedding");
  for (auto [i, layer] : llvm::enumerate(cfg.layers)) {
    int64_t idx = static_cast<int64_t>(i);
    switch (layer.mixer) {
    case Mixer::GatedDeltaNet:
      h = gdnBlock(h, idx);
      break;
    case Mixer::Attention:
      h = attentionBlock(h, idx);
      break;
    case Mixer::Mla:
      h = mlaBlock(h, idx);
      break;
    case Mixer::None:
      break;
    }
    if (layer.hasMlp)
      h = mlpBlock(h, idx, layer.mixer != Mixer::None);
  }
  h = rmsNorm(h, modelNormWeight("model.norm.weight", D), cfg.zeroCenteredNorms,
              -1, "final_norm");
  Value head = embed;
  if (!cfg.tieWordEmbeddings)
    head = tp > 1 ? splitParam("lm_head.weight", {cfg.vocabSize, D}, 0,
                               {cfg.vocabSize}, InitKind::Normal, 0.0,
                               cfg.initializerRange)
                  : param("lm_head.weight", {cfg.vocabSize, D},
                          InitKind::Normal, 0.0, cfg.initializerRange);
  // The vocab-parallel LM head reads the whole sequence on every rank (an
  // all-gather of the token shards with sequence parallelism) and its
  // hidden gradient is a partial sum: Megatron's f, or the gather whose
  // gradient is the reduce-scatter.
  h = enterRegion(h, -1, "lm_head");
  auto ce = LMHeadCrossEntropyOp::create(
      b, loc, lossType, countType, /*lse=*/Type(), h, head, labels,
      b.getI64IntegerAttr(shape.lossChunkTokens), b.getI64IntegerAttr(-100),
      scope(-1, "lm_head"), tp > 1 ? b.getUnitAttr() : UnitAttr());
  func::ReturnOp::create(b, loc,
                         ValueRange{ce.getLossSum(), ce.getTokenCount()});

  if (failed(verify(module)))
    return nullptr;
  return owned;
}

} // namespace

OwningOpRef<ModuleOp> ap::import::buildForwardGraph(MLIRContext &ctx,
                                                    const ModelConfig &cfg,
                                                    const TrainShape &shape) {
  ctx.loadDialect<TrainDialect, func::FuncDialect>();
  return GraphEmitter(ctx, cfg, shape).build();
}

llvm::Error ap::import::checkTrainShape(const TrainShape &shape) {
  auto error = [](const llvm::Twine &msg) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
  };
  for (auto [name, value] :
       {std::pair<const char *, int64_t>{"--seq", shape.seqLen},
        {"--micro-batch-size", shape.microBatchSize},
        {"--micro-batches", shape.microBatches},
        {"--loss-chunk-tokens", shape.lossChunkTokens}})
    if (value < 1 || value > kMaxStepTokens)
      return error(llvm::Twine(name) + " must be in [1, " +
                   llvm::Twine(kMaxStepTokens) + "], got " +
                   llvm::Twine(value));
  // Each factor is below 2^31, so neither product overflows.
  int64_t perMicrobatch = shape.seqLen * shape.microBatchSize;
  if (perMicrobatch > kMaxStepTokens ||
      perMicrobatch * shape.microBatches > kMaxStepTokens)
    return error("tokens per step (--seq " + llvm::Twine(shape.seqLen) +
                 " x --micro-batch-size " + llvm::Twine(shape.microBatchSize) +
                 " x --micro-batches " + llvm::Twine(shape.microBatches) +
                 ") must be at most " + llvm::Twine(kMaxStepTokens) +
                 " (the step counts its tokens in an i32)");
  return llvm::Error::success();
}

llvm::Error ap::import::checkDocumentSeparator(const ModelConfig &cfg,
                                               const TrainShape &shape) {
  int64_t sep = shape.documentSeparator;
  if (sep == -1 || (sep >= 0 && sep < cfg.vocabSize))
    return llvm::Error::success();
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      "--document-separator=" + llvm::Twine(sep) +
          ": expected a token id in [0, " + llvm::Twine(cfg.vocabSize) +
          ") (the config's vocab_size), or -1 for one sequence per row");
}

llvm::Error ap::import::checkTensorParallel(const ModelConfig &cfg,
                                            const TrainShape &shape) {
  int64_t tp = shape.tensorParallel;
  auto error = [&](const llvm::Twine &msg) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "--tensor-parallel=" + llvm::Twine(tp) +
                                       ": " + msg);
  };
  if (tp < 1 || tp > 1024)
    return error("expected a size in [1, 1024]");
  if (shape.sequenceParallel && tp == 1)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "--sequence-parallel needs "
                                   "--tensor-parallel of at least 2 (the "
                                   "ranks the tokens are split over)");
  if (tp == 1)
    return llvm::Error::success();
  if (shape.sequenceParallel && (shape.microBatchSize * shape.seqLen) % tp != 0)
    return error("--sequence-parallel splits a microbatch's " +
                 llvm::Twine(shape.microBatchSize * shape.seqLen) +
                 " tokens (--micro-batch-size x --seq) over the ranks; they "
                 "are not a multiple of the tensor-parallel size");
  // Each field tensor parallelism splits, with the layers that use it.
  bool attention = false, mla = false, gdn = false, mlp = false;
  for (const auto &layer : cfg.layers) {
    attention |= layer.mixer == Mixer::Attention;
    mla |= layer.mixer == Mixer::Mla;
    gdn |= layer.mixer == Mixer::GatedDeltaNet;
    mlp |= layer.hasMlp;
  }
  SmallVector<std::pair<const char *, int64_t>> fields;
  if (attention || mla)
    fields.push_back({"num_attention_heads", cfg.numHeads});
  // kv heads are split, not replicated: more ranks than kv heads would
  // need copies of a kv head on several ranks (and their gradients summed).
  if (attention)
    fields.push_back({"num_key_value_heads", cfg.numKvHeads});
  if (gdn) {
    fields.push_back({"linear_num_key_heads", cfg.linearKeyHeads});
    fields.push_back({"linear_num_value_heads", cfg.linearValueHeads});
  }
  if (mlp)
    fields.push_back({"intermediate_size", cfg.intermediateSize});
  // The embedding and LM head split the vocabulary's rows.
  fields.push_back({"vocab_size", cfg.vocabSize});
  for (auto [field, value] : fields)
    if (value % tp != 0)
      return error(llvm::Twine("the model's ") + field + " (" +
                   llvm::Twine(value) +
                   ") is not a multiple of the tensor-parallel size; each "
                   "rank takes an equal share of it");
  return llvm::Error::success();
}
