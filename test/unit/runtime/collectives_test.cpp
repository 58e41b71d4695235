//===- collectives_test.cpp - World of one, rank-order sums, groups -------===//
#include "runtime/collectives.h"

#include "runtime/error.h"
#include "test/unit/runtime/loopback_util.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

using namespace ap::rt;
using ap::kernels::Backend;
using ap::kernels::bf16;
using ap::kernels::DType;

namespace {

TEST(Collectives, DtypeBytes) {
  EXPECT_EQ(dtypeBytes(DType::BF16), 2u);
  EXPECT_EQ(dtypeBytes(DType::F32), 4u);
  EXPECT_EQ(dtypeBytes(DType::F64), 8u);
  EXPECT_EQ(dtypeBytes(DType::I32), 4u);
}

TEST(Collectives, SumInOrderIsLeftToRight) {
  // (1e8 + 1) - 1e8 in float loses the 1; the other order keeps it. The
  // contract is strict rank order.
  float a[1] = {1e8f}, b[1] = {1.0f}, c[1] = {-1e8f};
  const void *order1[3] = {a, b, c};
  const void *order2[3] = {a, c, b};
  float out = -1;
  detail::sumInOrder(DType::F32, order1, 3, 1, &out);
  EXPECT_EQ(out, (1e8f + 1.0f) - 1e8f);
  EXPECT_EQ(out, 0.0f);
  detail::sumInOrder(DType::F32, order2, 3, 1, &out);
  EXPECT_EQ(out, 1.0f);
  // BF16: accumulate in float, round once. 1 + 2^-8 + 2^-8 = 1 + 2^-7 is
  // representable, but rounding after each add would give 1.
  bf16 x[1] = {bf16(1.0f)}, y[1] = {bf16(0.00390625f)},
       z[1] = {bf16(0.00390625f)};
  const void *hb[3] = {x, y, z};
  bf16 hout;
  detail::sumInOrder(DType::BF16, hb, 3, 1, &hout);
  EXPECT_EQ(float(hout), 1.0078125f);
  int32_t i1[2] = {INT32_MAX, -5}, i2[2] = {1, 7};
  const void *ib[2] = {i1, i2};
  int32_t iout[2];
  detail::sumInOrder(DType::I32, ib, 2, 2, iout);
  EXPECT_EQ(iout[0], INT32_MIN);
  EXPECT_EQ(iout[1], 2);
  double d1[1] = {0.1}, d2[1] = {0.2};
  const void *db[2] = {d1, d2};
  double dout;
  detail::sumInOrder(DType::F64, db, 2, 1, &dout);
  EXPECT_EQ(dout, 0.1 + 0.2);
  EXPECT_THROW(detail::sumInOrder(DType::F64, db, 0, 1, &dout), Error);
}

TEST(Collectives, WorldOfOneHost) {
  LaunchInfo none; // no launcher
  auto w = createWorldCommunicator(Backend::Host, none);
  EXPECT_STREQ(w->kind(), "self");
  EXPECT_EQ(w->rank(), 0);
  EXPECT_EQ(w->size(), 1);
  std::vector<float> a = {1.5f, -2.0f, 3.25f}, b(3);
  w->allReduceSum(a.data(), b.data(), 3, DType::F32, nullptr);
  EXPECT_EQ(a, b);
  w->allReduceSum(a.data(), a.data(), 3, DType::F32, nullptr);
  EXPECT_EQ(a, b);
  std::vector<float> c(3);
  w->reduceScatterSum(a.data(), c.data(), 3, DType::F32, nullptr);
  EXPECT_EQ(c, a);
  std::vector<float> g(3);
  w->allGather(a.data(), g.data(), 3, DType::F32, nullptr);
  EXPECT_EQ(g, a);
  w->broadcast(a.data(), 3, DType::F32, 0, nullptr);
  EXPECT_EQ(a, b);
  w->barrier();
  EXPECT_TRUE(w->allTrue(true));
  EXPECT_FALSE(w->allTrue(false));
  EXPECT_THROW(w->broadcast(a.data(), 3, DType::F32, 1, nullptr), Error);
  EXPECT_THROW(w->send(a.data(), 3, DType::F32, 0, nullptr), Error);
  EXPECT_THROW(w->recv(a.data(), 3, DType::F32, 0, nullptr), Error);
  EXPECT_THROW(w->allGather(a.data(), a.data(), 3, DType::F32, nullptr), Error);

  ParallelGroups groups = makeParallelGroups(*w, 1, 1);
  EXPECT_EQ(groups.tp->size(), 1);
  EXPECT_EQ(groups.dp->size(), 1);
  EXPECT_EQ(groups.pp->size(), 1);
  EXPECT_EQ(groups.ppPrev, -1);
  EXPECT_EQ(groups.ppNext, -1);
  EXPECT_THROW(makeParallelGroups(*w, 2, 1), Error);
}

// A torchrun-style launch on the host backend (no mpirun) meets over TCP
// and gives every rank the rank-order sums of the MPI path: two ranks as
// two threads of this process.
TEST(Collectives, TorchrunHostRanksMeetOverTcp) {
  const int world = 2, port = test::freePort();
  std::vector<std::vector<float>> sums(world), scattered(world),
      gathered(world), casted(world);
  std::vector<int> agreed(world);
  std::vector<std::string> errors(world);
  auto rank = [&](int r) {
    try {
      std::unique_ptr<Communicator> c = createWorldCommunicator(
          Backend::Host, test::loopbackRank(r, world, port));
      EXPECT_STREQ(c->kind(), "tcp");
      EXPECT_EQ(c->rank(), r);
      EXPECT_EQ(c->size(), world);
      // Rank 0 holds 1e8, rank 1 holds 1: rank order gives 1e8 + 1 = 1e8
      // in float on both ranks (the other order would too; the second
      // element, -1e8 then 1, tells the orders apart).
      float mine[2] = {r == 0 ? 1e8f : 1.0f, r == 0 ? -1e8f : 1.0f};
      sums[r].resize(2);
      c->allReduceSum(mine, sums[r].data(), 2, DType::F32, nullptr);
      // Blocks of 2: rank r keeps block r of the sum.
      float blocks[4] = {float(r + 1), float(10 * (r + 1)), float(100 + r),
                         float(1000 + r)};
      scattered[r].resize(2);
      c->reduceScatterSum(blocks, scattered[r].data(), 2, DType::F32, nullptr);
      gathered[r].resize(2);
      float one = float(r + 7);
      c->allGather(&one, gathered[r].data(), 1, DType::F32, nullptr);
      float b = r == 1 ? 42.0f : -1.0f;
      c->broadcast(&b, 1, DType::F32, /*root=*/1, nullptr);
      casted[r] = {b};
      agreed[r] = c->allTrue(r == 0) ? 1 : 0;
      c->barrier();
    } catch (const Error &e) {
      errors[r] = e.what();
    }
  };
  std::thread t1(rank, 1);
  rank(0);
  t1.join();
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(sums[r][0], 1e8f + 1.0f);
    EXPECT_EQ(sums[r][1], -1e8f + 1.0f);
    EXPECT_EQ(gathered[r], (std::vector<float>{7.0f, 8.0f}));
    EXPECT_EQ(casted[r], (std::vector<float>{42.0f}));
    EXPECT_EQ(agreed[r], 0); // rank 1 said false
  }
  EXPECT_EQ(scattered[0], (std::vector<float>{1.0f + 2.0f, 10.0f + 20.0f}));
  EXPECT_EQ(scattered[1],
            (std::vector<float>{100.0f + 101.0f, 1000.0f + 1001.0f}));
}

