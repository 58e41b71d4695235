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

namespace {
/// The persistent buffer `v` is (a view chain of), or null.
PersistentOp rootPersistent(Value v) {
  while (auto view = v.getDefiningOp<ViewOp>())
    v = view.getSource();
  return v.getDefiningOp<PersistentOp>();
}

/// Splits the loop body's uses of `role` buffers into windows (see the
/// header): consecutive uses of one group with no other group's use between.
SmallVector<ShardWindow> windowsOf(Block &body, BufferRole role,
                                   DenseMap<Operation *, int64_t> &stepOrder) {
  SmallVector<ShardWindow> windows;
  llvm::StringMap<unsigned> open;   // group -> its latest window
  llvm::StringMap<int64_t> lastUse; // group -> body position of last use
  int64_t position = 0;
  for (Operation &op : body) {
    ++position;
    SmallVector<std::pair<std::string, PersistentOp>> uses;
    for (Value v : op.getOperands()) {
      if (!isa<BufferType>(v.getType()) || isa<ViewOp>(op))
        continue;
      PersistentOp p = rootPersistent(v);
      if (p && p.getRole() == role)
        uses.push_back({ap::zeroLayerGroup(p.getName()), p});
    }
    if (uses.empty())
      continue;
    for (auto &[group, p] : uses) {
      // Latest use of any other group.
      int64_t other = 0;
      for (auto &entry : lastUse)
        if (entry.getKey() != group)
          other = std::max(other, entry.getValue());
      auto it = open.find(group);
      bool extend = it != open.end() && lastUse.lookup(group) > other;
      if (!extend) {
        ShardWindow w;
        w.group = group;
        w.first = &op;
        open[group] = windows.size();
        windows.push_back(std::move(w));
      }
      ShardWindow &w = windows[open[group]];
      w.last = &op;
      if (!llvm::is_contained(w.buffers, p))
        w.buffers.push_back(p);
    }
    for (auto &[group, p] : uses)
      lastUse[group] = position;
  }
  for (ShardWindow &w : windows)
    llvm::sort(w.buffers, [&](PersistentOp a, PersistentOp b) {
      return stepOrder.lookup(a) < stepOrder.lookup(b);
    });
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
  int64_t k = std::max<int64_t>(gatherMaxInflight, 0);
  for (size_t w = 0; w < gathers.size(); ++w)
    gathers[w].gatherBefore = gathers[w >= size_t(k) ? w - k : 0].first;
}
