//===- PipelineStages.cpp - which pipeline stage runs each op -------------===//

#include "passes/analysis/PipelineStages.h"

#include "dialect/train/TrainDialect.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <limits>
#include <map>
#include <vector>

using namespace mlir;
using namespace ap::train;

int PipelineStages::stageOfLayer(int64_t layer) const {
  auto it = llvm::upper_bound(firstLayer, layer);
  return int(it - firstLayer.begin()) - 1;
}

std::string PipelineStages::layerRange(int stage) const {
  int64_t a = firstLayer[stage], b = firstLayer[stage + 1] - 1;
  return a == b ? llvm::formatv("layer {0}", a).str()
                : llvm::formatv("layers {0}-{1}", a, b).str();
}

namespace {
std::string describe(Value v) {
  if (Operation *def = v.getDefiningOp()) {
    std::string s = def->getName().getStringRef().str();
    if (auto scope = def->getAttrOfType<ScopeAttr>("scope"))
      s += llvm::formatv(" (L{0}.{1})", scope.getLayer(), scope.getModule())
               .str();
    return s;
  }
  return "a block argument";
}
} // namespace

FailureOr<PipelineStages>
PipelineStages::assign(MicrobatchLoopOp loop, int64_t stages,
                       ArrayRef<int64_t> layersPerStage, StringRef optionName) {
  Block &body = loop.getBody().front();
  int64_t layers = 0;
  for (Operation &op : body)
    if (auto scope = op.getAttrOfType<ScopeAttr>("scope"))
      layers = std::max(layers, scope.getLayer() + 1);

  PipelineStages p;
  if (stages < 1)
    return loop.emitError() << "--pipeline-parallel=" << stages
                            << ": expected 1 or more stages",
           failure();
  if (stages > layers)
    return loop.emitError()
               << "--pipeline-parallel=" << stages << ": more stages than the "
               << layers << " decoder layers of the model (each stage needs "
               << "at least one layer)",
           failure();
  p.firstLayer.push_back(0);
  if (layersPerStage.empty()) {
    // As even as possible; the earlier stages take the remainder (the last
    // one also runs the LM head and the loss).
    for (int64_t s = 0; s < stages; ++s)
      p.firstLayer.push_back(p.firstLayer.back() + layers / stages +
                             (s < layers % stages ? 1 : 0));
  } else {
    if (int64_t(layersPerStage.size()) != stages)
      return loop.emitError()
                 << optionName << " lists " << layersPerStage.size()
                 << " stages; expected " << stages
                 << " (one layer count per stage of --pipeline-parallel)",
             failure();
    int64_t sum = 0;
    for (auto [s, n] : llvm::enumerate(layersPerStage)) {
      if (n < 1)
        return loop.emitError() << optionName << ": stage " << s << " has " << n
                                << " layers; expected at least 1",
               failure();
      sum += n;
      p.firstLayer.push_back(sum);
    }
    if (sum != layers)
      return loop.emitError()
                 << optionName << " adds up to " << sum
                 << " layers; the model has " << layers << " decoder layers",
             failure();
  }

  const int last = int(stages) - 1;
  for (Operation &op : body) {
    if (isa<ParamRefOp>(op))
      continue;
    int stage = -1;
    if (auto scope = op.getAttrOfType<ScopeAttr>("scope")) {
      if (scope.getLayer() >= 0)
        stage = p.stageOfLayer(scope.getLayer());
      else if (scope.getModule() == "embedding")
        stage = 0;
      else if (scope.getModule() == "final_norm" ||
               scope.getModule() == "lm_head")
        stage = last;
      else
        return op.emitError()
                   << "pipeline stages: model-level module '"
                   << scope.getModule()
                   << "' has no stage (expected embedding, final_norm or "
                      "lm_head)",
               failure();
    } else if (isa<YieldOp>(op)) {
      stage = last;
    } else {
      return op.emitError() << "pipeline stages: op has no module scope, so "
                               "no stage can be chosen for it",
             failure();
    }
    // Backward work made entirely one stage up runs there (see the header).
    int from = -1;
    bool single = true, any = false;
    for (Value v : op.getOperands()) {
      Operation *def = v.getDefiningOp();
      if (!def || isa<ParamRefOp>(def))
        continue;
      int s = p.stageOf.lookup(def);
      single &= !any || s == from;
      from = s;
      any = true;
    }
    if (any && single && from > stage && !isa<YieldOp>(op))
      stage = from;
    p.stageOf[&op] = stage;
  }

  std::map<std::pair<int, int>, int64_t> channels;
  for (Operation &op : body) {
    auto def = p.stageOf.find(&op);
    if (def == p.stageOf.end() || isa<DocStartsOp>(op))
      continue;
    for (Value r : op.getResults()) {
      llvm::SmallVector<int> targets;
      for (Operation *user : r.getUsers()) {
        int to = p.stageOf.lookup(body.findAncestorOpInBlock(*user));
        if (to != def->second && !llvm::is_contained(targets, to))
          targets.push_back(to);
      }
      llvm::sort(targets);
      for (int to : targets) {
        if (std::abs(to - def->second) != 1)
          return op.emitError()
                     << "pipeline stages: a value of " << describe(r)
                     << " on stage " << def->second << " ("
                     << p.layerRange(def->second) << ") is used on stage " << to
                     << " (" << p.layerRange(to)
                     << "); only neighbouring stages exchange values",
                 failure();
        Crossing c;
        c.value = r;
        c.from = def->second;
        c.to = to;
        c.channel = channels[{c.from, c.to}]++;
        p.crossings.push_back(c);
      }
    }
  }
  return p;
}

