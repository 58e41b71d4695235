//===- pinned_pool_test.cpp - Pinned pool tests -----------------*- C++ -*-===//
#include "runtime/pinned_pool.h"
#include "runtime_test_util.h"

using namespace ap::rt;
using namespace ap::rt::test;

namespace {

using PinnedPoolTest = BackendTest;

PinnedLayout twoSlots() {
  PinnedLayout l;
  l.totalBytes = 3 * 4096;
  l.slots = {{0, 4096}, {4096, 8192}};
  return l;
}

TEST_P(PinnedPoolTest, LayoutIsValidated) {
  PinnedLayout misaligned{4096, {{100, 16}}};
  EXPECT_RT_ERROR(PinnedPool(*device, misaligned),
                  "offset 100 is not 256-byte aligned");
  PinnedLayout overlap{8192, {{0, 512}, {256, 512}}};
  EXPECT_RT_ERROR(PinnedPool(*device, overlap), "slots 0 and 1 overlap");
  PinnedLayout tooBig{1024, {{512, 1024}}};
  EXPECT_RT_ERROR(PinnedPool(*device, tooBig),
                  "exceeds the planned 1024 bytes");
  PinnedLayout empty{1024, {{0, 0}}};
  EXPECT_RT_ERROR(PinnedPool(*device, empty), "zero bytes");
}

TEST_P(PinnedPoolTest, SlotsFollowThePlanAndCountWhileHeld) {
  PinnedPool pool(*device, twoSlots());
  PinnedPoolStats st = pool.stats();
  EXPECT_EQ(st.buffers, 1u);
  EXPECT_EQ(st.bytes, 3u * 4096);
  EXPECT_EQ(st.inUse, 0u);
  PinnedSlot a = pool.acquire(0, Stream::D2H);
  PinnedSlot b = pool.acquire(1, Stream::D2H);
  EXPECT_EQ(static_cast<char *>(b.data) - static_cast<char *>(a.data), 4096);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 256, 0u);
  EXPECT_EQ(a.bytes, 4096u);
  EXPECT_EQ(b.bytes, 8192u);
  EXPECT_TRUE(pool.isHeld(1));
  EXPECT_EQ(pool.stats().inUse, 3u * 4096);
  // Pinned memory is host-writable in both backends.
  std::memset(a.data, 0x3c, a.bytes);
  pool.release(a);
  EXPECT_EQ(pool.stats().inUse, 8192u);
  pool.release(b);
  EXPECT_EQ(pool.stats().inUse, 0u);
  EXPECT_EQ(pool.stats().allocations, 1u); // one allocation for the run
  pool.assertNoneInUse("step 1");
}

TEST_P(PinnedPoolTest, OwnershipErrorsNameTheSlot) {
  PinnedPool pool(*device, twoSlots());
  PinnedPool other(*device, twoSlots());
  PinnedSlot a = pool.acquire(0, Stream::D2H);
  EXPECT_RT_ERROR(pool.acquire(0, Stream::D2H),
                  "slot 0 acquired while still held");
  EXPECT_RT_ERROR(pool.acquire(7, Stream::D2H), "unknown slot 7");
  EXPECT_RT_ERROR(other.release(a), "foreign slot");
  PinnedSlot forged = a;
  forged.index = 9;
  EXPECT_RT_ERROR(pool.release(forged), "unknown slot 9");
  pool.release(a);
  EXPECT_RT_ERROR(pool.release(a), "double release of slot 0");
  // A stale handle after the slot was taken again is a double release too,
  // and must not free the new holder's slot.
  PinnedSlot again = pool.acquire(0, Stream::D2H);
  EXPECT_RT_ERROR(pool.release(a), "double release of slot 0");
  EXPECT_TRUE(pool.isHeld(0));
  pool.release(again);
  EXPECT_RT_ERROR(pool.release(PinnedSlot{}), "foreign slot");
  pool.assertNoneInUse("test");
}

TEST_P(PinnedPoolTest, ReuseBeforeTheReadingH2DCompletedIsAnError) {
  PinnedPool pool(*device, twoSlots());
  Gate gate;
  EventId h2dDone = device->createEvent();
  PinnedSlot s = pool.acquire(1, Stream::D2H);
  EXPECT_RT_ERROR(pool.releaseAfter(s, h2dDone), "never recorded");
  // The H2D "reading" the slot is held back by the gate.
  device->hostCallback(Stream::H2D, gate.waiter());
  device->record(h2dDone, Stream::H2D);
  pool.releaseAfter(s, h2dDone);
  EXPECT_EQ(pool.stats().inUse, 8192u); // pending release still counts
  EXPECT_RT_ERROR(pool.assertNoneInUse("step 3"),
                  "slot 1 (8192 bytes, release waits on event");
  EXPECT_RT_ERROR(pool.acquire(1, Stream::D2H),
                  "slot 1 reused before the H2D that read it completed");
  // Ordering the writer's stream after the H2D makes the reuse legal even
  // though the H2D has not run yet.
  device->wait(Stream::D2H, h2dDone);
  PinnedSlot again = pool.acquire(1, Stream::D2H);
  EventId d2hDone = device->createEvent();
  device->record(d2hDone, Stream::D2H);
  pool.releaseAfter(again, d2hDone);
  gate.open();
  device->synchronize();
  EXPECT_EQ(pool.stats().inUse, 0u);
  pool.assertNoneInUse("step 3");
}

