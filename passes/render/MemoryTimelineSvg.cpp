//===- MemoryTimelineSvg.cpp - the memory timeline as an SVG picture ------===//

#include "passes/render/MemoryTimelineSvg.h"

#include "dialect/train/ModuleNames.h"
#include "dialect/train/TrainOps.h"
#include "passes/analysis/SavedActivations.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <map>

using namespace mlir;
using namespace ap::train;

int64_t MemoryChart::Point::total() const {
  int64_t sum = 0;
  for (int64_t b : bytes)
    sum += b;
  return sum;
}

//===----------------------------------------------------------------------===//
// Categories
//===----------------------------------------------------------------------===//

namespace {

// Keys of the categories that are not a leaf module's activations.
constexpr llvm::StringLiteral kParams = "params", kGrads = "grads",
                              kOptimizer = "optimizer", kInputs = "inputs",
                              kOther = "other", kRecomputed = "recomputed",
                              kReloaded = "reloaded", kInFlight = "in flight",
                              kBackward = "backward", kWorkspace = "workspace",
                              kLayerLeaves = "<layer leaves>";

struct CategoryStyle {
  llvm::StringLiteral key, name, color;
};

/// The stack, bottom first: the persistent state, then activations in
/// forward order (embedding, the decoder-layer leaves in docs/architecture.md
/// order at kLayerLeaves, the model head), then what placement and backward
/// add, then scratch. Fixed, so pictures of two placements compare band by
/// band. Colours: greys for the persistent state (large and constant, so it
/// should not draw the eye).
constexpr CategoryStyle kStack[] = {
    {kParams, "parameters", "#7f7f7f"},
    {kGrads, "FP32 main grads", "#a6a6a6"},
    {kOptimizer, "optimizer (FP32 master, Adam m, v)", "#cccccc"},
    {kInputs, "tokens, labels", "#bcbd22"},
    {"embedding", "act embedding", "#8c564b"},
    {kLayerLeaves, "", ""},
    {"final_norm", "act final_norm", "#d6616b"},
    {"lm_head", "act lm_head", "#843c39"},
    {kOther, "other activations", "#e7cb94"},
    {kRecomputed, "recomputed in backward", "#e377c2"},
    {kReloaded, "reloaded (H2D done)", "#17becf"},
    {kInFlight, "copies in flight", "#d62728"},
    {kBackward, "backward temporaries", "#ffd92f"},
    {kWorkspace, "kernel workspace", "#393b79"}};

/// Decoder-layer leaves: blues and a green for GDN, oranges for attention
/// and MLA, purples for the MLP.
constexpr std::pair<llvm::StringLiteral, llvm::StringLiteral> kLeafColors[] = {
    {"attn_norm", "#e7ba52"},    {"gdn_in_proj", "#3182bd"},
    {"gdn_prep", "#6baed6"},     {"gdn_core_attn", "#08519c"},
    {"gdn_norm_out", "#9ecae1"}, {"gdn_out_proj", "#31a354"},
    {"qkv_linear", "#e6550d"},   {"mla_up_proj", "#fd8d3c"},
    {"core_attn", "#a63603"},    {"attn_proj", "#fdae6b"},
    {"mlp_norm", "#bcbddc"},     {"mlp_fc1", "#756bb1"},
    {"mlp_act", "#9e9ac8"},      {"mlp_fc2", "#54278f"}};

const CategoryStyle *styleOf(StringRef key) {
  for (const CategoryStyle &s : kStack)
    if (key == s.key)
      return &s;
  return nullptr;
}

/// Position of `key` in the stack (unknown keys go just below the
/// placement categories).
int stackRank(StringRef key) {
  int rank = 0;
  for (const CategoryStyle &s : kStack) {
    if (s.key != kLayerLeaves) {
      if (key == s.key)
        return rank;
      ++rank;
      continue;
    }
    for (const ModuleLeaf &leaf : moduleLeaves()) {
      if (isModelLevelLeaf(leaf.name))
        continue;
      if (key == leaf.name)
        return rank;
      ++rank;
    }
  }
  return stackRank(kOther);
}

std::string displayName(StringRef key) {
  const CategoryStyle *s = styleOf(key);
  return s ? s->name.str() : ("act " + key).str();
}

std::string colorOf(StringRef key) {
  if (const CategoryStyle *s = styleOf(key))
    return s->color.str();
  for (const auto &[leaf, color] : kLeafColors)
    if (key == leaf)
      return color.str();
  return "#969696";
}

/// The leaf of a scope key ("L3.gdn_core_attn" -> "gdn_core_attn").
StringRef leafOf(StringRef scopeKey) {
  size_t dot = scopeKey.find('.');
  return dot == StringRef::npos ? scopeKey : scopeKey.drop_front(dot + 1);
}

/// The category of a buffer's value while it is an ordinary activation.
std::string primaryKey(Value v) {
  Operation *def = v.getDefiningOp();
  if (!def)
    return kInputs.str();
  if (def->hasAttr(kRecomputedAttrName) || isRebuiltActivation(v))
    return kRecomputed.str();
  if (SavedActivations::isBackwardOp(def))
    return kBackward.str();
  if (!def->hasAttr("scope"))
    return kOther.str();
  return Scope::of(def).leaf;
}

/// One piece of a buffer's lifetime drawn in one category.
struct Segment {
  std::string key;
  unsigned first, last; // inclusive point indices
  int64_t bytes;
};

/// Point index of `op` or of the body op that holds it.
int pointOf(const MemoryTimeline &tl, Operation *op) {
  for (; op; op = op->getParentOp())
    if (int i = tl.indexOf(op); i >= 0)
      return i;
  return -1;
}

/// Splits a buffer's lifetime: a reload result is in flight until its wait
/// and reloaded after it; an offloaded value is in flight from its last
/// device use (or its offload, if later) until the D2H has ended.
void segmentsOf(const MemoryTimeline &tl, const ActivationBuffer &buf,
                SmallVectorImpl<Segment> &out) {
  if (auto reload = buf.value.getDefiningOp<ReloadOp>()) {
    unsigned waitAt = buf.last + 1;
    for (Operation *user : reload.getResult().getUsers())
      if (isa<WaitOp>(user))
        if (int i = pointOf(tl, user); i >= 0)
          waitAt = std::min(waitAt, static_cast<unsigned>(i));
    if (waitAt > buf.first)
      out.push_back({kInFlight.str(), buf.first, std::min(waitAt - 1, buf.last),
                     buf.bytes});
    if (waitAt <= buf.last)
      out.push_back({kReloaded.str(), waitAt, buf.last, buf.bytes});
    return;
  }
  std::string key = primaryKey(buf.value);
  if (!buf.offloaded) {
    out.push_back({key, buf.first, buf.last, buf.bytes});
    return;
  }
  // The device is done with the value after its last non-offload use
  // (through views) and once its D2H is issued.
  unsigned done = buf.first;
  SmallVector<Value> worklist{buf.value};
  while (!worklist.empty()) {
    Value v = worklist.pop_back_val();
    for (OpOperand &use : v.getUses()) {
      int i = pointOf(tl, use.getOwner());
      if (i < 0)
        continue;
      done = std::max(done, static_cast<unsigned>(i));
      if (isa<ReshapeOp>(use.getOwner()))
        worklist.push_back(use.getOwner()->getResult(0));
    }
  }
  done = std::min(done, buf.last);
  out.push_back({key, buf.first, done, buf.bytes});
  if (done < buf.last)
    out.push_back({kInFlight.str(), done + 1, buf.last, buf.bytes});
}

} // namespace

