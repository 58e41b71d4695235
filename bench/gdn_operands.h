//===- gdn_operands.h - GDN chunk benchmark operands ------------*- C++ -*-===//
//
// The operands bench/gdn_bench.cu and bench/runtime_offload_bench.cu
// (clocks-kernels) time the GDN chunk kernels on: unit q and k rows (as
// after the L2 norm), normal v and dO, decays in (-0.305, -0.005) and betas
// in (0.05, 0.95), from std::mt19937(seed). Device buffers come from the
// caller's `upload(host, bytes)` and `zeros(bytes)` (each bench has its own
// error checks).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_BENCH_GDN_OPERANDS_H
#define ACTPLACE_BENCH_GDN_OPERANDS_H

#include "kernels/kernels.h"

#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

namespace ap::bench {

/// GdnChunkArgs (bf16) for B sequences of T tokens, H key and value heads
/// of dk / dv, with the forward's outputs and the backward's gradients
/// allocated (zeroed).
template <typename Upload, typename Zeros>
ap::kernels::GdnChunkArgs gdnChunkOperands(int B, int T, int H, int dk, int dv,
                                           unsigned seed, Upload &&upload,
                                           Zeros &&zeros) {
  using ap::kernels::bf16;
  const size_t rows = size_t(B) * T * H;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  std::vector<bf16> q(rows * dk), k(rows * dk), v(rows * dv), dO(rows * dv);
  std::vector<float> row(dk);
  for (auto *x : {&q, &k})
    for (size_t r = 0; r < rows; ++r) {
      float ss = 0;
      for (float &e : row) {
        e = nd(rng);
        ss += e * e;
      }
      for (int i = 0; i < dk; ++i)
        (*x)[r * dk + i] = bf16(row[i] / std::sqrt(ss));
    }
  for (auto *x : {&v, &dO})
    for (auto &e : *x)
      e = bf16(nd(rng));
  std::vector<float> g(rows), beta(rows);
  for (auto &e : g)
    e = -0.005f - 0.3f * ud(rng);
  for (auto &e : beta)
    e = 0.05f + 0.9f * ud(rng);
  ap::kernels::GdnChunkArgs a;
  a.dtype = ap::kernels::DType::BF16;
  a.batch = B;
  a.seqLen = T;
  a.keyHeads = H;
  a.valueHeads = H;
  a.keyDim = dk;
  a.valueDim = dv;
  a.scale = 1.f / std::sqrt(float(dk));
  a.q = upload(q.data(), q.size() * 2);
  a.k = upload(k.data(), k.size() * 2);
  a.v = upload(v.data(), v.size() * 2);
  a.g = upload(g.data(), g.size() * 4);
  a.beta = upload(beta.data(), beta.size() * 4);
  a.dO = upload(dO.data(), dO.size() * 2);
  a.o = zeros(rows * dv * 2);
  a.gCum = zeros(rows * 4);
  a.tMat = zeros(rows * 64 * 2);
  a.dq = zeros(q.size() * 2);
  a.dk = zeros(k.size() * 2);
  a.dv = zeros(v.size() * 2);
  a.dg = zeros(rows * 4);
  a.dbeta = zeros(rows * 4);
  return a;
}

} // namespace ap::bench

#endif // ACTPLACE_BENCH_GDN_OPERANDS_H
