//===- abi_test.cpp - The compiler-runtime C ABI ----------------*- C++ -*-===//
//
// runtime/abi.h's invariants on the host backend: a program of another ABI
// version or struct size is refused by ap_train_main with a message naming
// both versions; malformed tables are refused by name; ap_launch runs the
// kernel its id names with a copy of the caller's args and refuses an
// unknown id, a wrong args size or a copy stream; event, scope, parameter
// and microbatch indices outside the program and offsets outside the arena
// are errors naming the call.
//
//===----------------------------------------------------------------------===//
#include "runtime/abi.h"

#include "kernels/kernels.h"
#include "runtime/abi_program.h"
#include "runtime/trainer.h"
#include "runtime_test_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>

using namespace ap::rt;
using namespace ap::kernels;

namespace {

void emptyStep(ap_step *) {}

/// A minimal valid ABI program: one parameter, one scope, two events.
struct AbiProgram {
  ap_param param{};
  const char *scopes[1] = {"L0.core_attn"};
  ap_adamw adamw{};
  ap_program p{};
  AbiProgram() {
    param.name = "w";
    param.dtype = AP_DTYPE_BF16;
    param.rank = 1;
    param.shape[0] = 64;
    param.shape[1] = param.shape[2] = param.shape[3] = 1;
    param.numel = 64;
    param.init = AP_INIT_ONES;
    param.weight = 0;
    param.master = param.grad = param.adam_m = param.adam_v = AP_NO_OFFSET;
    param.frozen = 1;
    param.tied_grad_offset = AP_NO_OFFSET;
    adamw.param = 0;
    p.abi_version = AP_ABI_VERSION;
    p.struct_size = sizeof(ap_program);
    p.model = "abi-test";
    p.micro_batches = 1;
    p.batch = 1;
    p.seq = 8;
    p.vocab = 256;
    p.arena_bytes = 4096;
    p.persistent_bytes = 4096;
    p.scratch_offset = 2048;
    p.scratch_bytes = AP_SCRATCH_SCALAR_BYTES;
    p.params = &param;
    p.num_params = 1;
    p.scopes = scopes;
    p.num_scopes = 1;
    p.num_events = 2;
    p.state_loss_sum = p.state_token_count = p.state_grad_norm = p.state_lr =
        p.state_loss = AP_NO_OFFSET;
    p.data_parallel_size = 1;
    p.data_parallel_mode = AP_DP_REPLICATE;
    p.pipeline_size = 1;
    p.pipeline_stage = 0;
    p.step = emptyStep;
  }
};

/// ap_train_main's exit code and what it printed on stderr.
std::pair<int, std::string> trainMainOf(const ap_program &p) {
  char arg0[] = "abi_test";
  char *argv[] = {arg0, nullptr};
  testing::internal::CaptureStderr();
  int rc = ap_train_main(1, argv, &p);
  return {rc, testing::internal::GetCapturedStderr()};
}

TEST(AbiProgramTest, RefusesAnotherAbiVersion) {
  AbiProgram a;
  a.p.abi_version = AP_ABI_VERSION + 1;
  auto [rc, err] = trainMainOf(a.p);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(
      err.find("runtime ABI version " + std::to_string(AP_ABI_VERSION + 1)),
      std::string::npos)
      << err;
  EXPECT_NE(err.find("this runtime implements version " +
                     std::to_string(AP_ABI_VERSION)),
            std::string::npos)
      << err;
}

TEST(AbiProgramTest, RefusesAnotherStructSize) {
  AbiProgram a;
  a.p.struct_size = sizeof(ap_program) - 8;
  auto [rc, err] = trainMainOf(a.p);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("program struct of " +
                     std::to_string(sizeof(ap_program) - 8) + " bytes"),
            std::string::npos)
      << err;
}

