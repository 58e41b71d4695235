//===- attention.cpp - CPU reference causal attention -------------*- C++ -*-===//
//
// The oracle for the CUDA kernels and the host backend's attention. Follows
// kernels/attention.h exactly: the backward recomputes P from the saved lse
// (as the CUDA kernels do) so both backends consume the same saved tensors.
//
// Work is split over (batch, kv head) groups, one std::thread per group
// chunk. A group owns the dq rows of its q heads and its own dk/dv rows, and
// every element is reduced in a fixed order inside one thread, so the result
// does not depend on the number of threads.
//
//===----------------------------------------------------------------------===//
#include "kernels/kernels.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

namespace ap::kernels {

namespace {

template <typename T> struct AccOf {
  using type = float;
};
template <> struct AccOf<double> {
  using type = double;
};

template <typename T> T fromAcc(typename AccOf<T>::type x) {
  return static_cast<T>(x);
}
template <> bf16 fromAcc<bf16>(float x) { return bf16(x); }

template <typename T>
std::vector<typename AccOf<T>::type> widen(const void *p, size_t n) {
  using Acc = typename AccOf<T>::type;
  const T *src = static_cast<const T *>(p);
  std::vector<Acc> out(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = static_cast<Acc>(toFloat(src[i]));
  return out;
}

/// Runs fn(group) for group in [0, numGroups) over a few threads; each group
/// is handled by exactly one thread.
template <typename Fn> void parallelGroups(int64_t numGroups, Fn fn) {
  int64_t hw = std::max(1u, std::thread::hardware_concurrency());
  int64_t nThreads = std::min<int64_t>(hw, numGroups);
  if (nThreads <= 1) {
    for (int64_t g = 0; g < numGroups; ++g)
      fn(g);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(nThreads);
  for (int64_t t = 0; t < nThreads; ++t)
    threads.emplace_back([=, &fn] {
      for (int64_t g = t; g < numGroups; g += nThreads)
        fn(g);
    });
  for (auto &th : threads)
    th.join();
}

template <typename T> Status forwardImpl(const AttentionForwardArgs &a) {
  using Acc = typename AccOf<T>::type;
  const AttentionShape &s = a.shape;
  const int64_t B = s.batch, Tn = s.seqLen, Hq = s.numQHeads,
                Hkv = s.numKvHeads, Dqk = s.headDimQk, Dv = s.headDimV;
  const int64_t group = Hq / Hkv;
  const Acc scale = static_cast<Acc>(s.softmaxScale);
  std::vector<Acc> q = widen<T>(a.q, B * Tn * Hq * Dqk);
  std::vector<Acc> k = widen<T>(a.k, B * Tn * Hkv * Dqk);
  std::vector<Acc> v = widen<T>(a.v, B * Tn * Hkv * Dv);
  T *o = static_cast<T *>(a.o);
  Acc *lse = static_cast<Acc *>(a.lse);

  parallelGroups(B * Hkv, [&](int64_t g) {
    const int64_t b = g / Hkv, hk = g % Hkv;
    std::vector<Acc> sc(Tn), acc(Dv);
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      for (int64_t i = 0; i < Tn; ++i) {
        const Acc *qi = &q[((b * Tn + i) * Hq + h) * Dqk];
        Acc m = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          const Acc *kj = &k[((b * Tn + j) * Hkv + hk) * Dqk];
          Acc dot = 0;
          for (int64_t d = 0; d < Dqk; ++d)
            dot += qi[d] * kj[d];
          sc[j] = dot * scale;
          m = std::max(m, sc[j]);
        }
        Acc l = 0;
        std::fill(acc.begin(), acc.end(), Acc(0));
        for (int64_t j = 0; j <= i; ++j) {
          Acc p = std::exp(sc[j] - m);
          l += p;
          const Acc *vj = &v[((b * Tn + j) * Hkv + hk) * Dv];
          for (int64_t d = 0; d < Dv; ++d)
            acc[d] += p * vj[d];
        }
        T *oi = &o[((b * Tn + i) * Hq + h) * Dv];
        for (int64_t d = 0; d < Dv; ++d)
          oi[d] = fromAcc<T>(acc[d] / l);
        lse[(b * Hq + h) * Tn + i] = m + std::log(l);
      }
    }
  });
  return Status::Ok;
}

template <typename T> Status backwardImpl(const AttentionBackwardArgs &a) {
  using Acc = typename AccOf<T>::type;
  const AttentionShape &s = a.shape;
  const int64_t B = s.batch, Tn = s.seqLen, Hq = s.numQHeads,
                Hkv = s.numKvHeads, Dqk = s.headDimQk, Dv = s.headDimV;
  const int64_t group = Hq / Hkv;
  const Acc scale = static_cast<Acc>(s.softmaxScale);
  std::vector<Acc> q = widen<T>(a.q, B * Tn * Hq * Dqk);
  std::vector<Acc> k = widen<T>(a.k, B * Tn * Hkv * Dqk);
  std::vector<Acc> v = widen<T>(a.v, B * Tn * Hkv * Dv);
  std::vector<Acc> o = widen<T>(a.o, B * Tn * Hq * Dv);
  std::vector<Acc> dO = widen<T>(a.dO, B * Tn * Hq * Dv);
  const Acc *lse = static_cast<const Acc *>(a.lse);
  T *dq = static_cast<T *>(a.dq);
  T *dk = static_cast<T *>(a.dk);
  T *dv = static_cast<T *>(a.dv);

  parallelGroups(B * Hkv, [&](int64_t g) {
    const int64_t b = g / Hkv, hk = g % Hkv;
    // dK/dV of this kv head, accumulated over q heads then query rows, in
    // increasing order.
    std::vector<Acc> dkAcc(Tn * Dqk, Acc(0)), dvAcc(Tn * Dv, Acc(0));
    std::vector<Acc> dqAcc(Dqk);
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
      for (int64_t i = 0; i < Tn; ++i) {
        const Acc *qi = &q[((b * Tn + i) * Hq + h) * Dqk];
        const Acc *oi = &o[((b * Tn + i) * Hq + h) * Dv];
        const Acc *doi = &dO[((b * Tn + i) * Hq + h) * Dv];
        const Acc lsei = lse[(b * Hq + h) * Tn + i];
        Acc Di = 0;
        for (int64_t d = 0; d < Dv; ++d)
          Di += doi[d] * oi[d];
        std::fill(dqAcc.begin(), dqAcc.end(), Acc(0));
        for (int64_t j = 0; j <= i; ++j) {
          const Acc *kj = &k[((b * Tn + j) * Hkv + hk) * Dqk];
          const Acc *vj = &v[((b * Tn + j) * Hkv + hk) * Dv];
          Acc dot = 0;
          for (int64_t d = 0; d < Dqk; ++d)
            dot += qi[d] * kj[d];
          const Acc p = std::exp(dot * scale - lsei);
          Acc dp = 0;
          for (int64_t d = 0; d < Dv; ++d)
            dp += doi[d] * vj[d];
          const Acc ds = p * (dp - Di);
          Acc *dvj = &dvAcc[j * Dv];
          for (int64_t d = 0; d < Dv; ++d)
            dvj[d] += p * doi[d];
          Acc *dkj = &dkAcc[j * Dqk];
          for (int64_t d = 0; d < Dqk; ++d) {
            dqAcc[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
          }
        }
        T *dqi = &dq[((b * Tn + i) * Hq + h) * Dqk];
        for (int64_t d = 0; d < Dqk; ++d)
          dqi[d] = fromAcc<T>(scale * dqAcc[d]);
      }
    }
    for (int64_t j = 0; j < Tn; ++j) {
      T *dkj = &dk[((b * Tn + j) * Hkv + hk) * Dqk];
      T *dvj = &dv[((b * Tn + j) * Hkv + hk) * Dv];
      for (int64_t d = 0; d < Dqk; ++d)
        dkj[d] = fromAcc<T>(scale * dkAcc[j * Dqk + d]);
      for (int64_t d = 0; d < Dv; ++d)
        dvj[d] = fromAcc<T>(dvAcc[j * Dv + d]);
    }
  });
  return Status::Ok;
}

bool hostDtype(DType t) {
  return t == DType::BF16 || t == DType::F32 || t == DType::F64;
}

} // namespace

Status attentionValidate(const AttentionShape &s, DType dtype) {
  if (!hostDtype(dtype))
    return Status::InvalidArgument;
  if (s.batch <= 0 || s.seqLen <= 0 || s.numQHeads <= 0 ||
      s.numKvHeads <= 0 || s.headDimQk <= 0 || s.headDimV <= 0)
    return Status::InvalidArgument;
  if (s.numQHeads % s.numKvHeads != 0)
    return Status::InvalidArgument;
  if (!(s.softmaxScale > 0.0) || !std::isfinite(s.softmaxScale))
    return Status::InvalidArgument;
  return Status::Ok;
}

size_t attentionForwardWorkspaceBytes(const AttentionForwardArgs &) {
  return 0;
}

size_t attentionBackwardWorkspaceBytes(const AttentionBackwardArgs &a) {
  const AttentionShape &s = a.shape;
  if (attentionValidate(s, a.dtype) != Status::Ok)
    return 0;
  auto align = [](size_t n) { return (n + 255) / 256 * 256; };
  const size_t rows = size_t(s.batch) * s.seqLen;
  size_t bytes = align(rows * s.numQHeads * sizeof(float)); // D
  if (s.numQHeads != s.numKvHeads)
    bytes += align(rows * s.numQHeads * s.headDimQk * sizeof(float)) +
             align(rows * s.numQHeads * s.headDimV * sizeof(float));
  return bytes;
}

namespace reference {

Status attentionForward(const AttentionForwardArgs &a) {
  if (Status st = attentionValidate(a.shape, a.dtype); st != Status::Ok)
    return st;
  if (!a.q || !a.k || !a.v || !a.o || !a.lse)
    return Status::InvalidArgument;
  switch (a.dtype) {
  case DType::BF16:
    return forwardImpl<bf16>(a);
  case DType::F32:
    return forwardImpl<float>(a);
  case DType::F64:
    return forwardImpl<double>(a);
  default:
    return Status::InvalidArgument;
  }
}

Status attentionBackward(const AttentionBackwardArgs &a) {
  if (Status st = attentionValidate(a.shape, a.dtype); st != Status::Ok)
    return st;
  if (!a.q || !a.k || !a.v || !a.o || !a.lse || !a.dO || !a.dq || !a.dk ||
      !a.dv)
    return Status::InvalidArgument;
  switch (a.dtype) {
  case DType::BF16:
    return backwardImpl<bf16>(a);
  case DType::F32:
    return backwardImpl<float>(a);
  case DType::F64:
    return backwardImpl<double>(a);
  default:
    return Status::InvalidArgument;
  }
}

} // namespace reference
} // namespace ap::kernels
