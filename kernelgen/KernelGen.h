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
//   - a column sum over rows r in [0, rows) (the RMSNorm weight gradient):
//     group g of 32 adds the terms of r = g, g + 32, ... in increasing r from
//     0; then p[g] = p[g] + p[g + k] for g < k, k = 16, 8, 4, 2, 1; the
//     result p[0] is added once to the main grad.
//
// Kernel ABI (host C function and GPU entry take the same parameters, in this
// order; pointers are raw element pointers, strides are in elements, with no
// "0 means contiguous" rule: the caller passes the real stride):
//   swiglu_fwd   (gate, up, y, rows, cols, gateStride, upStride, yStride)
//   swiglu_bwd   (gate, up, dy, dgate, dup, [y,] rows, cols, gateStride,
//                 upStride, dyStride, dgateStride, dupStride, [yStride])
//   residual_add (a, b, y, n)
//   rmsnorm_fwd  (x, w, y, [rstd,] rows, dim, xStride, yStride, eps:f32)
//   rmsnorm_bwd  (x, w, rstd, dy, dx, [dw,] [y,] rows, dim, xStride,
//                 dyStride, dxStride, [yStride])
//   add_rmsnorm_fwd (a, b, h, w, y, [rstd,] rows, dim, eps: f32): h = a + b
//                 and y = rmsnorm(h), all [rows, dim] contiguous
//   adamw        (master, expAvg, expAvgSq, grad, clipCoef, [computeCopy,] n,
//                 stepSize, bc2Sqrt, decay, beta1, beta2, eps: f32)
//   sigmoid_gate_fwd (o, gate, y, rows, cols, oStride, gateStride, yStride)
//   sigmoid_gate_bwd (o, gate, dy, dout, dgate, rows, cols, oStride,
//                 gateStride, dyStride, doStride, dgateStride)
// Integers are int64_t; bracketed parameters exist only when the spec asks
// for that output. clipCoef may be null (coefficient 1). GPU launch (per
// entry, gpuEntries): grid = ceil(work * threadsPerItem / blockSize) blocks
// of blockSize threads, where work is rows*cols (swiglu, sigmoid_gate), n
// (residual_add, adamw; one thread per item, blocks of kBlockSize), rows
// (rmsnorm_fwd, add_rmsnorm_fwd, the rmsnorm_bwd row kernel: a warp of 32
// threads per row, blocks of kBlockSize) or dim (the rmsnorm_bwd dw kernel:
// 32 threads per column, blocks of 1024 = 32 columns x 32 row groups).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELGEN_KERNELGEN_H
#define ACTPLACE_KERNELGEN_KERNELGEN_H

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

/// Threads per block of every generated GPU kernel.
constexpr int64_t kBlockSize = 256;

enum class GroupKind {
  SwiGluForward,
  SwiGluBackward,
  ResidualAdd,
  RmsNormForward,
  RmsNormBackward,
  /// Residual add then RMSNorm forward of its output, in one kernel.
  AddRmsNormForward,
  AdamW,
  /// Sigmoid output gate y = o * sigmoid(gate), and its backward.
  SigmoidGateForward,
  SigmoidGateBackward,
};

/// Storage element types of the generated kernels (math is always f32).
enum class ElemType { BF16, F32 };

/// One kernel to generate: an op group and its static choices (which outputs
/// exist, storage types), fixed at generation time so the kernel has no
/// run-time branches on them.
struct GroupSpec {
  GroupKind kind = GroupKind::SwiGluForward;
  /// Storage type of activations (swiglu, residual add, rmsnorm) and of the
  /// AdamW main grad.
  ElemType dtype = ElemType::BF16;
  /// SwiGluBackward, RmsNormBackward: also write the recomputed forward
  /// output y.
  bool recomputeY = false;
  /// RmsNorm*, AddRmsNormForward: y = x * rstd * (1 + w) (true) or
  /// x * rstd * w.
  bool zeroCentered = true;
  /// RmsNormBackward: also accumulate the weight gradient into dw [dim]
  /// (f32 main grad, +=).
  bool accumulateDw = true;
  /// RmsNormForward, AddRmsNormForward: also write rstd [rows] (f32).
  bool writeRstd = true;
  /// AdamW: write the compute copy of this storage type; nullopt: none.
  std::optional<ElemType> computeCopy = ElemType::BF16;
};

/// The symbol of the kernel for `spec`, e.g. "ap_kg_swiglu_fwd_bf16".
std::string kernelName(const GroupSpec &spec);

/// The GPU entries of `spec`, in launch order: the kernel name, except for
/// RmsNormBackward, whose row phase (dx, y: "<name>_rows", a warp per row)
/// and column phase (dw: "<name>_dw", 32 row groups per column) are two
/// kernels. The host function runs the phases in the same order.
std::vector<std::string> gpuKernelNames(const GroupSpec &spec);

/// Parses a group name of the tool (swiglu-fwd, swiglu-bwd, residual-add,
/// rmsnorm-fwd, rmsnorm-bwd, add-rmsnorm-fwd, adamw); nullopt when unknown.
std::optional<GroupKind> parseGroupKind(llvm::StringRef name);
/// The names parseGroupKind accepts, for error messages.
const char *groupKindNames();

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

/// One parameter of a kernel's ABI (the list above): its name and kind,
/// 'p' a pointer, 'l' an int64_t, 'f' a float.
struct KernelParam {
  std::string name;
  char kind;
};
std::vector<KernelParam> kernelParams(const GroupSpec &spec);

/// Lanes of a row-wise kernel's warp and row groups of a column sum (the
/// fixed reduction order above).
constexpr int64_t kLanes = 32;

/// A GPU entry of `spec` (gpuKernelNames order) and its launch: work is the
/// product of the int64 parameters at `workParams` (indices into
/// kernelParams), each item takes threadsPerItem threads, launched as
/// ceil(work * threadsPerItem / blockSize) blocks of blockSize threads.
struct GpuEntry {
  std::string name;
  std::vector<int> workParams;
  int threadsPerItem = 1;
  int blockSize = int(kBlockSize);
};
std::vector<GpuEntry> gpuEntries(const GroupSpec &spec);

/// The host function a binary calls: `<kernelName>_packed(void **params)`,
/// params[i] pointing at parameter i of kernelParams (the calling convention
/// of cuLaunchKernel's kernelParams, so host and GPU launches take one
/// argument array).
std::string packedName(const GroupSpec &spec);

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

/// The f32 scalars of one AdamW step, computed exactly as the reference
/// kernel computes them (in double, then rounded to float).
struct AdamWScalars {
  float stepSize, bc2Sqrt, decay, beta1, beta2, eps;
};
AdamWScalars adamWScalars(double lr, double beta1, double beta2, double eps,
                          double weightDecay, int64_t step);

} // namespace ap::kernelgen

#endif // ACTPLACE_KERNELGEN_KERNELGEN_H