TEST(AbiProgramTest, RefusesMalformedTables) {
  {
    AbiProgram a;
    a.param.rank = 5;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("parameter 'w' has rank 5"), std::string::npos) << err;
  }
  {
    AbiProgram a;
    a.p.adamw = &a.adamw;
    a.p.num_adamw = 1;
    a.adamw.param = 3;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("adamw entry 0 names parameter 3 of 1"),
              std::string::npos)
        << err;
  }
  {
    AbiProgram a;
    a.p.params = nullptr;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("params has 1 entries and no data"), std::string::npos)
        << err;
  }
  {
    AbiProgram a;
    a.p.step = nullptr;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("no step function"), std::string::npos) << err;
  }
  {
    // Zero-initialised and never set: the plan's rank count is not known.
    AbiProgram a;
    a.p.data_parallel_size = 0;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("data_parallel_size is 0 (expected 1 or more ranks)"),
              std::string::npos)
        << err;
  }
  {
    AbiProgram a;
    a.p.data_parallel_mode = 7;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("data_parallel_mode is 7, not an AP_DP_* value"),
              std::string::npos)
        << err;
  }
  // shard_numel: 0 in replicate; ceil(numel / ranks) in zero3.
  {
    AbiProgram a;
    a.param.shard_numel = 64;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("parameter 'w' has shard_numel 64; expected 0 "
                       "(replicate: the buffers hold the whole parameter)"),
              std::string::npos)
        << err;
  }
  {
    AbiProgram a;
    a.param.numel = 63;
    a.param.shape[0] = 63;
    a.p.data_parallel_mode = AP_DP_ZERO3;
    a.p.data_parallel_size = 2;
    a.param.shard_numel = 31;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("parameter 'w' has shard_numel 31; expected 32 (ceil "
                       "of its numel 63 over data_parallel_size 2, zero3)"),
              std::string::npos)
        << err;
    a.param.shard_numel = 32;
    EXPECT_EQ(programOfAbi(a.p).params[0].shardNumel, 32);
  }
  // main_grad_bf16: only under zero3, never on a frozen parameter, 0 or 1.
  {
    AbiProgram a;
    a.param.frozen = 0;
    a.param.master = a.param.grad = a.param.adam_m = a.param.adam_v = 0;
    a.param.main_grad_bf16 = 1;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("parameter 'w' has main_grad_bf16 1 under "
                       "data_parallel_mode 0 (bf16 main grads need "
                       "AP_DP_ZERO3"),
              std::string::npos)
        << err;
    a.param.main_grad_bf16 = 2;
    a.p.data_parallel_mode = AP_DP_ZERO3;
    a.param.shard_numel = 64;
    std::tie(rc, err) = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("parameter 'w' has main_grad_bf16 2 (expected 0: f32, "
                       "or 1: bf16)"),
              std::string::npos)
        << err;
    a.param.main_grad_bf16 = 1;
    EXPECT_TRUE(programOfAbi(a.p).params[0].mainGradBf16);
    EXPECT_EQ(programOfAbi(a.p).params[0].gradDType(), DType::BF16);
    a.param.main_grad_bf16 = 0;
    EXPECT_FALSE(programOfAbi(a.p).params[0].mainGradBf16);
  }
  {
    AbiProgram a; // frozen
    a.p.data_parallel_mode = AP_DP_ZERO3;
    a.param.shard_numel = 64;
    a.param.main_grad_bf16 = 1;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("parameter 'w' is frozen and has main_grad_bf16 1"),
              std::string::npos)
        << err;
  }
  // The driver scratch is a buffer of the plan: inside the arena, with the
  // runtime's scalars.
  {
    AbiProgram a;
    a.p.scratch_offset = 4000;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("the driver scratch [4000, +256) is not a buffer of at "
                       "least 256 bytes inside the arena of 4096 bytes"),
              std::string::npos)
        << err;
  }
  {
    AbiProgram a;
    a.p.scratch_bytes = 16;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("the driver scratch [2048, +16)"), std::string::npos)
        << err;
  }
}

/// ap_train_main_stages' exit code and what it printed on stderr.
std::pair<int, std::string> trainStagesOf(const ap_program *const *stages,
                                          int32_t n) {
  char arg0[] = "abi_test";
  char *argv[] = {arg0, nullptr};
  testing::internal::CaptureStderr();
  int rc = ap_train_main_stages(1, argv, stages, n);
  return {rc, testing::internal::GetCapturedStderr()};
}

