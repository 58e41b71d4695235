//===- EmitCpp.cpp - The training step as readable C++ ----------*- C++ -*-===//
//
// The C++ form of the step (StepSink.h): what `actplace-compile --emit=cpp`
// and `actplace-translate --emit-cpp` print for people reading a placement.
// Binaries are built through the LLVM dialect (EmitLLVM.cpp); this file
// prints the same calls and constants as source that includes only
// kernels/kernels.h (the args structs) and runtime/abi.h, and compiles to
// the same program.
//
//===----------------------------------------------------------------------===//
#include "codegen/EmitCpp.h"
#include "codegen/StepSink.h"

#include "dialect/exec/ExecDialect.h"
#include "dialect/train/TrainDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "llvm/Support/Format.h"

#include <string>

using namespace mlir;

namespace ap::codegen {
namespace {

std::string fmtDouble(double v) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format("%.17g", v);
  return s;
}

std::string u64(uint64_t v) { return std::to_string(v) + "ull"; }

std::string addrText(Addr a) {
  if (a.kind == Addr::Scratch)
    return "ap_scratch(r, " + std::to_string(a.offset) + ")";
  return "ap_at(r, " + u64(a.offset) + ")";
}

class CppSink : public StepSink {
public:
  /// `stage` >= 0: one stage of a pipelined binary, written in namespace
  /// stage<k> without main (emitCppStages adds one for all stages).
  explicit CppSink(llvm::raw_ostream &os, int stage = -1)
      : os_(os), stage_(stage) {}

  void call(StringRef fn, ArrayRef<CallArg> args, StringRef comment) override {
    // Array arguments become constant locals of a block around the call
    // (ap_concat's input offsets `xs` and sizes `dims`).
    bool block = llvm::any_of(args, [](const CallArg &a) {
      return a.kind == CallArg::U64Array || a.kind == CallArg::I64Array;
    });
    int in = indent_;
    if (block) {
      line(in) << "{\n";
      in += 2;
      for (const CallArg &a : args) {
        if (a.kind != CallArg::U64Array && a.kind != CallArg::I64Array)
          continue;
        bool u = a.kind == CallArg::U64Array;
        line(in) << (u ? "const uint64_t xs[] = {"
                       : "const int64_t dims[] = {");
        for (size_t i = 0; i < a.arr.size(); ++i)
          body_ << (i ? ", " : "")
                << (u ? u64(uint64_t(a.arr[i])) : std::to_string(a.arr[i]));
        body_ << "};\n";
      }
    }
    line(in) << fn << "(r";
    for (const CallArg &a : args)
      body_ << ", " << text(a);
    body_ << ");";
    if (!comment.empty())
      body_ << " // " << cppString(comment);
    body_ << "\n";
    if (block)
      line(indent_) << "}\n";
  }

  void launch(int32_t, StringRef streamName, StringRef label, int32_t,
              StringRef kernelName, const KernelArgs &args) override {
    line(indent_) << "{\n";
    line(indent_ + 2) << args.type << " a;\n";
    for (const KernelArgs::Field &f : args.fields) {
      line(indent_ + 2) << "a." << f.name << " = ";
      if (!f.isPtr)
        body_ << f.text;
      else if (f.ptrCast.empty())
        body_ << addrText(f.addr);
      else
        body_ << "static_cast<" << f.ptrCast << ">(" << addrText(f.addr) << ")";
      body_ << ";\n";
    }
    line(indent_ + 2) << "ap_launch(r, " << streamName << ", "
                      << cppString(label) << ", " << kernelName
                      << ", &a, sizeof a);\n";
    line(indent_) << "}\n";
  }

  // Never reached: the walk refuses kernels = "generated" for this form
  // (holdsGeneratedKernels is false).
  void launchGenerated(int32_t, StringRef, StringRef label, uint32_t,
                       StringRef kernelName, const KernelArgs &) override {
    line(indent_) << "// generated kernel " << kernelName << " (" << label
                  << ") has no C++ form\n";
  }

