//===- collectives.cpp - Self communicator, parallel groups ---------------===//
//
// The world factory (MPI / NCCL) lives in collectives_world.cpp, so that a
// binary that only uses the self communicator (a one-rank training binary)
// does not link MPI or NCCL.
//
#include "runtime/collectives.h"

#include "runtime/error.h"

#include <cstring>
#include <vector>

namespace ap::rt {

using ap::kernels::Backend;
using ap::kernels::DType;

size_t dtypeBytes(DType t) {
  switch (t) {
  case DType::BF16:
    return 2;
  case DType::F32:
  case DType::I32:
    return 4;
  case DType::F64:
    return 8;
  }
  fail("collectives: unknown dtype ", int(t));
}

namespace detail {

void sumInOrder(DType dtype, const void *const *blocks, size_t numBlocks,
                size_t count, void *out) {
  if (numBlocks == 0)
    fail("collectives: nothing to reduce");
  switch (dtype) {
  case DType::BF16: {
    auto *o = static_cast<ap::kernels::bf16 *>(out);
    for (size_t i = 0; i < count; ++i) {
      float acc = 0.0f;
      for (size_t b = 0; b < numBlocks; ++b)
        acc += float(static_cast<const ap::kernels::bf16 *>(blocks[b])[i]);
      o[i] = ap::kernels::bf16(acc);
    }
    break;
  }
  case DType::F32: {
    auto *o = static_cast<float *>(out);
    for (size_t i = 0; i < count; ++i) {
      float acc = static_cast<const float *>(blocks[0])[i];
      for (size_t b = 1; b < numBlocks; ++b)
        acc += static_cast<const float *>(blocks[b])[i];
      o[i] = acc;
    }
    break;
  }
  case DType::F64: {
    auto *o = static_cast<double *>(out);
    for (size_t i = 0; i < count; ++i) {
      double acc = static_cast<const double *>(blocks[0])[i];
      for (size_t b = 1; b < numBlocks; ++b)
        acc += static_cast<const double *>(blocks[b])[i];
      o[i] = acc;
    }
    break;
  }
  case DType::I32: {
    auto *o = static_cast<int32_t *>(out);
    for (size_t i = 0; i < count; ++i) {
      uint32_t acc = 0; // unsigned: overflow wraps instead of being UB
      for (size_t b = 0; b < numBlocks; ++b)
        acc += uint32_t(static_cast<const int32_t *>(blocks[b])[i]);
      o[i] = int32_t(acc);
    }
    break;
  }
  }
}

void addInto(DType dtype, void *recv, const void *add, size_t count) {
  // Two blocks in order: recv first, then add (sumInOrder reads element i of
  // every block before it writes out[i], so out may be recv).
  const void *blocks[2] = {recv, add};
  if (count)
    sumInOrder(dtype, blocks, 2, count, recv);
}

void addIntoBf16(ap::kernels::bf16 *recv, const float *add, size_t count) {
  for (size_t i = 0; i < count; ++i)
    recv[i] = ap::kernels::bf16(float(recv[i]) + add[i]);
}

} // namespace detail

namespace {

/// World of one on the host: every collective degenerates to a copy.
class SelfCommunicator final : public Communicator {
public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Backend backend() const override { return Backend::Host; }
  const char *kind() const override { return "self"; }

  void allReduceSum(const void *send, void *recv, size_t count, DType dtype,
                    void *) override {
    copy(send, recv, count, dtype);
  }
  void reduceScatterSum(const void *send, void *recv, size_t recvCount,
                        DType dtype, void *) override {
    if (send == recv)
      fail("collectives(self): reduceScatterSum cannot run in place");
    copy(send, recv, recvCount, dtype);
  }
  void reduceScatterSumAdd(void *send, void *recv, size_t recvCount,
                           DType dtype, void *) override {
    if (send == recv)
      fail("collectives(self): reduceScatterSumAdd cannot run in place");
    detail::addInto(dtype, recv, send, recvCount);
  }
  void reduceScatterSumAddBf16(float *send, ap::kernels::bf16 *recv,
                               size_t recvCount, void *) override {
    detail::addIntoBf16(recv, send, recvCount);
  }
  void allGather(const void *send, void *recv, size_t sendCount, DType dtype,
                 void *) override {
    if (send == recv)
      fail("collectives(self): allGather cannot run in place");
    copy(send, recv, sendCount, dtype);
  }
  void broadcast(void *, size_t, DType, int root, void *) override {
    if (root != 0)
      fail("collectives(self): broadcast root ", root, " in a world of one");
  }
  void send(const void *, size_t, DType, int peer, void *) override {
    fail("collectives(self): send to rank ", peer,
         " in a world of one (no pipeline neighbours)");
  }
  void recv(void *, size_t, DType, int peer, void *) override {
    fail("collectives(self): recv from rank ", peer,
         " in a world of one (no pipeline neighbours)");
  }
  void barrier() override {}
  bool allTrue(bool value) override { return value; }
  std::unique_ptr<Communicator> split(int, int) override {
    return std::make_unique<SelfCommunicator>();
  }

private:
  static void copy(const void *src, void *dst, size_t count, DType dtype) {
    if (src != dst && count)
      std::memmove(dst, src, count * dtypeBytes(dtype));
  }
};

} // namespace

std::unique_ptr<Communicator> createSelfCommunicator() {
  return std::make_unique<SelfCommunicator>();
}

ParallelGroups makeParallelGroups(Communicator &world, int tpSize, int ppSize) {
  int w = world.size();
  if (tpSize < 1 || ppSize < 1 || w % (tpSize * ppSize) != 0)
    fail("collectives: tensor-parallel size ", tpSize, " x pipeline size ",
         ppSize, " does not divide the world of ", w);
  ParallelGroups g;
  g.tpSize = tpSize;
  g.ppSize = ppSize;
  g.dpSize = w / (tpSize * ppSize);
  int r = world.rank();
  g.tpRank = r % tpSize;
  g.dpRank = (r / tpSize) % g.dpSize;
  g.ppRank = r / (tpSize * g.dpSize);
  // Split order is the same on every rank, as collectives require.
  g.tp = world.split(g.dpRank + g.dpSize * g.ppRank, g.tpRank);
  g.dp = world.split(g.tpRank + tpSize * g.ppRank, g.dpRank);
  g.pp = world.split(g.tpRank + tpSize * g.dpRank, g.ppRank);
  g.ppPrev = g.ppRank > 0 ? g.ppRank - 1 : -1;
  g.ppNext = g.ppRank + 1 < ppSize ? g.ppRank + 1 : -1;
  return g;
}

} // namespace ap::rt
