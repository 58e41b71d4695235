//===- KernelSignatures.cpp - What each exec.kernel callee takes ----------===//
#include "dialect/exec/KernelSignatures.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/Twine.h"

using namespace mlir;
using namespace ap::exec;

namespace {
using K = KernelArgKind;
constexpr bool req = true, opt = false;

// Arguments shared by several kernels.
const KernelArgSpec kEps[] = {{"eps", K::Float, req}};
const KernelArgSpec kNorm[] = {{"eps", K::Float, req},
                               {"zero_centered", K::Flag, opt}};
const KernelArgSpec kNormGrad[] = {{"weight_grad", K::Symbol, opt},
                                   {"zero_centered", K::Flag, opt}};
const KernelArgSpec kWeightGrad[] = {{"weight_grad", K::Symbol, opt}};
const KernelArgSpec kScale[] = {{"scale", K::Float, req}};
const KernelArgSpec kChunk[] = {{"scale", K::Float, req},
                                {"chunk_size", K::Int, req}};
const KernelArgSpec kGates[] = {{"a_log_grad", K::Symbol, opt},
                                {"dt_bias_grad", K::Symbol, opt}};
const KernelArgSpec kRope[] = {{"rotary_dim", K::Int, req},
                               {"theta", K::Float, req}};
const KernelArgSpec kSlice[] = {{"dim", K::Int, req}, {"offset", K::Int, req}};
const KernelArgSpec kConcat[] = {{"dim", K::Int, req}};
const KernelArgSpec kLmHead[] = {{"chunk_tokens", K::Int, req},
                                 {"ignore_index", K::Int, req},
                                 {"weight_grad", K::Symbol, opt}};
const KernelArgSpec kSeparator[] = {{"separator", K::Int, req}};
const KernelArgSpec kFinalize[] = {{"max_norm", K::Float, req}};
const KernelArgSpec kLr[] = {{"max_lr", K::Float, req},
                             {"min_lr", K::Float, req},
                             {"warmup_steps", K::Int, req},
                             {"total_steps", K::Int, req}};
const KernelArgSpec kAdamW[] = {{"param", K::Symbol, req},
                                {"beta1", K::Float, req},
                                {"beta2", K::Float, req},
                                {"eps", K::Float, req},
                                {"weight_decay", K::Float, req}};

// Inputs and results (outputs before the main grads) per callee, from the
// kernels' argument structs (kernels/*.h) as the emitter fills them.
// The ops that mix tokens along the sequence take one more input under
// packed sequences: the i32 document starts (train.doc_starts), last.
const KernelSignature kSignatures[] = {
    {"train.embedding", 2, 2, 1, 1, {}},
    {"train.embedding_grad", 2, 2, 0, 0, kWeightGrad},
    {"train.doc_starts", 1, 1, 1, 1, kSeparator},
    {"train.rms_norm", 2, 2, 2, 2, kNorm},
    {"train.rms_norm_grad", 4, 4, 0, 1, kNormGrad},
    // The norm's output rebuilt in its backward (train-fuse-recompute).
    {"train.rms_norm_grad_rebuild", 4, 4, 1, 2, kNormGrad},
    {"train.linear", 2, 2, 1, 1, {}},
    {"train.linear_grad", 3, 3, 0, 1, kWeightGrad},
    {"train.linear_input_grad", 2, 2, 1, 1, {}},
    {"train.short_conv", 2, 3, 1, 4, {}},
    {"train.short_conv_grad", 3, 7, 0, 1, kWeightGrad},
    {"train.slice", 1, 1, 1, 1, kSlice},
    {"train.concat", 1, -1, 1, 1, kConcat},
    {"train.expand", 1, 1, 1, 1, {}},
    {"train.expand_grad", 1, 1, 1, 1, {}},
    {"train.l2_norm", 1, 1, 2, 2, kEps},
    {"train.l2_norm_grad", 3, 3, 1, 1, {}},
    {"train.gdn_gates", 4, 4, 2, 2, {}},
    {"train.gdn_gates_grad", 7, 7, 2, 2, kGates},
    {"train.gated_delta_rule", 5, 6, 3, 3, kChunk},
    {"train.gated_delta_rule_grad", 7, 8, 5, 5, kChunk},
    {"train.gated_rms_norm", 3, 3, 2, 2, kEps},
    {"train.gated_rms_norm_grad", 5, 5, 1, 3, kWeightGrad},
    {"train.rope", 1, 2, 1, 1, kRope},
    {"train.rope_grad", 1, 2, 1, 1, kRope},
    {"train.attention", 3, 4, 2, 2, kScale},
    {"train.attention_grad", 6, 7, 3, 3, kScale},
    {"train.output_gate", 2, 2, 1, 1, {}},
    {"train.output_gate_grad", 3, 3, 2, 2, {}},
    {"train.swiglu", 2, 2, 1, 1, {}},
    // With a fused recompute the backward also rebuilds the product.
    {"train.swiglu_grad", 3, 3, 2, 3, {}},
    {"train.add", 2, 2, 1, 1, {}},
    // h = a + b, then RMSNorm of h in one generated kernel
    // (exec-generate-kernels): ins a, b, w; results h, y, rstd.
    {"train.add_rms_norm", 3, 3, 3, 3, kNorm},
    // RMSNorm backward then the residual add of its dx in one generated
    // kernel (exec-generate-kernels): ins x, w, rstd, dy (or, fused with
    // the chain of adds that formed it, its 2 to 4 addends), the other
    // addend last; result the sum (then the weight grad).
    {"train.rms_norm_grad_add", 5, 8, 1, 1, kNormGrad},
    // RMSNorm backward whose dy a chain of residual adds forms, in one
    // generated kernel (exec-generate-kernels): ins x, w, rstd, then dy's
    // 2 to 4 addends in the chain's order; results dx (then the weight
    // grad).
    {"train.rms_norm_grad_sum", 5, 7, 0, 1, kNormGrad},
    {"train.lm_head_cross_entropy", 3, 3, 3, 3, kLmHead},
    {"train.lm_head_cross_entropy_grad", 4, 4, 0, 1, kLmHead},
    {"train.lm_head_cross_entropy_with_grad", 3, 3, 3, 3, kLmHead},
    {"train.yield", 2, 2, 0, 2, {}},
    {"train.finalize_grads", 1, 1, 0, -1, kFinalize},
    {"train.lr_schedule", 0, 0, 1, 1, kLr},
    {"train.adamw", 0, 1, 5, 5, kAdamW},
    {"train.loss_mean", 2, 2, 1, 1, {}},
};

const char *kindName(KernelArgKind k) {
  switch (k) {
  case K::Int:
    return "an integer";
  case K::Float:
    return "a float";
  case K::Symbol:
    return "a parameter symbol";
  case K::Flag:
    return "a flag";
  }
  return "?";
}

bool hasKind(Attribute a, KernelArgKind k) {
  switch (k) {
  case K::Int:
    return isa<IntegerAttr>(a) && !cast<IntegerAttr>(a).getType().isInteger(1);
  case K::Float:
    return isa<FloatAttr>(a);
  case K::Symbol:
    return isa<FlatSymbolRefAttr>(a);
  case K::Flag:
    return true; // unit, bool or a scope: any attribute marks it
  }
  return false;
}

std::string range(int lo, int hi) {
  if (hi < 0)
    return "at least " + std::to_string(lo);
  if (lo == hi)
    return std::to_string(lo);
  return std::to_string(lo) + " to " + std::to_string(hi);
}
} // namespace

