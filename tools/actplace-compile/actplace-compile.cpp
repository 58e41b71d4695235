//===- actplace-compile.cpp - Model config -> training binary -------------===//
//
//   actplace-compile CONFIG.json|GRAPH.mlir -o BINARY [placement flags]
//
// Runs the whole chain in one process: import (for a JSON config),
// train-autodiff, train-placement-pipeline (with the report), the lowering
// to exec, exec-plan-memory, exec-schedule-streams and the lowering of the
// step to the LLVM dialect (codegen/EmitLLVM.h); LLVM's target machine
// compiles that to an object in process, and the host compiler driver links
// it with the prebuilt runtime and kernel archives (found as
// StepToolchain.h says): no C++ is compiled. Prints the placement report's
// totals and the planned peak. A link error is a bug: the command and its
// output are shown and the object is kept. --emit=cpp|mlir|object writes
// the readable C++, the LLVM-dialect module or the object instead.
//
// --activation-cut F, --memory-budget B or --step-budget F replaces the
// module lists: the placement search (PlacementSearch.h, the same as the
// train-plan-budget pass) picks them under --profile and prints its moves;
// the rest of the chain then runs as if the chosen lists had been given.
// --global-batch-tokens N with --memory-budget also chooses the micro-batch
// size and count: one import, autodiff and screening search per size (1,
// 2, 4, 8), a full search for the contenders; the most predicted tokens/s
// whose planned arena fits wins.
//
// --memory-timeline FILE.svg draws the placed step's predicted memory
// (MemoryTimelineSvg) with the peak of the same step before placement and
// the planned arena as reference lines; --report-json FILE writes the
// placement report as JSON too (bench/ reads it).
//
//===----------------------------------------------------------------------===//
#include "CompileConfig.inc"
#include "StepToolchain.h"

#include "codegen/EmitCpp.h"
#include "codegen/EmitLLVM.h"
#include "codegen/TritonKernel.h"
#include "dialect/exec/ExecDialect.h"
#include "dialect/exec/ExecOps.h"
#include "dialect/train/TrainDialect.h"
#include "import/GraphBuilder.h"
#include "import/ModelConfig.h"
#include "passes/Passes.h"
#include "passes/Pipeline.h"
#include "passes/analysis/CostModel.h"
#include "passes/analysis/MemoryTimeline.h"
#include "passes/analysis/PipelineStages.h"
#include "passes/analysis/PlacementSearch.h"
#include "passes/render/MemoryTimelineSvg.h"
#include "support/DeviceReserve.h"
#include "support/ToolVersion.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Support/Timing.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdlib>
#include <fstream>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <sstream>
#include <thread>

namespace cl = llvm::cl;

static cl::OptionCategory category("actplace-compile options");
static cl::opt<std::string> input(cl::Positional, cl::Required,
                                  cl::desc("<CONFIG.json|GRAPH.mlir>"),
                                  cl::cat(category));
static cl::opt<std::string> output("o", cl::Required,
                                   cl::desc("Output training binary"),
                                   cl::cat(category));
static cl::opt<std::string>
    offloadModules("offload-modules",
                   cl::desc("Leaf modules / aliases to offload"), cl::init(""),
                   cl::cat(category));
static cl::opt<std::string>
    recomputeModules("recompute-modules",
                     cl::desc("Leaf modules / aliases to recompute"),
                     cl::init(""), cl::cat(category));
static cl::opt<std::string> fraction("fraction",
                                     cl::desc("Fraction of eligible scopes"),
                                     cl::init(""), cl::cat(category));
static cl::opt<std::string>
    minOffloadBytes("min-offload-bytes",
                    cl::desc("Smallest scope worth offloading"), cl::init(""),
                    cl::cat(category));
static cl::opt<std::string> maxInflight("max-inflight",
                                        cl::desc("Pending D2H copies allowed"),
                                        cl::init(""), cl::cat(category));
static cl::opt<std::string> prefetchDepth("prefetch-depth",
                                          cl::desc("Reload prefetch depth"),
                                          cl::init(""), cl::cat(category));
static cl::opt<ap::train::HideRule> hideRule(
    "hide-rule",
    cl::desc("Offload scopes whose reload cannot hide under backward compute"),
    cl::init(ap::train::HideRule::On),
    cl::values(clEnumValN(ap::train::HideRule::On, "on",
                          "keep them on the device (default)"),
               clEnumValN(ap::train::HideRule::Off, "off",
                          "offload them anyway")),
    cl::cat(category));
static cl::opt<double> activationCut(
    "activation-cut",
    cl::desc("Choose the placement: remove at least this share of the "
             "activation peak (0.6 = 60 %) at the least predicted step time "
             "(train-plan-budget; replaces --offload-modules and "
             "--recompute-modules)"),
    cl::init(0), cl::cat(category));
static cl::opt<std::string> memoryBudget(
    "memory-budget",
    cl::desc("Choose the placement: a predicted device peak of at most this "
             "(18GiB, 19.5GB, 512MiB, bytes; 'device': the profile's "
             "deviceMemoryBytes less what the driver and the CUDA context "
             "hold at start and the cuBLASLt and, on several ranks, NCCL "
             "reserve; 'process:SIZE': the process's device memory as the "
             "driver counts it, SIZE less the context and the same library "
             "reserves) at the least step time"),
    cl::init(""), cl::cat(category));
static cl::opt<double> stepBudget(
    "step-budget",
    cl::desc("Choose the placement: the most activation bytes removed with "
             "the predicted step at most this share longer (0.03 = 3 %)"),
    cl::init(-1), cl::cat(category));
static cl::opt<int64_t> globalBatchTokens(
    "global-batch-tokens",
    cl::desc("With --memory-budget and a JSON config: choose the micro-batch "
             "size B (1, 2, 4 or 8, dividing) and count M with B x M x seq x "
             "data-parallel-size = this, together with the placement, for "
             "the most predicted tokens/s within the budget (replaces "
             "--micro-batch-size and --micro-batches)"),
    cl::init(0), cl::cat(category));
static cl::opt<bool> searchScreen(
    "search-screen",
    cl::desc("Under --memory-budget, screen with the placement search's "
             "first two descents before the full search: to learn the "
             "planned arena's gap above the predicted peak, and to rank "
             "--global-batch-tokens' micro-batch sizes so that only the "
             "contenders get the full search (default true; false runs "
             "the full search for every size and attempt, slower)"),
    cl::init(true), cl::cat(category));
static cl::opt<bool> searchWorkspaceRegion(
    "search-workspace-region",
    cl::desc("Under --memory-budget, judge each placement by its peak with "
             "every kernel's workspace at the largest, the workspace region "
             "the planned arena holds, rather than the memory timeline's "
             "own peak (default true; false: the timeline's peak, the "
             "arena's gap left to the searches again)"),
    cl::init(true), cl::cat(category));
static cl::opt<int64_t> seqLen("seq", cl::desc("Tokens per sequence (JSON)"),
                               cl::init(4096), cl::cat(category));
static cl::opt<int64_t> microBatchSize("micro-batch-size",
                                       cl::desc("Sequences per microbatch"),
                                       cl::init(1), cl::cat(category));
static cl::opt<int64_t> microBatches("micro-batches",
                                     cl::desc("Microbatches per step"),
                                     cl::init(1), cl::cat(category));
using DataParallel = ap::train::DataParallelMode;
static cl::opt<DataParallel> dataParallel(
    "data-parallel", cl::init(DataParallel::Replicate),
    cl::desc("How data-parallel ranks hold parameters and optimizer state"),
    cl::values(AP_DATA_PARALLEL_VALUES), cl::cat(category));
static cl::opt<int64_t> dataParallelSize(
    "data-parallel-size",
    cl::desc("Data-parallel ranks (the plan is per rank; the binary refuses "
             "a launch of another world size). The global batch is "
             "micro-batches x micro-batch-size x this"),
    cl::init(1), cl::cat(category));
static cl::opt<int64_t> tensorParallel(
    "tensor-parallel",
    cl::desc("Tensor-parallel ranks (Megatron-style): attention and MLA "
             "heads, GDN key and value heads and the MLP width are split "
             "over this many ranks, column-parallel projections in, "
             "row-parallel out, one all-reduce after each block's output "
             "projection; the embedding, norms and LM head are replicated. "
             "The binary runs on tensor-parallel x data-parallel-size x "
             "pipeline-parallel ranks "
             "(default 1)"),
    cl::init(1), cl::cat(category));
static cl::opt<int64_t> documentSeparator(
    "document-separator",
    cl::desc("Packed sequences: the token id that ends each document in the "
             "data; the GDN state, short conv, RoPE positions and attention "
             "restart after it, and the separator's next-token label is not "
             "trained on (default -1: one sequence per row)"),
    cl::init(-1), cl::cat(category));
static cl::opt<int64_t> lossChunkTokens(
    "loss-chunk-tokens",
    cl::desc("Tokens per chunk of the LM head + cross-entropy, whose cuda "
             "scratch is chunk x vocabulary x 2 bytes (default 1024, as "
             "actplace-import)"),
    cl::init(1024), cl::cat(category));
static cl::opt<bool> sequenceParallel(
    "sequence-parallel",
    cl::desc("With --tensor-parallel: the residual stream, the norms "
             "between the tensor-parallel regions, the embedding and the "
             "loss run on each rank's 1/T of the tokens; each region's "
             "input is all-gathered and its output reduce-scattered (saved "
             "activations there are 1/T per rank)"),
    cl::init(false), cl::cat(category));
static cl::opt<int64_t> pipelineParallel(
    "pipeline-parallel",
    cl::desc("Pipeline stages: the decoder layers are split into this many "
             "stages (the embedding on the first, the final norm, LM head and "
             "loss on the last), each a program of its own run in a "
             "one-forward-one-backward order over the microbatches; the "
             "binary runs on data-parallel-size x this ranks (default 1)"),
    cl::init(1), cl::cat(category));
static cl::list<int64_t> pipelineStages(
    "pipeline-stages", cl::CommaSeparated,
    cl::desc("Decoder layers per stage, comma-separated, one count per stage "
             "of --pipeline-parallel (default: as even as possible, the "
             "earlier stages taking the remainder)"),
    cl::cat(category));
enum class PipelineBalance { Layers, Cost };
static cl::opt<PipelineBalance> pipelineBalance(
    "pipeline-balance",
    cl::desc("How --pipeline-parallel splits the layers when "
             "--pipeline-stages does not say"),
    cl::values(clEnumValN(PipelineBalance::Layers, "layers",
                          "as even a layer count as possible (default)"),
               clEnumValN(PipelineBalance::Cost, "cost",
                          "the split whose slowest stage (its layers' "
                          "forward and backward under the cost model, the "
                          "embedding on the first, the LM head and loss on "
                          "the last) is fastest; printed with each stage's "
                          "predicted time")),
    cl::init(PipelineBalance::Layers), cl::cat(category));
static cl::opt<bool> tiedGradParts(
    "tied-grad-parts",
    cl::desc("Sum a tied embedding / LM-head weight's gradient as a pipeline "
             "does: the LM head's part in a buffer of its own (one more f32 "
             "copy of the weight), added to the embedding's part once per "
             "step, so that a one-stage binary and a --pipeline-parallel one "
             "give the same bits (default off: the parts accumulate "
             "microbatch by microbatch into one buffer)"),
    cl::init(false), cl::cat(category));
static cl::opt<int64_t> gradBucketBytes(
    "grad-bucket-bytes",
    cl::desc("Smallest bucket of main grads summed in one go under "
             "--data-parallel=replicate (default 25 MiB; 0: one per grad)"),
    cl::init(26214400), cl::cat(category));
static cl::opt<int64_t> gatherMaxInflight(
    "gather-max-inflight",
    cl::desc("Under --data-parallel=zero3: layer-group windows whose "
             "parameters are gathered ahead of the one computing (default 1; "
             "0: each right before it). At most this + 1 windows' gathered "
             "parameters are in device memory at once"),
    cl::init(1), cl::cat(category));
static cl::opt<ap::train::MainGradDtype> mainGradDtype(
    "main-grad-dtype", cl::init(ap::train::MainGradDtype::F32),
    cl::desc("Element type of the main grads"),
    cl::values(clEnumValN(ap::train::MainGradDtype::F32, "fp32",
                          "FP32 main grads (default)"),
               clEnumValN(ap::train::MainGradDtype::BF16, "bf16",
                          "BF16 main-grad shards under --data-parallel=zero3 "
                          "(backward kernels still accumulate in FP32 per "
                          "layer; each reduce-scatter rounds its sum into "
                          "the shard once; FP32 masters either way)")),
    cl::cat(category));
enum class StorageDtype { BF16, F32 };
static cl::opt<StorageDtype>
    dtypeOpt("dtype",
             cl::desc("Storage type of activations and weights (JSON)"),
             cl::init(StorageDtype::BF16),
             cl::values(clEnumValN(StorageDtype::BF16, "bf16",
                                   "bfloat16, FP32 masters (default)"),
                        clEnumValN(StorageDtype::F32, "f32", "float32")),
             cl::cat(category));
/// The importer's spelling of --dtype.
static std::string dtypeName() {
  return dtypeOpt == StorageDtype::F32 ? "f32" : "bf16";
}
static cl::opt<int64_t> gemmWorkspace(
    "gemm-workspace-bytes",
    cl::desc("cuBLASLt workspace declared by GEMM kernels (default: 32 MiB "
             "in a CUDA build, 0 otherwise)"),
    cl::init(ACTPLACE_GEMM_WORKSPACE_BYTES), cl::cat(category));
