//===- pinned_pool.cpp - Pinned slots and size-class pool -------*- C++ -*-===//
#include "runtime/pinned_pool.h"

#include "runtime/error.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <sstream>

namespace ap::rt {
namespace {
std::atomic<uint32_t> nextPoolId{1};

std::string describePoint(const SyncPoint &p) {
  return detail::concat("event ", static_cast<uint32_t>(p.event), " (record ",
                        p.generation, " on stream ", streamName(p.stream), ")");
}
} // namespace

PinnedPool::PinnedPool(Device &device, PinnedLayout layout)
    : device_(device), id_(nextPoolId.fetch_add(1)),
      layout_(std::move(layout)) {
  std::vector<std::pair<uint64_t, uint32_t>> order;
  for (uint32_t i = 0; i < layout_.slots.size(); ++i) {
    const PinnedSlotSpec &s = layout_.slots[i];
    if (s.bytes == 0)
      fail("pinned pool: slot ", i, " has zero bytes");
    if (s.offset % kDeviceAlignment != 0)
      fail("pinned pool: slot ", i, " offset ", s.offset, " is not ",
           kDeviceAlignment, "-byte aligned");
    if (s.offset > layout_.totalBytes ||
        s.bytes > layout_.totalBytes - s.offset)
      fail("pinned pool: slot ", i, " [", s.offset, ", ", s.offset + s.bytes,
           ") exceeds the planned ", layout_.totalBytes, " bytes");
    order.emplace_back(s.offset, i);
  }
  std::sort(order.begin(), order.end());
  for (size_t k = 1; k < order.size(); ++k) {
    const PinnedSlotSpec &prev = layout_.slots[order[k - 1].second];
    if (prev.offset + prev.bytes > order[k].first)
      fail("pinned pool: slots ", order[k - 1].second, " and ", order[k].second,
           " overlap");
  }
  if (layout_.totalBytes) {
    region_ = static_cast<char *>(
        device_.backend().allocatePinned(layout_.totalBytes));
    ++allocations_;
  }
  slots_.resize(layout_.slots.size());
  for (size_t i = 0; i < slots_.size(); ++i)
    slots_[i].spec = layout_.slots[i];
}

PinnedPool::~PinnedPool() {
  // Device work may still read pinned memory; never free under it.
  try {
    device_.synchronize();
  } catch (const std::exception &e) {
    std::fprintf(stderr, "actplace: %s\n", e.what());
  }
  try {
    if (region_)
      device_.backend().freePinned(region_);
    for (auto &entry : buffers_)
      device_.backend().freePinned(entry.first);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "actplace: %s\n", e.what());
  }
}

uint64_t PinnedPool::slotBytes(uint32_t index) const {
  if (index >= slots_.size())
    fail("pinned pool: unknown slot ", index, " (the plan has ", slots_.size(),
         ")");
  return slots_[index].spec.bytes;
}

bool PinnedPool::isHeld(uint32_t index) const {
  return index < slots_.size() && slots_[index].state == State::Held;
}

//===----------------------------------------------------------------------===//
// Planned slots
//===----------------------------------------------------------------------===//

PinnedSlot PinnedPool::acquire(uint32_t index, Stream writer) {
  if (index >= slots_.size())
    fail("pinned pool: acquire of unknown slot ", index, " (the plan has ",
         slots_.size(), ")");
  Slot &slot = slots_[index];
  if (slot.state == State::Held)
    fail("pinned pool: slot ", index, " acquired while still held (lease ",
         slot.lease, "); the previous value was never reloaded or released");
  if (slot.state == State::Releasing) {
    if (!device_.orderedBefore(slot.pending, writer) &&
        !device_.completed(slot.pending))
      fail("pinned pool: slot ", index,
           " reused before the H2D that read it completed: its release waits "
           "on ",
           describePoint(slot.pending), " and nothing orders stream ",
           streamName(writer), " after it");
    slot.state = State::Free;
  }
  slot.state = State::Held;
  slot.lease = nextLease_++;
  return PinnedSlot{region_ + slot.spec.offset, slot.spec.bytes, index, id_,
                    slot.lease};
}

PinnedPool::Slot &PinnedPool::checkSlotHandle(const PinnedSlot &handle,
                                              const char *what) {
  if (handle.pool != id_)
    fail("pinned pool: ", what,
         " of a foreign slot: the handle belongs to pool #", handle.pool,
         ", not to pool #", id_);
  if (handle.index >= slots_.size())
    fail("pinned pool: ", what, " of unknown slot ", handle.index);
  Slot &slot = slots_[handle.index];
  if (handle.lease == 0 || handle.lease != slot.lease ||
      slot.state != State::Held)
    fail("pinned pool: double release of slot ", handle.index,
         " (handle lease ", handle.lease, ", slot ",
         slot.state == State::Held ? "held under lease "
                                   : "released after lease ",
         slot.lease, ")");
  return slot;
}