TEST_P(PinnedPoolTest, ReuseOrderedThroughAChainOfWaitsIsAccepted) {
  PinnedPool pool(*device, twoSlots());
  Gate gate;
  EventId h2dDone = device->createEvent(), produced = device->createEvent();
  PinnedSlot s = pool.acquire(0, Stream::D2H);
  device->hostCallback(Stream::H2D, gate.waiter());
  device->record(h2dDone, Stream::H2D);
  pool.releaseAfter(s, h2dDone);
  // consumer waits for the reload, a later producer runs on compute, the
  // d2h stream waits for the producer: the slot reuse is ordered.
  device->wait(Stream::Compute, h2dDone);
  device->record(produced, Stream::Compute);
  EXPECT_RT_ERROR(pool.acquire(0, Stream::D2H), "reused before the H2D");
  device->wait(Stream::D2H, produced);
  PinnedSlot again = pool.acquire(0, Stream::D2H);
  gate.open();
  device->synchronize();
  pool.release(again);
  pool.assertNoneInUse("step");
}

TEST_P(PinnedPoolTest, ReuseAfterTheH2DCompletedIsAccepted) {
  PinnedPool pool(*device, twoSlots());
  EventId h2dDone = device->createEvent();
  PinnedSlot s = pool.acquire(0, Stream::D2H);
  device->record(h2dDone, Stream::H2D);
  pool.releaseAfter(s, h2dDone);
  device->synchronize(h2dDone);
  PinnedSlot again = pool.acquire(0, Stream::D2H);
  pool.release(again);
}

TEST_P(PinnedPoolTest, GeneralPoolReusesSizeClasses) {
  PinnedPool pool(*device, PinnedLayout{});
  EXPECT_EQ(PinnedPool::sizeClass(1), 4096u);
  EXPECT_EQ(PinnedPool::sizeClass(4096), 4096u);
  EXPECT_EQ(PinnedPool::sizeClass(4097), 8192u);
  EXPECT_EQ(PinnedPool::sizeClass(3u << 20), 4u << 20);
  EXPECT_EQ(pool.stats().buffers, 0u);

  PinnedBuffer a = pool.allocate(5000);
  EXPECT_EQ(a.capacity, 8192u);
  EXPECT_EQ(a.bytes, 5000u);
  EXPECT_EQ(pool.stats().inUse, 8192u);
  std::memset(a.data, 1, a.capacity);
  void *first = a.data;
  pool.release(a);
  PinnedBuffer b = pool.allocate(6000); // same class: reused, no allocation
  EXPECT_EQ(b.data, first);
  EXPECT_EQ(pool.stats().allocations, 1u);
  PinnedBuffer c = pool.allocate(7000); // class busy: a second buffer
  EXPECT_NE(c.data, b.data);
  PinnedBuffer d = pool.allocate(10); // other class
  EXPECT_EQ(d.capacity, 4096u);
  PinnedPoolStats st = pool.stats();
  EXPECT_EQ(st.allocations, 3u);
  EXPECT_EQ(st.buffers, 3u);
  EXPECT_EQ(st.bytes, 8192u + 8192u + 4096u);
  EXPECT_EQ(st.inUse, st.bytes);
  pool.release(b);
  pool.release(c);
  pool.release(d);
  // Steady state: the same demand again allocates nothing.
  for (int i = 0; i < 3; ++i) {
    PinnedBuffer x = pool.allocate(8000), y = pool.allocate(8000);
    pool.release(x);
    pool.release(y);
  }
  EXPECT_EQ(pool.stats().allocations, 3u);
  EXPECT_EQ(pool.stats().inUse, 0u);
  pool.assertNoneInUse("staging");
}

TEST_P(PinnedPoolTest, GeneralPoolOwnershipErrors) {
  PinnedPool pool(*device, PinnedLayout{});
  PinnedPool other(*device, PinnedLayout{});
  PinnedBuffer a = pool.allocate(100);
  EXPECT_RT_ERROR(other.release(a), "foreign buffer");
  PinnedBuffer forged = a;
  int local = 0;
  forged.data = &local;
  EXPECT_RT_ERROR(pool.release(forged), "was not allocated by pool");
  pool.release(a);
  EXPECT_RT_ERROR(pool.release(a), "double release of a 4096-byte buffer");
  pool.assertNoneInUse("x");
}

TEST_P(PinnedPoolTest, GeneralPoolWaitsForPendingReleases) {
  PinnedPool pool(*device, PinnedLayout{});
  Gate gate;
  EventId done = device->createEvent();
  PinnedBuffer a = pool.allocate(4096);
  device->hostCallback(Stream::H2D, gate.waiter());
  device->record(done, Stream::H2D);
  pool.releaseAfter(a, done);
  PinnedBuffer b = pool.allocate(4096);
  EXPECT_NE(b.data, a.data); // the pending one is not handed out
  EXPECT_RT_ERROR(pool.assertNoneInUse("step 9"), "after step 9");
  pool.release(b);
  gate.open();
  device->synchronize();
  pool.assertNoneInUse("step 9");
  PinnedBuffer c = pool.allocate(4096);
  EXPECT_EQ(pool.stats().allocations, 2u);
  pool.release(c);
}

AP_RT_INSTANTIATE_BACKENDS(PinnedPoolTest);

} // namespace
