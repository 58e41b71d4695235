//===- ExecMemoryPlan.cpp - static device-arena plan ----------------------===//

#include "passes/analysis/ExecMemoryPlan.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <numeric>

using namespace mlir;
using namespace ap::exec;

std::optional<Stream> ap::exec::streamOf(Operation *op) {
  if (auto k = dyn_cast<KernelOp>(op))
    return k.getStream();
  if (isa<LoadInputOp, MicrobatchLoopOp>(op))
    return Stream::Compute;
  if (auto d = dyn_cast<D2HOp>(op))
    return d.getStream();
  if (auto h = dyn_cast<H2DOp>(op))
    return h.getStream();
  if (auto a = dyn_cast<AllReduceOp>(op))
    return a.getStream();
  if (auto g = dyn_cast<AllGatherOp>(op))
    return g.getStream();
  if (auto r = dyn_cast<ReduceScatterOp>(op))
    return r.getStream();
  if (auto z = dyn_cast<ZeroOp>(op))
    return z.getStream();
  if (auto s = dyn_cast<SendOp>(op))
    return s.getStream();
  if (auto r = dyn_cast<RecvOp>(op))
    return r.getStream();
  return std::nullopt;
}

namespace {
/// Calls `fn(user)` for every non-view user of `v`, looking through views.
template <typename Fn> void forEachUser(Value v, Fn &&fn) {
  for (Operation *user : v.getUsers()) {
    if (auto view = dyn_cast<ViewOp>(user))
      forEachUser(view.getResult(), fn);
    else
      fn(user);
  }
}
} // namespace