// A rank that goes away makes the other's next collective fail naming it;
// a rank that never comes is a timeout naming what was awaited.
TEST(Collectives, TorchrunHostRankGoneIsNamed) {
  const int world = 2, port = test::freePort();
  std::string error;
  std::thread t1([&] {
    std::unique_ptr<Communicator> c = createWorldCommunicator(
        Backend::Host, test::loopbackRank(1, world, port));
    c->barrier(); // then rank 1 leaves, closing its socket
  });
  {
    std::unique_ptr<Communicator> c = createWorldCommunicator(
        Backend::Host, test::loopbackRank(0, world, port));
    c->barrier();
    t1.join();
    float x = 1, y = 0;
    try {
      c->allReduceSum(&x, &y, 1, DType::F32, nullptr);
    } catch (const Error &e) {
      error = e.what();
    }
  }
  EXPECT_NE(error.find("rank 1 closed its connection"), std::string::npos)
      << error;

  CommOptions quick;
  quick.rendezvousTimeoutSeconds = 0.3;
  try {
    createWorldCommunicator(Backend::Host,
                            test::loopbackRank(0, 2, test::freePort()), quick);
    FAIL() << "expected a timeout";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("timed out waiting for the other "
                                         "ranks to connect"),
              std::string::npos)
        << e.what();
  }
}

} // namespace
