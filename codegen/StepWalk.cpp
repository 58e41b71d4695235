//===- StepWalk.cpp - exec.step -> runtime calls and program tables -------===//
//
// One pass over the step in program order (program order is enqueue order,
// docs/exec-dialect.md): host-side ops (buffers, views, events, pool
// acquire/release) become nothing at run time (their offsets and indices are
// folded into the calls); everything else becomes a call of the runtime's C
// ABI (runtime/abi.h): stream ops become ap_record / ap_wait / ap_offload /
// ap_reload, kernel calls an ap_launch of their AP_KERNEL_LIST id with the
// args struct filled from the buffer types and the op's `args`, and the ops
// without a kernel entry of their own (slice, concat, expand, the GDN gates,
// the step-level scalar ops) their ap_* call. The program description is a
// ProgramDesc. A StepSink writes both down (StepSink.h).
//
//===----------------------------------------------------------------------===//
#include "codegen/StepSink.h"

#include "dialect/exec/ExecDialect.h"
#include "dialect/exec/ExecOps.h"
#include "dialect/exec/KernelSignatures.h"
#include "dialect/train/TrainDialect.h"
#include "dialect/train/TrainOps.h"
#include "kernelgen/KernelGen.h"

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Format.h"

#include <cmath>
#include <limits>
#include <map>
#include <new>
#include <set>
#include <string>
#include <vector>

using namespace mlir;
using namespace ap::kernels;

