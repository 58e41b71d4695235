//===- GraphBuilder.h - model config -> train forward graph -------*- C++
//-*-===//
//
// Emits the forward graph of one microbatch in the train dialect: parameter
// declarations with HF checkpoint names, then `func.func @forward(tokens,
// labels) -> (loss_sum, token_count)` with every op in its module scope.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_IMPORT_GRAPHBUILDER_H
#define ACTPLACE_IMPORT_GRAPHBUILDER_H

#include "import/ModelConfig.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace ap::import {

struct TrainShape {
  int64_t seqLen = 4096;
  int64_t microBatchSize = 1;
  int64_t microBatches = 1;
  /// Compute dtype of parameters and activations: "bf16" or "f32".
  std::string dtype = "bf16";
  /// Tokens per chunk of the LM head + cross-entropy.
  int64_t lossChunkTokens = 1024;
  /// Parameters whose name starts with one of these are frozen.
  std::vector<std::string> freezePrefixes;
  /// Overrides the config's name in the module's train.model attribute.
  std::string modelName;
  /// Tensor-parallel ranks (Megatron-style, docs/parallelism.md): the graph
  /// is one rank's part of the model, its head and channel counts divided
  /// by this; 1 builds the whole model.
  int64_t tensorParallel = 1;
  /// With tensorParallel > 1: the residual stream between tensor-parallel
  /// regions, the norms there, the embedding and the loss run on this
  /// rank's 1/tensorParallel of the microbatch's tokens.
  bool sequenceParallel = false;
  /// Packed sequences: when >= 0, the token id that ends each document in
  /// the data (several documents per sequence); the GDN state, the short
  /// conv, RoPE positions and attention restart at every document
  /// (train.doc_starts). -1: every row is one sequence.
  int64_t documentSeparator = -1;
};

/// Builds the graph; returns null after emitting a diagnostic if the result
/// does not verify (an importer bug, never a user error).
mlir::OwningOpRef<mlir::ModuleOp> buildForwardGraph(mlir::MLIRContext &ctx,
                                                    const ModelConfig &cfg,
                                                    const TrainShape &shape);

/// The most tokens one step may hold: the step counts its tokens in an i32
/// (train.lm_head_cross_entropy's token_count) and the runtime keeps every
/// microbatch's ids in int32 vectors.
inline constexpr int64_t kMaxStepTokens = 2147483647;

/// Checks the training shape before a graph is built: --seq,
/// --micro-batch-size, --micro-batches and --loss-chunk-tokens positive,
/// the tokens of a step at most kMaxStepTokens. The message names the
/// option, the value and the limit.
llvm::Error checkTrainShape(const TrainShape &shape);

/// Checks that `shape.tensorParallel` divides what it splits in `cfg`
/// (attention q and kv heads, MLA heads, GDN key and value heads, the MLP
/// width); the message names the option and the config field.
/// The packed-sequence separator: -1 (none) or a token id of the vocabulary.
llvm::Error checkDocumentSeparator(const ModelConfig &cfg,
                                   const TrainShape &shape);

llvm::Error checkTensorParallel(const ModelConfig &cfg,
                                const TrainShape &shape);

} // namespace ap::import

#endif // ACTPLACE_IMPORT_GRAPHBUILDER_H
