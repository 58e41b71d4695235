//===- TritonKernel.h - Triton-compiled kernels as op implementations -*- C++
//-*-===//
//
// `actplace-compile --triton-kernel=MANIFEST.json` registers a kernel that
// Triton 3.x compiled (its PTX and the metadata JSON Triton writes beside
// it) as the implementation of one train op's exec.kernel calls. The
// manifest says which op, where the files are, how the op's buffers and
// sizes map to the kernel's parameters and how the grid follows from them:
//
//   {"op": "train.swiglu",
//    "metadata": "swiglu_fwd.json",          // relative to the manifest
//    "ptx": "swiglu_fwd.ptx",                // default: metadata's stem.ptx
//    "args": ["in0", "in1", "out0", "n:i32"],
//    "grid": ["cdiv(n, 1024)", 1, 1]}
//
// args name the kernel's parameters in order, leaving out the constexpr
// ones Triton folds away: "inK" / "outK" the op's K-th input / output
// buffer, or a size: "n" (elements of the first input), "rows" (n over
// the last dimension), "cols" (the last dimension, also "dim"), "eps" (the
// op's eps), with a type suffix ":i32" (default for sizes), ":i64" or
// ":f32" (default for eps). A grid entry is a whole number, a size name, or
// "cdiv(SIZE, K)".
//
// What is read from Triton's metadata: "name" (the PTX entry), "num_warps"
// (the block is 32 x num_warps threads), "shared" (dynamic shared memory
// bytes), "num_ctas" (must be 1: no clusters), "target" ({"backend":
// "cuda", "arch": N, "warp_size": 32}; arch at most 90, this project's
// sm_90a), and the scratch fields that tell the launch ABI: with
// "global_scratch_size" the kernel takes one hidden trailing pointer (the
// global scratch), with "profile_scratch_size" too a second one (Triton
// 3.5 and later); both sizes must be 0 (no scratch is allocated), so the
// hidden pointers are null. The PTX's entry must take the mapped
// parameters plus the hidden ones, and its .target must be at most sm_90.
//
// Every failure names the file and the field and what was expected.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_CODEGEN_TRITONKERNEL_H
#define ACTPLACE_CODEGEN_TRITONKERNEL_H

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ap::codegen {

/// One mapped kernel parameter: a buffer or a named size.
struct TritonArg {
  enum Kind { Input, Output, Size } kind = Size;
  int index = 0;    ///< Input / Output: which buffer
  std::string size; ///< Size: n, rows, cols, dim, eps
  char type = 'i';  ///< 'p' pointer, 'i' int32, 'l' int64, 'f' float
};

/// One grid dimension: a number, a size, or cdiv(size, divisor).
struct TritonGridDim {
  std::string size; ///< empty: `value` alone
  int64_t value = 1;
  int64_t divisor = 1;
};

struct TritonKernel {
  std::string op;   ///< the train op it implements ("train.swiglu")
  std::string name; ///< the PTX entry
  std::string ptx;  ///< the PTX text
  std::vector<TritonArg> args;
  std::array<TritonGridDim, 3> grid;
  int64_t numWarps = 4, sharedBytes = 0;
  int64_t hiddenParams = 0; ///< trailing null pointers Triton appends
  int64_t arch = 90;        ///< the metadata's target arch
  std::string manifest;     ///< for messages

  /// The runtime's parameter kinds of the mapped args ('p', 'i', 'l', 'f').
  std::string kinds() const;

  /// As an attribute on exec.step (kTritonKernelsAttr) and back.
  mlir::DictionaryAttr toAttr(mlir::MLIRContext *ctx) const;
  static std::optional<TritonKernel> fromAttr(mlir::DictionaryAttr attr,
                                              std::string &error);
};

/// Reads a manifest and the Triton files it names; checks them as the header
/// says.
llvm::Expected<TritonKernel> loadTritonKernel(llvm::StringRef manifestPath);

/// The value of one grid dimension for `sizes` (n, rows, cols/dim); an
/// error naming the size when it is unknown.
llvm::Expected<int64_t> tritonGridValue(const TritonGridDim &dim, int64_t n,
                                        int64_t rows, int64_t cols);

} // namespace ap::codegen

#endif // ACTPLACE_CODEGEN_TRITONKERNEL_H
