//===- TensorShapes.h - the tensor shapes train and exec ops accept -*- C++
//-*-===//
//
// One shape rule for every op of the train and exec dialects, checked once
// by an op trait instead of in each verifier: every tensor an op carries (its
// operands, results, region arguments and type attributes, including the
// tensors inside !train.host, !exec.buffer and !exec.host) has static
// dimensions of at least 1, an integer or float element type and a byte
// count of at most kMaxTensorBytes. The cost model, the memory timeline and
// the memory plans divide by dimensions and add byte counts; a graph the
// verifier accepts must never make them divide by zero or overflow.
//
// Header-only so that both dialect libraries use it without depending on
// each other.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_DIALECT_TRAIN_TENSORSHAPES_H
#define ACTPLACE_DIALECT_TRAIN_TENSORSHAPES_H

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/Operation.h"

#include <cstdint>
#include <optional>
#include <string>

namespace ap {

/// Largest tensor an op may carry, in bytes (256 TiB). Far beyond any device
/// or host memory, and small enough that the passes' sums and products of
/// byte counts (a step's live tensors, times microbatches, aligned up to
/// 256) stay far inside int64.
inline constexpr int64_t kMaxTensorBytes = int64_t(1) << 48;

/// Bytes of one element of `elementType` (bit width rounded up to bytes), or
/// nullopt for a type without a fixed width.
inline std::optional<int64_t> elementBytes(mlir::Type elementType) {
  if (!elementType.isIntOrFloat())
    return std::nullopt;
  return std::max<int64_t>(1, (elementType.getIntOrFloatBitWidth() + 7) / 8);
}

/// Checks one tensor against the rule above; `what` names where `op` holds
/// it ("operand #1").
inline mlir::LogicalResult verifyTensorShape(mlir::Operation *op,
                                             llvm::StringRef what,
                                             mlir::RankedTensorType tensor) {
  auto fail = [&]() -> mlir::InFlightDiagnostic {
    return op->emitOpError() << what << " ";
  };
  int64_t elements = 1;
  for (auto [d, size] : llvm::enumerate(tensor.getShape())) {
    if (mlir::ShapedType::isDynamic(size))
      return fail() << "dimension " << d << " is dynamic in " << tensor
                    << "; tensors need static dimensions";
    if (size < 1)
      return fail() << "dimension " << d << " is " << size << " in " << tensor
                    << "; every dimension must be at least 1";
    // The element count fits in int64 while it stays at most the byte limit.
    if (size > kMaxTensorBytes / elements)
      return fail() << "holds " << tensor << ", more than " << kMaxTensorBytes
                    << " bytes (dimension " << d << " is " << size << ")";
    elements *= size;
  }
  std::optional<int64_t> eltBytes = elementBytes(tensor.getElementType());
  if (!eltBytes)
    return fail() << "has element type " << tensor.getElementType()
                  << "; expected an integer or float element type";
  if (elements > kMaxTensorBytes / *eltBytes)
    return fail() << "holds " << tensor << ", more than " << kMaxTensorBytes
                  << " bytes (" << elements << " elements of " << *eltBytes
                  << " bytes)";
  return mlir::success();
}

/// Checks every tensor inside `type` (itself, or the tensor a wrapper type
/// such as !exec.buffer holds).
inline mlir::LogicalResult
verifyTensorsIn(mlir::Operation *op, llvm::StringRef what, mlir::Type type) {
  mlir::LogicalResult result = mlir::success();
  type.walk([&](mlir::RankedTensorType tensor) {
    if (succeeded(result))
      result = verifyTensorShape(op, what, tensor);
  });
  return result;
}

/// The whole rule for one op.
inline mlir::LogicalResult verifyTensorShapes(mlir::Operation *op) {
  for (auto [i, v] : llvm::enumerate(op->getOperands()))
    if (failed(
            verifyTensorsIn(op, "operand #" + std::to_string(i), v.getType())))
      return mlir::failure();
  for (auto [i, v] : llvm::enumerate(op->getResults()))
    if (failed(
            verifyTensorsIn(op, "result #" + std::to_string(i), v.getType())))
      return mlir::failure();
  for (auto [r, region] : llvm::enumerate(op->getRegions()))
    for (mlir::Block &block : region)
      for (auto [i, arg] : llvm::enumerate(block.getArguments()))
        if (failed(verifyTensorsIn(op,
                                   "region #" + std::to_string(r) +
                                       " argument #" + std::to_string(i),
                                   arg.getType())))
          return mlir::failure();
  for (mlir::NamedAttribute attr : op->getAttrs()) {
    mlir::LogicalResult result = mlir::success();
    std::string what = "attribute '" + attr.getName().str() + "'";
    attr.getValue().walk([&](mlir::Type type) {
      if (succeeded(result))
        if (auto tensor = mlir::dyn_cast<mlir::RankedTensorType>(type))
          result = verifyTensorShape(op, what, tensor);
    });
    if (failed(result))
      return mlir::failure();
  }
  return mlir::success();
}

/// The op trait (ODS: Train_TensorShapes, Exec_TensorShapes) every train and
/// exec op carries. Trait verifiers run before the op's own verifier, so
/// those may divide by any dimension.
template <typename ConcreteType>
class TensorShapes
    : public mlir::OpTrait::TraitBase<ConcreteType, TensorShapes> {
public:
  static mlir::LogicalResult verifyTrait(mlir::Operation *op) {
    return verifyTensorShapes(op);
  }
};

} // namespace ap

#endif // ACTPLACE_DIALECT_TRAIN_TENSORSHAPES_H
