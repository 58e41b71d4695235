//===- EmitCpp.cpp - exec -> C++ training step ------------------*- C++ -*-===//
//
// One pass over the step in program order (program order is enqueue order,
// docs/exec-dialect.md): host-side ops (buffers, views, events, pool
// acquire/release) become nothing at run time (their offsets and indices are
// folded into the calls); everything else becomes a call of the runtime's C
// ABI (runtime/abi.h): stream ops become ap_record / ap_wait / ap_offload /
// ap_reload, kernel calls an ap_launch of their AP_KERNEL_LIST id with the
// args struct filled from the buffer types and the op's `args`, and the ops
// without a kernel entry of their own (slice, concat, expand, the GDN gates,
// the step-level scalar ops) their ap_* call. The program tables are
// constant ap_* structs. The generated file includes only kernels/kernels.h
// (the args structs) and runtime/abi.h.
//
//===----------------------------------------------------------------------===//
#include "codegen/EmitCpp.h"

#include "dialect/exec/ExecDialect.h"
#include "dialect/exec/ExecOps.h"
#include "dialect/exec/KernelSignatures.h"
#include "dialect/train/TrainDialect.h"
#include "dialect/train/TrainOps.h"
#include "runtime/abi.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Format.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

using namespace mlir;

namespace ap::codegen {
namespace {

std::optional<Attribute> attrOf(Operation *op, StringRef name) {
  if (auto a = op->getInherentAttr(name))
    if (*a)
      return a;
  if (Attribute a = op->getAttr(name))
    return a;
  return std::nullopt;
}

int64_t intAttr(Operation *op, StringRef name, int64_t dflt = -1) {
  if (auto a = attrOf(op, name))
    if (auto i = dyn_cast<IntegerAttr>(*a))
      return i.getInt();
  return dflt;
}

/// The tensor type a buffer / host slot value carries.
RankedTensorType tensorOf(Value v) {
  Type t = v.getType();
  if (auto b = dyn_cast<exec::BufferType>(t))
    return b.getTensor();
  if (auto h = dyn_cast<exec::HostSlotType>(t))
    return h.getTensor();
  return {};
}

int64_t numel(RankedTensorType t) {
  int64_t n = 1;
  for (int64_t d : t.getShape())
    n *= d;
  return n;
}

int64_t elemBytes(RankedTensorType t) {
  return (t.getElementType().getIntOrFloatBitWidth() + 7) / 8;
}

std::string dtypeName(Type e) {
  if (e.isBF16())
    return "DType::BF16";
  if (e.isF32())
    return "DType::F32";
  if (e.isF64())
    return "DType::F64";
  if (e.isInteger(32))
    return "DType::I32";
  return "";
}

/// A DType name of dtypeName() as the runtime ABI's AP_DTYPE_* constant
/// (the same values): what the ABI's calls take.
std::string abiDtype(StringRef dtype) {
  return ("AP_DTYPE_" + dtype.drop_front(strlen("DType::"))).str();
}

/// The AP_KERNEL_* id of a kernel entry of kernels/kernels.h, from the
/// runtime ABI's own list (runtime/abi.h), so that the compiler and the
/// runtime cannot disagree on ids; empty for an entry the ABI lacks.
StringRef kernelId(StringRef entry) {
#define AP_KERNEL_ENTRY_NAME(ID, fn, Args) {#fn, "AP_KERNEL_" #ID},
  static const std::pair<StringRef, StringRef> kIds[] = {
      AP_KERNEL_LIST(AP_KERNEL_ENTRY_NAME)};
#undef AP_KERNEL_ENTRY_NAME
  for (const auto &[fn, id] : kIds)
    if (fn == entry)
      return id;
  return {};
}

/// `s` as a C++ narrow string literal, quotes included. Everything that
/// reaches the generated source from the model (its name, parameter and
/// scope names, op names) goes through here, as data and never as code:
/// printable ASCII stays as it is except `\`, `"` and `?` (escaped, so no
/// `??/` trigraph can form); every other byte (newlines, control characters,
/// the bytes of non-ASCII UTF-8) becomes a three-digit octal escape, which,
/// unlike `\x`, cannot run into a following digit. The literal holds the
/// same bytes as `s`, and no line of it ends in a backslash, so it is also
/// safe in a `//` comment (no line splice). The emitter prints no identifier
/// made from a name: names only ever appear inside these literals.
std::string cppString(StringRef s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '\\' || c == '"' || c == '?') {
      out += '\\';
      out += char(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      out += '\\';
      out += char('0' + (c >> 6));
      out += char('0' + ((c >> 3) & 7));
      out += char('0' + (c & 7));
    }
  }
  out += '"';
  return out;
}

/// `v` printed exactly (%.17g round-trips a double). Callers check that it
/// is finite (Emitter::num).
std::string fmtDouble(double v) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format("%.17g", v);
  return s;
}

double dblArg(DictionaryAttr args, StringRef name, double dflt) {
  if (!args)
    return dflt;
  if (auto f = args.getAs<FloatAttr>(name))
    return f.getValueAsDouble();
  if (auto i = args.getAs<IntegerAttr>(name))
    return double(i.getInt());
  return dflt;
}

int64_t intArg(DictionaryAttr args, StringRef name, int64_t dflt) {
  if (!args)
    return dflt;
  if (auto i = args.getAs<IntegerAttr>(name))
    return i.getInt();
  return dflt;
}

/// "L<layer>.<leaf>" (model-level scopes have no layer: "<leaf>").
std::string scopeName(DictionaryAttr args) {
  if (!args)
    return "";
  auto s = args.getAs<train::ScopeAttr>("scope");
  if (!s)
    return "";
  if (s.getLayer() < 0)
    return s.getModule().str();
  return "L" + std::to_string(s.getLayer()) + "." + s.getModule().str();
}

/// Number of `*_grad` symbol attributes (the main grads a kernel
/// accumulates into, appended after the train op's results).

class Emitter {
public:
  Emitter(ModuleOp module, llvm::raw_ostream &os) : module_(module), os_(os) {}

  LogicalResult run(EmittedPlan *plan);

private:
  LogicalResult collect(Operation *step);
  LogicalResult emitBlock(Block &block, int indent);
  LogicalResult emitOp(Operation *op, int indent);
  LogicalResult emitKernel(Operation *op, int indent);
  LogicalResult offsetOf(Value v, Operation *user, uint64_t &out);
  std::string ptr(Value v) {
    return "ap_at(r, " + std::to_string(off_[v]) + "ull)";
  }
  std::string stream(Operation *op) {
    switch (intAttr(op, "stream", 0)) {
    case 1:
      return "AP_STREAM_D2H";
    case 2:
      return "AP_STREAM_H2D";
    case 3:
      return "AP_STREAM_COMM";
    case 4:
      return "AP_STREAM_SIDE";
    default:
      return "AP_STREAM_COMPUTE";
    }
  }
  unsigned eventIndex(Value e) {
    auto it = events_.find(e);
    if (it != events_.end())
      return it->second;
    unsigned i = numEvents_++;
    events_[e] = i;
    return i;
  }
  llvm::raw_ostream &line(int indent) { return os_.indent(indent); }
  /// `v`, attribute `attr` of `op`, as a C++ floating literal (a `float`
  /// one with `f32`). A value the literal cannot carry (not finite; with
  /// `f32`, beyond float's range, or a nonzero that float rounds to zero) is
  /// recorded in numError_: the caller fails once the op is written.
  std::string num(Operation *op, double v, StringRef attr, bool f32 = false);
  /// num() of the kernel argument `name` (`dflt` when absent).
  std::string arg(Operation *op, DictionaryAttr args, StringRef name,
                  double dflt, bool f32 = false) {
    return num(op, dblArg(args, name, dflt), name, f32);
  }
  /// The first number num() refused, as a diagnostic on its op.
  LogicalResult numbersOk() {
    if (!numOp_)
      return success();
    return numOp_->emitError("emit-cpp: ") << numError_;
  }