// ABI 6: the pipeline fields are checked like every other field; the
// stages of a pipelined binary come in order and agree on the batch; a
// tied gradient buffer lies in the arena and belongs to a whole f32 grad.
TEST(AbiProgramTest, RefusesPipelineFieldsOutOfRange) {
  {
    // Zero-initialised and never set.
    AbiProgram a;
    a.p.pipeline_size = 0;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("pipeline_size is 0 (expected 1 or more stages)"),
              std::string::npos)
        << err;
  }
  {
    AbiProgram a;
    a.p.pipeline_size = 2;
    a.p.pipeline_stage = 2;
    EXPECT_THROW(
        {
          try {
            programOfAbi(a.p);
          } catch (const std::exception &e) {
            EXPECT_NE(std::string(e.what()).find(
                          "pipeline_stage is 2 (expected 0 to 1 for "
                          "pipeline_size 2)"),
                      std::string::npos)
                << e.what();
            throw;
          }
        },
        std::exception);
    a.p.pipeline_stage = -1;
    EXPECT_THROW(programOfAbi(a.p), std::exception);
    a.p.pipeline_stage = 1;
    Program p = programOfAbi(a.p);
    EXPECT_EQ(p.pipelineSize, 2);
    EXPECT_EQ(p.pipelineStage, 1);
    // A one-stage entry for a pipelined program.
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("ap_train_main with a program of pipeline_size 2"),
              std::string::npos)
        << err;
  }
  {
    // Zero3 shards are ceil(numel / data_parallel_size), pipelined or not.
    AbiProgram a;
    a.p.pipeline_size = 2;
    a.p.data_parallel_mode = AP_DP_ZERO3;
    a.p.data_parallel_size = 2;
    a.param.shard_numel = 64;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("parameter 'w' has shard_numel 64; expected 32"),
              std::string::npos)
        << err;
  }
  // Tensor parallelism: the split must be whole blocks of its segments.
  auto tensorParallelError = [&](int32_t tp, auto edit) {
    AbiProgram a;
    a.p.tensor_parallel_size = tp;
    a.param.tp_dim = 0;
    a.param.tp_num_segments = 2;
    a.param.tp_segments[0] = 64;
    a.param.tp_segments[1] = 64;
    edit(a);
    return trainMainOf(a.p);
  };
  {
    auto [rc, err] = tensorParallelError(
        2, [](AbiProgram &a) { a.param.tp_segments[1] = 32; });
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("parameter 'w' holds 64 along dim 0; its segments (96 "
                       "in all) over 2 ranks give 48"),
              std::string::npos)
        << err;
  }
  {
    auto [rc, err] = tensorParallelError(2, [](AbiProgram &a) {
      a.param.tp_segments[0] = 63;
      a.param.tp_segments[1] = 65;
    });
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("has segment 0 of 63 elements (expected a positive "
                       "multiple of tensor_parallel_size 2)"),
              std::string::npos)
        << err;
  }
  {
    auto [rc, err] = tensorParallelError(1, [](AbiProgram &) {});
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("parameter 'w' is split along dim 0 but "
                       "tensor_parallel_size is 1"),
              std::string::npos)
        << err;
  }
  {
    auto [rc, err] = tensorParallelError(
        2, [](AbiProgram &a) { a.param.tp_num_segments = 5; });
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("has tp_num_segments 5 (expected 0: replicated, or 1 "
                       "to 4)"),
              std::string::npos)
        << err;
  }
  {
    auto [rc, err] = tensorParallelError(2, [](AbiProgram &a) {
      a.param.tp_num_segments = 0;
      a.param.tp_grad_sum = 1; // the parameter is frozen
    });
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("has tp_grad_sum 1 but is frozen"), std::string::npos)
        << err;
  }
  {
    auto [rc, err] =
        tensorParallelError(2, [](AbiProgram &a) { a.param.tp_grad_sum = 1; });
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("is split by tensor parallelism and tp_grad_sum"),
              std::string::npos)
        << err;
  }
  {
    AbiProgram a;
    a.param.pipeline_tied = 2;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("parameter 'w' has pipeline_tied 2 (expected 0 or 1)"),
              std::string::npos)
        << err;
  }
  {
    AbiProgram a;
    a.param.frozen = 0;
    a.param.master = a.param.grad = a.param.adam_m = a.param.adam_v = 0;
    a.param.tied_grad_offset = 4096 - 128;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("parameter 'w' has tied_grad_offset 3968: 64 f32 "
                       "elements there do not fit the arena of 4096 bytes"),
              std::string::npos)
        << err;
    a.param.tied_grad_offset = 1024;
    EXPECT_EQ(programOfAbi(a.p).params[0].tiedGrad, 1024u);
    a.param.frozen = 1;
    std::tie(rc, err) = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("parameter 'w' has tied_grad_offset 1024 but is "
                       "frozen"),
              std::string::npos)
        << err;
  }
}

TEST(AbiProgramTest, PipelineStagesComeInOrderAndAgree) {
  AbiProgram s0, s1;
  s0.p.pipeline_size = s1.p.pipeline_size = 2;
  s1.p.pipeline_stage = 1;
  {
    const ap_program *swapped[] = {&s1.p, &s0.p};
    auto [rc, err] = trainStagesOf(swapped, 2);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("program 0 of 2 has pipeline_stage 1 and "
                       "pipeline_size 2 (expected stage 0 of 2"),
              std::string::npos)
        << err;
  }
  {
    const ap_program *three[] = {&s0.p, &s1.p, &s1.p};
    auto [rc, err] = trainStagesOf(three, 3);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("program 0 of 3 has pipeline_stage 0 and "
                       "pipeline_size 2"),
              std::string::npos)
        << err;
  }
  {
    s1.p.micro_batches = 4;
    const ap_program *stages[] = {&s0.p, &s1.p};
    auto [rc, err] = trainStagesOf(stages, 2);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("stage 1 has data_parallel_size 1, mode 0, "
                       "micro_batches 4"),
              std::string::npos)
        << err;
    s1.p.micro_batches = 1;
  }
  {
    auto [rc, err] = trainStagesOf(nullptr, 0);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("ap_train_main_stages with 0 stage(s) and a null "
                       "array"),
              std::string::npos)
        << err;
  }
  {
    // The world (one rank here) must be data_parallel_size x stages.
    const ap_program *stages[] = {&s0.p, &s1.p};
    auto [rc, err] = trainStagesOf(stages, 2);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("started 1 rank(s) but this binary was compiled for 1 "
                       "data-parallel rank(s) x 2 pipeline stages = 2 "
                       "rank(s)"),
              std::string::npos)
        << err;
  }
}