MemoryChart MemoryChart::build(const MemoryTimeline &tl,
                               const CostModel &cost) {
  MemoryChart chart;
  if (!tl.hasStep())
    return chart;
  ArrayRef<MemoryPoint> pts = tl.points();
  const StreamSimulation &sim = tl.bodySimulation();
  const unsigned n = pts.size();
  const unsigned bodyBegin = tl.bodyBegin();
  const unsigned bodyEnd = bodyBegin + sim.ops.size();
  chart.microBatches = tl.microBatches();

  // Categories present, in stack order.
  SmallVector<Segment> segments;
  for (const ActivationBuffer &buf : tl.buffers())
    segmentsOf(tl, buf, segments);
  std::map<std::string, int> rankOf;
  auto use = [&](StringRef key) { rankOf[key.str()] = stackRank(key); };
  use(kParams);
  use(kGrads);
  use(kOptimizer);
  for (const Segment &s : segments)
    use(s.key);
  for (const SimulatedCopy &c : sim.copies)
    use(leafOf(c.scope));
  use(kWorkspace);
  std::vector<std::string> keys;
  for (const auto &entry : rankOf)
    keys.push_back(entry.first);
  llvm::stable_sort(keys, [&](const std::string &a, const std::string &b) {
    return rankOf[a] < rankOf[b];
  });
  std::map<std::string, unsigned> indexOf;
  for (auto [i, key] : llvm::enumerate(keys)) {
    indexOf[key] = i;
    chart.categories.push_back({displayName(key), colorOf(key)});
  }
  const unsigned numCats = keys.size();

  // Bytes per point and category; difference arrays keep this linear.
  std::vector<std::vector<int64_t>> delta(numCats,
                                          std::vector<int64_t>(n + 1, 0));
  for (const Segment &s : segments) {
    delta[indexOf[s.key]][s.first] += s.bytes;
    delta[indexOf[s.key]][s.last + 1] -= s.bytes;
  }
  chart.points.resize(n);
  std::vector<int64_t> running(numCats, 0);
  for (unsigned i = 0; i < n; ++i) {
    Point &p = chart.points[i];
    p.bytes.assign(numCats, 0);
    for (unsigned c = 0; c < numCats; ++c)
      p.bytes[c] = running[c] += delta[c][i];
    p.bytes[indexOf[kParams.str()]] = pts[i].params;
    p.bytes[indexOf[kGrads.str()]] = pts[i].grads;
    p.bytes[indexOf[kOptimizer.str()]] = pts[i].optimizer;
    p.bytes[indexOf[kWorkspace.str()]] = pts[i].workspace;
  }
  // The categories must add up to the timeline's own totals.
  for (unsigned i = 0; i < n; ++i)
    assert(chart.points[i].total() == pts[i].total() &&
           "chart categories do not add up to the memory timeline");

  // Time: ops before the loop and after it run back to back at their cost;
  // the body follows the stream simulation (stalls included).
  double t = 0, bodyStart = 0;
  for (unsigned i = 0; i < n; ++i) {
    Point &p = chart.points[i];
    if (i == bodyBegin)
      bodyStart = t;
    p.start = t;
    // A side-stream op takes no compute time: it is issued at t.
    if (i >= bodyBegin && i < bodyEnd && !sim.ops[i - bodyBegin].side)
      t = bodyStart + sim.ops[i - bodyBegin].end;
    else
      t += cost.cost(pts[i].op).seconds;
    if (i + 1 == bodyEnd)
      t = bodyStart + sim.computeSeconds;
    p.end = t;
  }
  if (bodyBegin >= n)
    bodyStart = t;
  double preSeconds = bodyStart;
  double postSeconds = t - bodyStart - sim.computeSeconds;
  chart.stepSeconds =
      preSeconds + chart.microBatches * sim.computeSeconds + postSeconds;
  chart.exposedSecondsPerMicrobatch = sim.exposedSeconds;

  for (unsigned i = 0; i < n; ++i) {
    Operation *op = pts[i].op;
    std::string scope = scopeKey(op);
    chart.pointLabels.push_back(
        llvm::formatv("#{0} {1}{2}", i, op->getName().getStringRef(),
                      scope.empty() ? "" : " (" + scope + ")")
            .str());
  }

  for (const SimulatedCopy &c : sim.copies)
    chart.copies.push_back({c.direction == CopyDirection::DeviceToHost,
                            bodyStart + c.start, bodyStart + c.end, c.bytes,
                            c.scope, indexOf[leafOf(c.scope).str()]});
  for (auto [k, s] : llvm::enumerate(sim.ops)) {
    unsigned i = bodyBegin + k;
    if (s.side)
      chart.sideOps.push_back(
          {bodyStart + s.start, bodyStart + s.end,
           llvm::formatv("{0} on the side stream, "
                         "{1:F1} us",
                         chart.pointLabels[i], (s.end - s.start) * 1e6)
               .str(),
           i, i + 1});
    if (s.sideWait > 0) {
      double end = bodyStart + s.start - s.stall;
      chart.sideWaits.push_back(
          {end - s.sideWait, end,
           llvm::formatv("{0:F1} us waiting for the side stream before {1}",
                         s.sideWait * 1e6, chart.pointLabels[i])
               .str(),
           i, i + 1});
    }
  }
  for (auto [k, s] : llvm::enumerate(sim.ops))
    if (s.stall > 0) {
      unsigned i = bodyBegin + k;
      chart.stalls.push_back({bodyStart + s.start - s.stall,
                              bodyStart + s.start,
                              llvm::formatv("{0:F1} us stall before {1}",
                                            s.stall * 1e6, chart.pointLabels[i])
                                  .str(),
                              i, i + 1});
    }

  // Phases.
  auto span = [&](unsigned first, unsigned end, std::string label) {
    if (first >= end)
      return;
    chart.phases.push_back({chart.points[first].start,
                            chart.points[end - 1].end, std::move(label), first,
                            end});
  };
  unsigned backwardAt = bodyEnd;
  for (unsigned i = bodyBegin; i < bodyEnd; ++i)
    if (SavedActivations::isBackwardOp(pts[i].op)) {
      backwardAt = i;
      break;
    }
  span(0, std::min(bodyBegin, n), "before the loop");
  span(
      bodyBegin, backwardAt,
      llvm::formatv("forward (microbatch 1 of {0})", chart.microBatches).str());
  span(backwardAt, bodyEnd, "backward");
  span(bodyEnd, n, "grads, optimizer");

  chart.peakPoint = std::max(0, tl.indexOf(tl.peakOp()));
  return chart;
}

