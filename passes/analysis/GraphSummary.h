//===- GraphSummary.h - what a train graph holds ------------------*- C++
//-*-===//
//
// Counts parameters, layers, scopes and ops of an imported forward graph. Used
// by train-print-summary (the README's first look at a model) and by tests
// that check an import produced the expected structure.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_GRAPHSUMMARY_H
#define ACTPLACE_PASSES_ANALYSIS_GRAPHSUMMARY_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <string>

namespace ap::train {

/// Bytes of a statically shaped tensor type (bf16 = 2, f32 = i32 = 4).
int64_t tensorBytes(mlir::Type type);

class GraphSummary {
public:
  explicit GraphSummary(mlir::ModuleOp module);

  void print(llvm::raw_ostream &os) const;

  std::string modelName;
  int64_t microBatches = 1;
  llvm::SmallVector<std::string> inputs;
  int64_t numParams = 0, numFrozenParams = 0;
  int64_t paramElements = 0, trainableElements = 0, paramBytes = 0;
  /// Layer index -> leaves in first-use order.
  std::map<int64_t, llvm::SmallVector<std::string>> leavesByLayer;
  /// Op name -> count, in first-seen order.
  llvm::MapVector<llvm::StringRef, int64_t> opCounts;
};

} // namespace ap::train

#endif // ACTPLACE_PASSES_ANALYSIS_GRAPHSUMMARY_H
