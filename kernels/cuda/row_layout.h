//===- row_layout.h - lane layout of the row-wise norm kernels --*- C++ -*-===//
//
// Host-side shape rules of the register-tiled row kernels (rowwise.cuh):
// which lanes hold which columns of a row, and how many rows a block folds
// into one weight-gradient partial. Plain C++ so that the workspace queries of
// the reference library (compiled without CUDA) size the partials exactly as
// the kernels write them. Everything here is a function of the shape alone,
// so the reduction order never depends on the device, the pointers or timing.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_CUDA_ROW_LAYOUT_H
#define ACTPLACE_KERNELS_CUDA_ROW_LAYOUT_H

#include <algorithm>
#include <cstdint>

namespace ap::kernels::rowwise {

/// Widest row the register-tiled kernels hold (4 vectors of 8 per lane);
/// wider rows take the one-warp-per-row kernels.
constexpr int64_t kMaxDim = 1024;
/// Warps per block of every row kernel.
constexpr int kWarps = 8;
/// Blocks (and so weight-gradient partials) at most per reduction: enough to
/// fill 132 SMs several times over, few enough that the partials stay a small
/// fraction of the traffic.
constexpr int64_t kMaxPartials = 1024;

/// A row of `dim` elements is cut into 8-element vectors; `lanes` lanes (a
/// power of two dividing 32) share one row, each holding `vecs` vectors:
/// lane l of the group holds vectors l, l + lanes, ... Rows narrower than a
/// warp's worth of vectors share the warp (32 / lanes rows per warp).
struct Layout {
  int lanes = 32, vecs = 1;
};
inline Layout layout(int64_t dim) {
  int64_t nv = (dim + 7) / 8;
  if (nv <= 4)
    return {4, 1};
  if (nv <= 8)
    return {8, 1};
  if (nv <= 16)
    return {16, 1};
  if (nv <= 32)
    return {32, 1};
  return {32, nv <= 64 ? 2 : 4};
}

/// Rows a block covers in one pass of its warps.
inline int64_t rowsPerPass(int64_t dim) {
  return int64_t(kWarps) * (32 / layout(dim).lanes);
}
/// Passes per block of a reduction over `rows` rows: about 16 rows per
/// partial for short inputs, at most kMaxPartials partials for long ones.
/// (Measured on the H200: 8 rows per partial, or two passes' loads issued
/// before computing, were slower at the model shapes they changed.)
inline int64_t passesPerBlock(int64_t rows, int64_t dim) {
  int64_t perPass = rowsPerPass(dim);
  int64_t target = std::clamp<int64_t>(rows / 16, 1, kMaxPartials);
  return std::max<int64_t>(1,
                           (rows + perPass * target - 1) / (perPass * target));
}
/// Blocks of a reduction, one partial each.
inline int64_t partials(int64_t rows, int64_t dim) {
  int64_t rowsPerBlock = rowsPerPass(dim) * passesPerBlock(rows, dim);
  return (rows + rowsPerBlock - 1) / rowsPerBlock;
}

} // namespace ap::kernels::rowwise

#endif // ACTPLACE_KERNELS_CUDA_ROW_LAYOUT_H
