//===- KernelSignatures.h - What each exec.kernel callee takes --*- C++ -*-===//
//
// exec.kernel names the train op it implements; this table says, per
// callee, how many input and output buffers the kernel takes (outputs are
// its results, then one accumulated main grad per `*_grad` symbol in `args`)
// and which `args` entries it needs, of which kind. The verifier checks
// every exec.kernel against it, so a call the runtime's kernels cannot take
// is an error at the op, naming what is wrong, not a failure at emission or
// at run time. The C++ emitter and a future LLVM lowering can then rely on
// the counts and kinds.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_DIALECT_EXEC_KERNELSIGNATURES_H
#define ACTPLACE_DIALECT_EXEC_KERNELSIGNATURES_H

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/Support/LogicalResult.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <functional>
#include <string>

namespace ap::exec {

/// The kind of one `args` entry.
enum class KernelArgKind : uint8_t {
  Int,    ///< an integer attribute
  Float,  ///< a float attribute
  Symbol, ///< a flat symbol reference (a parameter)
  Flag,   ///< a unit or bool attribute
};

struct KernelArgSpec {
  llvm::StringLiteral name;
  KernelArgKind kind;
  bool required;
};

/// One callee's buffers and arguments. `maxIns` / `maxResults` of -1: no
/// upper bound.
struct KernelSignature {
  llvm::StringLiteral callee;
  int minIns, maxIns;
  int minResults, maxResults;
  llvm::ArrayRef<KernelArgSpec> args;
};

/// The signature of `callee`, or null for a callee no kernel implements.
const KernelSignature *lookupKernelSignature(llvm::StringRef callee);

/// Every callee, for messages.
std::string knownKernelCallees();

/// Checks a call of `callee` with these buffer counts and `args` against the
/// table; on a mismatch reports through `error` (a message naming the
/// callee and what it expected) and fails.
mlir::LogicalResult
verifyKernelCall(llvm::StringRef callee, size_t numIns, size_t numOuts,
                 mlir::DictionaryAttr args,
                 llvm::function_ref<void(const llvm::Twine &)> error);

/// The number of `*_grad` symbol entries of `args`: the kernel's trailing
/// accumulated main-grad outputs.
unsigned numGradOutputs(mlir::DictionaryAttr args);

} // namespace ap::exec

#endif // ACTPLACE_DIALECT_EXEC_KERNELSIGNATURES_H
