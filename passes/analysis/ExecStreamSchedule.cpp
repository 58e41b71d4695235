//===- ExecStreamSchedule.cpp - cross-stream ordering ---------------------===//

#include "passes/analysis/ExecStreamSchedule.h"
#include "passes/analysis/ExecMemoryPlan.h"

#include "llvm/ADT/DenseMap.h"

#include <array>
#include <map>

using namespace mlir;
using namespace ap::exec;

namespace {
constexpr int kStreams = 5; // compute, d2h, h2d, comm, side
constexpr int kCompute = int(Stream::Compute);
constexpr int kD2H = int(Stream::D2H);
/// clock[t]: how many ops of stream t are known to have completed first.
using Clock = std::array<int64_t, kStreams>;

void merge(Clock &into, const Clock &from) {
  for (int i = 0; i < kStreams; ++i)
    into[i] = std::max(into[i], from[i]);
}

/// The last read and write (op sequence number, 0 = none) of a byte range
/// per stream. The latest is all that matters: ops of one stream complete
/// in order.
struct Last {
  Clock read{}, write{};
};

/// Disjoint byte ranges of one memory space and their last accesses.
class RangeMap {
public:
  /// Calls `fn(Last &)` for every piece of [lo, hi), creating pieces for
  /// bytes never touched before.
  template <typename Fn> void visit(int64_t lo, int64_t hi, Fn &&fn) {
    split(lo);
    split(hi);
    int64_t cur = lo;
    auto it = pieces.lower_bound(lo);
    while (cur < hi) {
      if (it == pieces.end() || it->first >= hi) {
        pieces.emplace(cur, Piece{hi, {}});
        break;
      }
      if (it->first > cur)
        pieces.emplace(cur, Piece{it->first, {}});
      cur = it->second.end;
      ++it;
    }
    for (it = pieces.lower_bound(lo); it != pieces.end() && it->first < hi;
         ++it)
      fn(it->second.last);
  }

private:
  struct Piece {
    int64_t end;
    Last last;
  };
  void split(int64_t at) {
    auto it = pieces.upper_bound(at);
    if (it == pieces.begin())
      return;
    --it;
    if (it->first < at && it->second.end > at) {
      Piece right = it->second;
      it->second.end = at;
      pieces.emplace(at, right);
    }
  }
  std::map<int64_t, Piece> pieces;
};

struct Access {
  const void *space;
  int64_t lo, hi;
  bool write;
};

/// Keys of the two planned memory spaces (distinct objects, distinct
/// addresses).
char kDeviceArena, kPinnedPool;

/// Where the bytes of a buffer or slot are: the arena or pool range when
/// planned, else a space of their own (the root buffer).
Access locate(Value v, bool write) {
  while (auto view = v.getDefiningOp<ViewOp>())
    v = view.getSource();
  Operation *def = v.getDefiningOp();
  auto extent = [&](std::optional<uint64_t> off, uint64_t bytes) -> Access {
    if (off)
      return {&kDeviceArena, int64_t(*off), int64_t(*off + bytes), write};
    return {def, 0, int64_t(bytes), write};
  };
  if (auto b = dyn_cast_or_null<BufferOp>(def))
    return extent(b.getOffset(), b.getBytes());
  if (auto p = dyn_cast_or_null<PersistentOp>(def))
    return extent(p.getOffset(), p.getBytes());
  if (auto a = dyn_cast_or_null<PoolAcquireOp>(def))
    return {&kPinnedPool, int64_t(a.getOffset()),
            int64_t(a.getOffset() + a.getBytes()), write};
  return {v.getAsOpaquePointer(), 0, 1, write};
}

SmallVector<Access> accessesOf(Operation *op) {
  SmallVector<Access> acc;
  if (auto k = dyn_cast<KernelOp>(op)) {
    for (Value v : k.getInputs())
      acc.push_back(locate(v, false));
    for (Value v : k.getOutputs())
      acc.push_back(locate(v, true));
  } else if (auto l = dyn_cast<LoadInputOp>(op)) {
    acc.push_back(locate(l.getDest(), true));
  } else if (auto d = dyn_cast<D2HOp>(op)) {
    acc.push_back(locate(d.getSource(), false));
    acc.push_back(locate(d.getSlot(), true));
  } else if (auto h = dyn_cast<H2DOp>(op)) {
    acc.push_back(locate(h.getSlot(), false));
    acc.push_back(locate(h.getDest(), true));
  } else if (auto a = dyn_cast<AllReduceOp>(op)) {
    acc.push_back(locate(a.getBuffer(), true));
  } else if (auto g = dyn_cast<AllGatherOp>(op)) {
    acc.push_back(locate(g.getShard(), false));
    acc.push_back(locate(g.getFull(), true));
  } else if (auto r = dyn_cast<ReduceScatterOp>(op)) {
    // The runtime may reduce in place inside `full` (its contents are
    // unspecified afterwards): a write, not a read.
    acc.push_back(locate(r.getFull(), true));
    acc.push_back(locate(r.getShard(), true));
  } else if (auto z = dyn_cast<ZeroOp>(op)) {
    acc.push_back(locate(z.getBuffer(), true));
  } else if (auto s = dyn_cast<SendOp>(op)) {
    acc.push_back(locate(s.getBuffer(), false));
  } else if (auto r = dyn_cast<RecvOp>(op)) {
    acc.push_back(locate(r.getBuffer(), true));
  } else if (auto loop = dyn_cast<MicrobatchLoopOp>(op)) {
    // The whole loop, seen from the step: compute work reading and writing
    // every buffer from outside it that it touches.
    loop.getBody().walk([&](Operation *inner) {
      for (Value v : inner->getOperands())
        if (isa<BufferType>(v.getType()) &&
            !loop->isAncestor(v.getParentBlock()->getParentOp()))
          acc.push_back(locate(v, true));
    });
  }
  return acc;
}

/// Schedules one block (the step's top level or the loop body).
class Segment {
public:
  Segment(StreamSchedule &out, Block *block, int64_t maxInflight)
      : out(out), block(block), maxInflight(maxInflight) {}

