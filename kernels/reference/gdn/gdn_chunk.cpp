//===- gdn_chunk.cpp - gated delta rule host reference ----------*- C++ -*-===//
//
// The naive per-token recurrence (the oracle) and the chunked (WY/UT)
// forward and backward of docs/model-math.md 1.3-1.5, chunk 64, in the
// accumulation type. The backward recomputes W, U, the chunk states and Vnew
// from the saved q, k, v, g cumsum, beta, T and initial state. A row of packed
// documents (docStart) runs the per-row algorithm on each document in turn.
//
//===----------------------------------------------------------------------===//
#include "kernels/reference/gdn/gdn_reference.h"

#include <vector>

namespace ap::kernels::gdnref {
namespace {

/// Index helpers for one GdnChunkArgs.
struct Geo {
  int64_t B, T, Hk, Hv, dk, dv, r, qs, ks, vs;
  explicit Geo(const GdnChunkArgs &a)
      : B(a.batch), T(a.seqLen), Hk(a.keyHeads), Hv(a.valueHeads), dk(a.keyDim),
        dv(a.valueDim), r(a.valueHeads / a.keyHeads),
        qs(a.qStride ? a.qStride : a.keyHeads * int64_t(a.keyDim)),
        ks(a.kStride ? a.kStride : a.keyHeads * int64_t(a.keyDim)),
        vs(a.vStride ? a.vStride : a.valueHeads * int64_t(a.valueDim)) {}
  int64_t q(int64_t b, int64_t t, int64_t h) const {
    return (b * T + t) * qs + (h / r) * dk;
  }
  int64_t k(int64_t b, int64_t t, int64_t h) const {
    return (b * T + t) * ks + (h / r) * dk;
  }
  int64_t v(int64_t b, int64_t t, int64_t h) const {
    return (b * T + t) * vs + h * dv;
  }
  int64_t o(int64_t b, int64_t t, int64_t h) const {
    return ((b * T + t) * Hv + h) * dv;
  }
  int64_t s(int64_t b, int64_t t, int64_t h) const {
    return (b * T + t) * Hv + h;
  }
  int64_t state(int64_t b, int64_t h) const { return (b * Hv + h) * dk * dv; }
};

bool validChunkArgs(const GdnChunkArgs &a) {
  return validStorage(a.dtype) && a.batch > 0 && a.seqLen > 0 &&
         a.keyHeads > 0 && a.valueHeads > 0 && a.keyDim > 0 && a.valueDim > 0 &&
         a.valueHeads % a.keyHeads == 0 &&
         docStartValid(a.docStart, a.batch, a.seqLen);
}

/// One document of a row: its tokens t0 .. t0 + len - 1.
struct Doc {
  int64_t t0 = 0, len = 0;
};

/// The documents of row b in order (kernels/kernels.h, "Packed sequences");
/// the whole row when docStart is null.
std::vector<Doc> documents(const GdnChunkArgs &a, int64_t b) {
  std::vector<Doc> docs;
  for (int64_t t = 0; t < a.seqLen; ++t) {
    if (t == 0 || (a.docStart && a.docStart[b * a.seqLen + t] == t))
      docs.push_back({t, 0});
    ++docs.back().len;
  }
  return docs;
}

/// Chunks of a document of `len` tokens.
int64_t chunksOf(int64_t len) { return (len + kGdnChunk - 1) / kGdnChunk; }

/// Row-major dense matrix in the accumulation type.
template <typename A> struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<A> d;
  Mat() = default;
  Mat(int64_t r, int64_t c) : rows(r), cols(c), d(size_t(r * c), A(0)) {}
  A &operator()(int64_t i, int64_t j) { return d[size_t(i * cols + j)]; }
  A operator()(int64_t i, int64_t j) const { return d[size_t(i * cols + j)]; }
};

/// Per-chunk inputs of one (sequence, value head), loaded into Acc.
template <typename S> struct ChunkIn {
  using A = AccOf<S>;
  int64_t t0, L;
  Mat<A> Q, K, V, Tm;
  std::vector<A> G, beta, Gam;
};

/// Chunk n of document `doc` of row b.
template <typename S>
ChunkIn<S> loadChunk(const GdnChunkArgs &a, const Geo &g, int64_t b, int64_t h,
                     const Doc &doc, int64_t n, bool haveSavedT) {
  using A = AccOf<S>;
  ChunkIn<S> c;
  c.t0 = doc.t0 + n * kGdnChunk;
  c.L = std::min<int64_t>(kGdnChunk, doc.len - n * kGdnChunk);
  c.Q = Mat<A>(c.L, g.dk);
  c.K = Mat<A>(c.L, g.dk);
  c.V = Mat<A>(c.L, g.dv);
  c.G.resize(size_t(c.L));
  c.beta.resize(size_t(c.L));
  c.Gam.resize(size_t(c.L));
  const A *gp = static_cast<const A *>(a.g);
  const A *gc = static_cast<const A *>(a.gCum);
  const A *bp = static_cast<const A *>(a.beta);
  A run = 0;
  for (int64_t i = 0; i < c.L; ++i) {
    int64_t t = c.t0 + i;
    for (int64_t j = 0; j < g.dk; ++j) {
      c.Q(i, j) = ld<S>(a.q, g.q(b, t, h) + j);
      c.K(i, j) = ld<S>(a.k, g.k(b, t, h) + j);
    }
    for (int64_t j = 0; j < g.dv; ++j)
      c.V(i, j) = ld<S>(a.v, g.v(b, t, h) + j);
    if (haveSavedT) {
      c.G[i] = gc[g.s(b, t, h)];
    } else {
      run += gp[g.s(b, t, h)];
      c.G[i] = run;
    }
    c.beta[i] = bp[g.s(b, t, h)];
    c.Gam[i] = std::exp(c.G[i]);
  }
  c.Tm = Mat<A>(c.L, c.L);
  if (haveSavedT) {
    for (int64_t i = 0; i < c.L; ++i)
      for (int64_t j = 0; j < c.L; ++j)
        c.Tm(i, j) = ld<S>(a.tMat, g.s(b, c.t0 + i, h) * kGdnChunk + j);
  } else {
    // A is strictly lower; T = (I + A)^-1 by forward substitution.
    Mat<A> Am(c.L, c.L);
    for (int64_t i = 0; i < c.L; ++i)
      for (int64_t j = 0; j < i; ++j) {
        A kk = 0;
        for (int64_t m = 0; m < g.dk; ++m)
          kk += c.K(i, m) * c.K(j, m);
        Am(i, j) = c.beta[i] * kk * std::exp(c.G[i] - c.G[j]);
      }
    for (int64_t i = 0; i < c.L; ++i) {
      c.Tm(i, i) = 1;
      for (int64_t j = 0; j < i; ++j) {
        A s = 0;
        for (int64_t m = j; m < i; ++m)
          s += Am(i, m) * c.Tm(m, j);
        c.Tm(i, j) = -s;
      }
    }
  }
  return c;
}

/// W = T diag(beta Gam) K, U = T diag(beta) V.
template <typename A, typename C>
void computeWU(const C &c, Mat<A> &W, Mat<A> &U) {
  W = Mat<A>(c.L, c.K.cols);
  U = Mat<A>(c.L, c.V.cols);
  for (int64_t i = 0; i < c.L; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      A t = c.Tm(i, j);
      A tw = t * c.beta[j] * c.Gam[j], tu = t * c.beta[j];
      for (int64_t m = 0; m < c.K.cols; ++m)
        W(i, m) += tw * c.K(j, m);
      for (int64_t m = 0; m < c.V.cols; ++m)
        U(i, m) += tu * c.V(j, m);
    }
}

/// Vnew = U - W S0, then S0 <- Gam_last S0 + (K exp(G_last - G))^T Vnew.
template <typename A, typename C>
Mat<A> advanceState(const C &c, const Mat<A> &W, const Mat<A> &U, Mat<A> &S) {
  Mat<A> Vn = U;
  for (int64_t i = 0; i < c.L; ++i)
    for (int64_t m = 0; m < W.cols; ++m) {
      A w = W(i, m);
      for (int64_t j = 0; j < U.cols; ++j)
        Vn(i, j) -= w * S(m, j);
    }
  A gl = c.G[c.L - 1], gaml = c.Gam[c.L - 1];
  for (auto &x : S.d)
    x *= gaml;
  for (int64_t i = 0; i < c.L; ++i) {
    A e = std::exp(gl - c.G[i]);
    for (int64_t m = 0; m < W.cols; ++m) {
      A kd = c.K(i, m) * e;
      for (int64_t j = 0; j < U.cols; ++j)
        S(m, j) += kd * Vn(i, j);
    }
  }
  return Vn;
}

template <typename A>
Mat<A> loadState(const void *p, const Geo &g, int64_t b, int64_t h) {
  Mat<A> S(g.dk, g.dv);
  if (p)
    for (int64_t i = 0; i < g.dk * g.dv; ++i)
      S.d[size_t(i)] = static_cast<const A *>(p)[g.state(b, h) + i];
  return S;
}

} // namespace