// The side-stream GEMMs' SM share is the program's (the compiler copies the
// cost model's value into it): it reaches the runtime's Program, is
// required once the step has side kernels, and must be a percentage.
TEST(AbiProgramTest, SideSmPercentReachesTheProgram) {
  AbiProgram a;
  EXPECT_EQ(programOfAbi(a.p).sideSmPercent, 0);
  a.p.side_kernels = 1;
  a.p.side_sm_percent = 60;
  Program p = programOfAbi(a.p);
  EXPECT_TRUE(p.sideKernels);
  EXPECT_EQ(p.sideSmPercent, 60);
  for (int32_t bad : {0, -5, 101}) {
    a.p.side_sm_percent = bad;
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find("side_sm_percent is " + std::to_string(bad) +
                       " (expected 1 to 100"),
              std::string::npos)
        << err;
  }
}

// A generated kernel for the tests: y[i] = a[i] + 2 b[i] (f32) over n
// elements, from its argument slots (pointers a, b, y; int64 n; float
// unused), as a compiled binary's packed host entry is called.
extern "C" void testGeneratedAxpy(void **params) {
  const float *a = *static_cast<const float *const *>(params[0]);
  const float *b = *static_cast<const float *const *>(params[1]);
  float *y = *static_cast<float *const *>(params[2]);
  int64_t n = *static_cast<const int64_t *>(params[3]);
  float scale = *static_cast<const float *>(params[4]);
  for (int64_t i = 0; i < n; ++i)
    y[i] = a[i] + scale * b[i];
}

// A generated kernel with a workspace parameter: writes the workspace
// address it was given to *y (pointer y, workspace, int64 n unused).
extern "C" void testGeneratedWorkspace(void **params) {
  void **y = *static_cast<void **const *>(params[0]);
  *y = *static_cast<void *const *>(params[1]);
}

// The generated-kernel table reaches the Program; a table whose entries
// cannot be launched is refused naming the kernel and the field.
TEST(AbiProgramTest, GeneratedKernelTablesAreChecked) {
  ap_generated_entry entry{"test_axpy", {3, -1}, 1, 256, 1};
  ap_generated_kernel kernel{"test_axpy", "ppplf", &testGeneratedAxpy, &entry,
                             1};
  AbiProgram a;
  a.p.generated = &kernel;
  a.p.num_generated = 1;
  a.p.generated_ptx = ".version 8.0";
  Program p = programOfAbi(a.p);
  ASSERT_EQ(p.generated.size(), 1u);
  EXPECT_STREQ(p.generated[0].name, "test_axpy");
  EXPECT_STREQ(p.generatedPtx, ".version 8.0");
  auto refused = [&](const char *what) {
    auto [rc, err] = trainMainOf(a.p);
    EXPECT_EQ(rc, 1);
    EXPECT_NE(err.find(what), std::string::npos) << err;
  };
  kernel.params = "pppxf";
  refused("generated kernel 'test_axpy' has parameters 'pppxf' (expected 1 "
          "to 32 of 'p', 'l', 'i', 'f', 'w')");
  kernel.params = "ppplf";
  entry.work_params[0] = 0; // a pointer counts no threads
  refused("entry 'test_axpy' counts its threads by parameter 0, which is not "
          "an int64 parameter of 'ppplf'");
  entry.work_params[0] = 7;
  refused("counts its threads by parameter 7");
  entry.work_params[0] = 3;
  entry.block_size = 2048;
  refused("entry 'test_axpy' has 1 threads per item and blocks of 2048 (1 to "
          "1024 each)");
  entry.block_size = 256;
  entry.threads_per_item = 0;
  refused("has 0 threads per item");
  entry.threads_per_item = 1;
  entry.vector = 0;
  refused("entry 'test_axpy' has items of 0 elements (1 to 65536)");
  entry.vector = 65537;
  refused("has items of 65537 elements");
  entry.vector = 1;
  kernel.host = nullptr;
  refused("generated kernel 0 has a null name, parameter list or host "
          "function");
  kernel.host = &testGeneratedAxpy;
  kernel.num_entries = 0;
  refused("generated kernel 'test_axpy' has no GPU entry");
  kernel.num_entries = 1;
  // A Triton kernel has no host function but needs its PTX and a launch
  // shape.
  kernel.host = nullptr;
  kernel.triton = 1;
  kernel.num_warps = 4;
  refused("Triton kernel 'test_axpy' needs its PTX, 1 to 32 warps");
  kernel.ptx = ".target sm_90a";
  EXPECT_EQ(programOfAbi(a.p).generated[0].triton, 1);
  kernel.num_warps = 64;
  refused("(has 64 warps, 0 bytes, 0 hidden)");
  kernel.num_warps = 4;
  kernel.triton = 0;
  kernel.host = &testGeneratedAxpy;
  a.p.generated = nullptr;
  refused("generated has 1 entries and no data");
}

/// A step runner on the host backend, seen through the ABI handle.
class AbiStepTest : public ::testing::Test {
protected:
  void SetUp() override {
    DeviceOptions options;
    options.device = DeviceKind::Host;
    options.quiet = true;
    device = std::make_unique<Device>(options);
    device->allocateArena(4096, 1024, 2048);
    PinnedLayout layout;
    layout.totalBytes = 256;
    pool = std::make_unique<PinnedPool>(*device, layout);
    engine = std::make_unique<OffloadEngine>(*device, *pool);
    program.arenaBytes = 4096;
    program.scratchOffset = 3072;
    program.scratchBytes = 512;
    program.numEvents = 2;
    program.scopes = {"L0.core_attn"};
    runner =
        std::make_unique<StepRunner>(program, *device, *pool, *engine, false);
  }
  void TearDown() override {
    runner.reset();
    engine.reset();
    pool.reset();
  }
  ap_step *handle() { return reinterpret_cast<ap_step *>(runner.get()); }
  /// The message of the ap::rt::Error `fn` throws ("" if none).
  template <typename Fn> std::string errorOf(Fn fn) {
    try {
      fn();
    } catch (const std::exception &e) {
      return e.what();
    }
    return "";
  }

