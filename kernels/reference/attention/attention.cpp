//===- attention.cpp - CPU reference causal attention -----------*- C++ -*-===//
//
// The oracle for the CUDA kernels and the host backend's attention. Follows
// kernels/attention.h exactly: the backward recomputes P from the saved lse
// (as the CUDA kernels do) so both backends consume the same saved tensors.
//
// Work is split into items of 16 rows (query rows for o, lse and dq; key rows
// for dk and dv) taken by std::threads from a counter. Every output element
// is reduced by one thread in a fixed order, so the result does not depend
// on the number of threads or on scheduling. The backward recomputes P in
// both of its passes (as the CUDA dQ pass does) instead of sharing rows
// between threads.
//
//===----------------------------------------------------------------------===//
#include "kernels/kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

namespace ap::kernels {

namespace {

template <typename T> struct AccOf {
  using type = float; // f32 accumulation for bf16 and f32 storage
};
template <> struct AccOf<double> {
  using type = double; // f64 storage accumulates in f64
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

/// Runs fn(item) for item in [0, numItems) on a few threads that take items
/// from a shared counter. Each item is computed whole by one thread, in a
/// fixed order, so the result never depends on the scheduling.
template <typename Fn> void parallelItems(int64_t numItems, Fn fn) {
  int64_t hw = std::max(1u, std::thread::hardware_concurrency());
  int64_t nThreads = std::min<int64_t>(hw, numItems);
  if (nThreads <= 1) {
    for (int64_t i = 0; i < numItems; ++i)
      fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::thread> threads;
  threads.reserve(nThreads);
  for (int64_t t = 0; t < nThreads; ++t)
    threads.emplace_back([&] {
      for (int64_t i = next++; i < numItems; i = next++)
        fn(i);
    });
  for (auto &th : threads)
    th.join();
}

/// Dot product with 8 interleaved partial sums (a fixed order that compilers
/// can vectorise without reassociating).
template <typename Acc> Acc dot(const Acc *a, const Acc *b, int64_t n) {
  Acc part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8)
    for (int e = 0; e < 8; ++e)
      part[e] += a[d + e] * b[d + e];
  for (; d < n; ++d)
    part[d & 7] += a[d] * b[d];
  return ((part[0] + part[1]) + (part[2] + part[3])) +
         ((part[4] + part[5]) + (part[6] + part[7]));
}

/// Rows per work item.
constexpr int64_t kChunk = 16;

/// The first key query i of row b sees: its document's first token
/// (kernels/kernels.h, "Packed sequences"), 0 when the row is one document.
inline int64_t firstKey(const int32_t *docStart, int64_t b, int64_t Tn,
                        int64_t i) {
  return docStart ? docStart[b * Tn + i] : 0;
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
  const int64_t chunks = (Tn + kChunk - 1) / kChunk;

  // Items: (batch, q head, chunk of query rows); the last chunks (longest
  // causal rows) first so the tail of the schedule is short.
  parallelItems(B * Hq * chunks, [&](int64_t item) {
    const int64_t c = chunks - 1 - item / (B * Hq);
    const int64_t b = (item % (B * Hq)) / Hq, h = item % Hq;
    const int64_t hk = h / group;
    std::vector<Acc> sc(Tn), acc(Dv);
    for (int64_t i = c * kChunk; i < std::min(Tn, (c + 1) * kChunk); ++i) {
      const Acc *qi = &q[((b * Tn + i) * Hq + h) * Dqk];
      const int64_t j0 = firstKey(a.docStart, b, Tn, i);
      Acc m = -INFINITY;
      for (int64_t j = j0; j <= i; ++j) {
        sc[j] = dot(qi, &k[((b * Tn + j) * Hkv + hk) * Dqk], Dqk) * scale;
        m = std::max(m, sc[j]);
      }
      Acc l = 0;
      std::fill(acc.begin(), acc.end(), Acc(0));
      for (int64_t j = j0; j <= i; ++j) {
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
  const int64_t chunks = (Tn + kChunk - 1) / kChunk;

  // D_i = dO_i . O_i, laid out [B, Hq, T] like lse.
  std::vector<Acc> D(B * Hq * Tn);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Tn; ++i)
      for (int64_t h = 0; h < Hq; ++h)
        D[(b * Hq + h) * Tn + i] = dot(&dO[((b * Tn + i) * Hq + h) * Dv],
                                       &o[((b * Tn + i) * Hq + h) * Dv], Dv);
  auto probs = [&](int64_t b, int64_t h, int64_t i, int64_t j, Acc &p,
                   Acc &ds) {
    const int64_t hk = h / group;
    const Acc sc = dot(&q[((b * Tn + i) * Hq + h) * Dqk],
                       &k[((b * Tn + j) * Hkv + hk) * Dqk], Dqk) *
                   scale;
    p = std::exp(sc - lse[(b * Hq + h) * Tn + i]);
    const Acc dp = dot(&dO[((b * Tn + i) * Hq + h) * Dv],
                       &v[((b * Tn + j) * Hkv + hk) * Dv], Dv);
    ds = p * (dp - D[(b * Hq + h) * Tn + i]);
  };

  // dQ: items (batch, q head, chunk of query rows); dQ_i = scale sum_j dS_ij
  // K_j over j ascending.
  parallelItems(B * Hq * chunks, [&](int64_t item) {
    const int64_t c = chunks - 1 - item / (B * Hq);
    const int64_t b = (item % (B * Hq)) / Hq, h = item % Hq;
    const int64_t hk = h / group;
    std::vector<Acc> acc(Dqk);
    for (int64_t i = c * kChunk; i < std::min(Tn, (c + 1) * kChunk); ++i) {
      std::fill(acc.begin(), acc.end(), Acc(0));
      for (int64_t j = firstKey(a.docStart, b, Tn, i); j <= i; ++j) {
        Acc p, ds;
        probs(b, h, i, j, p, ds);
        const Acc *kj = &k[((b * Tn + j) * Hkv + hk) * Dqk];
        for (int64_t d = 0; d < Dqk; ++d)
          acc[d] += ds * kj[d];
      }
      T *dqi = &dq[((b * Tn + i) * Hq + h) * Dqk];
      for (int64_t d = 0; d < Dqk; ++d)
        dqi[d] = fromAcc<T>(scale * acc[d]);
    }
  });

  // dK, dV: items (batch, kv head, chunk of key rows); sums over the group's
  // q heads in increasing order, then query rows ascending: those of key j's
  // document, which end where a query no longer sees j.
  parallelItems(B * Hkv * chunks, [&](int64_t item) {
    const int64_t c = item / (B * Hkv); // first chunks see the most rows
    const int64_t b = (item % (B * Hkv)) / Hkv, hk = item % Hkv;
    std::vector<Acc> dkAcc(Dqk), dvAcc(Dv);
    for (int64_t j = c * kChunk; j < std::min(Tn, (c + 1) * kChunk); ++j) {
      std::fill(dkAcc.begin(), dkAcc.end(), Acc(0));
      std::fill(dvAcc.begin(), dvAcc.end(), Acc(0));
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
        for (int64_t i = j; i < Tn && firstKey(a.docStart, b, Tn, i) <= j;
             ++i) {
          Acc p, ds;
          probs(b, h, i, j, p, ds);
          const Acc *qi = &q[((b * Tn + i) * Hq + h) * Dqk];
          const Acc *doi = &dO[((b * Tn + i) * Hq + h) * Dv];
          for (int64_t d = 0; d < Dqk; ++d)
            dkAcc[d] += ds * qi[d];
          for (int64_t d = 0; d < Dv; ++d)
            dvAcc[d] += p * doi[d];
        }
      T *dkj = &dk[((b * Tn + j) * Hkv + hk) * Dqk];
      T *dvj = &dv[((b * Tn + j) * Hkv + hk) * Dv];
      for (int64_t d = 0; d < Dqk; ++d)
        dkj[d] = fromAcc<T>(scale * dkAcc[d]);
      for (int64_t d = 0; d < Dv; ++d)
        dvj[d] = fromAcc<T>(dvAcc[d]);
    }
  });
  return Status::Ok;
}

} // namespace

// attentionValidate and the workspace queries are in kernels/workspace.cpp.

namespace reference {

Status attentionForward(const AttentionForwardArgs &a) {
  if (Status st = attentionValidate(a.shape, a.dtype); st != Status::Ok)
    return st;
  if (!a.q || !a.k || !a.v || !a.o || !a.lse ||
      !docStartValid(a.docStart, a.shape.batch, a.shape.seqLen))
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
      !a.dv || !docStartValid(a.docStart, a.shape.batch, a.shape.seqLen))
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
