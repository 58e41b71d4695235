//===- step_tsan_test.cpp - A step as generated code runs it ----*- C++ -*-===//
//
// Two linear layers, two microbatches, forward then backward with weight
// gradients accumulated in FP32, shaped like the generated step: every saved
// activation is either kept or offloaded (its device memory clobbered after
// the D2H, as a later writer would) and reloaded before its backward. The
// weight-gradient fingerprints must be bit-identical with offload on and
// off, the pool empty after the step, and the transfer counters 0 / > 0.
// Also built under ThreadSanitizer (host backend): reference kernels,
// copies and the offload engine on real stream threads.
//
//===----------------------------------------------------------------------===//
#include "kernels/kernels.h"
#include "runtime/runtime.h"
#include "runtime_test_util.h"

using namespace ap::rt;
using namespace ap::rt::test;
namespace k = ap::kernels;

namespace {

constexpr int64_t kRows = 64, kDim = 128;
constexpr uint64_t kAct = kRows * kDim * 2; // bf16 activation
constexpr uint64_t kW = kDim * kDim * 2;    // bf16 weight
constexpr uint64_t kGrad = kDim * kDim * 4; // f32 main grad

std::vector<k::bf16> randomBf16(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<k::bf16> v(n);
  for (auto &x : v)
    x = k::bf16(u(gen));
  return v;
}

struct StepResult {
  std::string gradsFingerprint;
  StepMetrics metrics;
};

/// Keep: saved values stay on device. Offload: offloaded, clobbered,
/// reloaded. ClobberOnly: clobbered without offload (what a missing reload
/// would leave behind).
enum class Mode { Keep, Offload, ClobberOnly };

StepResult runStep(Device &dev, Mode mode) {
  const bool offload = mode == Mode::Offload;
  // Arena plan: x0 x1 x2 dy2 dx1 | W0 W1 | dW0 dW1 (each 256-aligned).
  uint64_t off = 0;
  auto place = [&](uint64_t bytes) {
    uint64_t at = off;
    off += alignUp(bytes, kDeviceAlignment);
    return at;
  };
  uint64_t oX0 = place(kAct), oX1 = place(kAct), oX2 = place(kAct),
           oDy2 = place(kAct), oDx1 = place(kAct), oW0 = place(kW),
           oW1 = place(kW), oG0 = place(kGrad), oG1 = place(kGrad);
  dev.allocateArena(off, k::linearWorkspaceBytes(dev.kind() == DeviceKind::Cuda
                                                     ? k::Backend::Cuda
                                                     : k::Backend::Host));
  auto at = [&](uint64_t o) { return dev.at(o); };

  PinnedPool pool(dev, PinnedLayout{2 * kAct, {{0, kAct}, {kAct, kAct}}});
  OffloadEngine engine(dev, pool);
  auto scope0 = engine.scope("L0.mlp_fc1"), scope1 = engine.scope("L1.mlp_fc1");
  EventId x0Ready = dev.createEvent(), x1Ready = dev.createEvent(),
          fwdDone = dev.createEvent(), d2h0 = dev.createEvent(),
          d2h1 = dev.createEvent(), h2d0 = dev.createEvent(),
          h2d1 = dev.createEvent(), clobbered = dev.createEvent();

  auto w0 = randomBf16(kDim * kDim, 1), w1 = randomBf16(kDim * kDim, 2);
  dev.copyAsync(at(oW0), w0.data(), kW, CopyKind::HostToDevice,
                Stream::Compute);
  dev.copyAsync(at(oW1), w1.data(), kW, CopyKind::HostToDevice,
                Stream::Compute);
  dev.memsetAsync(at(oG0), 0, kGrad, Stream::Compute);
  dev.memsetAsync(at(oG1), 0, kGrad, Stream::Compute);

  auto linearFwd = [&](uint64_t x, uint64_t w, uint64_t y) {
    k::LinearForwardArgs a;
    a.x = at(x), a.w = at(w), a.y = at(y);
    a.rows = kRows, a.in = kDim, a.out = kDim;
    dev.launch(Stream::Compute, "linear_fwd", [a](const k::KernelContext &ctx) {
      return k::linearForward(ctx, a);
    });
  };
  auto linearBwd = [&](uint64_t x, uint64_t w, uint64_t dy, uint64_t dx,
                       uint64_t dw) {
    k::LinearBackwardArgs a;
    a.x = at(x), a.w = at(w), a.dy = at(dy), a.dx = dx ? at(dx) : nullptr;
    a.dw = at(dw);
    a.rows = kRows, a.in = kDim, a.out = kDim;
    dev.launch(Stream::Compute, "linear_bwd", [a](const k::KernelContext &ctx) {
      return k::linearBackward(ctx, a);
    });
  };

  std::vector<std::vector<k::bf16>> keepAlive; // pageable sources of H2D
  for (uint32_t mb = 0; mb < 2; ++mb) {
    keepAlive.push_back(randomBf16(kRows * kDim, 100 + mb));
    keepAlive.push_back(randomBf16(kRows * kDim, 200 + mb));
    {
      ScopedRange r("L0.mlp_fc1");
      dev.copyAsync(at(oX0), keepAlive[keepAlive.size() - 2].data(), kAct,
                    CopyKind::HostToDevice, Stream::Compute);
      dev.record(x0Ready, Stream::Compute);
      if (offload)
        engine.offload(scope0, 0, at(oX0), kAct, x0Ready, d2h0);
      linearFwd(oX0, oW0, oX1);
      dev.record(x1Ready, Stream::Compute);
    }
    {
      ScopedRange r("L1.mlp_fc1");
      if (offload)
        engine.offload(scope1, 1, at(oX1), kAct, x1Ready, d2h1);
      linearFwd(oX1, oW1, oX2);
    }
    if (mode != Mode::Keep) {
      // A later writer reuses the saved values' memory once their D2H ran.
      if (offload) {
        dev.wait(Stream::Compute, d2h0);
        dev.wait(Stream::Compute, d2h1);
      }
      dev.memsetAsync(at(oX0), 0xff, kAct, Stream::Compute);
      dev.memsetAsync(at(oX1), 0xff, kAct, Stream::Compute);
      dev.record(clobbered, Stream::Compute);
      dev.wait(Stream::H2D, clobbered);
    }
    dev.copyAsync(at(oDy2), keepAlive.back().data(), kAct,
                  CopyKind::HostToDevice, Stream::Compute);
    dev.record(fwdDone, Stream::Compute);
    // Backward, layer 1 then layer 0; reloads issued one layer ahead.
    if (offload) {
      engine.reload(scope1, 1, at(oX1), kAct, d2h1, h2d1);
      engine.reload(scope0, 0, at(oX0), kAct, d2h0, h2d0);
      dev.wait(Stream::Compute, h2d1);
    }
    linearBwd(oX1, oW1, oDy2, oDx1, oG1);
    if (offload)
      dev.wait(Stream::Compute, h2d0);
    linearBwd(oX0, oW0, oDx1, 0, oG0);
  }
  dev.synchronize();
  pool.assertNoneInUse("step 1");
  engine.assertAllReloaded("step 1");

  StepResult result;
  result.gradsFingerprint =
      fingerprint(dev, pool, {{at(oG0), kGrad, true}, {at(oG1), kGrad, true}});
  collectRuntimeMetrics(result.metrics, dev, pool, &engine);
  result.metrics.step = 1;
  result.metrics.plannedPeakBytes = off + dev.workspaceBytes();
  return result;
}

using StepTest = BackendTest;

TEST_P(StepTest, OffloadChangesNoBitAndCountsTransfers) {
  StepResult off = runStep(*device, Mode::Keep);
  DeviceOptions options;
  options.device = GetParam();
  options.quiet = true;
  Device second(options);
  StepResult on = runStep(second, Mode::Offload);

  EXPECT_EQ(on.gradsFingerprint, off.gradsFingerprint);
  EXPECT_EQ(on.gradsFingerprint.size(), 64u);
  for (const char *scope : {"L0.mlp_fc1", "L1.mlp_fc1"}) {
    EXPECT_EQ(off.metrics.transfers[scope], TransferCounters{}) << scope;
    TransferCounters c = on.metrics.transfers[scope];
    EXPECT_EQ(c.d2hCount, 2u) << scope;
    EXPECT_EQ(c.h2dCount, 2u) << scope;
    EXPECT_EQ(c.d2hBytes, 2 * kAct) << scope;
  }
  EXPECT_EQ(on.metrics.pinnedPool.inUse, 0u);
  // The slots of the two offloaded activations plus the fingerprint's
  // staging (one slot per gradient leaf hashed at once).
  static const char probe = 0; // only sizes matter to the query
  uint64_t staging =
      fingerprintStagingBytes({{&probe, kGrad, true}, {&probe, kGrad, true}});
  EXPECT_EQ(on.metrics.pinnedPool.bytes,
            2 * kAct + PinnedPool::sizeClass(staging));
  EXPECT_GE(on.metrics.devicePeakBytes, on.metrics.plannedPeakBytes);
  EXPECT_EQ(rangeDepth(), 0);
}

// Without the reloads, backward reads the clobbered bytes: the gradients
// change, so the bit-identity above really depends on the reloads.
TEST_P(StepTest, ClobberWithoutReloadChangesTheGradients) {
  StepResult clean = runStep(*device, Mode::Keep);
  DeviceOptions options;
  options.device = GetParam();
  options.quiet = true;
  Device second(options);
  StepResult broken = runStep(second, Mode::ClobberOnly);
  EXPECT_NE(broken.gradsFingerprint, clean.gradsFingerprint);
}

AP_RT_INSTANTIATE_BACKENDS(StepTest);

} // namespace