  Program program;
  std::unique_ptr<Device> device;
  std::unique_ptr<PinnedPool> pool;
  std::unique_ptr<OffloadEngine> engine;
  std::unique_ptr<StepRunner> runner;
};

TEST_F(AbiStepTest, LaunchRunsTheKernelItsIdNames) {
  auto *x = static_cast<float *>(ap_at(handle(), 0));
  for (int i = 0; i < 16; ++i)
    x[i] = float(i);
  ResidualAddArgs a;
  a.dtype = DType::F32;
  a.a = ap_at(handle(), 0);
  a.b = ap_at(handle(), 0);
  a.y = ap_at(handle(), 256);
  a.n = 16;
  {
    // The runtime copies the args: the caller's storage may change at once.
    ResidualAddArgs copy = a;
    ap_launch(handle(), AP_STREAM_COMPUTE, "t/add",
              AP_KERNEL_RESIDUAL_ADD_FORWARD, &copy, sizeof copy);
    std::memset(static_cast<void *>(&copy), 0, sizeof copy);
  }
  device->synchronize();
  auto *y = static_cast<const float *>(ap_at(handle(), 256));
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(y[i], 2.f * float(i)) << i;
}

TEST_F(AbiStepTest, LaunchRefusesUnknownIdsSizesAndStreams) {
  ResidualAddArgs a;
  EXPECT_NE(errorOf([&] {
              ap_launch(handle(), AP_STREAM_COMPUTE, "t/x", AP_KERNEL_COUNT, &a,
                        sizeof a);
            }).find("'t/x': kernel id " + std::to_string(AP_KERNEL_COUNT)),
            std::string::npos);
  std::string err = errorOf([&] {
    ap_launch(handle(), AP_STREAM_COMPUTE, "t/x", AP_KERNEL_LINEAR_FORWARD, &a,
              sizeof a);
  });
  EXPECT_NE(err.find("AP_KERNEL_LINEAR_FORWARD takes " +
                     std::to_string(sizeof(LinearForwardArgs)) +
                     " bytes of arguments, got " + std::to_string(sizeof a)),
            std::string::npos)
      << err;
  err = errorOf([&] {
    ap_launch(handle(), AP_STREAM_D2H, "t/x", AP_KERNEL_RESIDUAL_ADD_FORWARD,
              &a, sizeof a);
  });
  EXPECT_NE(err.find("not d2h"), std::string::npos) << err;
  err = errorOf([&] {
    ap_launch(handle(), 9, "t/x", AP_KERNEL_RESIDUAL_ADD_FORWARD, &a, sizeof a);
  });
  EXPECT_NE(err.find("stream 9 is not an AP_STREAM_* value"), std::string::npos)
      << err;
}

// ap_launch_generated calls the kernel's host function on the host backend
// with pointers to a copy of the argument slots, in stream order, and counts
// the launch; wrong kernel indices and argument sizes are refused.
// ap_adamw_step_generated refuses a kernel index past the program's table
// and a generated kernel whose parameter kinds are not an AdamW's, naming
// the parameter and the kernel, before anything is launched.
TEST_F(AbiStepTest, AdamWGeneratedRefusesAWrongKernel) {
  ParamEntry w{};
  w.name = "w";
  w.dtype = DType::F32;
  w.rank = 1;
  w.shape[0] = 16;
  w.numel = 16;
  w.weight = 0;
  w.master = 256;
  w.grad = 512;
  w.adamM = 768;
  w.adamV = 1024;
  program.params = {w};
  ap_generated_entry entry{"test_axpy", {3, -1}, 1, 256, 1};
  ap_generated_kernel kernel{"test_axpy", "ppplf", &testGeneratedAxpy, &entry,
                             1};
  program.generated = {kernel};
  runner->beginStep();
  std::string err = errorOf(
      [&] { ap_adamw_step_generated(handle(), 0, 1, 0.9, 0.95, 1e-8, 0); });
  EXPECT_NE(err.find("ap_adamw_step_generated: generated kernel 1 (the "
                     "program has 1)"),
            std::string::npos)
      << err;
  err = errorOf(
      [&] { ap_adamw_step_generated(handle(), 0, 0, 0.9, 0.95, 1e-8, 0); });
  EXPECT_NE(err.find("adamw of 'w': generated kernel 'test_axpy' takes "
                     "parameters 'ppplf', not an AdamW's"),
            std::string::npos)
      << err;
  EXPECT_EQ(runner->generatedLaunches, 0u);
}