//===----------------------------------------------------------------------===//
// SVG
//===----------------------------------------------------------------------===//

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

/// Labels drawn over bands and dashed lines stay readable on a white halo.
constexpr llvm::StringLiteral kHalo =
    "stroke=\"#ffffff\" stroke-width=\"3\" paint-order=\"stroke\"";

// Layout in pixels.
constexpr double kPlotLeft = 90, kPlotWidth = 900, kPlotHeight = 400,
                 kLaneGap = 6, kLaneHeight = 16,
                 kLegendLeft = kPlotLeft + kPlotWidth + 28, kLegendWidth = 300,
                 kLegendRow = 16, kFontSize = 11;

std::string xmlEscape(StringRef s) {
  std::string out;
  for (char c : s) {
    switch (c) {
    case '&':
      out += "&amp;";
      break;
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '"':
      out += "&quot;";
      break;
    default:
      out += c;
    }
  }
  return out;
}

/// A coordinate with at most one decimal, no trailing ".0".
std::string px(double v) {
  double r = std::round(v * 10) / 10;
  if (r == std::floor(r))
    return llvm::formatv("{0}", static_cast<int64_t>(r)).str();
  return llvm::formatv("{0:F1}", r).str();
}

std::string mib(int64_t bytes) {
  double m = bytes / kMiB;
  return llvm::formatv(m < 10 ? "{0:F3} MiB" : "{0:F1} MiB", m).str();
}

