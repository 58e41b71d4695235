//===- tensor_parts.h - a tensor-parallel rank's part of a tensor ---------===//
//
// The one layout of tensor parallelism's split tensors (runtime/abi.h
// ap_param.tp_*), shared by the trainer (initialisation, --init-weights,
// --dump-grads) and actplace-ckpt (joining a checkpoint's parts): along
// dimension `dim` the whole tensor is the concatenation of `segments` (their
// whole extents), and rank r of `ranks` holds block r of every segment, in
// segment order. Byte-generic: `elemBytes` is the element size.
//
// Invariants (checked by every call, which throws ap::rt::Error naming what
// is wrong): 0 <= dim < the part's rank, ranks >= 1, every segment a positive
// multiple of ranks, the part's extent along dim the segments' sum / ranks.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_TENSOR_PARTS_H
#define ACTPLACE_RUNTIME_TENSOR_PARTS_H

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ap::rt {

struct TensorPartLayout {
  int dim = -1;
  std::vector<int64_t> segments;
  int ranks = 1;

  /// The whole tensor's shape for a part of shape `part`.
  std::vector<int64_t> wholeShape(const std::vector<int64_t> &part) const;
  /// Copies rank `rank`'s part out of `whole` into `part` (part-shaped).
  void take(const std::vector<int64_t> &partShape, int rank, size_t elemBytes,
            const void *whole, void *part) const;
  /// Copies every rank's part (parts[r], each part-shaped) into `whole`.
  void join(const std::vector<int64_t> &partShape, size_t elemBytes,
            const std::vector<const void *> &parts, void *whole) const;
};

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_TENSOR_PARTS_H
