//===- KernelAbi.h - kernelgen kernels: names, parameters, launches -*- C++
//-*-===//
//
// What a caller of kernelgen's kernels needs, with no MLIR: the op groups
// and their static choices (GroupSpec), each kernel's symbol, parameter
// list and GPU launch shape, and the AdamW scalars the host computes. The
// generators (KernelGen.h) build the kernels these describe; the runtime's
// tables (codegen) and the GPU test use only this.
//
// Kernel ABI (host C function and GPU entry take the same parameters, in this
// order; pointers are raw element pointers, strides are in elements, with no
// "0 means contiguous" rule: the caller passes the real stride):
//   swiglu_fwd   (gate, up, y, rows, cols, gateStride, upStride, yStride)
//   swiglu_bwd   (gate, up, dy, dgate, dup, [y,] rows, cols, gateStride,
//                 upStride, dyStride, dgateStride, dupStride, [yStride])
//   residual_add (a, b, y, n)
//   rmsnorm_fwd  (x, w, y, [rstd,] rows, dim, xStride, yStride, eps:f32)
//   rmsnorm_bwd  (x, w, rstd, dy, dx, [res,] [dw,] [y,] [dwPartial: workspace,]
//                 rows, dim, xStride, dyStride, dxStride, [yStride,]
//                 [dwParts, dwPartItems]); with dw: dwParts =
//                 rmsNormDwParts(rows), dwPartItems =
//                 rmsNormDwPartItems(rows, dim) and dwPartial
//                 rmsNormDwWorkspaceBytes(rows, dim) of scratch
//   add_rmsnorm_fwd (a, b, h, w, y, [rstd,] rows, dim, eps: f32): h = a + b
//                 and y = rmsnorm(h), all [rows, dim] contiguous
//   adamw        (master, expAvg, expAvgSq, grad, clipCoef, [computeCopy,] n,
//                 stepSize, bc2Sqrt, decay, beta1, beta2, eps: f32)
//   sigmoid_gate_fwd (o, gate, y, rows, cols, oStride, gateStride, yStride)
//   sigmoid_gate_bwd (o, gate, dy, dout, dgate, rows, cols, oStride,
//                 gateStride, dyStride, doStride, dgateStride)
//   l2norm_fwd   (x, y, rstd, rows, dim, eps: f32): per row (a token's
//                 head) y = x / sqrt(sum x^2 + eps), rstd that factor; all
//                 [rows, dim] contiguous
//   l2norm_bwd   (y, rstd, dy, dx, rows, dim): dx = rstd (dy - (dy . y) y)
//   gated_norm_fwd (x, z, w, y, rstd, rows, dim, eps: f32): per row (a
//                 token's head) y = w x rstd z sigmoid(z); all contiguous
//   gated_norm_bwd (x, z, w, rstd, dy, dx, dz, [dw,] [y,] [dwPartial:
//                 workspace,] rows, dim, [dwParts, dwPartItems]); dw as
//                 rmsnorm_bwd's
//   gdn_gates_fwd (a, b, aLog, dtBias, g, beta, rows, heads): a, b, beta
//                 [rows, heads] storage, g [rows, heads] f32, aLog and
//                 dtBias [heads] f32; all contiguous
//   gdn_gates_bwd (a, aLog, dtBias, beta, dg, dbeta, da, db, dALog,
//                 dDtBias, partial: workspace, rows, heads, parts): dg f32;
//                 dALog, dDtBias [heads] f32 +=; parts =
//                 rmsNormDwParts(rows), partial gdnGatesWorkspaceBytes
//   rope_fwd, rope_bwd (x, y, [docStart,] tokens, seq, heads, headDim,
//                 offset, rotaryDim, cols, thetaBits): x, y [tokens = batch x
//                 seq, heads, headDim] contiguous; docStart [batch, seq] i32
//                 (packed); cols = headDim - rotaryDim / 2 (the items of a
//                 token: rotary pairs and copied columns); thetaBits the bits
//                 of the f64 theta (an int64 slot)
// Integers are int64_t; bracketed parameters exist only when the spec asks
// for that output. clipCoef may be null (coefficient 1). GPU launch (per
// entry, gpuEntries): grid = ceil(work * threadsPerItem / blockSize) blocks
// of blockSize threads, where work is rows * ceil(cols / vector) (swiglu,
// sigmoid_gate: a thread per `vector` consecutive elements of a row),
// ceil(n / vector) (residual_add, adamw), ceil(rows / rowsPerWarp)
// (rmsnorm_fwd, add_rmsnorm_fwd, l2norm, gated_norm_fwd: a warp of 32
// threads per rowsPerWarp rows, blocks of kBlockSize), rows (a norm
// backward's row kernel without dw: a warp per row), dwParts (with dw: a
// block of 8 warps per part of rows, which also sums the part's dw
// partials up to kRowDwMaxDim columns), dwPartItems (the dw partial kernel
// for wider rows: 8 row groups per (part, column), blocks of 256 = 32
// columns x 8; 0 otherwise), dim (the dw kernel: 32 threads per column
// summing the parts, blocks of 1024 = 32 columns x 32 groups) or tokens
// (rope: a block of kBlockSize threads per token).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELGEN_KERNELABI_H
#define ACTPLACE_KERNELGEN_KERNELABI_H