  void run(bool loopBody) {
    if (loopBody)
      startBarrier();
    for (Operation &op : llvm::make_early_inc_range(*block))
      visit(&op);
    Operation *end = loopBody ? nullptr : block->getTerminator();
    Clock all{};
    for (int t = 0; t < kStreams; ++t)
      all[t] = count[t];
    order(end, kCompute, all, "barrier-end");
  }

private:
  struct Recorded {
    Clock clock;
    Value value;
    int newEvent;
    bool live;
  };

  void startBarrier() {
    SmallVector<int> used;
    for (int t = 0; t < kStreams; ++t)
      if (t != kCompute && llvm::any_of(*block, [&](Operation &op) {
            auto s = streamOf(&op);
            return s && int(*s) == t;
          }))
        used.push_back(t);
    if (used.empty() || block->empty())
      return;
    // An existing barrier (a previous run): events recorded on compute
    // before any work, and the streams already waiting for them.
    Value existing;
    SmallVector<bool> waiting(kStreams, false);
    for (Operation &op : *block) {
      if (auto r = dyn_cast<RecordOp>(op)) {
        if (r.getStream() == Stream::Compute)
          existing = r.getEvent();
      } else if (auto w = dyn_cast<WaitOp>(op)) {
        if (existing && w.getEvent() == existing)
          waiting[int(w.getStream())] = true;
      } else if (!isa<EventCreateOp>(op)) {
        break;
      }
    }
    Operation *first = &block->front();
    int id = -1;
    if (!existing) {
      id = out.numNewEvents++;
      out.insertions.push_back({StreamInsertion::Record, block, first,
                                Stream::Compute, Value(), id, "barrier-start"});
    }
    for (int t : used)
      if (!waiting[t])
        out.insertions.push_back({StreamInsertion::Wait, block, first,
                                  Stream(t), existing, id, "barrier-start",
                                  Stream::Compute});
  }

