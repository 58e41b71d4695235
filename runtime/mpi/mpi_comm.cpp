//===- mpi_comm.cpp - Host-backend collectives over MPI -------------------===//
//
// Reductions never use MPI_Allreduce/MPI_SUM: its summation order depends on
// the algorithm Open MPI picks (by message size and rank count), and MPI has
// no bfloat16 type. Instead each rank owns a contiguous chunk, receives that
// chunk from every rank (MPI_Alltoallv of raw bytes), sums it in rank order
// (detail::sumInOrder) and the chunks are all-gathered. Same bytes on the
// wire as a ring all-reduce, and bit-identical results on every rank and
// every run.
//
//===----------------------------------------------------------------------===//
#include "runtime/collectives.h"

#include "runtime/error.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace ap::rt {
namespace {

using ap::kernels::Backend;
using ap::kernels::DType;

/// Checks an MPI return code (communicators use MPI_ERRORS_RETURN, so errors
/// come back here instead of aborting) and names the failing call.
#define AP_MPI_CHECK(call)                                                     \
  do {                                                                         \
    int apMpiRc_ = (call);                                                     \
    if (apMpiRc_ != MPI_SUCCESS) {                                             \
      char apMpiMsg_[MPI_MAX_ERROR_STRING];                                    \
      int apMpiLen_ = 0;                                                       \
      MPI_Error_string(apMpiRc_, apMpiMsg_, &apMpiLen_);                       \
      ::ap::rt::fail("mpi: ", #call,                                           \
                     " failed: ", std::string(apMpiMsg_, size_t(apMpiLen_)));  \
    }                                                                          \
  } while (0)

/// Largest byte count handed to one MPI call (counts are int), and the
/// all-reduce segment size (bounds its temporaries), unless CommOptions::
/// mpiSegmentBytes asks for less.
constexpr size_t kDefaultSegmentBytes = size_t(1) << 28;

void finalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized)
    MPI_Finalize();
}

void ensureMpi() {
  int initialized = 0;
  AP_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized)
    return;
  // MULTIPLE because the runtime's comm stream is a worker thread, and
  // other threads (checkpoint barriers) may also call in.
  int provided = 0;
  AP_MPI_CHECK(
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
  if (provided < MPI_THREAD_SERIALIZED)
    fail("mpi: the MPI library provides thread level ", provided,
         "; the runtime needs at least MPI_THREAD_SERIALIZED");
  std::atexit(finalizeAtExit);
}

