//===- StepSink.h - The training step as runtime calls ----------*- C++ -*-===//
//
// Code generation is one walk over the planned and scheduled exec.step
// (StepWalk.cpp) that decides every runtime call of the step and every
// constant of the program description, and one sink per output form that
// writes them down: C++ source (EmitCpp.cpp, a readable form for people
// debugging a placement) and the LLVM dialect (EmitLLVM.cpp, the path that
// builds binaries). The sinks translate only: what to call, with which
// values, in which order, is decided once, here, so both forms run the same
// step.
//
// Kernel arguments are real kernels/kernels.h structs filled in the compiler
// (KernelArgs): scalar fields hold their final values, and each pointer field
// names the arena or scratch offset it points to, resolved at run time
// (ap_at / ap_scratch). The C++ sink prints the assignments by field name;
// the LLVM sink copies the struct's bytes from a constant and stores the
// pointers, so both hand the kernel the same bytes.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_CODEGEN_STEPSINK_H
#define ACTPLACE_CODEGEN_STEPSINK_H

#include "codegen/TritonKernel.h"
#include "kernelgen/KernelGen.h"
#include "kernels/kernels.h"
#include "runtime/abi.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LogicalResult.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace ap::codegen {

/// A run-time address: an offset into the arena (ap_at) or into the driver
/// scratch (ap_scratch).
struct Addr {
  enum Kind : uint8_t { Arena, Scratch } kind = Arena;
  uint64_t offset = 0;
};

/// One argument of a runtime call (after the leading `ap_step *`).
struct CallArg {
  enum Kind : uint8_t {
    U32,
    I32,
    I64,
    U64,
    F64,
    Str,       ///< a string constant (labels, input names)
    Ptr,       ///< an Addr, passed as a pointer
    U64Array,  ///< a constant array, passed as `const uint64_t *`
    I64Array,  ///< a constant array, passed as `const int64_t *`
    LoopIndex, ///< the enclosing microbatch loop's index (int64_t)
  } kind = I64;
  int64_t i = 0; ///< U32 / I32 / I64 / U64 (bits)
  double f = 0;
  std::string s;            ///< Str
  Addr addr;                ///< Ptr
  std::vector<int64_t> arr; ///< U64Array / I64Array (bits)
  /// The C++ spelling of an integer when it has a name (AP_STREAM_D2H,
  /// AP_DTYPE_BF16); empty: the number.
  std::string name;

  static CallArg u32(uint64_t v) { return {U32, int64_t(v)}; }
  static CallArg i32(int64_t v, std::string name = {}) {
    CallArg a{I32, v};
    a.name = std::move(name);
    return a;
  }
  static CallArg i64(int64_t v) { return {I64, v}; }
  static CallArg u64(uint64_t v) { return {U64, int64_t(v)}; }
  static CallArg f64(double v) {
    CallArg a{F64};
    a.f = v;
    return a;
  }
  static CallArg str(std::string v) {
    CallArg a{Str};
    a.s = std::move(v);
    return a;
  }
  static CallArg ptr(Addr v) {
    CallArg a{Ptr};
    a.addr = v;
    return a;
  }
  static CallArg array(Kind k, std::vector<int64_t> v) {
    CallArg a{k};
    a.arr = std::move(v);
    return a;
  }
  static CallArg loopIndex() { return {LoopIndex}; }
};

/// A kernels/kernels.h args struct being filled, with what each field was
/// set to (in order) for the sinks.
struct KernelArgs {
  struct Field {
    std::string name;   ///< C++ member designator ("shape.batch", "ys[1]")
    std::string text;   ///< the value as a C++ expression (scalars)
    uint64_t offset;    ///< byte offset in the struct
    bool isPtr = false; ///< a pointer field: `addr`, resolved at run time
    Addr addr;
    std::string ptrCast; ///< C++ cast for a typed pointer field
  };
  std::string type;           ///< struct name ("LinearForwardArgs")
  std::vector<uint8_t> bytes; ///< the struct, scalar fields set
  std::vector<Field> fields;  ///< every set, in order
  uint64_t align = alignof(std::max_align_t);
};