static cl::opt<std::string>
    linkFlags("link-flags",
              cl::desc("Extra flags for linking the binary (e.g. -g, -L...)"),
              cl::init(""), cl::cat(category));
enum class Emit { Binary, Object, Mlir, Cpp };
static cl::opt<Emit> emit(
    "emit", cl::init(Emit::Binary),
    cl::desc("What -o receives (every form runs the same calls)"),
    cl::values(clEnumValN(Emit::Binary, "binary",
                          "the training binary: the step lowered to the LLVM "
                          "dialect, compiled in process to an object and "
                          "linked with the runtime (default)"),
               clEnumValN(Emit::Object, "object",
                          "the step's object file, not linked"),
               clEnumValN(Emit::Mlir, "mlir", "the final LLVM-dialect module"),
               clEnumValN(Emit::Cpp, "cpp",
                          "the step as readable C++ (for reading a "
                          "placement; prints how to build it)")),
    cl::cat(category));
enum class Kernels { Library, Generated, Auto };
static cl::opt<Kernels> kernelsOpt(
    "kernels", cl::init(Kernels::Library),
    cl::desc("Implementation of the element-wise and row-wise kernels "
             "(SwiGLU, residual add, RMSNorm, the sigmoid output gate and "
             "GDN's L2 norm, forward and backward)"),
    cl::values(clEnumValN(Kernels::Library, "library",
                          "the kernel library's hand-written kernels "
                          "(default)"),
               clEnumValN(Kernels::Generated, "generated",
                          "kernels generated by kernelgen: host code in the "
                          "binary and PTX for sm_90a, loaded with the CUDA "
                          "driver API (docs/kernelgen.md)"),
               clEnumValN(Kernels::Auto, "auto",
                          "per op, the faster of the two by the device "
                          "profile's generatedKernelRatio (--profile); "
                          "library where it has no measurement")),
    cl::cat(category));

enum class ShortConvKernels { Default, Staged, PerElement };
static cl::opt<ShortConvKernels> shortConvKernels(
    "short-conv-kernels", cl::init(ShortConvKernels::Default),
    cl::desc("CUDA kernels of GDN's short convolution, forward and backward "
             "(the same bits whichever runs; the host backend has one)"),
    cl::values(clEnumValN(ShortConvKernels::Default, "default",
                          "the kernel library's default (default)"),
               clEnumValN(ShortConvKernels::Staged, "staged",
                          "a block per 128 tokens x 64 channels, its rows "
                          "staged through shared memory with 16-byte "
                          "accesses (the windowed kernels where the layout "
                          "does not allow it)"),
               clEnumValN(ShortConvKernels::PerElement, "per-element",
                          "a thread per output element (the reference "
                          "layout, for comparisons)")),
    cl::cat(category));

static cl::list<std::string> tritonKernels(
    "triton-kernel",
    cl::desc("A manifest (JSON) registering a kernel Triton compiled (its PTX "
             "and metadata JSON) as the implementation of one train op: "
             "{\"op\", \"metadata\", \"ptx\", \"args\", \"grid\"} "
             "(docs/kernelgen.md); repeatable, one per op. The binary then "
             "needs the cuda backend"),
    cl::cat(category));
static cl::opt<bool> fuseKernels(
    "fuse-kernels", cl::init(true),
    cl::desc("With --kernels=generated, fuse back-to-back element-wise and "
             "row-wise kernels into one generated kernel: each residual add "
             "with the RMSNorm of its output, each RMSNorm backward with the "
             "residual add of its dx and with the chain of adds forming its "
             "dy (exec-generate-kernels; default true)"),
    cl::cat(category));
static cl::opt<int> codegenOpt(
    "codegen-opt", cl::init(0),
    cl::desc("LLVM code generation level of the step, 0-3 (the step is "
             "straight-line runtime calls: 0 builds fastest)"),
    cl::cat(category));
static cl::opt<std::string>
    profile("profile",
            cl::desc("JSON device profile for the cost model (placement, "
                     "report and memory timeline)"),
            cl::init(""), cl::cat(category));
enum class CopyHold { Placement, PeakRates };
static cl::opt<CopyHold> copyHold(
    "copy-hold",
    cl::desc("How long the arena keeps offloaded bytes: until the D2H is "
             "predicted done under --profile (placement, the default) or "
             "under the H200 peak-rate defaults (peak-rates). With a "
             "calibrated profile, whose compute is slower than peak, "
             "peak-rates holds longer: more memory, fewer stalls on late "
             "copies"),
    cl::init(CopyHold::Placement),
    cl::values(clEnumValN(CopyHold::Placement, "placement", "(default)"),
               clEnumValN(CopyHold::PeakRates, "peak-rates", "")),
    cl::cat(category));
static cl::opt<std::string>
    reportJson("report-json",
               cl::desc("Also write the placement report as JSON here"),
               cl::init(""), cl::cat(category));
static cl::opt<std::string> memoryTimeline(
    "memory-timeline",
    cl::desc("Write the predicted device-memory timeline as an SVG here"),
    cl::init(""), cl::cat(category));
static cl::opt<ap::train::MemoryChartStyle::Axis> memoryTimelineAxis(
    "memory-timeline-axis", cl::desc("x axis of the SVG"),
    cl::init(ap::train::MemoryChartStyle::Axis::Time),
    cl::values(clEnumValN(ap::train::MemoryChartStyle::Axis::Time, "time",
                          "predicted ms (default)"),
               clEnumValN(ap::train::MemoryChartStyle::Axis::OpIndex, "op",
                          "op index")),
    cl::cat(category));
static cl::opt<std::string>
    memoryTimelineTitle("memory-timeline-title",
                        cl::desc("Title of the SVG (default: the input and "
                                 "its shape)"),
                        cl::init(""), cl::cat(category));
static cl::opt<bool> fuseLossGrad(
    "fuse-loss-grad",
    cl::desc("Compute the loss and its gradient in one op, each chunk's "
             "logits once (train-autodiff fuse-loss-grad; default true; "
             "false gives the same bits with a second logits pass)"),
    cl::init(true), cl::cat(category));
static cl::opt<bool> fuseRecompute(
    "fuse-recompute", cl::init(true),
    cl::desc("Rebuild a recomputed SwiGLU or RMSNorm inside its backward "
             "kernel instead "
             "of by a separate kernel (train-fuse-recompute; default true; "
             "false gives the same bits)"),
    cl::cat(category));
static cl::opt<ap::train::RecomputeStream> recomputeStream(
    "recompute-stream", cl::init(ap::train::RecomputeStream::Compute),
    cl::desc("Where recompute runs (train-recompute-stream; same bits)"),
    cl::values(clEnumValN(ap::train::RecomputeStream::Compute, "compute",
                          "right before its use (default)"),
               clEnumValN(ap::train::RecomputeStream::Side, "side",
                          "issued ahead on a second stream, beside kernels "
                          "that leave SMs idle")),
    cl::cat(category));
static cl::opt<ap::SideIssue> sideIssue(
    "side-issue", cl::init(ap::SideIssue::AfterHost),
    cl::desc("When the host enqueues side-stream recompute (same events, "
             "same bits)"),
    cl::values(clEnumValN(ap::SideIssue::AfterHost, "after-host",
                          "right after the compute kernel it overlaps "
                          "(exec-defer-side-issue; the side stream then also "
                          "waits for that kernel's first launch; default)"),
               clEnumValN(ap::SideIssue::WithRun, "with-run",
                          "where its run sits, right before it")),
    cl::cat(category));
static cl::opt<bool>
    timing("timing",
           cl::desc("Print where the compile's time goes on stderr, in MLIR's "
                    "pass-timing style: import, each pass of each stage, the "
                    "placement search, lowering to the LLVM dialect, LLVM "
                    "code generation and the link"),
           cl::init(false), cl::cat(category));
static cl::opt<bool>
    keepSource("keep-source",
               cl::desc("Also write the step as readable C++ beside the "
                        "binary (BINARY.cpp); the binary is still built "
                        "through LLVM"),
               cl::init(false), cl::cat(category));

static int fail(const llvm::Twine &msg) {
  llvm::errs() << "actplace-compile: error: " << msg << "\n";
  return 1;
}

using ap::tools::shellQuote; // StepToolchain.h

/// The most bytes the binary's plan may ask for, arena or pinned host
/// memory (256 TiB): beyond any device or host, so a plan above it is
/// refused here rather than failing to allocate when the binary starts.
static constexpr int64_t kMaxPlanBytes = int64_t(1) << 48;

/// `v` as printf's %g: 0.001 stays 0.001 (formatv's default shows 0.00).
static std::string g(double v) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format("%g", v);
  return s;
}

/// The --triton-kernel manifests, loaded once (loadTritonKernels).
static std::vector<ap::codegen::TritonKernel> &loadedTritonKernels() {
  static std::vector<ap::codegen::TritonKernel> kernels;
  return kernels;
}

/// Reads every --triton-kernel manifest and its Triton files; an error
/// names the file and the field.
static llvm::Error loadTritonKernels() {
  std::map<std::string, std::string> byOp;
  for (const std::string &path : tritonKernels) {
    llvm::Expected<ap::codegen::TritonKernel> k =
        ap::codegen::loadTritonKernel(path);
    if (!k)
      return k.takeError();
    auto [it, fresh] = byOp.emplace(k->op, path);
    if (!fresh)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "--triton-kernel: " + path + " and " +
                                         it->second + " both implement '" +
                                         k->op + "' (one kernel per op)");
    loadedTritonKernels().push_back(std::move(*k));
  }
  return llvm::Error::success();
}

/// --short-conv-kernels on every exec.step of `module` (the emitter sets
/// the short convolutions' GdnConvArgs::kernels from it).
static void markShortConvKernels(mlir::ModuleOp module) {
  if (shortConvKernels == ShortConvKernels::Default)
    return;
  const char *mode =
      shortConvKernels == ShortConvKernels::Staged ? "staged" : "per-element";
  module.walk([&](ap::exec::StepOp step) {
    step->setAttr(ap::exec::kShortConvKernelsAttr,
                  mlir::StringAttr::get(step.getContext(), mode));
  });
}

/// The Triton kernels on every exec.step of `module` (the emitter launches
/// them for their ops); says which op no call of the step uses.
static void attachTritonKernels(mlir::ModuleOp module,
                                llvm::StringRef prefix = "") {
  if (loadedTritonKernels().empty())
    return;
  module.walk([&](ap::exec::StepOp step) {
    llvm::SmallVector<mlir::Attribute> entries;
    for (const ap::codegen::TritonKernel &k : loadedTritonKernels()) {
      entries.push_back(k.toAttr(step.getContext()));
      int64_t calls = 0;
      step->walk(
          [&](ap::exec::KernelOp call) { calls += call.getCallee() == k.op; });
      llvm::outs() << prefix << "Triton kernel " << k.name << " (" << k.manifest
                   << "): " << calls << " calls of " << k.op << "\n";
    }
    step->setAttr(ap::exec::kTritonKernelsAttr,
                  mlir::ArrayAttr::get(step.getContext(), entries));
  });
}

/// When a choice meets the budget by its predicted peak but its planned
/// arena is over, a search again for a lower peak is no faster than it; an
/// earlier choice within the budget whose predicted step is within this
/// share of it is kept instead: a search again could gain no more than a
/// full search has gained over its screen on the recorded cases (0.4 %).
constexpr double kRetryGain = 0.004;

/// "+0.017" / "-0.665": the percent by which step `a` exceeds step `b`.
static std::string stepChange(double a, double b) {
  double pct = 100.0 * (a / b - 1);
  return (pct >= 0 ? "+" : "") + llvm::formatv("{0:F3}", pct).str();
}

/// The fastest choice a compile's searches planned within the budget
/// (planned arena and predicted peak), with its arena and the search that
/// found it. A later search can end slower (its greedy, finding earlier
/// placements in the cache, may take other moves; a retry aims lower), so
/// the compile keeps this one where it is faster.
struct FastestWithinBudget {
  struct Entry {
    ap::train::PlacementChoice choice;
    int64_t arena = 0;
    ap::train::PlacementSearchResult searched;
  };
  std::optional<Entry> kept;

  void offer(const ap::train::PlacementChoice &choice, int64_t arena,
             const ap::train::PlacementSearchResult &searched) {
    if (!kept || choice.stepAfter < kept->choice.stepAfter - 1e-12)
      kept = Entry{choice, arena, searched};
  }
  /// Whether the kept choice predicts a faster step than `step`.
  bool fasterThan(double step) const {
    return kept && kept->choice.stepAfter < step - 1e-12;
  }
  /// Whether the kept choice is within kRetryGain of `step`: a search again
  /// for a lower peak (no faster than the choice that missed) is not worth
  /// its time.
  bool withinRetryGain(double step) const {
    return kept && kept->choice.stepAfter <= step * (1 + kRetryGain);
  }
};