#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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
  /// L2 norm of each head's vector (GDN's q and k), and its backward.
  L2NormForward,
  L2NormBackward,
  /// GDN's gated RMSNorm of each head's output, y = w x rstd z sigmoid(z),
  /// and its backward (dx, dz; optionally dw += and the recomputed y).
  GatedNormForward,
  GatedNormBackward,
  /// GDN's gates, beta = sigmoid(b) and g = -exp(A_log) softplus(a +
  /// dt_bias) per (token, head), and their backward (da, db; dA_log and
  /// dt_bias's gradient += their column sums over tokens).
  GdnGatesForward,
  GdnGatesBackward,
  /// Rotary position embedding (rotate-half pairs over rotaryDim dims from
  /// offset; the rest copied), and its backward (the rotation by -angle).
  RopeForward,
  RopeBackward,
  /// The global grad norm: per tensor the f64 sums of squares of its blocks
  /// of kGradNormBlock elements (GradNormSquares, storage dtype), then one
  /// running sum over all partials, the norm and the clip coefficient
  /// (GradNormFinish).
  GradNormSquares,
  GradNormFinish,
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
  /// RmsNormBackward: dx is a residual add's output, dx = round(dx) + res
  /// (the norm's gradient rounded to storage as it would be stored, then
  /// the add's f32 sum of the two widened values), res [rows, dim] with dx's
  /// row stride; the gradient itself is not stored.
  bool addResidual = false;
  /// RmsNormBackward: dy is the sum of this many addends (1 to
  /// kMaxDyAddends; pointers dy, dy1, dy2, dy3 with dy's row stride), as a
  /// chain of residual adds would store it: ((dy + dy1) rounded to storage
  /// + dy2) rounded, ..., each add the f32 sum of its two widened operands.
  /// The sums are formed where dy is read and never stored.
  int dyAddends = 1;
  /// RopeForward/Backward: positions restart at each packed document
  /// (the docStart operand, kernels/kernels.h).
  bool packed = false;
  /// AdamW: write the compute copy of this storage type; nullopt: none.
  std::optional<ElemType> computeCopy = ElemType::BF16;
  /// The row-wise groups with independent rows (RMSNorm and add + RMSNorm
  /// forward, the L2 norms, the gated norm forward): rows a GPU warp takes
  /// (1, 2 or 4; rowsPerWarpFor picks it from the row length). With more
  /// than one, rows of at most 4 / rowsPerWarp aligned chunks a lane are
  /// loaded together and kept in registers for both passes; a launch
  /// choice only: every row's arithmetic, and so its bits, is the same.
  int rowsPerWarp = 1;
  /// The same groups with rowsPerWarp 1: a row of at most kRowsPerWarp
  /// aligned chunks a lane is loaded once and kept in registers for both
  /// passes (kernel suffix _k) instead of read again for the second; a
  /// launch choice only, as rowsPerWarp. RmsNormBackward and
  /// GatedNormBackward with dw: a row of at most one aligned chunk a lane
  /// is loaded once, two rows of a warp at a time, and the warp's dw
  /// column partials stay in registers over its rows instead of shared
  /// memory (suffix _k; rowInRegistersFor picks it); the same additions in
  /// the same order, so the same bits.
  bool rowInRegisters = false;
};

