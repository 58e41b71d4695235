//===- trainer_test.cpp - StepRunner launches -------------------*- C++ -*-===//
//
// The runner's kernel launches on the compute and side streams: each gets
// its stream's context (workspace, SM target), --op-times records them under
// their label in both modes, and kernels run on no other stream. trainMain
// refuses a world size other than the compiled data-parallel size (zero3
// training: zero3_train_mpi_test.cpp).
//
//===----------------------------------------------------------------------===//
#include "runtime/trainer.h"
#include "runtime_test_util.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

using namespace ap::rt;
using namespace ap::rt::test;
using ap::kernels::KernelContext;
using ap::kernels::Status;

namespace {

class StepRunnerTest : public BackendTest {
protected:
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped())
      return;
    device->allocateArena(4096, 1024, 2048);
    PinnedLayout layout;
    layout.totalBytes = 256;
    pool = std::make_unique<PinnedPool>(*device, layout);
    engine = std::make_unique<OffloadEngine>(*device, *pool);
    runner =
        std::make_unique<StepRunner>(program, *device, *pool, *engine, false);
  }
  void TearDown() override {
    runner.reset();
    engine.reset();
    pool.reset();
  }
  /// A kernel that records the context it ran with.
  KernelFn probe(std::shared_ptr<KernelContext> seen) {
    return [seen](const KernelContext &ctx) {
      *seen = ctx;
      return Status::Ok;
    };
  }

  Program program;
  std::unique_ptr<PinnedPool> pool;
  std::unique_ptr<OffloadEngine> engine;
  std::unique_ptr<StepRunner> runner;
};

TEST_P(StepRunnerTest, LaunchOnRunsWithThatStreamsContext) {
  auto compute = std::make_shared<KernelContext>();
  auto side = std::make_shared<KernelContext>();
  runner->launch("L0.mlp_fc1/linear", probe(compute));
  runner->launchOn(Stream::Side, "L0.mlp_fc1/linear(recompute)", probe(side));
  device->synchronize();
  EXPECT_EQ(compute->workspace, device->workspace());
  EXPECT_EQ(compute->workspaceBytes, 1024u);
  EXPECT_EQ(compute->smTarget, 0);
  EXPECT_EQ(side->workspace, device->sideWorkspace());
  EXPECT_EQ(side->workspaceBytes, 2048u);
  EXPECT_EQ(side->stream, device->kernelContext(Stream::Side).stream);
  EXPECT_EQ(side->smTarget, device->kernelContext(Stream::Side).smTarget);
  EXPECT_RT_ERROR(runner->launchOn(Stream::D2H, "x/y", probe(side)),
                  "kernel 'x/y' launched on the d2h stream");
}

TEST_P(StepRunnerTest, OpTimesRecordSideLaunchesUnderTheirLabel) {
  std::map<std::string, StepRunner::OpTime> times;
  runner->opTimes = &times;
  auto seen = std::make_shared<KernelContext>();
  for (bool inStream : {true, false}) {
    runner->opTimesInStream = inStream;
    runner->launchOn(Stream::Side, "L0.mlp_fc1/linear(recompute)", probe(seen));
    runner->launch("L0.mlp_fc1/linear", probe(seen));
    device->synchronize();
    runner->collectOpTimes();
  }
  runner->opTimes = nullptr;
  ASSERT_EQ(times.size(), 2u);
  EXPECT_EQ(times["L0.mlp_fc1/linear(recompute)"].count, 2);
  EXPECT_EQ(times["L0.mlp_fc1/linear"].count, 2);
  EXPECT_GE(times["L0.mlp_fc1/linear(recompute)"].seconds, 0.0);
}

// --op-timeline: one entry per launch of the collected step, on its stream,
// by start from 0; launches on one stream follow each other.
TEST_P(StepRunnerTest, TimelinePlacesLaunchesOnTheirStreams) {
  std::map<std::string, StepRunner::OpTime> times;
  std::vector<StepRunner::TimelineEntry> timeline;
  runner->opTimes = &times;
  runner->timeline = &timeline;
  auto seen = std::make_shared<KernelContext>();
  runner->launch("L0.attn_norm/rms_norm", probe(seen));
  runner->launchOn(Stream::Side, "L0.mlp_fc1/linear(recompute)", probe(seen));
  runner->launch("L0.mlp_fc1/linear", probe(seen));
  device->synchronize();
  runner->collectOpTimes();
  runner->opTimes = nullptr;
  runner->timeline = nullptr;
  ASSERT_EQ(timeline.size(), 3u);
  std::map<std::string, const StepRunner::TimelineEntry *> byName;
  double earliest = 1e30;
  for (const auto &e : timeline) {
    byName[e.name] = &e;
    EXPECT_LE(e.startS, e.endS) << e.name;
    earliest = std::min(earliest, e.startS);
  }
  EXPECT_EQ(earliest, 0.0);
  EXPECT_EQ(timeline.front().startS, 0.0); // sorted by start
  EXPECT_EQ(byName["L0.mlp_fc1/linear(recompute)"]->stream, Stream::Side);
  EXPECT_EQ(byName["L0.mlp_fc1/linear"]->stream, Stream::Compute);
  EXPECT_LE(byName["L0.attn_norm/rms_norm"]->endS,
            byName["L0.mlp_fc1/linear"]->startS);
}

AP_RT_INSTANTIATE_BACKENDS(StepRunnerTest);

} // namespace

namespace {

/// trainMain on `p` with --device host; returns the exit code and stderr.
std::pair<int, std::string> trainAlone(const Program &p) {
  const char *argv[] = {"train", "--device", "host", "--steps", "1"};
  ::testing::internal::CaptureStderr();
  int rc = trainMain(5, const_cast<char **>(argv), p);
  return {rc, ::testing::internal::GetCapturedStderr()};
}

/// Sets launcher variables for the scope (torchrun's, which win over any
/// other launcher's).
struct LaunchEnv {
  LaunchEnv(const char *rank, const char *world) {
    ::setenv("RANK", rank, 1);
    ::setenv("WORLD_SIZE", world, 1);
  }
  ~LaunchEnv() {
    ::unsetenv("RANK");
    ::unsetenv("WORLD_SIZE");
  }
};

} // namespace

// The world size is compiled in: a launch of another size is refused before
// anything starts, naming both numbers and both fixes.
TEST(TrainMain, RefusesAWorldSizeOtherThanTheCompiledOne) {
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  Program two;
  two.dataParallelSize = 2;
  auto [rc, err] = trainAlone(two);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("started 1 rank(s) but this binary was compiled for 2 "
                     "data-parallel rank(s)"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("mpirun -np 2"), std::string::npos) << err;
  EXPECT_NE(err.find("--data-parallel-size=1"), std::string::npos) << err;

  LaunchEnv env("1", "3");
  Program one;
  std::tie(rc, err) = trainAlone(one);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("error: rank 1 of 3: the launcher (torchrun) started 3 "
                     "rank(s) but this binary was compiled for 1"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("--data-parallel-size=3"), std::string::npos) << err;
}