  ModuleOp module_;
  llvm::raw_ostream &os_;
  llvm::DenseMap<Value, uint64_t> off_;    ///< arena offset of every buffer
  llvm::DenseMap<Value, unsigned> events_; ///< event value -> index
  unsigned numEvents_ = 0;
  llvm::DenseMap<Value, unsigned> slotOf_;    ///< pool_acquire value -> slot
  llvm::DenseMap<Value, Value> slotD2HEvent_; ///< slot value -> d2h event
  llvm::DenseMap<Operation *, std::string> copyScope_;
  std::vector<std::string> scopes_;
  std::map<std::string, unsigned> scopeIndex_;
  int lastD2HWait_ = -1; ///< event last waited for on the d2h stream
  uint64_t maxGateElems_ = 0;
  bool sideKernels_ = false; ///< some exec.kernel runs on the side stream
  /// An op named a kernel entry missing from the runtime ABI (reported).
  bool abiError_ = false;
  /// some side op was issued after its host (exec-defer-side-issue)
  bool sideAfterHost_ = false;
  std::map<std::string, std::map<std::string, uint64_t>> persistent_;
  llvm::StringMap<unsigned> paramIndex_;
  std::map<unsigned, std::pair<uint64_t, uint64_t>> slotSpec_;
  Operation *numOp_ = nullptr; ///< op of the first number num() refused
  std::string numError_;
};

std::string Emitter::num(Operation *op, double v, StringRef attr, bool f32) {
  std::string why;
  if (!std::isfinite(v))
    why = "is not finite";
  else if (f32 && std::fabs(v) > double(std::numeric_limits<float>::max()))
    why = "is beyond the range of float (the kernel argument is a float)";
  else if (f32 && v != 0 && float(v) == 0)
    why = "rounds to 0 as a float (the kernel argument is a float)";
  if (!why.empty()) {
    if (!numOp_) {
      numOp_ = op;
      numError_ = "attribute '" + attr.str() + "' of '" +
                  op->getName().getStringRef().str() + "'";
      if (auto k = dyn_cast<exec::KernelOp>(op))
        numError_ += " (" + k.getCallee().str() + ")";
      numError_ += " = " + fmtDouble(v) + " " + why;
    }
    return "0";
  }
  std::string s = fmtDouble(v);
  if (!f32)
    return s;
  // "1f" is not a literal; "1.0f" is.
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s + "f";
}

LogicalResult Emitter::offsetOf(Value v, Operation *user, uint64_t &out) {
  auto it = off_.find(v);
  if (it == off_.end())
    return user->emitError("emit-cpp: operand has no planned arena offset "
                           "(run exec-plan-memory first)");
  out = it->second;
  return success();
}

/// First kernel (in block order) that reads `v` or a view of it.
static Operation *firstKernelReader(Value v) {
  Operation *best = nullptr;
  SmallVector<Value> work{v};
  while (!work.empty()) {
    Value cur = work.pop_back_val();
    for (Operation *u : cur.getUsers()) {
      if (isa<exec::ViewOp>(u)) {
        work.push_back(u->getResult(0));
        continue;
      }
      if (!isa<exec::KernelOp>(u))
        continue;
      if (!best ||
          (u->getBlock() == best->getBlock() && u->isBeforeInBlock(best)))
        best = u;
    }
  }
  return best;
}

LogicalResult Emitter::collect(Operation *step) {
  WalkResult r = step->walk([&](Operation *op) -> WalkResult {
    if (auto b = dyn_cast<exec::BufferOp>(op)) {
      int64_t o = intAttr(op, "offset");
      if (o < 0)
        return op->emitError("emit-cpp: exec.buffer without a planned offset "
                             "(run exec-plan-memory first)"),
               WalkResult::interrupt();
      off_[b->getResult(0)] = uint64_t(o);
    } else if (auto p = dyn_cast<exec::PersistentOp>(op)) {
      int64_t o = intAttr(op, "offset");
      if (o < 0)
        return op->emitError("emit-cpp: exec.persistent without a planned "
                             "offset (run exec-plan-memory first)"),
               WalkResult::interrupt();
      off_[p->getResult(0)] = uint64_t(o);
      persistent_[p.getName().str()]
                 [exec::stringifyBufferRole(p.getRole()).str()] = uint64_t(o);
    } else if (auto v = dyn_cast<exec::ViewOp>(op)) {
      auto it = off_.find(op->getOperand(0));
      if (it == off_.end())
        return op->emitError("emit-cpp: view of an unplanned buffer"),
               WalkResult::interrupt();
      off_[v->getResult(0)] = it->second;
    } else if (isa<exec::PoolAcquireOp>(op)) {
      unsigned s = unsigned(intAttr(op, "slot"));
      slotOf_[op->getResult(0)] = s;
      slotSpec_[s] = {uint64_t(intAttr(op, "offset")),
                      uint64_t(intAttr(op, "bytes"))};
    } else if (auto d = dyn_cast<exec::D2HOp>(op)) {
      slotD2HEvent_[op->getOperand(1)] = op->getOperand(2);
      // The scope is the backward op that consumes the reloaded value.
      Value slot = op->getOperand(1);
      Operation *reader = nullptr;
      for (Operation *u : slot.getUsers())
        if (isa<exec::H2DOp>(u))
          reader = firstKernelReader(u->getOperand(1));
      if (!reader)
        return op->emitError("emit-cpp: offloaded value is never reloaded and "
                             "read by a kernel; cannot name its scope"),
               WalkResult::interrupt();
      std::string name = scopeName(cast<exec::KernelOp>(reader).getArgs());
      if (name.empty())
        return op->emitError("emit-cpp: the reader of an offloaded value has "
                             "no scope"),
               WalkResult::interrupt();
      if (!scopeIndex_.count(name)) {
        scopeIndex_[name] = unsigned(scopes_.size());
        scopes_.push_back(name);
      }
      copyScope_[op] = name;
      for (Operation *u : slot.getUsers())
        if (isa<exec::H2DOp>(u))
          copyScope_[u] = name;
    } else if (auto k = dyn_cast<exec::KernelOp>(op)) {
      StringRef c = k.getCallee();
      sideKernels_ |= k.getStream() == exec::Stream::Side;
      sideAfterHost_ |= k->hasAttr("exec.issued_after_host");
      if (c == "train.gdn_gates" || c == "train.gated_delta_rule" ||
          c == "train.gated_delta_rule_grad" || c == "train.gdn_gates_grad") {
        RankedTensorType t = tensorOf(op->getOperand(0));
        uint64_t n = uint64_t(numel(t));
        if (c.starts_with(
                "train.gated_delta_rule")) // q [B,T,Hk,dk]; gates from v
          n = uint64_t(numel(tensorOf(k.getInputs()[3])));
        maxGateElems_ = std::max(maxGateElems_, n);
      }
    }
    return WalkResult::advance();
  });
  return failure(r.wasInterrupted());
}