/// The program description (runtime/abi.h ap_program and its tables) in
/// compiler types; the sinks write it as constants.
struct ProgramDesc {
  struct Param {
    std::string name;
    int32_t dtype = 0;
    std::string dtypeName; ///< AP_DTYPE_*
    int32_t rank = 0;
    std::array<int64_t, 4> shape{1, 1, 1, 1};
    int64_t numel = 0;
    int32_t init = 0;
    std::string initName; ///< AP_INIT_*
    bool frozen = false;
    double initA = 0, initB = 0;
    /// weight, master, main grad, Adam m, Adam v (nullopt: AP_NO_OFFSET)
    std::array<std::optional<uint64_t>, 5> offsets;
    /// ap_param.shard_numel: 0, or the elements of each ZeRO-3 shard.
    int64_t shardNumel = 0;
    /// ap_param.main_grad_bf16: the ZeRO-3 main-grad shard is bf16.
    bool mainGradBf16 = false;
    /// ap_param.pipeline_tied: another pipeline stage holds it too.
    bool pipelineTied = false;
    /// ap_param.tied_grad_offset (nullopt: AP_NO_OFFSET).
    std::optional<uint64_t> tiedGradOffset;
    /// ap_param.tp_dim / tp_segments (whole extents) / tp_grad_sum.
    int32_t tpDim = -1;
    std::vector<int64_t> tpSegments;
    bool tpGradSum = false;
  };
  struct AdamW {
    int64_t param = 0;
    double beta1 = 0, beta2 = 0, eps = 0, weightDecay = 0;
  };
  std::string model;
  std::vector<std::pair<std::string, std::string>> modelConfig;
  int64_t microBatches = 0, batch = 0, seq = 0, vocab = 0;
  uint64_t persistentBytes = 0, activationBytes = 0, workspaceBytes = 0,
           sideWorkspaceBytes = 0, arenaBytes = 0, pinnedBytes = 0,
           scratchBytes = 0, scratchOffset = 0;
  /// Whether the plan has a side workspace to describe (printing only).
  bool describeSide = false;
  bool sideKernels = false, sideAfterHostStart = false;
  int32_t sideSmPercent = 0;
  /// Data parallelism as compiled (ranks; AP_DP_*).
  int32_t dataParallelSize = 1, dataParallelMode = 0;
  /// Pipeline parallelism as compiled: stages and this program's stage.
  int32_t pipelineSize = 1, pipelineStage = 0;
  /// Tensor-parallel ranks as compiled.
  int32_t tensorParallelSize = 1;
  /// Packed sequences: train.doc_starts' separator (-1: none) and the LM
  /// head's ignore_index.
  int64_t documentSeparator = -1;
  int64_t ignoreIndex = -100;
  std::vector<std::pair<uint64_t, uint64_t>> slots; ///< offset, bytes
  std::vector<std::string> scopes;
  std::vector<Param> params;
  /// loss_sum, token_count, grad_norm, lr, loss (nullopt: AP_NO_OFFSET)
  std::array<std::optional<uint64_t>, 5> stateOffsets;
  double maxLr = 0;
  /// lr schedule and clipping as compiled (present when the step has them)
  std::optional<double> minLr;
  std::optional<int64_t> warmupSteps, totalSteps;
  std::optional<double> maxGradNorm;
  std::vector<AdamW> adamw;
  uint32_t numEvents = 0;
  /// A kernel ap_launch_generated launches: kernelgen's (`spec`) or one
  /// Triton compiled (`triton`).
  struct Generated {
    std::optional<kernelgen::GroupSpec> spec;
    std::optional<TritonKernel> triton;
  };
  /// The generated kernels the step launches (ap_launch_generated's index),
  /// each once.
  std::vector<Generated> generated;
};

/// What the walk produces, in program order.
class StepSink {
public:
  virtual ~StepSink() = default;
  /// A runtime call `fn(step, args...)`; `comment` annotates it (C++).
  virtual void call(llvm::StringRef fn, llvm::ArrayRef<CallArg> args,
                    llvm::StringRef comment = {}) = 0;
  /// A kernel launch: ap_launch(step, stream, label, kernel, &args,
  /// sizeof args).
  virtual void launch(int32_t stream, llvm::StringRef streamName,
                      llvm::StringRef label, int32_t kernel,
                      llvm::StringRef kernelName, const KernelArgs &args) = 0;
  /// A generated kernel launch: ap_launch_generated(step, stream, label,
  /// kernel, &args, sizeof args), `args` one 8-byte slot per parameter.
  virtual void launchGenerated(int32_t stream, llvm::StringRef streamName,
                               llvm::StringRef label, uint32_t kernel,
                               llvm::StringRef kernelName,
                               const KernelArgs &args) = 0;
  /// Whether this form can hold generated kernels (their host code and PTX).
  virtual bool holdsGeneratedKernels() const { return false; }
  /// `for (mb = 0; mb < count; ++mb) {` ... `}` around the calls between.
  virtual void beginLoop(int64_t count) = 0;
  virtual void endLoop() = 0;
  /// A note in the readable output (nothing at run time).
  virtual void note(llvm::StringRef text) {}
  /// The program description, after the step's calls.
  virtual mlir::LogicalResult program(const ProgramDesc &desc) = 0;
};

/// Planned sizes of the emitted step, for tools that report them.
struct EmittedPlan {
  uint64_t arenaBytes = 0, persistentBytes = 0, activationBytes = 0,
           workspaceBytes = 0, sideWorkspaceBytes = 0, pinnedBytes = 0,
           scratchBytes = 0;
  size_t numParams = 0, numSlots = 0, numScopes = 0;
  /// Generated kernels (kernels = "generated"): distinct kernels, and
  /// launches in the step (a launch inside the microbatch loop counts once).
  size_t numGenerated = 0, generatedLaunches = 0;
};

/// Walks `module` (the train.param table and one planned, scheduled
/// exec.step) into `sink`. `tool` prefixes diagnostics ("emit-cpp",
/// "convert-exec-to-llvm"). Fails with a diagnostic naming the op for
/// anything it cannot translate (an op without a mapping, a buffer without a
/// planned offset, a copy whose scope cannot be found, a number the kernel
/// argument cannot hold).
mlir::LogicalResult walkStep(mlir::ModuleOp module, StepSink &sink,
                             llvm::StringRef tool, EmittedPlan *plan = nullptr);

/// `s` as a C++ narrow string literal, quotes included, holding the same
/// bytes (EmitCpp.cpp says how it stays data).
std::string cppString(llvm::StringRef s);

} // namespace ap::codegen

#endif // ACTPLACE_CODEGEN_STEPSINK_H
