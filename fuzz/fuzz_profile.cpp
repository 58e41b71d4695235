//===- fuzz_profile.cpp - libFuzzer target: JSON device profile -----------===//
//
// The device-profile parser (DeviceProfile::parse, what every `profile=`
// option and actplace-compile --profile read) and, for a profile it accepts,
// the predictions that use it: the memory timeline, the placement passes
// (hide rule, prefetch anchors and side-stream recompute all read the cost
// model; the report prices the main-grad all-reduces of three data-parallel
// ranks) and the lowering's copy-completion prediction, on the training step
// of models/tiny-hybrid.json (seq 64, 2 microbatches), built once. Every
// pass that succeeds must leave IR that verifies. train-plan-budget is left
// out: its search evaluates thousands of placements of that step (over ten
// seconds even without the sanitizers); fuzz_ir runs it on small steps.
//
// Seeds: bench/profiles/*.json and the profiles embedded in test/ (split-file
// sections); tools/scripts/fuzz.sh builds the corpus. Dictionary:
// fuzz/profile.dict.
//
//===----------------------------------------------------------------------===//

#include "FuzzCommon.h"

#include "import/GraphBuilder.h"
#include "import/ModelConfig.h"
#include "passes/Passes.h"
#include "passes/analysis/CostModel.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

using namespace mlir;
using ap::fuzz::runPipeline;

/// Profiles are a few KiB; the bound leaves room for long opScale tables.
static constexpr size_t kMaxProfileBytes = 64 * 1024;

namespace {

/// The passes read a profile from a file; one per process (libFuzzer's
/// -fork and -jobs workers are processes).
std::string profilePath;
void removeProfile() { llvm::sys::fs::remove(profilePath); }

/// The differentiated tiny-hybrid step, built once: each input runs its
/// pipelines on clones, so no input sees another's changes.
ModuleOp step;

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  ap::fuzz::silenceStdout();
  ap::registerAllActplacePasses();
  llvm::SmallString<128> path;
  if (std::error_code ec = llvm::sys::fs::createTemporaryFile(
          "actplace-fuzz-profile", "json", path)) {
    llvm::errs() << "fuzz_profile: cannot create a temporary file: "
                 << ec.message() << "\n";
    std::exit(1);
  }
  profilePath = path.str().str();
  std::atexit(removeProfile);

  auto cfg = ap::import::loadModelConfig(ACTPLACE_FUZZ_PROFILE_MODEL);
  if (!cfg) {
    llvm::errs() << "fuzz_profile: " << llvm::toString(cfg.takeError()) << "\n";
    std::exit(1);
  }
  ap::import::TrainShape shape;
  shape.seqLen = 64;
  shape.microBatches = 2;
  // Leaked on purpose: the step lives as long as the process.
  static auto *fctx = new ap::fuzz::FuzzContext;
  OwningOpRef<ModuleOp> module =
      ap::import::buildForwardGraph(fctx->get(), *cfg, shape);
  if (!module || !runPipeline(*module, "train-autodiff")) {
    llvm::errs() << "fuzz_profile: cannot build the training step of "
                 << ACTPLACE_FUZZ_PROFILE_MODEL << "\n";
    std::exit(1);
  }
  step = module.release();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > kMaxProfileBytes)
    return -1; // not added to the corpus
  std::string text = ap::fuzz::inputText(data, size);
  llvm::Expected<ap::train::DeviceProfile> profile =
      ap::train::DeviceProfile::parse(text, "fuzz.json");
  if (!profile) {
    std::string message = llvm::toString(profile.takeError());
    if (ap::fuzz::verbose())
      llvm::errs() << message << "\n";
    return 0;
  }

  {
    std::error_code ec;
    llvm::raw_fd_ostream out(profilePath, ec);
    if (ec)
      ap::fuzz::fuzzFailure("cannot write " + profilePath);
    out << text;
  }
  std::string p = " profile=" + profilePath;

  OwningOpRef<ModuleOp> placed(step.clone());
  runPipeline(
      *placed,
      "train-print-memory-timeline{per-op=true" + p +
          "},train-placement-pipeline{offload-modules=gdn_core_attn,core_attn "
          "recompute-modules=gdn_norm_out recompute-stream=side report=true "
          "data-parallel-size=3 grad-bucket-bytes=4096" +
          p + "},train-print-memory-timeline{" + p +
          "},convert-train-to-exec{" + p +
          "},exec-plan-memory,exec-schedule-streams,exec-defer-side-issue");
  return 0;
}
