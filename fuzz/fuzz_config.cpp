//===- fuzz_config.cpp - libFuzzer target: model config JSON -> graph -----===//
//
// What actplace-import does with a config, from the JSON text to a verified
// and printed module: parseModelConfig (every field check), then
// buildForwardGraph with the importer's default training shape. A config the
// parser rejects is fine; a config it accepts must give a graph that
// verifies (GraphBuilder.h: anything else is an importer bug).
//
// Seeds: models/*.json and the configs of test/tools/actplace-import
// (tools/scripts/fuzz.sh builds the corpus). Dictionary: fuzz/config.dict.
//
//===----------------------------------------------------------------------===//

#include "FuzzCommon.h"

#include "import/GraphBuilder.h"
#include "import/ModelConfig.h"

#include "mlir/IR/BuiltinOps.h"

/// Real configs are a few KiB; 64 KiB leaves room for long layer lists and
/// deep nesting while keeping each run short.
static constexpr size_t kMaxConfigBytes = 64 * 1024;

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  ap::fuzz::silenceStdout();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > kMaxConfigBytes)
    return -1; // not added to the corpus
  std::string text = ap::fuzz::inputText(data, size);
  llvm::Expected<ap::import::ModelConfig> cfg =
      ap::import::parseModelConfig(text, "fuzz.json");
  if (!cfg) {
    std::string message = llvm::toString(cfg.takeError());
    if (ap::fuzz::verbose())
      llvm::errs() << message << "\n";
    return 0;
  }

  // actplace-import's defaults (--seq 4096 --micro-batch-size 1
  // --micro-batches 1 --dtype bf16 --loss-chunk-tokens 1024).
  ap::import::TrainShape shape;
  if (cfg->name.empty())
    shape.modelName = "fuzz";

  ap::fuzz::FuzzContext ctx;
  mlir::OwningOpRef<mlir::ModuleOp> module =
      ap::import::buildForwardGraph(ctx.get(), *cfg, shape);
  if (!module)
    ap::fuzz::fuzzFailure("parseModelConfig accepted the config but the "
                          "graph buildForwardGraph built does not verify");
  module->print(llvm::nulls());
  return 0;
}
