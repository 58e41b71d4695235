//===- tensor_parts.cpp - a tensor-parallel rank's part of a tensor -------===//

#include "runtime/tensor_parts.h"

#include "runtime/error.h"

#include <cstring>

namespace ap::rt {

namespace {
/// outer x extent x inner around `dim`, after the invariants' checks.
struct Runs {
  int64_t outer = 1, inner = 1, part = 0, whole = 0;
};

Runs runsOf(const TensorPartLayout &l, const std::vector<int64_t> &partShape) {
  if (l.dim < 0 || size_t(l.dim) >= partShape.size())
    fail("tensor parts: split dimension ", l.dim, " of a rank-",
         partShape.size(), " part");
  if (l.ranks < 1 || l.segments.empty())
    fail("tensor parts: ", l.ranks, " rank(s) and ", l.segments.size(),
         " segment(s)");
  Runs r;
  for (int64_t s : l.segments) {
    if (s <= 0 || s % l.ranks != 0)
      fail("tensor parts: segment of ", s, " is not a positive multiple of ",
           l.ranks, " ranks");
    r.whole += s;
  }
  r.part = partShape[size_t(l.dim)];
  if (r.whole / l.ranks != r.part)
    fail("tensor parts: a part holds ", r.part, " along dimension ", l.dim,
         "; the segments (", r.whole, " in all) over ", l.ranks, " ranks give ",
         r.whole / l.ranks);
  for (int i = 0; i < l.dim; ++i)
    r.outer *= partShape[size_t(i)];
  for (size_t i = size_t(l.dim) + 1; i < partShape.size(); ++i)
    r.inner *= partShape[i];
  return r;
}

/// Calls copy(wholeElement, partElement, elements) for every run of rank
/// `rank`'s part.
template <typename Fn>
void forEachRun(const TensorPartLayout &l, const Runs &r, int rank, Fn &&copy) {
  for (int64_t o = 0; o < r.outer; ++o) {
    int64_t segStart = 0, localAt = 0;
    for (int64_t s : l.segments) {
      int64_t block = s / l.ranks;
      copy((o * r.whole + segStart + rank * block) * r.inner,
           (o * r.part + localAt) * r.inner, block * r.inner);
      segStart += s;
      localAt += block;
    }
  }
}
} // namespace

std::vector<int64_t>
TensorPartLayout::wholeShape(const std::vector<int64_t> &part) const {
  Runs r = runsOf(*this, part);
  std::vector<int64_t> shape = part;
  shape[size_t(dim)] = r.whole;
  return shape;
}

void TensorPartLayout::take(const std::vector<int64_t> &partShape, int rank,
                            size_t elemBytes, const void *whole,
                            void *part) const {
  Runs r = runsOf(*this, partShape);
  if (rank < 0 || rank >= ranks)
    fail("tensor parts: rank ", rank, " of ", ranks);
  auto *src = static_cast<const char *>(whole);
  auto *dst = static_cast<char *>(part);
  forEachRun(*this, r, rank, [&](int64_t at, int64_t to, int64_t n) {
    std::memcpy(dst + to * elemBytes, src + at * elemBytes, n * elemBytes);
  });
}

void TensorPartLayout::join(const std::vector<int64_t> &partShape,
                            size_t elemBytes,
                            const std::vector<const void *> &parts,
                            void *whole) const {
  Runs r = runsOf(*this, partShape);
  if (int(parts.size()) != ranks)
    fail("tensor parts: ", parts.size(), " parts for ", ranks, " ranks");
  auto *dst = static_cast<char *>(whole);
  for (int k = 0; k < ranks; ++k) {
    auto *src = static_cast<const char *>(parts[size_t(k)]);
    forEachRun(*this, r, k, [&](int64_t at, int64_t from, int64_t n) {
      std::memcpy(dst + at * elemBytes, src + from * elemBytes, n * elemBytes);
    });
  }
}

} // namespace ap::rt
