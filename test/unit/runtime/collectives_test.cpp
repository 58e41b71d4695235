//===- collectives_test.cpp - World of one, rank-order sums, groups -------===//
#include "runtime/collectives.h"

#include "runtime/error.h"

#include <gtest/gtest.h>

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

TEST(Collectives, MultiRankHostNeedsMpirun) {
  LaunchInfo torch;
  torch.launcher = Launcher::Torchrun;
  torch.rank = 0;
  torch.worldSize = 2;
  try {
    createWorldCommunicator(Backend::Host, torch);
    FAIL() << "expected an error";
  } catch (const Error &e) {
    // With MPI in the build the message names mpirun; without, it names MPI.
    EXPECT_NE(std::string(e.what()).find("MPI"), std::string::npos) << e.what();
  }
}

} // namespace