class MpiCommunicator final : public Communicator {
public:
  /// Takes ownership of `comm` unless it is MPI_COMM_WORLD. `segmentBytes`:
  /// see CommOptions::mpiSegmentBytes (0: kDefaultSegmentBytes).
  MpiCommunicator(MPI_Comm comm, size_t segmentBytes) : comm_(comm) {
    AP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    AP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    AP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    if (segmentBytes != 0) {
      if (segmentBytes < 64 || segmentBytes > kDefaultSegmentBytes)
        fail("mpi: segment of ", segmentBytes,
             " bytes (CommOptions::"
             "mpiSegmentBytes) must be in [64, ",
             kDefaultSegmentBytes, "]");
      segmentBytes_ = segmentBytes;
    }
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_WORLD && !finalized)
      MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::Host; }
  const char *kind() const override { return "mpi"; }

  void allReduceSum(const void *send, void *recv, size_t count, DType dtype,
                    void *) override {
    const size_t esz = dtypeBytes(dtype);
    const size_t P = size_t(size_);
    // Segments keep every per-peer message under segmentBytes_ and bound
    // the temporary memory.
    const size_t segElems = std::max<size_t>(P, segmentBytes_ / esz);
    std::vector<uint8_t> staged; // the input when reducing in place
    const uint8_t *in = static_cast<const uint8_t *>(send);
    if (send == recv && count) {
      staged.assign(in, in + count * esz);
      in = staged.data();
    }
    uint8_t *out = static_cast<uint8_t *>(recv);
    for (size_t base = 0; base < count; base += segElems) {
      size_t n = std::min(segElems, count - base);
      // Chunk c = [c*n/P, (c+1)*n/P): balanced, covers n exactly.
      std::vector<int> cnt(P), off(P), rcnt(P), roff(P);
      for (size_t c = 0; c < P; ++c) {
        size_t b = c * n / P, e = (c + 1) * n / P;
        cnt[c] = int((e - b) * esz);
        off[c] = int(b * esz);
      }
      size_t mine = size_t(cnt[size_t(rank_)]);
      for (size_t r = 0; r < P; ++r) {
        rcnt[r] = int(mine);
        roff[r] = int(r * mine);
      }
      std::vector<uint8_t> gathered(P * mine), reduced(mine);
      AP_MPI_CHECK(MPI_Alltoallv(in + base * esz, cnt.data(), off.data(),
                                 MPI_BYTE, gathered.data(), rcnt.data(),
                                 roff.data(), MPI_BYTE, comm_));
      std::vector<const void *> blocks(P);
      for (size_t r = 0; r < P; ++r)
        blocks[r] = gathered.data() + r * mine;
      if (mine)
        detail::sumInOrder(dtype, blocks.data(), P, mine / esz, reduced.data());
      AP_MPI_CHECK(MPI_Allgatherv(reduced.data(), int(mine), MPI_BYTE,
                                  out + base * esz, cnt.data(), off.data(),
                                  MPI_BYTE, comm_));
    }
  }

  void reduceScatterSum(const void *send, void *recv, size_t recvCount,
                        DType dtype, void *) override {
    if (send == recv)
      fail("mpi: reduceScatterSum cannot run in place");
    const size_t bytes = recvCount * dtypeBytes(dtype);
    checkSize(bytes, "reduceScatterSum");
    const size_t P = size_t(size_);
    std::vector<uint8_t> gathered(P * bytes);
    AP_MPI_CHECK(MPI_Alltoall(send, int(bytes), MPI_BYTE, gathered.data(),
                              int(bytes), MPI_BYTE, comm_));
    std::vector<const void *> blocks(P);
    for (size_t r = 0; r < P; ++r)
      blocks[r] = gathered.data() + r * bytes;
    if (recvCount)
      detail::sumInOrder(dtype, blocks.data(), P, recvCount, recv);
  }

  void reduceScatterSumAdd(void *send, void *recv, size_t recvCount,
                           DType dtype, void *) override {
    if (send == recv)
      fail("mpi: reduceScatterSumAdd cannot run in place");
    // The rank-order sum as reduceScatterSum gives it (rounded to the
    // dtype), then one add into recv: the same two roundings as NCCL's
    // reduce-scatter followed by the add kernel.
    std::vector<uint8_t> sum(recvCount * dtypeBytes(dtype));
    reduceScatterSum(send, sum.data(), recvCount, dtype, nullptr);
    detail::addInto(dtype, recv, sum.data(), recvCount);
  }
  void reduceScatterSumAddBf16(float *send, ap::kernels::bf16 *recv,
                               size_t recvCount, void *) override {
    // The F32 rank-order sum, then one add and one rounding to bf16.
    std::vector<float> sum(recvCount);
    reduceScatterSum(send, sum.data(), recvCount, DType::F32, nullptr);
    detail::addIntoBf16(recv, sum.data(), recvCount);
  }

  void allGather(const void *send, void *recv, size_t sendCount, DType dtype,
                 void *) override {
    if (send == recv)
      fail("mpi: allGather cannot run in place");
    const size_t bytes = sendCount * dtypeBytes(dtype);
    checkSize(bytes, "allGather");
    AP_MPI_CHECK(MPI_Allgather(send, int(bytes), MPI_BYTE, recv, int(bytes),
                               MPI_BYTE, comm_));
  }

  void broadcast(void *buf, size_t count, DType dtype, int root,
                 void *) override {
    checkPeer(root, "broadcast root", true);
    uint8_t *p = static_cast<uint8_t *>(buf);
    size_t bytes = count * dtypeBytes(dtype);
    for (size_t off = 0; off < bytes; off += segmentBytes_)
      AP_MPI_CHECK(MPI_Bcast(p + off, int(std::min(segmentBytes_, bytes - off)),
                             MPI_BYTE, root, comm_));
  }

  void send(const void *buf, size_t count, DType dtype, int peer,
            void *) override {
    checkPeer(peer, "send peer", false);
    const uint8_t *p = static_cast<const uint8_t *>(buf);
    size_t bytes = count * dtypeBytes(dtype);
    for (size_t off = 0; off < bytes; off += segmentBytes_)
      AP_MPI_CHECK(MPI_Send(p + off, int(std::min(segmentBytes_, bytes - off)),
                            MPI_BYTE, peer, kTag, comm_));
  }

  void recv(void *buf, size_t count, DType dtype, int peer, void *) override {
    checkPeer(peer, "recv peer", false);
    uint8_t *p = static_cast<uint8_t *>(buf);
    size_t bytes = count * dtypeBytes(dtype);
    for (size_t off = 0; off < bytes; off += segmentBytes_) {
      int want = int(std::min(segmentBytes_, bytes - off));
      MPI_Status st;
      AP_MPI_CHECK(MPI_Recv(p + off, want, MPI_BYTE, peer, kTag, comm_, &st));
      int got = 0;
      AP_MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &got));
      if (got != want)
        fail("mpi: recv from rank ", peer, " got ", got, " bytes, expected ",
             want, " (mismatched send/recv sizes)");
    }
  }

  void barrier() override { AP_MPI_CHECK(MPI_Barrier(comm_)); }

  bool allTrue(bool value) override {
    int v = value ? 1 : 0;
    AP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, comm_));
    return v != 0;
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub;
    AP_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
    return std::make_unique<MpiCommunicator>(sub, segmentBytes_);
  }

private:
  static constexpr int kTag = 0x6170; // "ap"

  void checkSize(size_t bytes, const char *what) const {
    if (bytes > size_t(INT_MAX))
      fail("mpi: ", what, " of ", bytes,
           " bytes per rank exceeds the 2 GiB MPI message limit; split the "
           "buffer");
  }
  void checkPeer(int peer, const char *what, bool selfOk) const {
    if (peer < 0 || peer >= size_ || (!selfOk && peer == rank_))
      fail("mpi: ", what, " ", peer, " is not another rank of this ", size_,
           "-rank communicator (this is rank ", rank_, ")");
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  size_t segmentBytes_ = kDefaultSegmentBytes;
};

} // namespace

std::unique_ptr<Communicator> createMpiWorldCommunicator(size_t segmentBytes) {
  ensureMpi();
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, segmentBytes);
}

void mpiBroadcastBytes(void *bytes, size_t n) {
  ensureMpi();
  if (n > size_t(INT_MAX))
    fail("mpi: broadcast of ", n, " bytes is too large for the bootstrap");
  AP_MPI_CHECK(MPI_Bcast(bytes, int(n), MPI_BYTE, 0, MPI_COMM_WORLD));
}

} // namespace ap::rt
