//===- gdn_reference.h - GDN host reference internals -----------*- C++ -*-===//
//
// Templates shared by the GDN host reference kernels. Storage type S is bf16,
// float or double; Acc is double for double storage and float otherwise.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_REFERENCE_GDN_GDN_REFERENCE_H
#define ACTPLACE_KERNELS_REFERENCE_GDN_GDN_REFERENCE_H

#include "kernels/kernels.h"

#include <cmath>
#include <type_traits>

namespace ap::kernels::gdnref {

template <typename S>
using AccOf = std::conditional_t<std::is_same_v<S, double>, double, float>;

template <typename S> inline AccOf<S> ld(const void *p, int64_t i) {
  return static_cast<AccOf<S>>(toFloat(static_cast<const S *>(p)[i]));
}
template <typename S, typename A> inline void st(void *p, int64_t i, A v) {
  if constexpr (std::is_same_v<S, bf16>)
    static_cast<bf16 *>(p)[i] = bf16(static_cast<float>(v));
  else
    static_cast<S *>(p)[i] = static_cast<S>(v);
}
template <typename A> inline A sigm(A x) {
  return A(1) / (A(1) + std::exp(-x));
}

/// True when `dtype` names a storage type the reference supports.
inline bool validStorage(DType d) {
  return d == DType::BF16 || d == DType::F32 || d == DType::F64;
}

template <typename S> Status convForward(const GdnConvArgs &a);
template <typename S> Status convBackward(const GdnConvArgs &a);
template <typename S> Status gatesForward(const GdnGatesArgs &a);
template <typename S> Status gatesBackward(const GdnGatesArgs &a);
template <typename S> Status l2NormForward(const GdnL2NormArgs &a);
template <typename S> Status l2NormBackward(const GdnL2NormArgs &a);
template <typename S> Status gatedNormForward(const GdnGatedNormArgs &a);
template <typename S> Status gatedNormBackward(const GdnGatedNormArgs &a);
template <typename S> Status recurrentForward(const GdnChunkArgs &a);
template <typename S> Status chunkForward(const GdnChunkArgs &a);
template <typename S> Status chunkBackward(const GdnChunkArgs &a);

} // namespace ap::kernels::gdnref

#endif // ACTPLACE_KERNELS_REFERENCE_GDN_GDN_REFERENCE_H