template <typename S> Status recurrentForward(const GdnChunkArgs &a) {
  using A = AccOf<S>;
  if (!validChunkArgs(a) || !a.q || !a.k || !a.v || !a.g || !a.beta || !a.o)
    return Status::InvalidArgument;
  Geo g(a);
  const A *gp = static_cast<const A *>(a.g);
  const A *bp = static_cast<const A *>(a.beta);
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t h = 0; h < g.Hv; ++h) {
      Mat<A> St = loadState<A>(a.initialState, g, b, h);
      std::vector<A> kt(size_t(g.dk)), qt(size_t(g.dk)), u(size_t(g.dv));
      for (int64_t t = 0; t < g.T; ++t) {
        if (t > 0 && a.docStart && a.docStart[b * g.T + t] == t)
          St = Mat<A>(g.dk, g.dv); // a document starts from the zero state
        A decay = std::exp(gp[g.s(b, t, h)]), bt = bp[g.s(b, t, h)];
        for (int64_t i = 0; i < g.dk; ++i) {
          kt[i] = ld<S>(a.k, g.k(b, t, h) + i);
          qt[i] = ld<S>(a.q, g.q(b, t, h) + i);
        }
        for (auto &x : St.d)
          x *= decay;
        for (int64_t j = 0; j < g.dv; ++j) {
          A sk = 0;
          for (int64_t i = 0; i < g.dk; ++i)
            sk += St(i, j) * kt[i];
          u[j] = bt * (ld<S>(a.v, g.v(b, t, h) + j) - sk);
        }
        for (int64_t i = 0; i < g.dk; ++i)
          for (int64_t j = 0; j < g.dv; ++j)
            St(i, j) += kt[i] * u[j];
        for (int64_t j = 0; j < g.dv; ++j) {
          A o = 0;
          for (int64_t i = 0; i < g.dk; ++i)
            o += St(i, j) * qt[i];
          st<S>(a.o, g.o(b, t, h) + j, static_cast<A>(a.scale) * o);
        }
      }
      if (a.finalState)
        for (int64_t i = 0; i < g.dk * g.dv; ++i)
          static_cast<A *>(a.finalState)[g.state(b, h) + i] = St.d[size_t(i)];
    }
  return Status::Ok;
}