/// 1, 2 or 5 times a power of ten, so that `range` spans about `target`
/// steps.
double niceStep(double range, int target) {
  if (range <= 0)
    return 1;
  double raw = range / target;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

/// A tick value with the decimals its step needs.
std::string tickText(double v, double step) {
  int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step))));
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::format("%.*f", decimals, v);
  return s;
}

/// Pixel width of `text` at `size`, roughly (the SVG has no layout engine).
double textWidth(StringRef text, double size) {
  return 0.58 * size * text.size();
}

/// Splits `text` into lines of at most `maxChars`, after a space or a comma
/// where it can (a longer word stays whole).
void wrap(StringRef text, size_t maxChars, std::vector<std::string> &lines) {
  while (text.size() > maxChars) {
    size_t cut = text.substr(0, maxChars).find_last_of(" ,");
    cut = cut == StringRef::npos || cut == 0 ? maxChars : cut + 1;
    lines.push_back(text.substr(0, cut).rtrim().str());
    text = text.drop_front(cut).ltrim();
  }
  lines.push_back(text.str());
}

class SvgWriter {
public:
  SvgWriter(const MemoryChart &chart, const MemoryChartStyle &style,
            llvm::raw_ostream &os)
      : chart(chart), style(style), os(os) {}

  void write();

private:
  // Axis units: seconds (Time) or op index (OpIndex).
  double axisStart(unsigned point) const {
    return style.axis == MemoryChartStyle::Axis::Time
               ? chart.points[point].start
               : point;
  }
  double axisEnd(unsigned point) const {
    return style.axis == MemoryChartStyle::Axis::Time ? chart.points[point].end
                                                      : point + 1;
  }
  /// Axis position of a time: itself, or the op running at that time plus
  /// the fraction of it elapsed.
  double axisOfTime(double t) const;
  double xOf(double axis) const {
    return kPlotLeft + (axis - axisMin) / (axisMax - axisMin) * kPlotWidth;
  }
  double yOf(int64_t bytes) const {
    return plotTop + kPlotHeight - bytes / yMaxBytes * kPlotHeight;
  }
  double peakX() const {
    unsigned i = chart.peakPoint;
    return (xOf(axisStart(i)) + xOf(axisEnd(i))) / 2;
  }
  /// The peak label extends left of the marker when the marker is in the
  /// right half.
  bool peakLabelLeft() const {
    return !chart.points.empty() && peakX() >= kPlotLeft + kPlotWidth / 2;
  }
  bool offScale(const MemoryChartStyle::Line &l) const {
    return chart.peakBytes() > 0 && l.bytes > 1.5 * chart.peakBytes();
  }
  /// MiB with the decimals that tell categories of this chart apart.
  std::string legendMiB(int64_t bytes) const {
    return llvm::formatv(chart.peakBytes() < 100 * kMiB ? "{0:F3}" : "{0:F1}",
                         bytes / kMiB)
        .str();
  }
  double lanesTop() const { return plotTop + kPlotHeight + kLaneGap; }
  double laneY(int lane) const { return lanesTop() + lane * (kLaneHeight + 3); }
  /// d2h, h2d, side (only with side-stream work), stalls.
  int numLanes() const { return chart.sideOps.empty() ? 3 : 4; }

  void header();
  void yAxis();
  void stack();
  void phases();
  void referenceLines();
  void peak();
  void lanes();
  void xAxis();
  void legend();

  const MemoryChart &chart;
  const MemoryChartStyle &style;
  llvm::raw_ostream &os;
  double axisMin = 0, axisMax = 1, yMaxBytes = 1, yStepMiB = 1;
  double width = 0, height = 0;
  /// The title and notes, wrapped to the picture's width.
  std::vector<std::string> headerLines;
  /// Below the header lines.
  double plotTop = 96;
};