namespace {
/// Predicted seconds per decoder layer of a microbatch (forward and
/// backward), and of the model-level work the first stage (`first`: the
/// embedding) and the last (`last`: the final norm, LM head and loss)
/// carry.
SmallVector<double> layerSecondsOf(MicrobatchLoopOp loop, const CostModel &cost,
                                   double &first, double &last) {
  SmallVector<double> layerSeconds;
  first = last = 0;
  for (Operation &op : loop.getBody().front()) {
    auto scope = op.getAttrOfType<ScopeAttr>("scope");
    if (!scope)
      continue;
    double s = cost.cost(&op).seconds;
    if (scope.getLayer() >= 0) {
      if (int64_t(layerSeconds.size()) <= scope.getLayer())
        layerSeconds.resize(scope.getLayer() + 1, 0.0);
      layerSeconds[scope.getLayer()] += s;
    } else if (scope.getModule() == "embedding") {
      first += s;
    } else {
      last += s;
    }
  }
  return layerSeconds;
}
} // namespace

SmallVector<double>
PipelineStages::stageSeconds(MicrobatchLoopOp loop,
                             ArrayRef<int64_t> layersPerStage,
                             const CostModel &cost) {
  double first = 0, last = 0;
  SmallVector<double> layerSeconds = layerSecondsOf(loop, cost, first, last);
  SmallVector<double> out;
  int64_t at = 0;
  for (auto [s, n] : llvm::enumerate(layersPerStage)) {
    double t = s == 0 ? first : 0.0;
    for (int64_t i = at; i < at + n && i < int64_t(layerSeconds.size()); ++i)
      t += layerSeconds[i];
    if (s + 1 == layersPerStage.size())
      t += last;
    out.push_back(t);
    at += n;
  }
  return out;
}

FailureOr<SmallVector<int64_t>>
PipelineStages::balanceByCost(MicrobatchLoopOp loop, int64_t stages,
                              const CostModel &cost,
                              SmallVectorImpl<double> *stageSeconds) {
  double first = 0, last = 0;
  SmallVector<double> layerSeconds = layerSecondsOf(loop, cost, first, last);
  const int64_t layers = int64_t(layerSeconds.size());
  if (stages < 1 || stages > layers)
    return loop.emitError()
               << "--pipeline-parallel=" << stages << ": expected 1 to the "
               << layers << " decoder layers of the model",
           failure();
  SmallVector<double> prefix(layers + 1, 0.0);
  for (int64_t i = 0; i < layers; ++i)
    prefix[i + 1] = prefix[i] + layerSeconds[i];
  auto stageTime = [&](int64_t s, int64_t begin, int64_t end) {
    return prefix[end] - prefix[begin] + (s == 0 ? first : 0.0) +
           (s == stages - 1 ? last : 0.0);
  };
  // best[s][i]: the smallest largest-stage time of stages 0..s holding
  // layers [0, i); cut[s][i]: where stage s starts in that split.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages,
                                        std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int64_t>> cut(stages,
                                        std::vector<int64_t>(layers + 1, 0));
  for (int64_t i = 1; i <= layers; ++i)
    best[0][i] = stageTime(0, 0, i);
  for (int64_t s = 1; s < stages; ++s)
    for (int64_t i = s + 1; i <= layers; ++i)
      // Later starts first: a tie keeps more layers on the earlier stages.
      for (int64_t j = i - 1; j >= s; --j) {
        double t = std::max(best[s - 1][j], stageTime(s, j, i));
        if (t < best[s][i]) {
          best[s][i] = t;
          cut[s][i] = j;
        }
      }
  SmallVector<int64_t> counts(stages, 0);
  int64_t end = layers;
  for (int64_t s = stages - 1; s >= 0; --s) {
    int64_t begin = s == 0 ? 0 : cut[s][end];
    counts[s] = end - begin;
    if (stageSeconds)
      stageSeconds->insert(stageSeconds->begin(), stageTime(s, begin, end));
    end = begin;
  }
  return counts;
}
