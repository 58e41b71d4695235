//===- pipeline.h - Point-to-point links between pipeline stages -*- C++
//-*-===//
//
// ap_pipeline_send / ap_pipeline_recv (runtime/abi.h) over the pipeline
// group of a StepRunner: boundary activations go to the next stage, their
// gradients to the previous one. Messages between two neighbours in one
// direction match in issue order (each side issues them in the same order),
// so there are no tags.
//
// Deadlock freedom under 1F1B needs one property: a send never blocks the
// comm stream (a stage's warm-up sends several activations before it
// receives the first gradient, while its neighbour sends that gradient
// before it receives the next activation). A receive does block the comm
// stream until the data arrived, so whatever waits on the comm stream
// after it sees the data.
//
//   - host backend: the comm stream's task copies the bytes out of the arena
//     into a buffer the links own and hands it to a sender thread per
//     neighbour (FIFO), which calls the communicator's blocking send; a
//     receive is a blocking recv on the comm stream's worker. MPI runs at
//     MPI_THREAD_MULTIPLE.
//   - cuda backend with a host communicator staged through pinned memory
//     (--comm mpi-staged): the same sender threads; the host thread stages
//     each send once the comm stream reached it, and each receive blocks
//     the host thread, then copies in on the comm stream. Every rank then
//     runs its step in program order with asynchronous sends, which 1F1B
//     allows. Bits and peaks, not speed, like the other staged collectives.
//   - cuda backend with NCCL (runtime/cuda/pipeline_nccl.cpp): one NCCL
//     communicator and one internal cudaStream per direction (toward the
//     next stage, toward the previous one), so a send to the next stage and
//     a receive from it never queue behind each other; a send first copies
//     its bytes into a device staging buffer on the comm stream, then the
//     direction's stream sends from there; a receive runs on the
//     direction's stream after the comm stream's earlier work, and the comm
//     stream waits for it.
//
// drain() waits until every send issued so far completed and rethrows the
// first failure, naming the peer; the step calls it in ap_end_loop.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_PIPELINE_H
#define ACTPLACE_RUNTIME_PIPELINE_H

#include "runtime/collectives.h"
#include "runtime/device.h"

#include <cstdint>
#include <memory>

namespace ap::rt {

/// Which neighbour of this stage (runtime/abi.h AP_PEER_*).
enum class PipelinePeer { Prev = 0, Next = 1 };

class PipelineLinks {
public:
  virtual ~PipelineLinks();
  /// Sends `bytes` at `src` (device memory of the arena) to `peer`, in comm
  /// stream order, without blocking the comm stream.
  virtual void send(const void *src, uint64_t bytes, PipelinePeer peer) = 0;
  /// Receives the next message from `peer` into `dst` on the comm stream.
  virtual void recv(void *dst, uint64_t bytes, PipelinePeer peer) = 0;
  /// Waits for every send issued so far (the comm stream's earlier work
  /// included); rethrows the first failed one.
  virtual void drain() = 0;
};

/// Links over `pp` (the pipeline group: stage s is rank s) for the stage
/// pp.rank(); the ranks of its neighbours are pp.rank() -+ 1 (-1: none).
/// Picks the host, staged or NCCL form from the device and communicator.
/// Collective over `pp` on cuda with NCCL (it splits two communicators);
/// every stage calls it.
std::unique_ptr<PipelineLinks> createPipelineLinks(Device &dev,
                                                   Communicator &pp);

/// The pipeline rank of `peer` of `stage` in `stages`; an error naming the
/// stage and `what` ("send to") when there is none.
int pipelineNeighbour(int stage, int stages, PipelinePeer peer,
                      const char *what);

/// Elements of `bytes` for a byte-level transfer: the widest of I32 and BF16
/// whose size divides it (refused otherwise, naming `what`).
size_t pipelineElements(uint64_t bytes, ap::kernels::DType &dtype,
                        const char *what);

#if defined(ACTPLACE_HAVE_CUDA)
/// The NCCL form (runtime/cuda/pipeline_nccl.cpp). Collective over `pp`.
std::unique_ptr<PipelineLinks> createNcclPipelineLinks(Device &dev,
                                                       Communicator &pp);
#endif

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_PIPELINE_H