double SvgWriter::axisOfTime(double t) const {
  if (style.axis == MemoryChartStyle::Axis::Time)
    return t;
  auto it = std::partition_point(
      chart.points.begin(), chart.points.end(),
      [&](const MemoryChart::Point &p) { return p.end <= t; });
  if (it == chart.points.end())
    return chart.points.size();
  double len = it->end - it->start;
  double frac = len > 0 ? std::clamp((t - it->start) / len, 0.0, 1.0) : 0.0;
  return (it - chart.points.begin()) + frac;
}

void SvgWriter::write() {
  const unsigned n = chart.points.size();
  axisMin = 0;
  axisMax = n == 0 ? 1 : axisEnd(n - 1);
  if (axisMax <= axisMin)
    axisMax = axisMin + 1;
  // Lines far above the peak (a tiny model's arena is mostly the fixed GEMM
  // workspace) would flatten the chart: they are named above the plot
  // instead.
  int64_t top = chart.peakBytes();
  for (const MemoryChartStyle::Line &l : style.lines)
    if (!offScale(l))
      top = std::max(top, l.bytes);
  // Headroom above the highest line for the peak label.
  yStepMiB = niceStep(top / kMiB * 1.08, 6);
  double yMaxMiB = std::ceil(top / kMiB * 1.08 / yStepMiB) * yStepMiB;
  yMaxBytes = std::max(1.0, yMaxMiB * kMiB);

  // Notes wrap at spaces and commas so long placement flags stay inside.
  std::vector<std::string> notes = style.notes;
  int64_t d2h = 0, h2d = 0;
  for (const MemoryChart::Copy &c : chart.copies)
    (c.deviceToHost ? d2h : h2d) += c.bytes;
  notes.push_back(llvm::formatv(
      "predicted peak {0}; per microbatch: d2h {1}, h2d {2}, exposed "
      "transfer {3:F3} ms; step {4:F3} ms ({5} microbatches)",
      mib(chart.peakBytes()), mib(d2h), mib(h2d),
      chart.exposedSecondsPerMicrobatch * 1e3, chart.stepSeconds * 1e3,
      chart.microBatches));
  size_t maxChars = static_cast<size_t>((kLegendLeft + kLegendWidth - 30) /
                                        textWidth("x", kFontSize));
  for (const std::string &note : notes)
    wrap(note, maxChars, headerLines);
  plotTop = 40 + 15 * headerLines.size() + 26;

  double legendHeight =
      plotTop + 24 + (chart.categories.size() + 1) * kLegendRow;
  height = std::max(laneY(numLanes()) + 44, legendHeight + 16);
  width = kLegendLeft + kLegendWidth;

  os << llvm::formatv(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" "
      "height=\"{1}\" viewBox=\"0 0 {0} {1}\" font-family=\"DejaVu Sans, "
      "Helvetica, Arial, sans-serif\" font-size=\"{2}\">\n",
      px(width), px(height), px(kFontSize));
  os << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  header();
  yAxis();
  if (n > 0) {
    stack();
    phases();
  }
  referenceLines();
  if (n > 0)
    peak();
  lanes();
  xAxis();
  legend();
  os << "</svg>\n";
}

void SvgWriter::header() {
  os << "<g id=\"title\">\n";
  os << llvm::formatv("<text x=\"{0}\" y=\"22\" font-size=\"15\" "
                      "font-weight=\"bold\">{1}</text>\n",
                      px(kPlotLeft - 70), xmlEscape(style.title));
  for (auto [i, note] : llvm::enumerate(headerLines))
    os << llvm::formatv(
        "<text x=\"{0}\" y=\"{1}\" fill=\"#444444\">{2}</text>\n",
        px(kPlotLeft - 70), px(40 + 15 * i), xmlEscape(note));
  os << "</g>\n";
}

void SvgWriter::yAxis() {
  os << "<g id=\"y-axis\" font-size=\"10\" fill=\"#444444\">\n";
  double maxMiB = yMaxBytes / kMiB;
  for (int i = 0; i * yStepMiB <= maxMiB * (1 + 1e-9); ++i) {
    double v = i * yStepMiB;
    double y = yOf(static_cast<int64_t>(v * kMiB));
    os << llvm::formatv("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" "
                        "stroke=\"#e6e6e6\"/>\n",
                        px(kPlotLeft), px(y), px(kPlotLeft + kPlotWidth));
    os << llvm::formatv("<text x=\"{0}\" y=\"{1}\" "
                        "text-anchor=\"end\">{2}</text>\n",
                        px(kPlotLeft - 6), px(y + 3.5), tickText(v, yStepMiB));
  }
  double midY = plotTop + kPlotHeight / 2;
  os << llvm::formatv("<text x=\"{0}\" y=\"{1}\" text-anchor=\"middle\" "
                      "font-size=\"11\" transform=\"rotate(-90 {0} {1})\">"
                      "predicted device memory (MiB)</text>\n",
                      px(kPlotLeft - 62), px(midY));
  os << "</g>\n";
}

