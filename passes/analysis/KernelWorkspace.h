//===- KernelWorkspace.h - kernel scratch of train ops ----------*- C++ -*-===//
//
// The scratch memory the kernel running a train op asks for, as the kernel
// library's own workspace queries (kernels/workspace.cpp) state it: the
// compiler builds each query's args struct from the op's shapes and calls
// the same function the kernels check ctx.workspaceBytes against, so a plan
// and the kernels cannot disagree. The memory timeline (placement) and
// convert-train-to-exec (exec-plan-memory's workspace) both use it; the cost
// model predicts time only.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_KERNELWORKSPACE_H
#define ACTPLACE_PASSES_ANALYSIS_KERNELWORKSPACE_H

#include "kernels/kernels.h"

#include <cstdint>

namespace mlir {
class Operation;
} // namespace mlir

namespace ap::train {

/// Largest workspace a plan states. A shape the verifier accepts can ask
/// for more scratch than int64 holds (the attention backward's dS tiles grow
/// with T^2) and plans add workspaces to other byte counts; 2^56 bytes is
/// more than any device has, so the cap changes no placement decision.
constexpr int64_t kMaxKernelWorkspaceBytes = int64_t(1) << 56;

/// Scratch of the kernel that runs `op` on `backend`, from the kernel
/// library's queries: the chunked gated delta rule forward and backward
/// (gdnChunk{Forward,Backward}WorkspaceBytes), the attention backward
/// (attentionBackwardWorkspaceBytes) and the chunked LM head + cross-entropy
/// ops (lmHeadCrossEntropyChunkWorkspaceBytes: the chunk buffers, without
/// the shared GEMM workspace, which exec plans once as gemm-workspace-bytes).
/// 0 for every other op. Capped at kMaxKernelWorkspaceBytes; a shape whose
/// sizes do not fit the kernel's args struct (a head count or head dim
/// beyond int32, which no kernel takes) gets the cap.
int64_t kernelWorkspaceBytes(mlir::Operation *op, ap::kernels::Backend backend);

/// The backend memory plans are made for: the CUDA kernels' scratch. The
/// host kernels need none, so a plan with the CUDA figures is valid on both
/// backends; only the GEMM workspace follows the target
/// (convert-train-to-exec's gemm-workspace-bytes).
constexpr ap::kernels::Backend kPlannedBackend = ap::kernels::Backend::Cuda;

} // namespace ap::train

#endif // ACTPLACE_PASSES_ANALYSIS_KERNELWORKSPACE_H
