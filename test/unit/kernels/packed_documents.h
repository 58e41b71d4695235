//===- packed_documents.h - a packed row for kernel tests ------*- C++ -*-===//
//
// One row of T tokens holding several documents (kernels/kernels.h, packed
// sequences), for the tests that compare a packed row with its documents
// run alone: the GPU tests and the host emulation of the CUDA conv.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TEST_UNIT_KERNELS_PACKED_DOCUMENTS_H
#define ACTPLACE_TEST_UNIT_KERNELS_PACKED_DOCUMENTS_H

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ap::test {

struct PackedRow {
  int T;
  /// First token of each document, increasing, the first 0.
  std::vector<int> starts;

  size_t documents() const { return starts.size(); }
  int length(size_t d) const {
    return (d + 1 < starts.size() ? starts[d + 1] : T) - starts[d];
  }
  /// The kernels' docStart array of the row.
  std::vector<int32_t> docStart() const {
    std::vector<int32_t> ds(static_cast<size_t>(T));
    for (size_t d = 0; d < starts.size(); ++d)
      for (int t = starts[d]; t < starts[d] + length(d); ++t)
        ds[size_t(t)] = starts[d];
    return ds;
  }
};

/// Documents at 0, 37, 106 (inside the second 64-token chunk) and 199 of a
/// 200-token row.
inline PackedRow kPackedRow200{200, {0, 37, 106, 199}};

} // namespace ap::test

#endif // ACTPLACE_TEST_UNIT_KERNELS_PACKED_DOCUMENTS_H