/// What --global-batch-tokens chooses from, for one program and for
/// pipeline stages alike: the memory budget as a goal, the model config, and
/// the sequences each data-parallel rank trains per step.
struct BatchChoiceInputs {
  ap::train::PlacementGoal goal;
  ap::import::ModelConfig cfg;
  int64_t sequences = 0;
};
static llvm::Expected<BatchChoiceInputs> batchChoiceInputs() {
  auto goal = ap::train::PlacementGoal::fromOptions(0, memoryBudget, -1);
  if (!goal)
    return goal.takeError();
  // Each size's choice is lowered and its arena planned: judge placements
  // by the peak the arena cannot go below (PlacementGoal::workspaceRegion).
  goal->workspaceRegion = searchWorkspaceRegion;
  auto cfg = ap::import::loadModelConfig(input);
  if (!cfg)
    return cfg.takeError();
  return BatchChoiceInputs{*goal, std::move(*cfg),
                           globalBatchTokens / (seqLen * dataParallelSize)};
}

/// What --kernels decided: whether generated kernels run, and for which
/// train ops (empty: every op with a group), and whether add + RMSNorm
/// pairs fuse (chooseKernels).
static bool useGenerated = false;
static std::vector<std::string> generatedOps;
static bool fuseGenerated = false;
/// And RMSNorm backward + residual add pairs (train.rms_norm_grad_add).
static bool fuseGradAdd = false;
/// And the chains of adds forming an RMSNorm backward's dy
/// (train.rms_norm_grad_sum).
static bool fuseDySum = false;

/// The train ops kernelgen has groups for (the fused add + RMSNorm apart).
static const char *const kGeneratedOpNames[] = {"train.swiglu",
                                                "train.swiglu_grad",
                                                "train.add",
                                                "train.rms_norm",
                                                "train.rms_norm_grad",
                                                "train.output_gate",
                                                "train.output_gate_grad",
                                                "train.l2_norm",
                                                "train.l2_norm_grad",
                                                "train.gated_rms_norm",
                                                "train.gated_rms_norm_grad",
                                                "train.gdn_gates",
                                                "train.gdn_gates_grad",
                                                "train.rope",
                                                "train.rope_grad",
                                                "train.finalize_grads",
                                                "train.adamw"};

/// Records chooseKernels' decision on `module` for the cost model
/// (kModuleGeneratedOpsAttr): the train ops whose generated kernel the step
/// runs, so the placement search and the report predict their time with
/// the profile's generatedKernelRatio.
static void markGeneratedOps(mlir::ModuleOp module) {
  if (!useGenerated)
    return;
  mlir::Builder b(module.getContext());
  llvm::SmallVector<mlir::Attribute> names;
  if (generatedOps.empty()) { // --kernels=generated: every op with a group
    for (const char *op : kGeneratedOpNames)
      names.push_back(b.getStringAttr(op));
    if (fuseGenerated)
      names.push_back(b.getStringAttr("train.add_rms_norm"));
    if (fuseGradAdd)
      names.push_back(b.getStringAttr("train.rms_norm_grad_add"));
    if (fuseDySum)
      names.push_back(b.getStringAttr("train.rms_norm_grad_sum"));
  } else {
    for (const std::string &op : generatedOps)
      names.push_back(b.getStringAttr(op));
  }
  module->setAttr(ap::train::kModuleGeneratedOpsAttr, b.getArrayAttr(names));
}

/// Applies --kernels (and, for auto, the profile's measurements) to the
/// three settings above; prints auto's choice. Returns an error message,
/// empty on success.
static std::string chooseKernels() {
  useGenerated = kernelsOpt == Kernels::Generated;
  fuseGenerated = useGenerated && fuseKernels;
  fuseGradAdd = fuseGenerated;
  fuseDySum = fuseGenerated;
  generatedOps.clear();
  if (kernelsOpt != Kernels::Auto)
    return "";
  ap::train::DeviceProfile device;
  if (!profile.empty()) {
    auto loaded = ap::train::DeviceProfile::load(profile);
    if (!loaded)
      return llvm::toString(loaded.takeError());
    device = *loaded;
  }
  const auto &ratio = device.generatedKernelRatio;
  auto faster = [&](llvm::StringRef op) {
    auto it = ratio.find(op.str());
    return it != ratio.end() && it->second < 1.0;
  };
  std::string chosen, kept;
  for (const char *op : kGeneratedOpNames) {
    std::string &list = faster(op) ? chosen : kept;
    list += (list.empty() ? "" : ", ") + std::string(op);
    if (faster(op))
      generatedOps.push_back(op);
  }
  fuseGenerated = fuseKernels && faster("train.add_rms_norm");
  if (fuseGenerated) {
    generatedOps.push_back("train.add_rms_norm");
    chosen += (chosen.empty() ? "" : ", ") + std::string("train.add_rms_norm");
  }
  fuseGradAdd = fuseKernels && faster("train.rms_norm_grad_add");
  if (fuseGradAdd) {
    generatedOps.push_back("train.rms_norm_grad_add");
    chosen +=
        (chosen.empty() ? "" : ", ") + std::string("train.rms_norm_grad_add");
  }
  fuseDySum = fuseKernels && faster("train.rms_norm_grad_sum");
  if (fuseDySum) {
    generatedOps.push_back("train.rms_norm_grad_sum");
    chosen +=
        (chosen.empty() ? "" : ", ") + std::string("train.rms_norm_grad_sum");
  }
  useGenerated = !generatedOps.empty();
  if (!useGenerated)
    llvm::outs() << "kernels=auto: library kernels for every op (the "
                 << (profile.empty() ? std::string("default profile")
                                     : "profile " + profile)
                 << " measures no generated kernel faster: "
                    "generatedKernelRatio)\n";
  else
    llvm::outs() << "kernels=auto: generated for " << chosen << "; library for "
                 << (kept.empty() ? "none" : kept) << "\n";
  return "";
}

/// Adds one kernel fusion of a step to the JSON placement report at `path`
/// (written by the placement passes before the exec pipeline decides the
/// fusion), as `key`: {kind, pairs, `bytesField`, predicted_saving_us} per
/// microbatch. Returns an error message, empty on success.
static std::string addFusionToReport(llvm::StringRef path, llvm::StringRef key,
                                     llvm::StringRef kind,
                                     llvm::StringRef bytesField, int64_t pairs,
                                     int64_t bytes, double us) {
  auto buffer = llvm::MemoryBuffer::getFile(path);
  if (!buffer)
    return "cannot read the report " + path.str() + ": " +
           buffer.getError().message();
  llvm::Expected<llvm::json::Value> parsed =
      llvm::json::parse((*buffer)->getBuffer());
  if (!parsed)
    return "the report " + path.str() +
           " is not JSON: " + llvm::toString(parsed.takeError());
  llvm::json::Object *root = parsed->getAsObject();
  if (!root)
    return "the report " + path.str() + " is not a JSON object";
  (*root)[key] = llvm::json::Object{{"kind", kind},
                                    {"pairs", pairs},
                                    {bytesField, bytes},
                                    {"predicted_saving_us", us},
                                    {"per", "microbatch"}};
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec);
  if (ec)
    return "cannot write the report " + path.str() + ": " + ec.message();
  os << llvm::formatv("{0:2}", llvm::json::Value(std::move(*parsed))) << "\n";
  return "";
}

/// The fusion exec-generate-kernels did in `module`'s step, priced at the
/// profile's memory bandwidth and launch latency (docs/kernelgen.md); also
/// recorded in the JSON report `reportPath` when one is written.
static std::string printFusion(mlir::ModuleOp module,
                               llvm::StringRef reportPath,
                               llvm::StringRef prefix = "") {
  std::string error;
  if (!useGenerated || (!fuseGenerated && !fuseGradAdd && !fuseDySum))
    return error;
  ap::train::DeviceProfile device;
  if (!profile.empty())
    if (auto loaded = ap::train::DeviceProfile::load(profile))
      device = *loaded;
  module.walk([&](ap::exec::StepOp step) {
    // One fusion's line: its pairs (attribute `pairsAttr`) and the bytes
    // they save (`bytesAttr`), priced; returns the predicted microseconds,
    // or -1 when the step records none.
    auto report = [&](llvm::StringRef pairsAttr, llvm::StringRef bytesAttr,
                      llvm::StringRef what, llvm::StringRef bytesWhat,
                      int64_t &pairs, int64_t &bytes) {
      auto p = step->getAttrOfType<mlir::IntegerAttr>(pairsAttr);
      auto b = step->getAttrOfType<mlir::IntegerAttr>(bytesAttr);
      if (!p || !b)
        return -1.0;
      pairs = p.getInt();
      bytes = b.getInt();
      double us = (double(bytes) / device.memBandwidth +
                   double(pairs) * device.launchLatency) *
                  1e6;
      llvm::outs() << prefix << "kernel fusion: " << pairs << " " << what
                   << " pairs in one generated kernel each: " << pairs
                   << " launches and " << bytes << " bytes of " << bytesWhat
                   << " fewer per microbatch, predicted " << g(us)
                   << " us less\n";
      return us;
    };
    int64_t pairs = 0, bytes = 0, gradPairs = 0, gradBytes = 0;
    double us =
        report(ap::exec::kFusedAddNormAttr, ap::exec::kFusedSavedBytesAttr,
               "residual add + RMSNorm", "reads", pairs, bytes);
    double gradUs = report(ap::exec::kFusedNormGradAddAttr,
                           ap::exec::kFusedNormGradSavedBytesAttr,
                           "RMSNorm backward + residual add",
                           "writes and reads", gradPairs, gradBytes);
    // The add chains folded into a norm backward's dy: each add saves a
    // write and a read of its sum and a launch.
    int64_t sumChains = 0, sumAdds = 0, sumBytes = 0;
    double sumUs = -1;
    if (auto c =
            step->getAttrOfType<mlir::IntegerAttr>(ap::exec::kFusedDySumAttr)) {
      auto a =
          step->getAttrOfType<mlir::IntegerAttr>(ap::exec::kFusedDySumAddsAttr);
      auto by = step->getAttrOfType<mlir::IntegerAttr>(
          ap::exec::kFusedDySumSavedBytesAttr);
      sumChains = c.getInt();
      sumAdds = a ? a.getInt() : 0;
      sumBytes = by ? by.getInt() : 0;
      sumUs = (double(sumBytes) / device.memBandwidth +
               double(sumAdds) * device.launchLatency) *
              1e6;
      llvm::outs() << prefix << "kernel fusion: " << sumChains
                   << " chains of residual adds (" << sumAdds
                   << " adds) in the RMSNorm backward reading their sum: "
                   << sumAdds << " launches and " << sumBytes
                   << " bytes of writes and reads fewer per microbatch, "
                      "predicted "
                   << g(sumUs) << " us less\n";
    }
    if (sumUs >= 0 && !reportPath.empty() && error.empty())
      error = addFusionToReport(reportPath, "kernel_fusion_dy_sum",
                                "residual_add_chain+rms_norm_grad",
                                "saved_write_and_read_bytes", sumChains,
                                sumBytes, sumUs);
    if (us >= 0 && !reportPath.empty() && error.empty())
      error = addFusionToReport(reportPath, "kernel_fusion",
                                "residual_add+rms_norm", "saved_read_bytes",
                                pairs, bytes, us);
    if (gradUs >= 0 && !reportPath.empty() && error.empty())
      error = addFusionToReport(
          reportPath, "kernel_fusion_backward", "rms_norm_grad+residual_add",
          "saved_write_and_read_bytes", gradPairs, gradBytes, gradUs);
  });
  return error;
}

/// Prints what the generated kernels of `plan` are, when any.
static void printGenerated(const ap::codegen::EmittedPlan &plan,
                           llvm::StringRef prefix = "") {
  if (useGenerated)
    llvm::outs() << prefix << "generated kernels: " << plan.numGenerated << " ("
                 << plan.generatedLaunches << " launches in the step's code)\n";
}

/// The step's planned sizes (exec-plan-memory's attributes on exec.step),
/// -1 where absent.
static int64_t stepBytes(mlir::ModuleOp module, llvm::StringRef attr) {
  int64_t bytes = -1;
  module->walk([&](mlir::Operation *op) {
    if (auto a = op->getAttrOfType<mlir::IntegerAttr>(attr))
      bytes = a.getInt();
  });
  return bytes;
}