void PinnedPool::releaseAfter(const PinnedSlot &handle, EventId readDone) {
  Slot &slot = checkSlotHandle(handle, "release");
  slot.pending = device_.lastRecord(readDone);
  slot.state = State::Releasing;
}

void PinnedPool::release(const PinnedSlot &handle) {
  Slot &slot = checkSlotHandle(handle, "release");
  slot.state = State::Free;
}

//===----------------------------------------------------------------------===//
// General pool
//===----------------------------------------------------------------------===//

uint64_t PinnedPool::sizeClass(uint64_t bytes) {
  uint64_t c = kMinClassBytes;
  while (c < bytes)
    c <<= 1;
  return c;
}

PinnedBuffer PinnedPool::allocate(uint64_t bytes) {
  uint64_t capacity = sizeClass(bytes);
  for (auto &entry : buffers_) {
    Buffer &b = entry.second;
    if (b.capacity != capacity || b.state == State::Held)
      continue;
    if (b.state == State::Releasing) {
      if (!device_.completed(b.pending))
        continue;
      b.state = State::Free;
    }
    b.state = State::Held;
    b.lease = nextLease_++;
    return PinnedBuffer{entry.first, bytes, capacity, id_, b.lease};
  }
  void *data = device_.backend().allocatePinned(capacity);
  ++allocations_;
  Buffer b;
  b.capacity = capacity;
  b.state = State::Held;
  b.lease = nextLease_++;
  buffers_.emplace(data, b);
  return PinnedBuffer{data, bytes, capacity, id_, b.lease};
}

PinnedPool::Buffer &PinnedPool::checkBufferHandle(const PinnedBuffer &handle,
                                                  const char *what) {
  if (handle.pool != id_)
    fail("pinned pool: ", what, " of a foreign buffer: it belongs to pool #",
         handle.pool, ", not to pool #", id_);
  auto it = buffers_.find(handle.data);
  if (it == buffers_.end())
    fail("pinned pool: ", what, " of a foreign buffer: ", handle.data,
         " was not allocated by pool #", id_);
  Buffer &b = it->second;
  if (handle.lease == 0 || handle.lease != b.lease || b.state != State::Held)
    fail("pinned pool: double release of a ", b.capacity,
         "-byte buffer (handle lease ", handle.lease, ", buffer lease ",
         b.lease, ")");
  return b;
}

void PinnedPool::release(const PinnedBuffer &handle) {
  checkBufferHandle(handle, "release").state = State::Free;
}

void PinnedPool::releaseAfter(const PinnedBuffer &handle, EventId readDone) {
  Buffer &b = checkBufferHandle(handle, "release");
  b.pending = device_.lastRecord(readDone);
  b.state = State::Releasing;
}

//===----------------------------------------------------------------------===//
// Statistics
//===----------------------------------------------------------------------===//

void PinnedPool::retire() {
  for (Slot &s : slots_)
    if (s.state == State::Releasing && device_.completed(s.pending))
      s.state = State::Free;
  for (auto &entry : buffers_)
    if (entry.second.state == State::Releasing &&
        device_.completed(entry.second.pending))
      entry.second.state = State::Free;
}

PinnedPoolStats PinnedPool::stats() {
  retire();
  PinnedPoolStats st;
  st.allocations = allocations_;
  if (region_) {
    st.buffers = 1;
    st.bytes = layout_.totalBytes;
  }
  for (const Slot &s : slots_)
    if (s.state != State::Free)
      st.inUse += s.spec.bytes;
  for (const auto &entry : buffers_) {
    ++st.buffers;
    st.bytes += entry.second.capacity;
    if (entry.second.state != State::Free)
      st.inUse += entry.second.capacity;
  }
  return st;
}

void PinnedPool::assertNoneInUse(const std::string &where) {
  PinnedPoolStats st = stats();
  if (st.inUse == 0)
    return;
  std::ostringstream os;
  os << "pinned pool: " << st.inUse << " bytes still in use after " << where
     << ":";
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot &s = slots_[i];
    if (s.state == State::Held)
      os << " slot " << i << " (" << s.spec.bytes << " bytes, held);";
    else if (s.state == State::Releasing)
      os << " slot " << i << " (" << s.spec.bytes << " bytes, release waits on "
         << describePoint(s.pending) << ");";
  }
  for (const auto &entry : buffers_)
    if (entry.second.state != State::Free)
      os << " buffer of " << entry.second.capacity << " bytes ("
         << (entry.second.state == State::Held ? "held" : "release pending")
         << ");";
  throw Error(os.str());
}

} // namespace ap::rt
