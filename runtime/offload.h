//===- offload.h - Offload engine -------------------------------*- C++ -*-===//
//
// The compiled schedule decides which copy runs after which event; the
// engine executes it and checks its invariants on every call (cheap, always
// on, docs/architecture.md sections 4 and 5):
//   offload: the d2h stream waits for the producer's event, then copies the
//            value into its planned pinned slot and records the D2H event;
//   reload:  the h2d stream waits for that same value's D2H event, copies it
//            back and records the H2D event; the slot returns to the pool
//            only when that H2D completes (never when merely enqueued).
// Violations (reload of an empty slot, of another scope's value, with a
// different size, after another D2H event, a producer event that was never
// recorded, a slot reused before its H2D completed, a source outside the
// arena) are Errors naming the scope and slot.
//
// Counters per scope name: D2H / H2D transfer counts and bytes. They feed the
// metrics line and the transfer tests (0 with offload off, > 0 per offloaded
// scope with it on).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_OFFLOAD_H
#define ACTPLACE_RUNTIME_OFFLOAD_H

#include "runtime/device.h"
#include "runtime/pinned_pool.h"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ap::rt {

struct TransferCounters {
  uint64_t d2hCount = 0;
  uint64_t h2dCount = 0;
  uint64_t d2hBytes = 0;
  uint64_t h2dBytes = 0;
  bool operator==(const TransferCounters &o) const {
    return d2hCount == o.d2hCount && h2dCount == o.h2dCount &&
           d2hBytes == o.d2hBytes && h2dBytes == o.h2dBytes;
  }
};

class OffloadEngine {
public:
  using ScopeId = uint32_t;

  OffloadEngine(Device &device, PinnedPool &pool);

  /// The id of scope `name` (e.g. "L3.gdn_core_attn"), registering it on
  /// first use. Generated code registers all scopes once at startup.
  ScopeId scope(std::string_view name);
  const std::string &scopeName(ScopeId id) const;

  /// Starts the D2H of `bytes` at `src` (inside the device arena) into pinned
  /// slot `slot` on the d2h stream, after `producer`; records `d2hDone` on
  /// the d2h stream when the copy is done.
  void offload(ScopeId scope, uint32_t slot, const void *src, uint64_t bytes,
               EventId producer, EventId d2hDone);

  /// Starts the H2D of the value held in `slot` into `dst` (inside the arena)
  /// on the h2d stream, after `d2hDone`, which must be the event of that
  /// value's offload; records `h2dDone` and releases the slot on it.
  void reload(ScopeId scope, uint32_t slot, void *dst, uint64_t bytes,
              EventId d2hDone, EventId h2dDone);

  /// Offloaded values not reloaded yet.
  uint32_t pendingReloads() const;
  /// Fails naming every slot that still holds a value never reloaded.
  void assertAllReloaded(const std::string &where) const;

  /// Counters of every registered scope, by name.
  std::map<std::string, TransferCounters> transfers() const;
  /// Counters of one scope (zeros when unknown).
  TransferCounters counters(std::string_view name) const;
  void resetCounters();

private:
  struct SlotState {
    bool holding = false;
    PinnedSlot handle;
    ScopeId scope = 0;
    uint64_t bytes = 0;
    SyncPoint d2h;
  };
  const std::string &checkScope(ScopeId id) const;

  Device &device_;
  PinnedPool &pool_;
  std::vector<std::string> names_;
  std::vector<TransferCounters> counters_;
  std::vector<SlotState> slots_;
};

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_OFFLOAD_H