/// The options checked before anything runs: a size of zero divides by zero
/// in the cost model, one near 2^31 overflows later, and a goal outside its
/// range would otherwise be taken for "no goal" (the defaults 0 and -1 mean
/// not given) and silently ignored. Returns the message naming the option,
/// its value and the valid range; empty when all are good.
static std::string checkOptions() {
  ap::import::TrainShape shape;
  shape.seqLen = seqLen;
  shape.microBatchSize = microBatchSize;
  shape.microBatches = microBatches;
  shape.lossChunkTokens = lossChunkTokens;
  if (llvm::Error err = ap::import::checkTrainShape(shape))
    return llvm::toString(std::move(err));
  if (dataParallelSize < 1 || dataParallelSize > (int64_t(1) << 20))
    return llvm::formatv("--data-parallel-size must be in [1, {0}] ranks, "
                         "got {1}",
                         int64_t(1) << 20, int64_t(dataParallelSize))
        .str();
  if (pipelineParallel < 1 || pipelineParallel > 4096)
    return llvm::formatv("--pipeline-parallel must be in [1, 4096] stages, "
                         "got {0}",
                         int64_t(pipelineParallel))
        .str();
  if (tensorParallel < 1 || tensorParallel > 1024)
    return llvm::formatv("--tensor-parallel must be in [1, 1024] ranks, "
                         "got {0}",
                         int64_t(tensorParallel))
        .str();
  if (pipelineBalance == PipelineBalance::Cost && !pipelineStages.empty())
    return "--pipeline-balance=cost chooses the layers per stage; "
           "--pipeline-stages gives them: pass one of the two";
  if (pipelineBalance == PipelineBalance::Cost && pipelineParallel == 1)
    return "--pipeline-balance=cost needs --pipeline-parallel (the number of "
           "stages to balance)";
  if (!pipelineStages.empty() && pipelineParallel == 1)
    return "--pipeline-stages needs --pipeline-parallel (the number of stages "
           "it lists)";
  if (gradBucketBytes < 0 || gradBucketBytes > kMaxPlanBytes)
    return llvm::formatv("--grad-bucket-bytes must be in [0, {0}], got {1}",
                         kMaxPlanBytes, int64_t(gradBucketBytes))
        .str();
  if (gatherMaxInflight < 0 || gatherMaxInflight > 1024)
    return llvm::formatv("--gather-max-inflight must be in [0, 1024] "
                         "windows, got {0}",
                         int64_t(gatherMaxInflight))
        .str();
  if (mainGradDtype == ap::train::MainGradDtype::BF16 &&
      dataParallel != DataParallel::Zero3)
    return "--main-grad-dtype=bf16 needs --data-parallel=zero3 (replicated "
           "ranks accumulate into the main grads inside the backward "
           "kernels, which take FP32)";
  if (gatherMaxInflight.getNumOccurrences() &&
      dataParallel != DataParallel::Zero3)
    return "--gather-max-inflight applies to --data-parallel=zero3 only "
           "(replicated ranks gather nothing)";
  if (gemmWorkspace < 0 || gemmWorkspace > kMaxPlanBytes)
    return llvm::formatv("--gemm-workspace-bytes must be in [0, {0}], got {1}",
                         kMaxPlanBytes, int64_t(gemmWorkspace))
        .str();
  if (activationCut.getNumOccurrences() &&
      !(activationCut > 0 && activationCut <= 1))
    return "--activation-cut must be in (0, 1] (the share of the activation "
           "peak to remove: 0.6 = 60 %), got " +
           g(activationCut);
  // 0 is a budget too: only placements predicted to cost no step time.
  if (stepBudget.getNumOccurrences() && !(stepBudget >= 0 && stepBudget < 1))
    return "--step-budget must be in [0, 1) (the share the predicted step "
           "may grow: 0.03 = 3 %), got " +
           g(stepBudget);
  if (globalBatchTokens.getNumOccurrences()) {
    if (memoryBudget.empty())
      return "--global-batch-tokens needs --memory-budget (the micro-batch "
             "size is chosen for the most tokens/s within it)";
    if (microBatchSize.getNumOccurrences() || microBatches.getNumOccurrences())
      return "--global-batch-tokens chooses --micro-batch-size and "
             "--micro-batches; drop them";
    if (!llvm::StringRef(input).ends_with(".json"))
      return "--global-batch-tokens needs a JSON model config (the graph is "
             "imported once per micro-batch size), got " +
             std::string(input);
    int64_t perBatch = seqLen * dataParallelSize;
    if (globalBatchTokens <= 0 || globalBatchTokens % perBatch != 0)
      return llvm::formatv("--global-batch-tokens={0} is not a positive "
                           "multiple of seq x data-parallel-size = {1} x {2} "
                           "= {3} tokens",
                           int64_t(globalBatchTokens), int64_t(seqLen),
                           int64_t(dataParallelSize), perBatch)
          .str();
  }
  if (memoryBudget.getNumOccurrences() && memoryBudget.empty())
    return "--memory-budget must be a positive size such as 18GiB, 19.5GB, "
           "512MiB or a byte count, got ''";
  return "";
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
#ifdef __GLIBC__
  // The placement search clones and frees the step's module thousands of
  // times on several threads; glibc's defaults hand the freed pages back
  // to the kernel (trim, munmap) and fault them in again on the next
  // clone. Keep them.
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
#endif
  ap::setToolVersionPrinter("actplace-compile");
  ap::registerAllActplacePasses();
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(
      argc, argv,
      "actplace-compile: model config or graph -> training binary\n\n"
      "  actplace-compile models/tiny-hybrid.json --seq 64 --micro-batches 2 "
      "--offload-modules=gdn_core_attn -o train\n"
      "  actplace-compile models/qwen3.5-0.8b.json --micro-batches 4 "
      "--activation-cut=0.5 --profile=PROFILE.json -o train\n");
  if (!tritonKernels.empty() && (emit == Emit::Cpp || keepSource))
    return fail("--triton-kernel has no readable C++ form (--emit=cpp, "
                "--keep-source); use --emit=binary, object or mlir");
  if (llvm::Error e = loadTritonKernels())
    return fail(llvm::toString(std::move(e)));
  if (kernelsOpt != Kernels::Library && (emit == Emit::Cpp || keepSource))
    return fail("--kernels=generated has no readable C++ form (--emit=cpp, "
                "--keep-source): the generated kernels exist as LLVM and PTX "
                "only; use --emit=binary, object or mlir");
  // --memory-budget=device: the device profile's capacity less what the
  // binary keeps back beside its arena (support/DeviceReserve.h), as bytes.
  if (memoryBudget == "device") {
    ap::train::DeviceProfile device;
    if (!profile.empty()) {
      auto loaded = ap::train::DeviceProfile::load(profile);
      if (!loaded)
        return fail("--memory-budget=device: " +
                    llvm::toString(loaded.takeError()));
      device = *loaded;
    }
    uint64_t capacity = uint64_t(device.deviceMemoryBytes);
    uint64_t reserve = ap::support::deviceReserveBytes(dataParallelSize);
    if (capacity <= reserve)
      return fail(llvm::formatv("--memory-budget=device: the device has {0} "
                                "bytes, not more than the {1} kept back",
                                capacity, reserve)
                      .str());
    memoryBudget = std::to_string(capacity - reserve);
    llvm::errs() << llvm::formatv(
        "memory budget: device = {0} bytes ({1}) minus {2} kept back "
        "(driver and CUDA context, cuBLASLt{3}) = {4} bytes\n",
        capacity,
        profile.empty() ? std::string("the built-in H200 capacity")
                        : "deviceMemoryBytes of " + std::string(profile),
        reserve, dataParallelSize > 1 ? ", NCCL" : "", capacity - reserve);
  }
  // --memory-budget=process:SIZE: the process's whole device memory (what
  // nvidia-smi shows for it, the CUDA context included), so the plan gets
  // SIZE less the context as the process's count has it and the library
  // reserves.
  if (llvm::StringRef(memoryBudget).starts_with("process:")) {
    std::string size = memoryBudget.substr(8);
    auto parsed = ap::train::PlacementGoal::fromOptions(0, size, -1);
    if (!parsed)
      return fail("--memory-budget=" + memoryBudget + ": " +
                  llvm::toString(parsed.takeError()));
    uint64_t total = uint64_t(parsed->value);
    uint64_t reserve = ap::support::processReserveBytes(dataParallelSize);
    if (total <= reserve)
      return fail(llvm::formatv("--memory-budget={0}: {1} bytes are not more "
                                "than the {2} kept back (CUDA context, "
                                "cuBLASLt{3})",
                                std::string(memoryBudget), total, reserve,
                                dataParallelSize > 1 ? ", NCCL" : "")
                      .str());
    llvm::errs() << llvm::formatv(
        "memory budget: process {0} bytes minus {1} kept back (CUDA "
        "context, cuBLASLt{2}) = {3} bytes\n",
        total, reserve, dataParallelSize > 1 ? ", NCCL" : "", total - reserve);
    memoryBudget = std::to_string(total - reserve);
  }
  std::string badOption = checkOptions();
  if (!badOption.empty())
    return fail(badOption);

  mlir::DialectRegistry registry;
  registry.insert<ap::exec::ExecDialect, ap::train::TrainDialect,
                  mlir::func::FuncDialect, mlir::arith::ArithDialect,
                  mlir::scf::SCFDialect, mlir::tensor::TensorDialect>();
  mlir::MLIRContext ctx(registry);
  ctx.loadAllAvailableDialects();
  // Every diagnostic is shown, warnings and notes too (the context alone
  // prints only errors): train-verify-placement-config warns about a module
  // the model lacks, as in actplace-opt. Those with a place in the input
  // .mlir show it; the rest (a JSON config's graph has no locations) are
  // one line each. Not the whole module after a failing op's error.
  ctx.printOpOnDiagnostic(false);
  llvm::SourceMgr sm;
  mlir::SourceMgrDiagnosticHandler fileDiagnostics(sm, &ctx);
  mlir::ScopedDiagnosticHandler plainDiagnostics(
      &ctx, [](mlir::Diagnostic &d) -> mlir::LogicalResult {
        if (!llvm::isa<mlir::UnknownLoc>(d.getLocation()))
          return mlir::failure(); // to fileDiagnostics
        auto print = [](mlir::Diagnostic &one) {
          const char *kind = "error";
          switch (one.getSeverity()) {
          case mlir::DiagnosticSeverity::Warning:
            kind = "warning";
            break;
          case mlir::DiagnosticSeverity::Note:
            kind = "note";
            break;
          case mlir::DiagnosticSeverity::Remark:
            kind = "remark";
            break;
          case mlir::DiagnosticSeverity::Error:
            break;
          }
          llvm::errs() << "actplace-compile: " << kind << ": " << one << "\n";
        };
        print(d);
        for (mlir::Diagnostic &note : d.getNotes())
          print(note);
        return mlir::success();
      });

  // --timing: one tree of timers, printed on stderr when the compile ends.
  mlir::DefaultTimingManager timingManager;
  timingManager.setEnabled(timing);
  mlir::TimingScope rootTimer = timingManager.getRootScope();
  mlir::TimingScope importTimer = rootTimer.nest("import");

  mlir::OwningOpRef<mlir::ModuleOp> module;
  if (llvm::StringRef(input).ends_with(".json")) {
    auto cfg = ap::import::loadModelConfig(input);
    if (!cfg)
      return fail(llvm::toString(cfg.takeError()));
    ap::import::TrainShape shape;
    shape.seqLen = seqLen;
    shape.microBatchSize = microBatchSize;
    shape.microBatches = microBatches;
    shape.lossChunkTokens = lossChunkTokens;
    shape.dtype = dtypeName();
    shape.tensorParallel = tensorParallel;
    shape.sequenceParallel = sequenceParallel;
    if (llvm::Error err = ap::import::checkTensorParallel(*cfg, shape))
      return fail(llvm::toString(std::move(err)));
    shape.documentSeparator = documentSeparator;
    if (llvm::Error err = ap::import::checkDocumentSeparator(*cfg, shape))
      return fail(llvm::toString(std::move(err)));
    module = ap::import::buildForwardGraph(ctx, *cfg, shape);
    if (!module)
      return fail("the imported graph does not verify (diagnostics above)");
  } else {
    std::string err;
    auto buf = mlir::openInputFile(input, &err);
    if (!buf)
      return fail(err);
    sm.AddNewSourceBuffer(std::move(buf), llvm::SMLoc());
    module = mlir::parseSourceFile<mlir::ModuleOp>(sm, &ctx);
    if (!module)
      return fail("cannot parse " + input);
  }

  if (std::string error = chooseKernels(); !error.empty())
    return fail(error);
  markGeneratedOps(*module);

  // One options struct for the whole compile (passes/Pipeline.h); the
  // module lists may still come from the search below.
  ap::CompileOptions opts;
  opts.autodiff.fuseLossGrad = fuseLossGrad;
  ap::train::PlacementConfig &placement = opts.placement;
  placement.profile = profile;
  placement.hideRule = hideRule;
  placement.fuseRecompute = fuseRecompute;
  placement.recomputeStream = recomputeStream;
  {
    auto integer = [](const std::string &text, auto &out) {
      return text.empty() || !llvm::StringRef(text).getAsInteger(10, out);
    };
    if (!fraction.empty() &&
        llvm::StringRef(fraction).getAsDouble(placement.fraction))
      return fail("--fraction must be a number, got '" + fraction + "'");
    if (!integer(minOffloadBytes, placement.minOffloadBytes) ||
        !integer(maxInflight, placement.maxInflight) ||
        !integer(prefetchDepth, placement.prefetchDepth))
      return fail("--min-offload-bytes, --max-inflight and --prefetch-depth "
                  "must be integers");
  }
  opts.lowering.gemmWorkspaceBytes = gemmWorkspace;
  opts.lowering.dataParallel = dataParallel;
  opts.lowering.dataParallelSize = dataParallelSize;
  opts.lowering.tiedGradParts = tiedGradParts;
  opts.gradBuckets.bucketBytes = gradBucketBytes;
  opts.zeroShard.gatherMaxInflight = gatherMaxInflight;
  opts.zeroShard.mainGradDtype = mainGradDtype;
  // The cost model prices the same buckets or gathers and reduce-scatters
  // (the report's and the search's step prediction on N ranks), and the
  // memory timeline holds zero3's shards and gathered windows.
  placement.dataParallel = dataParallel;
  placement.dataParallelSize = dataParallelSize;
  placement.gradBucketBytes = gradBucketBytes;
  placement.gatherMaxInflight = gatherMaxInflight;
  placement.mainGradDtype = mainGradDtype;
  // The lowering predicts copy completion (how long offloaded bytes stay
  // reserved in the arena) with the profile placement used, unless
  // --copy-hold=peak-rates asks for the defaults.
  if (copyHold == CopyHold::Placement) {
    opts.lowering.profile = profile;
  } else if (!profile.empty()) {
    // The copies are predicted at peak rates, but side GEMMs still run on
    // the SM share the placement profile's side capacity was measured at.
    llvm::Expected<ap::train::DeviceProfile> prof =
        ap::train::DeviceProfile::load(profile);
    if (!prof)
      return fail(llvm::toString(prof.takeError()));
    opts.lowering.sideSmPercent = prof->sideSmPercent;
  }
  opts.sideIssue = sideIssue;
  opts.generatedKernels = useGenerated;
  opts.generatedOps = generatedOps;
  opts.fuseKernels = fuseGenerated;
  opts.fuseNormGradAdd = fuseGradAdd;
  opts.fuseDySum = fuseDySum;

  // Three stages so the memory timeline can see the step before placement
  // and the placed step while it is still in the train dialect.
  importTimer.stop();
  auto runStages = [&](const ap::CompileOptions &o, ap::PipelineStage first,
                       ap::PipelineStage last) -> mlir::LogicalResult {
    static const char *const kStageNames[] = {"autodiff", "placement",
                                              "lowering"};
    mlir::TimingScope stageTimer = rootTimer.nest(kStageNames[int(first)]);
    mlir::PassManager pm(&ctx);
    ap::buildPipeline(pm, o, first, last);
    pm.enableTiming(stageTimer);
    if (failed(pm.run(*module))) {
      fail("the compiler pipeline failed (diagnostics above)");
      return mlir::failure();
    }
    return mlir::success();
  };
  // --emit: the readable or LLVM-dialect module as it is, or the object
  // file, or the binary (object and link).
  auto finishBinary = [&]() -> int {
    ap::tools::StepToolchain toolchain = ap::tools::locateStepToolchain();
    if (emit == Emit::Cpp) {
      // Not built here: binaries come from the LLVM path. How to build it by
      // hand (the same headers and archives that path links).
      llvm::outs() << "wrote " << output << "\nbuild it with: " << ACTPLACE_CXX
                   << " -std=c++17 -O2 -I" << shellQuote(toolchain.includeRoot)
                   << " " << ACTPLACE_EXTRA_FLAGS << " " << shellQuote(output)
                   << " -o BINARY " << toolchain.linkItems << "\n";
      return 0;
    }
    if (emit == Emit::Mlir) {
      std::error_code ec;
      llvm::raw_fd_ostream os(output, ec);
      if (ec)
        return fail("cannot write " + output + ": " + ec.message());
      module->print(os);
      llvm::outs() << "wrote " << output << "\n";
      return 0;
    }
    std::string objPath =
        emit == Emit::Object ? std::string(output) : output + ".o";
    {
      mlir::TimingScope llvmTimer = rootTimer.nest("LLVM (object file)");
      std::string error;
      if (!ap::codegen::emitObjectFile(*module, objPath, codegenOpt, error))
        return fail(error);
    }
    if (emit == Emit::Object) {
      llvm::outs() << "wrote " << output << "\n";
      return 0;
    }

    // The link: the host compiler driver as linker only (crt files, the C++
    // runtime the archives need); nothing is compiled.
    std::string logPath = output + ".link.log";
    std::string cmd = std::string(ACTPLACE_CXX) + " " + shellQuote(objPath) +
                      " -o " + shellQuote(output) + " " + toolchain.linkItems +
                      " " + linkFlags + " > " + shellQuote(logPath) + " 2>&1";
    mlir::TimingScope linkTimer = rootTimer.nest("link");
    int rc = std::system(cmd.c_str());
    linkTimer.stop();
    if (rc != 0) {
      auto log = llvm::MemoryBuffer::getFile(logPath);
      llvm::errs() << "actplace-compile: error: the step did not link; "
                      "command:\n  "
                   << cmd << "\n";
      if (log)
        llvm::errs() << (*log)->getBuffer();
      llvm::errs() << "object kept at " << objPath << "\n";
      return 1;
    }
    llvm::sys::fs::remove(logPath);
    llvm::sys::fs::remove(objPath);
    llvm::outs() << "wrote " << output << "\n";
    return 0;
  };

  using Stage = ap::PipelineStage;
  if (failed(runStages(opts, Stage::Autodiff, Stage::Autodiff)))
    return 1;

  // The placement search for a goal (--memory-budget, --activation-cut,
  // --step-budget) on `searched` (the step, or one pipeline stage of it),
  // lowered under `lowerOpts` to check the planned arena; the choice goes to
  // `chosenOffload` / `chosenRecompute`. Returns 0, or 1 after an error.
  // Prints a search's accepted moves as they come (or, replayed, a trail):
  // a heading per descent, the moves numbered within it.
  struct TrailPrinter {
    int moves = 0, start = -1;
    void operator()(const ap::train::PlacementSearchStep &s) {
      if (s.start != start) {
        start = s.start;
        moves = 0;
        llvm::outs() << s.descent << ":\n";
      }
      llvm::outs() << llvm::formatv("  {0,2}. {1}: {2}\n", ++moves, s.move,
                                    s.after.summary());
      llvm::outs().flush();
    }
  };
  auto printTrail = [](llvm::ArrayRef<ap::train::PlacementSearchStep> trail) {
    TrailPrinter print;
    for (const ap::train::PlacementSearchStep &s : trail)
      print(s);
  };
  auto printChose = [](const ap::train::PlacementSearchResult &r) {
    llvm::outs() << "chose: "
                 << (r.best.options().empty() ? "nothing placed"
                                              : r.best.options())
                 << " (descent " << r.start + 1 << ", " << r.evaluations
                 << " placements evaluated)\n";
  };
  // A search --global-batch-tokens already ran (and lowered) for the
  // chosen size: reported, not repeated.
  struct FinishedSearch {
    ap::train::PlacementSearchResult result;
    int64_t arena = 0;
  };

  // The planned arena (exec-plan-memory) of `module` placed as `c` and
  // lowered under `lowerOpts`; -1 when it does not lower.
  auto plannedArenaOf = [&](mlir::ModuleOp module,
                            const ap::CompileOptions &lowerOpts,
                            const ap::train::PlacementChoice &c) -> int64_t {
    mlir::OwningOpRef<mlir::ModuleOp> clone(module.clone());
    ap::CompileOptions o = lowerOpts;
    o.placement.offloadModules = c.offload;
    o.placement.recomputeModules = c.recompute;
    mlir::PassManager pm(&ctx);
    ap::buildPipeline(pm, o, Stage::Placement, Stage::Lowering);
    if (failed(pm.run(*clone)))
      return -1;
    return stepBytes(*clone, ap::exec::kArenaBytesAttr);
  };

  auto searchGoal =
      [&](mlir::ModuleOp searched, const ap::CompileOptions &lowerOpts,
          ap::train::PlacementSearchCache *cache, std::string &chosenOffload,
          std::string &chosenRecompute,
          const FinishedSearch *finished = nullptr) -> int {
    auto goal = ap::train::PlacementGoal::fromOptions(activationCut,
                                                      memoryBudget, stepBudget);
    if (!goal)
      return fail(llvm::toString(goal.takeError()));
    // The choice's arena is planned below: a memory budget judges
    // placements by the peak that arena cannot go below.
    goal->workspaceRegion = searchWorkspaceRegion;
    ap::train::PlacementConfig base = placement;
    llvm::outs() << "placement search: " << goal->str() << ", cost model "
                 << (profile.empty() ? std::string("H200 defaults")
                                     : std::string(profile))
                 << "\n";
    if (finished) {
      printTrail(finished->result.trail);
      printChose(finished->result);
      llvm::outs() << "planned arena of the choice: " << finished->arena
                   << " bytes (predicted peak "
                   << finished->result.best.peakAfter
                   << "; searched by the micro-batch choice)\n";
      chosenOffload = llvm::join(finished->result.best.offload, ",");
      chosenRecompute = llvm::join(finished->result.best.recompute, ",");
      return 0;
    }
    // A memory budget bounds what the binary allocates, the planned arena
    // (exec-plan-memory); the search predicts the memory timeline's peak,
    // which packing and the shared workspace region exceed by a little. So
    // the choice is lowered and planned, and when its arena is over, the
    // search runs again for a predicted peak lower by the excess.
    auto plannedArena = [&](const ap::train::PlacementChoice &c) {
      return plannedArenaOf(searched, lowerOpts, c);
    };
    ap::train::PlacementGoal target = *goal;
    int64_t unplacedArena = -1;
    ap::train::PlacementChoice best;
    mlir::TimingScope searchTimer = rootTimer.nest("placement search");
    using Kind = ap::train::PlacementGoal::Kind;
    // Under a memory budget a screening search (its first two descents,
    // PlacementSearchDepth::Screen) learns the arena's gap above the
    // predicted peak first, so that the full search usually runs once, at
    // an aim that leaves room for it. The full search reuses the screen's
    // placements. An aim the screen cannot meet is not taken.
    // The fastest screened choice that planned within the budget.
    FastestWithinBudget screenMet;
    if (goal->kind == Kind::MemoryBudget && searchScreen) {
      auto screen =
          ap::train::searchPlacement(searched, base, target, {}, cache,
                                     ap::train::PlacementSearchDepth::Screen);
      for (int attempt = 1; attempt <= 3; ++attempt) {
        if (failed(screen))
          return fail("the placement search failed (diagnostics above)");
        if (!screen->goalMet)
          break;
        int64_t arena = plannedArena(screen->best);
        if (arena < 0)
          return fail("the screened placement did not lower (a compiler bug)");
        double gap = static_cast<double>(arena - screen->best.peakAfter);
        llvm::outs() << llvm::formatv(
            "screen: {0} ({1} placements), predicted peak {2} bytes, planned "
            "arena {3} bytes\n",
            screen->best.options().empty() ? "nothing placed"
                                           : screen->best.options(),
            screen->evaluations, screen->best.peakAfter, arena);
        if (static_cast<double>(arena) <= goal->value &&
            static_cast<double>(screen->best.peakAfter) <= goal->value)
          screenMet.offer(screen->best, arena, *screen);
        if (static_cast<double>(arena) <= goal->value ||
            goal->value - gap >= target.value)
          break;
        ap::train::PlacementGoal lower = target;
        lower.value = goal->value - gap;
        auto next =
            ap::train::searchPlacement(searched, base, lower, {}, cache,
                                       ap::train::PlacementSearchDepth::Screen);
        if (failed(next))
          return fail("the placement search failed (diagnostics above)");
        if (!next->goalMet)
          break;
        target = lower;
        screen = std::move(next);
        llvm::outs() << llvm::formatv(
            "screen: the arena runs {0} bytes above the predicted peak; the "
            "full search aims at a predicted peak of at most {1} bytes\n",
            static_cast<int64_t>(gap), static_cast<int64_t>(target.value));
      }
    }
    for (int attempt = 1;; ++attempt) {
      const bool lowered = target.value < goal->value;
      auto result = ap::train::searchPlacement(searched, base, target,
                                               TrailPrinter(), cache);
      if (failed(result))
        return fail("the placement search failed (diagnostics above)");
      best = result->best;
      auto unreachable = [&] {
        return fail(
            goal->str() +
            " is not reachable; the best placement "
            "found " +
            best.summary() +
            (best.options().empty() ? "" : " (" + best.options() + ")"));
      };
      // A second search aims below the budget by the arena's gap; missing
      // that aim is fine while the arena still fits the budget (below).
      const bool aimMissed = !result->goalMet;
      if (aimMissed && (!lowered || goal->kind != Kind::MemoryBudget))
        return unreachable();
      printChose(*result);
      if (goal->kind == Kind::StepBudget)
        break;
      int64_t arena = plannedArena(best);
      if (arena < 0)
        return fail("the chosen placement did not lower (a compiler bug)");
      llvm::outs() << "planned arena of the choice: " << arena
                   << " bytes (predicted peak " << best.peakAfter << ")\n";
      if (goal->kind == Kind::MemoryBudget) {
        double excess = static_cast<double>(arena) - goal->value;
        if (excess <= 0 && static_cast<double>(best.peakAfter) <= goal->value)
          break;
        if (aimMissed)
          return unreachable();
        // A screened choice within the budget and within kRetryGain of
        // this one is kept instead of searching again.
        if (screenMet.withinRetryGain(best.stepAfter)) {
          llvm::outs() << llvm::formatv(
              "the arena is {0} bytes over the budget; the screen's choice, "
              "within it, predicts a step {1} % against this one's: keeps it "
              "instead of searching again: {2}\n",
              static_cast<int64_t>(excess),
              stepChange(screenMet.kept->choice.stepAfter, best.stepAfter),
              screenMet.kept->choice.options());
          best = screenMet.kept->choice;
          llvm::outs() << "planned arena of the choice: "
                       << screenMet.kept->arena << " bytes (predicted peak "
                       << best.peakAfter << ")\n";
          screenMet.kept.reset();
          break;
        }
        // The arena runs `gap` bytes above the predicted peak: ask the
        // search for a predicted peak that leaves room for it.
        double gap = static_cast<double>(arena - best.peakAfter);
        target.value = std::min(target.value, goal->value - gap);
        llvm::outs() << llvm::formatv(
            "the arena is {0} bytes over the budget and {1} bytes above the "
            "predicted peak; searching again for a predicted peak of at most "
            "{2} bytes\n",
            static_cast<int64_t>(excess), static_cast<int64_t>(gap),
            static_cast<int64_t>(target.value));
      } else {
        // The cut the binary shows: planned arenas without and with the
        // placement, against the activation peak.
        if (unplacedArena < 0 && (unplacedArena = plannedArena({})) < 0)
          return fail("the unplaced step did not lower (a compiler bug)");
        double planned = static_cast<double>(unplacedArena - arena) /
                         best.activationPeakBefore;
        llvm::outs() << llvm::formatv("planned cut: {0:F2} % of the "
                                      "activation peak (predicted {1:F2} %)\n",
                                      100.0 * planned,
                                      100.0 * best.removedShare());
        if (planned >= goal->value)
          break;
        target.value =
            std::max(target.value, goal->value + best.removedShare() - planned);
        if (target.value > 1.0)
          return fail(
              goal->str() +
              " is not reachable as a planned cut: the "
              "arenas' packing takes back " +
              llvm::formatv("{0:F2}", 100.0 * (best.removedShare() - planned))
                  .str() +
              " points");
        llvm::outs() << llvm::formatv("searching again for a predicted cut of "
                                      "at least {0:F2} %\n",
                                      100.0 * target.value);
      }
      if (attempt == 4)
        return fail(goal->str() +
                    " is not reachable as planned: the fourth "
                    "search's choice plans " +
                    std::to_string(arena) + " bytes");
    }
    if (screenMet.fasterThan(best.stepAfter)) {
      best = screenMet.kept->choice;
      llvm::outs() << "keeps the screen's choice, faster within the budget: "
                   << best.options() << "\n"
                   << "planned arena of the choice: " << screenMet.kept->arena
                   << " bytes (predicted peak " << best.peakAfter << ")\n";
    }
    chosenOffload = llvm::join(best.offload, ",");
    chosenRecompute = llvm::join(best.recompute, ",");
    return 0;
  };

  // --global-batch-tokens: the differentiated step of `config` for one
  // micro-batch size `b` x `m` microbatches (a candidate of the choice).
  auto importCandidate = [&](const ap::import::ModelConfig &config, int64_t b,
                             int64_t m, int64_t lossChunk,
                             mlir::OwningOpRef<mlir::ModuleOp> &out) -> int {
    ap::import::TrainShape shape;
    shape.seqLen = seqLen;
    shape.microBatchSize = b;
    shape.microBatches = m;
    shape.lossChunkTokens = lossChunk;
    shape.dtype = dtypeName();
    shape.tensorParallel = tensorParallel;
    shape.sequenceParallel = sequenceParallel;
    if (llvm::Error err = ap::import::checkTrainShape(shape))
      return fail(llvm::toString(std::move(err)));
    if (llvm::Error err = ap::import::checkTensorParallel(config, shape))
      return fail(llvm::toString(std::move(err)));
    shape.documentSeparator = documentSeparator;
    if (llvm::Error err = ap::import::checkDocumentSeparator(config, shape))
      return fail(llvm::toString(std::move(err)));
    out = ap::import::buildForwardGraph(ctx, config, shape);
    if (!out)
      return fail("the imported graph does not verify (diagnostics above)");
    markGeneratedOps(*out);
    mlir::PassManager pm(&ctx);
    ap::buildPipeline(pm, opts, Stage::Autodiff, Stage::Autodiff);
    if (failed(pm.run(*out)))
      return fail("the compiler pipeline failed (diagnostics above)");
    return 0;
  };

  // Pipeline parallelism: one program per stage, each compiled from the
  // same differentiated step (train-pipeline-stage keeps its part), placed,
  // lowered and scheduled on its own, then lowered together into one binary.
  if (pipelineParallel > 1) {
    const bool stageSearch = ap::train::PlacementGoal::requested(
        activationCut, memoryBudget, stepBudget);

    if (stageSearch && (!offloadModules.empty() || !recomputeModules.empty()))
      return fail("--activation-cut, --memory-budget and --step-budget "
                  "choose the modules; drop --offload-modules and "
                  "--recompute-modules");
    auto splitList = [](llvm::StringRef text) {
      std::vector<std::string> out;
      llvm::SmallVector<llvm::StringRef> parts;
      if (!text.empty())
        text.split(parts, ',');
      for (llvm::StringRef p : parts)
        out.push_back(p.trim().str());
      return out;
    };
    placement.offloadModules = splitList(offloadModules);
    placement.recomputeModules = splitList(recomputeModules);
    std::vector<int64_t> layersPerStage(pipelineStages.begin(),
                                        pipelineStages.end());
    if (pipelineBalance == PipelineBalance::Cost) {
      // One split for every stage, chosen on the differentiated step.
      ap::train::MicrobatchLoopOp loop;
      module->walk([&](ap::train::MicrobatchLoopOp l) { loop = l; });
      mlir::FailureOr<ap::train::CostModel> cost =
          ap::train::CostModel::fromProfile(profile, *module);
      if (!loop || failed(cost))
        return fail("--pipeline-balance=cost: no cost model for the step "
                    "(diagnostics above)");
      llvm::SmallVector<double> seconds;
      mlir::FailureOr<llvm::SmallVector<int64_t>> split =
          ap::train::PipelineStages::balanceByCost(loop, pipelineParallel,
                                                   *cost, &seconds);
      if (failed(split))
        return fail("--pipeline-balance=cost failed (diagnostics above)");
      layersPerStage.assign(split->begin(), split->end());
      std::string counts, times;
      for (auto [n, s] : llvm::zip(*split, seconds)) {
        counts += (counts.empty() ? "" : ",") + std::to_string(n);
        times += (times.empty() ? "" : ", ") + g(s * 1e3);
      }
      llvm::outs() << "pipeline stages balanced by the cost model: "
                   << "--pipeline-stages=" << counts << " (predicted " << times
                   << " ms per microbatch, forward and backward)\n";
    }
    // --global-batch-tokens with stages: each micro-batch size (with at
    // least as many microbatches as stages) is imported, cut into its
    // stages and each stage searched for the budget; the 1F1B step is
    // M + P - 1 slots of the slowest stage's predicted time per
    // microbatch, and the fastest size whose every stage plans within the
    // budget wins.
    if (globalBatchTokens.getNumOccurrences()) {
      auto batch = batchChoiceInputs();
      if (!batch)
        return fail(llvm::toString(batch.takeError()));
      const ap::train::PlacementGoal *goal = &batch->goal;
      const ap::import::ModelConfig *cfg = &batch->cfg;
      int64_t sequences = batch->sequences;
      struct StageChoice {
        ap::train::PlacementChoice best;
        int64_t arena = 0;
      };
      struct PipelineCandidate {
        int64_t b = 0, m = 0;
        std::vector<StageChoice> stages;
        bool met = true;
        double tokensPerSecond = 0;
        mlir::OwningOpRef<mlir::ModuleOp> module;
      };
      std::vector<PipelineCandidate> candidates;
      llvm::outs() << "micro-batch choice with " << pipelineParallel
                   << " stages: " << int64_t(globalBatchTokens)
                   << " tokens per step = " << sequences << " sequences of "
                   << int64_t(seqLen) << " per pipeline, " << goal->str()
                   << " per stage\n";
      for (int64_t b : {1, 2, 4, 8}) {
        if (sequences % b != 0 || sequences / b < pipelineParallel)
          continue;
        PipelineCandidate c;
        c.b = b;
        c.m = sequences / b;
        if (importCandidate(*cfg, c.b, c.m, lossChunkTokens, c.module))
          return 1;
        double slowest = 0;
        for (int64_t k = 0; k < pipelineParallel; ++k) {
          ap::CompileOptions o = opts;
          o.pipelineStages = pipelineParallel;
          o.pipelineStage = k;
          o.pipelineLayers = layersPerStage;
          mlir::OwningOpRef<mlir::ModuleOp> cut = c.module->clone();
          {
            mlir::PassManager pm(&ctx);
            ap::TrainPipelineStageOptions so;
            so.stages = pipelineParallel;
            so.stage = k;
            so.layers.assign(layersPerStage.begin(), layersPerStage.end());
            pm.addPass(ap::createTrainPipelineStage(so));
            if (failed(pm.run(*cut)))
              return fail("the compiler pipeline failed for pipeline stage " +
                          std::to_string(k) + " (diagnostics above)");
          }
          ap::train::PlacementSearchCache cache;
          auto result =
              ap::train::searchPlacement(*cut, placement, *goal, {}, &cache);
          if (failed(result))
            return fail("the placement search failed (diagnostics above)");
          StageChoice s;
          s.best = result->best;
          o.placement.offloadModules = s.best.offload;
          o.placement.recomputeModules = s.best.recompute;
          mlir::PassManager pm(&ctx);
          ap::buildPipeline(pm, o, Stage::Placement, Stage::Lowering);
          if (failed(pm.run(*cut)))
            return fail("the chosen placement did not lower (a compiler "
                        "bug)");
          s.arena = stepBytes(*cut, ap::exec::kArenaBytesAttr);
          // The choice goes by the predicted peaks; the chosen size's
          // stages are searched again below against their planned arenas
          // (packing runs a little above the prediction).
          c.met = c.met && result->goalMet;
          slowest = std::max(slowest, s.best.stepAfter / double(c.m));
          c.stages.push_back(std::move(s));
        }
        double step = double(c.m + pipelineParallel - 1) * slowest;
        c.tokensPerSecond = step > 0 ? double(globalBatchTokens) / step : 0;
        std::string arenas;
        for (const StageChoice &s : c.stages)
          arenas += (arenas.empty() ? "" : ", ") + std::to_string(s.arena);
        llvm::outs() << llvm::formatv(
            "  micro-batch size {0} x {1} micro-batches: {2:F0} tokens/s "
            "predicted (1F1B over the slowest stage), first planned arenas "
            "{3} bytes{4}\n",
            c.b, c.m, c.tokensPerSecond, arenas,
            c.met ? "" : " (a stage's predicted peak is over the budget)");
        candidates.push_back(std::move(c));
      }
      PipelineCandidate *chosen = nullptr;
      for (PipelineCandidate &c : candidates)
        if (c.met && (!chosen || c.tokensPerSecond > chosen->tokensPerSecond))
          chosen = &c;
      if (!chosen)
        return fail(
            llvm::formatv("{0} is not reachable at --global-batch-tokens={1} "
                          "with {2} stages: no micro-batch size of 1, 2, 4 or "
                          "8 with at least {2} microbatches plans every stage "
                          "within it",
                          goal->str(), int64_t(globalBatchTokens),
                          int64_t(pipelineParallel))
                .str());
      llvm::outs() << llvm::formatv("micro-batch choice: micro-batch size {0} "
                                    "x {1} micro-batches ({2:F0} tokens/s "
                                    "predicted)\n",
                                    chosen->b, chosen->m,
                                    chosen->tokensPerSecond);
      microBatchSize = chosen->b;
      microBatches = chosen->m;
      module = std::move(chosen->module);
    }
    // The 1F1B step before placement: M + P - 1 slots of the slowest
    // stage's forward and backward (P - 1 of them the fill and drain
    // bubble), communication left out.
    {
      ap::train::MicrobatchLoopOp loop;
      module->walk([&](ap::train::MicrobatchLoopOp l) { loop = l; });
      mlir::FailureOr<ap::train::CostModel> cost =
          ap::train::CostModel::fromProfile(profile, *module);
      mlir::FailureOr<ap::train::PipelineStages> split = mlir::failure();
      if (loop)
        split = ap::train::PipelineStages::assign(loop, pipelineParallel,
                                                  layersPerStage);
      if (succeeded(cost) && succeeded(split)) {
        llvm::SmallVector<int64_t> counts;
        for (int64_t s = 0; s < pipelineParallel; ++s)
          counts.push_back(split->firstLayer[s + 1] - split->firstLayer[s]);
        llvm::SmallVector<double> seconds =
            ap::train::PipelineStages::stageSeconds(loop, counts, *cost);
        double slowest = *std::max_element(seconds.begin(), seconds.end());
        int64_t m = microBatches, p = pipelineParallel;
        llvm::outs() << llvm::formatv(
            "pipeline: {0} stages x {1} microbatches (1F1B): predicted step "
            "{2:F3} ms before placement = {3} x the slowest stage's "
            "{4:F3} ms per microbatch; the fill and drain bubble is {5:F1} % "
            "of it\n",
            p, m, double(m + p - 1) * slowest * 1e3, m + p - 1, slowest * 1e3,
            100.0 * double(p - 1) / double(m + p - 1));
      }
    }
    // --memory-timeline with stages: FILE.stage<k>.svg per stage, the
    // placed stage's one-microbatch timeline with the peak the stage
    // predicts with the microbatches 1F1B keeps in flight there.
    auto drawStageTimeline = [&](mlir::ModuleOp placed,
                                 const ap::CompileOptions &o,
                                 int64_t k) -> int {
      mlir::FailureOr<ap::train::CostModel> cost =
          ap::train::CostModel::fromProfile(profile, placed);
      if (failed(cost))
        return fail("--memory-timeline: no cost model (diagnostics above)");
      ap::train::MemoryTimeline timeline = ap::train::MemoryTimeline::compute(
          placed, *cost, o.placement.dataParallelOptions());
      ap::train::MemoryChart chart =
          ap::train::MemoryChart::build(timeline, *cost);
      ap::train::MemoryChartStyle style;
      style.title =
          memoryTimelineTitle.empty()
              ? llvm::sys::path::filename(input).str() + " pipeline stage " +
                    std::to_string(k) + " of " +
                    std::to_string(pipelineParallel)
              : memoryTimelineTitle + " (stage " + std::to_string(k) + ")";
      int64_t inflight =
          ap::train::pipelineInflight(placed, timeline.microBatches());
      std::string placed_;
      if (!o.placement.offloadModules.empty())
        placed_ += "offload " + llvm::join(o.placement.offloadModules, ",");
      if (!o.placement.recomputeModules.empty())
        placed_ += std::string(placed_.empty() ? "" : ", ") + "recompute " +
                   llvm::join(o.placement.recomputeModules, ",");
      style.notes.push_back("one microbatch; 1F1B holds up to " +
                            std::to_string(inflight) +
                            " in flight on this stage; placement: " +
                            (placed_.empty() ? std::string("none") : placed_));
      style.lines.push_back({"predicted stage peak with the microbatches in "
                             "flight",
                             ap::train::stagePeakBytes(placed, timeline)});
      style.axis = memoryTimelineAxis;
      llvm::StringRef base(memoryTimeline);
      std::string path =
          base.ends_with(".svg")
              ? base.drop_back(4).str() + ".stage" + std::to_string(k) + ".svg"
              : base.str() + ".stage" + std::to_string(k);
      std::error_code ec;
      llvm::raw_fd_ostream os(path, ec);
      if (ec)
        return fail("cannot write " + path + ": " + ec.message());
      ap::train::writeMemoryChartSvg(chart, style, os);
      llvm::outs() << "memory timeline of stage " << k << ": " << path
                   << " (one microbatch's peak " << chart.peakBytes()
                   << " bytes; with " << inflight << " in flight "
                   << ap::train::stagePeakBytes(placed, timeline) << ")\n";
      return 0;
    };
    std::vector<mlir::OwningOpRef<mlir::ModuleOp>> stages;
    llvm::SmallVector<mlir::ModuleOp> stageRefs;
    for (int64_t k = 0; k < pipelineParallel; ++k) {
      ap::CompileOptions o = opts;
      o.pipelineStages = pipelineParallel;
      o.pipelineStage = k;
      o.pipelineLayers = layersPerStage;
      if (stageSearch) {
        // Each stage is searched on its own, with the goal applying to the
        // stage: its planned arena holds the microbatches 1F1B keeps in
        // flight there, so the choice may differ from stage to stage.
        mlir::OwningOpRef<mlir::ModuleOp> cut = module->clone();
        {
          mlir::PassManager pm(&ctx);
          ap::TrainPipelineStageOptions so;
          so.stages = pipelineParallel;
          so.stage = k;
          so.layers.assign(layersPerStage.begin(), layersPerStage.end());
          pm.addPass(ap::createTrainPipelineStage(so));
          if (failed(pm.run(*cut)))
            return fail("the compiler pipeline failed for pipeline stage " +
                        std::to_string(k) + " (diagnostics above)");
        }
        llvm::outs() << "pipeline stage " << k << ":\n";
        std::string off, rec;
        ap::train::PlacementSearchCache stageCache;
        if (searchGoal(*cut, o, &stageCache, off, rec))
          return 1;
        o.placement.offloadModules = splitList(off);
        o.placement.recomputeModules = splitList(rec);
      }
      o.report = true;
      o.reportFile = output + ".stage" + std::to_string(k) + ".report.txt";
      if (!reportJson.empty())
        o.jsonReportFile = reportJson + ".stage" + std::to_string(k);
      mlir::OwningOpRef<mlir::ModuleOp> stage = module->clone();
      mlir::TimingScope stageTimer =
          rootTimer.nest("stage " + std::to_string(k));
      // Placement, then (for --memory-timeline) the stage's chart of its
      // placed step, then the lowering.
      for (Stage part : {Stage::Placement, Stage::Lowering}) {
        mlir::PassManager pm(&ctx);
        ap::buildPipeline(pm, o, part, part);
        pm.enableTiming(stageTimer);
        if (failed(pm.run(*stage)))
          return fail("the compiler pipeline failed for pipeline stage " +
                      std::to_string(k) + " (diagnostics above)");
        if (part == Stage::Placement && !memoryTimeline.empty())
          if (int rc = drawStageTimeline(*stage, o, k))
            return rc;
      }
      int64_t arena = stepBytes(*stage, ap::exec::kArenaBytesAttr);
      if (arena > kMaxPlanBytes)
        return fail(llvm::formatv("stage {0}'s planned arena is {1} bytes, "
                                  "over the limit of {2} (2^48) bytes",
                                  k, arena, kMaxPlanBytes));
      stageRefs.push_back(*stage);
      stages.push_back(std::move(stage));
    }
    std::vector<ap::codegen::EmittedPlan> plans(stages.size());
    std::string cppPath = emit == Emit::Cpp ? std::string(output)
                          : keepSource      ? output + ".cpp"
                                            : std::string();
    if (!cppPath.empty()) {
      std::error_code ec;
      llvm::raw_fd_ostream os(cppPath, ec);
      if (ec)
        return fail("cannot write " + cppPath + ": " + ec.message());
      if (failed(ap::codegen::emitCppStages(stageRefs, os, plans.data())))
        return fail("code generation failed (diagnostics above)");
    }
    {
      mlir::TimingScope lowerTimer = rootTimer.nest("lowering to LLVM dialect");
      for (auto [k, stage] : llvm::enumerate(stageRefs)) {
        std::string stageReport =
            reportJson.empty() ? std::string()
                               : reportJson + ".stage" + std::to_string(k);
        std::string error =
            printFusion(stage, stageReport, "stage " + std::to_string(k) + " ");
        if (!error.empty())
          return fail(error);
        attachTritonKernels(stage, "stage " + std::to_string(k) + " ");
        markShortConvKernels(stage);
      }
      if (failed(
              ap::codegen::lowerStagesToLLVM(*module, stageRefs, plans.data())))
        return fail("code generation failed (diagnostics above)");
    }
    for (auto [k, plan] : llvm::enumerate(plans))
      printGenerated(plan, "stage " + std::to_string(k) + " ");
    for (auto [k, plan] : llvm::enumerate(plans))
      llvm::outs() << "stage " << k << " planned peak: arena "
                   << plan.arenaBytes << " bytes (persistent "
                   << plan.persistentBytes << ", activations "
                   << plan.activationBytes << ", workspace "
                   << plan.workspaceBytes << "), pinned " << plan.pinnedBytes
                   << " bytes in " << plan.numSlots << " slots, "
                   << plan.numScopes << " offload scopes; report " << output
                   << ".stage" << k << ".report.txt\n";
    return finishBinary();
  }

  // --global-batch-tokens: one import, autodiff and placement search per
  // micro-batch size B (1, 2, 4, 8 where they divide the sequences per
  // rank); the most predicted tokens/s within the budget wins, and the
  // search below starts from that size's placements (the same cache).
  ap::train::PlacementSearchCache searchCache;
  std::optional<FinishedSearch> chosenSearch;
  if (globalBatchTokens.getNumOccurrences()) {
    auto batch = batchChoiceInputs();
    if (!batch)
      return fail(llvm::toString(batch.takeError()));
    const ap::train::PlacementGoal *goal = &batch->goal;
    const ap::import::ModelConfig *cfg = &batch->cfg;
    int64_t sequences = batch->sequences;
    struct Candidate {
      int64_t b = 0, m = 0, arena = 0;
      ap::train::PlacementChoice best;
      bool met = false;
      double tokensPerSecond = 0;
      mlir::OwningOpRef<mlir::ModuleOp> module;
      ap::train::PlacementSearchCache cache;
      /// The aim of its last search (the budget, or lower by the arena's
      /// gap), and its last search (full once it is a contender).
      ap::train::PlacementGoal target;
      ap::train::PlacementSearchResult searched;
      bool full = false;
      /// The fastest choice of its searches so far within the budget.
      FastestWithinBudget bestMet;
      /// Placements of all its searches.
      int64_t evaluations = 0;
      /// The least budget this size's choice fits.
      int64_t needs() const { return std::max(arena, best.peakAfter); }
      std::string text() const {
        return llvm::formatv("micro-batch size {0} x {1} micro-batches", b, m)
            .str();
      }
    };
    std::vector<Candidate> candidates;
    mlir::TimingScope choiceTimer = rootTimer.nest("micro-batch choice");
    // Searches size `c` at `depth` from its aim. What the binary allocates
    // is the planned arena (packing and the workspace region run a little
    // above the predicted peak): a size fits when its choice's arena does.
    // When the search met its aim with a predicted peak but the arena is
    // over, it runs again (up to three times, reusing its placements) for a
    // predicted peak lower by the arena's gap above it.
    auto searchSize = [&](Candidate &c, ap::train::PlacementSearchDepth depth,
                          mlir::TimingScope &sizeTimer,
                          llvm::raw_ostream &os) -> int {
      const bool full = depth == ap::train::PlacementSearchDepth::Full;
      for (int attempt = 1;; ++attempt) {
        mlir::TimingScope t =
            sizeTimer.nest(full ? "placement search" : "screening search");
        auto result = ap::train::searchPlacement(*c.module, placement, c.target,
                                                 {}, &c.cache, depth);
        if (failed(result))
          return fail("the placement search failed (diagnostics above)");
        c.best = result->best;
        c.evaluations += result->evaluations;
        c.searched = std::move(*result);
        c.searched.evaluations = c.evaluations;
        {
          mlir::TimingScope t = sizeTimer.nest("lowering the choice");
          c.arena = plannedArenaOf(*c.module, opts, c.best);
          if (c.arena < 0)
            return fail("the chosen placement did not lower (a compiler bug)");
        }
        // Met against the user's budget (a retry's lower target is only
        // the search's aim).
        c.met = double(c.arena) <= goal->value &&
                double(c.best.peakAfter) <= goal->value;
        if (c.met)
          c.bestMet.offer(c.best, c.arena, c.searched);
        if (c.met || !c.searched.goalMet || attempt == 4)
          break;
        // A search for a lower peak is no faster than this choice: with an
        // earlier choice within the budget and within kRetryGain of it,
        // keep that one (below) instead of searching again.
        if (c.bestMet.withinRetryGain(c.best.stepAfter)) {
          os << llvm::formatv(
              "  {0}: planned arena {1} bytes, over the budget; an earlier "
              "choice within it predicts a step {2} % against this one's: no "
              "search again\n",
              c.text(), c.arena,
              stepChange(c.bestMet.kept->choice.stepAfter, c.best.stepAfter));
          break;
        }
        const double gap = double(c.arena - c.best.peakAfter);
        if (goal->value - gap >= c.target.value)
          break; // no lower target to try
        c.target.value = goal->value - gap;
        os << llvm::formatv(
            "  {0}: planned arena {1} bytes, over the budget; {2} again for "
            "a predicted peak of at most {3} bytes\n",
            c.text(), c.arena, full ? "searching" : "screening",
            int64_t(c.target.value));
      }
      const bool keepEarlier =
          c.bestMet.kept && (!c.met || c.bestMet.fasterThan(c.best.stepAfter));
      if (keepEarlier) {
        int64_t evaluations = c.searched.evaluations;
        c.best = c.bestMet.kept->choice;
        c.arena = c.bestMet.kept->arena;
        c.searched = c.bestMet.kept->searched;
        c.searched.evaluations = evaluations;
        c.met = true;
        os << llvm::formatv("  {0}: keeps an earlier search's choice, the "
                            "fastest within the budget\n",
                            c.text());
      }
      c.tokensPerSecond = c.best.stepAfter > 0
                              ? double(globalBatchTokens) / c.best.stepAfter
                              : 0;
      os << llvm::formatv(
          "  {0}: {1}, {2:F0} tokens/s predicted, device peak {3} bytes, "
          "planned arena {4} bytes{5}{6}\n",
          c.text(),
          c.best.options().empty() ? "nothing placed" : c.best.options(),
          c.tokensPerSecond, c.best.peakAfter, c.arena,
          c.met ? "" : " (over the budget)",
          full ? " (full search)" : " (screen)");
      return 0;
    };
    llvm::outs() << "micro-batch choice: " << int64_t(globalBatchTokens)
                 << " tokens per step = " << sequences << " sequences of "
                 << int64_t(seqLen) << " per rank x "
                 << int64_t(dataParallelSize) << " ranks, " << goal->str()
                 << "\n";
    // Searches the sizes `todo` at `depth`, each under its timer: on
    // threads of their own where the context runs multi-threaded (each
    // search evaluates on several threads too; together they keep the
    // cores busy through each other's serial parts: the first placement,
    // each descent's last candidates, the lowering of the choice), one
    // after the other otherwise. Each search is deterministic and owns its
    // module and cache, so the choices do not depend on the threads; what
    // they print comes out in the order of `todo`. (A search drops only the
    // diagnostics of the threads placing its candidates, so a choice that
    // fails to lower still reports its pass's diagnostics.)
    auto searchSizes =
        [&](llvm::ArrayRef<Candidate *> todo,
            ap::train::PlacementSearchDepth depth,
            llvm::MutableArrayRef<mlir::TimingScope> timers) -> int {
      std::vector<std::string> text(todo.size());
      std::vector<int> rc(todo.size(), 0);
      auto run = [&](size_t i) {
        llvm::raw_string_ostream os(text[i]);
        rc[i] = searchSize(*todo[i], depth, timers[i], os);
      };
      if (todo.size() > 1 && ctx.isMultithreadingEnabled()) {
        // What the passes load on first use is loaded here, before any
        // two searches could load it at once.
        ctx.loadAllAvailableDialects();
        std::vector<std::thread> pool;
        for (size_t i = 1; i < todo.size(); ++i)
          pool.emplace_back(run, i);
        run(0);
        for (std::thread &t : pool)
          t.join();
      } else {
        for (size_t i = 0; i < todo.size(); ++i)
          run(i);
      }
      for (const std::string &t : text)
        llvm::outs() << t;
      for (int r : rc)
        if (r)
          return r;
      return 0;
    };
    // Every size's import and autodiff first (on this thread: they build
    // IR and load dialects), then their screens together.
    std::vector<mlir::TimingScope> sizeTimers;
    for (int64_t b : {1, 2, 4, 8}) {
      if (sequences % b != 0)
        continue;
      Candidate c;
      c.b = b;
      c.m = sequences / b;
      std::string timerName = "micro-batch size " + std::to_string(b);
      sizeTimers.push_back(choiceTimer.nest(timerName));
      {
        mlir::TimingScope t = sizeTimers.back().nest("import and autodiff");
        if (importCandidate(*cfg, c.b, c.m, lossChunkTokens, c.module))
          return 1;
      }
      c.target = *goal;
      c.full = !searchScreen;
      candidates.push_back(std::move(c));
    }
    {
      std::vector<Candidate *> todo;
      for (Candidate &c : candidates)
        todo.push_back(&c);
      if (searchSizes(todo,
                      searchScreen ? ap::train::PlacementSearchDepth::Screen
                                   : ap::train::PlacementSearchDepth::Full,
                      sizeTimers))
        return 1;
    }
    // The screens rank the sizes. The full search, from a screen's aim,
    // goes to the contenders: the sizes met within kContenderMargin of the
    // fastest screened size, and sizes at least kNearMissGain faster that
    // the screen left less than kNearMiss over the budget; when none met,
    // every size. A full search only adds descents (the first two are the
    // screen's), so it never makes a size slower; on the recorded cases it
    // gained at most half a percent. A near miss a full search might bring
    // under the budget is worth its time (a full search, about 7 s for
    // Qwen3.5-0.8B) only when it would win by more than that.
    constexpr double kContenderMargin = 0.02, kNearMiss = 0.05,
                     kNearMissGain = 0.01;
    double fastest = 0;
    for (const Candidate &c : candidates)
      if (c.met)
        fastest = std::max(fastest, c.tokensPerSecond);
    std::vector<Candidate *> contenders;
    for (Candidate &c : candidates) {
      if (c.full)
        continue;
      bool contender =
          c.met ? c.tokensPerSecond >= (1 - kContenderMargin) * fastest
                : c.tokensPerSecond >= (1 + kNearMissGain) * fastest &&
                      double(c.needs()) <= (1 + kNearMiss) * goal->value;
      if (fastest > 0 && !contender)
        continue;
      // A choice at the unplaced step (nothing placed, or only copies that
      // hide): no search does better.
      if (c.met && c.best.stepAfter <= c.best.stepBefore)
        continue;
      if (fastest == 0)
        c.target = *goal;
      c.full = true;
      contenders.push_back(&c);
    }
    {
      std::vector<mlir::TimingScope> timers;
      for (Candidate *c : contenders)
        timers.push_back(
            choiceTimer.nest("micro-batch size " + std::to_string(c->b)));
      if (searchSizes(contenders, ap::train::PlacementSearchDepth::Full,
                      timers))
        return 1;
    }
    if (candidates.empty())
      return fail(llvm::formatv("--global-batch-tokens={0}: {1} sequences per "
                                "rank take no micro-batch size of 1, 2, 4 or 8",
                                int64_t(globalBatchTokens), sequences)
                      .str());
    // The fastest that fits; on a tie the smaller micro-batch (less memory).
    std::vector<Candidate *> order;
    for (Candidate &c : candidates)
      order.push_back(&c);
    llvm::stable_sort(order, [](const Candidate *a, const Candidate *b) {
      if (a->met != b->met)
        return a->met;
      if (a->met)
        return a->tokensPerSecond > b->tokensPerSecond;
      return a->needs() < b->needs();
    });
    Candidate &chosen = *order.front();
    if (!chosen.met)
      return fail(
          llvm::formatv("{0} is not reachable at --global-batch-tokens={1}: "
                        "the smallest plan found needs {2} bytes (planned "
                        "arena and predicted peak; {3}, {4}); give "
                        "--memory-budget={2} or more",
                        goal->str(), int64_t(globalBatchTokens), chosen.needs(),
                        chosen.text(),
                        chosen.best.options().empty() ? "nothing placed"
                                                      : chosen.best.options())
              .str());
    llvm::outs() << "micro-batch choice: " << chosen.text() << " ("
                 << llvm::formatv("{0:F0}", chosen.tokensPerSecond)
                 << " tokens/s predicted)";
    if (order.size() > 1) {
      Candidate &second = *order[1];
      if (second.met)
        llvm::outs() << llvm::formatv(
            "; runner-up {0}: {1:F0} tokens/s, {2:F2} % slower{3}",
            second.text(), second.tokensPerSecond,
            100.0 * (1.0 - second.tokensPerSecond / chosen.tokensPerSecond),
            // A screen's tokens/s is what its first two descents found; the
            // full search could only be faster.
            second.full ? "" : " (screened: at least)");
      else
        llvm::outs() << llvm::formatv(
            "; runner-up {0} would be {1:F0} tokens/s but its best plan "
            "needs {2} bytes, over the budget",
            second.text(), second.tokensPerSecond, second.needs());
    }
    llvm::outs() << "\n";
    microBatchSize = chosen.b;
    microBatches = chosen.m;
    module = std::move(chosen.module);
    searchCache = std::move(chosen.cache);
    if (chosen.met)
      chosenSearch = FinishedSearch{std::move(chosen.searched), chosen.arena};
  }

  // A goal instead of module lists: the search picks them (under the same
  // profile and options), then everything below runs as if they were given.
  if (pipelineParallel == 1 && ap::train::PlacementGoal::requested(
                                   activationCut, memoryBudget, stepBudget)) {
    if (!offloadModules.empty() || !recomputeModules.empty())
      return fail("--activation-cut, --memory-budget and --step-budget "
                  "choose the modules; drop --offload-modules and "
                  "--recompute-modules");
    std::string chosenOffload, chosenRecompute;
    if (searchGoal(*module, opts, &searchCache, chosenOffload, chosenRecompute,
                   chosenSearch ? &*chosenSearch : nullptr))
      return 1;
    offloadModules = chosenOffload;
    recomputeModules = chosenRecompute;
  }

  // Comma lists, as the passes' list options read them.
  auto split = [](llvm::StringRef text) {
    std::vector<std::string> out;
    llvm::SmallVector<llvm::StringRef> parts;
    if (!text.empty())
      text.split(parts, ',');
    for (llvm::StringRef p : parts)
      out.push_back(p.trim().str());
    return out;
  };
  placement.offloadModules = split(offloadModules);
  placement.recomputeModules = split(recomputeModules);

  // The placement flags given, in pass-option spelling: the SVG's subtitle.
  auto given = [](const auto &opt, std::string text) {
    return opt.getNumOccurrences() ? text : std::string();
  };
  std::string placementFlags;
  for (const auto &[name, value] :
       {std::pair<const char *, std::string>{"offload-modules", offloadModules},
        {"recompute-modules", recomputeModules},
        {"fraction", fraction},
        {"min-offload-bytes", minOffloadBytes},
        {"max-inflight", maxInflight},
        {"prefetch-depth", prefetchDepth},
        {"hide-rule",
         given(hideRule, hideRule == ap::train::HideRule::On ? "on" : "off")},
        {"fuse-recompute", fuseRecompute ? "" : "false"},
        {"recompute-stream",
         given(recomputeStream,
               recomputeStream == ap::train::RecomputeStream::Side
                   ? "side"
                   : "compute")}})
    if (!value.empty())
      placementFlags +=
          std::string(placementFlags.empty() ? "" : " ") + name + "=" + value;
  std::string reportPath = output + ".report.txt";
  opts.report = true;
  opts.reportFile = reportPath;
  opts.jsonReportFile = reportJson;
  bool drawTimeline = !memoryTimeline.empty();
  ap::train::DeviceProfile device;
  if (drawTimeline && !profile.empty()) {
    auto loaded = ap::train::DeviceProfile::load(profile);
    if (!loaded)
      return fail(llvm::toString(loaded.takeError()));
    device = *loaded;
  }
  ap::train::CostModel cost(device);

  int64_t unplacedPeak = 0;
  if (drawTimeline)
    unplacedPeak = ap::train::MemoryTimeline::compute(
                       *module, cost, placement.dataParallelOptions())
                       .peakBytes();
  if (failed(runStages(opts, Stage::Placement, Stage::Placement)))
    return 1;
  ap::train::MemoryChart chart;
  if (drawTimeline)
    chart = ap::train::MemoryChart::build(
        ap::train::MemoryTimeline::compute(*module, cost,
                                           placement.dataParallelOptions()),
        cost);
  if (failed(runStages(opts, Stage::Lowering, Stage::Lowering)))
    return 1;
  // What the binary allocates, checked before it is built.
  for (llvm::StringRef attr :
       {ap::exec::kArenaBytesAttr, ap::exec::kPinnedBytesAttr}) {
    int64_t bytes = stepBytes(*module, attr);
    if (bytes > kMaxPlanBytes)
      return fail(llvm::formatv(
          "the planned {0} is {1} bytes (persistent {2}, activations {3}, "
          "workspace {4}), over the limit of {5} (2^48) bytes; lower --seq, "
          "--micro-batch-size or the model's sizes",
          attr, bytes, stepBytes(*module, ap::exec::kPersistentBytesAttr),
          stepBytes(*module, ap::exec::kActivationBytesAttr),
          stepBytes(*module, ap::exec::kWorkspaceBytesAttr), kMaxPlanBytes));
  }

  // Placement report totals (the whole report is kept beside the binary).
  {
    std::ifstream rep(reportPath);
    std::string l;
    while (std::getline(rep, l))
      if (l.rfind("totals", 0) == 0 || l.rfind("transfers", 0) == 0 ||
          l.rfind("predicted", 0) == 0 || l.rfind("activation peak", 0) == 0)
        llvm::outs() << l << "\n";
  }

  markShortConvKernels(*module);
  // The readable C++ (--emit=cpp, --keep-source) is printed from the
  // planned exec module, before the LLVM lowering replaces it.
  ap::codegen::EmittedPlan plan;
  std::string cppPath = emit == Emit::Cpp ? std::string(output)
                        : keepSource      ? output + ".cpp"
                                          : std::string();
  if (!cppPath.empty()) {
    mlir::TimingScope emitTimer = rootTimer.nest("readable C++");
    std::error_code ec;
    llvm::raw_fd_ostream os(cppPath, ec);
    if (ec)
      return fail("cannot write " + cppPath + ": " + ec.message());
    if (failed(ap::codegen::emitCpp(*module, os, &plan)))
      return fail("code generation failed (diagnostics above)");
  }
  {
    mlir::TimingScope lowerTimer = rootTimer.nest("lowering to LLVM dialect");
    std::string error = printFusion(*module, reportJson);
    if (!error.empty())
      return fail(error);
    attachTritonKernels(*module);
    if (failed(ap::codegen::lowerStepToLLVM(*module, &plan)))
      return fail("code generation failed (diagnostics above)");
  }
  printGenerated(plan);
  llvm::outs() << "planned peak: arena " << plan.arenaBytes
               << " bytes (persistent " << plan.persistentBytes
               << ", activations " << plan.activationBytes << ", workspace "
               << plan.workspaceBytes << "), pinned " << plan.pinnedBytes
               << " bytes in " << plan.numSlots << " slots, " << plan.numScopes
               << " offload scopes\n";

  if (drawTimeline) {
    ap::train::MemoryChartStyle style;
    style.title = memoryTimelineTitle;
    if (style.title.empty()) {
      style.title = llvm::sys::path::filename(input).str();
      if (llvm::StringRef(input).ends_with(".json"))
        style.title += " seq " + std::to_string(seqLen) + ", micro-batch " +
                       std::to_string(microBatchSize) + ", " +
                       std::to_string(microBatches) + " microbatches, " +
                       dtypeName();
    }
    style.notes.push_back(
        "placement: " +
        (placementFlags.empty() ? std::string("none") : placementFlags) +
        (profile.empty() ? "; cost model: H200 defaults"
                         : "; cost model: " + profile));
    style.lines.push_back({"peak before placement", unplacedPeak});
    style.lines.push_back({"planned arena (exec-plan-memory)",
                           static_cast<int64_t>(plan.arenaBytes)});
    style.axis = memoryTimelineAxis;
    std::error_code ec;
    llvm::raw_fd_ostream os(memoryTimeline, ec);
    if (ec)
      return fail("cannot write " + memoryTimeline + ": " + ec.message());
    ap::train::writeMemoryChartSvg(chart, style, os);
    llvm::outs() << "memory timeline: " << memoryTimeline << " (peak "
                 << chart.peakBytes() << " bytes, before placement "
                 << unplacedPeak << ")\n";
  }

  return finishBinary();
}