const KernelSignature *ap::exec::lookupKernelSignature(llvm::StringRef callee) {
  for (const KernelSignature &s : kSignatures)
    if (s.callee == callee)
      return &s;
  return nullptr;
}

std::string ap::exec::knownKernelCallees() {
  std::string out;
  for (const KernelSignature &s : kSignatures)
    out += (out.empty() ? "" : ", ") + s.callee.str();
  return out;
}

unsigned ap::exec::numGradOutputs(DictionaryAttr args) {
  unsigned n = 0;
  if (!args)
    return 0;
  for (NamedAttribute a : args)
    if (a.getName().strref().ends_with("_grad") &&
        isa<FlatSymbolRefAttr>(a.getValue()))
      ++n;
  return n;
}

LogicalResult ap::exec::verifyKernelCall(
    llvm::StringRef callee, size_t numIns, size_t numOuts, DictionaryAttr args,
    llvm::function_ref<void(const llvm::Twine &)> error) {
  const KernelSignature *sig = lookupKernelSignature(callee);
  if (!sig) {
    error("no kernel implements \"" + callee +
          "\"; known callees: " + knownKernelCallees());
    return failure();
  }
  if (int(numIns) < sig->minIns ||
      (sig->maxIns >= 0 && int(numIns) > sig->maxIns)) {
    error("\"" + callee + "\" takes " + range(sig->minIns, sig->maxIns) +
          " input buffers, got " + llvm::Twine(numIns));
    return failure();
  }
  unsigned grads = numGradOutputs(args);
  if (numOuts < grads) {
    error("\"" + callee + "\" accumulates " + llvm::Twine(grads) +
          " main grads (its *_grad args) into trailing outputs, but has only " +
          llvm::Twine(numOuts) + " outputs");
    return failure();
  }
  int results = int(numOuts - grads);
  if (results < sig->minResults ||
      (sig->maxResults >= 0 && results > sig->maxResults)) {
    error("\"" + callee + "\" writes " +
          range(sig->minResults, sig->maxResults) +
          " result buffers before its " + llvm::Twine(grads) +
          " main grads, got " + llvm::Twine(results));
    return failure();
  }
  for (const KernelArgSpec &spec : sig->args) {
    Attribute a = args ? args.get(spec.name) : Attribute();
    if (!a) {
      if (spec.required) {
        error("\"" + callee + "\" needs args." + spec.name + " (" +
              kindName(spec.kind) + ")");
        return failure();
      }
      continue;
    }
    if (!hasKind(a, spec.kind)) {
      error("\"" + callee + "\" args." + spec.name + " must be " +
            kindName(spec.kind));
      return failure();
    }
  }
  return success();
}