LogicalResult Emitter::run(EmittedPlan *plan) {
  Operation *step = nullptr;
  SmallVector<train::ParamOp> params;
  for (Operation &op : module_.getBody()->getOperations()) {
    if (isa<exec::StepOp>(op)) {
      if (step)
        return op.emitError("emit-cpp: more than one exec.step");
      step = &op;
    } else if (auto p = dyn_cast<train::ParamOp>(op)) {
      params.push_back(p);
    }
  }
  if (!step)
    return module_.emitError("emit-cpp: no exec.step in the module (run "
                             "convert-train-to-exec first)");
  if (failed(collect(step)))
    return failure();
  for (train::ParamOp p : params)
    paramIndex_[p.getSymName()] = paramIndex_.size();

  auto stepAttr = [&](StringRef n) { return intAttr(step, n, 0); };
  uint64_t arena = uint64_t(stepAttr("arena_bytes"));
  if (arena == 0)
    return step->emitError("emit-cpp: exec.step has no arena_bytes (run "
                           "exec-plan-memory first)");
  // Driver scratch: 256 bytes of scalars, then two Acc staging arrays for
  // the GDN gates (beta in, dbeta out), 8 bytes an element at most.
  uint64_t stage = (maxGateElems_ * 8 + 255) / 256 * 256;
  uint64_t scratch = 256 + 2 * stage;

  // The microbatch input shape comes from load_input "tokens".
  int64_t batch = 1, seq = 1, vocab = 0,
          microBatches = stepAttr("micro_batches");
  step->walk([&](exec::LoadInputOp l) {
    RankedTensorType t = tensorOf(l->getOperand(0));
    if (t && t.getRank() == 2) {
      batch = t.getDimSize(0);
      seq = t.getDimSize(1);
    }
  });
  double maxLr = 0;
  step->walk([&](exec::KernelOp k) {
    if (k.getCallee() == "train.embedding")
      vocab = tensorOf(k.getInputs()[1]).getDimSize(0);
    if (k.getCallee() == "train.lr_schedule")
      maxLr = dblArg(k.getArgs(), "max_lr", 0);
  });

  std::string model;
  if (auto m = module_->getAttrOfType<StringAttr>(train::kModelNameAttrName))
    model = m.getValue().str();
  os_ << "//===- generated by actplace-translate --emit-cpp: do not edit "
         "-----===//\n"
      << "//\n// Training step of model " << cppString(model)
      << ": parameter table, buffer plan, pinned slots, offload scopes and\n"
      << "// the step function. Links with actplace_runtime and the kernels.\n"
      << "//\n//"
         "===------------------------------------------------------------===//"
         "\n"
      << "#include \"kernels/kernels.h\"\n#include \"runtime/abi.h\"\n\n"
      << "#include <cstdint>\n\n"
      << "namespace {\nusing namespace ap::kernels;\n\n";

  // Buffer plan. The side workspace appears only where the plan has one or
  // the step has side kernels, so other programs' code stays as it was.
  uint64_t sideWorkspace = uint64_t(stepAttr("side_workspace_bytes"));
  bool emitSide = sideWorkspace > 0 || sideKernels_;
  os_ << "// Buffer plan (exec-plan-memory): arena [persistent | activations | "
      << (emitSide ? "workspace | side workspace].\n" : "workspace].\n");
  os_ << "constexpr uint64_t kPersistentBytes = "
      << stepAttr("persistent_bytes")
      << "ull;\nconstexpr uint64_t kActivationBytes = "
      << stepAttr("activation_bytes")
      << "ull;\nconstexpr uint64_t kWorkspaceBytes = "
      << stepAttr("workspace_bytes") << "ull;\n";
  if (emitSide)
    os_ << "constexpr uint64_t kSideWorkspaceBytes = " << sideWorkspace
        << "ull;\n";
  os_ << "constexpr uint64_t kArenaBytes = " << arena
      << "ull;\nconstexpr uint64_t kPinnedBytes = " << stepAttr("pinned_bytes")
      << "ull;\nconstexpr uint64_t kScratchBytes = " << scratch << "ull;\n\n";

  os_ << "void trainStep(ap_step *r) {\n";
  if (failed(emitBlock(step->getRegion(0).front(), 2)))
    return failure();
  os_ << "}\n\n";

  // Program tables: plain constant data of the C ABI (runtime/abi.h).
  unsigned numSlots = 0;
  for (auto &[s, spec] : slotSpec_)
    numSlots = std::max(numSlots, s + 1);
  if (numSlots) {
    os_ << "// Pinned slots: {offset, bytes}.\nconst ap_slot kSlots[] = {\n";
    for (unsigned s = 0; s < numSlots; ++s) {
      auto it = slotSpec_.find(s);
      uint64_t off = it == slotSpec_.end() ? 0 : it->second.first;
      uint64_t bytes = it == slotSpec_.end() ? 0 : it->second.second;
      os_ << "    {" << off << "ull, " << bytes << "ull},\n";
    }
    os_ << "};\n";
  }
  if (!scopes_.empty()) {
    os_ << "// Offload scopes (the transfer counters of the metrics line).\n"
        << "const char *const kScopes[] = {\n";
    for (const std::string &s : scopes_)
      os_ << "    " << cppString(s) << ",\n";
    os_ << "};\n";
  }
  unsigned numConfig = 0;
  if (auto fields =
          module_->getAttrOfType<DictionaryAttr>(train::kModelConfigAttrName);
      fields && !fields.empty()) {
    os_ << "// Model settings (recorded in checkpoints).\n"
        << "const ap_config_entry kModelConfig[] = {\n";
    for (NamedAttribute field : fields) {
      os_ << "    {" << cppString(field.getName()) << ", "
          << cppString(cast<StringAttr>(field.getValue()).getValue()) << "},\n";
      ++numConfig;
    }
    os_ << "};\n";
  }
  auto offStr = [&](const std::map<std::string, uint64_t> &roles,
                    const char *role) -> std::string {
    auto it = roles.find(role);
    if (it == roles.end())
      return "AP_NO_OFFSET";
    return std::to_string(it->second) + "ull";
  };
  if (!params.empty())
    os_ << "// Parameters: name, dtype, rank, shape, numel, init, frozen, "
           "init a, b,\n// offsets of weight, master, main grad, Adam m, "
           "Adam v.\nconst ap_param kParams[] = {\n";
  for (train::ParamOp p : params) {
    std::string name = p.getSymName().str();
    auto pit = persistent_.find(name);
    if (pit == persistent_.end() || !pit->second.count("weight"))
      return p->emitError("emit-cpp: parameter '")
             << name << "' has no persistent weight buffer in the exec.step";
    auto t = dyn_cast<RankedTensorType>(p.getType());
    if (!t) {
      // train.param's type is a tensor-like param type; read the weight's.
      for (Operation &op : step->getRegion(0).front())
        if (auto po = dyn_cast<exec::PersistentOp>(op))
          if (po.getName() == name && po.getRole() == exec::BufferRole::Weight)
            t = tensorOf(po->getResult(0));
    }
    if (!t || t.getRank() > 4)
      return p->emitError("emit-cpp: parameter '")
             << name << "' needs a ranked tensor type of rank <= 4";
    train::InitAttr init = p.getInit();
    const char *kind = "AP_INIT_ZEROS";
    switch (init.getKind()) {
    case train::InitKind::Zeros:
      kind = "AP_INIT_ZEROS";
      break;
    case train::InitKind::Ones:
      kind = "AP_INIT_ONES";
      break;
    case train::InitKind::Normal:
      kind = "AP_INIT_NORMAL";
      break;
    case train::InitKind::Uniform:
      kind = "AP_INIT_UNIFORM";
      break;
    case train::InitKind::LogUniform:
      kind = "AP_INIT_LOG_UNIFORM";
      break;
    }
    os_ << "    {" << cppString(name) << ", "
        << abiDtype(dtypeName(t.getElementType())) << ", " << t.getRank()
        << ", {";
    for (int64_t i = 0; i < 4; ++i)
      os_ << (i ? ", " : "") << (i < t.getRank() ? t.getDimSize(i) : 1);
    os_ << "}, " << numel(t) << ", " << kind << ", " << (p.getFrozen() ? 1 : 0)
        << ", " << num(p, init.getA().convertToDouble(), "init.a") << ", "
        << num(p, init.getB().convertToDouble(), "init.b") << ", "
        << offStr(pit->second, "weight") << ", "
        << offStr(pit->second, "master") << ", "
        << offStr(pit->second, "main_grad") << ", "
        << offStr(pit->second, "adam_m") << ", "
        << offStr(pit->second, "adam_v") << "},\n";
  }
  if (!params.empty())
    os_ << "};\n";
  // The optimizer as the step runs it (the same arguments and defaults as
  // its calls in trainStep), as numbers: the run configuration a
  // checkpoint records, so that a resume under other settings is refused.
  std::string schedule, adamw;
  llvm::raw_string_ostream sched(schedule), adam(adamw);
  unsigned numAdamW = 0;
  step->walk([&](exec::KernelOp k) {
    Operation *op = k.getOperation();
    DictionaryAttr args = k.getArgs();
    if (k.getCallee() == "train.lr_schedule") {
      sched << "  p.min_lr = " << arg(op, args, "min_lr", 0)
            << ";\n  p.warmup_steps = " << intArg(args, "warmup_steps", 0)
            << ";\n  p.total_steps = " << intArg(args, "total_steps", 1)
            << ";\n";
    } else if (k.getCallee() == "train.finalize_grads") {
      sched << "  p.max_grad_norm = " << arg(op, args, "max_norm", 1.0)
            << ";\n";
    } else if (k.getCallee() == "train.adamw") {
      auto sym = args ? args.getAs<FlatSymbolRefAttr>("param") : nullptr;
      if (sym && paramIndex_.count(sym.getValue())) {
        adam << "    {" << paramIndex_[sym.getValue()] << ", "
             << arg(op, args, "beta1", 0.9) << ", "
             << arg(op, args, "beta2", 0.999) << ", "
             << arg(op, args, "eps", 1e-8) << ", "
             << arg(op, args, "weight_decay", 0) << "},\n";
        ++numAdamW;
      }
    }
  });
  if (numAdamW)
    os_ << "// AdamW: parameter index, beta1, beta2, eps, weight decay.\n"
        << "const ap_adamw kAdamW[] = {\n"
        << adamw << "};\n";
  os_ << "\nap_program makeProgram() {\n  ap_program p = {};\n"
      << "  p.abi_version = AP_ABI_VERSION;\n"
      << "  p.struct_size = sizeof(ap_program);\n";
  os_ << "  p.model = " << cppString(model)
      << ";\n  p.micro_batches = " << microBatches << ";\n  p.batch = " << batch
      << ";\n  p.seq = " << seq << ";\n  p.vocab = " << (vocab ? vocab : 256)
      << ";\n";
  if (numConfig)
    os_ << "  p.model_config = kModelConfig;\n  p.num_model_config = "
        << numConfig << ";\n";
  os_ << "  p.persistent_bytes = kPersistentBytes;\n"
      << "  p.activation_bytes = kActivationBytes;\n"
      << "  p.workspace_bytes = kWorkspaceBytes;\n";
  if (emitSide)
    os_ << "  p.side_workspace_bytes = kSideWorkspaceBytes;\n";
  if (sideKernels_)
    os_ << "  p.side_kernels = 1;\n";
  if (sideAfterHost_)
    os_ << "  p.side_after_host_start = 1;\n";
  // Side GEMMs' SM share: the cost model's (convert-train-to-exec writes
  // it from the device profile), required once the step has side kernels.
  if (sideKernels_) {
    int64_t sideSmPercent = stepAttr(exec::kSideSmPercentAttr);
    if (sideSmPercent < 1 || sideSmPercent > 100) {
      std::string got = attrOf(step, exec::kSideSmPercentAttr)
                            ? std::to_string(sideSmPercent)
                            : std::string("absent");
      return step->emitError("emit-cpp: exec.step has side-stream kernels "
                             "but its ")
             << exec::kSideSmPercentAttr << " is " << got
             << " (expected 1 to 100, set by convert-train-to-exec from the "
                "device profile's sideSmPercent)";
    }
    os_ << "  p.side_sm_percent = " << sideSmPercent << ";\n";
  }
  os_ << "  p.arena_bytes = kArenaBytes;\n"
      << "  p.pinned_bytes = kPinnedBytes;\n"
      << "  p.scratch_bytes = kScratchBytes;\n";
  if (numSlots)
    os_ << "  p.slots = kSlots;\n  p.num_slots = " << numSlots << ";\n";
  if (!scopes_.empty())
    os_ << "  p.scopes = kScopes;\n  p.num_scopes = " << scopes_.size()
        << ";\n";
  if (!params.empty())
    os_ << "  p.params = kParams;\n  p.num_params = " << params.size() << ";\n";
  const char *stateNames[] = {"loss_sum", "token_count", "grad_norm", "lr",
                              "loss"};
  for (int i = 0; i < 5; ++i) {
    auto it = persistent_.find(stateNames[i]);
    os_ << "  p.state_" << stateNames[i] << " = "
        << (it != persistent_.end() && it->second.count("state")
                ? std::to_string(it->second["state"]) + "ull"
                : std::string("AP_NO_OFFSET"))
        << ";\n";
  }
  os_ << "  p.optimizer_known = 1;\n" << schedule;
  if (numAdamW)
    os_ << "  p.adamw = kAdamW;\n  p.num_adamw = " << numAdamW << ";\n";
  os_ << "  p.max_lr = " << num(step, maxLr, "max_lr") << ";\n";
  os_ << "  p.num_events = " << numEvents_ << ";\n  p.step = trainStep;\n"
      << "  return p;\n}\n\nconst ap_program kProgram = makeProgram();\n"
      << "} // namespace\n\nint main(int argc, char **argv) {\n"
      << "  return ap_train_main(argc, argv, &kProgram);\n}\n";
  if (failed(numbersOk()))
    return failure();

  if (plan) {
    plan->arenaBytes = arena;
    plan->persistentBytes = uint64_t(stepAttr("persistent_bytes"));
    plan->activationBytes = uint64_t(stepAttr("activation_bytes"));
    plan->workspaceBytes = uint64_t(stepAttr("workspace_bytes"));
    plan->sideWorkspaceBytes = sideWorkspace;
    plan->pinnedBytes = uint64_t(stepAttr("pinned_bytes"));
    plan->scratchBytes = scratch;
    plan->numParams = params.size();
    plan->numSlots = numSlots;
    plan->numScopes = scopes_.size();
  }
  return success();
}