template <typename S> Status chunkForward(const GdnChunkArgs &a) {
  using A = AccOf<S>;
  if (!validChunkArgs(a) || !a.q || !a.k || !a.v || !a.g || !a.beta || !a.o ||
      !a.gCum || !a.tMat)
    return Status::InvalidArgument;
  Geo g(a);
  const A scale = static_cast<A>(a.scale);
  for (int64_t b = 0; b < g.B; ++b) {
    const std::vector<Doc> docs = documents(a, b);
    for (int64_t h = 0; h < g.Hv; ++h) {
      Mat<A> St = loadState<A>(a.initialState, g, b, h);
      for (size_t d = 0; d < docs.size(); ++d) {
        if (d > 0)
          St = Mat<A>(g.dk, g.dv); // a document starts from the zero state
        for (int64_t n = 0; n < chunksOf(docs[d].len); ++n) {
          ChunkIn<S> c =
              loadChunk<S>(a, g, b, h, docs[d], n, /*haveSavedT=*/false);
          for (int64_t i = 0; i < c.L; ++i) {
            static_cast<A *>(a.gCum)[g.s(b, c.t0 + i, h)] = c.G[i];
            for (int64_t j = 0; j < kGdnChunk; ++j)
              st<S>(a.tMat, g.s(b, c.t0 + i, h) * kGdnChunk + j,
                    j < c.L ? c.Tm(i, j) : A(0));
          }
          Mat<A> W, U;
          computeWU<A>(c, W, U);
          Mat<A> S0 = St;
          Mat<A> Vn = advanceState<A>(c, W, U, St);
          for (int64_t i = 0; i < c.L; ++i) {
            std::vector<A> o(size_t(g.dv), A(0));
            for (int64_t m = 0; m < g.dk; ++m) {
              A qg = c.Q(i, m) * c.Gam[i];
              for (int64_t j = 0; j < g.dv; ++j)
                o[j] += qg * S0(m, j);
            }
            for (int64_t s = 0; s <= i; ++s) {
              A qk = 0;
              for (int64_t m = 0; m < g.dk; ++m)
                qk += c.Q(i, m) * c.K(s, m);
              qk *= std::exp(c.G[i] - c.G[s]);
              for (int64_t j = 0; j < g.dv; ++j)
                o[j] += qk * Vn(s, j);
            }
            for (int64_t j = 0; j < g.dv; ++j)
              st<S>(a.o, g.o(b, c.t0 + i, h) + j, scale * o[j]);
          }
        }
      }
      if (a.finalState)
        for (int64_t i = 0; i < g.dk * g.dv; ++i)
          static_cast<A *>(a.finalState)[g.state(b, h) + i] = St.d[size_t(i)];
    }
  }
  return Status::Ok;
}