MemoryPlan::MemoryPlan(StepOp step) {
  Block &top = step.getBody().front();
  MicrobatchLoopOp loop;
  for (Operation &op : top) {
    if (isa<PersistentOp, BufferOp>(op)) {
      int64_t bytes = isa<PersistentOp>(op) ? cast<PersistentOp>(op).getBytes()
                                            : cast<BufferOp>(op).getBytes();
      persistent.push_back({&op, persistentBytes});
      persistentBytes += alignTo256(bytes);
    }
    if (auto l = dyn_cast<MicrobatchLoopOp>(op))
      loop = l;
  }
  step.walk([&](Operation *op) {
    if (auto k = dyn_cast<KernelOp>(op)) {
      int64_t &region =
          k.getStream() == Stream::Side ? sideWorkspaceBytes : workspaceBytes;
      region = std::max(region, alignTo256(k.getWorkspace()));
    }
    if (auto a = dyn_cast<PoolAcquireOp>(op))
      pinnedBytes =
          std::max(pinnedBytes, int64_t(a.getOffset() + a.getBytes()));
  });
  if (!loop)
    return;

  // Body positions.
  DenseMap<Operation *, int64_t> pos;
  Block &body = loop.getBody().front();
  for (Operation &op : body) {
    if (!op.getRegions().empty()) {
      op.emitError("exec-plan-memory: nested regions in the microbatch loop "
                   "are not supported");
      ok = false;
      return;
    }
    pos[&op] = pos.size();
  }

  // Body position of every kernel call, by ordinal (for done_by_kernel).
  SmallVector<int64_t> kernelPos;
  for (Operation &op : body)
    if (isa<KernelOp>(op))
      kernelPos.push_back(pos[&op]);
  int64_t bodyEnd = int64_t(pos.size()) - 1;

  // Side-stream kernels: the last position each one may still be running
  // at. The side stream completes in order, so a side kernel is known done
  // only at the first compute use of its own outputs or of a later side
  // kernel's (the compute stream waits there); walk the body backwards
  // keeping the earliest such use.
  DenseMap<Operation *, int64_t> sideRunsUntil;
  {
    int64_t join = bodyEnd;
    for (Operation &op : llvm::reverse(body)) {
      auto k = dyn_cast<KernelOp>(op);
      if (!k || k.getStream() != Stream::Side)
        continue;
      for (Value out : k.getOutputs())
        forEachUser(out, [&](Operation *user) {
          std::optional<Stream> s = streamOf(user);
          if (user != &op && s && *s != Stream::Side)
            join = std::min(join, pos.lookup(user) - 1);
        });
      sideRunsUntil[&op] = std::max(join, pos[&op]);
    }
  }

  for (Operation &op : body) {
    auto buf = dyn_cast<BufferOp>(op);
    if (!buf)
      continue;
    PlannedBuffer p;
    p.op = buf;
    p.bytes = alignTo256(buf.getBytes());
    p.start = p.end = pos[buf];
    bool used = false;
    forEachUser(buf.getResult(), [&](Operation *user) {
      int64_t at = pos.lookup(user);
      if (!used || at < p.start) {
        p.start = at;
        p.firstUser = user;
      }
      p.end = used ? std::max(p.end, at) : at;
      used = true;
      auto side = sideRunsUntil.find(user);
      if (side != sideRunsUntil.end())
        p.end = std::max(p.end, side->second);
      if (auto d2h = dyn_cast<D2HOp>(user)) {
        p.d2hEvents.push_back(d2h.getEvent());
        // Keep the bytes until the copy is predicted done, so that their
        // next writer does not stall compute on it.
        if (auto k = d2h.getDoneByKernel()) {
          int64_t until = int64_t(*k) < int64_t(kernelPos.size())
                              ? kernelPos[*k] - 1
                              : bodyEnd;
          p.holdUntil = std::max(p.holdUntil, until);
        }
      }
    });
    p.end = std::max(p.end, p.holdUntil);
    transients.push_back(std::move(p));
  }

  // Greedy by size: largest first (then earliest), lowest offset that does
  // not overlap any placed buffer whose lifetime intersects.
  SmallVector<unsigned> order(transients.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](unsigned a, unsigned b) {
    if (transients[a].bytes != transients[b].bytes)
      return transients[a].bytes > transients[b].bytes;
    return transients[a].start < transients[b].start;
  });
  SmallVector<unsigned> placed;
  for (unsigned i : order) {
    PlannedBuffer &p = transients[i];
    SmallVector<std::pair<int64_t, int64_t>> busy;
    for (unsigned j : placed) {
      const PlannedBuffer &q = transients[j];
      if (q.start <= p.end && p.start <= q.end)
        busy.push_back({q.offset, q.offset + q.bytes});
    }
    llvm::sort(busy);
    int64_t at = 0;
    for (auto [lo, hi] : busy) {
      if (at + p.bytes <= lo)
        break;
      at = std::max(at, hi);
    }
    p.offset = at;
    activationBytes = std::max(activationBytes, at + p.bytes);
    placed.push_back(i);
  }

  // Waits before the first later writer of a region a D2H read. Copies of
  // one stream complete in order, so a writer waits only for the latest
  // such D2H per copy stream, and not at all when a wait on its stream for
  // that copy or a later one of the same stream comes earlier in the body
  // (already there or added for an earlier writer).
  DenseMap<Value, std::pair<int64_t, unsigned>> d2hOf;
  for (Operation &op : body)
    if (auto d = dyn_cast<D2HOp>(op))
      d2hOf[d.getEvent()] = {pos[d], unsigned(d.getStream())};
  // covered[{waiter, copy stream}]: latest D2H position the waiter stream
  // is ordered after so far.
  DenseMap<std::pair<unsigned, unsigned>, int64_t> covered;
  SmallVector<std::pair<int64_t, WaitOp>> existing;
  for (Operation &op : body)
    if (auto w = dyn_cast<WaitOp>(op))
      if (d2hOf.count(w.getEvent()))
        existing.push_back({pos[w], w});
  auto cover = [&](unsigned waiter, Value ev) {
    auto [at, copyStream] = d2hOf.lookup(ev);
    int64_t &c = covered[{waiter, copyStream}];
    c = std::max(c, at + 1);
  };
  SmallVector<unsigned> byStart(transients.size());
  std::iota(byStart.begin(), byStart.end(), 0);
  std::stable_sort(byStart.begin(), byStart.end(), [&](unsigned a, unsigned b) {
    return transients[a].start < transients[b].start;
  });
  size_t nextExisting = 0;
  for (unsigned bi : byStart) {
    PlannedBuffer &b = transients[bi];
    while (nextExisting < existing.size() &&
           existing[nextExisting].first < b.start) {
      WaitOp w = existing[nextExisting++].second;
      cover(unsigned(w.getStream()), w.getEvent());
    }
    std::optional<Stream> s =
        b.firstUser ? streamOf(b.firstUser) : std::nullopt;
    if (!s)
      continue;
    // Latest D2H per copy stream among the earlier occupants of b's bytes.
    DenseMap<unsigned, std::pair<int64_t, Value>> latestCopy;
    for (const PlannedBuffer &a : transients) {
      if (a.d2hEvents.empty() || a.end >= b.start ||
          a.offset >= b.offset + b.bytes || b.offset >= a.offset + a.bytes)
        continue;
      for (Value ev : a.d2hEvents) {
        auto [at, copyStream] = d2hOf.lookup(ev);
        auto &l = latestCopy[copyStream];
        if (!l.second || at > l.first)
          l = {at, ev};
      }
    }
    for (auto &[copyStream, l] : latestCopy) {
      if (covered.lookup({unsigned(*s), copyStream}) > l.first)
        continue;
      cover(unsigned(*s), l.second);
      reuseWaits.push_back({l.second, *s, b.firstUser});
    }
  }
}

void MemoryPlan::print(llvm::raw_ostream &os) const {
  os << llvm::formatv("exec-plan-memory: arena {0} bytes = persistent {1} + "
                      "activations {2} + workspace {3}",
                      arenaBytes(), persistentBytes, activationBytes,
                      workspaceBytes);
  if (sideWorkspaceBytes)
    os << llvm::formatv(" + side workspace {0}", sideWorkspaceBytes);
  os << llvm::formatv("; pinned {0} bytes; {1} transient buffers, {2} reuse "
                      "waits\n",
                      pinnedBytes, transients.size(), reuseWaits.size());
  for (auto [i, p] : llvm::enumerate(transients)) {
    os << llvm::formatv("buffer {0} offset {1} bytes {2} live {3} {4} ", i,
                        persistentBytes + p.offset, p.bytes, p.start, p.end)
       << const_cast<BufferOp &>(p.op).getResult().getType().getTensor();
    if (!p.d2hEvents.empty())
      os << " offloaded";
    os << "\n";
  }
}