LogicalResult Emitter::emitBlock(Block &block, int indent) {
  for (Operation &op : block)
    if (failed(emitOp(&op, indent)))
      return failure();
  return success();
}

LogicalResult Emitter::emitOp(Operation *op, int indent) {
  if (isa<exec::BufferOp, exec::PersistentOp, exec::ViewOp, exec::PoolAcquireOp,
          exec::EventCreateOp>(op))
    return success(); // folded into the calls (offsets, slot and event ids)
  if (isa<exec::PoolReleaseOp>(op))
    return success(); // OffloadEngine::reload releases on the H2D event
  if (isa<exec::ReturnOp>(op)) {
    line(indent) << "// exec.return: loss and grad norm are in the state "
                    "buffers and on the runner.\n";
    return success();
  }
  if (auto loop = dyn_cast<exec::MicrobatchLoopOp>(op)) {
    int64_t n = intAttr(op, "count", 1);
    line(indent) << "for (int64_t mb = 0; mb < " << n << "; ++mb) {\n";
    line(indent + 2) << "ap_begin_microbatch(r, mb);\n";
    if (failed(emitBlock(op->getRegion(0).front(), indent + 2)))
      return failure();
    line(indent) << "}\n";
    line(indent) << "ap_end_loop(r);\n";
    return success();
  }
  if (isa<exec::RecordOp>(op)) {
    line(indent) << "ap_record(r, " << eventIndex(op->getOperand(0)) << ", "
                 << stream(op) << ");\n";
    return success();
  }
  if (isa<exec::WaitOp>(op)) {
    unsigned e = eventIndex(op->getOperand(0));
    if (stream(op) == "AP_STREAM_D2H")
      lastD2HWait_ = int(e);
    // Compute waiting for a reload: through the runner, which times the
    // stall under "<scope>/wait" when --op-times asks for it.
    if (stream(op) == "AP_STREAM_COMPUTE")
      for (Operation *u : op->getOperand(0).getUsers())
        if (isa<exec::H2DOp>(u) && u->getOperand(2) == op->getOperand(0) &&
            copyScope_.count(u)) {
          line(indent) << "ap_wait_copy(r, "
                       << cppString(copyScope_[u] + "/wait") << ", " << e
                       << ");\n";
          return success();
        }
    line(indent) << "ap_wait(r, " << stream(op) << ", " << e << ");\n";
    return success();
  }
  if (isa<exec::LoadInputOp>(op)) {
    uint64_t o;
    if (failed(offsetOf(op->getOperand(0), op, o)))
      return failure();
    auto name = cast<StringAttr>(*attrOf(op, "name"));
    line(indent) << "ap_load_input(r, " << cppString(name.getValue()) << ", "
                 << o << "ull, " << numel(tensorOf(op->getOperand(0))) * 4
                 << "ull);\n";
    return success();
  }
  if (isa<exec::D2HOp>(op)) {
    uint64_t o;
    if (failed(offsetOf(op->getOperand(0), op, o)))
      return failure();
    RankedTensorType t = tensorOf(op->getOperand(0));
    unsigned slot = slotOf_[op->getOperand(1)];
    // The engine orders the copy after a producer event: the event the d2h
    // stream last waited on, which exec-schedule-streams puts before every
    // copy (the copy reads bytes compute wrote). Emission adds no event of
    // its own: scheduling is the passes' decision.
    int producer = lastD2HWait_;
    if (producer < 0)
      return op->emitError(
          "emit-cpp: exec.d2h with no earlier exec.wait on the d2h stream "
          "to order it after its producer (run exec-schedule-streams)");
    line(indent) << "ap_offload(r, " << scopeIndex_[copyScope_[op]] << ", "
                 << slot << ", " << o << "ull, " << numel(t) * elemBytes(t)
                 << "ull, " << producer << ", " << eventIndex(op->getOperand(2))
                 << "); // " << cppString(copyScope_[op]) << "\n";
    return success();
  }
  if (isa<exec::H2DOp>(op)) {
    uint64_t o;
    if (failed(offsetOf(op->getOperand(1), op, o)))
      return failure();
    RankedTensorType t = tensorOf(op->getOperand(1));
    Value slotV = op->getOperand(0);
    auto d2h = slotD2HEvent_.find(slotV);
    if (d2h == slotD2HEvent_.end())
      return op->emitError("emit-cpp: h2d from a slot no d2h filled");
    line(indent) << "ap_reload(r, " << scopeIndex_[copyScope_[op]] << ", "
                 << slotOf_[slotV] << ", " << o << "ull, "
                 << numel(t) * elemBytes(t) << "ull, "
                 << eventIndex(d2h->second) << ", "
                 << eventIndex(op->getOperand(2)) << "); // "
                 << cppString(copyScope_[op]) << "\n";
    return success();
  }
  if (isa<exec::AllReduceOp>(op)) {
    uint64_t o;
    if (failed(offsetOf(op->getOperand(0), op, o)))
      return failure();
    RankedTensorType t = tensorOf(op->getOperand(0));
    line(indent) << "ap_all_reduce(r, " << o << "ull, "
                 << numel(t) * elemBytes(t) << "ull, "
                 << abiDtype(dtypeName(t.getElementType())) << ");\n";
    return success();
  }
  if (isa<exec::KernelOp>(op))
    return failure(failed(emitKernel(op, indent)) || abiError_ ||
                   failed(numbersOk()));
  return op->emitError("emit-cpp: unsupported op '")
         << op->getName().getStringRef() << "'";
}

