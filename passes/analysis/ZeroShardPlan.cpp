//===- ZeroShardPlan.cpp - where ZeRO-3 gathers and reductions go ---------===//

#include "passes/analysis/ZeroShardPlan.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"

#include <algorithm>
#include <cctype>

using namespace mlir;
using namespace ap::exec;

std::string ap::zeroLayerGroup(llvm::StringRef name) {
  // "model.layers.<i>." (or "layers.<i>." at the start): the layer.
  for (size_t at = name.find("layers."); at != llvm::StringRef::npos;
       at = name.find("layers.", at + 1)) {
    if (at != 0 && name[at - 1] != '.')
      continue;
    size_t end = at + 7;
    while (end < name.size() &&
           std::isdigit(static_cast<unsigned char>(name[end])))
      ++end;
    if (end > at + 7 && (end == name.size() || name[end] == '.'))
      return name.substr(0, end).str();
  }
  return name.str();
}

SmallVector<ap::ZeroWindowSpan>
ap::splitZeroWindows(ArrayRef<SmallVector<ZeroUse>> uses) {
  SmallVector<ZeroWindowSpan> windows;
  llvm::StringMap<unsigned> open;   // group -> its latest window
  llvm::StringMap<int64_t> lastUse; // group -> 1 + position of its last use
  for (auto [position, opUses] : llvm::enumerate(uses)) {
    if (opUses.empty())
      continue;
    // Each group the op uses, once: extend or open its window, judged
    // against the uses before this op.
    SmallVector<StringRef> groups;
    for (const ZeroUse &u : opUses)
      if (!llvm::is_contained(groups, u.group))
        groups.push_back(u.group);
    for (StringRef group : groups) {
      int64_t other = 0;
      for (auto &entry : lastUse)
        if (entry.getKey() != group)
          other = std::max(other, entry.getValue());
      auto it = open.find(group);
      if (it == open.end() || lastUse.lookup(group) <= other) {
        ZeroWindowSpan w;
        w.group = group.str();
        w.first = position;
        open[group] = windows.size();
        windows.push_back(std::move(w));
      }
      windows[open[group]].last = position;
    }
    for (const ZeroUse &u : opUses) {
      ZeroWindowSpan &w = windows[open[u.group]];
      if (!llvm::is_contained(w.params, u.param))
        w.params.push_back(u.param);
    }
    for (StringRef group : groups)
      lastUse[group] = static_cast<int64_t>(position) + 1;
  }
  return windows;
}

namespace {
/// The persistent buffer `v` is (a view chain of), or null.
PersistentOp rootPersistent(Value v) {
  while (auto view = v.getDefiningOp<ViewOp>())
    v = view.getSource();
  return v.getDefiningOp<PersistentOp>();
}

/// Splits the loop body's uses of `role` buffers into windows (see the
/// header and splitZeroWindows).
SmallVector<ShardWindow> windowsOf(Block &body, BufferRole role,
                                   DenseMap<Operation *, int64_t> &stepOrder) {
  SmallVector<Operation *> ops;
  SmallVector<SmallVector<ap::ZeroUse>> uses;
  SmallVector<PersistentOp> buffers;
  DenseMap<Operation *, unsigned> bufferIndex;
  for (Operation &op : body) {
    ops.push_back(&op);
    SmallVector<ap::ZeroUse> &opUses = uses.emplace_back();
    if (isa<ViewOp>(op))
      continue;
    for (Value v : op.getOperands()) {
      if (!isa<BufferType>(v.getType()))
        continue;
      PersistentOp p = rootPersistent(v);
      if (!p || p.getRole() != role)
        continue;
      auto [it, added] = bufferIndex.try_emplace(p, buffers.size());
      if (added)
        buffers.push_back(p);
      opUses.push_back({ap::zeroLayerGroup(p.getName()), it->second});
    }
  }
  SmallVector<ShardWindow> windows;
  for (const ap::ZeroWindowSpan &span : ap::splitZeroWindows(uses)) {
    ShardWindow w;
    w.group = span.group;
    w.first = ops[span.first];
    w.last = ops[span.last];
    for (unsigned b : span.params)
      w.buffers.push_back(buffers[b]);
    llvm::sort(w.buffers, [&](PersistentOp a, PersistentOp b) {
      return stepOrder.lookup(a) < stepOrder.lookup(b);
    });
    windows.push_back(std::move(w));
  }
  return windows;
}
} // namespace

ZeroShardPlan::ZeroShardPlan(StepOp step, int64_t gatherMaxInflight) {
  if (auto size = step->getAttrOfType<IntegerAttr>(kDataParallelSizeAttr))
    ranks = size.getInt();
  DenseMap<Operation *, int64_t> stepOrder;
  MicrobatchLoopOp loop;
  for (Operation &op : step.getBody().front()) {
    stepOrder[&op] = stepOrder.size();
    if (auto p = dyn_cast<PersistentOp>(op)) {
      BufferRole r = p.getRole();
      if (r == BufferRole::Weight || r == BufferRole::Master ||
          r == BufferRole::MainGrad || r == BufferRole::AdamM ||
          r == BufferRole::AdamV)
        sharded.push_back(p);
    }
    if (auto l = dyn_cast<MicrobatchLoopOp>(op))
      loop = l;
  }
  if (!loop)
    return;
  Block &body = loop.getBody().front();
  gathers = windowsOf(body, BufferRole::Weight, stepOrder);
  reductions = windowsOf(body, BufferRole::MainGrad, stepOrder);
  for (size_t w = 0; w < gathers.size(); ++w)
    gathers[w].gatherBefore =
        gathers[ap::zeroGatherAnchor(w, gatherMaxInflight)].first;
}