  /// Makes stream `s` wait, right before `before`, until every stream t has
  /// completed its first need[t] ops. Per unmet stream the candidate is the
  /// earliest existing event that suffices (else a new record right after
  /// the op that must complete); the candidate meeting the most needs at
  /// once is taken first, since one event often orders several streams.
  void order(Operation *before, int s, const Clock &need, const char *reason) {
    std::array<const char *, kStreams> why;
    why.fill(reason);
    order(before, s, need, why);
  }
  void order(Operation *before, int s, const Clock &need,
             const std::array<const char *, kStreams> &why) {
    auto unmet = [&](int t) { return t != s && need[t] > known[s][t]; };
    while (true) {
      int bestT = -1, bestCover = -1;
      Recorded best{};
      for (int t = 0; t < kStreams; ++t) {
        if (!unmet(t))
          continue;
        const Recorded *found = nullptr;
        for (const Recorded &r : recs[t])
          if (r.live && r.clock[t] >= need[t] &&
              (!found || r.clock[t] < found->clock[t]))
            found = &r;
        Recorded cand =
            found ? *found
                  : Recorded{clockAfter[t][need[t] - 1], Value(), -1, true};
        int cover = 0;
        for (int u = 0; u < kStreams; ++u)
          if (unmet(u) && cand.clock[u] >= need[u])
            ++cover;
        if (cover > bestCover) {
          bestCover = cover;
          bestT = t;
          best = cand;
        }
      }
      if (bestT < 0)
        return;
      if (!best.value && best.newEvent < 0) {
        Operation *after = opsOf[bestT][need[bestT] - 1];
        best.newEvent = out.numNewEvents++;
        out.insertions.push_back({StreamInsertion::Record, block,
                                  after->getNextNode(), Stream(bestT), Value(),
                                  best.newEvent, why[bestT]});
        recs[bestT].push_back(best);
      }
      out.insertions.push_back({StreamInsertion::Wait, block, before, Stream(s),
                                best.value, best.newEvent, why[bestT],
                                Stream(bestT)});
      merge(known[s], best.clock);
    }
  }

  void record(Value ev, int s, const Clock &clock) {
    auto it = latest.find(ev);
    if (it != latest.end())
      recs[it->second.first][it->second.second].live = false;
    recs[s].push_back({clock, ev, -1, true});
    latest[ev] = {s, recs[s].size() - 1};
  }

  void visit(Operation *op) {
    if (auto w = dyn_cast<WaitOp>(op)) {
      auto it = latest.find(w.getEvent());
      if (it != latest.end()) {
        Clock c = recs[it->second.first][it->second.second].clock;
        merge(known[int(w.getStream())], c);
      }
      return;
    }
    if (auto r = dyn_cast<RecordOp>(op)) {
      int s = int(r.getStream());
      record(r.getEvent(), s, known[s]);
      return;
    }
    std::optional<Stream> stream = streamOf(op);
    if (!stream)
      return;
    int s = int(*stream);

    if (isa<D2HOp>(op) && s == kD2H && maxInflight > 0 &&
        count[kD2H] - known[kCompute][kD2H] >= maxInflight) {
      Clock need{};
      need[kD2H] = count[kD2H] - maxInflight + 1;
      order(op, kCompute, need, "max-inflight");
    }

    SmallVector<Access> acc = accessesOf(op);
    Clock need{};
    std::array<const char *, kStreams> why;
    why.fill("RAW");
    for (const Access &a : acc)
      spaces[a.space].visit(a.lo, a.hi, [&](Last &l) {
        for (int t = 0; t < kStreams; ++t) {
          if (t == s)
            continue;
          if (l.write[t] > need[t]) {
            need[t] = l.write[t];
            why[t] = a.write ? "WAW" : "RAW";
          }
          if (a.write && l.read[t] > need[t]) {
            need[t] = l.read[t];
            why[t] = "WAR";
          }
        }
      });
    order(op, s, need, why);

    int64_t seq = ++count[s];
    known[s][s] = seq;
    opsOf[s].push_back(op);
    clockAfter[s].push_back(known[s]);
    for (const Access &a : acc)
      spaces[a.space].visit(
          a.lo, a.hi, [&](Last &l) { (a.write ? l.write : l.read)[s] = seq; });
    // A copy records its event when it completes.
    if (auto d = dyn_cast<D2HOp>(op))
      record(d.getEvent(), s, known[s]);
    if (auto h = dyn_cast<H2DOp>(op))
      record(h.getEvent(), s, known[s]);
  }

  StreamSchedule &out;
  Block *block;
  int64_t maxInflight;
  Clock known[kStreams] = {};
  int64_t count[kStreams] = {};
  SmallVector<Operation *> opsOf[kStreams];
  SmallVector<Clock> clockAfter[kStreams];
  /// Records per stream, in program order; `latest` finds an event value's
  /// current one (a wait sees the latest record of its event).
  std::vector<Recorded> recs[kStreams];
  llvm::DenseMap<Value, std::pair<int, size_t>> latest;
  std::map<const void *, RangeMap> spaces;
};
} // namespace

