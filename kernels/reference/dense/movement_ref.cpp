//===- movement_ref.cpp - data movement reference kernels ---------*- C++
//-*-===//
//
// Host implementations of copyRows, sumRepeats and convertDType
// (kernels/dense.h): plain loops, the oracle for the CUDA versions.
//
//===----------------------------------------------------------------------===//
#include "kernels/reference/dense/dense_internal.h"

#include <cstring>

namespace ap::kernels::ref {

Status copyRows(const CopyRowsArgs &a) {
  const char *src = static_cast<const char *>(a.src);
  char *dst = static_cast<char *>(a.dst);
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t r = 0; r < a.repeats; ++r)
      std::memmove(dst + o * a.dstPitch + r * a.rowBytes, src + o * a.srcPitch,
                   size_t(a.rowBytes));
  return Status::Ok;
}

template <class T> Status sumRepeats(const SumRepeatsArgs &a) {
  const T *x = static_cast<const T *>(a.x);
  T *y = static_cast<T *>(a.y);
  for (int64_t o = 0; o < a.outer; ++o)
    for (int64_t i = 0; i < a.inner; ++i) {
      Acc<T> s = 0;
      for (int64_t r = 0; r < a.repeats; ++r)
        s += load(x[(o * a.repeats + r) * a.inner + i]);
      y[o * a.inner + i] = store<T>(s);
    }
  return Status::Ok;
}
template Status sumRepeats<bf16>(const SumRepeatsArgs &);
template Status sumRepeats<float>(const SumRepeatsArgs &);
template Status sumRepeats<double>(const SumRepeatsArgs &);

namespace {
double loadAny(const void *p, DType t, int64_t i) {
  switch (t) {
  case DType::BF16:
    return double(float(static_cast<const bf16 *>(p)[i]));
  case DType::F32:
    return double(static_cast<const float *>(p)[i]);
  default:
    return static_cast<const double *>(p)[i];
  }
}
} // namespace

Status convertDType(const ConvertArgs &a) {
  for (int64_t i = 0; i < a.n; ++i) {
    double v = loadAny(a.x, a.from, i);
    switch (a.to) {
    case DType::BF16:
      // Through float: every bf16 is a float, and f64 -> bf16 in two
      // roundings matches what the CUDA path (which has no f64) would do.
      static_cast<bf16 *>(a.y)[i] = bf16(float(v));
      break;
    case DType::F32:
      static_cast<float *>(a.y)[i] = float(v);
      break;
    default:
      static_cast<double *>(a.y)[i] = v;
      break;
    }
  }
  return Status::Ok;
}

} // namespace ap::kernels::ref
