//===- metrics.cpp - Step metrics, fingerprints -----------------*- C++ -*-===//
#include "runtime/metrics.h"

#include "runtime/error.h"
#include "runtime/json.h"
#include "runtime/launch.h"
#include "runtime/sha256.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unistd.h>

namespace ap::rt {

std::string jsonNumber(double v) {
  if (!std::isfinite(v))
    return "null";
  char buf[40];
  // The shortest %.Ng that reads back bit-identically: exact for
  // fingerprints-free comparisons of loss, and short for people.
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v)
      break;
  }
  return buf;
}

std::string metricsJson(const StepMetrics &m) {
  // nlohmann writes the strings, the integers and the nested objects. The
  // five measured numbers keep jsonNumber's text (the shortest %.Ng that
  // reads back exactly: "32768", "0.0003"), which nlohmann's own spelling
  // of a double would change ("32768.0"), so the top level joins them as
  // text. Bytes that are not UTF-8 in a name become U+FFFD, as in jsonQuote.
  auto text = [](const Json &v) {
    return v.dump(-1, ' ', false, Json::error_handler_t::replace);
  };
  Json transfers = Json::object();
  for (const auto &[scope, c] : m.transfers)
    transfers[scope] = {{"d2h_count", c.d2hCount},
                        {"h2d_count", c.h2dCount},
                        {"d2h_bytes", c.d2hBytes},
                        {"h2d_bytes", c.h2dBytes}};
  Json pinned = {{"buffers", m.pinnedPool.buffers},
                 {"bytes", m.pinnedPool.bytes},
                 {"in_use", m.pinnedPool.inUse}};
  std::string line =
      "{\"step\":" + text(m.step) + ",\"backend\":" + text(m.backend) +
      ",\"device\":" + text(m.device) +
      (m.worldSize > 1 ? ",\"rank\":" + text(m.rank) +
                             ",\"world_size\":" + text(m.worldSize)
                       : std::string()) +
      ",\"loss\":" + jsonNumber(m.loss) +
      (m.evalLoss ? ",\"eval_loss\":" + jsonNumber(*m.evalLoss)
                  : std::string()) +
      ",\"grad_norm\":" + jsonNumber(m.gradNorm) +
      ",\"lr\":" + jsonNumber(m.lr) +
      ",\"step_time_s\":" + jsonNumber(m.stepTimeS) +
      ",\"tokens_per_s\":" + jsonNumber(m.tokensPerS) +
      ",\"device_peak_bytes\":" + text(m.devicePeakBytes) +
      ",\"planned_peak_bytes\":" + text(m.plannedPeakBytes) +
      (m.deviceFreeAtStartBytes ? ",\"device_free_at_start_bytes\":" +
                                      text(*m.deviceFreeAtStartBytes)
                                : std::string()) +
      ",\"pinned_pool\":" + text(pinned) + ",\"transfers\":" + text(transfers);
  if (m.generatedLaunches)
    line += ",\"generated_launches\":" + text(*m.generatedLaunches);
  if (m.fingerprints) {
    const Fingerprints &f = *m.fingerprints;
    line += ",\"fingerprints\":" + text({{"loss", f.loss},
                                         {"grads", f.grads},
                                         {"params", f.params},
                                         {"optimizer", f.optimizer}});
  }
  return line + "}";
}

void collectRuntimeMetrics(StepMetrics &m, Device &device, PinnedPool &pool,
                           const OffloadEngine *engine) {
  m.backend = deviceKindName(device.kind());
  m.device = device.deviceName();
  device.sampleMemory();
  m.devicePeakBytes = device.devicePeakBytes();
  m.pinnedPool = pool.stats();
  m.transfers.clear();
  if (engine)
    m.transfers = engine->transfers();
}

MetricsWriter::MetricsWriter(const std::string &path) : path_(path) {
  if (path.empty())
    return;
  if (path == "-") {
    file_ = stdout;
    return;
  }
  file_ = std::fopen(path.c_str(), "a");
  if (!file_)
    fail("metrics: cannot open '", path,
         "' for appending: ", std::strerror(errno));
  owned_ = true;
}

MetricsWriter::~MetricsWriter() {
  if (owned_ && file_)
    std::fclose(file_);
}

void MetricsWriter::write(const StepMetrics &m) {
  if (!file_)
    return;
  std::string line = metricsJson(m);
  line += '\n';
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() ||
      std::fflush(file_) != 0)
    fail("metrics: write to '", path_, "' failed: ", std::strerror(errno));
}

//===----------------------------------------------------------------------===//
// Fingerprints
//===----------------------------------------------------------------------===//