/// Whether `kind` is one of the row-wise groups rowsPerWarp applies to.
bool hasRowsPerWarp(GroupKind kind);
/// The rowsPerWarp for rows of `dim` elements of `spec`'s kind and storage:
/// 4 where a row is one chunk a lane (rowChunkOf), 2 where it is two, 1
/// for wider rows (which then read a row twice, a chunk at a time; measured
/// faster than 4 chunks a lane in registers at Qwen3.5-0.8B's 1024) and for
/// the other kinds.
int rowsPerWarpFor(const GroupSpec &spec, int64_t dim);
/// Whether `spec` (a norm backward with dw) takes rows of `dim` elements
/// in registers (GroupSpec::rowInRegisters): where a row is at most one
/// chunk a lane (rowChunkOf). False for the other kinds, whose _k variant
/// code generation does not pick.
bool rowInRegistersFor(const GroupSpec &spec, int64_t dim);
/// Whether `kind` is a norm backward that rowInRegistersFor applies to.
bool hasDwRowInRegisters(GroupKind kind);

/// The symbol of the kernel for `spec`, e.g. "ap_kg_swiglu_fwd_bf16".
std::string kernelName(const GroupSpec &spec);

/// The GPU entries of `spec`, in launch order: the kernel name, except for
/// RmsNormBackward, whose row phase (dx, y: "<name>_rows", a warp per row)
/// and, with dw, the partial column sums over parts of the rows
/// ("<name>_dwpart") and the sum of the parts ("<name>_dw") are kernels of
/// their own. The host function runs the phases in the same order.
std::vector<std::string> gpuKernelNames(const GroupSpec &spec);

/// Parses a group name of the tool (swiglu-fwd, swiglu-bwd, residual-add,
/// rmsnorm-fwd, rmsnorm-bwd, add-rmsnorm-fwd, adamw); nullopt when unknown.
std::optional<GroupKind> parseGroupKind(llvm::StringRef name);
/// The names parseGroupKind accepts, for error messages.
const char *groupKindNames();

/// One parameter of a kernel's ABI (the list above): its name and kind,
/// 'p' a pointer, 'w' a pointer to kernel workspace (the launching stream's:
/// the runtime passes it), 'l' an int64_t, 'f' a float.
struct KernelParam {
  std::string name;
  char kind;
};
std::vector<KernelParam> kernelParams(const GroupSpec &spec);

/// Lanes of a row-wise kernel's warp and row groups of a column sum (the
/// fixed reduction order, KernelGen.h).
constexpr int64_t kLanes = 32;
/// Rotary pairs (rotaryDim / 2) whose cos and sin a GPU RoPE block keeps in
/// its shared table; more take the item-per-thread path.
constexpr int64_t kRopeMaxHalf = 256;
/// Tokens a GPU RoPE block takes (their tables at once; kBlockSize must be
/// a multiple of it).
constexpr int64_t kRopeTokensPerBlock = 4;
/// The most addends of a norm backward's dy (GroupSpec::dyAddends).
constexpr int kMaxDyAddends = 4;
/// The most rows a warp of a row-wise kernel takes (GroupSpec::rowsPerWarp)
/// and the most chunks a lane keeps in registers across them.
constexpr int64_t kRowsPerWarp = 4;

