//===- collectives_nccl_ranks_test.cpp - NCCL across ranks (GPUs) ---------===//
//
// The multi-rank NCCL path: one process per GPU, launched torchrun-style
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), the NCCL unique id
// shared by the TCP rendezvous. Skips unless launched that way with a GPU per
// local rank, so plain ctest (and CI) skips it. Run by hand on a multi-GPU
// machine:
//   for r in 0 1; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
//     MASTER_PORT=29555 ./runtime_collectives_nccl_ranks_test & done; wait
//
//===----------------------------------------------------------------------===//
#include "runtime/collectives.h"
#include "runtime/launch.h"

#include <gtest/gtest.h>

#if defined(ACTPLACE_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

#include <cstdlib>
#include <cstring>
#include <vector>

using namespace ap::rt;
using ap::kernels::Backend;
using ap::kernels::DType;

namespace {

#if defined(ACTPLACE_HAVE_CUDA) && defined(ACTPLACE_HAVE_NCCL)

#define CHECK_CUDA(x) ASSERT_EQ((x), cudaSuccess) << #x

/// Rank r contributes x_r[i] = (i % 101) * 0.25 + r: the sum over R ranks is
/// R * (i % 101) * 0.25 + R (R - 1) / 2, exact in f32 for these values.
float contribution(size_t i, int rank) { return float(i % 101) * 0.25f + rank; }

TEST(NcclCollectives, AcrossRanks) {
  const char *world = std::getenv("WORLD_SIZE");
  int gpus = 0;
  if (!world || std::atoi(world) < 2 ||
      cudaGetDeviceCount(&gpus) != cudaSuccess)
    GTEST_SKIP() << "not launched as one of several ranks (WORLD_SIZE >= 2)";
  LaunchInfo launch = detectLaunch();
  if (gpus <= launch.localRank)
    GTEST_SKIP() << "no GPU for local rank " << launch.localRank;
  CHECK_CUDA(cudaSetDevice(launch.localRank));
  auto comm = createWorldCommunicator(Backend::Cuda, launch);
  ASSERT_STREQ(comm->kind(), "nccl");
  const int R = comm->size(), me = comm->rank();
  ASSERT_EQ(R, launch.worldSize);
  ASSERT_EQ(me, launch.rank);

  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t n = (size_t(1) << 22) + 7;
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i)
    h[i] = contribution(i, me);
  float *d = nullptr, *r = nullptr;
  CHECK_CUDA(cudaMalloc(&d, n * 4));
  CHECK_CUDA(cudaMalloc(&r, n * 4 * R));
  CHECK_CUDA(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));

  // All-reduce twice: the exact sum, and the same bits both times.
  std::vector<float> out1(n), out2(n);
  for (std::vector<float> *out : {&out1, &out2}) {
    CHECK_CUDA(cudaMemset(r, 0xff, n * 4));
    comm->allReduceSum(d, r, n, DType::F32, s);
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaMemcpy(out->data(), r, n * 4, cudaMemcpyDeviceToHost));
  }
  for (size_t i = 0; i < n; i += 4099) {
    float expect = 0;
    for (int k = 0; k < R; ++k)
      expect += contribution(i, k);
    ASSERT_EQ(out1[i], expect) << "element " << i;
  }
  ASSERT_EQ(0, std::memcmp(out1.data(), out2.data(), n * 4));

  // All-gather: block k holds rank k's contribution.
  CHECK_CUDA(cudaMemset(r, 0xff, n * 4 * R));
  comm->allGather(d, r, n, DType::F32, s);
  CHECK_CUDA(cudaStreamSynchronize(s));
  std::vector<float> gathered(n * R);
  CHECK_CUDA(cudaMemcpy(gathered.data(), r, n * 4 * R, cudaMemcpyDeviceToHost));
  for (int k = 0; k < R; ++k)
    for (size_t i = 0; i < n; i += 8191)
      ASSERT_EQ(gathered[k * n + i], contribution(i, k));

  // Broadcast from the last rank.
  CHECK_CUDA(cudaMemcpy(r, d, n * 4, cudaMemcpyDeviceToDevice));
  comm->broadcast(r, n, DType::F32, R - 1, s);
  CHECK_CUDA(cudaStreamSynchronize(s));
  std::vector<float> b(n);
  CHECK_CUDA(cudaMemcpy(b.data(), r, n * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i += 8191)
    ASSERT_EQ(b[i], contribution(i, R - 1));
  EXPECT_TRUE(comm->allTrue(true));
  CHECK_CUDA(cudaFree(d));
  CHECK_CUDA(cudaFree(r));
  CHECK_CUDA(cudaStreamDestroy(s));
}

#else
TEST(NcclCollectives, AcrossRanks) {
  GTEST_SKIP() << "built without CUDA/NCCL";
}
#endif

} // namespace
