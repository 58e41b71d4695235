//===- collectives_nccl_test.cpp - NCCL world of one (needs a GPU) --------===//
//
// NCCL cannot put two ranks on one GPU, so on a single-GPU machine this is
// the NCCL path that can run: a world of one through the same factory the
// training binary uses. Skipped without CUDA/NCCL in the build or without a
// usable GPU.
//
//===----------------------------------------------------------------------===//
#include "runtime/collectives.h"

#include "runtime/error.h"

#include <gtest/gtest.h>

#if defined(ACTPLACE_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

using namespace ap::rt;
using ap::kernels::Backend;
using ap::kernels::bf16;
using ap::kernels::DType;

namespace {

#if defined(ACTPLACE_HAVE_CUDA) && defined(ACTPLACE_HAVE_NCCL)

bool haveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CHECK_CUDA(x) ASSERT_EQ((x), cudaSuccess) << #x

TEST(NcclCollectives, WorldOfOne) {
  if (!haveGpu())
    GTEST_SKIP() << "no usable GPU";
  CHECK_CUDA(cudaSetDevice(0));
  LaunchInfo none;
  auto w = createWorldCommunicator(Backend::Cuda, none);
  EXPECT_STREQ(w->kind(), "nccl");
  EXPECT_EQ(w->size(), 1);
  EXPECT_EQ(w->rank(), 0);
  EXPECT_EQ(w->backend(), Backend::Cuda);

  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t n = (size_t(1) << 20) + 3;
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i)
    h[i] = float(i % 977) * 0.37f - 100.0f;
  float *d = nullptr, *r = nullptr;
  CHECK_CUDA(cudaMalloc(&d, n * 4));
  CHECK_CUDA(cudaMalloc(&r, n * 4 * 2));
  CHECK_CUDA(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(r, 0, n * 8));
  // Out of place, in place, bf16, broadcast, all-gather, reduce-scatter
  // (and its accumulating form).
  w->allReduceSum(d, r, n, DType::F32, s);
  w->allReduceSum(d, d, n, DType::F32, s);
  CHECK_CUDA(cudaStreamSynchronize(s));
  std::vector<float> back(n), back2(n);
  CHECK_CUDA(cudaMemcpy(back.data(), r, n * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(back2.data(), d, n * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, h);
  EXPECT_EQ(back2, h);

  std::vector<bf16> hb(1000);
  for (size_t i = 0; i < hb.size(); ++i)
    hb[i] = bf16(float(i) * 0.125f - 7.0f);
  CHECK_CUDA(cudaMemcpy(d, hb.data(), 2000, cudaMemcpyHostToDevice));
  w->allReduceSum(d, r, 1000, DType::BF16, s);
  w->broadcast(r, 1000, DType::BF16, 0, s);
  CHECK_CUDA(cudaStreamSynchronize(s));
  std::vector<bf16> hb2(1000);
  CHECK_CUDA(cudaMemcpy(hb2.data(), r, 2000, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < hb.size(); ++i)
    ASSERT_EQ(hb2[i].bits, hb[i].bits);

  CHECK_CUDA(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
  w->allGather(d, r, n, DType::F32, s);
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaMemcpy(back.data(), r, n * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, h);
  w->reduceScatterSum(d, r, n, DType::F32, s);
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaMemcpy(back.data(), r, n * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(back, h);
  // Accumulate (a ZeRO-3 main grad over microbatches): NCCL reduces in
  // place inside the send buffer, then the add kernel adds the block into
  // recv on the same stream; bf16 adds in float, rounded once.
  w->reduceScatterSumAdd(d, r, n, DType::F32, s);
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaMemcpy(back.data(), r, n * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(back[i], h[i] + h[i]) << i;
  CHECK_CUDA(cudaMemcpy(d, hb.data(), 2000, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(r, hb.data(), 2000, cudaMemcpyHostToDevice));
  w->reduceScatterSumAdd(d, r, 1000, DType::BF16, s);
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaMemcpy(hb2.data(), r, 2000, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < hb.size(); ++i)
    ASSERT_EQ(hb2[i].bits, bf16(float(hb[i]) + float(hb[i])).bits) << i;
  // A bf16 main-grad shard: the f32 block added into it in float, rounded
  // once to bf16 (detail::addIntoBf16's bits).
  std::vector<float> hf(1000);
  for (size_t i = 0; i < hf.size(); ++i)
    hf[i] = float(i) * 0x1p-12f + 0x1p-9f;
  CHECK_CUDA(cudaMemcpy(d, hf.data(), 4000, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(r, hb.data(), 2000, cudaMemcpyHostToDevice));
  w->reduceScatterSumAddBf16(d, reinterpret_cast<bf16 *>(r), 1000, s);
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaMemcpy(hb2.data(), r, 2000, cudaMemcpyDeviceToHost));
  std::vector<bf16> want = hb;
  detail::addIntoBf16(want.data(), hf.data(), want.size());
  for (size_t i = 0; i < hb.size(); ++i)
    ASSERT_EQ(hb2[i].bits, want[i].bits) << i;
  // The send buffer is scratch after an accumulate: refill it.
  CHECK_CUDA(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
  w->barrier();
  EXPECT_TRUE(w->allTrue(true));
  EXPECT_FALSE(w->allTrue(false));

  EXPECT_THROW(w->broadcast(r, 1, DType::F32, 1, s), Error);
  EXPECT_THROW(w->send(r, 1, DType::F32, 0, s), Error);
  // Groups on a world of one split through ncclCommSplit.
  ParallelGroups g = makeParallelGroups(*w, 1, 1);
  EXPECT_EQ(g.tp->size(), 1);
  EXPECT_STREQ(g.dp->kind(), "nccl");
  g.dp->allReduceSum(d, r, 16, DType::F32, s);
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaMemcpy(back.data(), r, 64, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(back[i], h[i]);

  // Call overhead of a 256 MiB in-place all-reduce in a world of one: NCCL
  // moves no data there, so this is the cost of the call, not a bandwidth.
  size_t big = size_t(64) << 20;
  float *bd = nullptr;
  CHECK_CUDA(cudaMalloc(&bd, big * 4));
  CHECK_CUDA(cudaMemset(bd, 0, big * 4));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  w->allReduceSum(bd, bd, big, DType::F32, s);
  CHECK_CUDA(cudaEventRecord(e0, s));
  for (int i = 0; i < 5; ++i)
    w->allReduceSum(bd, bd, big, DType::F32, s);
  CHECK_CUDA(cudaEventRecord(e1, s));
  CHECK_CUDA(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  std::printf("nccl world-of-one in-place all-reduce 256 MiB (no data moves): "
              "%.3f ms per call\n",
              ms / 5);
  cudaFree(bd);
  cudaFree(d);
  cudaFree(r);
  cudaStreamDestroy(s);
}

/// Gathers in a group (NCCL group calls, enqueued at the end) give the same
/// blocks as one by one, and the watchdog marks them after the end.
TEST(NcclCollectives, GatherGroupOfOne) {
  if (!haveGpu())
    GTEST_SKIP() << "no usable GPU";
  CHECK_CUDA(cudaSetDevice(0));
  LaunchInfo none;
  auto w = createWorldCommunicator(Backend::Cuda, none);
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t n = 4099;
  std::vector<float> h(3 * n);
  for (size_t i = 0; i < h.size(); ++i)
    h[i] = float(i) * 0.25f - 7.0f;
  float *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, h.size() * 4));
  CHECK_CUDA(cudaMalloc(&dst, h.size() * 4));
  CHECK_CUDA(cudaMemcpy(src, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(dst, 0, h.size() * 4));
  w->groupStart();
  for (int k = 0; k < 3; ++k)
    w->allGather(src + k * n, dst + k * n, n, DType::F32, s);
  w->groupEnd();
  std::vector<float> back(h.size());
  CHECK_CUDA(cudaMemcpyAsync(back.data(), dst, h.size() * 4,
                             cudaMemcpyDeviceToHost, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  for (size_t i = 0; i < h.size(); ++i)
    ASSERT_EQ(back[i], h[i]) << i;
  EXPECT_THROW(w->groupEnd(), Error);
  cudaFree(src);
  cudaFree(dst);
  cudaStreamDestroy(s);
}

/// A collective behind a host function that sleeps 30 s (a stand-in for a
/// peer that never arrives): with ACTPLACE_COMM_TIMEOUT=2 the watchdog
/// names the stuck collective and ends the process with status 1 well
/// before the sleep ends. Run as a death test in a re-executed child, so
/// the CUDA context is the child's own.
void hangOneCollective() {
  setenv("ACTPLACE_COMM_TIMEOUT", "2", 1);
  cudaSetDevice(0);
  LaunchInfo none;
  auto w = createWorldCommunicator(Backend::Cuda, none);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  float *d = nullptr;
  cudaMalloc(&d, 4);
  cudaLaunchHostFunc(
      s, [](void *) { std::this_thread::sleep_for(std::chrono::seconds(30)); },
      nullptr);
  w->allReduceSum(d, d, 1, DType::F32, s);
  std::this_thread::sleep_for(std::chrono::seconds(25));
  std::exit(0); // the watchdog did not act
}

TEST(NcclCollectivesDeathTest, WatchdogEndsAStuckCollective) {
  if (!haveGpu())
    GTEST_SKIP() << "no usable GPU";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(hangOneCollective(), ::testing::ExitedWithCode(1),
              "error: NCCL: the communicator of rank 0 of 1 a collective "
              "enqueued [0-9]+ s ago has not completed "
              "\\(ACTPLACE_COMM_TIMEOUT is 2 s\\)");
}

TEST(NcclCollectivesDeathTest, BadTimeoutIsRefused) {
  if (!haveGpu())
    GTEST_SKIP() << "no usable GPU";
  setenv("ACTPLACE_COMM_TIMEOUT", "soon", 1);
  LaunchInfo none;
  try {
    createWorldCommunicator(Backend::Cuda, none);
    ADD_FAILURE() << "ACTPLACE_COMM_TIMEOUT=soon was accepted";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("ACTPLACE_COMM_TIMEOUT='soon'"),
              std::string::npos)
        << e.what();
  }
  unsetenv("ACTPLACE_COMM_TIMEOUT");
}

#else

TEST(NcclCollectives, WorldOfOne) { GTEST_SKIP() << "built without CUDA/NCCL"; }

#endif

} // namespace
