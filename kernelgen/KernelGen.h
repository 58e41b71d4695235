//===- KernelGen.h - generated element-wise and row-wise kernels -*- C++
//-*-===//
//
// Builds MLIR for small groups of element-wise and row-wise ops (SwiGLU
// forward and backward, residual add, RMSNorm forward, the AdamW update) and
// lowers the same per-element code two ways (docs/kernelgen.md):
//   - host: scf loops -> LLVM dialect -> LLVM IR -> a native object or an
//     in-process JIT, one plain C function per kernel;
//   - GPU: one gpu.func per kernel (one thread per element; a warp per row
//     for the row-wise ops; a block per 32 columns for the RMSNorm weight
//     gradient) -> NVVM -> PTX (sm_90a).
//
// Numerics: every kernel performs, per element, the operations of the CPU
// reference kernel of the same op (kernels/reference/dense/dense_ref.cpp) in
// the same order and association, with no fast-math flags and no fused
// multiply-add, bf16 values widened exactly and rounded to nearest even with
// the reference's NaN rule. Reductions run in kernelgen's own fixed order,
// the same on host and GPU (so the two lowerings give the same bits), not the
// reference's sequential one:
//   - a row sum over j in [0, n): lane l of 32 adds the terms of j = l,
//     l + 32, ... in increasing j from 0; the 32 partials combine in a
//     butterfly, p[l] = p[l] + p[l ^ k] for k = 16, 8, 4, 2, 1 (every lane
//     ends with the same value);
//   - a column sum over rows r in [0, rows) (the norms' weight gradients):
//     per part p of R rows (rmsNormDwRowsPerPart), row group g of 8 adds the
//     terms of r = p R + g, + 8, ... in increasing r from 0, then q[g] =
//     q[g] + q[g + k] for g < k, k = 4, 2, 1; per column, group g of 32 adds
//     the parts g, g + 32, ... from 0, then the same halving with k = 16,
//     ..., 1; the result p[0] is added once to the main grad.
//
// The kernels' names, parameters and launch shapes: KernelAbi.h.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELGEN_KERNELGEN_H
#define ACTPLACE_KERNELGEN_KERNELGEN_H

#include "kernelgen/KernelAbi.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/Support/LLVM.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mlir {
class DialectRegistry;
class ExecutionEngine;
class MLIRContext;
} // namespace mlir

namespace ap::kernelgen {

/// Dialects the builders and both lowerings need, with the LLVM IR
/// translations (LLVM, NVVM, GPU) and the NVVM target attribute.
void registerKernelGenDialects(mlir::DialectRegistry &registry);

/// Host form: one func.func per spec (scf loops over memrefs made from the
/// raw pointers), before any lowering.
mlir::OwningOpRef<mlir::ModuleOp>
buildHostModule(mlir::MLIRContext &context, llvm::ArrayRef<GroupSpec> specs);
/// GPU form: one gpu.module "ap_kg" of gpu.func kernels, before lowering.
mlir::OwningOpRef<mlir::ModuleOp>
buildGpuModule(mlir::MLIRContext &context, llvm::ArrayRef<GroupSpec> specs);

/// Lowers a host module in place to the LLVM dialect.
mlir::LogicalResult lowerHostToLLVM(mlir::ModuleOp module);
/// The LLVM IR text of a lowered host module (for the generic x86-64 CPU the
/// reference kernels are built for).
mlir::FailureOr<std::string> hostLLVMIR(mlir::ModuleOp module);
/// A native relocatable object of a lowered host module, in memory.
mlir::FailureOr<std::string> hostObject(mlir::ModuleOp module);
/// A JIT of a lowered host module; look kernels up by kernelName.
mlir::FailureOr<std::unique_ptr<mlir::ExecutionEngine>>
jitHostModule(mlir::ModuleOp module);

struct GpuTarget {
  std::string chip = "sm_90a";
  std::string features = "+ptx80";
  /// CUDA toolkit root, for libdevice (the exp of silu); empty: $CUDA_HOME,
  /// then /usr/local/cuda.
  std::string toolkitPath;
};
/// The CUDA toolkit root holding nvvm/libdevice/libdevice.10.bc:
/// target.toolkitPath, else $CUDA_HOME, $CUDA_PATH, /usr/local/cuda; empty
/// when none does (the GPU lowering then fails).
std::string libdeviceToolkit(const GpuTarget &target);
/// Lowers a GPU module in place through NVVM to a gpu.binary holding PTX.
mlir::LogicalResult lowerGpuToBinary(mlir::ModuleOp module,
                                     const GpuTarget &target);
/// The PTX text of a module lowered by lowerGpuToBinary.
mlir::FailureOr<std::string> ptxOf(mlir::ModuleOp module);

/// For a training binary (codegen): the host kernels of `specs` lowered to
/// the LLVM dialect with their packed entries, printed as MLIR text (built in
/// a context of its own; only LLVM-dialect ops, parseable where the LLVM
/// dialect is loaded). Duplicated specs (same kernelName) are generated once.
/// On failure returns false and sets `error` (the diagnostics).
bool packedHostKernels(llvm::ArrayRef<GroupSpec> specs, std::string &mlirText,
                       std::string &error);
/// The PTX of `specs`' GPU entries (one module), built in a context of its
/// own. On failure returns false and sets `error`.
bool kernelsPtx(llvm::ArrayRef<GroupSpec> specs, const GpuTarget &target,
                std::string &ptx, std::string &error);

} // namespace ap::kernelgen

#endif // ACTPLACE_KERNELGEN_KERNELGEN_H
