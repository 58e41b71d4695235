//===- SavedActivations.h - values crossing forward -> backward ---*- C++
//-*-===//
//
// After train-autodiff, every activation the backward pass reads is an SSA
// value defined in the forward part of the microbatch body and used in its
// backward part. This analysis lists them with their producer, scope, bytes,
// forward definition point, first and last backward use, and the scopes whose
// backward needs them (docs/architecture.md section 4: a value is counted once
// and belongs to every scope that needs it).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_SAVEDACTIVATIONS_H
#define ACTPLACE_PASSES_ANALYSIS_SAVEDACTIVATIONS_H

#include "dialect/train/TrainOps.h"

#include "mlir/IR/Block.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"

#include <string>

namespace ap::train {

/// A module scope as placement options see it: decoder layer + leaf.
struct Scope {
  int64_t layer = -1;
  std::string leaf;

  static Scope of(mlir::Operation *op);
  /// "L3.gdn_core_attn", or "model.lm_head" for model-level leaves.
  std::string str() const;
  bool operator==(const Scope &o) const {
    return layer == o.layer && leaf == o.leaf;
  }
  bool operator<(const Scope &o) const {
    return layer != o.layer ? layer < o.layer : leaf < o.leaf;
  }
};

struct SavedActivation {
  mlir::Value value;
  /// Defining op (null for a block argument).
  mlir::Operation *producer = nullptr;
  Scope scope;
  int64_t bytes = 0;
  /// Positions in the body (0-based op index).
  int64_t defIndex = -1, firstUse = -1, lastUse = -1;
  /// Scopes of the backward ops that read it, sorted, unique.
  llvm::SmallVector<Scope> neededBy;
};

class SavedActivations {
public:
  /// Analyses the body of the module's microbatch loop. `valid()` is false
  /// (after a diagnostic) when there is none.
  explicit SavedActivations(mlir::ModuleOp module);
  explicit SavedActivations(mlir::Block &body);
  /// The body's order, op indices and backward start only; values() is
  /// empty. For passes that read no more (train-recompute,
  /// train-recompute-stream): listing the values walks every forward
  /// result's users, and the placement search runs those passes on
  /// thousands of clones.
  static SavedActivations orderOnly(mlir::ModuleOp module);

  bool valid() const { return body != nullptr; }
  mlir::Block *getBody() const { return body; }
  /// Index of the first backward op in the body.
  int64_t backwardStart() const { return bwdStart; }
  int64_t indexOf(mlir::Operation *op) const { return index.lookup(op); }
  llvm::ArrayRef<mlir::Operation *> ops() const { return order; }

  llvm::ArrayRef<SavedActivation> values() const { return saved; }
  int64_t totalBytes() const;

  /// True for ops train-autodiff created or placement put in backward:
  /// backward ops, their gradient sums and views, recomputed clones.
  static bool isBackwardOp(mlir::Operation *op);

  /// The body of the module's single microbatch loop, or null.
  static mlir::Block *findBody(mlir::ModuleOp module);
  /// The same, reporting on the module when there is none.
  static mlir::Block *findBodyOrEmitError(mlir::ModuleOp module);

private:
  SavedActivations() = default;
  void analyse(bool listValues = true);

  mlir::Block *body = nullptr;
  llvm::SmallVector<mlir::Operation *> order;
  llvm::DenseMap<mlir::Operation *, int64_t> index;
  int64_t bwdStart = 0;
  llvm::SmallVector<SavedActivation> saved;
};

} // namespace ap::train

#endif // ACTPLACE_PASSES_ANALYSIS_SAVEDACTIVATIONS_H