  void beginLoop(int64_t count) override {
    line(indent_) << "for (int64_t mb = 0; mb < " << count << "; ++mb) {\n";
    indent_ += 2;
  }
  void endLoop() override {
    indent_ -= 2;
    line(indent_) << "}\n";
  }
  void note(StringRef text) override { line(indent_) << "// " << text << "\n"; }

  LogicalResult program(const ProgramDesc &d) override;

private:
  llvm::raw_ostream &line(int indent) { return body_.indent(indent); }
  static std::string text(const CallArg &a) {
    switch (a.kind) {
    case CallArg::U32:
    case CallArg::I64:
      return std::to_string(a.i);
    case CallArg::I32:
      return a.name.empty() ? std::to_string(a.i) : a.name;
    case CallArg::U64:
      return u64(uint64_t(a.i));
    case CallArg::F64:
      return fmtDouble(a.f);
    case CallArg::Str:
      return cppString(a.s);
    case CallArg::Ptr:
      return addrText(a.addr);
    case CallArg::U64Array:
      return "xs";
    case CallArg::I64Array:
      return "dims";
    case CallArg::LoopIndex:
      return "mb";
    }
    return "";
  }

  llvm::raw_ostream &os_;
  int stage_ = -1;
  std::string bodyText_;
  llvm::raw_string_ostream body_{bodyText_};
  int indent_ = 2;
};

LogicalResult CppSink::program(const ProgramDesc &d) {
  os_ << "//===- generated by actplace (--emit=cpp): do not edit "
         "-------------===//\n"
      << "//\n// Training step of model " << cppString(d.model)
      << ": parameter table, buffer plan, pinned slots, offload scopes and\n"
      << "// the step function. Links with actplace_runtime and the kernels.\n"
      << "//\n//"
         "===------------------------------------------------------------===//"
         "\n"
      << "#include \"kernels/kernels.h\"\n#include \"runtime/abi.h\"\n\n"
      << "#include <cstdint>\n\n"
      << (stage_ < 0 ? std::string("namespace {\n")
                     : "namespace stage" + std::to_string(stage_) + " {\n")
      << "using namespace ap::kernels;\n\n";
  os_ << "// Buffer plan (exec-plan-memory): arena [persistent | activations | "
      << (d.describeSide ? "workspace | side workspace].\n" : "workspace].\n");
  os_ << "constexpr uint64_t kPersistentBytes = " << u64(d.persistentBytes)
      << ";\nconstexpr uint64_t kActivationBytes = " << u64(d.activationBytes)
      << ";\nconstexpr uint64_t kWorkspaceBytes = " << u64(d.workspaceBytes)
      << ";\n";
  if (d.describeSide)
    os_ << "constexpr uint64_t kSideWorkspaceBytes = "
        << u64(d.sideWorkspaceBytes) << ";\n";
  os_ << "constexpr uint64_t kArenaBytes = " << u64(d.arenaBytes)
      << ";\nconstexpr uint64_t kPinnedBytes = " << u64(d.pinnedBytes)
      << ";\nconstexpr uint64_t kScratchBytes = " << u64(d.scratchBytes)
      << ";\nconstexpr uint64_t kScratchOffset = " << u64(d.scratchOffset)
      << ";\n\n";
  os_ << "void trainStep(ap_step *r) {\n" << bodyText_ << "}\n\n";

  if (!d.slots.empty()) {
    os_ << "// Pinned slots: {offset, bytes}.\nconst ap_slot kSlots[] = {\n";
    for (auto [off, bytes] : d.slots)
      os_ << "    {" << u64(off) << ", " << u64(bytes) << "},\n";
    os_ << "};\n";
  }
  if (!d.scopes.empty()) {
    os_ << "// Offload scopes (the transfer counters of the metrics line).\n"
        << "const char *const kScopes[] = {\n";
    for (const std::string &s : d.scopes)
      os_ << "    " << cppString(s) << ",\n";
    os_ << "};\n";
  }
  if (!d.modelConfig.empty()) {
    os_ << "// Model settings (recorded in checkpoints).\n"
        << "const ap_config_entry kModelConfig[] = {\n";
    for (const auto &[key, value] : d.modelConfig)
      os_ << "    {" << cppString(key) << ", " << cppString(value) << "},\n";
    os_ << "};\n";
  }
  auto offText = [](const std::optional<uint64_t> &o) {
    return o ? u64(*o) : std::string("AP_NO_OFFSET");
  };
  if (!d.params.empty()) {
    os_ << "// Parameters: name, dtype, rank, shape, numel, init, frozen, "
           "init a, b,\n// offsets of weight, master, main grad, Adam m, "
           "Adam v,\n// shard elements (0: whole), bf16 main grad, tied across "
           "stages,\n"
           "// tied LM-head grad part, tensor-parallel split dim, segments "
           "and grad sum.\nconst "
           "ap_param kParams[] = {\n";
    for (const ProgramDesc::Param &p : d.params) {
      os_ << "    {" << cppString(p.name) << ", " << p.dtypeName << ", "
          << p.rank << ", {";
      for (int i = 0; i < 4; ++i)
        os_ << (i ? ", " : "") << p.shape[i];
      os_ << "}, " << p.numel << ", " << p.initName << ", "
          << (p.frozen ? 1 : 0) << ", " << fmtDouble(p.initA) << ", "
          << fmtDouble(p.initB);
      for (const auto &o : p.offsets)
        os_ << ", " << offText(o);
      os_ << ", " << p.shardNumel << ", " << (p.mainGradBf16 ? 1 : 0) << ", "
          << (p.pipelineTied ? 1 : 0) << ", " << offText(p.tiedGradOffset)
          << ", " << p.tpDim << ", " << p.tpSegments.size() << ", {";
      for (size_t i = 0; i < 4; ++i)
        os_ << (i ? ", " : "")
            << (i < p.tpSegments.size() ? p.tpSegments[i] : 0);
      os_ << "}, " << (p.tpGradSum ? 1 : 0) << "},\n";
    }
    os_ << "};\n";
  }
  if (!d.adamw.empty()) {
    os_ << "// AdamW: parameter index, beta1, beta2, eps, weight decay.\n"
        << "const ap_adamw kAdamW[] = {\n";
    for (const ProgramDesc::AdamW &a : d.adamw)
      os_ << "    {" << a.param << ", " << fmtDouble(a.beta1) << ", "
          << fmtDouble(a.beta2) << ", " << fmtDouble(a.eps) << ", "
          << fmtDouble(a.weightDecay) << "},\n";
    os_ << "};\n";
  }
  os_ << "\nap_program makeProgram() {\n  ap_program p = {};\n"
      << "  p.abi_version = AP_ABI_VERSION;\n"
      << "  p.struct_size = sizeof(ap_program);\n";
  os_ << "  p.model = " << cppString(d.model)
      << ";\n  p.micro_batches = " << d.microBatches
      << ";\n  p.batch = " << d.batch << ";\n  p.seq = " << d.seq
      << ";\n  p.vocab = " << d.vocab << ";\n";
  if (!d.modelConfig.empty())
    os_ << "  p.model_config = kModelConfig;\n  p.num_model_config = "
        << d.modelConfig.size() << ";\n";
  os_ << "  p.persistent_bytes = kPersistentBytes;\n"
      << "  p.activation_bytes = kActivationBytes;\n"
      << "  p.workspace_bytes = kWorkspaceBytes;\n";
  if (d.describeSide)
    os_ << "  p.side_workspace_bytes = kSideWorkspaceBytes;\n";
  if (d.sideKernels)
    os_ << "  p.side_kernels = 1;\n";
  if (d.sideAfterHostStart)
    os_ << "  p.side_after_host_start = 1;\n";
  if (d.sideKernels)
    os_ << "  p.side_sm_percent = " << d.sideSmPercent << ";\n";
  os_ << "  p.arena_bytes = kArenaBytes;\n"
      << "  p.pinned_bytes = kPinnedBytes;\n"
      << "  p.scratch_bytes = kScratchBytes;\n"
      << "  p.scratch_offset = kScratchOffset;\n";
  if (!d.slots.empty())
    os_ << "  p.slots = kSlots;\n  p.num_slots = " << d.slots.size() << ";\n";
  if (!d.scopes.empty())
    os_ << "  p.scopes = kScopes;\n  p.num_scopes = " << d.scopes.size()
        << ";\n";
  if (!d.params.empty())
    os_ << "  p.params = kParams;\n  p.num_params = " << d.params.size()
        << ";\n";
  const char *stateNames[] = {"loss_sum", "token_count", "grad_norm", "lr",
                              "loss"};
  for (int i = 0; i < 5; ++i)
    os_ << "  p.state_" << stateNames[i] << " = " << offText(d.stateOffsets[i])
        << ";\n";
  os_ << "  p.optimizer_known = 1;\n";
  if (d.minLr)
    os_ << "  p.min_lr = " << fmtDouble(*d.minLr) << ";\n";
  if (d.warmupSteps)
    os_ << "  p.warmup_steps = " << *d.warmupSteps << ";\n";
  if (d.totalSteps)
    os_ << "  p.total_steps = " << *d.totalSteps << ";\n";
  if (d.maxGradNorm)
    os_ << "  p.max_grad_norm = " << fmtDouble(*d.maxGradNorm) << ";\n";
  if (!d.adamw.empty())
    os_ << "  p.adamw = kAdamW;\n  p.num_adamw = " << d.adamw.size() << ";\n";
  os_ << "  p.max_lr = " << fmtDouble(d.maxLr) << ";\n";
  os_ << "  p.data_parallel_size = " << d.dataParallelSize << ";\n"
      << "  p.data_parallel_mode = "
      << (d.dataParallelMode == AP_DP_ZERO3 ? "AP_DP_ZERO3" : "AP_DP_REPLICATE")
      << ";\n";
  os_ << "  p.pipeline_size = " << d.pipelineSize << ";\n"
      << "  p.pipeline_stage = " << d.pipelineStage << ";\n"
      << "  p.tensor_parallel_size = " << d.tensorParallelSize << ";\n"
      << "  p.document_separator = " << d.documentSeparator << ";\n"
      << "  p.ignore_index = " << d.ignoreIndex << ";\n";
  os_ << "  p.num_events = " << d.numEvents << ";\n  p.step = trainStep;\n"
      << "  return p;\n}\n\nconst ap_program kProgram = makeProgram();\n";
  if (stage_ >= 0) {
    os_ << "} // namespace stage" << stage_ << "\n\n";
    return success();
  }
  os_ << "} // namespace\n\nint main(int argc, char **argv) {\n"
      << "  return ap_train_main(argc, argv, &kProgram);\n}\n";
  return success();
}

} // namespace

LogicalResult emitCppStages(ArrayRef<ModuleOp> stages, llvm::raw_ostream &os,
                            EmittedPlan *plans) {
  std::string text;
  llvm::raw_string_ostream buffer(text);
  for (auto [k, stage] : llvm::enumerate(stages)) {
    CppSink sink(buffer, int(k));
    if (failed(walkStep(stage, sink, "emit-cpp", plans ? &plans[k] : nullptr)))
      return failure();
  }
  buffer << "int main(int argc, char **argv) {\n"
         << "  static const ap_program *const kStages[] = {";
  for (size_t k = 0; k < stages.size(); ++k)
    buffer << (k ? ", " : "") << "&stage" << k << "::kProgram";
  buffer << "};\n  return ap_train_main_stages(argc, argv, kStages, "
         << stages.size() << ");\n}\n";
  os << text;
  return success();
}

LogicalResult emitCpp(ModuleOp module, llvm::raw_ostream &os,
                      EmittedPlan *plan) {
  // Written to a buffer first, so that a failure leaves `os` untouched.
  std::string text;
  llvm::raw_string_ostream buffer(text);
  CppSink sink(buffer);
  if (failed(walkStep(module, sink, "emit-cpp", plan)))
    return failure();
  os << text;
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
