//===- offload_test.cpp - Offload engine tests ------------------*- C++ -*-===//
#include "runtime/offload.h"
#include "runtime_test_util.h"

using namespace ap::rt;
using namespace ap::rt::test;

namespace {

/// A small "step": three saved values in the arena, offloaded after their
/// producers, clobbered on device (their memory reused), reloaded and read
/// back by their consumers.
class OffloadTest : public BackendTest {
protected:
  static constexpr uint64_t kValueBytes[3] = {1 << 20, 3 << 19, 256 * 1000};
  static constexpr uint64_t kSlot = 2 << 20;

  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped())
      return;
    device->allocateArena(3 * kSlot);
    PinnedLayout layout;
    layout.totalBytes = 3 * kSlot;
    for (uint64_t i = 0; i < 3; ++i)
      layout.slots.push_back({i * kSlot, kSlot});
    pool = std::make_unique<PinnedPool>(*device, layout);
    engine = std::make_unique<OffloadEngine>(*device, *pool);
    for (auto &e : produced)
      e = device->createEvent();
    for (auto &e : d2h)
      e = device->createEvent();
    for (auto &e : h2d)
      e = device->createEvent();
    clobbered = device->createEvent();
  }
  void TearDown() override {
    engine.reset();
    pool.reset();
  }
  char *value(int i) {
    return static_cast<char *>(device->at(i * kSlot, kValueBytes[i]));
  }

  /// Runs one microbatch with fresh random values; returns what consumers
  /// read back after the reloads.
  void microbatch(uint32_t seed, const OffloadEngine::ScopeId scopes[3]) {
    std::vector<std::vector<uint8_t>> inputs, outputs(3);
    for (int i = 0; i < 3; ++i) {
      inputs.push_back(randomBytes(kValueBytes[i], seed + i));
      // producer: writes the value on the compute stream
      device->copyAsync(value(i), inputs[i].data(), kValueBytes[i],
                        CopyKind::HostToDevice, Stream::Compute);
      device->record(produced[i], Stream::Compute);
      engine->offload(scopes[i], i, value(i), kValueBytes[i], produced[i],
                      d2h[i]);
    }
    // Device memory of the values is reused once their D2H finished.
    for (int i = 0; i < 3; ++i) {
      device->wait(Stream::Compute, d2h[i]);
      device->memsetAsync(value(i), 0, kValueBytes[i], Stream::Compute);
    }
    // The reloads overwrite that memory, so they wait for its last user.
    device->record(clobbered, Stream::Compute);
    device->wait(Stream::H2D, clobbered);
    // Backward, in reverse order: reload, then the consumer waits for it.
    for (int i = 2; i >= 0; --i) {
      engine->reload(scopes[i], i, value(i), kValueBytes[i], d2h[i], h2d[i]);
      device->wait(Stream::Compute, h2d[i]);
      outputs[i].resize(kValueBytes[i]);
      device->copyAsync(outputs[i].data(), value(i), kValueBytes[i],
                        CopyKind::DeviceToHost, Stream::Compute);
    }
    device->synchronize(Stream::Compute);
    for (int i = 0; i < 3; ++i)
      EXPECT_TRUE(outputs[i] == inputs[i]) << "value " << i << " seed " << seed;
  }

  std::unique_ptr<PinnedPool> pool;
  std::unique_ptr<OffloadEngine> engine;
  EventId produced[3], d2h[3], h2d[3], clobbered;
};

TEST_P(OffloadTest, RoundTripsCountPerScopeAndEmptyThePool) {
  OffloadEngine::ScopeId a = engine->scope("L0.gdn_core_attn");
  OffloadEngine::ScopeId b = engine->scope("L1.core_attn");
  EXPECT_EQ(engine->scope("L0.gdn_core_attn"), a);
  EXPECT_EQ(engine->scopeName(b), "L1.core_attn");
  const OffloadEngine::ScopeId scopes[3] = {a, b, a};
  for (uint32_t mb = 0; mb < 3; ++mb) {
    // No host synchronisation between microbatches: slot reuse is legal
    // only through the waits (consumer waited on H2D, producer after it).
    microbatch(100 * mb, scopes);
    EXPECT_EQ(engine->pendingReloads(), 0u);
  }
  device->synchronize();
  pool->assertNoneInUse("step 1");
  EXPECT_EQ(pool->stats().inUse, 0u);
  engine->assertAllReloaded("step 1");

  TransferCounters ca = engine->counters("L0.gdn_core_attn");
  EXPECT_EQ(ca.d2hCount, 6u);
  EXPECT_EQ(ca.h2dCount, 6u);
  EXPECT_EQ(ca.d2hBytes, 3 * (kValueBytes[0] + kValueBytes[2]));
  EXPECT_EQ(ca.h2dBytes, ca.d2hBytes);
  TransferCounters cb = engine->counters("L1.core_attn");
  EXPECT_EQ(cb.d2hCount, 3u);
  EXPECT_EQ(cb.h2dBytes, 3 * kValueBytes[1]);
  auto all = engine->transfers();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all.begin()->first, "L0.gdn_core_attn");
  EXPECT_EQ(engine->counters("nope"), TransferCounters{});
  engine->resetCounters();
  EXPECT_EQ(engine->counters("L1.core_attn"), TransferCounters{});
}

