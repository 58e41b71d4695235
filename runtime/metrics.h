//===- metrics.h - Step metrics, fingerprints -------------------*- C++ -*-===//
//
// One JSON object per line and per step (schema in docs/runtime-metrics.md):
// machine-readable, append-only, and diffable between runs. With
// --fingerprints the line carries SHA-256 digests of the exact bytes of the
// loss, gradients, parameters and optimizer state, so two runs (offload on
// and off, resumed and uninterrupted) compare bit-for-bit by string equality.
//
// The terminal gets a separate, human progress line.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_METRICS_H
#define ACTPLACE_RUNTIME_METRICS_H

#include "runtime/device.h"
#include "runtime/offload.h"
#include "runtime/pinned_pool.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ap::rt {

/// SHA-256 hex digests (64 lower-case hex characters each).
struct Fingerprints {
  std::string loss;
  std::string grads;
  std::string params;
  std::string optimizer;
};

/// Everything one metrics line holds.
struct StepMetrics {
  int64_t step = 0;
  /// The backend that ran the step ("host" / "cuda") and its device's name
  /// (Device::deviceName()), so a line never passes host numbers off as GPU
  /// ones.
  std::string backend;
  std::string device;
  /// The data-parallel rank that wrote the line and the world size; both
  /// written (after "device") only when worldSize > 1, so a world of one
  /// keeps its lines as they were.
  int rank = 0;
  int worldSize = 1;
  double loss = 0;
  double gradNorm = 0;
  double lr = 0;
  double stepTimeS = 0;
  double tokensPerS = 0;
  uint64_t devicePeakBytes = 0;
  uint64_t plannedPeakBytes = 0;
  /// The free device memory the start-up check read (cuda: after the
  /// context was made, before the arena), when one was measured; written as
  /// "device_free_at_start_bytes" after "planned_peak_bytes". The device's
  /// capacity less it is what `--memory-budget=device` must keep back.
  std::optional<uint64_t> deviceFreeAtStartBytes;
  PinnedPoolStats pinnedPool;
  std::map<std::string, TransferCounters> transfers;
  std::optional<Fingerprints> fingerprints;
  /// The evaluation loss measured after this step (--eval-data), when one
  /// was; written as "eval_loss" after "loss".
  std::optional<double> evalLoss;
  /// Generated kernels the step launched, for a program that has any;
  /// written as "generated_launches" after "transfers".
  std::optional<uint64_t> generatedLaunches;
};

/// The metrics line for `m`, without the trailing newline. Keys appear in
/// the documented order; numbers use the shortest text that reads back to
/// the same double; non-finite numbers are written as null.
std::string metricsJson(const StepMetrics &m);

/// Shortest decimal text that parses back to exactly `v` (JSON number), or
/// "null" for NaN and infinities.
std::string jsonNumber(double v);

/// Fills the runtime's part of a metrics line: backend and device,
/// device_peak_bytes (memory is
/// sampled now, so call it after the step's last synchronisation),
/// pinned_pool and transfers (from `engine`; none when it is null). The
/// training loop fills step, loss, grad_norm, lr, times, planned bytes.
void collectRuntimeMetrics(StepMetrics &m, Device &device, PinnedPool &pool,
                           const OffloadEngine *engine);

/// Appends metrics lines to a file ("-" = stdout). Each line is flushed, so
/// a crashed run keeps every completed step.
class MetricsWriter {
public:
  /// Empty path: a disabled writer (write() does nothing).
  explicit MetricsWriter(const std::string &path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter &) = delete;
  MetricsWriter &operator=(const MetricsWriter &) = delete;
  bool enabled() const { return file_ != nullptr; }
  void write(const StepMetrics &m);

private:
  std::FILE *file_ = nullptr;
  bool owned_ = false;
  std::string path_;
};

//===--- Fingerprints
//-------------------------------------------------------===//

/// A byte range to fingerprint; `onDevice` ranges are copied to the host
/// through pinned staging first.
struct ByteRange {
  const void *data = nullptr;
  uint64_t bytes = 0;
  bool onDevice = true;
};

/// A digest of the exact bytes of `ranges`, in order: each range is cut into
/// leaves of 16 MiB (the last one shorter; an empty range is one empty leaf),
/// every leaf gets its SHA-256, and the result is the SHA-256 (hex) of the
/// concatenated leaf digests. Leaves are hashed in parallel (one thread per
/// core, up to 16). Device ranges are read after all work enqueued on
/// `after` (the step's last stream), through one general-pool staging buffer
/// (fingerprintStagingBytes) reused group by group.
std::string fingerprint(Device &device, PinnedPool &pool,
                        const std::vector<ByteRange> &ranges,
                        Stream after = Stream::Compute);
/// The general-pool staging one fingerprint of `ranges` takes: a slot per
/// device leaf of one parallel group, each the size of the largest device
/// leaf (so small data stays small).
uint64_t fingerprintStagingBytes(const std::vector<ByteRange> &ranges);

//===--- Progress
//-----------------------------------------------------------===//

/// The text of one progress line (no newline), e.g.
/// "step 12/100  loss 3.2145  lr 3.00e-04  0.412 s/step  19,876 tok/s  ETA
/// 36s".
std::string progressText(const StepMetrics &m, int64_t totalSteps);

/// Writes progressText on the terminal: rewritten in place (carriage
/// return) on a TTY; else one line at the first and last step and at most
/// every `intervalS` seconds, so logs stay short.
class ProgressLine {
public:
  explicit ProgressLine(int64_t totalSteps, std::FILE *out = stderr,
                        double intervalS = 10.0);
  void update(const StepMetrics &m);
  /// Ends the in-place line with a newline (TTY only).
  void finish();

private:
  int64_t totalSteps_;
  std::FILE *out_;
  double intervalS_;
  bool tty_;
  bool open_ = false;
  bool printedAny_ = false;
  std::chrono::steady_clock::time_point last_;
};

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_METRICS_H