StreamSchedule::StreamSchedule(StepOp step) {
  Block &top = step.getBody().front();
  for (Operation &op : top)
    if (auto loop = dyn_cast<MicrobatchLoopOp>(op)) {
      int64_t mi = loop.getMaxInflight() ? int64_t(*loop.getMaxInflight()) : 0;
      Segment(*this, &loop.getBody().front(), mi).run(/*loopBody=*/true);
    }
  Segment(*this, &top, 0).run(/*loopBody=*/false);
}

namespace {
/// Replays a block's clocks (no hazard analysis) to find dominated waits.
void redundantWaitsIn(Block &block, SmallVectorImpl<WaitOp> &out) {
  // Every stream starts with one virtual op: the work enqueued before the
  // block (the previous iteration), which the body's start barrier orders.
  Clock known[kStreams] = {};
  int64_t count[kStreams];
  for (int s = 0; s < kStreams; ++s)
    known[s][s] = count[s] = 1;
  llvm::DenseMap<Value, Clock> recorded;
  // The current run of waits per stream.
  SmallVector<WaitOp> run[kStreams];
  auto closeRun = [&](int s) {
    SmallVector<WaitOp> &ws = run[s];
    // Drop, one at a time, a wait covered by the merge of the others still
    // kept. Order-independent enough: a dominated wait stays dominated when
    // another dominated one is dropped.
    SmallVector<bool> keep(ws.size(), true);
    for (size_t i = 0; i < ws.size(); ++i) {
      auto it = recorded.find(ws[i].getEvent());
      if (it == recorded.end())
        continue; // recorded outside the block: keep, unknown clock
      Clock others{};
      for (size_t j = 0; j < ws.size(); ++j)
        if (j != i && keep[j])
          if (auto jt = recorded.find(ws[j].getEvent()); jt != recorded.end())
            merge(others, jt->second);
      bool covered = true;
      for (int t = 0; t < kStreams; ++t)
        if (t != s && it->second[t] > std::max(others[t], known[s][t]))
          covered = false;
      if (covered) {
        keep[i] = false;
        out.push_back(ws[i]);
      }
    }
    for (size_t i = 0; i < ws.size(); ++i)
      if (keep[i])
        if (auto it = recorded.find(ws[i].getEvent()); it != recorded.end())
          merge(known[s], it->second);
    ws.clear();
  };
  for (Operation &op : block) {
    if (auto w = dyn_cast<WaitOp>(op)) {
      run[int(w.getStream())].push_back(w);
      continue;
    }
    if (auto r = dyn_cast<RecordOp>(op)) {
      int s = int(r.getStream());
      closeRun(s);
      recorded[r.getEvent()] = known[s];
      continue;
    }
    std::optional<Stream> stream = streamOf(&op);
    if (!stream)
      continue;
    int s = int(*stream);
    closeRun(s);
    known[s][s] = ++count[s];
    if (auto d = dyn_cast<D2HOp>(op))
      recorded[d.getEvent()] = known[s];
    if (auto h = dyn_cast<H2DOp>(op))
      recorded[h.getEvent()] = known[s];
  }
  // Waits at the end of the block order the next block's work (the loop
  // end barrier): close the runs too.
  for (int s = 0; s < kStreams; ++s)
    closeRun(s);
}
} // namespace

SmallVector<WaitOp> ap::exec::findRedundantWaits(StepOp step) {
  SmallVector<WaitOp> out;
  Block &top = step.getBody().front();
  for (Operation &op : top)
    if (auto loop = dyn_cast<MicrobatchLoopOp>(op))
      redundantWaitsIn(loop.getBody().front(), out);
  redundantWaitsIn(top, out);
  return out;
}

std::string ap::exec::explainWait(const StreamInsertion &w) {
  std::string who = stringifyStream(w.stream).str();
  std::string of = stringifyStream(w.waitsFor).str();
  std::string r = w.reason;
  std::string head = who + " waits for " + of + ": ";
  if (r == "RAW")
    return head + "reads bytes that " + of + " work wrote";
  if (r == "WAR")
    return head + "overwrites bytes that " + of + " work still reads";
  if (r == "WAW")
    return head + "overwrites bytes that " + of + " work writes";
  if (r == "barrier-start")
    return head + "the microbatch starts after the previous one";
  if (r == "barrier-end")
    return head + "nothing of the microbatch stays in flight into the next";
  if (r == "max-inflight")
    return head + "max_inflight D2H copies are pending, the oldest must end";
  return head + r;
}
