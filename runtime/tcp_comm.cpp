//===- tcp_comm.cpp - Host collectives over the TCP rendezvous ------------===//
//
// The host backend's communicator for a torchrun-style launch (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT; no mpirun): every collective is one
// all-gather of the ranks' bytes through rank 0 (TcpRendezvous), after which
// each rank reduces the blocks itself in rank order 0, 1, ..., P-1 with the
// same detail::sumInOrder the MPI communicator uses, so every rank holds the
// bits MPI would give. Each rank moves P times the buffer per call: a path
// for tests and small runs, not for speed. A rank that dies closes its
// socket; the next collective of every other rank fails naming it, so a job
// without a launcher to clean up still ends (test/e2e/data_parallel.py,
// case torchrun).
//
//===----------------------------------------------------------------------===//
#include "runtime/collectives.h"

#include "runtime/error.h"

#include <cstring>
#include <memory>
#include <vector>

namespace ap::rt {

using ap::kernels::Backend;
using ap::kernels::DType;

namespace {

class TcpCommunicator final : public Communicator {
public:
  explicit TcpCommunicator(std::shared_ptr<TcpRendezvous> tcp)
      : tcp_(std::move(tcp)) {}

  int rank() const override { return tcp_->rank(); }
  int size() const override { return tcp_->worldSize(); }
  Backend backend() const override { return Backend::Host; }
  const char *kind() const override { return "tcp"; }

  void allReduceSum(const void *send, void *recv, size_t count, DType dtype,
                    void *) override {
    std::vector<std::vector<uint8_t>> all =
        gather(send, count * dtypeBytes(dtype), "allReduceSum");
    sumBlocks(all, 0, count, dtype, recv);
  }
  void reduceScatterSum(const void *send, void *recv, size_t recvCount,
                        DType dtype, void *) override {
    std::vector<std::vector<uint8_t>> all = gather(
        send, recvCount * dtypeBytes(dtype) * size(), "reduceScatterSum");
    sumBlocks(all, size_t(rank()) * recvCount, recvCount, dtype, recv);
  }
  void reduceScatterSumAdd(void *send, void *recv, size_t recvCount,
                           DType dtype, void *) override {
    std::vector<std::vector<uint8_t>> all = gather(
        send, recvCount * dtypeBytes(dtype) * size(), "reduceScatterSumAdd");
    std::vector<uint8_t> sum(recvCount * dtypeBytes(dtype));
    sumBlocks(all, size_t(rank()) * recvCount, recvCount, dtype, sum.data());
    detail::addInto(dtype, recv, sum.data(), recvCount);
  }
  void reduceScatterSumAddBf16(float *send, ap::kernels::bf16 *recv,
                               size_t recvCount, void *) override {
    std::vector<std::vector<uint8_t>> all = gather(
        send, recvCount * sizeof(float) * size(), "reduceScatterSumAddBf16");
    std::vector<float> sum(recvCount);
    sumBlocks(all, size_t(rank()) * recvCount, recvCount, DType::F32,
              sum.data());
    detail::addIntoBf16(recv, sum.data(), recvCount);
  }
  void allGather(const void *send, void *recv, size_t sendCount, DType dtype,
                 void *) override {
    size_t bytes = sendCount * dtypeBytes(dtype);
    std::vector<std::vector<uint8_t>> all = gather(send, bytes, "allGather");
    for (int r = 0; r < size(); ++r)
      if (bytes)
        std::memcpy(static_cast<char *>(recv) + size_t(r) * bytes,
                    all[size_t(r)].data(), bytes);
  }
  void broadcast(void *buf, size_t count, DType dtype, int root,
                 void *) override {
    if (root < 0 || root >= size())
      fail("collectives(tcp): broadcast root ", root, " outside the ", size(),
           " ranks");
    size_t bytes = count * dtypeBytes(dtype);
    // Only the root's bytes travel; the others send an empty block.
    std::vector<std::vector<uint8_t>> all =
        gather(buf, rank() == root ? bytes : 0, "broadcast", root);
    if (rank() != root && bytes)
      std::memcpy(buf, all[size_t(root)].data(), bytes);
  }
  void send(const void *, size_t, DType, int peer, void *) override {
    fail("collectives(tcp): send to rank ", peer,
         ": point-to-point transfers (pipeline stages) need mpirun or NCCL, "
         "not the TCP communicator of a torchrun-style host launch");
  }
  void recv(void *, size_t, DType, int peer, void *) override {
    fail("collectives(tcp): recv from rank ", peer,
         ": point-to-point transfers (pipeline stages) need mpirun or NCCL, "
         "not the TCP communicator of a torchrun-style host launch");
  }
  void barrier() override { tcp_->barrier(); }
  bool allTrue(bool value) override {
    uint8_t mine = value ? 1 : 0;
    std::vector<std::vector<uint8_t>> all = gather(&mine, 1, "allTrue");
    bool out = true;
    for (const std::vector<uint8_t> &v : all)
      out = out && v.size() == 1 && v[0] == 1;
    return out;
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    // Groups other than the whole world need a connection per group; the
    // data-parallel group of a run without tensor or pipeline parallelism is
    // the world, which is all this communicator serves.
    int32_t mine[2] = {color, key};
    std::vector<std::vector<uint8_t>> all = gather(mine, sizeof(mine), "split");
    int32_t lastKey = 0;
    for (int r = 0; r < size(); ++r) {
      int32_t theirs[2];
      std::memcpy(theirs, all[size_t(r)].data(), sizeof(theirs));
      if (theirs[0] != color || (r > 0 && theirs[1] < lastKey))
        fail("collectives(tcp): split into groups other than the whole "
             "world in rank order (rank ",
             r, " has color ", theirs[0], " and key ", theirs[1],
             "); tensor and pipeline groups need mpirun or NCCL");
      lastKey = theirs[1];
    }
    return std::make_unique<TcpCommunicator>(tcp_);
  }

private:
  /// Every rank's `bytes` at `data`, by rank. All ranks must send the same
  /// number of bytes (except for a broadcast, where only `root` sends).
  std::vector<std::vector<uint8_t>> gather(const void *data, size_t bytes,
                                           const char *what, int root = -1) {
    const uint8_t *p = static_cast<const uint8_t *>(data);
    std::vector<std::vector<uint8_t>> all =
        tcp_->allGather(std::vector<uint8_t>(p, p + bytes));
    for (int r = 0; r < size(); ++r) {
      size_t expect =
          root < 0 ? bytes : (r == root ? all[size_t(root)].size() : 0);
      if (all[size_t(r)].size() != expect)
        fail("collectives(tcp): ", what, ": rank ", r, " sent ",
             all[size_t(r)].size(), " bytes, this rank expected ", expect,
             " (the ranks run different programs?)");
    }
    return all;
  }

  /// out = sum over ranks, in rank order, of `count` elements starting at
  /// element `first` of each rank's block.
  void sumBlocks(const std::vector<std::vector<uint8_t>> &all, size_t first,
                 size_t count, DType dtype, void *out) {
    std::vector<const void *> blocks;
    for (const std::vector<uint8_t> &v : all)
      blocks.push_back(v.data() + first * dtypeBytes(dtype));
    detail::sumInOrder(dtype, blocks.data(), blocks.size(), count, out);
  }

  std::shared_ptr<TcpRendezvous> tcp_;
};

} // namespace

std::unique_ptr<Communicator> createTcpCommunicator(const LaunchInfo &launch,
                                                    double timeoutSeconds) {
  return std::make_unique<TcpCommunicator>(
      std::make_shared<TcpRendezvous>(launch, timeoutSeconds));
}

} // namespace ap::rt
