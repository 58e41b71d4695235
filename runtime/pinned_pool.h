//===- pinned_pool.h - Pinned slots and pool --------------------*- C++ -*-===//
//
// Pinned host memory is allocated once per run (cudaHostAlloc of 1 GiB took
// 0.68 s on our H200, so never in the steady state) in two parts:
//   - the slot region, laid out by the compiled plan: a table of
//     (offset, bytes) slots that offloaded activations are copied into;
//   - a general pool with power-of-two size classes for runtime-owned
//     staging (checkpoint I/O, fingerprints), which grows to its working set
//     once and then only reuses.
//
// Ownership is checked on every call, with messages that name the slot:
// acquiring a held slot, releasing twice, releasing a handle of another pool
// ("foreign slot"), and reusing a slot before the H2D that read it completed
// (the docs/architecture.md section 4 rule). The last one is decided with the
// Device's ordering clocks: the writer's stream must be ordered after the H2D's
// event (by waits, transitively) or the event must be complete.
//
// Statistics: buffers (host allocations held), bytes retained, bytes in use.
// In use must be 0 after every step; the training loop calls
// assertNoneInUse().
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_PINNED_POOL_H
#define ACTPLACE_RUNTIME_PINNED_POOL_H

#include "runtime/device.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ap::rt {

/// One slot of the compiled plan's pinned layout.
struct PinnedSlotSpec {
  uint64_t offset = 0; ///< from the start of the slot region, 256-aligned
  uint64_t bytes = 0;
};

/// The compiled plan's pinned layout (one microbatch plus what is in
/// flight, docs/architecture.md section 4).
struct PinnedLayout {
  uint64_t totalBytes = 0;
  std::vector<PinnedSlotSpec> slots;
};

/// A held slot. Copyable, but only the holder of the current lease may
/// release it.
struct PinnedSlot {
  void *data = nullptr;
  uint64_t bytes = 0;
  uint32_t index = 0;
  uint32_t pool = 0;  ///< id of the pool that issued it
  uint64_t lease = 0; ///< 0: not a held slot
  explicit operator bool() const { return lease != 0; }
};

/// A general-pool buffer; `capacity` is its size class.
struct PinnedBuffer {
  void *data = nullptr;
  uint64_t bytes = 0;
  uint64_t capacity = 0;
  uint32_t pool = 0;
  uint64_t lease = 0;
  explicit operator bool() const { return lease != 0; }
};

struct PinnedPoolStats {
  uint64_t buffers = 0;     ///< host allocations held (slot region counts one)
  uint64_t bytes = 0;       ///< bytes retained by those allocations
  uint64_t inUse = 0;       ///< bytes held or awaiting a pending release
  uint64_t allocations = 0; ///< host allocations made so far (lifetime)
};

class PinnedPool {
public:
  /// Smallest general-pool size class.
  static constexpr uint64_t kMinClassBytes = 4096;

  /// Validates `layout` (slots 256-aligned, inside totalBytes, disjoint) and
  /// allocates the slot region once.
  PinnedPool(Device &device, PinnedLayout layout);
  ~PinnedPool();
  PinnedPool(const PinnedPool &) = delete;
  PinnedPool &operator=(const PinnedPool &) = delete;

  uint32_t id() const { return id_; }
  uint32_t slotCount() const { return static_cast<uint32_t>(slots_.size()); }
  uint64_t slotBytes(uint32_t index) const;

  //===--- Planned slots --------------------------------------------------===//
  /// Takes slot `index` for work about to be enqueued on `writer`. Fails if
  /// the slot is held, or if its previous reader (the H2D given to
  /// releaseAfter) is neither complete nor ordered before `writer`.
  PinnedSlot acquire(uint32_t index, Stream writer);
  /// Returns the slot once the last device work reading it, recorded as
  /// `readDone`, completes; until then it counts as in use. Fails on a
  /// foreign handle, a double release or a stale lease.
  void releaseAfter(const PinnedSlot &slot, EventId readDone);
  /// Returns a slot no device work touches any more (the caller
  /// synchronised). Same ownership checks.
  void release(const PinnedSlot &slot);
  /// True while the slot is held (acquired, not released).
  bool isHeld(uint32_t index) const;

  //===--- General pool ---------------------------------------------------===//
  /// A buffer of at least `bytes` from the size class above it; reuses a
  /// free buffer of that class, allocates only on a miss.
  PinnedBuffer allocate(uint64_t bytes);
  void release(const PinnedBuffer &buffer);
  /// Returns the buffer once `readDone` completes.
  void releaseAfter(const PinnedBuffer &buffer, EventId readDone);
  /// The size class serving `bytes`.
  static uint64_t sizeClass(uint64_t bytes);

  //===--- Statistics -----------------------------------------------------===//
  /// Retires pending releases whose events completed, then counts.
  PinnedPoolStats stats();
  /// Throws an Error listing every slot and buffer still in use, naming
  /// `where` (e.g. "step 12"). The training loop calls it after each step,
  /// after synchronising.
  void assertNoneInUse(const std::string &where);

private:
  enum class State : uint8_t { Free, Held, Releasing };
  struct Slot {
    PinnedSlotSpec spec;
    State state = State::Free;
    uint64_t lease = 0;
    SyncPoint pending; ///< valid when Releasing
  };
  struct Buffer {
    uint64_t capacity = 0;
    State state = State::Free;
    uint64_t lease = 0;
    SyncPoint pending;
  };

  Slot &checkSlotHandle(const PinnedSlot &slot, const char *what);
  Buffer &checkBufferHandle(const PinnedBuffer &buffer, const char *what);
  void retire();

  Device &device_;
  uint32_t id_;
  PinnedLayout layout_;
  char *region_ = nullptr;
  std::vector<Slot> slots_;
  std::map<void *, Buffer> buffers_;
  uint64_t nextLease_ = 1;
  uint64_t allocations_ = 0;
};

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_PINNED_POOL_H
