//===- TrainDialect.h - train dialect -----------------------------*- C++
//-*-===//
#ifndef ACTPLACE_DIALECT_TRAIN_TRAINDIALECT_H
#define ACTPLACE_DIALECT_TRAIN_TRAINDIALECT_H

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/DialectImplementation.h"

#include "dialect/train/TrainDialect.h.inc"
#include "dialect/train/TrainEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "dialect/train/TrainAttrs.h.inc"

#include "mlir/IR/BuiltinTypes.h"
#define GET_TYPEDEF_CLASSES
#include "dialect/train/TrainTypes.h.inc"

namespace ap::train {
/// Module attribute: microbatches per training step.
inline constexpr llvm::StringLiteral kMicroBatchesAttrName =
    "train.micro_batches";
/// Module attribute: model name for reports.
inline constexpr llvm::StringLiteral kModelNameAttrName = "train.model";
/// Module attribute: a dictionary of strings, every model setting that
/// shapes what the model computes (its HF field name -> exact text). The
/// generated binary records it in each checkpoint; a resume under other
/// settings is refused naming the field.
inline constexpr llvm::StringLiteral kModelConfigAttrName =
    "train.model_config";
/// Module attributes of one pipeline stage (train-pipeline-stage): the
/// stage count, this stage (0-based) and its decoder layers [first, end).
inline constexpr llvm::StringLiteral kPipelineStagesAttrName =
    "train.pipeline_stages";
inline constexpr llvm::StringLiteral kPipelineStageAttrName =
    "train.pipeline_stage";
inline constexpr llvm::StringLiteral kPipelineLayersAttrName =
    "train.pipeline_layers";
/// Module attribute of a pipeline stage: the parameters (an array of
/// symbol names) another stage also holds (the tied embedding / LM head).
inline constexpr llvm::StringLiteral kPipelineTiedAttrName =
    "train.pipeline_tied";
/// Module attribute: the tensor-parallel size N (>= 1) the graph is one
/// rank's part of (train.param split, train.tp_copy / train.tp_reduce).
inline constexpr llvm::StringLiteral kTensorParallelAttrName =
    "train.tensor_parallel";
/// Module unit attribute (with train.tensor_parallel >= 2): the residual
/// stream between tensor-parallel regions is split over the ranks by
/// tokens (train.sp_gather / sp_scatter / sp_shard).
inline constexpr llvm::StringLiteral kSequenceParallelAttrName =
    "train.sequence_parallel";
/// Unit attribute on forward ops cloned into backward by train-recompute.
inline constexpr llvm::StringLiteral kRecomputedAttrName = "train.recomputed";
/// Unit attribute on recompute clones that train-recompute-stream issued
/// ahead: they run on the side stream.
inline constexpr llvm::StringLiteral kSideStreamAttrName = "train.side_stream";
/// Unit attribute on the backward op a side-stream run was issued before
/// (train-recompute-stream's anchor); exec.kernel carries it in its args, so
/// that exec-defer-side-issue can issue the run after that kernel.
inline constexpr llvm::StringLiteral kSideHostAttrName = "train.side_host";
/// Placement decisions per result of a forward op ("offload", "recompute",
/// "keep: <reason>", or "" when none was taken), for reports.
inline constexpr llvm::StringLiteral kPlacementAttrName = "train.placement";
/// On the microbatch loop: most D2H copies pending before compute waits.
inline constexpr llvm::StringLiteral kMaxInflightAttrName =
    "train.max_inflight";
/// The module's tensor-parallel size (1 without the attribute).
int64_t tensorParallelSize(mlir::Operation *op);
} // namespace ap::train

#endif // ACTPLACE_DIALECT_TRAIN_TRAINDIALECT_H