namespace ap::codegen {

std::string cppString(StringRef s) {
  // Everything that reaches generated source from the model (its name,
  // parameter and scope names, op names) goes through here, as data and
  // never as code: printable ASCII stays as it is except `\`, `"` and `?`
  // (escaped, so no `??/` trigraph can form); every other byte (newlines,
  // control characters, the bytes of non-ASCII UTF-8) becomes a three-digit
  // octal escape, which, unlike `\x`, cannot run into a following digit. The
  // literal holds the same bytes as `s`, and no line of it ends in a
  // backslash, so it is also safe in a `//` comment (no line splice). No
  // identifier is ever made from a name.
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

/// The kernel library's DType of an element type (the ABI's AP_DTYPE_* have
/// the same values).
std::optional<DType> dtypeOf(Type e) {
  if (e.isBF16())
    return DType::BF16;
  if (e.isF32())
    return DType::F32;
  if (e.isF64())
    return DType::F64;
  if (e.isInteger(32))
    return DType::I32;
  return std::nullopt;
}

const char *dtypeSuffix(DType d) {
  switch (d) {
  case DType::BF16:
    return "BF16";
  case DType::F32:
    return "F32";
  case DType::F64:
    return "F64";
  case DType::I32:
    return "I32";
  }
  return "BF16";
}

/// A DType as a call argument (AP_DTYPE_*).
CallArg abiDtype(DType d) {
  return CallArg::i32(int32_t(d), std::string("AP_DTYPE_") + dtypeSuffix(d));
}

/// The AP_KERNEL_* id of a kernel entry of kernels/kernels.h, from the
/// runtime ABI's own list (runtime/abi.h), so that the compiler and the
/// runtime cannot disagree on ids; -1 for an entry the ABI lacks.
std::pair<int32_t, StringRef> kernelId(StringRef entry) {
#define AP_KERNEL_ENTRY_NAME(ID, fn, Args)                                     \
  {#fn, "AP_KERNEL_" #ID, AP_KERNEL_##ID},
  static const struct {
    StringRef fn, name;
    int32_t id;
  } kIds[] = {AP_KERNEL_LIST(AP_KERNEL_ENTRY_NAME)};
#undef AP_KERNEL_ENTRY_NAME
  for (const auto &k : kIds)
    if (k.fn == entry)
      return {k.id, k.name};
  return {-1, {}};
}

/// `v` printed exactly (%.17g round-trips a double).
std::string fmtDouble(double v) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format("%.17g", v);
  return s;
}

/// `v` as a C++ float literal that reads back as `v` (%.9g round-trips a
/// float; "1f" is not a literal, "1.0f" is).
std::string fmtFloat(float v) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format("%.9g", double(v));
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s + "f";
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

/// The C++ cast a typed pointer field needs from ap_at's `void *`.
template <typename P> std::string ptrCast() {
  using T = std::remove_cv_t<std::remove_pointer_t<P>>;
  if constexpr (std::is_void_v<T>)
    return "";
  else if constexpr (std::is_same_v<T, int32_t>)
    return std::is_const_v<std::remove_pointer_t<P>> ? "const int32_t *"
                                                     : "int32_t *";
  else
    static_assert(std::is_void_v<T>, "add the field's pointer type here");
}

/// A kernels/kernels.h args struct filled in the compiler: default
/// constructed over zeroed bytes (padding stays zero), each set recorded.
template <typename A> class ArgsOf {
public:
  explicit ArgsOf(const char *type) {
    std::memset(storage_, 0, sizeof storage_);
    a = new (storage_) A();
    out.type = type;
    out.align = alignof(A);
  }
  /// A scalar field (integer, enum, bool, float, double).
  template <typename F, typename V>
  void val(F &field, const std::string &name, V v) {
    field = static_cast<F>(v);
    std::string text;
    if constexpr (std::is_same_v<F, bool>)
      text = field ? "true" : "false";
    else if constexpr (std::is_same_v<F, DType>)
      text = std::string("DType::") + dtypeSuffix(field);
    else if constexpr (std::is_same_v<F, GdnConvKernels>)
      text = field == GdnConvKernels::Staged ? "GdnConvKernels::Staged"
             : field == GdnConvKernels::PerElement
                 ? "GdnConvKernels::PerElement"
                 : "GdnConvKernels::Fastest";
    else if constexpr (std::is_same_v<F, float>)
      text = fmtFloat(field);
    else if constexpr (std::is_same_v<F, double>) {
      text = fmtDouble(field);
      if (text.find_first_of(".en") == std::string::npos)
        text += ".0"; // reads as a double (1.0, not 1)
    } else
      text = std::to_string(field);
    out.fields.push_back({name, text, offsetOf(&field)});
  }
  /// A pointer field: resolved at run time from `addr`.
  template <typename P> void ptr(P &field, const std::string &name, Addr addr) {
    static_assert(std::is_pointer_v<P>, "ptr() sets pointer fields");
    KernelArgs::Field f{name, "", offsetOf(&field), true, addr, ptrCast<P>()};
    out.fields.push_back(std::move(f));
  }
  /// The filled struct.
  const KernelArgs &done() {
    out.bytes.assign(storage_, storage_ + sizeof(A));
    return out;
  }

  A *a;

private:
  uint64_t offsetOf(const void *field) const {
    return uint64_t(static_cast<const unsigned char *>(field) - storage_);
  }
  alignas(A) unsigned char storage_[sizeof(A)];
  KernelArgs out;
};

#define SETV(field, value) A.val(A.a->field, #field, value)
#define SETP(field, value) A.ptr(A.a->field, #field, value)

/// First kernel (in block order) that reads `v` or a view of it.
Operation *firstKernelReader(Value v) {
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

class Walker {
public:
  Walker(ModuleOp module, StepSink &sink, StringRef tool)
      : module_(module), sink_(sink), tool_(tool.str()) {}

  LogicalResult run(EmittedPlan *plan);

private:
  LogicalResult collect(Operation *step);
  LogicalResult walkBlock(Block &block);
  LogicalResult walkOp(Operation *op);
  LogicalResult walkKernel(Operation *op);
  LogicalResult offsetOf(Value v, Operation *user, uint64_t &out);
  std::string pfx() const { return tool_ + ": "; }
  Addr at(Value v) { return {Addr::Arena, off_[v]}; }
  CallArg off(Value v) { return CallArg::u64(off_[v]); }
  static CallArg stream(Operation *op) {
    switch (intAttr(op, "stream", 0)) {
    case 1:
      return CallArg::i32(AP_STREAM_D2H, "AP_STREAM_D2H");
    case 2:
      return CallArg::i32(AP_STREAM_H2D, "AP_STREAM_H2D");
    case 3:
      return CallArg::i32(AP_STREAM_COMM, "AP_STREAM_COMM");
    case 4:
      return CallArg::i32(AP_STREAM_SIDE, "AP_STREAM_SIDE");
    default:
      return CallArg::i32(AP_STREAM_COMPUTE, "AP_STREAM_COMPUTE");
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
  /// `v`, attribute `attr` of `op`, checked for the kernel argument it
  /// becomes (a float one with `f32`): a value the argument cannot carry
  /// (not finite; with `f32`, beyond float's range, or a nonzero that float
  /// rounds to zero) is recorded in numError_, and the caller fails once
  /// the op is walked.
  double num(Operation *op, double v, StringRef attr, bool f32 = false);
  /// num() of the kernel argument `name` (`dflt` when absent).
  double arg(Operation *op, DictionaryAttr args, StringRef name, double dflt,
             bool f32 = false) {
    return num(op, dblArg(args, name, dflt), name, f32);
  }
  /// The first number num() refused, as a diagnostic on its op.
  LogicalResult numbersOk() {
    if (!numOp_)
      return success();
    return numOp_->emitError(pfx()) << numError_;
  }

  ModuleOp module_;
  StepSink &sink_;
  std::string tool_;
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
  /// Bytes of one GDN gate staging array the step needs (collect()).
  uint64_t gateStage_ = 0;
  /// The driver scratch buffer (exec.persistent of role scratch).
  exec::PersistentOp scratch_;
  /// Where the dbeta staging array starts in the driver scratch: after the
  /// scalars and the beta array, each array half of the rest.
  uint64_t dbetaStage() {
    uint64_t bytes = scratch_ ? uint64_t(scratch_.getBytes()) : 0;
    uint64_t rest =
        bytes > AP_SCRATCH_SCALAR_BYTES ? bytes - AP_SCRATCH_SCALAR_BYTES : 0;
    return AP_SCRATCH_SCALAR_BYTES + rest / 2;
  }
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
  /// exec.step kernels = "generated": element-wise and row-wise calls with
  /// a kernelgen group launch the generated kernel.
  bool generated_ = false;
  /// exec.step short_conv_kernels: what GdnConvArgs::kernels asks for.
  GdnConvKernels convKernels_ = GdnConvKernels::Fastest;
  /// exec.step generated_ops: the train ops that take generated kernels
  /// (empty: every op with a group).
  std::set<std::string> generatedOps_;
  /// Launched generated kernels, each once, and their index by name.
  std::vector<ProgramDesc::Generated> genSpecs_;
  std::map<std::string, unsigned> genIndex_;
  /// The program's index of kernelgen kernel `spec`, added on first use.
  unsigned generatedIndex(const kernelgen::GroupSpec &spec) {
    auto [it, fresh] = genIndex_.try_emplace(kernelgen::kernelName(spec),
                                             unsigned(genSpecs_.size()));
    if (fresh)
      genSpecs_.push_back({spec, std::nullopt});
    return it->second;
  }
  /// --triton-kernel: the Triton kernel implementing each op (by callee).
  std::map<std::string, TritonKernel> triton_;
  size_t genLaunches_ = 0; ///< generated launches in the step's text
  /// Main grads of each dtype exist (the grad norm's generated kernels).
  bool mainGradBf16_ = false, mainGradF32_ = false;
};

double Walker::num(Operation *op, double v, StringRef attr, bool f32) {
  std::string why;
  if (!std::isfinite(v))
    why = "is not finite";
  else if (f32 && std::fabs(v) > double(std::numeric_limits<float>::max()))
    why = "is beyond the range of float (the kernel argument is a float)";
  else if (f32 && v != 0 && float(v) == 0)
    why = "rounds to 0 as a float (the kernel argument is a float)";
  if (why.empty())
    return v;
  if (!numOp_) {
    numOp_ = op;
    numError_ = "attribute '" + attr.str() + "' of '" +
                op->getName().getStringRef().str() + "'";
    if (auto k = dyn_cast<exec::KernelOp>(op))
      numError_ += " (" + k.getCallee().str() + ")";
    numError_ += " = " + fmtDouble(v) + " " + why;
  }
  return 0;
}

LogicalResult Walker::offsetOf(Value v, Operation *user, uint64_t &out) {
  auto it = off_.find(v);
  if (it == off_.end())
    return user->emitError(pfx() + "operand has no planned arena offset "
                                   "(run exec-plan-memory first)");
  out = it->second;
  return success();
}

LogicalResult Walker::collect(Operation *step) {
  WalkResult r = step->walk([&](Operation *op) -> WalkResult {
    if (auto b = dyn_cast<exec::BufferOp>(op)) {
      int64_t o = intAttr(op, "offset");
      if (o < 0)
        return op->emitError(pfx() + "exec.buffer without a planned offset "
                                     "(run exec-plan-memory first)"),
               WalkResult::interrupt();
      off_[b->getResult(0)] = uint64_t(o);
    } else if (auto p = dyn_cast<exec::PersistentOp>(op)) {
      int64_t o = intAttr(op, "offset");
      if (o < 0)
        return op->emitError(pfx() + "exec.persistent without a planned "
                                     "offset (run exec-plan-memory first)"),
               WalkResult::interrupt();
      off_[p->getResult(0)] = uint64_t(o);
      persistent_[p.getName().str()]
                 [exec::stringifyBufferRole(p.getRole()).str()] = uint64_t(o);
      if (p.getRole() == exec::BufferRole::MainGrad)
        (tensorOf(p->getResult(0)).getElementType().isBF16() ? mainGradBf16_
                                                             : mainGradF32_) =
            true;
      if (p.getRole() == exec::BufferRole::Scratch) {
        if (scratch_)
          return op->emitError(pfx() + "a second driver scratch buffer"),
                 WalkResult::interrupt();
        scratch_ = p;
      }
    } else if (auto v = dyn_cast<exec::ViewOp>(op)) {
      auto it = off_.find(op->getOperand(0));
      if (it == off_.end())
        return op->emitError(pfx() + "view of an unplanned buffer"),
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
        return op->emitError(pfx() + "offloaded value is never reloaded and "
                                     "read by a kernel; cannot name its scope"),
               WalkResult::interrupt();
      std::string name = scopeName(cast<exec::KernelOp>(reader).getArgs());
      if (name.empty())
        return op->emitError(pfx() + "the reader of an offloaded value has "
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

LogicalResult Walker::run(EmittedPlan *plan) {
  Operation *step = nullptr;
  SmallVector<train::ParamOp> params;
  for (Operation &op : module_.getBody()->getOperations()) {
    if (isa<exec::StepOp>(op)) {
      if (step)
        return op.emitError(pfx() + "more than one exec.step");
      step = &op;
    } else if (auto p = dyn_cast<train::ParamOp>(op)) {
      params.push_back(p);
    }
  }
  if (!step)
    return module_.emitError(pfx() + "no exec.step in the module (run "
                                     "convert-train-to-exec first)");
  if (failed(collect(step)))
    return failure();
  if (Attribute t = step->getAttr(exec::kTritonKernelsAttr)) {
    auto list = dyn_cast<ArrayAttr>(t);
    if (!list)
      return step->emitError(pfx() + "exec.step's ")
             << exec::kTritonKernelsAttr << " is not an array";
    for (Attribute entry : list) {
      std::string error = "an entry is not a dictionary";
      auto dict = dyn_cast<DictionaryAttr>(entry);
      std::optional<TritonKernel> k =
          dict ? TritonKernel::fromAttr(dict, error) : std::nullopt;
      if (!k)
        return step->emitError(pfx() + "exec.step's ")
               << exec::kTritonKernelsAttr << ": " << error;
      if (!triton_.emplace(k->op, *k).second)
        return step->emitError(pfx() + "two Triton kernels implement '")
               << k->op << "'";
    }
    if (!triton_.empty() && !sink_.holdsGeneratedKernels())
      return step->emitError(pfx() + "the step has Triton kernels, which "
                                     "this output form cannot hold (the "
                                     "readable C++ form; build the binary "
                                     "through LLVM)");
  }
  if (Attribute k = step->getAttr(exec::kKernelsAttr)) {
    auto mode = dyn_cast<StringAttr>(k);
    if (!mode ||
        (mode.getValue() != "library" && mode.getValue() != "generated"))
      return step->emitError(pfx() + "exec.step has ")
             << exec::kKernelsAttr << " = " << k
             << " (expected \"library\" or \"generated\")";
    generated_ = mode.getValue() == "generated";
    if (generated_ && !sink_.holdsGeneratedKernels())
      return step->emitError(pfx() + "exec.step has ")
             << exec::kKernelsAttr
             << " = \"generated\", which this output form cannot hold (the "
                "readable C++ form has no generated kernels; build the "
                "binary through LLVM)";
  }
  if (Attribute k = step->getAttr(exec::kShortConvKernelsAttr)) {
    auto mode = dyn_cast<StringAttr>(k);
    if (mode && mode.getValue() == "staged")
      convKernels_ = GdnConvKernels::Staged;
    else if (mode && mode.getValue() == "per-element")
      convKernels_ = GdnConvKernels::PerElement;
    else
      return step->emitError(pfx() + "exec.step has ")
             << exec::kShortConvKernelsAttr << " = " << k
             << " (expected \"staged\" or \"per-element\")";
  }
  if (Attribute ops = step->getAttr(exec::kGeneratedOpsAttr)) {
    auto list = dyn_cast<ArrayAttr>(ops);
    if (!list || !generated_)
      return step->emitError(pfx() + "exec.step has ")
             << exec::kGeneratedOpsAttr << " = " << ops
             << " (expected an array of train op names, with kernels = "
                "\"generated\")";
    for (Attribute a : list) {
      auto name = dyn_cast<StringAttr>(a);
      if (!name)
        return step->emitError(pfx() + "exec.step has ")
               << exec::kGeneratedOpsAttr << " entry " << a
               << " (expected a train op name)";
      generatedOps_.insert(name.str());
    }
  }
  gateStage_ = uint64_t(exec::alignTo256(int64_t(maxGateElems_) * 8));
  for (train::ParamOp p : params)
    paramIndex_[p.getSymName()] = paramIndex_.size();

  auto stepAttr = [&](StringRef n) { return intAttr(step, n, 0); };
  ProgramDesc d;
  d.arenaBytes = uint64_t(stepAttr("arena_bytes"));
  if (d.arenaBytes == 0)
    return step->emitError(pfx() + "exec.step has no arena_bytes (run "
                                   "exec-plan-memory first)");

  // The microbatch input shape comes from load_input "tokens".
  d.batch = 1;
  d.seq = 1;
  d.microBatches = stepAttr("micro_batches");
  step->walk([&](exec::LoadInputOp l) {
    RankedTensorType t = tensorOf(l->getOperand(0));
    if (t && t.getRank() == 2) {
      d.batch = t.getDimSize(0);
      d.seq = t.getDimSize(1);
    }
  });
  step->walk([&](exec::KernelOp k) {
    // A vocab-parallel table is a block of the vocabulary; the lowering
    // records the whole one in the step's `vocab` (below).
    if (k.getCallee() == "train.embedding")
      d.vocab = tensorOf(k.getInputs()[1]).getDimSize(0);
    if (k.getCallee() == "train.lr_schedule")
      d.maxLr = dblArg(k.getArgs(), "max_lr", 0);
    if (k.getCallee() == "train.doc_starts")
      d.documentSeparator = intArg(k.getArgs(), "separator", -1);
    if (k.getCallee().starts_with("train.lm_head_cross_entropy"))
      d.ignoreIndex = intArg(k.getArgs(), "ignore_index", -100);
  });
  // Recorded by the lowering (a pipeline stage may load no tokens and hold
  // no embedding).
  if (attrOf(step, "batch") && attrOf(step, "seq")) {
    d.batch = stepAttr("batch");
    d.seq = stepAttr("seq");
  }
  if (attrOf(step, "vocab"))
    d.vocab = stepAttr("vocab");
  if (!d.vocab)
    d.vocab = 256;
  if (auto m = module_->getAttrOfType<StringAttr>(train::kModelNameAttrName))
    d.model = m.getValue().str();

  d.persistentBytes = uint64_t(stepAttr("persistent_bytes"));
  d.activationBytes = uint64_t(stepAttr("activation_bytes"));
  d.workspaceBytes = uint64_t(stepAttr("workspace_bytes"));
  d.sideWorkspaceBytes = uint64_t(stepAttr("side_workspace_bytes"));
  d.pinnedBytes = uint64_t(stepAttr("pinned_bytes"));
  // The side workspace is described only where the plan has one or the
  // step has side kernels.
  d.describeSide = d.sideWorkspaceBytes > 0 || sideKernels_;

  if (failed(walkBlock(step->getRegion(0).front())))
    return failure();
  // The driver scratch is the plan's buffer of role `scratch`
  // (convert-train-to-exec declares it, exec-plan-memory places it).
  if (!scratch_)
    return step->emitError(pfx() + "exec.step has no driver scratch buffer "
                                   "(exec.persistent of role scratch, which "
                                   "convert-train-to-exec declares)");
  d.scratchOffset = off_[scratch_->getResult(0)];
  d.scratchBytes = uint64_t(scratch_.getBytes());
  if (d.scratchBytes < AP_SCRATCH_SCALAR_BYTES + 2 * gateStage_)
    return scratch_->emitError(pfx() + "the driver scratch has ")
           << d.scratchBytes << " bytes; the step's GDN gates need "
           << AP_SCRATCH_SCALAR_BYTES + 2 * gateStage_;

  d.sideKernels = sideKernels_;
  d.sideAfterHostStart = sideAfterHost_;
  d.generated = genSpecs_;
  int64_t dpSize = attrOf(step, exec::kDataParallelSizeAttr)
                       ? stepAttr(exec::kDataParallelSizeAttr)
                       : 1;
  if (dpSize < 1 || dpSize > (int64_t(1) << 20))
    return step->emitError(pfx() + "exec.step has ")
           << exec::kDataParallelSizeAttr << " " << dpSize
           << " (expected 1 or more ranks)";
  d.dataParallelSize = int32_t(dpSize);
  if (attrOf(step, exec::kTensorParallelAttr)) {
    int64_t tp = stepAttr(exec::kTensorParallelAttr);
    if (tp < 1 || tp > 1024)
      return step->emitError(pfx() + "exec.step has tensor_parallel ")
             << tp << " (expected 1 to 1024 ranks)";
    d.tensorParallelSize = int32_t(tp);
  }
  if (attrOf(step, "pipeline_stages")) {
    int64_t stages = stepAttr("pipeline_stages");
    int64_t stage = stepAttr("pipeline_stage");
    if (stages < 1 || stages > 4096 || stage < 0 || stage >= stages)
      return step->emitError(pfx() + "exec.step is pipeline stage ")
             << stage << " of " << stages
             << " (expected 0 <= stage < stages <= 4096)";
    d.pipelineSize = int32_t(stages);
    d.pipelineStage = int32_t(stage);
  }
  d.dataParallelMode = AP_DP_REPLICATE;
  if (auto mode =
          step->getAttrOfType<StringAttr>(exec::kDataParallelModeAttr)) {
    if (mode.getValue() == "zero3")
      d.dataParallelMode = AP_DP_ZERO3;
    else if (mode.getValue() != "replicate")
      return step->emitError(pfx() + "exec.step has ")
             << exec::kDataParallelModeAttr << " '" << mode.getValue()
             << "' (expected replicate or zero3)";
  }
  // Side GEMMs' SM share: the cost model's (convert-train-to-exec writes
  // it from the device profile), required once the step has side kernels.
  if (sideKernels_) {
    int64_t sideSmPercent = stepAttr(exec::kSideSmPercentAttr);
    if (sideSmPercent < 1 || sideSmPercent > 100) {
      std::string got = attrOf(step, exec::kSideSmPercentAttr)
                            ? std::to_string(sideSmPercent)
                            : std::string("absent");
      return step->emitError(pfx() + "exec.step has side-stream kernels "
                                     "but its ")
             << exec::kSideSmPercentAttr << " is " << got
             << " (expected 1 to 100, set by convert-train-to-exec from the "
                "device profile's sideSmPercent)";
    }
    d.sideSmPercent = int32_t(sideSmPercent);
  }

  unsigned numSlots = 0;
  for (auto &[s, spec] : slotSpec_)
    numSlots = std::max(numSlots, s + 1);
  for (unsigned s = 0; s < numSlots; ++s) {
    auto it = slotSpec_.find(s);
    d.slots.push_back(it == slotSpec_.end() ? std::pair<uint64_t, uint64_t>{}
                                            : it->second);
  }
  d.scopes = scopes_;
  if (auto fields =
          module_->getAttrOfType<DictionaryAttr>(train::kModelConfigAttrName))
    for (NamedAttribute field : fields)
      d.modelConfig.emplace_back(
          field.getName().str(),
          cast<StringAttr>(field.getValue()).getValue().str());

  for (train::ParamOp p : params) {
    std::string name = p.getSymName().str();
    auto pit = persistent_.find(name);
    if (pit == persistent_.end() || !pit->second.count("weight"))
      return p->emitError(pfx() + "parameter '")
             << name << "' has no persistent weight buffer in the exec.step";
    auto t = dyn_cast<RankedTensorType>(p.getType());
    if (!t) {
      // train.param's type is a tensor-like param type; read the weight's.
      for (Operation &op : step->getRegion(0).front())
        if (auto po = dyn_cast<exec::PersistentOp>(op))
          if (po.getName() == name && po.getRole() == exec::BufferRole::Weight)
            t = tensorOf(po->getResult(0));
    }
    std::optional<DType> dtype = t ? dtypeOf(t.getElementType()) : std::nullopt;
    if (!t || t.getRank() > 4 || !dtype)
      return p->emitError(pfx() + "parameter '")
             << name << "' needs a ranked tensor type of rank <= 4 of bf16, "
             << "f32, f64 or i32";
    ProgramDesc::Param q;
    q.name = name;
    q.dtype = int32_t(*dtype);
    q.dtypeName = std::string("AP_DTYPE_") + dtypeSuffix(*dtype);
    q.rank = int32_t(t.getRank());
    for (int64_t i = 0; i < t.getRank(); ++i)
      q.shape[i] = t.getDimSize(i);
    q.numel = numel(t);
    train::InitAttr init = p.getInit();
    switch (init.getKind()) {
    case train::InitKind::Zeros:
      q.init = AP_INIT_ZEROS, q.initName = "AP_INIT_ZEROS";
      break;
    case train::InitKind::Ones:
      q.init = AP_INIT_ONES, q.initName = "AP_INIT_ONES";
      break;
    case train::InitKind::Normal:
      q.init = AP_INIT_NORMAL, q.initName = "AP_INIT_NORMAL";
      break;
    case train::InitKind::Uniform:
      q.init = AP_INIT_UNIFORM, q.initName = "AP_INIT_UNIFORM";
      break;
    case train::InitKind::LogUniform:
      q.init = AP_INIT_LOG_UNIFORM, q.initName = "AP_INIT_LOG_UNIFORM";
      break;
    }
    q.frozen = p.getFrozen();
    q.initA = num(p, init.getA().convertToDouble(), "init.a");
    q.initB = num(p, init.getB().convertToDouble(), "init.b");
    const char *roles[] = {"weight", "master", "main_grad", "adam_m", "adam_v"};
    for (int i = 0; i < 5; ++i) {
      auto it = pit->second.find(roles[i]);
      if (it != pit->second.end())
        q.offsets[i] = it->second;
    }
    if (auto it = pit->second.find("tied_grad"); it != pit->second.end())
      q.tiedGradOffset = it->second;
    // ZeRO-3: the persistent buffers are this rank's shards of the
    // flattened parameter (exec-shard-params).
    if (d.dataParallelMode == AP_DP_ZERO3) {
      q.shardNumel = (q.numel + dpSize - 1) / dpSize;
      for (Operation &op : step->getRegion(0).front())
        if (auto po = dyn_cast<exec::PersistentOp>(op))
          if (po.getName() == name &&
              po.getRole() == exec::BufferRole::MainGrad)
            q.mainGradBf16 =
                tensorOf(po->getResult(0)).getElementType().isBF16();
      int64_t held = -1;
      for (Operation &op : step->getRegion(0).front())
        if (auto po = dyn_cast<exec::PersistentOp>(op))
          if (po.getName() == name && po.getRole() == exec::BufferRole::Weight)
            held = numel(tensorOf(po->getResult(0)));
      if (held != q.shardNumel)
        return p->emitError(pfx() + "parameter '")
               << name << "' has a weight buffer of " << held
               << " elements; a zero3 step over " << dpSize
               << " ranks holds shards of " << q.shardNumel
               << " (run exec-shard-params)";
    }
    if (auto tied = step->getAttrOfType<ArrayAttr>("pipeline_tied"))
      q.pipelineTied = llvm::any_of(tied, [&](Attribute a) {
        return cast<StringAttr>(a).getValue() == name;
      });
    if (std::optional<uint64_t> dim = p.getTpDim()) {
      if (p.getTpSegments()->size() > 4)
        return p->emitError(pfx() + "parameter '")
               << name << "' is split into " << p.getTpSegments()->size()
               << " segments (the runtime takes at most 4)";
      q.tpDim = int32_t(*dim);
      q.tpSegments.assign(p.getTpSegments()->begin(), p.getTpSegments()->end());
    }
    q.tpGradSum = p.getTpGradSum();
    d.params.push_back(std::move(q));
  }
  // The optimizer as the step runs it (the same arguments and defaults as
  // its calls in the step), as numbers: the run configuration a checkpoint
  // records, so that a resume under other settings is refused.
  step->walk([&](exec::KernelOp k) {
    Operation *op = k.getOperation();
    DictionaryAttr args = k.getArgs();
    if (k.getCallee() == "train.lr_schedule") {
      d.minLr = arg(op, args, "min_lr", 0);
      d.warmupSteps = intArg(args, "warmup_steps", 0);
      d.totalSteps = intArg(args, "total_steps", 1);
    } else if (k.getCallee() == "train.finalize_grads") {
      d.maxGradNorm = arg(op, args, "max_norm", 1.0);
    } else if (k.getCallee() == "train.adamw") {
      auto sym = args ? args.getAs<FlatSymbolRefAttr>("param") : nullptr;
      if (sym && paramIndex_.count(sym.getValue()))
        d.adamw.push_back(
            {int64_t(paramIndex_[sym.getValue()]), arg(op, args, "beta1", 0.9),
             arg(op, args, "beta2", 0.999), arg(op, args, "eps", 1e-8),
             arg(op, args, "weight_decay", 0)});
    }
  });
  const char *stateNames[] = {"loss_sum", "token_count", "grad_norm", "lr",
                              "loss"};
  for (int i = 0; i < 5; ++i) {
    auto it = persistent_.find(stateNames[i]);
    if (it != persistent_.end() && it->second.count("state"))
      d.stateOffsets[i] = it->second["state"];
  }
  d.maxLr = num(step, d.maxLr, "max_lr");
  d.numEvents = numEvents_;
  if (failed(numbersOk()))
    return failure();
  if (failed(sink_.program(d)))
    return failure();

  if (plan) {
    plan->arenaBytes = d.arenaBytes;
    plan->persistentBytes = d.persistentBytes;
    plan->activationBytes = d.activationBytes;
    plan->workspaceBytes = d.workspaceBytes;
    plan->sideWorkspaceBytes = d.sideWorkspaceBytes;
    plan->pinnedBytes = d.pinnedBytes;
    plan->scratchBytes = d.scratchBytes;
    plan->numParams = d.params.size();
    plan->numSlots = d.slots.size();
    plan->numScopes = d.scopes.size();
    plan->numGenerated = d.generated.size();
    plan->generatedLaunches = genLaunches_;
  }
  return success();
}

/// Runs of ZeRO-3 gathers a block issues back to back on one stream (only
/// that stream's records and waits, and ops that make no call, between
/// them: a window's parameters, exec-shard-params): the first op and the
/// last op of each run of two or more gathers. The runtime may launch such
/// a run as one collective (ap_comm_group_begin / end); gathers copy
/// bytes, so no bit changes.
static std::pair<llvm::DenseSet<Operation *>, llvm::DenseSet<Operation *>>
gatherRuns(Block &block) {
  llvm::DenseSet<Operation *> firsts, lasts;
  Operation *first = nullptr, *last = nullptr;
  int64_t stream = -1, gathers = 0;
  auto close = [&] {
    if (gathers >= 2) {
      firsts.insert(first);
      lasts.insert(last);
    }
    first = last = nullptr;
    gathers = 0;
  };
  for (Operation &op : block) {
    auto g = dyn_cast<exec::AllGatherOp>(op);
    bool dpGather = g && g.getCommunicator() == "dp";
    int64_t s = intAttr(&op, "stream", 0);
    if (dpGather && first && s == stream) {
      ++gathers;
      last = &op;
      continue;
    }
    if (first && s == stream && isa<exec::RecordOp, exec::WaitOp>(op)) {
      last = &op;
      continue;
    }
    // Folded into the calls' operands: no call of their own.
    if (first && isa<exec::BufferOp, exec::PersistentOp, exec::ViewOp,
                     exec::EventCreateOp>(op))
      continue;
    close();
    if (dpGather) {
      first = last = &op;
      stream = s;
      gathers = 1;
    }
  }
  close();
  return {firsts, lasts};
}

LogicalResult Walker::walkBlock(Block &block) {
  auto [firsts, lasts] = gatherRuns(block);
  for (Operation &op : block) {
    if (firsts.contains(&op))
      sink_.call("ap_comm_group_begin", {stream(&op)});
    if (failed(walkOp(&op)))
      return failure();
    if (lasts.contains(&op))
      sink_.call("ap_comm_group_end", {stream(&op)});
  }
  return success();
}

LogicalResult Walker::walkOp(Operation *op) {
  if (isa<exec::BufferOp, exec::PersistentOp, exec::ViewOp, exec::PoolAcquireOp,
          exec::EventCreateOp>(op))
    return success(); // folded into the calls (offsets, slot and event ids)
  if (isa<exec::PoolReleaseOp>(op))
    return success(); // OffloadEngine::reload releases on the H2D event
  if (isa<exec::ReturnOp>(op)) {
    sink_.note("exec.return: loss and grad norm are in the state buffers and "
               "on the runner.");
    return success();
  }
  if (auto loop = dyn_cast<exec::MicrobatchLoopOp>(op)) {
    sink_.beginLoop(intAttr(op, "count", 1));
    sink_.call("ap_begin_microbatch", {CallArg::loopIndex()});
    if (failed(walkBlock(op->getRegion(0).front())))
      return failure();
    sink_.endLoop();
    sink_.call("ap_end_loop", {});
    return success();
  }
  if (isa<exec::RecordOp>(op)) {
    sink_.call("ap_record",
               {CallArg::u32(eventIndex(op->getOperand(0))), stream(op)});
    return success();
  }
  if (isa<exec::WaitOp>(op)) {
    unsigned e = eventIndex(op->getOperand(0));
    CallArg s = stream(op);
    if (s.i == AP_STREAM_D2H)
      lastD2HWait_ = int(e);
    // Compute waiting for a reload: through the runner, which times the
    // stall under "<scope>/wait" when --op-times asks for it.
    if (s.i == AP_STREAM_COMPUTE)
      for (Operation *u : op->getOperand(0).getUsers())
        if (isa<exec::H2DOp>(u) && u->getOperand(2) == op->getOperand(0) &&
            copyScope_.count(u)) {
          sink_.call("ap_wait_copy",
                     {CallArg::str(copyScope_[u] + "/wait"), CallArg::u32(e)});
          return success();
        }
    sink_.call("ap_wait", {s, CallArg::u32(e)});
    return success();
  }
  if (isa<exec::LoadInputOp>(op)) {
    uint64_t o;
    if (failed(offsetOf(op->getOperand(0), op, o)))
      return failure();
    auto name = cast<StringAttr>(*attrOf(op, "name"));
    sink_.call(cast<exec::LoadInputOp>(op).getTpShard() ? "ap_load_input_shard"
                                                        : "ap_load_input",
               {CallArg::str(name.getValue().str()), CallArg::u64(o),
                CallArg::u64(numel(tensorOf(op->getOperand(0))) * 4)});
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
    // copy (the copy reads bytes compute wrote). Code generation adds no
    // event of its own: scheduling is the passes' decision.
    int producer = lastD2HWait_;
    if (producer < 0)
      return op->emitError(
          pfx() + "exec.d2h with no earlier exec.wait on the d2h stream "
                  "to order it after its producer (run exec-schedule-streams)");
    sink_.call("ap_offload",
               {CallArg::u32(scopeIndex_[copyScope_[op]]), CallArg::u32(slot),
                CallArg::u64(o), CallArg::u64(numel(t) * elemBytes(t)),
                CallArg::u32(producer),
                CallArg::u32(eventIndex(op->getOperand(2)))},
               copyScope_[op]);
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
      return op->emitError(pfx() + "h2d from a slot no d2h filled");
    sink_.call("ap_reload",
               {CallArg::u32(scopeIndex_[copyScope_[op]]),
                CallArg::u32(slotOf_[slotV]), CallArg::u64(o),
                CallArg::u64(numel(t) * elemBytes(t)),
                CallArg::u32(eventIndex(d2h->second)),
                CallArg::u32(eventIndex(op->getOperand(2)))},
               copyScope_[op]);
    return success();
  }
  if (auto ar = dyn_cast<exec::AllReduceOp>(op)) {
    uint64_t o;
    if (failed(offsetOf(op->getOperand(0), op, o)))
      return failure();
    RankedTensorType t = tensorOf(op->getOperand(0));
    std::optional<DType> dt = dtypeOf(t.getElementType());
    if (!dt)
      return op->emitError(pfx() + "all-reduce of an unsupported element type");
    // "dp" is the data-parallel group, "pp" this rank's pipeline, "tp"
    // the ranks sharing its layers.
    StringRef group = ar.getCommunicator();
    if (group != "dp" && group != "pp" && group != "tp")
      return op->emitError(pfx() + "all-reduce over '")
             << group << "' (expected \"dp\", \"pp\" or \"tp\")";
    int32_t flags = (ar.getLastMicrobatch() ? AP_REDUCE_LAST_MICROBATCH : 0) |
                    (group == "pp" ? AP_REDUCE_PIPELINE : 0) |
                    (group == "tp" ? AP_REDUCE_TENSOR : 0);
    std::string text = flags == AP_REDUCE_LAST_MICROBATCH
                           ? "AP_REDUCE_LAST_MICROBATCH"
                       : flags == AP_REDUCE_PIPELINE ? "AP_REDUCE_PIPELINE"
                       : flags == AP_REDUCE_TENSOR   ? "AP_REDUCE_TENSOR"
                       : flags == 0                  ? "0"
                                                     : std::to_string(flags);
    sink_.call("ap_all_reduce",
               {CallArg::u64(o), CallArg::u64(numel(t) * elemBytes(t)),
                abiDtype(*dt), stream(op), CallArg::i32(flags, text)});
    return success();
  }
  if (isa<exec::SendOp, exec::RecvOp>(op)) {
    uint64_t o;
    if (failed(offsetOf(op->getOperand(0), op, o)))
      return failure();
    RankedTensorType t = tensorOf(op->getOperand(0));
    bool next = intAttr(op, "peer", 0) == 1;
    sink_.call(isa<exec::SendOp>(op) ? "ap_pipeline_send" : "ap_pipeline_recv",
               {CallArg::u64(o), CallArg::u64(numel(t) * elemBytes(t)),
                CallArg::i32(next ? AP_PEER_NEXT : AP_PEER_PREV,
                             next ? "AP_PEER_NEXT" : "AP_PEER_PREV"),
                stream(op)});
    return success();
  }
  if (auto mb = dyn_cast<exec::MicrobatchOp>(op)) {
    sink_.call("ap_begin_microbatch", {CallArg::i64(int64_t(mb.getIndex()))},
               mb.getBackward() ? "backward" : "forward");
    return success();
  }
  if (isa<exec::AllGatherOp, exec::ReduceScatterOp>(op)) {
    // (shard, full) for a gather, (full, shard) for a scatter: the operands
    // keep their order in the call.
    bool gather = isa<exec::AllGatherOp>(op);
    Value shard = op->getOperand(gather ? 0 : 1);
    uint64_t o0, o1;
    if (failed(offsetOf(op->getOperand(0), op, o0)) ||
        failed(offsetOf(op->getOperand(1), op, o1)))
      return failure();
    // The dtype and block bytes are the full buffer's: a bf16 main-grad
    // shard takes the f32 sum of its block (AP_REDUCE_SHARD_BF16).
    RankedTensorType t = tensorOf(shard);
    RankedTensorType ft = tensorOf(op->getOperand(gather ? 1 : 0));
    std::optional<DType> dt = dtypeOf(ft.getElementType());
    if (!dt)
      return op->emitError(pfx() + "collective of an unsupported element type");
    SmallVector<CallArg> args{CallArg::u64(o0), CallArg::u64(o1),
                              CallArg::u64(numel(t) * elemBytes(ft)),
                              abiDtype(*dt), stream(op)};
    // "dp": ZeRO-3 shards; "tp": sequence-parallel token shards.
    StringRef group = gather
                          ? cast<exec::AllGatherOp>(op).getCommunicator()
                          : cast<exec::ReduceScatterOp>(op).getCommunicator();
    if (group != "dp" && group != "tp")
      return op->emitError(pfx() + "shard collective over '")
             << group << "' (expected \"dp\" or \"tp\")";
    bool overTensor = group == "tp";
    if (gather) {
      args.push_back(CallArg::i32(overTensor ? AP_REDUCE_TENSOR : 0,
                                  overTensor ? "AP_REDUCE_TENSOR" : "0"));
    } else {
      bool acc = cast<exec::ReduceScatterOp>(op).getAccumulate();
      bool bf16Shard = t.getElementType() != ft.getElementType();
      int32_t flags = (acc ? AP_REDUCE_ACCUMULATE : 0) |
                      (bf16Shard ? AP_REDUCE_SHARD_BF16 : 0) |
                      (overTensor ? AP_REDUCE_TENSOR : 0);
      std::string text = bf16Shard
                             ? "AP_REDUCE_ACCUMULATE | AP_REDUCE_SHARD_BF16"
                         : acc ? "AP_REDUCE_ACCUMULATE"
                               : "0";
      if (overTensor)
        text = acc ? "AP_REDUCE_ACCUMULATE | AP_REDUCE_TENSOR"
                   : "AP_REDUCE_TENSOR";
      args.push_back(CallArg::i32(flags, text));
    }
    sink_.call(gather ? "ap_all_gather" : "ap_reduce_scatter", args);
    return success();
  }
  if (isa<exec::ZeroOp>(op)) {
    uint64_t o;
    if (failed(offsetOf(op->getOperand(0), op, o)))
      return failure();
    RankedTensorType t = tensorOf(op->getOperand(0));
    sink_.call("ap_zero", {CallArg::u64(o),
                           CallArg::u64(numel(t) * elemBytes(t)), stream(op)});
    return success();
  }
  if (isa<exec::KernelOp>(op))
    return failure(failed(walkKernel(op)) || abiError_ || failed(numbersOk()));
  return op->emitError(pfx() + "unsupported op '")
         << op->getName().getStringRef() << "'";
}

LogicalResult Walker::walkKernel(Operation *op) {
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
  // Packed sequences: the ops that mix tokens along the sequence take the
  // document starts (i32 [B, T], train.doc_starts) as their last input;
  // every other input of theirs is floating point.
  Value docStarts;
  if ((callee == "train.short_conv" || callee == "train.short_conv_grad" ||
       callee == "train.gated_delta_rule" ||
       callee == "train.gated_delta_rule_grad" || callee == "train.rope" ||
       callee == "train.rope_grad" || callee == "train.attention" ||
       callee == "train.attention_grad") &&
      !ins.empty() && tensorOf(ins.back()).getElementType().isInteger(32))
    docStarts = ins.pop_back_val();
  std::string scope = scopeName(args);
  std::string label = (scope.empty() ? std::string("step") : scope) + "/" +
                      callee.drop_front(6).str();
  if (args && args.get("train.recomputed"))
    label += "(recompute)";
  unsigned grads = exec::numGradOutputs(args);
  unsigned results = outs.size() >= grads ? outs.size() - grads : 0;
  auto T = [&](Value v) { return tensorOf(v); };
  auto dt = [&](Value v) {
    return dtypeOf(T(v).getElementType()).value_or(DType::BF16);
  };
  auto dim = [&](Value v, int64_t i) {
    RankedTensorType t = T(v);
    return t.getDimSize(i < 0 ? t.getRank() + i : i);
  };
  auto nel = [&](Value v) { return numel(T(v)); };
  // `on side`: the runner launches it on the side stream, with that
  // stream's workspace and SM target.
  bool side = k.getStream() == exec::Stream::Side;
  // The launch through the C ABI: the kernel by its AP_KERNEL_LIST id, the
  // args struct by address and size (the runtime copies it).
  auto launch = [&](auto &A, const char *entry) {
    auto [id, idName] = kernelId(entry);
    if (id < 0) {
      abiError_ = true;
      op->emitError(pfx() + "kernel entry '")
          << entry << "' is not in the runtime ABI's AP_KERNEL_LIST";
      return;
    }
    sink_.launch(side ? AP_STREAM_SIDE : AP_STREAM_COMPUTE,
                 side ? "AP_STREAM_SIDE" : "AP_STREAM_COMPUTE", label, id,
                 idName, A.done());
  };
  // A generated kernel (exec.step kernels = "generated"): one 8-byte slot
  // per parameter of its kernelgen ABI, set by name from `vals`.
  struct GenArg {
    char kind;
    Addr addr;
    int64_t i = 0;
    float f = 0;
  };
  auto P = [](Addr a) { return GenArg{'p', a}; };
  auto L = [](int64_t v) { return GenArg{'l', {}, v}; };
  auto F = [](float v) { return GenArg{'f', {}, 0, v}; };
  // A norm backward's weight gradient: dw, and its partial column sums in
  // the stream's workspace (the plan's workspace query counts them,
  // KernelWorkspace.cpp).
  auto setDw = [&](std::map<std::string, GenArg> &v, Addr dw, int64_t rows,
                   int64_t d) {
    v["dw"] = P(dw);
    v["dwPartial"] =
        GenArg{'w', {}, int64_t(kernelgen::rmsNormDwWorkspaceBytes(rows, d))};
    v["dwParts"] = L(kernelgen::rmsNormDwParts(rows));
    v["dwPartItems"] = L(kernelgen::rmsNormDwPartItems(rows, d));
  };
  auto launchGen =
      [&](kernelgen::GroupSpec spec,
          const std::map<std::string, GenArg> &vals) -> LogicalResult {
    // A row-wise group's rows a warp: a launch choice from the row length.
    if (kernelgen::hasRowsPerWarp(spec.kind))
      spec.rowsPerWarp = kernelgen::rowsPerWarpFor(spec, vals.at("dim").i);
    // A norm backward's narrow rows in registers, its dw partials too.
    if (kernelgen::hasDwRowInRegisters(spec.kind))
      spec.rowInRegisters =
          kernelgen::rowInRegistersFor(spec, vals.at("dim").i);
    std::string name = kernelgen::kernelName(spec);
    unsigned index = generatedIndex(spec);
    std::vector<kernelgen::KernelParam> params = kernelgen::kernelParams(spec);
    KernelArgs a;
    a.type = "generated";
    a.align = 8;
    a.bytes.assign(8 * params.size(), 0);
    for (auto [i, p] : llvm::enumerate(params)) {
      auto v = vals.find(p.name);
      if (v == vals.end() || v->second.kind != p.kind)
        return op->emitError(pfx() + "internal error: parameter '")
               << p.name << "' of generated kernel " << name << " not set";
      KernelArgs::Field f{p.name, "", uint64_t(8 * i)};
      if (p.kind == 'p') {
        f.isPtr = true;
        f.addr = v->second.addr;
      } else if (p.kind == 'l' || p.kind == 'w') {
        // 'w': the workspace bytes the kernel needs (the runtime passes the
        // stream's workspace in their place).
        std::memcpy(&a.bytes[8 * i], &v->second.i, 8);
        f.text = std::to_string(v->second.i);
      } else {
        std::memcpy(&a.bytes[8 * i], &v->second.f, 4);
        f.text = fmtFloat(v->second.f);
      }
      a.fields.push_back(std::move(f));
    }
    ++genLaunches_;
    sink_.launchGenerated(side ? AP_STREAM_SIDE : AP_STREAM_COMPUTE,
                          side ? "AP_STREAM_SIDE" : "AP_STREAM_COMPUTE", label,
                          index, name, a);
    return success();
  };
  // The storage type of a generated kernel for `v` (none: the library's).
  auto genType = [&](Value v) -> std::optional<kernelgen::ElemType> {
    // A backward that rebuilds a recomputed output counts as its op.
    StringRef op = callee;
    op.consume_back("_rebuild");
    if (!generated_ ||
        (!generatedOps_.empty() && !generatedOps_.count(op.str())))
      return std::nullopt;
    if (dt(v) == DType::BF16)
      return kernelgen::ElemType::BF16;
    if (dt(v) == DType::F32)
      return kernelgen::ElemType::F32;
    return std::nullopt;
  };
  auto lbl = [&] { return CallArg::str(label); };
  // The runner's helpers (data movement, dtype staging in the shared driver
  // scratch, the step-level ops) run on the compute stream only.
  auto notOnSide = [&](StringRef why) {
    return op->emitError(pfx() + "'")
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
      return op->emitError(pfx() + "'")
             << callee << "' with " << ins.size() << " inputs and "
             << outs.size() << " outputs (expected " << ni << " and " << no
             << ")";
    return success();
  };

  // A Triton kernel for this op (--triton-kernel): its parameters from the
  // manifest's mapping, the grid computed here, after them.
  auto launchTriton = [&](const TritonKernel &t) -> LogicalResult {
    auto where = [&]() {
      return op->emitError(pfx() + "Triton kernel ")
             << t.name << " (" << t.manifest << ") for '" << callee << "': ";
    };
    if (ins.empty())
      return where() << "the call has no input to take the sizes from";
    int64_t cols = dim(ins[0], -1), n = nel(ins[0]);
    int64_t rows = cols > 0 ? n / cols : 0;
    size_t np = t.args.size();
    KernelArgs a;
    a.type = "triton";
    a.align = 8;
    a.bytes.assign(8 * (np + 3), 0);
    for (auto [i, arg] : llvm::enumerate(t.args)) {
      KernelArgs::Field f{arg.kind == TritonArg::Size ? arg.size
                                                      : std::string("buffer"),
                          "", uint64_t(8 * i)};
      if (arg.kind != TritonArg::Size) {
        const SmallVector<Value> &bufs =
            arg.kind == TritonArg::Input ? ins : outs;
        if (size_t(arg.index) >= bufs.size())
          return where() << (arg.kind == TritonArg::Input ? "in" : "out")
                         << arg.index << " maps a buffer the call does not "
                         << "have (" << bufs.size() << ")";
        f.isPtr = true;
        f.addr = at(bufs[arg.index]);
      } else if (arg.type == 'f') {
        float eps = float(this->arg(op, args, "eps", 1e-6, /*f32=*/true));
        std::memcpy(&a.bytes[8 * i], &eps, 4);
        f.text = fmtFloat(eps);
      } else {
        int64_t v = arg.size == "n" ? n : arg.size == "rows" ? rows : cols;
        if (arg.type == 'i' && v > std::numeric_limits<int32_t>::max())
          return where() << arg.size << " = " << v << " does not fit the "
                         << "kernel's i32 parameter";
        if (arg.type == 'i') {
          int32_t v32 = int32_t(v);
          std::memcpy(&a.bytes[8 * i], &v32, 4);
        } else {
          std::memcpy(&a.bytes[8 * i], &v, 8);
        }
        f.text = std::to_string(v);
      }
      a.fields.push_back(std::move(f));
    }
    for (int d = 0; d < 3; ++d) {
      llvm::Expected<int64_t> g = tritonGridValue(t.grid[d], n, rows, cols);
      if (!g)
        return where() << llvm::toString(g.takeError());
      std::memcpy(&a.bytes[8 * (np + d)], &*g, 8);
      a.fields.push_back({"grid", std::to_string(*g), uint64_t(8 * (np + d))});
    }
    std::string key = "triton:" + t.name;
    auto [it, fresh] = genIndex_.try_emplace(key, unsigned(genSpecs_.size()));
    if (fresh)
      genSpecs_.push_back({std::nullopt, t});
    ++genLaunches_;
    sink_.launchGenerated(side ? AP_STREAM_SIDE : AP_STREAM_COMPUTE,
                          side ? "AP_STREAM_SIDE" : "AP_STREAM_COMPUTE", label,
                          it->second, t.name, a);
    return success();
  };
  if (auto t = triton_.find(callee.str()); t != triton_.end()) {
    // A Triton kernel's manifest maps the op's buffers; it has no
    // document starts.
    if (docStarts)
      return op->emitError(pfx() + "'")
             << callee
             << "' of packed sequences (document starts) has no Triton "
                "kernel form; drop its --triton-kernel";
    return launchTriton(t->second);
  }

  if (callee == "train.doc_starts") {
    if (failed(expectCounts(1, 1)))
      return failure();
    if (side)
      return notOnSide("no side-stream form");
    ArgsOf<DocumentStartsArgs> A("DocumentStartsArgs");
    SETP(tokens, at(ins[0]));
    SETP(docStart, at(outs[0]));
    SETV(batch, dim(ins[0], 0));
    SETV(seq, dim(ins[0], 1));
    SETV(separator, int32_t(intArg(args, "separator", 0)));
    launch(A, "documentStarts");
    return success();
  }
  if (callee == "train.embedding") {
    if (failed(expectCounts(2, 1)))
      return failure();
    ArgsOf<EmbeddingForwardArgs> A("EmbeddingForwardArgs");
    SETV(dtype, dt(ins[1]));
    SETP(ids, at(ins[0]));
    SETP(w, at(ins[1]));
    SETP(y, at(outs[0]));
    SETV(tokens, nel(ins[0]));
    SETV(vocab, dim(ins[1], 0));
    SETV(dim, dim(ins[1], 1));
    // The runtime fills the rank's block of the vocabulary (kernels/dense.h
    // VocabGroup).
    if (args && args.get("vocab_parallel"))
      SETV(vocabParallel, int32_t(1));
    launch(A, "embeddingForward");
    return success();
  }
  if (callee == "train.embedding_grad") {
    if (failed(expectCounts(2, 1)))
      return failure();
    ArgsOf<EmbeddingBackwardArgs> A("EmbeddingBackwardArgs");
    SETV(dtype, dt(ins[1]));
    SETP(ids, at(ins[0]));
    SETP(dy, at(ins[1]));
    SETP(dw, at(outs[0]));
    SETV(tokens, nel(ins[0]));
    SETV(vocab, dim(outs[0], 0));
    SETV(dim, dim(outs[0], 1));
    if (args && args.get("vocab_parallel"))
      SETV(vocabParallel, int32_t(1));
    launch(A, "embeddingBackward");
    return success();
  }
  if (callee == "train.rms_norm" || callee == "train.rms_norm_grad" ||
      callee == "train.rms_norm_grad_rebuild") {
    bool fwd = callee == "train.rms_norm";
    // The rebuilding backward's second result is the forward's output.
    bool rebuildsY = callee == "train.rms_norm_grad_rebuild";
    if (fwd ? failed(expectCounts(2, 2)) : ins.size() != 4)
      return fwd ? failure()
                 : op->emitError(pfx() + "'") << callee << "' needs 4 inputs";
    int64_t d = nel(ins[1]);
    int64_t rows = nel(ins[0]) / d;
    bool zc = args && args.get("zero_centered");
    if (auto et = genType(ins[0]); et && (fwd || results >= 1)) {
      kernelgen::GroupSpec g;
      g.dtype = *et;
      g.zeroCentered = zc;
      std::map<std::string, GenArg> v{{"x", P(at(ins[0]))},
                                      {"w", P(at(ins[1]))},
                                      {"rows", L(rows)},
                                      {"dim", L(d)},
                                      {"xStride", L(d)}};
      if (fwd) {
        g.kind = kernelgen::GroupKind::RmsNormForward;
        g.writeRstd = true;
        v["y"] = P(at(outs[0]));
        v["rstd"] = P(at(outs[1]));
        v["yStride"] = L(d);
        v["eps"] = F(float(arg(op, args, "eps", 1e-6, /*f32=*/true)));
        return launchGen(g, v);
      }
      g.kind = kernelgen::GroupKind::RmsNormBackward;
      g.recomputeY = rebuildsY && results == 2;
      g.accumulateDw = grads >= 1;
      v["rstd"] = P(at(ins[2]));
      v["dy"] = P(at(ins[3]));
      v["dx"] = P(at(outs[0]));
      v["dyStride"] = L(d);
      v["dxStride"] = L(d);
      if (g.recomputeY) {
        v["y"] = P(at(outs[1]));
        v["yStride"] = L(d);
      }
      if (g.accumulateDw)
        setDw(v, at(outs[results]), rows, d);
      return launchGen(g, v);
    }
    if (fwd) {
      ArgsOf<RmsNormForwardArgs> A("RmsNormForwardArgs");
      SETV(dtype, dt(ins[0]));
      SETP(x, at(ins[0]));
      SETP(w, at(ins[1]));
      SETP(y, at(outs[0]));
      SETP(rstd, at(outs[1]));
      SETV(rows, rows);
      SETV(dim, d);
      SETV(eps, arg(op, args, "eps", 1e-6));
      SETV(zeroCentered, zc);
      launch(A, "rmsNormForward");
    } else {
      ArgsOf<RmsNormBackwardArgs> A("RmsNormBackwardArgs");
      SETV(dtype, dt(ins[0]));
      SETP(x, at(ins[0]));
      SETP(w, at(ins[1]));
      SETP(rstd, at(ins[2]));
      SETP(dy, at(ins[3]));
      if (results >= 1)
        SETP(dx, at(outs[0]));
      if (rebuildsY && results == 2)
        SETP(y, at(outs[1]));
      if (grads >= 1)
        SETP(dw, at(outs[results]));
      SETV(rows, rows);
      SETV(dim, d);
      SETV(zeroCentered, zc);
      launch(A, "rmsNormBackward");
    }
    return success();
  }
  if (callee == "train.linear") {
    if (failed(expectCounts(2, 1)))
      return failure();
    int64_t in = dim(ins[1], 1), out = dim(ins[1], 0);
    ArgsOf<LinearForwardArgs> A("LinearForwardArgs");
    SETV(dtype, dt(ins[0]));
    SETP(x, at(ins[0]));
    SETP(w, at(ins[1]));
    SETP(y, at(outs[0]));
    SETV(rows, nel(ins[0]) / in);
    SETV(in, in);
    SETV(out, out);
    launch(A, "linearForward");
    return success();
  }
  if (callee == "train.linear_grad") {
    if (ins.size() != 3)
      return op->emitError(pfx() + "train.linear_grad needs 3 inputs");
    int64_t in = dim(ins[1], 1), out = dim(ins[1], 0);
    ArgsOf<LinearBackwardArgs> A("LinearBackwardArgs");
    SETV(dtype, dt(ins[0]));
    SETP(x, at(ins[0]));
    SETP(w, at(ins[1]));
    SETP(dy, at(ins[2]));
    if (results >= 1)
      SETP(dx, at(outs[0]));
    if (grads >= 1)
      SETP(dw, at(outs[results]));
    SETV(rows, nel(ins[0]) / in);
    SETV(in, in);
    SETV(out, out);
    launch(A, "linearBackward");
    return success();
  }
  if (callee == "train.linear_input_grad") {
    // dx only; x is not read (train-fuse-recompute defers the weight
    // gradient to a train.linear_grad without result).
    if (failed(expectCounts(2, 1)))
      return failure();
    int64_t in = dim(ins[0], 1), out = dim(ins[0], 0);
    ArgsOf<LinearBackwardArgs> A("LinearBackwardArgs");
    SETV(dtype, dt(ins[1]));
    SETP(w, at(ins[0]));
    SETP(dy, at(ins[1]));
    SETP(dx, at(outs[0]));
    SETV(rows, nel(ins[1]) / out);
    SETV(in, in);
    SETV(out, out);
    launch(A, "linearBackward");
    return success();
  }
  if (callee == "train.short_conv" || callee == "train.short_conv_grad") {
    bool fwd = callee == "train.short_conv";
    ArgsOf<GdnConvArgs> A("GdnConvArgs");
    SETV(dtype, dt(ins[0]));
    SETV(batch, dim(ins[0], 0));
    SETV(seqLen, dim(ins[0], 1));
    SETV(channels, dim(ins[0], 2));
    SETV(kernelSize, dim(ins[1], 1));
    SETP(x, at(ins[0]));
    SETP(w, at(ins[1]));
    if (docStarts)
      SETP(docStart, at(docStarts));
    if (convKernels_ != GdnConvKernels::Fastest)
      SETV(kernels, convKernels_);
    // A split conv's channel groups (its results; the grad's dy operands):
    // one buffer each.
    auto groups = [&](ArrayRef<Value> vs, bool outputs) {
      SETV(splits, vs.size());
      for (auto [s, v] : llvm::enumerate(vs)) {
        std::string i = "[" + std::to_string(s) + "]";
        A.val(A.a->splitChannels[s], "splitChannels" + i, dim(v, 2));
        if (outputs)
          A.ptr(A.a->ys[s], "ys" + i, at(v));
        else
          A.ptr(A.a->dys[s], "dys" + i, at(v));
      }
    };
    size_t nGroups = fwd ? results : ins.size() - 2;
    if (nGroups < 1 || nGroups > 4)
      return op->emitError(pfx() + "'")
             << callee << "' with " << nGroups
             << " channel groups (the kernels take 1 to "
                "kGdnConvMaxSplits = 4, kernels/gdn.h)";
    if (fwd) {
      if (results == 1)
        SETP(y, at(outs[0]));
      else
        groups(ArrayRef<Value>(outs).take_front(results), true);
      launch(A, "gdnConvForward");
    } else {
      if (nGroups > 1)
        groups(ArrayRef<Value>(ins).drop_front(2), false);
      else
        SETP(dy, at(ins[2]));
      if (results >= 1)
        SETP(dx, at(outs[0]));
      if (grads >= 1)
        SETP(dw, at(outs[results]));
      launch(A, "gdnConvBackward");
    }
    return success();
  }
  if (callee == "train.slice") {
    if (failed(expectCounts(1, 1)))
      return failure();
    int64_t d = intArg(args, "dim", -1);
    RankedTensorType x = T(ins[0]), y = T(outs[0]);
    if (d < 0 || d >= x.getRank())
      return op->emitError(pfx() + "train.slice without a valid dim");
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < d; ++i)
      outer *= x.getDimSize(i);
    for (int64_t i = d + 1; i < x.getRank(); ++i)
      inner *= x.getDimSize(i);
    sink_.call("ap_slice", {lbl(), off(ins[0]), off(outs[0]),
                            CallArg::i64(outer), CallArg::i64(x.getDimSize(d)),
                            CallArg::i64(intArg(args, "offset", 0)),
                            CallArg::i64(y.getDimSize(d)), CallArg::i64(inner),
                            CallArg::i64(elemBytes(x))});
    return success();
  }
  if (callee == "train.concat") {
    if (outs.size() != 1 || ins.empty())
      return op->emitError(pfx() + "train.concat needs inputs and 1 output");
    int64_t d = intArg(args, "dim", -1);
    RankedTensorType y = T(outs[0]);
    if (d < 0 || d >= y.getRank())
      return op->emitError(pfx() + "train.concat without a valid dim");
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < d; ++i)
      outer *= y.getDimSize(i);
    for (int64_t i = d + 1; i < y.getRank(); ++i)
      inner *= y.getDimSize(i);
    std::vector<int64_t> xs, dims;
    for (Value v : ins) {
      xs.push_back(int64_t(off_[v]));
      dims.push_back(T(v).getDimSize(d));
    }
    sink_.call("ap_concat",
               {lbl(), CallArg::array(CallArg::U64Array, std::move(xs)),
                CallArg::array(CallArg::I64Array, std::move(dims)),
                CallArg::u32(ins.size()), off(outs[0]), CallArg::i64(outer),
                CallArg::i64(inner), CallArg::i64(elemBytes(y))});
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
      return op->emitError(pfx() + "'")
             << callee << "' must broadcast one unit dim";
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < d; ++i)
      outer *= big.getDimSize(i);
    for (int64_t i = d + 1; i < big.getRank(); ++i)
      inner *= big.getDimSize(i);
    std::optional<DType> bigType = dtypeOf(big.getElementType());
    if (!bigType)
      return op->emitError(pfx() + "'")
             << callee << "' of an unsupported element type";
    sink_.call(fwd ? "ap_expand" : "ap_expand_grad",
               {lbl(), off(ins[0]), off(outs[0]), CallArg::i64(outer),
                CallArg::i64(big.getDimSize(d)), CallArg::i64(inner),
                abiDtype(*bigType)});
    return success();
  }
  if (callee == "train.l2_norm" || callee == "train.l2_norm_grad") {
    bool fwd = callee == "train.l2_norm";
    Value shaped = fwd ? ins[0] : ins[0];
    int64_t h = dim(shaped, -2), d = dim(shaped, -1);
    // Heads lie contiguously per token: [tokens x heads, d] rows.
    if (auto et = genType(shaped)) {
      kernelgen::GroupSpec g;
      g.kind = fwd ? kernelgen::GroupKind::L2NormForward
                   : kernelgen::GroupKind::L2NormBackward;
      g.dtype = *et;
      std::map<std::string, GenArg> v{{"rows", L(nel(shaped) / d)},
                                      {"dim", L(d)}};
      if (fwd) {
        v["x"] = P(at(ins[0]));
        v["y"] = P(at(outs[0]));
        v["rstd"] = P(at(outs[1]));
        v["eps"] = F(float(arg(op, args, "eps", 1e-6, /*f32=*/true)));
      } else {
        v["y"] = P(at(ins[0]));
        v["rstd"] = P(at(ins[1]));
        v["dy"] = P(at(ins[2]));
        v["dx"] = P(at(outs[0]));
      }
      return launchGen(g, v);
    }
    ArgsOf<GdnL2NormArgs> A("GdnL2NormArgs");
    SETV(dtype, dt(shaped));
    SETV(tokens, nel(shaped) / (h * d));
    SETV(heads, h);
    SETV(dim, d);
    if (fwd) {
      SETV(eps, arg(op, args, "eps", 1e-6, /*f32=*/true));
      SETP(x, at(ins[0]));
      SETP(y, at(outs[0]));
      SETP(rstd, at(outs[1]));
      launch(A, "gdnL2NormForward");
    } else {
      SETP(y, at(ins[0]));
      SETP(rstd, at(ins[1]));
      SETP(dy, at(ins[2]));
      SETP(dx, at(outs[0]));
      launch(A, "gdnL2NormBackward");
    }
    return success();
  }
  if (callee == "train.gdn_gates") {
    if (failed(expectCounts(4, 2)))
      return failure();
    int64_t heads = dim(ins[0], -1), rows = nel(ins[0]) / heads;
    if (auto et = genType(ins[0]);
        et && dt(ins[1]) == dt(ins[0]) && dt(outs[1]) == dt(ins[0])) {
      kernelgen::GroupSpec g;
      g.kind = kernelgen::GroupKind::GdnGatesForward;
      g.dtype = *et;
      return launchGen(g, {{"a", P(at(ins[0]))},
                           {"b", P(at(ins[1]))},
                           {"aLog", P(at(ins[2]))},
                           {"dtBias", P(at(ins[3]))},
                           {"g", P(at(outs[0]))},
                           {"beta", P(at(outs[1]))},
                           {"rows", L(rows)},
                           {"heads", L(heads)}});
    }
    sink_.call("ap_gdn_gates",
               {lbl(), off(ins[0]), off(ins[1]), off(ins[2]), off(ins[3]),
                off(outs[0]), off(outs[1]),
                CallArg::i64(nel(ins[0]) / dim(ins[0], -1)),
                CallArg::i32(dim(ins[0], -1)), abiDtype(dt(ins[0]))});
    return success();
  }
  if (callee == "train.gdn_gates_grad") {
    if (failed(expectCounts(7, 4)))
      return op->emitError(pfx() + "train.gdn_gates_grad of frozen gate "
                                   "parameters is not supported");
    // ins: a, A_log, dt_bias, g, beta, dg, dbeta; outs: da, db, dA_log, ddt.
    int64_t heads = dim(ins[0], -1), rows = nel(ins[0]) / heads;
    if (auto et = genType(ins[0]);
        et && dt(ins[4]) == dt(ins[0]) && dt(ins[6]) == dt(ins[0]) &&
        dt(outs[0]) == dt(ins[0]) && dt(outs[1]) == dt(ins[0])) {
      kernelgen::GroupSpec g;
      g.kind = kernelgen::GroupKind::GdnGatesBackward;
      g.dtype = *et;
      // The partial column sums: the stream's workspace (the plan's
      // workspace query counts them, KernelWorkspace.cpp).
      return launchGen(
          g, {{"a", P(at(ins[0]))},
              {"aLog", P(at(ins[1]))},
              {"dtBias", P(at(ins[2]))},
              {"beta", P(at(ins[4]))},
              {"dg", P(at(ins[5]))},
              {"dbeta", P(at(ins[6]))},
              {"da", P(at(outs[0]))},
              {"db", P(at(outs[1]))},
              {"dALog", P(at(outs[2]))},
              {"dDtBias", P(at(outs[3]))},
              {"partial",
               GenArg{'w',
                      {},
                      int64_t(kernelgen::gdnGatesWorkspaceBytes(rows, heads))}},
              {"rows", L(rows)},
              {"heads", L(heads)},
              {"parts", L(kernelgen::rmsNormDwParts(rows))}});
    }
    sink_.call("ap_gdn_gates_grad",
               {lbl(), off(ins[0]), off(ins[1]), off(ins[2]), off(ins[4]),
                off(ins[5]), off(ins[6]), off(outs[0]), off(outs[1]),
                off(outs[2]), off(outs[3]),
                CallArg::i64(nel(ins[0]) / dim(ins[0], -1)),
                CallArg::i32(dim(ins[0], -1)), abiDtype(dt(ins[0]))});
    return success();
  }
  if (callee == "train.gated_delta_rule" ||
      callee == "train.gated_delta_rule_grad") {
    bool fwd = callee == "train.gated_delta_rule";
    if (fwd ? failed(expectCounts(5, 3)) : failed(expectCounts(7, 5)))
      return failure();
    Value q = ins[0], kk = ins[1], v = ins[2];
    Value beta = fwd ? ins[4] : ins[4];
    DType st = dt(q);
    DType acc = st == DType::F64 ? DType::F64 : DType::F32;
    int64_t nBeta = nel(beta);
    bool betaStored = dt(beta) != acc;
    if (side && (betaStored || (!fwd && dt(outs[4]) != acc)))
      return notOnSide("its gates are staged in the driver scratch");
    // Gates in another dtype than the kernel's Acc are staged in the driver
    // scratch: beta converted in before, dbeta converted out after.
    Addr betaAt = at(beta);
    if (betaStored) {
      betaAt = {Addr::Scratch, AP_SCRATCH_SCALAR_BYTES};
      sink_.call("ap_convert",
                 {lbl(), CallArg::ptr(at(beta)), abiDtype(dt(beta)),
                  CallArg::ptr(betaAt), abiDtype(acc), CallArg::i64(nBeta)});
    }
    ArgsOf<GdnChunkArgs> A("GdnChunkArgs");
    SETV(dtype, st);
    SETV(batch, dim(q, 0));
    SETV(seqLen, dim(q, 1));
    SETV(keyHeads, dim(q, 2));
    SETV(keyDim, dim(q, 3));
    SETV(valueHeads, dim(v, 2));
    SETV(valueDim, dim(v, 3));
    SETV(scale, arg(op, args, "scale", 0, /*f32=*/true));
    SETP(q, at(q));
    SETP(k, at(kk));
    SETP(v, at(v));
    SETP(beta, betaAt);
    if (docStarts)
      SETP(docStart, at(docStarts));
    if (fwd) {
      SETP(g, at(ins[3]));
      SETP(o, at(outs[0]));
      SETP(gCum, at(outs[1]));
      SETP(tMat, at(outs[2]));
      launch(A, "gdnChunkForward");
      return success();
    }
    SETP(gCum, at(ins[3]));
    SETP(tMat, at(ins[5]));
    SETP(dO, at(ins[6]));
    SETP(dq, at(outs[0]));
    SETP(dk, at(outs[1]));
    SETP(dv, at(outs[2]));
    SETP(dg, at(outs[3]));
    bool dbetaStored = dt(outs[4]) != acc;
    Addr dbetaScratch{Addr::Scratch, dbetaStage()};
    SETP(dbeta, dbetaStored ? dbetaScratch : at(outs[4]));
    // A host of side-stream work runs the unsplit state passes, which leave
    // SMs to the side stream (the form its side capacity and sideHostScale
    // describe); every split gives the same bits.
    if (args && args.get(ap::train::kSideHostAttrName))
      SETV(stateSplit, 1);
    launch(A, "gdnChunkBackward");
    if (dbetaStored)
      sink_.call("ap_convert",
                 {lbl(), CallArg::ptr(dbetaScratch), abiDtype(acc),
                  CallArg::ptr(at(outs[4])), abiDtype(dt(outs[4])),
                  CallArg::i64(nel(outs[4]))});
    return success();
  }
  if (callee == "train.gated_rms_norm" ||
      callee == "train.gated_rms_norm_grad") {
    bool fwd = callee == "train.gated_rms_norm";
    int64_t h = dim(ins[0], -2), d = dim(ins[0], -1);
    if (auto et = genType(ins[0]); et && (fwd || results >= 2)) {
      // Rows of d: one per token and head, contiguous.
      int64_t rows = nel(ins[0]) / d;
      kernelgen::GroupSpec g;
      g.dtype = *et;
      std::map<std::string, GenArg> v{{"x", P(at(ins[0]))},
                                      {"z", P(at(ins[1]))},
                                      {"w", P(at(ins[2]))},
                                      {"rows", L(rows)},
                                      {"dim", L(d)}};
      if (fwd) {
        g.kind = kernelgen::GroupKind::GatedNormForward;
        v["y"] = P(at(outs[0]));
        v["rstd"] = P(at(outs[1]));
        v["eps"] = F(float(arg(op, args, "eps", 1e-6, /*f32=*/true)));
        return launchGen(g, v);
      }
      g.kind = kernelgen::GroupKind::GatedNormBackward;
      g.recomputeY = results == 3;
      g.accumulateDw = grads >= 1;
      v["rstd"] = P(at(ins[3]));
      v["dy"] = P(at(ins[4]));
      v["dx"] = P(at(outs[0]));
      v["dz"] = P(at(outs[1]));
      if (g.recomputeY)
        v["y"] = P(at(outs[2]));
      if (g.accumulateDw)
        setDw(v, at(outs[results]), rows, d);
      return launchGen(g, v);
    }
    ArgsOf<GdnGatedNormArgs> A("GdnGatedNormArgs");
    SETV(dtype, dt(ins[0]));
    SETV(tokens, nel(ins[0]) / (h * d));
    SETV(heads, h);
    SETV(dim, d);
    SETP(x, at(ins[0]));
    SETP(z, at(ins[1]));
    SETP(w, at(ins[2]));
    if (fwd) {
      SETV(eps, arg(op, args, "eps", 1e-6, /*f32=*/true));
      SETP(y, at(outs[0]));
      SETP(rstd, at(outs[1]));
      launch(A, "gdnGatedNormForward");
    } else {
      SETP(rstd, at(ins[3]));
      SETP(dy, at(ins[4]));
      SETP(dx, at(outs[0]));
      SETP(dz, at(outs[1]));
      // A third result rebuilds the forward's output (train-fuse-recompute).
      if (results == 3)
        SETP(y, at(outs[2]));
      if (grads >= 1)
        SETP(dw, at(outs[results]));
      launch(A, "gdnGatedNormBackward");
    }
    return success();
  }
  if (callee == "train.rope" || callee == "train.rope_grad") {
    if (failed(expectCounts(1, 1)))
      return failure();
    if (auto et = genType(ins[0]); et && dt(outs[0]) == dt(ins[0])) {
      kernelgen::GroupSpec g;
      g.kind = callee == "train.rope" ? kernelgen::GroupKind::RopeForward
                                      : kernelgen::GroupKind::RopeBackward;
      g.dtype = *et;
      g.packed = bool(docStarts);
      double theta = arg(op, args, "theta", 1e4);
      int64_t rotaryDim = intArg(args, "rotary_dim", dim(ins[0], 3));
      int64_t thetaBits;
      std::memcpy(&thetaBits, &theta, sizeof(theta));
      std::map<std::string, GenArg> v{
          {"x", P(at(ins[0]))},
          {"y", P(at(outs[0]))},
          {"tokens", L(dim(ins[0], 0) * dim(ins[0], 1))},
          {"seq", L(dim(ins[0], 1))},
          {"heads", L(dim(ins[0], 2))},
          {"headDim", L(dim(ins[0], 3))},
          {"offset", L(intArg(args, "offset", 0))},
          {"rotaryDim", L(rotaryDim)},
          {"cols", L(dim(ins[0], 3) - rotaryDim / 2)},
          {"thetaBits", L(thetaBits)}};
      if (docStarts)
        v["docStart"] = P(at(docStarts));
      return launchGen(g, v);
    }
    ArgsOf<RopeArgs> A("RopeArgs");
    SETV(dtype, dt(ins[0]));
    SETP(x, at(ins[0]));
    SETP(y, at(outs[0]));
    SETV(batch, dim(ins[0], 0));
    SETV(seq, dim(ins[0], 1));
    SETV(heads, dim(ins[0], 2));
    SETV(headDim, dim(ins[0], 3));
    SETV(offset, intArg(args, "offset", 0));
    SETV(rotaryDim, intArg(args, "rotary_dim", dim(ins[0], 3)));
    SETV(theta, arg(op, args, "theta", 1e4));
    if (docStarts)
      SETP(docStart, at(docStarts));
    launch(A, callee == "train.rope" ? "ropeForward" : "ropeBackward");
    return success();
  }
  if (callee == "train.attention" || callee == "train.attention_grad") {
    bool fwd = callee == "train.attention";
    if (fwd ? failed(expectCounts(3, 2)) : failed(expectCounts(6, 3)))
      return failure();
    // The fields both directions share.
    auto common = [&](auto &A) {
      SETV(dtype, dt(ins[0]));
      SETV(shape.batch, dim(ins[0], 0));
      SETV(shape.seqLen, dim(ins[0], 1));
      SETV(shape.numQHeads, dim(ins[0], 2));
      SETV(shape.numKvHeads, dim(ins[1], 2));
      SETV(shape.headDimQk, dim(ins[0], 3));
      SETV(shape.headDimV, dim(ins[2], 3));
      SETV(shape.softmaxScale, arg(op, args, "scale", 0));
      SETP(q, at(ins[0]));
      SETP(k, at(ins[1]));
      SETP(v, at(ins[2]));
      if (docStarts)
        SETP(docStart, at(docStarts));
    };
    if (fwd) {
      ArgsOf<AttentionForwardArgs> A("AttentionForwardArgs");
      common(A);
      SETP(o, at(outs[0]));
      SETP(lse, at(outs[1]));
      launch(A, "attentionForward");
    } else {
      ArgsOf<AttentionBackwardArgs> A("AttentionBackwardArgs");
      common(A);
      SETP(o, at(ins[3]));
      SETP(lse, at(ins[4]));
      SETP(dO, at(ins[5]));
      SETP(dq, at(outs[0]));
      SETP(dk, at(outs[1]));
      SETP(dv, at(outs[2]));
      launch(A, "attentionBackward");
    }
    return success();
  }
  if (callee == "train.output_gate" || callee == "train.output_gate_grad") {
    bool fwd = callee == "train.output_gate";
    if (fwd ? failed(expectCounts(2, 1)) : failed(expectCounts(3, 2)))
      return failure();
    int64_t cols = dim(ins[0], -1), rows = nel(ins[0]) / cols;
    if (auto et = genType(ins[0])) {
      kernelgen::GroupSpec g;
      g.kind = fwd ? kernelgen::GroupKind::SigmoidGateForward
                   : kernelgen::GroupKind::SigmoidGateBackward;
      g.dtype = *et;
      std::map<std::string, GenArg> v{
          {"o", P(at(ins[0]))}, {"gate", P(at(ins[1]))},
          {"rows", L(rows)},    {"cols", L(cols)},
          {"oStride", L(cols)}, {"gateStride", L(cols)}};
      if (fwd) {
        v["y"] = P(at(outs[0]));
        v["yStride"] = L(cols);
      } else {
        v["dy"] = P(at(ins[2]));
        v["dout"] = P(at(outs[0]));
        v["dgate"] = P(at(outs[1]));
        for (const char *s : {"dyStride", "doStride", "dgateStride"})
          v[s] = L(cols);
      }
      return launchGen(g, v);
    }
    auto common = [&](auto &A) {
      SETV(dtype, dt(ins[0]));
      SETP(o, at(ins[0]));
      SETP(gate, at(ins[1]));
      SETV(rows, rows);
      SETV(cols, cols);
    };
    if (fwd) {
      ArgsOf<SigmoidGateForwardArgs> A("SigmoidGateForwardArgs");
      common(A);
      SETP(y, at(outs[0]));
      launch(A, "sigmoidGateForward");
    } else {
      ArgsOf<SigmoidGateBackwardArgs> A("SigmoidGateBackwardArgs");
      common(A);
      SETP(dy, at(ins[2]));
      SETP(dout, at(outs[0]));
      SETP(dgate, at(outs[1]));
      launch(A, "sigmoidGateBackward");
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
    if (auto et = genType(ins[0])) {
      kernelgen::GroupSpec g;
      g.dtype = *et;
      std::map<std::string, GenArg> v{
          {"gate", P(at(ins[0]))}, {"up", P(at(ins[1]))},
          {"rows", L(rows)},       {"cols", L(cols)},
          {"gateStride", L(cols)}, {"upStride", L(cols)}};
      if (fwd) {
        g.kind = kernelgen::GroupKind::SwiGluForward;
        v["y"] = P(at(outs[0]));
        v["yStride"] = L(cols);
        return launchGen(g, v);
      }
      g.kind = kernelgen::GroupKind::SwiGluBackward;
      g.recomputeY = rebuildsY;
      v["dy"] = P(at(ins[2]));
      v["dgate"] = P(at(outs[0]));
      v["dup"] = P(at(outs[1]));
      for (const char *s : {"dyStride", "dgateStride", "dupStride"})
        v[s] = L(cols);
      if (rebuildsY) {
        v["y"] = P(at(outs[2]));
        v["yStride"] = L(cols);
      }
      return launchGen(g, v);
    }
    auto common = [&](auto &A) {
      SETV(dtype, dt(ins[0]));
      SETP(gate, at(ins[0]));
      SETP(up, at(ins[1]));
      SETV(rows, rows);
      SETV(cols, cols);
    };
    if (fwd) {
      ArgsOf<SwiGluForwardArgs> A("SwiGluForwardArgs");
      common(A);
      SETP(y, at(outs[0]));
      launch(A, "swiGluForward");
    } else {
      ArgsOf<SwiGluBackwardArgs> A("SwiGluBackwardArgs");
      common(A);
      SETP(dy, at(ins[2]));
      SETP(dgate, at(outs[0]));
      SETP(dup, at(outs[1]));
      if (rebuildsY)
        SETP(y, at(outs[2]));
      launch(A, "swiGluBackward");
    }
    return success();
  }
  if (callee == "train.add_rms_norm") {
    // exec-generate-kernels' fusion: only a generated kernel implements it.
    if (failed(expectCounts(3, 3)))
      return failure();
    auto et = genType(ins[0]);
    if (!et)
      return op->emitError(pfx() + "'train.add_rms_norm' runs only as a "
                                   "generated kernel of bf16 or f32 "
                                   "(exec.step ")
             << exec::kKernelsAttr << " = \"generated\")";
    int64_t d = nel(ins[2]);
    kernelgen::GroupSpec g;
    g.kind = kernelgen::GroupKind::AddRmsNormForward;
    g.dtype = *et;
    g.zeroCentered = args && args.get("zero_centered");
    g.writeRstd = true;
    return launchGen(
        g, {{"a", P(at(ins[0]))},
            {"b", P(at(ins[1]))},
            {"w", P(at(ins[2]))},
            {"h", P(at(outs[0]))},
            {"y", P(at(outs[1]))},
            {"rstd", P(at(outs[2]))},
            {"rows", L(nel(ins[0]) / d)},
            {"dim", L(d)},
            {"eps", F(float(arg(op, args, "eps", 1e-6, /*f32=*/true)))}});
  }
  if (callee == "train.rms_norm_grad_add" ||
      callee == "train.rms_norm_grad_sum") {
    // exec-generate-kernels' fusions: RMSNorm backward with the residual
    // add of its dx (_add: ins x, w, rstd, dy or its addends, the other
    // addend last; outs the sum, then the weight grad), or with the chain
    // of adds forming its dy (_sum: ins x, w, rstd, dy's addends; outs dx,
    // then the weight grad).
    bool withAdd = callee == "train.rms_norm_grad_add";
    int addends = int(ins.size()) - (withAdd ? 4 : 3);
    auto et = genType(ins[0]);
    if (!et || results != 1 || addends < (withAdd ? 1 : 2) ||
        addends > kernelgen::kMaxDyAddends)
      return op->emitError(pfx() + "'" + callee.str() +
                           "' runs only as a generated kernel of bf16 or f32 "
                           "with x, w, rstd, 1 to 4 addends of dy" +
                           (withAdd ? ", the other addend" : "") +
                           " and one result (exec.step ")
             << exec::kKernelsAttr << " = \"generated\")";
    int64_t d = nel(ins[1]);
    int64_t rows = nel(ins[0]) / d;
    kernelgen::GroupSpec g;
    g.kind = kernelgen::GroupKind::RmsNormBackward;
    g.dtype = *et;
    g.zeroCentered = args && args.get("zero_centered");
    g.accumulateDw = grads >= 1;
    g.addResidual = withAdd;
    g.dyAddends = addends;
    std::map<std::string, GenArg> v{
        {"x", P(at(ins[0]))},  {"w", P(at(ins[1]))},   {"rstd", P(at(ins[2]))},
        {"dy", P(at(ins[3]))}, {"dx", P(at(outs[0]))}, {"rows", L(rows)},
        {"dim", L(d)},         {"xStride", L(d)},      {"dyStride", L(d)},
        {"dxStride", L(d)}};
    for (int k = 1; k < addends; ++k)
      v["dy" + std::to_string(k)] = P(at(ins[3 + k]));
    if (withAdd)
      v["res"] = P(at(ins.back()));
    if (g.accumulateDw)
      setDw(v, at(outs[1]), rows, d);
    return launchGen(g, v);
  }
  if (callee == "train.add") {
    if (failed(expectCounts(2, 1)))
      return failure();
    if (auto et = genType(ins[0])) {
      kernelgen::GroupSpec g;
      g.kind = kernelgen::GroupKind::ResidualAdd;
      g.dtype = *et;
      return launchGen(g, {{"a", P(at(ins[0]))},
                           {"b", P(at(ins[1]))},
                           {"y", P(at(outs[0]))},
                           {"n", L(nel(outs[0]))}});
    }
    ArgsOf<ResidualAddArgs> A("ResidualAddArgs");
    SETV(dtype, dt(ins[0]));
    SETP(a, at(ins[0]));
    SETP(b, at(ins[1]));
    SETP(y, at(outs[0]));
    SETV(n, nel(outs[0]));
    launch(A, "residualAddForward");
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
      return op->emitError(pfx() + "'")
             << callee << "' with " << ins.size() << " inputs (expected "
             << (fused ? 3 : 4) << ")";
    if (fused && results != 3)
      return op->emitError(pfx() + "the fused lm head needs loss, count "
                                   "and hidden-grad outputs");
    int64_t d = dim(ins[1], 1), vocab = dim(ins[1], 0);
    ArgsOf<LmHeadCrossEntropyArgs> A("LmHeadCrossEntropyArgs");
    SETV(dtype, dt(ins[0]));
    SETP(hidden, at(ins[0]));
    SETP(weight, at(ins[1]));
    SETP(labels, at(ins[2]));
    SETV(tokens, nel(ins[0]) / d);
    SETV(dim, d);
    SETV(vocab, vocab);
    SETV(chunkTokens, intArg(args, "chunk_tokens", 1024));
    SETV(ignoreIndex, intArg(args, "ignore_index", -100));
    if (args && args.get("vocab_parallel"))
      SETV(vocabParallel, int32_t(1));
    if (fwd) {
      SETP(lossSum, at(outs[0]));
      SETP(validCount, at(outs[1]));
      SETP(lse, at(outs[2]));
      launch(A, "lmHeadCrossEntropyForward");
      return success();
    }
    // The backward entry writes the loss outputs too (kernels/dense.h): the
    // fused op's are its results, the grad op's are thrown away.
    // Sum of token losses: finalize_grads divides by the step's tokens.
    SETV(gradScale, 1.0);
    if (fused) {
      SETP(lossSum, at(outs[0]));
      SETP(validCount, at(outs[1]));
      SETP(dHidden, at(outs[2]));
    } else {
      if (side)
        return notOnSide("its loss sum goes to the driver scratch");
      SETP(lossSum, (Addr{Addr::Scratch, AP_SCRATCH_LOSS_DISCARD}));
      if (results >= 1)
        SETP(dHidden, at(outs[0]));
    }
    if (grads >= 1)
      SETP(dWeight, at(outs[results]));
    launch(A, "lmHeadCrossEntropyBackward");
    return success();
  }
  if (callee == "train.yield") {
    if (failed(expectCounts(2, 2)))
      return failure();
    sink_.call("ap_yield", {off(ins[0]), off(ins[1])});
    return success();
  }
  if (callee == "train.finalize_grads") {
    double maxNorm = arg(op, args, "max_norm", 1.0);
    if (generated_ &&
        (generatedOps_.empty() || generatedOps_.count(callee.str()))) {
      // kernelgen's grad norm: the sums of squares for each main-grad dtype
      // the step has, then the finish; the runtime fills their arguments.
      auto index = [&](const kernelgen::GroupSpec &g) {
        return uint64_t(generatedIndex(g));
      };
      auto squares = [&](bool present, kernelgen::ElemType t) {
        if (!present)
          return uint64_t(AP_GENERATED_NONE);
        kernelgen::GroupSpec g;
        g.kind = kernelgen::GroupKind::GradNormSquares;
        g.dtype = t;
        return index(g);
      };
      kernelgen::GroupSpec finish;
      finish.kind = kernelgen::GroupKind::GradNormFinish;
      sink_.call(
          "ap_finalize_grads_generated",
          {CallArg::f64(maxNorm),
           CallArg::u32(squares(mainGradBf16_, kernelgen::ElemType::BF16)),
           CallArg::u32(squares(mainGradF32_, kernelgen::ElemType::F32)),
           CallArg::u32(index(finish))});
      return success();
    }
    sink_.call("ap_finalize_grads", {CallArg::f64(maxNorm)});
    return success();
  }
  if (callee == "train.lr_schedule") {
    sink_.call("ap_lr_schedule",
               {CallArg::f64(arg(op, args, "max_lr", 3e-4)),
                CallArg::f64(arg(op, args, "min_lr", 0)),
                CallArg::i64(intArg(args, "warmup_steps", 0)),
                CallArg::i64(intArg(args, "total_steps", 1))});
    return success();
  }
  if (callee == "train.adamw") {
    auto sym = args ? args.getAs<FlatSymbolRefAttr>("param") : nullptr;
    if (!sym || !paramIndex_.count(sym.getValue()))
      return op->emitError(pfx() + "train.adamw without a known `param`");
    // outs: weight (the compute copy), master, main grad, Adam m and v.
    std::optional<kernelgen::ElemType> gradType, copyType;
    if (outs.size() == 5) {
      gradType = genType(outs[2]);
      copyType = genType(outs[0]);
    }
    // The hyperparameters, after the parameter (and the generated kernel).
    std::vector<CallArg> call{CallArg::u32(paramIndex_[sym.getValue()])};
    if (gradType && copyType) {
      // kernelgen's AdamW over the parameter's flat buffers: the runtime
      // fills its arguments (the shard, the learning rate, the step).
      kernelgen::GroupSpec g;
      g.kind = kernelgen::GroupKind::AdamW;
      g.dtype = *gradType;
      g.computeCopy = *copyType;
      call.push_back(CallArg::u32(generatedIndex(g)));
    }
    for (auto [name, fallback] :
         {std::pair{"beta1", 0.9}, std::pair{"beta2", 0.999},
          std::pair{"eps", 1e-8}, std::pair{"weight_decay", 0.0}})
      call.push_back(CallArg::f64(arg(op, args, name, fallback)));
    sink_.call(gradType && copyType ? "ap_adamw_step_generated"
                                    : "ap_adamw_step",
               call, sym.getValue());
    return success();
  }
  if (callee == "train.loss_mean") {
    sink_.call("ap_loss_mean", {});
    return success();
  }
  return op->emitError(pfx() + "unsupported kernel '") << callee << "'";
}

} // namespace

LogicalResult walkStep(ModuleOp module, StepSink &sink, StringRef tool,
                       EmittedPlan *plan) {
  return Walker(module, sink, tool).run(plan);
}

} // namespace ap::codegen
