//===- MemoryTimelineSvg.h - the memory timeline as an SVG picture -*- C++ -*-//
//
// Draws the predicted device memory of one training step (MemoryTimeline)
// as a stacked area chart: parameters, FP32 main grads, optimizer state,
// activations by leaf module, recomputed and reloaded values, copies in
// flight, backward temporaries and kernel workspaces, with the offload (D2H)
// and reload (H2D) copies and the compute stalls they cause on lanes below,
// the peak marked and labelled. Used by `actplace-compile --memory-timeline`
// and bench/ so that each placement arm comes with a picture.
//
// Two stages, so a driver can build the chart while the train-dialect step
// still exists and write it after lowering (when the planned arena is known):
// MemoryChart::build copies everything the picture needs out of the IR into
// plain numbers; writeMemoryChartSvg renders them. The SVG is self-contained
// (no scripts, no external fonts or styles).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_RENDER_MEMORYTIMELINESVG_H
#define ACTPLACE_PASSES_RENDER_MEMORYTIMELINESVG_H

#include "passes/analysis/CostModel.h"
#include "passes/analysis/MemoryTimeline.h"

#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ap::train {

/// The picture's data: no IR pointers, so it outlives the step it was
/// built from.
struct MemoryChart {
  struct Category {
    std::string name;
    /// "#rrggbb".
    std::string color;
  };
  /// One op of the step in program order (the loop body once).
  struct Point {
    /// Predicted seconds from the start of the step; a point covers
    /// [start, end) (stalls before an op are counted in its interval).
    double start = 0, end = 0;
    /// Device bytes live while the op runs, one entry per category.
    std::vector<int64_t> bytes;
    int64_t total() const;
  };
  /// A D2H or H2D copy on its lane.
  struct Copy {
    bool deviceToHost = true;
    double start = 0, end = 0;
    int64_t bytes = 0;
    /// "L3.gdn_core_attn".
    std::string scope;
    /// The category whose colour the copy is drawn in.
    unsigned category = 0;
  };
  /// A labelled time range: a phase of the step or a compute stall.
  struct Span {
    double start = 0, end = 0;
    std::string label;
    /// Program-order indices [firstPoint, endPoint) the span covers.
    unsigned firstPoint = 0, endPoint = 0;
  };

  /// Bottom of the stack first.
  std::vector<Category> categories;
  std::vector<Point> points;
  /// "#143 train.lm_head_cross_entropy (model.lm_head)", one per point.
  std::vector<std::string> pointLabels;
  std::vector<Copy> copies;
  /// Compute-stream stalls (exposed transfer time).
  std::vector<Span> stalls;
  /// Side-stream kernels (recompute issued ahead) as they run, and the
  /// compute stream's waits for them; drawn on a lane of their own, which
  /// the chart has only when the step has side-stream work.
  std::vector<Span> sideOps, sideWaits;
  /// Before the loop (when anything runs there), forward and backward of one
  /// microbatch, the step's tail (grad finalisation, optimizer).
  std::vector<Span> phases;
  /// MemoryTimeline's peak point (the first reaching the largest total).
  unsigned peakPoint = 0;
  int64_t microBatches = 1;
  /// Predicted seconds of the whole step (microBatches bodies + the rest)
  /// and stall seconds per microbatch.
  double stepSeconds = 0, exposedSecondsPerMicrobatch = 0;

  /// Copies `timeline` (with `cost`, the model it was computed with) into a
  /// chart. An empty timeline gives an empty chart.
  static MemoryChart build(const MemoryTimeline &timeline,
                           const CostModel &cost);

  int64_t peakBytes() const {
    return points.empty() ? 0 : points[peakPoint].total();
  }
};

/// How the chart is drawn.
struct MemoryChartStyle {
  std::string title;
  /// Lines under the title (the writer adds one with the chart's totals).
  std::vector<std::string> notes;
  /// Dashed horizontal lines, e.g. the peak without placement or the
  /// planned arena.
  struct Line {
    std::string label;
    int64_t bytes = 0;
  };
  std::vector<Line> lines;
  /// The x axis: predicted time (ms), or op index (every op one unit wide).
  enum class Axis { Time, OpIndex };
  Axis axis = Axis::Time;
};

/// Writes `chart` as one SVG document.
void writeMemoryChartSvg(const MemoryChart &chart,
                         const MemoryChartStyle &style, llvm::raw_ostream &os);

} // namespace ap::train

#endif // ACTPLACE_PASSES_RENDER_MEMORYTIMELINESVG_H