TEST_F(AbiStepTest, FinalizeGradsGeneratedRefusesKernelsOutOfRange) {
  ap_generated_entry entry{"test_axpy", {3, -1}, 1, 256, 1};
  ap_generated_kernel kernel{"test_axpy", "ppplf", &testGeneratedAxpy, &entry,
                             1};
  program.generated = {kernel};
  runner->beginStep();
  auto refused = [&](uint32_t bf16, uint32_t f32, uint32_t finish,
                     const std::string &what) {
    std::string err = errorOf(
        [&] { ap_finalize_grads_generated(handle(), 1.0, bf16, f32, finish); });
    EXPECT_NE(err.find("ap_finalize_grads_generated: " + what),
              std::string::npos)
        << err;
  };
  refused(AP_GENERATED_NONE, 0, 1,
          "finish kernel 1 (the program has 1 generated kernels)");
  refused(AP_GENERATED_NONE, 0, AP_GENERATED_NONE, "finish kernel 4294967295");
  refused(2, AP_GENERATED_NONE, 0, "bf16 sums of squares kernel 2");
  refused(AP_GENERATED_NONE, 7, 0, "f32 sums of squares kernel 7");
  EXPECT_EQ(runner->generatedLaunches, 0u);
}

TEST_F(AbiStepTest, LaunchGeneratedRunsTheHostFunctionFromItsSlots) {
  ap_generated_entry entry{"test_axpy", {3, -1}, 1, 256, 1};
  ap_generated_kernel kernel{"test_axpy", "ppplf", &testGeneratedAxpy, &entry,
                             1};
  program.generated = {kernel};
  auto *a = static_cast<float *>(ap_at(handle(), 0));
  auto *b = static_cast<float *>(ap_at(handle(), 256));
  for (int i = 0; i < 16; ++i) {
    a[i] = float(i);
    b[i] = 0.5f;
  }
  uint64_t slots[5] = {};
  void *pa = a, *pb = b, *py = ap_at(handle(), 512);
  int64_t n = 16;
  float scale = 4.f;
  std::memcpy(&slots[0], &pa, 8);
  std::memcpy(&slots[1], &pb, 8);
  std::memcpy(&slots[2], &py, 8);
  std::memcpy(&slots[3], &n, 8);
  std::memcpy(&slots[4], &scale, 4);
  runner->beginStep();
  ap_launch_generated(handle(), AP_STREAM_COMPUTE, "t/gen", 0, slots,
                      sizeof slots);
  std::memset(slots, 0, sizeof slots); // the runtime copied them
  device->synchronize();
  auto *y = static_cast<const float *>(py);
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(y[i], float(i) + 2.f) << i;
  EXPECT_EQ(runner->generatedLaunches, 1u);

  std::string err = errorOf([&] {
    ap_launch_generated(handle(), AP_STREAM_COMPUTE, "t/gen", 1, slots,
                        sizeof slots);
  });
  EXPECT_NE(err.find("'t/gen': generated kernel 1 (the program has 1)"),
            std::string::npos)
      << err;
  err = errorOf([&] {
    ap_launch_generated(handle(), AP_STREAM_COMPUTE, "t/gen", 0, slots, 32);
  });
  EXPECT_NE(err.find("test_axpy takes 40 bytes of arguments (5 parameters), "
                     "got 32"),
            std::string::npos)
      << err;
  err = errorOf([&] {
    ap_launch_generated(handle(), AP_STREAM_H2D, "t/gen", 0, slots,
                        sizeof slots);
  });
  EXPECT_NE(err.find("not h2d"), std::string::npos) << err;

  // A 'w' parameter: the slot holds the bytes the kernel needs; the kernel
  // gets the stream's workspace (1024 bytes on compute) in their place, or
  // the launch is refused naming both sizes.
  ap_generated_entry wsEntry{"test_ws", {2, -1}, 1, 256, 1};
  ap_generated_kernel wsKernel{"test_ws", "pwl", &testGeneratedWorkspace,
                               &wsEntry, 1};
  program.generated = {wsKernel};
  uint64_t wsSlots[3] = {};
  void *out = ap_at(handle(), 1024);
  std::memcpy(&wsSlots[0], &out, 8);
  wsSlots[1] = 1024;
  ap_launch_generated(handle(), AP_STREAM_COMPUTE, "t/ws", 0, wsSlots,
                      sizeof wsSlots);
  device->synchronize();
  EXPECT_EQ(*static_cast<void **>(out), device->workspace());
  EXPECT_NE(device->workspace(), nullptr);
  EXPECT_EQ(wsSlots[1], 1024u); // the caller's slots are untouched
  wsSlots[1] = 1025;
  err = errorOf([&] {
    ap_launch_generated(handle(), AP_STREAM_COMPUTE, "t/ws", 0, wsSlots,
                        sizeof wsSlots);
    device->synchronize();
  });
  EXPECT_NE(err.find("generated kernel 'test_ws': parameter 1 needs 1025 "
                     "bytes of kernel workspace, the stream has 1024"),
            std::string::npos)
      << err;

  // A Triton kernel: the grid follows its parameters (3 more slots), and
  // the host backend refuses it (no host form), naming it.
  ap_generated_kernel triton{
      "test_triton", "ppplf", nullptr, &entry, 1, 1, 4, 0, 2, ".target"};
  program.generated = {triton};
  err = errorOf([&] {
    ap_launch_generated(handle(), AP_STREAM_COMPUTE, "t/tri", 0, slots,
                        sizeof slots);
  });
  EXPECT_NE(err.find("test_triton takes 64 bytes of arguments (5 parameters "
                     "and the grid), got 40"),
            std::string::npos)
      << err;
  uint64_t withGrid[8] = {};
  err = errorOf([&] {
    ap_launch_generated(handle(), AP_STREAM_COMPUTE, "t/tri", 0, withGrid,
                        sizeof withGrid);
    device->synchronize();
  });
  EXPECT_NE(err.find("Triton kernel 'test_triton' runs on the cuda backend "
                     "only"),
            std::string::npos)
      << err;
  program.generated.clear();
}

