//===- collectives.h - Collective communication over communicators -*- C++
//-*-===//
//
// All-reduce (sum), reduce-scatter (sum), all-gather, broadcast and
// send/recv over communicators: the world, tensor-parallel and data-parallel
// groups, and pipeline neighbours (docs/architecture.md section 5).
//
// Implementations:
//   - "self": a world of one on the host backend (copies; no launcher).
//   - "tcp": host backend across processes started without mpirun
//     (torchrun-style environment): every call an all-gather through rank 0
//     over the TCP rendezvous, then the same rank-order sums as "mpi".
//   - "mpi": host backend across processes (Open MPI). Calls block the calling
//     thread (the runtime issues them from its comm stream's worker, so they
//     are ordered like any other task on that stream); `stream` is ignored.
//     Sums are deterministic: every element is reduced by one owner rank in
//     rank order 0, 1, ..., P-1 (fp32 accumulation for BF16, rounded once) and
//     the result is distributed, so all ranks get identical bits whatever MPI's
//     internal algorithm is.
//   - "nccl": cuda backend (world of one included). Calls are enqueued on the
//     cudaStream_t passed as `stream` and return immediately. The device must
//     already be selected (cudaSetDevice) by the caller.
// Every failing MPI/NCCL/CUDA call throws ap::rt::Error naming the call.
//
// Buffers are in the backend's memory space: host memory for self/mpi, device
// memory for nccl. Counts are elements; in-place use (send == recv) is allowed
// for allReduceSum only.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_COLLECTIVES_H
#define ACTPLACE_RUNTIME_COLLECTIVES_H

#include "kernels/kernels.h"
#include "runtime/launch.h"

#include <cstddef>
#include <functional>
#include <memory>

namespace ap::rt {

/// Bytes of one element of a kernel dtype.
size_t dtypeBytes(ap::kernels::DType t);

class Communicator {
public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual ap::kernels::Backend backend() const = 0;
  /// "self", "mpi" or "nccl".
  virtual const char *kind() const = 0;

  /// recv[i] = sum over ranks of send[i], i < count.
  virtual void allReduceSum(const void *send, void *recv, size_t count,
                            ap::kernels::DType dtype, void *stream) = 0;
  /// send holds size() blocks of recvCount elements; this rank receives the
  /// sum over ranks of block rank().
  virtual void reduceScatterSum(const void *send, void *recv, size_t recvCount,
                                ap::kernels::DType dtype, void *stream) = 0;
  /// recv[i] += block rank() of the sum over ranks of send (the sum in
  /// rank order as reduceScatterSum, then one add, rounded once): a sharded
  /// main grad accumulating microbatches. `send` is scratch afterwards (nccl
  /// reduces in place inside it, then adds on the same stream).
  virtual void reduceScatterSumAdd(void *send, void *recv, size_t recvCount,
                                   ap::kernels::DType dtype, void *stream) = 0;
  /// reduceScatterSumAdd of an F32 `send` into a BF16 `recv` (a bf16
  /// sharded main grad): recv[i] = bf16(float(recv[i]) + block rank() of the
  /// F32 rank-order sum), one round-to-nearest-even per call. `send` is
  /// scratch afterwards.
  virtual void reduceScatterSumAddBf16(float *send, ap::kernels::bf16 *recv,
                                       size_t recvCount, void *stream) = 0;
  /// recv holds size() blocks of sendCount elements, block r from rank r.
  virtual void allGather(const void *send, void *recv, size_t sendCount,
                         ap::kernels::DType dtype, void *stream) = 0;
  /// buf of rank `root` is copied into buf of every rank.
  virtual void broadcast(void *buf, size_t count, ap::kernels::DType dtype,
                         int root, void *stream) = 0;
  /// Point to point; peer is a rank of this communicator (not this rank).
  virtual void send(const void *buf, size_t count, ap::kernels::DType dtype,
                    int peer, void *stream) = 0;
  virtual void recv(void *buf, size_t count, ap::kernels::DType dtype, int peer,
                    void *stream) = 0;

  /// Blocks the calling thread until every rank has called it (host side;
  /// on nccl it does not wait for earlier work on other streams).
  /// Collectives issued between groupStart and groupEnd may be launched
  /// as one (NCCL's group calls), enqueued at groupEnd. Only calls whose
  /// result does not depend on the launch (all-gathers, copies) are put in
  /// a group (StepRunner::commGroupBegin). Default: no group, each call
  /// runs as it is issued.
  virtual void groupStart() {}
  virtual void groupEnd() {}
  virtual void barrier() = 0;

  /// Blocks until every rank has called it and returns the logical AND of
  /// their `value`s: lets ranks agree that a multi-step action (a checkpoint
  /// save) succeeded everywhere before committing it. Also a barrier.
  virtual bool allTrue(bool value) = 0;