namespace {
/// Leaves of at most 16 MiB, hashed in parallel groups: a model's state is
/// gigabytes, and one SHA-256 stream over it took tens of seconds per step.
constexpr uint64_t kLeaf = 16ull << 20;

struct Leaf {
  const char *data;
  uint64_t bytes;
  bool onDevice;
};

std::vector<Leaf> leavesOf(const std::vector<ByteRange> &ranges) {
  std::vector<Leaf> leaves;
  for (const ByteRange &r : ranges) {
    if (r.bytes && !r.data)
      fail("fingerprint: null range of ", r.bytes, " bytes");
    uint64_t done = 0;
    do {
      leaves.push_back({static_cast<const char *>(r.data) + done,
                        std::min(kLeaf, r.bytes - done), r.onDevice});
      done += kLeaf;
    } while (done < r.bytes);
  }
  return leaves;
}

size_t hashGroupSize() { return std::clamp<size_t>(usableCores(), 1, 16); }

/// Staging layout: one slot per leaf of a group, each as large as the
/// largest device leaf.
std::pair<size_t, uint64_t> stagingShape(const std::vector<Leaf> &leaves) {
  size_t deviceLeaves = 0;
  uint64_t stride = 0;
  for (const Leaf &l : leaves)
    if (l.onDevice) {
      ++deviceLeaves;
      stride = std::max(stride, l.bytes);
    }
  return {std::min(hashGroupSize(), deviceLeaves), stride};
}
} // namespace

uint64_t fingerprintStagingBytes(const std::vector<ByteRange> &ranges) {
  auto [slots, stride] = stagingShape(leavesOf(ranges));
  return uint64_t(slots) * stride;
}

std::string fingerprint(Device &device, PinnedPool &pool,
                        const std::vector<ByteRange> &ranges, Stream after) {
  std::vector<Leaf> leaves = leavesOf(ranges);
  auto [slots, stride] = stagingShape(leaves);
  size_t group = hashGroupSize();
  PinnedBuffer staging;
  if (slots && stride)
    staging = pool.allocate(uint64_t(slots) * stride);
  std::vector<std::array<uint8_t, 32>> digests(leaves.size());
  try {
    for (size_t first = 0; first < leaves.size(); first += group) {
      size_t last = std::min(leaves.size(), first + group);
      std::vector<const char *> bytes(last - first);
      size_t slot = 0;
      for (size_t i = first; i < last; ++i) {
        const Leaf &l = leaves[i];
        bytes[i - first] = l.data;
        if (l.onDevice && l.bytes) {
          char *dst = static_cast<char *>(staging.data) + slot++ * stride;
          device.copyToHostSync(dst, l.data, l.bytes, after);
          bytes[i - first] = dst;
        }
      }
      std::vector<std::thread> workers;
      for (size_t i = first; i < last; ++i)
        workers.emplace_back([&, i] {
          Sha256 leaf;
          leaf.update(bytes[i - first], leaves[i].bytes);
          digests[i] = leaf.finish();
        });
      for (std::thread &t : workers)
        t.join();
    }
  } catch (...) {
    if (staging)
      pool.release(staging);
    throw;
  }
  if (staging)
    pool.release(staging); // copies were synchronised above
  Sha256 root;
  for (const std::array<uint8_t, 32> &d : digests)
    root.update(d.data(), d.size());
  return Sha256::hex(root.finish());
}

//===----------------------------------------------------------------------===//
// Progress
//===----------------------------------------------------------------------===//

namespace {
std::string groupThousands(uint64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return out;
}

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0)
    return "?";
  auto total = static_cast<uint64_t>(s + 0.5);
  char buf[32];
  if (total >= 3600)
    std::snprintf(buf, sizeof(buf), "%lluh%02llum",
                  static_cast<unsigned long long>(total / 3600),
                  static_cast<unsigned long long>(total / 60 % 60));
  else if (total >= 60)
    std::snprintf(buf, sizeof(buf), "%llum%02llus",
                  static_cast<unsigned long long>(total / 60),
                  static_cast<unsigned long long>(total % 60));
  else
    std::snprintf(buf, sizeof(buf), "%llus",
                  static_cast<unsigned long long>(total));
  return buf;
}
} // namespace

std::string progressText(const StepMetrics &m, int64_t totalSteps) {
  char buf[160];
  std::string text = "step " + std::to_string(m.step);
  if (totalSteps > 0)
    text += "/" + std::to_string(totalSteps);
  std::snprintf(buf, sizeof(buf), "  loss %.4f  lr %.2e  %.3f s/step  ", m.loss,
                m.lr, m.stepTimeS);
  text += buf;
  text +=
      groupThousands(static_cast<uint64_t>(std::max(0.0, m.tokensPerS) + 0.5));
  text += " tok/s";
  if (totalSteps > 0 && m.step < totalSteps)
    text += "  ETA " + duration(double(totalSteps - m.step) * m.stepTimeS);
  return text;
}

ProgressLine::ProgressLine(int64_t totalSteps, std::FILE *out, double intervalS)
    : totalSteps_(totalSteps), out_(out), intervalS_(intervalS),
      tty_(out && isatty(fileno(out))) {}

void ProgressLine::update(const StepMetrics &m) {
  if (!out_)
    return;
  std::string text = progressText(m, totalSteps_);
  if (tty_) {
    // \033[K clears what a longer previous line left behind.
    std::fprintf(out_, "\r%s\033[K", text.c_str());
    std::fflush(out_);
    open_ = true;
    return;
  }
  auto now = std::chrono::steady_clock::now();
  bool last = totalSteps_ > 0 && m.step >= totalSteps_;
  if (printedAny_ && !last &&
      std::chrono::duration<double>(now - last_).count() < intervalS_)
    return;
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
  printedAny_ = true;
  last_ = now;
}

void ProgressLine::finish() {
  if (open_ && out_) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
  open_ = false;
}

} // namespace ap::rt
