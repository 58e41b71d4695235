//===- EmitLLVM.cpp - exec.step -> LLVM dialect and object file -----------===//
//
// The LLVM-dialect form of the step (StepSink.h). Runtime calls are
// declared from the C prototypes of runtime/abi.h themselves (abiSignature
// reads each one's parameter types), so a call whose arguments disagree with
// the ABI is an internal error here, not a crash at run time. Constants that
// hold pointers (the program description, its tables, the scope names) are
// images: the bytes of the real C struct filled in the compiler, with each
// pointer field a relocation to a global, written as a packed LLVM struct
// of byte runs and pointers; so their layout is the C compiler's, never
// restated here.
//
//===----------------------------------------------------------------------===//
#include "codegen/EmitLLVM.h"

#include "dialect/exec/ExecDialect.h"
#include "dialect/train/TrainDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Target/TargetOptions.h"
#include "llvm/TargetParser/Host.h"
#include "llvm/TargetParser/Triple.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

using namespace mlir;

namespace ap::codegen {
namespace {

//===----------------------------------------------------------------------===//
// The ABI's call signatures, read from runtime/abi.h's prototypes
//===----------------------------------------------------------------------===//

/// One parameter as the LLVM lowering passes it: 'i' i32, 'l' i64, 'd'
/// double, 'p' pointer.
template <typename T> constexpr char abiKind() {
  if constexpr (std::is_pointer_v<T>)
    return 'p';
  else if constexpr (std::is_same_v<T, double>)
    return 'd';
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 4)
    return 'i';
  else if constexpr (std::is_integral_v<T> && sizeof(T) == 8)
    return 'l';
  else
    static_assert(sizeof(T) == 0, "an ABI parameter type the lowering lacks");
}

template <typename F> struct AbiSignature;
template <typename... A> struct AbiSignature<void(ap_step *, A...)> {
  static std::string get() { return {abiKind<A>()...}; }
};

/// The parameter kinds after `ap_step *` of every call a step makes.
const llvm::StringMap<std::string> &abiCalls() {
#define AP_ABI_CALL(fn)                                                        \
  std::make_pair(llvm::StringRef(#fn), AbiSignature<decltype(fn)>::get())
  static const llvm::StringMap<std::string> calls = {
      AP_ABI_CALL(ap_launch),
      AP_ABI_CALL(ap_launch_generated),
      AP_ABI_CALL(ap_record),
      AP_ABI_CALL(ap_wait),
      AP_ABI_CALL(ap_wait_copy),
      AP_ABI_CALL(ap_offload),
      AP_ABI_CALL(ap_reload),
      AP_ABI_CALL(ap_begin_microbatch),
      AP_ABI_CALL(ap_load_input),
      AP_ABI_CALL(ap_load_input_shard),
      AP_ABI_CALL(ap_yield),
      AP_ABI_CALL(ap_end_loop),
      AP_ABI_CALL(ap_all_reduce),
      AP_ABI_CALL(ap_all_gather),
      AP_ABI_CALL(ap_reduce_scatter),
      AP_ABI_CALL(ap_zero),
      AP_ABI_CALL(ap_pipeline_send),
      AP_ABI_CALL(ap_pipeline_recv),
      AP_ABI_CALL(ap_slice),
      AP_ABI_CALL(ap_concat),
      AP_ABI_CALL(ap_expand),
      AP_ABI_CALL(ap_expand_grad),
      AP_ABI_CALL(ap_gdn_gates),
      AP_ABI_CALL(ap_gdn_gates_grad),
      AP_ABI_CALL(ap_convert),
      AP_ABI_CALL(ap_finalize_grads),
      AP_ABI_CALL(ap_lr_schedule),
      AP_ABI_CALL(ap_adamw_step),
      AP_ABI_CALL(ap_loss_mean),
      AP_ABI_CALL(ap_comm_group_begin),
      AP_ABI_CALL(ap_comm_group_end),
      AP_ABI_CALL(ap_adamw_step_generated),
      AP_ABI_CALL(ap_finalize_grads_generated)};
#undef AP_ABI_CALL
  return calls;
}

char kindLetter(CallArg::Kind k) {
  switch (k) {
  case CallArg::U32:
  case CallArg::I32:
    return 'i';
  case CallArg::I64:
  case CallArg::U64:
  case CallArg::LoopIndex:
    return 'l';
  case CallArg::F64:
    return 'd';
  case CallArg::Str:
  case CallArg::Ptr:
  case CallArg::U64Array:
  case CallArg::I64Array:
    return 'p';
  }
  return '?';
}

/// The largest args struct of AP_KERNEL_LIST or generated kernel's slots:
/// the one stack buffer every launch fills (the runtime copies it).
constexpr size_t kMaxArgsBytes = [] {
  size_t m = 8 * AP_GENERATED_MAX_PARAMS; // ap_launch_generated's slots
#define AP_ARGS_SIZE(ID, fn, Args) m = std::max(m, sizeof(ap::kernels::Args));
  AP_KERNEL_LIST(AP_ARGS_SIZE)
#undef AP_ARGS_SIZE
  return m;
}();

//===----------------------------------------------------------------------===//
// The sink
//===----------------------------------------------------------------------===//

/// Bytes with pointer relocations: a C struct (or array of them) filled in
/// the compiler, each pointer field naming the symbol it points to.
struct Image {
  std::vector<uint8_t> bytes;
  std::vector<std::pair<uint64_t, std::string>> relocs; ///< offset, symbol
  uint64_t align = 8;

  template <typename T> static Image of(const T *data, size_t n) {
    Image im;
    im.bytes.resize(sizeof(T) * n);
    if (n)
      std::memcpy(im.bytes.data(), data, sizeof(T) * n);
    im.align = alignof(T);
    return im;
  }
  /// Records `symbol` at `field`, a pointer member of element `i` of the
  /// array `base`, and clears its bytes.
  template <typename T, typename P>
  void reloc(const T *base, size_t i, P T::*field, std::string symbol) {
    uint64_t at = sizeof(T) * i +
                  uint64_t(reinterpret_cast<const char *>(&(base[i].*field)) -
                           reinterpret_cast<const char *>(&base[i]));
    std::memset(bytes.data() + at, 0, sizeof(void *));
    relocs.emplace_back(at, std::move(symbol));
  }
};

class LLVMSink : public StepSink {
public:
  /// `prefix` starts every symbol this sink defines (a pipeline stage's
  /// "s1."), so several stages share one module; `withMain`: the program
  /// is the binary's only one and main() runs it.
  explicit LLVMSink(ModuleOp out, std::string prefix = "", bool withMain = true)
      : ctx_(out.getContext()), b_(ctx_), loc_(out.getLoc()), out_(out),
        prefix_(std::move(prefix)), withMain_(withMain) {
    ptrTy_ = LLVM::LLVMPointerType::get(ctx_);
    i8_ = IntegerType::get(ctx_, 8);
    i32_ = IntegerType::get(ctx_, 32);
    i64_ = IntegerType::get(ctx_, 64);
    f64_ = Float64Type::get(ctx_);
    voidTy_ = LLVM::LLVMVoidType::get(ctx_);
    b_.setInsertionPointToEnd(out.getBody());
    auto fnTy = LLVM::LLVMFunctionType::get(voidTy_, {ptrTy_});
    step_ = LLVM::LLVMFuncOp::create(b_, loc_, prefix_ + "actplace_step", fnTy,
                                     LLVM::Linkage::Internal);
    Block *entry = step_.addEntryBlock(b_);
    r_ = entry->getArgument(0);
    b_.setInsertionPointToStart(entry);
    // One buffer for every launch's args (ap_launch copies them).
    Value one = cst(i64_, 1);
    argsBuf_ = LLVM::AllocaOp::create(
        b_, loc_, ptrTy_, LLVM::LLVMArrayType::get(i8_, kMaxArgsBytes), one,
        /*alignment=*/16);
  }

  void call(StringRef fn, ArrayRef<CallArg> args, StringRef) override {
    SmallVector<Value> vals{r_};
    std::string kinds;
    for (const CallArg &a : args) {
      vals.push_back(value(a));
      kinds += kindLetter(a.kind);
    }
    emitCall(fn, kinds, vals);
  }

  void launch(int32_t stream, StringRef, StringRef label, int32_t kernel,
              StringRef, const KernelArgs &args) override {
    launchWith("ap_launch", stream, label, kernel, args);
  }
  void launchGenerated(int32_t stream, StringRef, StringRef label,
                       uint32_t kernel, StringRef,
                       const KernelArgs &args) override {
    launchWith("ap_launch_generated", stream, label, int32_t(kernel), args);
  }
  bool holdsGeneratedKernels() const override { return true; }

  /// `fn`(step, stream, label, kernel, &args, sizeof args): the args image
  /// copied into the launch buffer, its pointers stored at run time.
  void launchWith(StringRef fn, int32_t stream, StringRef label, int32_t kernel,
                  const KernelArgs &args) {
    uint64_t size = args.bytes.size();
    if (size > kMaxArgsBytes) {
      error_ = "args struct " + args.type + " is larger than the launch buffer";
      return;
    }
    Value image = addressOf(bytesGlobal(args.bytes, args.align, "args"));
    LLVM::MemcpyOp::create(b_, loc_, argsBuf_, image, cst(i64_, size),
                           /*isVolatile=*/false);
    for (const KernelArgs::Field &f : args.fields) {
      if (!f.isPtr)
        continue;
      Value p = address(f.addr);
      Value slot =
          LLVM::GEPOp::create(b_, loc_, ptrTy_, i8_, argsBuf_,
                              ArrayRef<LLVM::GEPArg>{int32_t(f.offset)});
      LLVM::StoreOp::create(b_, loc_, p, slot);
    }
    emitCall(fn, "ipipl",
             {r_, cst(i32_, stream), addressOf(stringGlobal(label)),
              cst(i32_, kernel), argsBuf_, cst(i64_, size)});
  }

  void beginLoop(int64_t count) override {
    Block *cur = b_.getInsertionBlock();
    Region *region = cur->getParent();
    Block *header = new Block(), *body = new Block(), *exit = new Block();
    region->push_back(header);
    region->push_back(body);
    region->push_back(exit);
    Value index = header->addArgument(i64_, loc_);
    LLVM::BrOp::create(b_, loc_, ValueRange{cst(i64_, 0)}, header);
    b_.setInsertionPointToStart(header);
    Value more = LLVM::ICmpOp::create(b_, loc_, LLVM::ICmpPredicate::slt, index,
                                      cst(i64_, count));
    LLVM::CondBrOp::create(b_, loc_, more, body, exit);
    b_.setInsertionPointToStart(body);
    loops_.push_back({header, exit, index});
  }
  void endLoop() override {
    Loop l = loops_.pop_back_val();
    Value next = LLVM::AddOp::create(b_, loc_, l.index, cst(i64_, 1));
    LLVM::BrOp::create(b_, loc_, ValueRange{next}, l.header);
    b_.setInsertionPointToStart(l.exit);
  }

  LogicalResult program(const ProgramDesc &d) override;

  const std::string &error() const { return error_; }

  /// The generated kernels' table (prefix "generated"), their host code
  /// (absorbed into the module) and PTX (`ptxSymbol`, empty when none).
  LogicalResult generatedKernels(const std::vector<ProgramDesc::Generated> &all,
                                 std::string &ptxSymbol);

private:
  struct Loop {
    Block *header, *exit;
    Value index;
  };

  Value cst(Type t, int64_t v) {
    return LLVM::ConstantOp::create(b_, loc_, t, b_.getIntegerAttr(t, v));
  }
  Value address(Addr a) {
    return emitCall(a.kind == Addr::Scratch ? "ap_scratch" : "ap_at", "l",
                    {r_, cst(i64_, int64_t(a.offset))}, ptrTy_);
  }
  Value addressOf(LLVM::GlobalOp g) {
    return LLVM::AddressOfOp::create(b_, loc_, g);
  }
  Value value(const CallArg &a) {
    switch (a.kind) {
    case CallArg::U32:
    case CallArg::I32:
      return cst(i32_, a.i);
    case CallArg::I64:
    case CallArg::U64:
      return cst(i64_, a.i);
    case CallArg::F64:
      return LLVM::ConstantOp::create(b_, loc_, f64_,
                                      b_.getFloatAttr(f64_, a.f));
    case CallArg::Str:
      return addressOf(stringGlobal(a.s));
    case CallArg::Ptr:
      return address(a.addr);
    case CallArg::U64Array:
    case CallArg::I64Array: {
      std::vector<uint8_t> bytes(a.arr.size() * 8);
      if (!a.arr.empty())
        std::memcpy(bytes.data(), a.arr.data(), bytes.size());
      return addressOf(bytesGlobal(bytes, 8, "array"));
    }
    case CallArg::LoopIndex:
      if (loops_.empty()) {
        error_ = "a loop index outside a microbatch loop";
        return cst(i64_, 0);
      }
      return loops_.back().index;
    }
    return {};
  }

  /// The external declaration of `fn`: `ap_step *` then `kinds`, returning
  /// `result` (void when null).
  LLVM::LLVMFuncOp declare(StringRef fn, StringRef kinds, Type result) {
    if (auto f = out_.lookupSymbol<LLVM::LLVMFuncOp>(fn))
      return f;
    SmallVector<Type> params{ptrTy_};
    for (char k : kinds)
      params.push_back(k == 'i'   ? Type(i32_)
                       : k == 'l' ? Type(i64_)
                       : k == 'd' ? Type(f64_)
                                  : Type(ptrTy_));
    OpBuilder::InsertionGuard guard(b_);
    b_.setInsertionPointToStart(out_.getBody());
    return LLVM::LLVMFuncOp::create(
        b_, loc_, fn,
        LLVM::LLVMFunctionType::get(result ? result : voidTy_, params));
  }
  Value emitCall(StringRef fn, StringRef kinds, ArrayRef<Value> args,
                 Type result = {}) {
    if (!result) {
      auto it = abiCalls().find(fn);
      if (it == abiCalls().end())
        error_ = ("no runtime ABI call '" + fn + "'").str();
      else if (it->second != kinds)
        error_ = ("call of '" + fn + "' with arguments (" + kinds +
                  ") where runtime/abi.h declares (" + it->second + ")")
                     .str();
    }
    auto call = LLVM::CallOp::create(b_, loc_, declare(fn, kinds, result),
                                     ValueRange(args));
    return result ? call.getResult() : Value();
  }

  /// A private constant global holding `bytes` (deduplicated).
  LLVM::GlobalOp bytesGlobal(const std::vector<uint8_t> &bytes, uint64_t align,
                             StringRef prefix) {
    std::string key(bytes.begin(), bytes.end());
    key += char(align);
    auto it = bytesGlobals_.find(key);
    if (it != bytesGlobals_.end())
      return it->second;
    OpBuilder::InsertionGuard guard(b_);
    b_.setInsertionPoint(step_);
    std::string name =
        (prefix_ + prefix + "." + Twine(bytesGlobals_.size())).str();
    auto g = LLVM::GlobalOp::create(
        b_, loc_, LLVM::LLVMArrayType::get(i8_, bytes.size()),
        /*isConstant=*/true, LLVM::Linkage::Private, name,
        b_.getStringAttr(StringRef(reinterpret_cast<const char *>(bytes.data()),
                                   bytes.size())),
        align);
    bytesGlobals_[key] = g;
    return g;
  }
  /// A NUL-terminated string constant (deduplicated).
  LLVM::GlobalOp stringGlobal(StringRef s) {
    auto it = strings_.find(s);
    if (it != strings_.end())
      return it->second;
    OpBuilder::InsertionGuard guard(b_);
    b_.setInsertionPoint(step_);
    std::string text = s.str();
    text.push_back('\0');
    auto g = LLVM::GlobalOp::create(
        b_, loc_, LLVM::LLVMArrayType::get(i8_, text.size()),
        /*isConstant=*/true, LLVM::Linkage::Private,
        prefix_ + "str." + std::to_string(strings_.size()),
        b_.getStringAttr(text),
        /*alignment=*/1);
    strings_[s] = g;
    return g;
  }
  /// A constant global for `im`: a packed struct of its byte runs and
  /// pointers (the pointers are addresses of the named symbols).
  LLVM::GlobalOp imageGlobal(const Image &im, StringRef name,
                             LLVM::Linkage linkage = LLVM::Linkage::Private) {
    OpBuilder::InsertionGuard guard(b_);
    b_.setInsertionPointToEnd(out_.getBody());
    auto relocs = im.relocs;
    llvm::sort(relocs);
    SmallVector<Type> parts;
    SmallVector<std::pair<std::string, bool>> contents; // bytes or symbol
    uint64_t at = 0;
    auto run = [&](uint64_t end) {
      if (end > at) {
        parts.push_back(LLVM::LLVMArrayType::get(i8_, end - at));
        contents.emplace_back(
            std::string(im.bytes.begin() + at, im.bytes.begin() + end), false);
      }
      at = end;
    };
    for (const auto &[offset, symbol] : relocs) {
      run(offset);
      parts.push_back(ptrTy_);
      contents.emplace_back(symbol, true);
      at = offset + sizeof(void *);
    }
    run(im.bytes.size());
    auto type = LLVM::LLVMStructType::getLiteral(ctx_, parts, /*packed=*/true);
    auto g =
        LLVM::GlobalOp::create(b_, loc_, type, /*isConstant=*/true, linkage,
                               prefix_ + name.str(), Attribute(), im.align);
    Block *init = b_.createBlock(&g.getInitializerRegion());
    b_.setInsertionPointToStart(init);
    Value agg = LLVM::UndefOp::create(b_, loc_, type);
    for (auto [i, c] : llvm::enumerate(contents)) {
      Value v;
      if (c.second)
        v = LLVM::AddressOfOp::create(b_, loc_, ptrTy_, c.first);
      else
        v = LLVM::ConstantOp::create(b_, loc_, parts[i],
                                     b_.getStringAttr(c.first));
      agg = LLVM::InsertValueOp::create(b_, loc_, agg, v, int64_t(i));
    }
    LLVM::ReturnOp::create(b_, loc_, agg);
    return g;
  }
  std::string symbolOf(LLVM::GlobalOp g) { return g.getSymName().str(); }

public:
  /// The ap_program global, once program() ran.
  std::string programSymbol() const { return prefix_ + "program"; }

private:
  MLIRContext *ctx_;
  OpBuilder b_;
  Location loc_;
  ModuleOp out_;
  Type ptrTy_, i8_, i32_, i64_, f64_, voidTy_;
  LLVM::LLVMFuncOp step_;
  Value r_, argsBuf_;
  SmallVector<Loop> loops_;
  std::map<std::string, LLVM::GlobalOp> bytesGlobals_;
  llvm::StringMap<LLVM::GlobalOp> strings_;
  std::string error_;
  std::string prefix_;
  bool withMain_;
};

LogicalResult
LLVMSink::generatedKernels(const std::vector<ProgramDesc::Generated> &all,
                           std::string &ptxSymbol) {
  // The table: per kernel its name, parameter kinds, packed host function
  // (kernelgen) or PTX and launch shape (Triton), and GPU entries.
  std::vector<kernelgen::GroupSpec> specs;
  std::vector<ap_generated_kernel> kernels(all.size());
  std::vector<std::string> entrySymbols;
  for (auto [i, g] : llvm::enumerate(all)) {
    std::vector<ap_generated_entry> es;
    std::vector<std::string> names;
    if (g.spec) {
      specs.push_back(*g.spec);
      for (const kernelgen::GpuEntry &e : kernelgen::gpuEntries(*g.spec)) {
        ap_generated_entry en{};
        en.work_params[0] = e.workParams.size() > 0 ? e.workParams[0] : -1;
        en.work_params[1] = e.workParams.size() > 1 ? e.workParams[1] : -1;
        en.threads_per_item = int32_t(e.threadsPerItem);
        en.block_size = int32_t(e.blockSize);
        en.vector = int32_t(e.vector);
        es.push_back(en);
        names.push_back(e.name);
      }
    } else {
      // A Triton kernel: one entry, its grid in the launch's args.
      es.push_back({nullptr, {-1, -1}, 0, 0, 0});
      names.push_back(g.triton->name);
      kernels[i].triton = 1;
      kernels[i].num_warps = int32_t(g.triton->numWarps);
      kernels[i].shared_bytes = int32_t(g.triton->sharedBytes);
      kernels[i].hidden_params = int32_t(g.triton->hiddenParams);
    }
    Image im = Image::of(es.data(), es.size());
    for (auto [j, name] : llvm::enumerate(names))
      im.reloc(es.data(), j, &ap_generated_entry::name,
               symbolOf(stringGlobal(name)));
    std::string name = "gen_entries." + std::to_string(i);
    imageGlobal(im, name);
    entrySymbols.push_back(prefix_ + name);
    kernels[i].num_entries = uint32_t(es.size());
  }
  // The host kernels with their packed entries, once per module (pipeline
  // stages share them).
  std::string text, error;
  if (!specs.empty()) {
    if (!kernelgen::packedHostKernels(specs, text, error))
      return emitError(loc_, "convert-exec-to-llvm: generated kernels: ")
             << error;
    OwningOpRef<ModuleOp> host =
        parseSourceString<ModuleOp>(text, ParserConfig(ctx_));
    if (!host)
      return emitError(loc_, "convert-exec-to-llvm: the generated host "
                             "kernels did not parse back");
    for (Operation &op : llvm::make_early_inc_range(*host->getBody())) {
      auto sym = dyn_cast<SymbolOpInterface>(op);
      if (sym && out_.lookupSymbol(sym.getName()))
        continue;
      op.remove();
      out_.getBody()->push_back(&op);
    }
  }
  Image im = Image::of(kernels.data(), kernels.size());
  for (auto [i, g] : llvm::enumerate(all)) {
    std::string params, name;
    if (g.spec) {
      for (const kernelgen::KernelParam &kp : kernelgen::kernelParams(*g.spec))
        params.push_back(kp.kind);
      name = kernelgen::kernelName(*g.spec);
      im.reloc(kernels.data(), i, &ap_generated_kernel::host,
               kernelgen::packedName(*g.spec));
    } else {
      params = g.triton->kinds();
      name = g.triton->name;
      im.reloc(kernels.data(), i, &ap_generated_kernel::ptx,
               symbolOf(stringGlobal(g.triton->ptx)));
    }
    im.reloc(kernels.data(), i, &ap_generated_kernel::name,
             symbolOf(stringGlobal(name)));
    im.reloc(kernels.data(), i, &ap_generated_kernel::params,
             symbolOf(stringGlobal(params)));
    im.reloc(kernels.data(), i, &ap_generated_kernel::entries, entrySymbols[i]);
  }
  imageGlobal(im, "generated");
  if (specs.empty())
    return success();
  // The PTX of the GPU entries; without a CUDA toolkit (libdevice) the
  // binary runs its generated kernels on the host backend only.
  kernelgen::GpuTarget target;
  if (kernelgen::libdeviceToolkit(target).empty()) {
    emitWarning(loc_, "convert-exec-to-llvm: no CUDA toolkit with "
                      "nvvm/libdevice/libdevice.10.bc ($CUDA_HOME, "
                      "$CUDA_PATH, /usr/local/cuda): the binary's generated "
                      "kernels have no PTX and run on the host backend only");
    return success();
  }
  std::string ptx;
  if (!kernelgen::kernelsPtx(specs, target, ptx, error))
    return emitError(loc_, "convert-exec-to-llvm: generated kernels: ")
           << error;
  ptxSymbol = symbolOf(stringGlobal(ptx));
  return success();
}

LogicalResult LLVMSink::program(const ProgramDesc &d) {
  // Close the step.
  LLVM::ReturnOp::create(b_, loc_, ValueRange{});

  ap_program p = {};
  p.abi_version = AP_ABI_VERSION;
  p.struct_size = sizeof(ap_program);
  p.micro_batches = d.microBatches;
  p.batch = d.batch;
  p.seq = d.seq;
  p.vocab = d.vocab;
  p.persistent_bytes = d.persistentBytes;
  p.activation_bytes = d.activationBytes;
  p.workspace_bytes = d.workspaceBytes;
  if (d.describeSide)
    p.side_workspace_bytes = d.sideWorkspaceBytes;
  p.side_kernels = d.sideKernels;
  p.side_after_host_start = d.sideAfterHostStart;
  p.side_sm_percent = d.sideKernels ? d.sideSmPercent : 0;
  p.arena_bytes = d.arenaBytes;
  p.pinned_bytes = d.pinnedBytes;
  p.scratch_bytes = d.scratchBytes;
  p.scratch_offset = d.scratchOffset;
  p.num_model_config = uint32_t(d.modelConfig.size());
  p.num_slots = uint32_t(d.slots.size());
  p.num_scopes = uint32_t(d.scopes.size());
  p.num_params = uint32_t(d.params.size());
  p.num_events = d.numEvents;
  uint64_t *state[] = {&p.state_loss_sum, &p.state_token_count,
                       &p.state_grad_norm, &p.state_lr, &p.state_loss};
  for (int i = 0; i < 5; ++i)
    *state[i] = d.stateOffsets[i] ? *d.stateOffsets[i] : AP_NO_OFFSET;
  p.max_lr = d.maxLr;
  p.optimizer_known = 1;
  p.min_lr = d.minLr.value_or(0);
  p.warmup_steps = d.warmupSteps.value_or(0);
  p.total_steps = d.totalSteps.value_or(0);
  p.max_grad_norm = d.maxGradNorm.value_or(0);
  p.num_adamw = uint32_t(d.adamw.size());
  p.data_parallel_size = d.dataParallelSize;
  p.data_parallel_mode = d.dataParallelMode;
  p.pipeline_size = d.pipelineSize;
  p.pipeline_stage = d.pipelineStage;
  p.tensor_parallel_size = d.tensorParallelSize;
  p.document_separator = d.documentSeparator;
  p.ignore_index = d.ignoreIndex;
  p.num_generated = uint32_t(d.generated.size());
  std::string ptxSymbol;
  if (!d.generated.empty()) {
    if (failed(generatedKernels(d.generated, ptxSymbol)))
      return failure();
  }
  Image prog = Image::of(&p, 1);
  if (!d.generated.empty()) {
    prog.reloc(&p, 0, &ap_program::generated, prefix_ + "generated");
    if (!ptxSymbol.empty())
      prog.reloc(&p, 0, &ap_program::generated_ptx, ptxSymbol);
  }
  prog.reloc(&p, 0, &ap_program::model, symbolOf(stringGlobal(d.model)));
  prog.reloc(&p, 0, &ap_program::step, step_.getSymName().str());

  if (!d.modelConfig.empty()) {
    std::vector<ap_config_entry> entries(d.modelConfig.size());
    Image im = Image::of(entries.data(), entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      im.reloc(entries.data(), i, &ap_config_entry::key,
               symbolOf(stringGlobal(d.modelConfig[i].first)));
      im.reloc(entries.data(), i, &ap_config_entry::value,
               symbolOf(stringGlobal(d.modelConfig[i].second)));
    }
    imageGlobal(im, "model_config");
    prog.reloc(&p, 0, &ap_program::model_config, prefix_ + "model_config");
  }
  if (!d.slots.empty()) {
    std::vector<ap_slot> slots;
    for (auto [off, bytes] : d.slots)
      slots.push_back({off, bytes});
    imageGlobal(Image::of(slots.data(), slots.size()), "slots");
    prog.reloc(&p, 0, &ap_program::slots, prefix_ + "slots");
  }
  if (!d.scopes.empty()) {
    std::vector<const char *> names(d.scopes.size(), nullptr);
    Image im = Image::of(names.data(), names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      uint64_t at = i * sizeof(const char *);
      im.relocs.emplace_back(at, symbolOf(stringGlobal(d.scopes[i])));
    }
    imageGlobal(im, "scopes");
    prog.reloc(&p, 0, &ap_program::scopes, prefix_ + "scopes");
  }
  if (!d.params.empty()) {
    std::vector<ap_param> params(d.params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const ProgramDesc::Param &q = d.params[i];
      ap_param &a = params[i];
      a.dtype = q.dtype;
      a.rank = q.rank;
      for (int j = 0; j < 4; ++j)
        a.shape[j] = q.shape[j];
      a.numel = q.numel;
      a.init = q.init;
      a.frozen = q.frozen;
      a.init_a = q.initA;
      a.init_b = q.initB;
      uint64_t *offs[] = {&a.weight, &a.master, &a.grad, &a.adam_m, &a.adam_v};
      for (int j = 0; j < 5; ++j)
        *offs[j] = q.offsets[j] ? *q.offsets[j] : AP_NO_OFFSET;
      a.shard_numel = q.shardNumel;
      a.main_grad_bf16 = q.mainGradBf16 ? 1 : 0;
      a.pipeline_tied = q.pipelineTied ? 1 : 0;
      a.tied_grad_offset = q.tiedGradOffset ? *q.tiedGradOffset : AP_NO_OFFSET;
      a.tp_dim = q.tpDim;
      a.tp_num_segments = int32_t(q.tpSegments.size());
      for (size_t j = 0; j < 4; ++j)
        a.tp_segments[j] = j < q.tpSegments.size() ? q.tpSegments[j] : 0;
      a.tp_grad_sum = q.tpGradSum ? 1 : 0;
    }
    Image im = Image::of(params.data(), params.size());
    for (size_t i = 0; i < params.size(); ++i)
      im.reloc(params.data(), i, &ap_param::name,
               symbolOf(stringGlobal(d.params[i].name)));
    imageGlobal(im, "params");
    prog.reloc(&p, 0, &ap_program::params, prefix_ + "params");
  }
  if (!d.adamw.empty()) {
    std::vector<ap_adamw> adamw;
    for (const ProgramDesc::AdamW &a : d.adamw)
      adamw.push_back({a.param, a.beta1, a.beta2, a.eps, a.weightDecay});
    imageGlobal(Image::of(adamw.data(), adamw.size()), "adamw");
    prog.reloc(&p, 0, &ap_program::adamw, prefix_ + "adamw");
  }
  LLVM::GlobalOp program = imageGlobal(prog, "program");
  if (!withMain_) {
    if (!error_.empty())
      return emitError(loc_, "convert-exec-to-llvm: internal error: ")
             << error_;
    return success();
  }

  // int main(int argc, char **argv) { return ap_train_main(argc, argv, &p); }
  b_.setInsertionPointToEnd(out_.getBody());
  auto mainFn = LLVM::LLVMFuncOp::create(
      b_, loc_, "main", LLVM::LLVMFunctionType::get(i32_, {i32_, ptrTy_}));
  Block *entry = mainFn.addEntryBlock(b_);
  b_.setInsertionPointToStart(entry);
  OpBuilder::InsertionGuard guard(b_);
  auto trainMain = [&] {
    if (auto f = out_.lookupSymbol<LLVM::LLVMFuncOp>("ap_train_main"))
      return f;
    OpBuilder::InsertionGuard g(b_);
    b_.setInsertionPointToStart(out_.getBody());
    return LLVM::LLVMFuncOp::create(
        b_, loc_, "ap_train_main",
        LLVM::LLVMFunctionType::get(i32_, {i32_, ptrTy_, ptrTy_}));
  }();
  Value rc = LLVM::CallOp::create(b_, loc_, trainMain,
                                  ValueRange{entry->getArgument(0),
                                             entry->getArgument(1),
                                             addressOf(program)})
                 .getResult();
  LLVM::ReturnOp::create(b_, loc_, rc);
  if (!error_.empty())
    return emitError(loc_, "convert-exec-to-llvm: internal error: ") << error_;
  return success();
}

} // namespace

LogicalResult lowerStepToLLVM(ModuleOp module, EmittedPlan *plan) {
  MLIRContext *ctx = module.getContext();
  ctx->getOrLoadDialect<LLVM::LLVMDialect>();
  // Built beside the input, which the walk reads; swapped in on success.
  OwningOpRef<ModuleOp> out = ModuleOp::create(module.getLoc());
  LLVMSink sink(*out);
  if (failed(walkStep(module, sink, "convert-exec-to-llvm", plan)))
    return failure();
  module.getBody()->clear();
  for (NamedAttribute a : module->getDiscardableAttrs())
    module->removeDiscardableAttr(a.getName());
  module.getBody()->getOperations().splice(module.getBody()->end(),
                                           out->getBody()->getOperations());
  return success();
}

LogicalResult lowerStagesToLLVM(ModuleOp into, ArrayRef<ModuleOp> stages,
                                EmittedPlan *plans) {
  MLIRContext *ctx = into.getContext();
  ctx->getOrLoadDialect<LLVM::LLVMDialect>();
  OwningOpRef<ModuleOp> out = ModuleOp::create(into.getLoc());
  // Each stage's step, tables and program under its own prefix.
  SmallVector<std::string> programs;
  for (auto [k, stage] : llvm::enumerate(stages)) {
    LLVMSink sink(*out, "s" + std::to_string(k) + ".", /*withMain=*/false);
    if (failed(walkStep(stage, sink, "convert-exec-to-llvm",
                        plans ? &plans[k] : nullptr)))
      return failure();
    programs.push_back(sink.programSymbol());
  }
  // const ap_program *stages[] = {&s0.program, ...};
  // int main(int argc, char **argv) {
  //   return ap_train_main_stages(argc, argv, stages, N); }
  OpBuilder b(ctx);
  Location loc = into.getLoc();
  b.setInsertionPointToEnd(out->getBody());
  auto ptr = LLVM::LLVMPointerType::get(ctx);
  auto i32 = IntegerType::get(ctx, 32);
  auto tableTy = LLVM::LLVMArrayType::get(ptr, programs.size());
  auto table = LLVM::GlobalOp::create(b, loc, tableTy, /*isConstant=*/true,
                                      LLVM::Linkage::Private, "stages",
                                      Attribute(), alignof(void *));
  {
    OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(b.createBlock(&table.getInitializerRegion()));
    Value agg = LLVM::UndefOp::create(b, loc, tableTy);
    for (auto [i, sym] : llvm::enumerate(programs))
      agg = LLVM::InsertValueOp::create(
          b, loc, agg, LLVM::AddressOfOp::create(b, loc, ptr, sym), int64_t(i));
    LLVM::ReturnOp::create(b, loc, agg);
  }
  auto trainMain = LLVM::LLVMFuncOp::create(
      b, loc, "ap_train_main_stages",
      LLVM::LLVMFunctionType::get(i32, {i32, ptr, ptr, i32}));
  auto mainFn = LLVM::LLVMFuncOp::create(
      b, loc, "main", LLVM::LLVMFunctionType::get(i32, {i32, ptr}));
  Block *entry = mainFn.addEntryBlock(b);
  b.setInsertionPointToStart(entry);
  Value count = LLVM::ConstantOp::create(
      b, loc, i32, b.getI32IntegerAttr(int32_t(programs.size())));
  Value rc = LLVM::CallOp::create(
                 b, loc, trainMain,
                 ValueRange{entry->getArgument(0), entry->getArgument(1),
                            LLVM::AddressOfOp::create(b, loc, table), count})
                 .getResult();
  LLVM::ReturnOp::create(b, loc, rc);
  into.getBody()->clear();
  for (NamedAttribute a : into->getDiscardableAttrs())
    into->removeDiscardableAttr(a.getName());
  into.getBody()->getOperations().splice(into.getBody()->end(),
                                         out->getBody()->getOperations());
  return success();
}

bool emitObjectFile(ModuleOp module, StringRef path, int optLevel,
                    std::string &error) {
  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  DialectRegistry registry;
  registerBuiltinDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
  module.getContext()->appendDialectRegistry(registry);

  llvm::LLVMContext llvmContext;
  std::unique_ptr<llvm::Module> llvmModule =
      translateModuleToLLVMIR(module, llvmContext, "actplace_step");
  if (!llvmModule) {
    error = "the LLVM-dialect step did not translate to LLVM IR";
    return false;
  }
  llvm::Triple triple(llvm::sys::getDefaultTargetTriple());
  std::string lookupError;
  const llvm::Target *target =
      llvm::TargetRegistry::lookupTarget(triple, lookupError);
  if (!target) {
    error = "no LLVM target for " + triple.str() + ": " + lookupError;
    return false;
  }
  llvm::TargetOptions options;
  llvm::CodeGenOptLevel level = optLevel <= 0   ? llvm::CodeGenOptLevel::None
                                : optLevel == 1 ? llvm::CodeGenOptLevel::Less
                                : optLevel == 2
                                    ? llvm::CodeGenOptLevel::Default
                                    : llvm::CodeGenOptLevel::Aggressive;
  std::unique_ptr<llvm::TargetMachine> machine(target->createTargetMachine(
      triple, "generic", "", options, llvm::Reloc::PIC_, std::nullopt, level));
  if (!machine) {
    error = "cannot create an LLVM target machine for " + triple.str();
    return false;
  }
  llvmModule->setTargetTriple(triple);
  llvmModule->setDataLayout(machine->createDataLayout());
  std::string verifyErrors;
  llvm::raw_string_ostream verifyOs(verifyErrors);
  if (llvm::verifyModule(*llvmModule, &verifyOs)) {
    error = "the step's LLVM IR does not verify: " + verifyErrors;
    return false;
  }
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec, llvm::sys::fs::OF_None);
  if (ec) {
    error = "cannot write " + path.str() + ": " + ec.message();
    return false;
  }
  llvm::legacy::PassManager pm;
  if (machine->addPassesToEmitFile(pm, os, nullptr,
                                   llvm::CodeGenFileType::ObjectFile)) {
    error = "the LLVM target machine cannot emit an object file";
    return false;
  }
  pm.run(*llvmModule);
  os.flush();
  if (os.has_error()) {
    error = "error writing " + path.str();
    return false;
  }
  return true;
}

/// The LLVM-dialect step of `module` as LLVM IR text.
LogicalResult printLLVMIR(ModuleOp module, llvm::raw_ostream &os) {
  if (failed(lowerStepToLLVM(module)))
    return failure();
  DialectRegistry registry;
  registerBuiltinDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
  module.getContext()->appendDialectRegistry(registry);
  llvm::LLVMContext llvmContext;
  std::unique_ptr<llvm::Module> llvmModule =
      translateModuleToLLVMIR(module, llvmContext, "actplace_step");
  if (!llvmModule)
    return module.emitError("convert-exec-to-llvm: the LLVM-dialect step did "
                            "not translate to LLVM IR");
  llvmModule->print(os, nullptr);
  return success();
}

void registerEmitLLVM() {
  TranslateFromMLIRRegistration irReg(
      "emit-llvm-ir", "exec.step -> the LLVM IR of the training step",
      [](Operation *op, llvm::raw_ostream &os) -> LogicalResult {
        auto m = dyn_cast<ModuleOp>(op);
        if (!m)
          return op->emitError("convert-exec-to-llvm: expected a "
                               "builtin.module");
        return printLLVMIR(m, os);
      },
      [](DialectRegistry &registry) {
        registry.insert<exec::ExecDialect, train::TrainDialect,
                        func::FuncDialect, arith::ArithDialect, scf::SCFDialect,
                        tensor::TensorDialect, LLVM::LLVMDialect>();
      });
  TranslateFromMLIRRegistration reg(
      "emit-llvm-step",
      "exec.step -> LLVM-dialect training step (runtime C ABI calls)",
      [](Operation *op, llvm::raw_ostream &os) -> LogicalResult {
        auto m = dyn_cast<ModuleOp>(op);
        if (!m)
          return op->emitError("convert-exec-to-llvm: expected a "
                               "builtin.module");
        if (failed(lowerStepToLLVM(m)))
          return failure();
        m.print(os);
        return success();
      },
      [](DialectRegistry &registry) {
        registry.insert<exec::ExecDialect, train::TrainDialect,
                        func::FuncDialect, arith::ArithDialect, scf::SCFDialect,
                        tensor::TensorDialect, LLVM::LLVMDialect>();
      });
}

} // namespace ap::codegen