// ap_zero clears its range in stream order; a world of one's
// reduce-scatter copies, or adds with AP_REDUCE_ACCUMULATE.
TEST_F(AbiStepTest, ZeroAndReduceScatterAccumulateOnOneRank) {
  std::unique_ptr<Communicator> self = createSelfCommunicator();
  runner->dataParallel = self.get();
  auto *x = static_cast<float *>(ap_at(handle(), 0));
  auto *y = static_cast<float *>(ap_at(handle(), 256));
  for (int i = 0; i < 16; ++i) {
    x[i] = 0.5f * float(i);
    y[i] = 100.f;
  }
  ap_reduce_scatter(handle(), 0, 256, 64, AP_DTYPE_F32, AP_STREAM_COMM,
                    AP_REDUCE_ACCUMULATE);
  device->synchronize();
  for (int i = 0; i < 16; ++i)
    ASSERT_EQ(y[i], 100.f + 0.5f * float(i)) << i;
  ap_reduce_scatter(handle(), 0, 256, 64, AP_DTYPE_F32, AP_STREAM_COMPUTE, 0);
  device->synchronize();
  for (int i = 0; i < 16; ++i)
    ASSERT_EQ(y[i], 0.5f * float(i)) << i;
  ap_zero(handle(), 256, 32, AP_STREAM_COMM);
  device->synchronize();
  for (int i = 0; i < 16; ++i)
    ASSERT_EQ(y[i], i < 8 ? 0.f : 0.5f * float(i)) << i;
  // A bf16 shard: 64 bytes of f32 block, 32 bytes of bf16 shard (the bytes
  // past it untouched), bf16(float(shard) + block) rounded once: 1 + 2^-9
  // (a quarter ulp) stays at 1, 1 + 3 x 2^-9 rounds up to 1 + 2^-7.
  auto *b = static_cast<bf16 *>(ap_at(handle(), 512));
  for (int i = 0; i < 32; ++i)
    b[i] = bf16(1.f);
  for (int i = 0; i < 16; ++i)
    x[i] = (i % 2 ? 3.f : 1.f) * 0x1p-9f;
  ap_reduce_scatter(handle(), 0, 512, 64, AP_DTYPE_F32, AP_STREAM_COMM,
                    AP_REDUCE_ACCUMULATE | AP_REDUCE_SHARD_BF16);
  device->synchronize();
  for (int i = 0; i < 16; ++i)
    ASSERT_EQ(float(b[i]), i % 2 ? 1.f + 0x1p-7f : 1.f) << i;
  for (int i = 16; i < 32; ++i)
    ASSERT_EQ(float(b[i]), 1.f) << i;
  runner->dataParallel = nullptr;
}