template <typename S> Status chunkBackward(const GdnChunkArgs &a) {
  using A = AccOf<S>;
  if (!validChunkArgs(a) || !a.q || !a.k || !a.v || !a.beta || !a.gCum ||
      !a.tMat || !a.dO || !a.dq || !a.dk || !a.dv || !a.dg || !a.dbeta)
    return Status::InvalidArgument;
  Geo g(a);
  const A scale = static_cast<A>(a.scale);
  // q/k gradients summed over the value heads of a group, in head order.
  std::vector<A> dqAcc(size_t(g.B * g.T * g.Hk * g.dk), A(0));
  std::vector<A> dkAcc(dqAcc.size(), A(0));
  A *dgOut = static_cast<A *>(a.dg);
  A *dbOut = static_cast<A *>(a.dbeta);
  for (int64_t b = 0; b < g.B; ++b) {
    const std::vector<Doc> docs = documents(a, b);
    for (int64_t h = 0; h < g.Hv; ++h)
      for (size_t d = 0; d < docs.size(); ++d) {
        // The initial state enters the row's first document and the final
        // state leaves its last; the others start and end at zero.
        const bool first = d == 0, last = d + 1 == docs.size();
        const int64_t NT = chunksOf(docs[d].len);
        std::vector<ChunkIn<S>> cs;
        std::vector<Mat<A>> Ws, Us, H0, Vn, dHe, dVn;
        Mat<A> St = loadState<A>(first ? a.initialState : nullptr, g, b, h);
        // Recompute W, U, chunk-start states and Vnew.
        for (int64_t n = 0; n < NT; ++n) {
          cs.push_back(
              loadChunk<S>(a, g, b, h, docs[d], n, /*haveSavedT=*/true));
          Mat<A> W, U;
          computeWU<A>(cs[n], W, U);
          H0.push_back(St);
          Vn.push_back(advanceState<A>(cs[n], W, U, St));
          Ws.push_back(std::move(W));
          Us.push_back(std::move(U));
        }
        // Reverse pass over chunks for dh_end and dVnew.
        Mat<A> dH = loadState<A>(last ? a.dFinalState : nullptr, g, b, h);
        dHe.resize(size_t(NT));
        dVn.resize(size_t(NT));
        for (int64_t n = NT - 1; n >= 0; --n) {
          const ChunkIn<S> &c = cs[n];
          Mat<A> dO(c.L, g.dv);
          for (int64_t i = 0; i < c.L; ++i)
            for (int64_t j = 0; j < g.dv; ++j)
              dO(i, j) = ld<S>(a.dO, g.o(b, c.t0 + i, h) + j);
          dHe[n] = dH;
          Mat<A> dv(c.L, g.dv);
          A gl = c.G[c.L - 1];
          for (int64_t s = 0; s < c.L; ++s) {
            for (int64_t r = s; r < c.L; ++r) {
              A qk = 0;
              for (int64_t m = 0; m < g.dk; ++m)
                qk += c.Q(r, m) * c.K(s, m);
              qk *= scale * std::exp(c.G[r] - c.G[s]);
              for (int64_t j = 0; j < g.dv; ++j)
                dv(s, j) += qk * dO(r, j);
            }
            A e = std::exp(gl - c.G[s]);
            for (int64_t m = 0; m < g.dk; ++m) {
              A kd = c.K(s, m) * e;
              for (int64_t j = 0; j < g.dv; ++j)
                dv(s, j) += kd * dH(m, j);
            }
          }
          for (auto &x : dH.d)
            x *= c.Gam[c.L - 1];
          for (int64_t r = 0; r < c.L; ++r)
            for (int64_t m = 0; m < g.dk; ++m) {
              A qg = scale * c.Q(r, m) * c.Gam[r], w = Ws[n](r, m);
              for (int64_t j = 0; j < g.dv; ++j)
                dH(m, j) += qg * dO(r, j) - w * dv(r, j);
            }
          dVn[n] = std::move(dv);
        }
        if (first && a.dInitialState)
          for (int64_t i = 0; i < g.dk * g.dv; ++i)
            static_cast<A *>(a.dInitialState)[g.state(b, h) + i] =
                dH.d[size_t(i)];
        // Per-chunk gradients.
        for (int64_t n = 0; n < NT; ++n) {
          const ChunkIn<S> &c = cs[n];
          const int64_t L = c.L;
          const Mat<A> &S0 = H0[n], &dh = dHe[n], &Vnw = Vn[n], &dU = dVn[n];
          Mat<A> dO(L, g.dv);
          for (int64_t i = 0; i < L; ++i)
            for (int64_t j = 0; j < g.dv; ++j)
              dO(i, j) = ld<S>(a.dO, g.o(b, c.t0 + i, h) + j);
          A gl = c.G[L - 1];
          Mat<A> dQ(L, g.dk), dK(L, g.dk), dW(L, g.dk);
          for (int64_t r = 0; r < L; ++r)
            for (int64_t m = 0; m < g.dk; ++m) {
              A sq = 0, sk = 0, sw = 0;
              for (int64_t j = 0; j < g.dv; ++j) {
                sq += dO(r, j) * S0(m, j);
                sk += Vnw(r, j) * dh(m, j);
                sw += dU(r, j) * S0(m, j);
              }
              dQ(r, m) = scale * sq * c.Gam[r];
              dK(r, m) = sk * std::exp(gl - c.G[r]);
              dW(r, m) = -sw;
            }
          A extra = 0;
          for (int64_t i = 0; i < g.dk * g.dv; ++i)
            extra += S0.d[size_t(i)] * dh.d[size_t(i)];
          extra *= c.Gam[L - 1];
          for (int64_t r = 0; r < L; ++r)
            for (int64_t m = 0; m < g.dk; ++m)
              extra += dK(r, m) * c.K(r, m);
          Mat<A> dS(L, L);
          for (int64_t r = 0; r < L; ++r)
            for (int64_t s = 0; s <= r; ++s) {
              A x = 0;
              for (int64_t j = 0; j < g.dv; ++j)
                x += dO(r, j) * Vnw(s, j);
              dS(r, s) = scale * x * std::exp(c.G[r] - c.G[s]);
            }
          for (int64_t r = 0; r < L; ++r)
            for (int64_t s = 0; s <= r; ++s)
              for (int64_t m = 0; m < g.dk; ++m) {
                dQ(r, m) += dS(r, s) * c.K(s, m);
                dK(s, m) += dS(r, s) * c.Q(r, m);
              }
          std::vector<A> dG(size_t(L), A(0)), dbeta(size_t(L), A(0));
          for (int64_t r = 0; r < L; ++r) {
            A x = 0;
            for (int64_t m = 0; m < g.dk; ++m)
              x += dQ(r, m) * c.Q(r, m) - dK(r, m) * c.K(r, m);
            dG[r] = x;
          }
          dG[L - 1] += extra;
          // WY backward.
          Mat<A> dT(L, L), X(L, g.dk), Y(L, g.dv);
          for (int64_t i = 0; i < L; ++i)
            for (int64_t j = 0; j < L; ++j) {
              A x = 0, y = 0;
              for (int64_t m = 0; m < g.dk; ++m)
                x += dW(i, m) * c.K(j, m);
              for (int64_t m = 0; m < g.dv; ++m)
                y += dU(i, m) * c.V(j, m);
              dT(i, j) = x * c.beta[j] * c.Gam[j] + y * c.beta[j];
            }
          for (int64_t i = 0; i < L; ++i)
            for (int64_t j = 0; j < L; ++j) {
              A t = c.Tm(j, i); // (T^T)(i, j)
              if (t == A(0))
                continue;
              for (int64_t m = 0; m < g.dk; ++m)
                X(i, m) += t * dW(j, m);
              for (int64_t m = 0; m < g.dv; ++m)
                Y(i, m) += t * dU(j, m);
            }
          Mat<A> dV(L, g.dv);
          for (int64_t i = 0; i < L; ++i) {
            A xk = 0, yv = 0;
            for (int64_t m = 0; m < g.dk; ++m) {
              dK(i, m) += X(i, m) * c.beta[i] * c.Gam[i];
              xk += X(i, m) * c.K(i, m);
            }
            for (int64_t m = 0; m < g.dv; ++m) {
              dV(i, m) = Y(i, m) * c.beta[i];
              yv += Y(i, m) * c.V(i, m);
            }
            dbeta[i] += xk * c.Gam[i] + yv;
            dG[i] += xk * c.beta[i] * c.Gam[i];
          }
          // dP = -strictlower(T^T dT T^T) * D.
          Mat<A> M1(L, L), dP(L, L);
          for (int64_t i = 0; i < L; ++i)
            for (int64_t j = 0; j < L; ++j) {
              A x = 0;
              for (int64_t m = 0; m < L; ++m)
                x += c.Tm(m, i) * dT(m, j);
              M1(i, j) = x;
            }
          for (int64_t i = 0; i < L; ++i)
            for (int64_t j = 0; j < i; ++j) {
              A x = 0;
              for (int64_t m = 0; m < L; ++m)
                x += M1(i, m) * c.Tm(j, m);
              dP(i, j) = -x * std::exp(c.G[i] - c.G[j]);
            }
          for (int64_t i = 0; i < L; ++i)
            for (int64_t j = 0; j < i; ++j) {
              A p = dP(i, j);
              A kk = 0;
              for (int64_t m = 0; m < g.dk; ++m)
                kk += c.K(i, m) * c.K(j, m);
              for (int64_t m = 0; m < g.dk; ++m) {
                dK(i, m) += c.beta[i] * p * c.K(j, m);
                dK(j, m) += p * c.beta[i] * c.K(i, m);
              }
              dbeta[i] += p * kk;
              A e = p * c.beta[i] * kk;
              dG[i] += e;
              dG[j] -= e;
            }
          // Outputs: reverse cumsum of dG gives the raw-g gradient.
          A run = 0;
          for (int64_t i = L - 1; i >= 0; --i) {
            run += dG[i];
            dgOut[g.s(b, c.t0 + i, h)] = run;
            dbOut[g.s(b, c.t0 + i, h)] = dbeta[i];
          }
          const int64_t hk = h / g.r;
          for (int64_t i = 0; i < L; ++i) {
            int64_t base = ((b * g.T + c.t0 + i) * g.Hk + hk) * g.dk;
            for (int64_t m = 0; m < g.dk; ++m) {
              dqAcc[size_t(base + m)] += dQ(i, m);
              dkAcc[size_t(base + m)] += dK(i, m);
            }
            for (int64_t m = 0; m < g.dv; ++m)
              st<S>(a.dv, g.v(b, c.t0 + i, h) + m, dV(i, m));
          }
        }
      }
  }
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t t = 0; t < g.T; ++t)
      for (int64_t hk = 0; hk < g.Hk; ++hk)
        for (int64_t m = 0; m < g.dk; ++m) {
          size_t i = size_t(((b * g.T + t) * g.Hk + hk) * g.dk + m);
          st<S>(a.dq, (b * g.T + t) * g.qs + hk * g.dk + m, dqAcc[i]);
          st<S>(a.dk, (b * g.T + t) * g.ks + hk * g.dk + m, dkAcc[i]);
        }
  return Status::Ok;
}

#define AP_GDN_INSTANTIATE(S)                                                  \
  template Status recurrentForward<S>(const GdnChunkArgs &);                   \
  template Status chunkForward<S>(const GdnChunkArgs &);                       \
  template Status chunkBackward<S>(const GdnChunkArgs &);
AP_GDN_INSTANTIATE(bf16)
AP_GDN_INSTANTIATE(float)
AP_GDN_INSTANTIATE(double)
#undef AP_GDN_INSTANTIATE

} // namespace ap::kernels::gdnref