void SvgWriter::stack() {
  // One op per pixel column: where several ops share a column the one with
  // the largest total is drawn (so the peak is never averaged away); a
  // column no op starts in shows the op running across it.
  const unsigned n = chart.points.size();
  const int columns = static_cast<int>(kPlotWidth);
  std::vector<int> chosen(columns, -1);
  double perColumn = (axisMax - axisMin) / columns;
  for (unsigned i = 0; i < n; ++i) {
    double a = (axisStart(i) - axisMin) / perColumn;
    double b = (axisEnd(i) - axisMin) / perColumn;
    int c0 = std::clamp(static_cast<int>(std::floor(a)), 0, columns - 1);
    int c1 = std::clamp(static_cast<int>(std::ceil(b)) - 1, c0, columns - 1);
    for (int c = c0; c <= c1; ++c)
      if (chosen[c] < 0 ||
          chart.points[i].total() > chart.points[chosen[c]].total())
        chosen[c] = i;
  }
  for (int c = 1; c < columns; ++c)
    if (chosen[c] < 0)
      chosen[c] = chosen[c - 1];
  // Runs of columns showing the same op.
  struct Run {
    int begin, end;
    unsigned point;
  };
  std::vector<Run> runs;
  for (int c = 0; c < columns; ++c) {
    if (chosen[c] < 0)
      continue;
    if (!runs.empty() && runs.back().point == static_cast<unsigned>(chosen[c]))
      runs.back().end = c + 1;
    else
      runs.push_back({c, c + 1, static_cast<unsigned>(chosen[c])});
  }

  // Each category is painted as the area from zero to its cumulative top,
  // top category first, so the bands below cover the rest without seams.
  const unsigned numCats = chart.categories.size();
  std::vector<std::vector<int64_t>> cumulative(
      runs.size(), std::vector<int64_t>(numCats, 0));
  for (auto [r, run] : llvm::enumerate(runs)) {
    int64_t sum = 0;
    for (unsigned c = 0; c < numCats; ++c)
      cumulative[r][c] = sum += chart.points[run.point].bytes[c];
  }
  os << "<g id=\"stack\" stroke=\"none\">\n";
  for (unsigned c = numCats; c-- > 0;) {
    bool any = false;
    for (const Run &run : runs)
      any |= chart.points[run.point].bytes[c] != 0;
    if (!any)
      continue;
    // Steps only where the (rounded) height changes.
    double base = yOf(0);
    std::string d = "M" + px(kPlotLeft + runs.front().begin) + " " + px(base);
    std::string lastY;
    for (auto [r, run] : llvm::enumerate(runs)) {
      std::string y = px(yOf(cumulative[r][c]));
      if (y == lastY)
        continue;
      if (r > 0)
        d += "H" + px(kPlotLeft + run.begin);
      d += "V" + y;
      lastY = y;
    }
    d += "H" + px(kPlotLeft + runs.back().end) + "V" + px(base) + "Z";
    os << llvm::formatv("<path class=\"area\" data-category=\"{0}\" "
                        "fill=\"{1}\" d=\"{2}\"><title>{0}</title></path>\n",
                        xmlEscape(chart.categories[c].name),
                        chart.categories[c].color, d);
  }
  os << llvm::formatv("<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" "
                      "height=\"{3}\" fill=\"none\" stroke=\"#666666\"/>\n",
                      px(kPlotLeft), px(plotTop), px(kPlotWidth),
                      px(kPlotHeight));
  os << "</g>\n";
}

void SvgWriter::phases() {
  os << "<g id=\"phases\" font-size=\"10\" fill=\"#444444\">\n";
  double bottom = laneY(numLanes()) - 3;
  for (auto [i, ph] : llvm::enumerate(chart.phases)) {
    double x0 = xOf(axisStart(ph.firstPoint));
    double x1 = xOf(axisEnd(ph.endPoint - 1));
    if (i > 0)
      os << llvm::formatv("<line class=\"phase\" x1=\"{0}\" y1=\"{1}\" "
                          "x2=\"{0}\" y2=\"{2}\" stroke=\"#555555\" "
                          "stroke-dasharray=\"4 3\"/>\n",
                          px(x0), px(plotTop - 12), px(bottom));
    // Long labels only where they fit; a shorter one otherwise.
    std::string label = ph.label;
    if (textWidth(label, 10) > x1 - x0 - 4)
      label = label.substr(0, label.find(' '));
    if (textWidth(label, 10) > x1 - x0 - 4)
      continue;
    os << llvm::formatv("<text class=\"phase\" x=\"{0}\" y=\"{1}\" "
                        "text-anchor=\"middle\" {3}>{2}</text>\n",
                        px((x0 + x1) / 2), px(plotTop - 4), xmlEscape(label),
                        kHalo);
  }
  os << "</g>\n";
}