  /// Collective: ranks passing the same `color` form a new communicator,
  /// ordered by `key` (ties by current rank).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  /// The communicator over host memory this one moves its bytes with:
  /// itself on the host backend, the wrapped MPI communicator for
  /// mpi-staged, null for nccl (pipeline sends stage their bytes through it,
  /// runtime/pipeline.h).
  virtual Communicator *hostCommunicator() {
    return backend() == ap::kernels::Backend::Host ? this : nullptr;
  }
};

namespace detail {
/// out[i] = blocks[0][i] + blocks[1][i] + ... in this order, accumulated in
/// float for BF16 (rounded once) and F32, double for F64, wrapping int32 for
/// I32. The fixed order is what makes host reductions bit-reproducible.
void sumInOrder(ap::kernels::DType dtype, const void *const *blocks,
                size_t numBlocks, size_t count, void *out);
/// recv[i] = recv[i] + add[i] in the dtype's accumulation type, rounded
/// once (the host side of reduceScatterSumAdd).
void addInto(ap::kernels::DType dtype, void *recv, const void *add,
             size_t count);
/// recv[i] = bf16(float(recv[i]) + add[i]), rounded once (the host side
/// of reduceScatterSumAddBf16).
void addIntoBf16(ap::kernels::bf16 *recv, const float *add, size_t count);
} // namespace detail

/// A world of one on the host backend: reductions are copies.
std::unique_ptr<Communicator> createSelfCommunicator();

/// The host backend's world for a launch without mpirun (torchrun-style:
/// RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): collectives through rank 0
/// over TCP (runtime/tcp_comm.cpp), reduced in rank order like "mpi", so
/// the bits are MPI's. For tests and small runs (each rank moves P times
/// every buffer). Blocks until all ranks connected (or the timeout).
std::unique_ptr<Communicator> createTcpCommunicator(const LaunchInfo &launch,
                                                    double timeoutSeconds);

struct CommOptions {
  /// How long ranks wait for each other in the bootstrap.
  double rendezvousTimeoutSeconds = 300.0;
  /// MPI (host backend): the most bytes of one MPI message, and the
  /// all-reduce segment (bounds its temporaries); 64 to 256 MiB, 0 for
  /// 256 MiB. Tests use a small value to exercise segmentation.
  size_t mpiSegmentBytes = 0;
  /// cuda backend: run the collectives over MPI with device buffers staged
  /// through pinned host memory instead of NCCL (several ranks on one GPU,
  /// which NCCL refuses; bits and peaks, not speed). Needs mpirun.
  bool stagedMpi = false;
};

/// The world communicator for this process:
///   - host backend, world of one: self;
///   - host backend, several ranks: MPI under mpirun; TCP through rank 0
///     (createTcpCommunicator) under a torchrun-style launch (RANK,
///     WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or srun;
///   - cuda backend: NCCL; the unique id travels by MPI_Bcast under mpirun
///     (when built with MPI), else by TcpRendezvous (MASTER_ADDR/PORT);
///     with options.stagedMpi, MPI on device buffers staged through pinned
///     memory (mpirun only).
/// Throws ap::rt::Error when the backend is unavailable in this build.
std::unique_ptr<Communicator>
createWorldCommunicator(ap::kernels::Backend backend, const LaunchInfo &launch,
                        const CommOptions &options = CommOptions());

/// The standard 3-D layout: world rank = tp + TP * (dp + DP * pp), i.e.
/// tensor-parallel ranks are adjacent (one node), then data parallel, then
/// pipeline stages (Megatron's default order).
struct ParallelGroups {
  int tpSize = 1, dpSize = 1, ppSize = 1;
  int tpRank = 0, dpRank = 0, ppRank = 0;
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> dp;
  /// Ranks of one pipeline (same tp, dp); stage s is rank s in it.
  std::unique_ptr<Communicator> pp;
  /// Pipeline neighbours as ranks of `pp` (-1 at the ends).
  int ppPrev = -1, ppNext = -1;
};

/// Collective over `world`: splits it into the groups above. Throws
/// ap::rt::Error when tpSize * ppSize does not divide the world size.
ParallelGroups makeParallelGroups(Communicator &world, int tpSize, int ppSize);

#if defined(ACTPLACE_HAVE_MPI)
/// MPI_COMM_WORLD (initialising MPI with MPI_THREAD_MULTIPLE if needed,
/// finalised at exit), messages of at most `segmentBytes` (CommOptions::
/// mpiSegmentBytes). Defined in runtime/mpi/.
std::unique_ptr<Communicator> createMpiWorldCommunicator(size_t segmentBytes);
/// Broadcasts `bytes` from world rank 0 over MPI_COMM_WORLD.
void mpiBroadcastBytes(void *bytes, size_t n);
#endif

#if defined(ACTPLACE_HAVE_CUDA) && defined(ACTPLACE_HAVE_MPI)
/// Device buffers staged through pinned host memory around `host`'s
/// collectives (CommOptions::stagedMpi). Defined in
/// runtime/cuda/staged_comm.cpp.
std::unique_ptr<Communicator>
createStagedMpiCommunicator(std::unique_ptr<Communicator> host);
#endif

#if defined(ACTPLACE_HAVE_CUDA)
/// recv[i] += add[i] (F32 or BF16, in float, rounded once) enqueued on the
/// cudaStream_t `stream`: the add of reduceScatterSumAdd on NCCL. Defined in
/// runtime/cuda/accumulate.cu.
void cudaAddInto(ap::kernels::DType dtype, void *recv, const void *add,
                 size_t count, void *stream);
/// recv[i] = bf16(float(recv[i]) + add[i]) (rounded once) on `stream`:
/// the add of reduceScatterSumAddBf16 on NCCL.
void cudaAddIntoBf16(ap::kernels::bf16 *recv, const float *add, size_t count,
                     void *stream);
#endif

#if defined(ACTPLACE_HAVE_CUDA)
/// NCCL over `launch` (see createWorldCommunicator). `shareId` must deliver
/// rank 0's 128-byte id to every rank. Defined in runtime/cuda/nccl_comm.cpp;
/// throws when built without NCCL.
std::unique_ptr<Communicator>
createNcclWorldCommunicator(const LaunchInfo &launch,
                            const std::function<void(void *, size_t)> &shareId);
#endif

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_COLLECTIVES_H