LogicalResult Emitter::emitKernel(Operation *op, int indent) {
  auto k = cast<exec::KernelOp>(op);
  StringRef callee = k.getCallee();
  DictionaryAttr args = k.getArgs();
  SmallVector<Value> ins(k.getInputs().begin(), k.getInputs().end());
  SmallVector<Value> outs(k.getOutputs().begin(), k.getOutputs().end());
  for (Value v : llvm::concat<Value>(ins, outs)) {
    uint64_t o;
    if (failed(offsetOf(v, op, o)))
      return failure();
  }
  std::string scope = scopeName(args);
  std::string label = (scope.empty() ? std::string("step") : scope) + "/" +
                      callee.drop_front(6).str();
  if (args && args.get("train.recomputed"))
    label += "(recompute)";
  label = cppString(label); // printed as a literal only
  unsigned grads = exec::numGradOutputs(args);
  unsigned results = outs.size() >= grads ? outs.size() - grads : 0;
  auto T = [&](Value v) { return tensorOf(v); };
  auto dt = [&](Value v) { return dtypeName(T(v).getElementType()); };
  auto dim = [&](Value v, int64_t i) {
    RankedTensorType t = T(v);
    return t.getDimSize(i < 0 ? t.getRank() + i : i);
  };
  auto nel = [&](Value v) { return numel(T(v)); };
  auto open = [&](const char *type) {
    line(indent) << "{\n";
    line(indent + 2) << type << " a;\n";
  };
  auto set = [&](const std::string &field, const std::string &value) {
    line(indent + 2) << "a." << field << " = " << value << ";\n";
  };
  // `on side`: the runner launches it on the side stream, with that
  // stream's workspace and SM target.
  bool side = k.getStream() == exec::Stream::Side;
  // The launch through the C ABI: the kernel by its AP_KERNEL_LIST id, the
  // args struct by address and size (the runtime copies it).
  std::string launchStream = side ? "AP_STREAM_SIDE" : "AP_STREAM_COMPUTE";
  auto launchLine = [&](const char *entry) {
    StringRef id = kernelId(entry);
    if (id.empty()) {
      abiError_ = true;
      op->emitError("emit-cpp: kernel entry '")
          << entry << "' is not in the runtime ABI's AP_KERNEL_LIST";
    }
    line(indent + 2) << "ap_launch(r, " << launchStream << ", " << label << ", "
                     << id << ", &a, sizeof a);\n";
  };
  auto close = [&](const char *entry) {
    launchLine(entry);
    line(indent) << "}\n";
  };
  // The runner's helpers (data movement, dtype staging in the shared driver
  // scratch, the step-level ops) run on the compute stream only.
  auto notOnSide = [&](StringRef why) {
    return op->emitError("emit-cpp: '")
           << callee << "' cannot run on the side stream (" << why << ")";
  };
  if (side &&
      (callee == "train.slice" || callee == "train.concat" ||
       callee == "train.expand" || callee == "train.expand_grad" ||
       callee == "train.gdn_gates" || callee == "train.gdn_gates_grad" ||
       callee == "train.yield" || callee == "train.finalize_grads" ||
       callee == "train.lr_schedule" || callee == "train.adamw" ||
       callee == "train.loss_mean"))
    return notOnSide("a runner helper on the compute stream");
  auto expectCounts = [&](size_t ni, size_t no) -> LogicalResult {
    if (ins.size() != ni || outs.size() != no)
      return op->emitError("emit-cpp: '")
             << callee << "' with " << ins.size() << " inputs and "
             << outs.size() << " outputs (expected " << ni << " and " << no
             << ")";
    return success();
  };

  if (callee == "train.embedding") {
    if (failed(expectCounts(2, 1)))
      return failure();
    open("EmbeddingForwardArgs");
    set("dtype", dt(ins[1]));
    set("ids", "static_cast<const int32_t *>(" + ptr(ins[0]) + ")");
    set("w", ptr(ins[1]));
    set("y", ptr(outs[0]));
    set("tokens", std::to_string(nel(ins[0])));
    set("vocab", std::to_string(dim(ins[1], 0)));
    set("dim", std::to_string(dim(ins[1], 1)));
    close("embeddingForward");
    return success();
  }
  if (callee == "train.embedding_grad") {
    if (failed(expectCounts(2, 1)))
      return failure();
    open("EmbeddingBackwardArgs");
    set("dtype", dt(ins[1]));
    set("ids", "static_cast<const int32_t *>(" + ptr(ins[0]) + ")");
    set("dy", ptr(ins[1]));
    set("dw", ptr(outs[0]));
    set("tokens", std::to_string(nel(ins[0])));
    set("vocab", std::to_string(dim(outs[0], 0)));
    set("dim", std::to_string(dim(outs[0], 1)));
    close("embeddingBackward");
    return success();
  }
  if (callee == "train.rms_norm" || callee == "train.rms_norm_grad" ||
      callee == "train.rms_norm_grad_rebuild") {
    bool fwd = callee == "train.rms_norm";
    // The rebuilding backward's second result is the forward's output.
    bool rebuildsY = callee == "train.rms_norm_grad_rebuild";
    if (fwd ? failed(expectCounts(2, 2)) : ins.size() != 4)
      return fwd ? failure()
                 : op->emitError("emit-cpp: '") << callee << "' needs 4 inputs";
    int64_t d = nel(ins[1]);
    int64_t rows = nel(ins[0]) / d;
    bool zc = args && args.get("zero_centered");
    if (fwd) {
      open("RmsNormForwardArgs");
      set("dtype", dt(ins[0]));
      set("x", ptr(ins[0]));
      set("w", ptr(ins[1]));
      set("y", ptr(outs[0]));
      set("rstd", ptr(outs[1]));
      set("rows", std::to_string(rows));
      set("dim", std::to_string(d));
      set("eps", arg(op, args, "eps", 1e-6));
      set("zeroCentered", zc ? "true" : "false");
      close("rmsNormForward");
    } else {
      open("RmsNormBackwardArgs");
      set("dtype", dt(ins[0]));
      set("x", ptr(ins[0]));
      set("w", ptr(ins[1]));
      set("rstd", ptr(ins[2]));
      set("dy", ptr(ins[3]));
      if (results >= 1)
        set("dx", ptr(outs[0]));
      if (rebuildsY && results == 2)
        set("y", ptr(outs[1]));
      if (grads >= 1)
        set("dw", ptr(outs[results]));
      set("rows", std::to_string(rows));
      set("dim", std::to_string(d));
      set("zeroCentered", zc ? "true" : "false");
      close("rmsNormBackward");
    }
    return success();
  }
  if (callee == "train.linear") {
    if (failed(expectCounts(2, 1)))
      return failure();
    int64_t in = dim(ins[1], 1), out = dim(ins[1], 0);
    open("LinearForwardArgs");
    set("dtype", dt(ins[0]));
    set("x", ptr(ins[0]));
    set("w", ptr(ins[1]));
    set("y", ptr(outs[0]));
    set("rows", std::to_string(nel(ins[0]) / in));
    set("in", std::to_string(in));
    set("out", std::to_string(out));
    close("linearForward");
    return success();
  }
  if (callee == "train.linear_grad") {
    if (ins.size() != 3)
      return op->emitError("emit-cpp: train.linear_grad needs 3 inputs");
    int64_t in = dim(ins[1], 1), out = dim(ins[1], 0);
    open("LinearBackwardArgs");
    set("dtype", dt(ins[0]));
    set("x", ptr(ins[0]));
    set("w", ptr(ins[1]));
    set("dy", ptr(ins[2]));
    if (results >= 1)
      set("dx", ptr(outs[0]));
    if (grads >= 1)
      set("dw", ptr(outs[results]));
    set("rows", std::to_string(nel(ins[0]) / in));
    set("in", std::to_string(in));
    set("out", std::to_string(out));
    close("linearBackward");
    return success();
  }
  if (callee == "train.linear_input_grad") {
    // dx only; x is not read (train-fuse-recompute defers the weight
    // gradient to a train.linear_grad without result).
    if (failed(expectCounts(2, 1)))
      return failure();
    int64_t in = dim(ins[0], 1), out = dim(ins[0], 0);
    open("LinearBackwardArgs");
    set("dtype", dt(ins[1]));
    set("w", ptr(ins[0]));
    set("dy", ptr(ins[1]));
    set("dx", ptr(outs[0]));
    set("rows", std::to_string(nel(ins[1]) / out));
    set("in", std::to_string(in));
    set("out", std::to_string(out));
    close("linearBackward");
    return success();
  }
  if (callee == "train.short_conv" || callee == "train.short_conv_grad") {
    bool fwd = callee == "train.short_conv";
    open("GdnConvArgs");
    set("dtype", dt(ins[0]));
    set("batch", std::to_string(dim(ins[0], 0)));
    set("seqLen", std::to_string(dim(ins[0], 1)));
    set("channels", std::to_string(dim(ins[0], 2)));
    set("kernelSize", std::to_string(dim(ins[1], 1)));
    set("x", ptr(ins[0]));
    set("w", ptr(ins[1]));
    // A split conv's channel groups (its results; the grad's dy operands):
    // one buffer each.
    auto groups = [&](ArrayRef<Value> vs, const char *field) {
      set("splits", std::to_string(vs.size()));
      for (auto [s, v] : llvm::enumerate(vs)) {
        set("splitChannels[" + std::to_string(s) + "]",
            std::to_string(dim(v, 2)));
        set(std::string(field) + "[" + std::to_string(s) + "]", ptr(v));
      }
    };
    size_t nGroups = fwd ? results : ins.size() - 2;
    if (nGroups < 1 || nGroups > 4)
      return op->emitError("emit-cpp: '")
             << callee << "' with " << nGroups
             << " channel groups (the kernels take 1 to "
                "kGdnConvMaxSplits = 4, kernels/gdn.h)";
    if (fwd) {
      if (results == 1)
        set("y", ptr(outs[0]));
      else
        groups(ArrayRef<Value>(outs).take_front(results), "ys");
      close("gdnConvForward");
    } else {
      if (nGroups > 1)
        groups(ArrayRef<Value>(ins).drop_front(2), "dys");
      else
        set("dy", ptr(ins[2]));
      if (results >= 1)
        set("dx", ptr(outs[0]));
      if (grads >= 1)
        set("dw", ptr(outs[results]));
      close("gdnConvBackward");
    }
    return success();
  }
  if (callee == "train.slice") {
    if (failed(expectCounts(1, 1)))
      return failure();
    int64_t d = intArg(args, "dim", -1);
    RankedTensorType x = T(ins[0]), y = T(outs[0]);
    if (d < 0 || d >= x.getRank())
      return op->emitError("emit-cpp: train.slice without a valid dim");
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < d; ++i)
      outer *= x.getDimSize(i);
    for (int64_t i = d + 1; i < x.getRank(); ++i)
      inner *= x.getDimSize(i);
    line(indent) << "ap_slice(r, " << label << ", " << off_[ins[0]] << "ull, "
                 << off_[outs[0]] << "ull, " << outer << ", " << x.getDimSize(d)
                 << ", " << intArg(args, "offset", 0) << ", " << y.getDimSize(d)
                 << ", " << inner << ", " << elemBytes(x) << ");\n";
    return success();
  }
  if (callee == "train.concat") {
    if (outs.size() != 1 || ins.empty())
      return op->emitError("emit-cpp: train.concat needs inputs and 1 output");
    int64_t d = intArg(args, "dim", -1);
    RankedTensorType y = T(outs[0]);
    if (d < 0 || d >= y.getRank())
      return op->emitError("emit-cpp: train.concat without a valid dim");
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < d; ++i)
      outer *= y.getDimSize(i);
    for (int64_t i = d + 1; i < y.getRank(); ++i)
      inner *= y.getDimSize(i);
    line(indent) << "{\n";
    line(indent + 2) << "const uint64_t xs[] = {";
    for (size_t i = 0; i < ins.size(); ++i)
      os_ << (i ? ", " : "") << off_[ins[i]] << "ull";
    os_ << "};\n";
    line(indent + 2) << "const int64_t dims[] = {";
    for (size_t i = 0; i < ins.size(); ++i)
      os_ << (i ? ", " : "") << T(ins[i]).getDimSize(d);
    os_ << "};\n";
    line(indent + 2) << "ap_concat(r, " << label << ", xs, dims, " << ins.size()
                     << ", " << off_[outs[0]] << "ull, " << outer << ", "
                     << inner << ", " << elemBytes(y) << ");\n";
    line(indent) << "}\n";
    return success();
  }
  if (callee == "train.expand" || callee == "train.expand_grad") {
    if (failed(expectCounts(1, 1)))
      return failure();
    bool fwd = callee == "train.expand";
    RankedTensorType small = fwd ? T(ins[0]) : T(outs[0]);
    RankedTensorType big = fwd ? T(outs[0]) : T(ins[0]);
    int64_t d = -1;
    for (int64_t i = 0; i < big.getRank(); ++i)
      if (small.getDimSize(i) != big.getDimSize(i))
        d = i;
    if (d < 0 || small.getDimSize(d) != 1)
      return op->emitError("emit-cpp: '")
             << callee << "' must broadcast one unit dim";
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < d; ++i)
      outer *= big.getDimSize(i);
    for (int64_t i = d + 1; i < big.getRank(); ++i)
      inner *= big.getDimSize(i);
    line(indent) << (fwd ? "ap_expand" : "ap_expand_grad") << "(r, " << label
                 << ", " << off_[ins[0]] << "ull, " << off_[outs[0]] << "ull, "
                 << outer << ", " << big.getDimSize(d) << ", " << inner << ", "
                 << abiDtype(dtypeName(big.getElementType())) << ");\n";
    return success();
  }
  if (callee == "train.l2_norm" || callee == "train.l2_norm_grad") {
    bool fwd = callee == "train.l2_norm";
    Value shaped = fwd ? ins[0] : ins[0];
    int64_t h = dim(shaped, -2), d = dim(shaped, -1);
    open("GdnL2NormArgs");
    set("dtype", dt(shaped));
    set("tokens", std::to_string(nel(shaped) / (h * d)));
    set("heads", std::to_string(h));
    set("dim", std::to_string(d));
    if (fwd) {
      set("eps", arg(op, args, "eps", 1e-6, /*f32=*/true));
      set("x", ptr(ins[0]));
      set("y", ptr(outs[0]));
      set("rstd", ptr(outs[1]));
      close("gdnL2NormForward");
    } else {
      set("y", ptr(ins[0]));
      set("rstd", ptr(ins[1]));
      set("dy", ptr(ins[2]));
      set("dx", ptr(outs[0]));
      close("gdnL2NormBackward");
    }
    return success();
  }
  if (callee == "train.gdn_gates") {
    if (failed(expectCounts(4, 2)))
      return failure();
    line(indent) << "ap_gdn_gates(r, " << label << ", " << off_[ins[0]]
                 << "ull, " << off_[ins[1]] << "ull, " << off_[ins[2]]
                 << "ull, " << off_[ins[3]] << "ull, " << off_[outs[0]]
                 << "ull, " << off_[outs[1]] << "ull, "
                 << nel(ins[0]) / dim(ins[0], -1) << ", " << dim(ins[0], -1)
                 << ", " << abiDtype(dt(ins[0])) << ");\n";
    return success();
  }
  if (callee == "train.gdn_gates_grad") {
    if (failed(expectCounts(7, 4)))
      return op->emitError("emit-cpp: train.gdn_gates_grad of frozen gate "
                           "parameters is not supported");
    // ins: a, A_log, dt_bias, g, beta, dg, dbeta; outs: da, db, dA_log, ddt.
    line(indent) << "ap_gdn_gates_grad(r, " << label << ", " << off_[ins[0]]
                 << "ull, " << off_[ins[1]] << "ull, " << off_[ins[2]]
                 << "ull, " << off_[ins[4]] << "ull, " << off_[ins[5]]
                 << "ull, " << off_[ins[6]] << "ull, " << off_[outs[0]]
                 << "ull, " << off_[outs[1]] << "ull, " << off_[outs[2]]
                 << "ull, " << off_[outs[3]] << "ull, "
                 << nel(ins[0]) / dim(ins[0], -1) << ", " << dim(ins[0], -1)
                 << ", " << abiDtype(dt(ins[0])) << ");\n";
    return success();
  }
  if (callee == "train.gated_delta_rule" ||
      callee == "train.gated_delta_rule_grad") {
    bool fwd = callee == "train.gated_delta_rule";
    if (fwd ? failed(expectCounts(5, 3)) : failed(expectCounts(7, 5)))
      return failure();
    Value q = ins[0], kk = ins[1], v = ins[2];
    Value beta = fwd ? ins[4] : ins[4];
    std::string st = dt(q);
    std::string acc = st == "DType::F64" ? "DType::F64" : "DType::F32";
    int64_t nBeta = nel(beta);
    uint64_t stage = (maxGateElems_ * 8 + 255) / 256 * 256;
    bool betaStored = dt(beta) != acc;
    if (side && (betaStored || (!fwd && dt(outs[4]) != acc)))
      return notOnSide("its gates are staged in the driver scratch");
    line(indent) << "{\n";
    std::string betaPtr = ptr(beta);
    if (betaStored) {
      line(indent + 2) << "ap_convert(r, " << label << ", " << ptr(beta) << ", "
                       << abiDtype(dt(beta)) << ", ap_scratch(r, 256), "
                       << abiDtype(acc) << ", " << nBeta << ");\n";
      betaPtr = "ap_scratch(r, 256)";
    }
    line(indent + 2) << "GdnChunkArgs a;\n";
    set("dtype", st);
    set("batch", std::to_string(dim(q, 0)));
    set("seqLen", std::to_string(dim(q, 1)));
    set("keyHeads", std::to_string(dim(q, 2)));
    set("keyDim", std::to_string(dim(q, 3)));
    set("valueHeads", std::to_string(dim(v, 2)));
    set("valueDim", std::to_string(dim(v, 3)));
    set("scale", arg(op, args, "scale", 0, /*f32=*/true));
    set("q", ptr(q));
    set("k", ptr(kk));
    set("v", ptr(v));
    set("beta", betaPtr);
    if (fwd) {
      set("g", ptr(ins[3]));
      set("o", ptr(outs[0]));
      set("gCum", ptr(outs[1]));
      set("tMat", ptr(outs[2]));
      close("gdnChunkForward");
      return success();
    }
    set("gCum", ptr(ins[3]));
    set("tMat", ptr(ins[5]));
    set("dO", ptr(ins[6]));
    set("dq", ptr(outs[0]));
    set("dk", ptr(outs[1]));
    set("dv", ptr(outs[2]));
    set("dg", ptr(outs[3]));
    bool dbetaStored = dt(outs[4]) != acc;
    std::string dbetaScratch =
        "ap_scratch(r, " + std::to_string(256 + stage) + ")";
    set("dbeta", dbetaStored ? dbetaScratch : ptr(outs[4]));
    launchLine("gdnChunkBackward");
    if (dbetaStored)
      line(indent + 2) << "ap_convert(r, " << label << ", " << dbetaScratch
                       << ", " << abiDtype(acc) << ", " << ptr(outs[4]) << ", "
                       << abiDtype(dt(outs[4])) << ", " << nel(outs[4])
                       << ");\n";
    line(indent) << "}\n";
    return success();
  }
  if (callee == "train.gated_rms_norm" ||
      callee == "train.gated_rms_norm_grad") {
    bool fwd = callee == "train.gated_rms_norm";
    int64_t h = dim(ins[0], -2), d = dim(ins[0], -1);
    open("GdnGatedNormArgs");
    set("dtype", dt(ins[0]));
    set("tokens", std::to_string(nel(ins[0]) / (h * d)));
    set("heads", std::to_string(h));
    set("dim", std::to_string(d));
    set("x", ptr(ins[0]));
    set("z", ptr(ins[1]));
    set("w", ptr(ins[2]));
    if (fwd) {
      set("eps", arg(op, args, "eps", 1e-6, /*f32=*/true));
      set("y", ptr(outs[0]));
      set("rstd", ptr(outs[1]));
      close("gdnGatedNormForward");
    } else {
      set("rstd", ptr(ins[3]));
      set("dy", ptr(ins[4]));
      set("dx", ptr(outs[0]));
      set("dz", ptr(outs[1]));
      // A third result rebuilds the forward's output (train-fuse-recompute).
      if (results == 3)
        set("y", ptr(outs[2]));
      if (grads >= 1)
        set("dw", ptr(outs[results]));
      close("gdnGatedNormBackward");
    }
    return success();
  }
  if (callee == "train.rope" || callee == "train.rope_grad") {
    if (failed(expectCounts(1, 1)))
      return failure();
    open("RopeArgs");
    set("dtype", dt(ins[0]));
    set("x", ptr(ins[0]));
    set("y", ptr(outs[0]));
    set("batch", std::to_string(dim(ins[0], 0)));
    set("seq", std::to_string(dim(ins[0], 1)));
    set("heads", std::to_string(dim(ins[0], 2)));
    set("headDim", std::to_string(dim(ins[0], 3)));
    set("offset", std::to_string(intArg(args, "offset", 0)));
    set("rotaryDim",
        std::to_string(intArg(args, "rotary_dim", dim(ins[0], 3))));
    set("theta", arg(op, args, "theta", 1e4));
    close(callee == "train.rope" ? "ropeForward" : "ropeBackward");
    return success();
  }
  if (callee == "train.attention" || callee == "train.attention_grad") {
    bool fwd = callee == "train.attention";
    if (fwd ? failed(expectCounts(3, 2)) : failed(expectCounts(6, 3)))
      return failure();
    open(fwd ? "AttentionForwardArgs" : "AttentionBackwardArgs");
    set("dtype", dt(ins[0]));
    set("shape.batch", std::to_string(dim(ins[0], 0)));
    set("shape.seqLen", std::to_string(dim(ins[0], 1)));
    set("shape.numQHeads", std::to_string(dim(ins[0], 2)));
    set("shape.numKvHeads", std::to_string(dim(ins[1], 2)));
    set("shape.headDimQk", std::to_string(dim(ins[0], 3)));
    set("shape.headDimV", std::to_string(dim(ins[2], 3)));
    set("shape.softmaxScale", arg(op, args, "scale", 0));
    set("q", ptr(ins[0]));
    set("k", ptr(ins[1]));
    set("v", ptr(ins[2]));
    if (fwd) {
      set("o", ptr(outs[0]));
      set("lse", ptr(outs[1]));
      close("attentionForward");
    } else {
      set("o", ptr(ins[3]));
      set("lse", ptr(ins[4]));
      set("dO", ptr(ins[5]));
      set("dq", ptr(outs[0]));
      set("dk", ptr(outs[1]));
      set("dv", ptr(outs[2]));
      close("attentionBackward");
    }
    return success();
  }
  if (callee == "train.output_gate" || callee == "train.output_gate_grad") {
    bool fwd = callee == "train.output_gate";
    if (fwd ? failed(expectCounts(2, 1)) : failed(expectCounts(3, 2)))
      return failure();
    int64_t cols = dim(ins[0], -1), rows = nel(ins[0]) / cols;
    open(fwd ? "SigmoidGateForwardArgs" : "SigmoidGateBackwardArgs");
    set("dtype", dt(ins[0]));
    set("o", ptr(ins[0]));
    set("gate", ptr(ins[1]));
    set("rows", std::to_string(rows));
    set("cols", std::to_string(cols));
    if (fwd) {
      set("y", ptr(outs[0]));
      close("sigmoidGateForward");
    } else {
      set("dy", ptr(ins[2]));
      set("dout", ptr(outs[0]));
      set("dgate", ptr(outs[1]));
      close("sigmoidGateBackward");
    }
    return success();
  }
  if (callee == "train.swiglu" || callee == "train.swiglu_grad") {
    bool fwd = callee == "train.swiglu";
    // A backward with three results also rebuilds the forward's output
    // (train-fuse-recompute).
    bool rebuildsY = !fwd && outs.size() == 3;
    if (fwd ? failed(expectCounts(2, 1))
            : failed(expectCounts(3, rebuildsY ? 3 : 2)))
      return failure();
    int64_t cols = dim(ins[0], -1), rows = nel(ins[0]) / cols;
    open(fwd ? "SwiGluForwardArgs" : "SwiGluBackwardArgs");
    set("dtype", dt(ins[0]));
    set("gate", ptr(ins[0]));
    set("up", ptr(ins[1]));
    set("rows", std::to_string(rows));
    set("cols", std::to_string(cols));
    if (fwd) {
      set("y", ptr(outs[0]));
      close("swiGluForward");
    } else {
      set("dy", ptr(ins[2]));
      set("dgate", ptr(outs[0]));
      set("dup", ptr(outs[1]));
      if (rebuildsY)
        set("y", ptr(outs[2]));
      close("swiGluBackward");
    }
    return success();
  }
  if (callee == "train.add") {
    if (failed(expectCounts(2, 1)))
      return failure();
    open("ResidualAddArgs");
    set("dtype", dt(ins[0]));
    set("a", ptr(ins[0]));
    set("b", ptr(ins[1]));
    set("y", ptr(outs[0]));
    set("n", std::to_string(nel(outs[0])));
    close("residualAddForward");
    return success();
  }
  if (callee == "train.lm_head_cross_entropy" ||
      callee == "train.lm_head_cross_entropy_grad" ||
      callee == "train.lm_head_cross_entropy_with_grad") {
    bool fwd = callee == "train.lm_head_cross_entropy";
    bool fused = callee == "train.lm_head_cross_entropy_with_grad";
    if (fwd && failed(expectCounts(3, 3)))
      return failure();
    if (!fwd && ins.size() != (fused ? 3u : 4u))
      return op->emitError("emit-cpp: '")
             << callee << "' with " << ins.size() << " inputs (expected "
             << (fused ? 3 : 4) << ")";
    if (fused && results != 3)
      return op->emitError("emit-cpp: the fused lm head needs loss, count "
                           "and hidden-grad outputs");
    int64_t d = dim(ins[1], 1), vocab = dim(ins[1], 0);
    open("LmHeadCrossEntropyArgs");
    set("dtype", dt(ins[0]));
    set("hidden", ptr(ins[0]));
    set("weight", ptr(ins[1]));
    set("labels", "static_cast<const int32_t *>(" + ptr(ins[2]) + ")");
    set("tokens", std::to_string(nel(ins[0]) / d));
    set("dim", std::to_string(d));
    set("vocab", std::to_string(vocab));
    set("chunkTokens", std::to_string(intArg(args, "chunk_tokens", 1024)));
    set("ignoreIndex", std::to_string(intArg(args, "ignore_index", -100)));
    if (fwd) {
      set("lossSum", ptr(outs[0]));
      set("validCount", "static_cast<int32_t *>(" + ptr(outs[1]) + ")");
      set("lse", ptr(outs[2]));
      close("lmHeadCrossEntropyForward");
      return success();
    }
    // The backward entry writes the loss outputs too (kernels/dense.h): the
    // fused op's are its results, the grad op's are thrown away.
    // Sum of token losses: finalize_grads divides by the step's tokens.
    set("gradScale", "1.0");
    if (fused) {
      set("lossSum", ptr(outs[0]));
      set("validCount", "static_cast<int32_t *>(" + ptr(outs[1]) + ")");
      set("dHidden", ptr(outs[2]));
    } else {
      if (side)
        return notOnSide("its loss sum goes to the driver scratch");
      set("lossSum", "ap_scratch(r, 8)");
      if (results >= 1)
        set("dHidden", ptr(outs[0]));
    }
    if (grads >= 1)
      set("dWeight", ptr(outs[results]));
    close("lmHeadCrossEntropyBackward");
    return success();
  }
  if (callee == "train.yield") {
    if (failed(expectCounts(2, 2)))
      return failure();
    line(indent) << "ap_yield(r, " << off_[ins[0]] << "ull, " << off_[ins[1]]
                 << "ull);\n";
    return success();
  }
  if (callee == "train.finalize_grads") {
    line(indent) << "ap_finalize_grads(r, " << arg(op, args, "max_norm", 1.0)
                 << ");\n";
    return success();
  }
  if (callee == "train.lr_schedule") {
    line(indent) << "ap_lr_schedule(r, " << arg(op, args, "max_lr", 3e-4)
                 << ", " << arg(op, args, "min_lr", 0) << ", "
                 << intArg(args, "warmup_steps", 0) << ", "
                 << intArg(args, "total_steps", 1) << ");\n";
    return success();
  }
  if (callee == "train.adamw") {
    auto sym = args ? args.getAs<FlatSymbolRefAttr>("param") : nullptr;
    if (!sym || !paramIndex_.count(sym.getValue()))
      return op->emitError("emit-cpp: train.adamw without a known `param`");
    line(indent) << "ap_adamw_step(r, " << paramIndex_[sym.getValue()] << ", "
                 << arg(op, args, "beta1", 0.9) << ", "
                 << arg(op, args, "beta2", 0.999) << ", "
                 << arg(op, args, "eps", 1e-8) << ", "
                 << arg(op, args, "weight_decay", 0) << "); // "
                 << cppString(sym.getValue()) << "\n";
    return success();
  }
  if (callee == "train.loss_mean") {
    line(indent) << "ap_loss_mean(r);\n";
    return success();
  }
  return op->emitError("emit-cpp: unsupported kernel '") << callee << "'";
}

} // namespace

LogicalResult emitCpp(ModuleOp module, llvm::raw_ostream &os,
                      EmittedPlan *plan) {
  // Written to a buffer first, so that a failure leaves `os` untouched.
  std::string body;
  llvm::raw_string_ostream bos(body);
  Emitter e(module, bos);
  if (failed(e.run(plan)))
    return failure();
  os << body;
  return success();
}

void registerEmitCppTranslation() {
  TranslateFromMLIRRegistration reg(
      "emit-cpp", "exec.step -> C++ training step (runtime + kernels)",
      [](Operation *op, llvm::raw_ostream &os) -> LogicalResult {
        auto m = dyn_cast<ModuleOp>(op);
        if (!m)
          return op->emitError("emit-cpp: expected a builtin.module");
        return emitCpp(m, os);
      },
      [](DialectRegistry &registry) {
        registry.insert<exec::ExecDialect, train::TrainDialect,
                        func::FuncDialect, arith::ArithDialect, scf::SCFDialect,
                        tensor::TensorDialect>();
      });
}

} // namespace ap::codegen
