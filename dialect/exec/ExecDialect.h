//===- ExecDialect.h - exec dialect -----------------------------*- C++ -*-===//
#ifndef ACTPLACE_DIALECT_EXEC_EXECDIALECT_H
#define ACTPLACE_DIALECT_EXEC_EXECDIALECT_H

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/DialectImplementation.h"

#include "dialect/exec/ExecDialect.h.inc"
#include "dialect/exec/ExecEnums.h.inc"

#define GET_TYPEDEF_CLASSES
#include "dialect/exec/ExecTypes.h.inc"

namespace ap::exec {
/// Every buffer and slot offset and size is a multiple of this
/// (docs/architecture.md section 4: results never depend on pointer values).
inline constexpr int64_t kAlignment = 256;

/// Largest buffer or slot offset (64 PiB): room for 256 buffers of the
/// largest tensor (ap::kMaxTensorBytes) while offset + bytes and the plan's
/// sums stay far inside int64.
inline constexpr int64_t kMaxOffsetBytes = int64_t(1) << 56;

/// `n` rounded up to kAlignment.
inline int64_t alignTo256(int64_t n) {
  return (n + kAlignment - 1) / kAlignment * kAlignment;
}

/// Bytes of a statically shaped tensor (element bit width / 8, at least 1).
int64_t tensorBytes(mlir::RankedTensorType type);

/// Step attributes exec-plan-memory writes.
inline constexpr llvm::StringLiteral kPersistentBytesAttr = "persistent_bytes";
inline constexpr llvm::StringLiteral kActivationBytesAttr = "activation_bytes";
inline constexpr llvm::StringLiteral kWorkspaceBytesAttr = "workspace_bytes";
/// The side stream's workspace region, after the compute one (absent: 0).
inline constexpr llvm::StringLiteral kSideWorkspaceBytesAttr =
    "side_workspace_bytes";
inline constexpr llvm::StringLiteral kArenaBytesAttr = "arena_bytes";
/// Side-stream GEMMs' share of the SMs in percent, from the device profile
/// the cost model predicted with (convert-train-to-exec writes it; the
/// emitter copies it into the program).
inline constexpr llvm::StringLiteral kSideSmPercentAttr = "side_sm_percent";
inline constexpr llvm::StringLiteral kPinnedBytesAttr = "pinned_bytes";
/// Data parallelism the step is planned for (convert-train-to-exec writes
/// them): the number of ranks (absent: 1) and "replicate" or "zero3"
/// (absent: replicate). The emitter copies them into the program.
inline constexpr llvm::StringLiteral kDataParallelSizeAttr =
    "data_parallel_size";
inline constexpr llvm::StringLiteral kDataParallelModeAttr = "data_parallel";
/// Tensor parallelism the step is planned for (convert-train-to-exec copies
/// the module's train.tensor_parallel): the ranks sharing each layer
/// (absent: 1); the size of the "tp" group its collectives run over.
inline constexpr llvm::StringLiteral kTensorParallelAttr = "tensor_parallel";
/// Which implementation the element-wise and row-wise kernels of the step
/// get: "library" (absent: the kernel library's) or "generated" (kernelgen's
/// kernels where a group exists for the call, the library's elsewhere).
/// actplace-compile --kernels writes it; the emitter reads it.
inline constexpr llvm::StringLiteral kKernelsAttr = "kernels";
/// Which CUDA kernels the step's short convolutions (GDN's conv1d, forward
/// and backward) ask for: "staged" (kernels::GdnConvKernels::Staged, a
/// block's rows staged through shared memory) or "per-element" (absent: the
/// library's default). Every choice gives the same bits; the host backend
/// ignores it. actplace-compile --short-conv-kernels writes it; the emitter
/// sets GdnConvArgs::kernels from it.
inline constexpr llvm::StringLiteral kShortConvKernelsAttr =
    "short_conv_kernels";
/// exec-generate-kernels: with kernels = "generated", the train ops that
/// take generated kernels (absent: every op that has a group).
inline constexpr llvm::StringLiteral kGeneratedOpsAttr = "generated_ops";
/// exec-generate-kernels: residual add + RMSNorm pairs fused into one
/// generated kernel, and the bytes of h those kernels do not read back (one
/// pass over the step's text).
inline constexpr llvm::StringLiteral kFusedAddNormAttr = "fused_add_norm";
/// Kernels Triton compiled that implement train ops of the step
/// (actplace-compile --triton-kernel): an array of dictionaries
/// (codegen/TritonKernel.h), which the emitter launches instead of the
/// library's or kernelgen's kernel for every call of their op.
inline constexpr llvm::StringLiteral kTritonKernelsAttr = "triton_kernels";
inline constexpr llvm::StringLiteral kFusedSavedBytesAttr = "fused_saved_bytes";
/// exec.step: RMSNorm backward + residual add pairs exec-generate-kernels
/// fused (train.rms_norm_grad_add), and the bytes of dx they neither write
/// nor read back in one pass over the step's text.
inline constexpr llvm::StringLiteral kFusedNormGradAddAttr =
    "fused_norm_grad_add";
inline constexpr llvm::StringLiteral kFusedNormGradSavedBytesAttr =
    "fused_norm_grad_saved_bytes";
/// exec.step: chains of residual adds exec-generate-kernels fused into the
/// RMSNorm backward that reads their sum as dy (train.rms_norm_grad_sum, or
/// the addends of a train.rms_norm_grad_add), the adds those chains hold,
/// and the bytes of the intermediate sums they neither write nor read back
/// in one pass over the step's text.
inline constexpr llvm::StringLiteral kFusedDySumAttr = "fused_dy_sum";
inline constexpr llvm::StringLiteral kFusedDySumAddsAttr = "fused_dy_sum_adds";
inline constexpr llvm::StringLiteral kFusedDySumSavedBytesAttr =
    "fused_dy_sum_saved_bytes";
} // namespace ap::exec

#endif // ACTPLACE_DIALECT_EXEC_EXECDIALECT_H