TEST_F(AbiStepTest, IndicesOutsideTheProgramAreErrors) {
  EXPECT_NE(errorOf([&] {
              ap_record(handle(), 2, AP_STREAM_COMPUTE);
            }).find("ap_record: event 2 of a program with 2 events"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_wait(handle(), AP_STREAM_COMPUTE, 7);
            }).find("ap_wait: event 7"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_offload(handle(), 1, 0, 0, 64, 0, 1);
            }).find("ap_offload: scope 1 of a program with 1 offload scopes"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_begin_microbatch(handle(), 1);
            }).find("ap_begin_microbatch 1 of a program with 1"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_adamw_step(handle(), 0, 0.9, 0.95, 1e-8, 0);
            }).find("ap_adamw_step: parameter 0 of 0"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_adamw_step_generated(handle(), 0, 0, 0.9, 0.95, 1e-8, 0);
            }).find("ap_adamw_step_generated: parameter 0 of 0"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_all_reduce(handle(), 0, 4, 17, AP_STREAM_COMM, 0);
            }).find("dtype 17 is not an AP_DTYPE_* value"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_all_reduce(handle(), 0, 4, AP_DTYPE_F32, AP_STREAM_COMM, 6);
            }).find("ap_all_reduce: flags 6 (expected AP_REDUCE_* bits)"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_all_gather(handle(), 0, 256, 4, AP_DTYPE_F32, AP_STREAM_COMM,
                            AP_REDUCE_ACCUMULATE);
            }).find("ap_all_gather: flags 2 (expected 0 or AP_REDUCE_TENSOR)"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_all_reduce(handle(), 0, 4, AP_DTYPE_F32, AP_STREAM_D2H, 0);
            }).find("all_reduce: stream d2h (expected comm or compute)"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_reduce_scatter(handle(), 0, 256, 4, AP_DTYPE_F32,
                                AP_STREAM_COMM, AP_REDUCE_LAST_MICROBATCH);
            })
                .find("ap_reduce_scatter: flags 1 (expected 0, "
                      "AP_REDUCE_ACCUMULATE or AP_REDUCE_ACCUMULATE | "
                      "AP_REDUCE_SHARD_BF16, or AP_REDUCE_TENSOR)"),
            std::string::npos);
  // A bf16 shard is a main grad the f32 block sum is added into.
  EXPECT_NE(errorOf([&] {
              ap_reduce_scatter(handle(), 0, 256, 4, AP_DTYPE_F32,
                                AP_STREAM_COMM, AP_REDUCE_SHARD_BF16);
            })
                .find("ap_reduce_scatter: flags 4: AP_REDUCE_SHARD_BF16 "
                      "without AP_REDUCE_ACCUMULATE"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_reduce_scatter(handle(), 0, 256, 4, AP_DTYPE_BF16,
                                AP_STREAM_COMM,
                                AP_REDUCE_ACCUMULATE | AP_REDUCE_SHARD_BF16);
            })
                .find("ap_reduce_scatter: AP_REDUCE_SHARD_BF16 with dtype 0 "
                      "(the full buffer must be AP_DTYPE_F32"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_zero(handle(), 4000, 256, AP_STREAM_COMPUTE);
            }).find("4000"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_zero(handle(), 0, 64, AP_STREAM_H2D);
            }).find("zero: stream h2d (expected comm or compute)"),
            std::string::npos);
  // The driver scratch is the program's buffer: its addresses are arena
  // addresses, and an offset past it is an error.
  EXPECT_EQ(ap_scratch(handle(), 16),
            static_cast<char *>(ap_at(handle(), 3072 + 16)));
  EXPECT_NE(errorOf([&] { ap_scratch(handle(), 512); })
                .find("ap_scratch: offset 512 is outside the driver scratch of "
                      "512 bytes"),
            std::string::npos);
  // An offset past the arena: the device's range check, through the ABI.
  EXPECT_FALSE(errorOf([&] { ap_at(handle(), 1ull << 40); }).empty());
  EXPECT_NE(errorOf([&] {
              ap_launch(nullptr, 0, "t", 0, nullptr, 0);
            }).find("null step handle"),
            std::string::npos);
}

// A one-stage program: pipeline transfers have no neighbour, run on the
// comm stream only and name a peer; a pipeline sum over one stage changes
// nothing.
TEST_F(AbiStepTest, PipelineCallsOnOneStage) {
  EXPECT_NE(errorOf([&] {
              ap_pipeline_send(handle(), 0, 64, AP_PEER_NEXT, AP_STREAM_COMM);
            }).find("ap_pipeline_send: stage 0 of 1 has no next stage"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_pipeline_recv(handle(), 0, 64, AP_PEER_PREV, AP_STREAM_COMM);
            }).find("ap_pipeline_recv: stage 0 of 1 has no previous stage"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_pipeline_send(handle(), 0, 64, AP_PEER_NEXT,
                               AP_STREAM_COMPUTE);
            })
                .find("ap_pipeline_send: stream compute (pipeline transfers "
                      "run on the comm stream"),
            std::string::npos);
  EXPECT_NE(
      errorOf([&] { ap_pipeline_recv(handle(), 0, 64, 2, AP_STREAM_COMM); })
          .find("ap_pipeline_recv: peer 2 (expected AP_PEER_PREV 0 or "
                "AP_PEER_NEXT 1)"),
      std::string::npos);
  auto *f = static_cast<float *>(ap_at(handle(), 0));
  for (int i = 0; i < 16; ++i)
    f[i] = 0.5f * float(i);
  ap_all_reduce(handle(), 0, 64, AP_DTYPE_F32, AP_STREAM_COMM,
                AP_REDUCE_PIPELINE);
  device->synchronize();
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(f[i], 0.5f * float(i)) << i;
  // Over the tensor-parallel group of a program without one: the buffer.
  ap_all_reduce(handle(), 0, 64, AP_DTYPE_F32, AP_STREAM_COMPUTE,
                AP_REDUCE_TENSOR);
  device->synchronize();
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(f[i], 0.5f * float(i)) << i;
  EXPECT_NE(errorOf([&] {
              ap_all_reduce(handle(), 0, 64, AP_DTYPE_F32, AP_STREAM_COMM, 32);
            }).find("ap_all_reduce: flags 32"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_all_reduce(handle(), 0, 64, AP_DTYPE_F32, AP_STREAM_COMM,
                            AP_REDUCE_PIPELINE | AP_REDUCE_TENSOR);
            }).find("over the pipeline and the tensor-parallel group at once"),
            std::string::npos);
}

} // namespace