TEST_P(OffloadTest, ReloadInvariantsAreChecked) {
  auto s = engine->scope("L2.attn_proj"), t = engine->scope("L2.core_attn");
  EXPECT_RT_ERROR(
      engine->reload(s, 0, value(0), kValueBytes[0], d2h[0], h2d[0]),
      "reload of slot 0 which holds no offloaded value");
  device->record(produced[0], Stream::Compute);
  engine->offload(s, 0, value(0), kValueBytes[0], produced[0], d2h[0]);
  EXPECT_RT_ERROR(
      engine->reload(t, 0, value(0), kValueBytes[0], d2h[0], h2d[0]),
      "holds a value of scope L2.attn_proj");
  EXPECT_RT_ERROR(engine->reload(s, 0, value(0), 1000, d2h[0], h2d[0]),
                  "reload of 1000 bytes from slot 0 which holds 1048576 bytes");
  EXPECT_RT_ERROR(
      engine->reload(s, 0, value(0), kValueBytes[0], d2h[1], h2d[0]),
      "but that value's D2H recorded event");
  EXPECT_RT_ERROR(
      engine->reload(s, 0, value(0), kValueBytes[0], d2h[0], d2h[0]),
      "H2D event must differ");
  std::vector<uint8_t> outside(16);
  EXPECT_RT_ERROR(
      engine->reload(s, 0, outside.data(), kValueBytes[0], d2h[0], h2d[0]),
      "not inside the device arena");
  EXPECT_RT_ERROR(engine->assertAllReloaded("step 4"),
                  "slot 0 (scope L2.attn_proj, 1048576 bytes)");
  engine->reload(s, 0, value(0), kValueBytes[0], d2h[0], h2d[0]);
  EXPECT_RT_ERROR(
      engine->reload(s, 0, value(0), kValueBytes[0], d2h[0], h2d[0]),
      "holds no offloaded value (reload before offload, or twice)");
  device->synchronize();
  pool->assertNoneInUse("step 4");
}

TEST_P(OffloadTest, OffloadInvariantsAreChecked) {
  auto s = engine->scope("L0.mlp_fc1");
  EXPECT_RT_ERROR(
      engine->offload(s, 0, value(0), kValueBytes[0], produced[0], d2h[0]),
      "producer event 0 was never recorded");
  device->record(produced[0], Stream::Compute);
  EXPECT_RT_ERROR(
      engine->offload(s, 0, value(0), kSlot + 1, produced[0], d2h[0]),
      "into slot 0 of 2097152 bytes");
  EXPECT_RT_ERROR(engine->offload(s, 0, value(0), 0, produced[0], d2h[0]),
                  "offload of 0 bytes");
  EXPECT_RT_ERROR(engine->offload(s, 5, value(0), 16, produced[0], d2h[0]),
                  "unknown pinned slot 5");
  std::vector<uint8_t> host(64);
  EXPECT_RT_ERROR(engine->offload(s, 0, host.data(), 64, produced[0], d2h[0]),
                  "not inside the device arena");
  EXPECT_RT_ERROR(engine->offload(s, 0, value(0), 64, produced[0], produced[0]),
                  "must differ from the producer event");
  EXPECT_RT_ERROR(engine->offload(99, 0, value(0), 64, produced[0], d2h[0]),
                  "unknown scope id 99");
  engine->offload(s, 0, value(0), 64, produced[0], d2h[0]);
  EXPECT_RT_ERROR(engine->offload(s, 0, value(0), 64, produced[0], d2h[1]),
                  "slot 0 still holds a value of scope L0.mlp_fc1");
  engine->reload(s, 0, value(0), 64, d2h[0], h2d[0]);
  device->synchronize();
  pool->assertNoneInUse("step");
}

TEST_P(OffloadTest, SlotReuseBeforeItsH2DCompletedIsAnError) {
  auto s = engine->scope("L5.gdn_core_attn");
  Gate gate;
  device->record(produced[0], Stream::Compute);
  engine->offload(s, 0, value(0), 4096, produced[0], d2h[0]);
  device->hostCallback(Stream::H2D, gate.waiter()); // the H2D cannot finish yet
  engine->reload(s, 0, value(0), 4096, d2h[0], h2d[0]);
  // The next producer did not wait for the reload: reusing the slot would
  // overwrite pinned memory the H2D may still be reading.
  device->record(produced[1], Stream::Compute);
  EXPECT_RT_ERROR(engine->offload(s, 0, value(1), 4096, produced[1], d2h[1]),
                  "slot 0 reused before the H2D that read it completed");
  // A different slot is fine.
  engine->offload(s, 1, value(1), 4096, produced[1], d2h[1]);
  engine->reload(s, 1, value(1), 4096, d2h[1], h2d[1]);
  gate.open();
  device->synchronize();
  pool->assertNoneInUse("step");
  EXPECT_EQ(engine->counters("L5.gdn_core_attn").d2hCount, 2u);
}

AP_RT_INSTANTIATE_BACKENDS(OffloadTest);

} // namespace
