//===- offload.cpp - Offload engine -----------------------------*- C++ -*-===//
#include "runtime/offload.h"

#include "runtime/error.h"
#include "runtime/nvtx.h"

#include <sstream>

namespace ap::rt {

OffloadEngine::OffloadEngine(Device &device, PinnedPool &pool)
    : device_(device), pool_(pool), slots_(pool.slotCount()) {}

OffloadEngine::ScopeId OffloadEngine::scope(std::string_view name) {
  for (ScopeId i = 0; i < names_.size(); ++i)
    if (names_[i] == name)
      return i;
  if (name.empty())
    fail("offload engine: empty scope name");
  names_.emplace_back(name);
  counters_.emplace_back();
  return static_cast<ScopeId>(names_.size() - 1);
}

const std::string &OffloadEngine::checkScope(ScopeId id) const {
  if (id >= names_.size())
    fail("offload engine: unknown scope id ", id, " (", names_.size(),
         " registered)");
  return names_[id];
}

const std::string &OffloadEngine::scopeName(ScopeId id) const {
  return checkScope(id);
}

void OffloadEngine::offload(ScopeId scope, uint32_t slot, const void *src,
                            uint64_t bytes, EventId producer, EventId d2hDone) {
  const std::string &name = checkScope(scope);
  if (slot >= slots_.size())
    fail("offload engine: scope ", name, ": unknown pinned slot ", slot,
         " (the plan has ", slots_.size(), ")");
  SlotState &st = slots_[slot];
  if (st.holding)
    fail("offload engine: scope ", name, ": slot ", slot,
         " still holds a value of scope ", names_[st.scope],
         " that was never reloaded");
  if (bytes == 0 || bytes > pool_.slotBytes(slot))
    fail("offload engine: scope ", name, ": offload of ", bytes,
         " bytes into slot ", slot, " of ", pool_.slotBytes(slot), " bytes");
  if (!device_.inArena(src, bytes))
    fail("offload engine: scope ", name, ": offload source ", src, " (+", bytes,
         " bytes) is not inside the device arena");
  if (producer == d2hDone)
    fail("offload engine: scope ", name,
         ": the D2H event must differ from the producer event");
  if (device_.generation(producer) == 0)
    fail("offload engine: scope ", name, ": producer event ",
         static_cast<uint32_t>(producer),
         " was never recorded, so the D2H could read a value not yet produced");

  ScopedRange range(name.c_str());
  device_.wait(Stream::D2H, producer);
  // After the wait, so that a slot reuse ordered through the producer's
  // stream (consumer waited on the H2D, then produced) is seen as ordered.
  st.handle = pool_.acquire(slot, Stream::D2H);
  device_.copyAsync(st.handle.data, src, bytes, CopyKind::DeviceToHost,
                    Stream::D2H);
  device_.record(d2hDone, Stream::D2H);
  st.holding = true;
  st.scope = scope;
  st.bytes = bytes;
  st.d2h = device_.lastRecord(d2hDone);
  counters_[scope].d2hCount += 1;
  counters_[scope].d2hBytes += bytes;
}

void OffloadEngine::reload(ScopeId scope, uint32_t slot, void *dst,
                           uint64_t bytes, EventId d2hDone, EventId h2dDone) {
  const std::string &name = checkScope(scope);
  if (slot >= slots_.size())
    fail("offload engine: scope ", name, ": unknown pinned slot ", slot);
  SlotState &st = slots_[slot];
  if (!st.holding)
    fail("offload engine: scope ", name, ": reload of slot ", slot,
         " which holds no offloaded value (reload before offload, or twice)");
  if (st.scope != scope)
    fail("offload engine: scope ", name, ": reload of slot ", slot,
         " which holds a value of scope ", names_[st.scope]);
  if (bytes != st.bytes)
    fail("offload engine: scope ", name, ": reload of ", bytes,
         " bytes from slot ", slot, " which holds ", st.bytes, " bytes");
  if (d2hDone != st.d2h.event)
    fail("offload engine: scope ", name, ": reload from slot ", slot,
         " waits on event ", static_cast<uint32_t>(d2hDone),
         " but that value's D2H recorded event ",
         static_cast<uint32_t>(st.d2h.event));
  if (h2dDone == d2hDone)
    fail("offload engine: scope ", name,
         ": the H2D event must differ from the D2H event");
  if (!device_.inArena(dst, bytes))
    fail("offload engine: scope ", name, ": reload destination ", dst, " (+",
         bytes, " bytes) is not inside the device arena");

  ScopedRange range(name.c_str());
  device_.wait(Stream::H2D, d2hDone);
  // Holds unless the D2H event was re-recorded on another stream since.
  if (!device_.orderedBefore(st.d2h, Stream::H2D) && !device_.completed(st.d2h))
    fail("offload engine: scope ", name, ": the H2D from slot ", slot,
         " is not ordered after its D2H (event ",
         static_cast<uint32_t>(d2hDone), " was re-recorded on another stream)");
  device_.copyAsync(dst, st.handle.data, bytes, CopyKind::HostToDevice,
                    Stream::H2D);
  device_.record(h2dDone, Stream::H2D);
  pool_.releaseAfter(st.handle, h2dDone);
  st.holding = false;
  counters_[scope].h2dCount += 1;
  counters_[scope].h2dBytes += bytes;
}

uint32_t OffloadEngine::pendingReloads() const {
  uint32_t n = 0;
  for (const SlotState &s : slots_)
    n += s.holding ? 1 : 0;
  return n;
}

void OffloadEngine::assertAllReloaded(const std::string &where) const {
  if (pendingReloads() == 0)
    return;
  std::ostringstream os;
  os << "offload engine: values offloaded but never reloaded after " << where
     << ":";
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].holding)
      os << " slot " << i << " (scope " << names_[slots_[i].scope] << ", "
         << slots_[i].bytes << " bytes);";
  throw Error(os.str());
}

std::map<std::string, TransferCounters> OffloadEngine::transfers() const {
  std::map<std::string, TransferCounters> out;
  for (size_t i = 0; i < names_.size(); ++i)
    out[names_[i]] = counters_[i];
  return out;
}

TransferCounters OffloadEngine::counters(std::string_view name) const {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name)
      return counters_[i];
  return {};
}

void OffloadEngine::resetCounters() {
  for (TransferCounters &c : counters_)
    c = {};
}

} // namespace ap::rt
