//===- kernels.h - actplace kernel ABI --------------------------*- C++ -*-===//
//
// The one header through which generated code and the runtime reach kernels
// (docs/architecture.md section 6). Kernels know nothing of the runtime or of
// MLIR: each entry takes a KernelContext (owned and filled by the runtime) and
// a small args struct of pointers and shapes.
//
// Every op family declares its args structs and entries in its own header,
// included at the bottom, so that this file stays the single include.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_KERNELS_H
#define ACTPLACE_KERNELS_KERNELS_H

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ap::kernels {

/// Where a kernel runs. Generated code never branches on this; the entry
/// points dispatch on it.
enum class Backend : int32_t { Host = 0, Cuda = 1 };

/// Handed to every kernel by the runtime. Kernels never allocate: scratch comes
/// from `workspace`, sized by the kernel's declared workspace query.
struct KernelContext {
  Backend backend = Backend::Host;
  /// cudaStream_t on the cuda backend; null on host.
  void *stream = nullptr;
  /// 256-byte aligned scratch in the memory space of the backend.
  void *workspace = nullptr;
  size_t workspaceBytes = 0;
  /// cublasLtHandle_t on the cuda backend, owned by the runtime.
  void *cublasLt = nullptr;
  /// Number of SMs of the device (0 on host): kernels may size grids by it,
  /// but never by pointer values, so placement cannot change results.
  int32_t smCount = 0;
  /// > 0: GEMMs ask cuBLASLt to run on about this many SMs (leaving the rest
  /// to kernels on other streams); the algorithm is the one chosen without
  /// the target, so results are bit-identical. 0: all SMs. Host kernels
  /// ignore it.
  int32_t smTarget = 0;
  /// cudaEvent_t or null. A kernel made of several launches whose first
  /// launch fills every SM and whose later ones leave SMs free (the GDN chunk
  /// backward) records it after that first launch, so that work on another
  /// stream can wait for the wide launch alone (the runtime sets it for
  /// programs whose side work is issued after its host:
  /// Device::enableSideAfterFirstLaunch). Never changes results.
  void *firstLaunchDone = nullptr;
};

/// Result of a kernel call. Kernels validate shapes and report instead of
/// aborting; the runtime turns a non-Ok status into an error naming the op.
enum class Status : int32_t {
  Ok = 0,
  InvalidArgument = 1,
  Unsupported = 2,
  BackendError = 3,
};

/// Element types kernels see. Storage is bf16 on the training path, f32 for
/// statistics (rstd, LSE, gates) and master weights, f64 only in tests.
enum class DType : int32_t { BF16 = 0, F32 = 1, F64 = 2, I32 = 3 };

/// Host-side bfloat16 storage with round-to-nearest-even conversion, bit
/// compatible with __nv_bfloat16.
struct bf16 {
  uint16_t bits = 0;

  bf16() = default;
  explicit bf16(float f) : bits(fromFloat(f)) {}
  explicit operator float() const { return toFloat(bits); }

  static uint16_t fromFloat(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) // NaN: keep it quiet and non-zero.
      return static_cast<uint16_t>((u >> 16) | 0x40u);
    uint32_t roundingBias = 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>((u + roundingBias) >> 16);
  }
  static float toFloat(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  }
};
static_assert(sizeof(bf16) == 2, "bf16 must be 2 bytes");

inline float toFloat(bf16 v) { return static_cast<float>(v); }
inline float toFloat(float v) { return v; }
inline double toFloat(double v) { return v; }

/// Packed sequences. Long-context training packs several documents into one
/// sequence row. The kernels that mix tokens along the sequence (short conv,
/// chunked gated delta rule, RoPE, attention) take an optional per-token
///   const int32_t *docStart; // [B, T]
/// where docStart[b*T + t] is the position, within row b, of the first token
/// of token t's document, and compute every document exactly as if it were
/// its own row. Null means each row is one document. A valid array has
/// docStart[b*T + 0] == 0 and, for t > 0, docStart[b*T + t] equal to either
/// docStart[b*T + t - 1] (t continues its document) or t (t starts one); the
/// host entries check this and answer InvalidArgument otherwise.
/// documentStarts (kernels/dense.h) builds the array from token ids.
/// On the cuda backend docStart is in device memory. RoPE and the short conv
/// read it per element (unchecked); the gated delta rule and attention read
/// it back to the host, check it (InvalidArgument) and run their kernels
/// once per document on its own tokens (kernels/cuda/documents.h), which
/// waits for the call's stream.
inline bool docStartValid(const int32_t *docStart, int64_t batch, int64_t seq) {
  if (!docStart)
    return true;
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t *d = docStart + b * seq;
    if (seq > 0 && d[0] != 0)
      return false;
    for (int64_t t = 1; t < seq; ++t)
      if (d[t] != d[t - 1] && d[t] != t)
        return false;
  }
  return true;
}

} // namespace ap::kernels

#include "kernels/attention.h"
#include "kernels/dense.h"
#include "kernels/gdn.h"

#endif // ACTPLACE_KERNELS_KERNELS_H
