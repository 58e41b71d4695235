//===- fuzz_ir.cpp - libFuzzer target: MLIR text -> actplace passes -------===//
//
// Parses the input as MLIR with the dialects actplace-opt registers (the
// parser runs the train and exec verifiers), then runs the compiler's passes
// on what verifies, as actplace-opt and actplace-compile would:
//
//   a forward graph (@forward)   train-print-summary, train-autodiff, then
//                                 as a training step;
//   a training step (@train_step) on clones: the printing analyses
//                                 (saved activations, memory timeline) and
//                                 train-plan-budget; then the placement
//                                 pipeline with its report, the memory
//                                 timeline of the placed step,
//                                 convert-train-to-exec, exec-plan-memory,
//                                 exec-schedule-streams, exec-defer-side-issue;
//   an exec module (exec.step)   the exec passes.
//
// The placement options, the plan-budget goal and the lowering's workspace
// come from a fixed table, picked by a hash of the input, so one input always
// runs the same pipeline. Invariants checked (besides the sanitizers): every
// pass that succeeds leaves IR that verifies, and the input and every result
// print to text that parses again.
//
// Seeds: the *.mlir inputs of test/ split at `// -----`, and forward graphs
// and training steps of models/tiny-*.json (tools/scripts/fuzz.sh builds the
// corpus). Dictionary: fuzz/ir.dict.
//
//===----------------------------------------------------------------------===//

#include "FuzzCommon.h"

#include "dialect/exec/ExecOps.h"
#include "passes/Passes.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Parser/Parser.h"
#include "llvm/ADT/Hashing.h"

#include <string>

using namespace mlir;
using ap::fuzz::runPipeline;

/// The qwen3.5-0.8b training step is about 1 MiB of text and takes seconds
/// per pipeline under the sanitizers; the tiny models' steps are a few tens
/// of KiB. 256 KiB keeps every input well inside the per-input timeout.
static constexpr size_t kMaxIrBytes = 256 * 1024;
/// Steps with more ops skip train-plan-budget (see fuzzTrainStep).
static constexpr int64_t kMaxPlanBudgetOps = 200;

namespace {

struct Variant {
  const char *placement;  // train-placement-pipeline options
  const char *planBudget; // train-plan-budget goal
  const char *lowering;   // convert-train-to-exec options
  const char *planMemory; // exec-plan-memory options
  const char *schedule;   // exec-schedule-streams options
};

/// Option sets the lit tests use, one per input (by hash). Module names that
/// a model lacks are warnings, so every set applies to every model.
const Variant kVariants[] = {
    {"offload-modules=gdn_core_attn,core_attn recompute-modules=gdn_norm_out "
     "hide-rule=off report=true",
     "activation-cut=0.5", "gemm-workspace-bytes=0", "", ""},
    {"offload-modules=gdn_core_attn,core_attn,attn_proj "
     "recompute-modules=gdn_norm_out hide-rule=off max-inflight=1 "
     "fuse-recompute=false report=true report-format=json",
     "step-budget=0.03", "", "print-plan=true", ""},
    {"recompute-modules=gdn_in_proj,mlp_fc1,mla_up_proj recompute-stream=side "
     "report=true",
     "memory-budget=1MiB", "gemm-workspace-bytes=4096", "", "remarks=true"},
    {"offload-modules=mlp,layernorm hide-rule=off prefetch-depth=1 "
     "fraction=0.5",
     "activation-cut=1", "", "print-plan=true", "remarks=true"},
};

std::string execPipeline(const Variant &v) {
  return std::string("exec-plan-memory{") + v.planMemory +
         "},exec-schedule-streams{" + v.schedule + "},exec-defer-side-issue";
}

/// Prints `module` and parses the text again.
void roundTrip(ModuleOp module, llvm::StringRef what) {
  std::string text;
  llvm::raw_string_ostream os(text);
  module.print(os);
  ParserConfig config(module.getContext());
  if (!parseSourceString<ModuleOp>(text, config))
    ap::fuzz::fuzzFailure(llvm::Twine("the printed ") + what +
                          " does not parse again");
}

OwningOpRef<ModuleOp> cloneOf(ModuleOp module) {
  return OwningOpRef<ModuleOp>(module.clone());
}

void fuzzExec(ModuleOp module, const Variant &v) {
  if (runPipeline(module, execPipeline(v)))
    roundTrip(module, "planned exec module");
}

/// The placement pipeline, the memory timeline of the placed step, then the
/// lowering and the exec passes.
void fuzzPlacedStep(ModuleOp module, const Variant &v) {
  if (!runPipeline(module, std::string("train-placement-pipeline{") +
                               v.placement + "},train-print-memory-timeline"))
    return;
  roundTrip(module, "placed step");
  if (runPipeline(module, std::string("convert-train-to-exec{") + v.lowering +
                              "}," + execPipeline(v)))
    roundTrip(module, "lowered exec module");
}

void fuzzTrainStep(ModuleOp module, const Variant &v) {
  OwningOpRef<ModuleOp> analysed = cloneOf(module);
  runPipeline(*analysed, "train-print-saved-activations,"
                         "train-print-memory-timeline{per-op=true}");

  // The search places and predicts the step dozens of times: tens of
  // seconds for the tiny models' steps under the sanitizers, so only small
  // steps (the hand-written test inputs and what mutation makes of them)
  // get it.
  int64_t ops = 0;
  module.walk([&](Operation *) { ++ops; });
  if (ops <= kMaxPlanBudgetOps) {
    OwningOpRef<ModuleOp> budgeted = cloneOf(module);
    if (runPipeline(*budgeted, std::string("train-plan-budget{") +
                                   v.planBudget +
                                   " log-file=},train-print-memory-timeline"))
      roundTrip(*budgeted, "step train-plan-budget placed");
  }
  fuzzPlacedStep(module, v);
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  ap::fuzz::silenceStdout();
  ap::registerAllActplacePasses();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > kMaxIrBytes)
    return -1; // not added to the corpus
  std::string text = ap::fuzz::inputText(data, size);
  ap::fuzz::FuzzContext fctx;
  MLIRContext &ctx = fctx.get();
  // The parser verifies what it built; an input that does not verify ends
  // here, with the verifier's diagnostic.
  ParserConfig config(&ctx);
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(text, config);
  if (!module)
    return 0;
  roundTrip(*module, "input");

  const Variant &v = kVariants[llvm::hash_value(text) %
                               (sizeof(kVariants) / sizeof(kVariants[0]))];
  if (!module->getOps<ap::exec::StepOp>().empty()) {
    fuzzExec(*module, v);
    return 0;
  }
  if (!module->lookupSymbol("train_step")) {
    if (!module->lookupSymbol("forward"))
      return 0;
    runPipeline(*module, "train-print-summary");
    if (!runPipeline(*module, "train-autodiff"))
      return 0;
    roundTrip(*module, "differentiated step");
  }
  fuzzTrainStep(*module, v);
  return 0;
}