void SvgWriter::referenceLines() {
  os << "<g id=\"reference-lines\" font-size=\"10\">\n";
  std::vector<MemoryChartStyle::Line> lines = style.lines;
  llvm::stable_sort(
      lines, [](const auto &a, const auto &b) { return a.bytes > b.bytes; });
  double lastLabelY = -1e9;
  // Below the peak label's row, on the side away from the peak.
  double offScaleY = plotTop + 26;
  bool labelsLeft = peakLabelLeft();
  for (const MemoryChartStyle::Line &l : lines) {
    if (offScale(l)) {
      os << llvm::formatv(
          "<text class=\"reference off-scale\" x=\"{0}\" y=\"{1}\" "
          "text-anchor=\"end\" data-bytes=\"{2}\">{3}: {4} (above the "
          "scale)</text>\n",
          px(kPlotLeft + kPlotWidth - 4), px(offScaleY), l.bytes,
          xmlEscape(l.label), mib(l.bytes));
      offScaleY += 12;
      lastLabelY = offScaleY;
      continue;
    }
    double y = yOf(l.bytes);
    os << llvm::formatv("<line class=\"reference\" x1=\"{0}\" y1=\"{1}\" "
                        "x2=\"{2}\" y2=\"{1}\" stroke=\"#000000\" "
                        "stroke-width=\"1\" stroke-dasharray=\"6 3\"/>\n",
                        px(kPlotLeft), px(y), px(kPlotLeft + kPlotWidth));
    // Labels above their line unless the previous label is in the way.
    double labelY = y - 3;
    if (labelY - lastLabelY < 11)
      labelY = y + 11;
    lastLabelY = labelY;
    os << llvm::formatv(
        "<text class=\"reference\" x=\"{0}\" y=\"{1}\" text-anchor=\"{2}\" "
        "data-bytes=\"{3}\" {4}>{5}: {6}</text>\n",
        px(labelsLeft ? kPlotLeft + 4 : kPlotLeft + kPlotWidth - 4), px(labelY),
        labelsLeft ? "start" : "end", l.bytes, kHalo, xmlEscape(l.label),
        mib(l.bytes));
  }
  os << "</g>\n";
}

void SvgWriter::peak() {
  unsigned i = chart.peakPoint;
  double x = peakX();
  double y = yOf(chart.peakBytes());
  os << "<g id=\"peak\">\n";
  // The label sits in the top row of the plot (above every band and
  // reference line, which stay below 1/1.08 of the height), joined to the
  // marker by a dotted line.
  double labelY = plotTop + 12;
  os << llvm::formatv("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" "
                      "stroke=\"#d62728\" stroke-width=\"1\" "
                      "stroke-dasharray=\"2 2\"/>\n",
                      px(x), px(labelY + 3), px(y));
  os << llvm::formatv("<circle cx=\"{0}\" cy=\"{1}\" r=\"3.5\" "
                      "fill=\"#d62728\"/>\n",
                      px(x), px(y));
  std::string text =
      "peak " + mib(chart.peakBytes()) + " at " + chart.pointLabels[i];
  bool right = !peakLabelLeft();
  os << llvm::formatv(
      "<text class=\"peak\" x=\"{0}\" y=\"{1}\" text-anchor=\"{2}\" "
      "font-weight=\"bold\" fill=\"#d62728\" data-bytes=\"{3}\" "
      "{4}>{5}</text>\n",
      px(right ? x + 6 : x - 6), px(labelY), right ? "start" : "end",
      chart.peakBytes(), kHalo, xmlEscape(text));
  os << "</g>\n";
}