/// Row groups of the RMSNorm dw partial sums, and the rows of one part: the
/// dw of rows [p * R, (p + 1) * R), R = rmsNormDwRowsPerPart(rows), is one
/// partial per column (kDwGroups row groups, then a halving tree), and the
/// parts of a column meet in a second phase (kLanes groups, then a halving
/// tree). R is kDwPartRows (two rows a group) while that makes at most
/// kMaxDwParts parts, else the smallest multiple of kDwPartRows that does:
/// a function of the shape alone, so the order is too.
constexpr int64_t kDwGroups = 8;
constexpr int64_t kDwPartRows = 16;
constexpr int64_t kMaxDwParts = 1024;
/// The rows of one dw part over `rows` rows.
int64_t rmsNormDwRowsPerPart(int64_t rows);
/// The parts of an RMSNorm dw over `rows` (the dwParts parameter).
int64_t rmsNormDwParts(int64_t rows);
/// Widest row whose dw partials the GPU row kernel of an RMSNorm or gated
/// norm backward sums itself, in shared memory (kDwGroups x this many f32,
/// 32 KiB a block): it reads each row once for dx and dw. Wider rows leave
/// the partials to a kernel of their own, which reads the rows again.
constexpr int64_t kRowDwMaxDim = 1024;
/// The dwPartItems parameter of a norm backward with dw: the items of its
/// separate partial kernel, parts x dim when dim > kRowDwMaxDim, else 0
/// (the row kernel wrote the partials; the launch is skipped).
int64_t rmsNormDwPartItems(int64_t rows, int64_t dim);
/// The workspace of an RMSNorm backward with dw: one f32 per part and
/// column.
uint64_t rmsNormDwWorkspaceBytes(int64_t rows, int64_t dim);
/// The workspace of a GDN gates backward: the partial column sums of its
/// two gradients (dA_log's, then dt_bias's), each as an RMSNorm dw's over
/// `rows` tokens and `heads` columns.
uint64_t gdnGatesWorkspaceBytes(int64_t rows, int64_t heads);

/// The grad norm's blocking, the kernel library's (kernels/dense.h
/// GradNormArgs): a partial per block of kGradNormBlock elements, summed by
/// kGradNormThreads threads (thread t the elements t, t + kGradNormThreads,
/// ... of the block in increasing order, in f64), whose partials halve in a
/// tree (p[t] = p[t] + p[t + k] for t < k, k = kGradNormThreads / 2, ...,
/// 1).
constexpr int64_t kGradNormBlock = 65536;
constexpr int64_t kGradNormThreads = 256;
/// The partials of a tensor of n elements.
int64_t gradNormParts(int64_t n);

/// Elements of a row chunk in the row sums' order: lane l of kLanes owns
/// the chunks l, l + kLanes, ... of rowChunkOf consecutive elements
/// (Numerics in docs/kernelgen.md). 16 bytes of storage (8 bf16, 4 f32),
/// except the norms of GDN's heads (L2, gated): 4 elements, so that a
/// 128-wide head is one chunk per lane.
int64_t rowChunkOf(GroupKind kind, ElemType storage);

/// Elements per GPU thread of an element-wise group (16 bytes of its
/// widest storage: 8 bf16 or 4 f32), 1 for row-wise groups.
int64_t vectorOf(const GroupSpec &spec);

/// A GPU entry of `spec` (gpuKernelNames order) and its launch: work is the
/// product of the int64 parameters at `workParams` (indices into
/// kernelParams), the last rounded up to whole vectors of `vector`
/// elements; each item takes threadsPerItem threads, launched as
/// ceil(work * threadsPerItem / blockSize) blocks of blockSize threads.
struct GpuEntry {
  std::string name;
  std::vector<int> workParams;
  int threadsPerItem = 1;
  int blockSize = int(kBlockSize);
  int vector = 1;
};
std::vector<GpuEntry> gpuEntries(const GroupSpec &spec);
/// Blocks of entry `e` for the int64 parameter values `ints` (indexed like
/// kernelParams; other entries unused).
uint64_t gpuBlocks(const GpuEntry &e, const std::vector<int64_t> &ints);

/// The host function a binary calls: `<kernelName>_packed(void **params)`,
/// params[i] pointing at parameter i of kernelParams (the calling convention
/// of cuLaunchKernel's kernelParams, so host and GPU launches take one
/// argument array).
std::string packedName(const GroupSpec &spec);

/// The f32 scalars of one AdamW step, computed exactly as the reference
/// kernel computes them (in double, then rounded to float).
struct AdamWScalars {
  float stepSize, bc2Sqrt, decay, beta1, beta2, eps;
};
AdamWScalars adamWScalars(double lr, double beta1, double beta2, double eps,
                          double weightDecay, int64_t step);

} // namespace ap::kernelgen

#endif // ACTPLACE_KERNELGEN_KERNELABI_H
