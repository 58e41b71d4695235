//===- actplace-import.cpp - model config JSON -> train graph -------------===//
//
// Reads a model config (HF-style fields, flat or the Qwen3.5 nested layout)
// and training shape options, and writes the forward graph of one microbatch
// in the train dialect.
//
//===----------------------------------------------------------------------===//

#include "import/GraphBuilder.h"
#include "import/ModelConfig.h"

#include "dialect/train/ModuleNames.h"
#include "dialect/train/TrainDialect.h"
#include "support/ToolVersion.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

namespace cl = llvm::cl;

static cl::OptionCategory category("actplace-import options");
static cl::opt<std::string> inputPath(cl::Positional,
                                      cl::desc("<model config .json>"),
                                      cl::cat(category));
static cl::opt<std::string> outputPath("o",
                                       cl::desc("Output file (default stdout)"),
                                       cl::value_desc("file"), cl::init("-"),
                                       cl::cat(category));
static cl::opt<int64_t> seqLen("seq",
                               cl::desc("Tokens per sequence (default 4096)"),
                               cl::init(4096), cl::cat(category));
static cl::opt<int64_t>
    microBatchSize("micro-batch-size",
                   cl::desc("Sequences per microbatch (default 1)"),
                   cl::init(1), cl::cat(category));
static cl::opt<int64_t>
    microBatches("micro-batches",
                 cl::desc("Microbatches per training step (default 1); "
                          "recorded as train.micro_batches"),
                 cl::init(1), cl::cat(category));
static cl::opt<std::string>
    dtype("dtype",
          cl::desc("Compute dtype of parameters and activations: "
                   "bf16 (default) or f32"),
          cl::init("bf16"), cl::cat(category));
static cl::opt<int64_t>
    lossChunkTokens("loss-chunk-tokens",
                    cl::desc("Tokens per LM-head/cross-entropy chunk "
                             "(default 1024)"),
                    cl::init(1024), cl::cat(category));
static cl::list<std::string>
    freeze("freeze",
           cl::desc("Freeze parameters whose name starts with this "
                    "prefix (repeatable, or comma-separated)"),
           cl::CommaSeparated, cl::cat(category));
static cl::opt<std::string>
    modelName("model-name", cl::desc("Model name recorded in the graph"),
              cl::init(""), cl::cat(category));
static cl::opt<int64_t> documentSeparator(
    "document-separator",
    cl::desc("Packed sequences: the token id that ends each document in the "
             "data; the GDN state, short conv, RoPE positions and attention "
             "restart after it (default -1: one sequence per row)"),
    cl::init(-1), cl::cat(category));
static cl::opt<int64_t> tensorParallel(
    "tensor-parallel",
    cl::desc("Build one rank's part of the model for this many "
             "tensor-parallel ranks (default 1: the whole model)"),
    cl::init(1), cl::cat(category));
static cl::opt<bool> sequenceParallel(
    "sequence-parallel",
    cl::desc("With --tensor-parallel: split the residual stream between the "
             "tensor-parallel regions over the ranks by tokens"),
    cl::init(false), cl::cat(category));

static cl::opt<bool> listModules(
    "list-modules",
    cl::desc("Print the module names placement options accept, one per "
             "line, and exit: '<leaf> leaf <kind>' for each leaf, then "
             "'<alias> alias <leaf>,<leaf>,...' for each alias (no model "
             "config is read)"),
    cl::init(false), cl::cat(category));

static int fail(const llvm::Twine &message) {
  llvm::WithColor::error(llvm::errs(), "actplace-import") << message << "\n";
  return 1;
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  ap::setToolVersionPrinter("actplace-import");
  cl::HideUnrelatedOptions(category);
  cl::ParseCommandLineOptions(
      argc, argv,
      "actplace-import: model config JSON -> train dialect forward graph\n\n"
      "  actplace-import models/qwen3.5-0.8b.json --seq 4096 --micro-batches 4 "
      "-o qwen.mlir\n");

  // The compiler's own table, printed for scripts (the benchmark harness)
  // that name modules and must not keep a copy of it.
  if (listModules) {
    if (!inputPath.empty())
      return fail("--list-modules reads no model config, got '" + inputPath +
                  "'");
    for (const ap::train::ModuleLeaf &leaf : ap::train::moduleLeaves())
      llvm::outs() << leaf.name << " leaf "
                   << ap::train::leafKindName(leaf.kind) << "\n";
    for (llvm::StringRef alias : ap::train::moduleAliasNames()) {
      llvm::SmallVector<llvm::StringRef> leaves;
      ap::train::expandModuleName(alias, leaves);
      llvm::outs() << alias << " alias " << llvm::join(leaves, ",") << "\n";
    }
    return 0;
  }
  if (inputPath.empty())
    return fail("no model config given (usage: actplace-import <model "
                "config .json> [options], or --list-modules)");

  ap::import::TrainShape shape;
  shape.seqLen = seqLen;
  shape.microBatchSize = microBatchSize;
  shape.microBatches = microBatches;
  shape.dtype = dtype;
  shape.lossChunkTokens = lossChunkTokens;
  // The same shape limits as actplace-compile, checked before the config
  // is read so that a bad option is reported whatever the config holds.
  if (llvm::Error err = ap::import::checkTrainShape(shape))
    return fail(llvm::toString(std::move(err)));
  if (dtype != "bf16" && dtype != "f32")
    return fail("--dtype must be bf16 or f32, got '" + dtype + "'");

  llvm::Expected<ap::import::ModelConfig> cfg =
      ap::import::loadModelConfig(inputPath);
  if (!cfg)
    return fail(llvm::toString(cfg.takeError()));

  shape.tensorParallel = tensorParallel;
  shape.sequenceParallel = sequenceParallel;
  if (llvm::Error err = ap::import::checkTensorParallel(*cfg, shape))
    return fail(llvm::toString(std::move(err)));
  shape.documentSeparator = documentSeparator;
  if (llvm::Error err = ap::import::checkDocumentSeparator(*cfg, shape))
    return fail(llvm::toString(std::move(err)));
  shape.freezePrefixes.assign(freeze.begin(), freeze.end());
  shape.modelName = modelName;
  if (shape.modelName.empty() && cfg->name.empty())
    shape.modelName = llvm::sys::path::stem(inputPath).str();

  mlir::MLIRContext ctx;
  mlir::OwningOpRef<mlir::ModuleOp> module =
      ap::import::buildForwardGraph(ctx, *cfg, shape);
  if (!module)
    return fail("internal error: the imported graph of '" + inputPath +
                "' does not verify (diagnostics above); please report it");

  std::string error;
  std::unique_ptr<llvm::ToolOutputFile> out =
      mlir::openOutputFile(outputPath, &error);
  if (!out)
    return fail(error);
  module->print(out->os());
  out->os() << "\n";
  out->keep();
  return 0;
}