void SvgWriter::lanes() {
  os << "<g id=\"lanes\" font-size=\"10\">\n";
  const bool side = numLanes() == 4;
  const int stallLane = numLanes() - 1;
  const char *withSide[] = {"d2h", "h2d", "side", "stalls"};
  const char *without[] = {"d2h", "h2d", "stalls"};
  const char **names = side ? withSide : without;
  for (int lane = 0; lane < numLanes(); ++lane) {
    double y = laneY(lane);
    os << llvm::formatv("<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" "
                        "height=\"{3}\" fill=\"#f4f4f4\"/>\n",
                        px(kPlotLeft), px(y), px(kPlotWidth), px(kLaneHeight));
    os << llvm::formatv("<text x=\"{0}\" y=\"{1}\" text-anchor=\"end\" "
                        "fill=\"#444444\">{2}</text>\n",
                        px(kPlotLeft - 6), px(y + kLaneHeight - 4),
                        names[lane]);
  }
  // Copies narrower than a pixel still show as a hairline.
  auto bar = [&](const char *cls, double t0, double t1, int lane,
                 const std::string &fill, const std::string &data,
                 const std::string &title) {
    double x0 = xOf(axisOfTime(t0)), x1 = xOf(axisOfTime(t1));
    x0 = std::clamp(x0, kPlotLeft, kPlotLeft + kPlotWidth);
    x1 = std::clamp(x1, kPlotLeft, kPlotLeft + kPlotWidth);
    os << llvm::formatv("<rect class=\"{0}\" x=\"{1}\" y=\"{2}\" "
                        "width=\"{3}\" height=\"{4}\" fill=\"{5}\" "
                        "stroke=\"#ffffff\" stroke-width=\"0.3\" {6}>"
                        "<title>{7}</title></rect>\n",
                        cls, px(x0), px(laneY(lane) + 1),
                        px(std::max(0.6, x1 - x0)), px(kLaneHeight - 2), fill,
                        data, xmlEscape(title));
  };
  for (const MemoryChart::Copy &c : chart.copies)
    bar(c.deviceToHost ? "d2h" : "h2d", c.start, c.end, c.deviceToHost ? 0 : 1,
        chart.categories[c.category].color,
        llvm::formatv("data-bytes=\"{0}\" data-scope=\"{1}\"", c.bytes,
                      xmlEscape(c.scope))
            .str(),
        llvm::formatv("{0} {1}: {2} bytes, {3:F1} us", c.scope,
                      c.deviceToHost ? "offload" : "reload", c.bytes,
                      (c.end - c.start) * 1e6)
            .str());
  for (const MemoryChart::Span &s : chart.stalls)
    bar("stall", s.start, s.end, stallLane, "#d62728",
        llvm::formatv("data-seconds=\"{0:E3}\"", s.end - s.start).str(),
        s.label);
  for (const MemoryChart::Span &s : chart.sideOps)
    bar("side", s.start, s.end, 2, "#9467bd",
        llvm::formatv("data-seconds=\"{0:E3}\"", s.end - s.start).str(),
        s.label);
  for (const MemoryChart::Span &s : chart.sideWaits)
    bar("side-wait", s.start, s.end, stallLane, "#ff7f0e",
        llvm::formatv("data-seconds=\"{0:E3}\"", s.end - s.start).str(),
        s.label);
  os << "</g>\n";
}

void SvgWriter::xAxis() {
  bool time = style.axis == MemoryChartStyle::Axis::Time;
  // Time ticks in milliseconds, op ticks in ops.
  double scale = time ? 1e3 : 1;
  double range = (axisMax - axisMin) * scale;
  double step = niceStep(range, 10);
  if (!time)
    step = std::max(1.0, step);
  double y = laneY(numLanes());
  os << "<g id=\"x-axis\" font-size=\"10\" fill=\"#444444\">\n";
  for (int i = 0; i * step <= range * (1 + 1e-9); ++i) {
    double v = i * step;
    double x = xOf(axisMin + v / scale);
    os << llvm::formatv("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" "
                        "stroke=\"#666666\"/>\n",
                        px(x), px(y - 2), px(y + 2));
    os << llvm::formatv("<text x=\"{0}\" y=\"{1}\" "
                        "text-anchor=\"middle\">{2}</text>\n",
                        px(x), px(y + 13), tickText(v, step));
  }
  os << llvm::formatv(
      "<text x=\"{0}\" y=\"{1}\" text-anchor=\"middle\" font-size=\"11\">"
      "{2}</text>\n",
      px(kPlotLeft + kPlotWidth / 2), px(y + 30),
      time ? "predicted time (ms): one microbatch of the loop, then the "
             "step's tail"
           : "op index in program order: one microbatch of the loop, then "
             "the step's tail");
  os << "</g>\n";
}

void SvgWriter::legend() {
  os << "<g id=\"legend\">\n";
  os << llvm::formatv("<text x=\"{0}\" y=\"{1}\" font-weight=\"bold\">"
                      "category (MiB at the peak)</text>\n",
                      px(kLegendLeft), px(plotTop + 8));
  // Top of the stack first, as the bands appear.
  const MemoryChart::Point *peakPoint =
      chart.points.empty() ? nullptr : &chart.points[chart.peakPoint];
  int row = 0;
  for (unsigned c = chart.categories.size(); c-- > 0;) {
    double y = plotTop + 20 + row++ * kLegendRow;
    int64_t atPeak = peakPoint ? peakPoint->bytes[c] : 0;
    os << llvm::formatv(
        "<rect class=\"legend\" x=\"{0}\" y=\"{1}\" width=\"12\" "
        "height=\"11\" fill=\"{2}\" stroke=\"#666666\" "
        "stroke-width=\"0.5\"/>\n",
        px(kLegendLeft), px(y), chart.categories[c].color);
    os << llvm::formatv(
        "<text class=\"legend\" x=\"{0}\" y=\"{1}\" data-bytes=\"{2}\">{3} "
        "({4})</text>\n",
        px(kLegendLeft + 18), px(y + 9.5), atPeak,
        xmlEscape(chart.categories[c].name), legendMiB(atPeak));
  }
  os << "</g>\n";
}

} // namespace

void ap::train::writeMemoryChartSvg(const MemoryChart &chart,
                                    const MemoryChartStyle &style,
                                    llvm::raw_ostream &os) {
  SvgWriter(chart, style, os).write();
}
