//===- documents.h - packed documents of a cuda call, read on the host -*- C++
//-*-===//
//
// The chunked gated delta rule and attention take packed rows
// (kernels/kernels.h, docStart) on the cuda backend by running their
// one-document kernels once per document, on the document's own token range
// with batch 1. Every document is then computed by exactly the launches that
// would compute it as its own row, so a packed document's bits equal the
// unpacked ones by construction, and the kernels keep one code path.
//
// The document boundaries live in device memory (the step builds them from
// the token ids), and the launches are sized by them, so the entry reads the
// array back first: one device-to-host copy of B*T int32 and a wait on the
// call's stream. The host then checks the array's contract, which the
// kernels that read docStart per element cannot.
//
// Only .cu files include this header (it calls the CUDA runtime).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_CUDA_DOCUMENTS_H
#define ACTPLACE_KERNELS_CUDA_DOCUMENTS_H

#include "kernels/kernels.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

namespace ap::kernels::cudadocs {

/// One document: tokens [start, start + length) of row `row`. `first` and
/// `last`: the row's first and last documents (which carry the row's
/// initial and final recurrent states).
struct Document {
  int64_t row = 0, start = 0, length = 0;
  bool first = false, last = false;
};

/// Reads docStart [batch, seq] from device memory (after the work queued on
/// `stream`) and lists every row's documents in row and token order.
/// InvalidArgument when the array breaks the contract of kernels/kernels.h;
/// BackendError when the copy fails.
inline Status readDocuments(cudaStream_t stream, const int32_t *docStart,
                            int64_t batch, int64_t seq,
                            std::vector<Document> &out) {
  out.clear();
  if (batch <= 0 || seq <= 0)
    return Status::Ok;
  // One buffer per host thread: the step's entries run one at a time per
  // thread, and a reused buffer keeps the call free of allocations.
  thread_local std::vector<int32_t> host;
  host.resize(size_t(batch) * size_t(seq));
  cudaError_t err =
      cudaMemcpyAsync(host.data(), docStart, host.size() * sizeof(int32_t),
                      cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess)
    err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) {
    std::fprintf(stderr,
                 "actplace packed documents: reading docStart failed: "
                 "%s\n",
                 cudaGetErrorString(err));
    return Status::BackendError;
  }
  if (!docStartValid(host.data(), batch, seq))
    return Status::InvalidArgument;
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t *d = host.data() + b * seq;
    int64_t start = 0;
    for (int64_t t = 1; t <= seq; ++t) {
      if (t < seq && d[t] != t)
        continue;
      Document doc;
      doc.row = b;
      doc.start = start;
      doc.length = t - start;
      doc.first = start == 0;
      doc.last = t == seq;
      out.push_back(doc);
      start = t;
    }
  }
  return Status::Ok;
}

} // namespace ap::kernels::cudadocs

#endif // ACTPLACE_KERNELS_CUDA_DOCUMENTS_H
