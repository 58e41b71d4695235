//===- gdn_layout.h - workspace blocking of the GDN cuda kernels -*- C++
//-*-===//
//
// Host-side shape rules of the GDN cuda kernels that fix how much workspace
// they use: how many tokens or rows one weight-gradient partial covers. Plain
// C++, so that the workspace queries (kernels/workspace.cpp, built without
// CUDA and linked by the compiler too) size the partials exactly as the
// kernels write them.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_CUDA_GDN_GDN_LAYOUT_H
#define ACTPLACE_KERNELS_CUDA_GDN_GDN_LAYOUT_H

#include "kernels/cuda/row_layout.h"

#include <cstdint>

namespace ap::kernels::gdncuda {

/// Tokens per partial of the short-conv weight gradient: the conv backward
/// writes one fp32 [channels][kernelSize] partial per run of kConvRows
/// tokens to its workspace.
constexpr int kConvRows = 128;

/// Rows per block (one dw partial each) of the gated norm backward for rows
/// wider than rowwise::kMaxDim.
constexpr int kNormRowsPerBlock = 64;

/// Partial dw rows of the gated norm backward (one per block).
inline int64_t gatedNormPartials(int64_t rows, int64_t d) {
  if (d <= rowwise::kMaxDim)
    return rowwise::partials(rows, d);
  return (rows + kNormRowsPerBlock - 1) / kNormRowsPerBlock;
}

} // namespace ap::kernels::gdncuda

#endif // ACTPLACE_KERNELS_CUDA_GDN_GDN_LAYOUT_H
