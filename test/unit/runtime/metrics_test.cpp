//===- metrics_test.cpp - Metrics tests -------------------------*- C++ -*-===//
#include "runtime/metrics.h"
#include "runtime/safetensors.h"
#include "runtime/sha256.h"
#include "runtime_test_util.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>

using namespace ap::rt;
using namespace ap::rt::test;

namespace {

StepMetrics sample() {
  StepMetrics m;
  m.step = 12;
  m.backend = "host";
  m.device = "CPU";
  m.loss = 3.25;
  m.gradNorm = 0.5;
  m.lr = 3e-4;
  m.stepTimeS = 0.125;
  m.tokensPerS = 32768;
  m.devicePeakBytes = 1234567;
  m.plannedPeakBytes = 1200000;
  m.pinnedPool = {2, 8192, 0, 2};
  m.transfers["L1.core_attn"] = {1, 1, 4096, 4096};
  m.transfers["L0.gdn_core_attn"] = {2, 2, 100, 100};
  return m;
}

TEST(Metrics, LineFollowsTheDocumentedSchemaExactly) {
  EXPECT_EQ(metricsJson(sample()),
            "{\"step\":12,\"backend\":\"host\",\"device\":\"CPU\","
            "\"loss\":3.25,\"grad_norm\":0.5,\"lr\":0.0003,"
            "\"step_time_s\":0.125,\"tokens_per_s\":32768,"
            "\"device_peak_bytes\":1234567,\"planned_peak_bytes\":1200000,"
            "\"pinned_pool\":{\"buffers\":2,\"bytes\":8192,\"in_use\":0},"
            "\"transfers\":{"
            "\"L0.gdn_core_attn\":{\"d2h_count\":2,\"h2d_count\":2,\"d2h_"
            "bytes\":100,\"h2d_bytes\":100},"
            "\"L1.core_attn\":{\"d2h_count\":1,\"h2d_count\":1,\"d2h_bytes\":"
            "4096,\"h2d_bytes\":4096}}}");
}

TEST(Metrics, FreeMemoryAtStartFollowsThePlannedPeakWhenMeasured) {
  StepMetrics m = sample();
  std::string plain = metricsJson(m);
  EXPECT_EQ(plain.find("device_free_at_start_bytes"), std::string::npos);
  m.deviceFreeAtStartBytes = 84460896256ull;
  std::string with = metricsJson(m);
  EXPECT_NE(with.find("\"planned_peak_bytes\":1200000,"
                      "\"device_free_at_start_bytes\":84460896256,"
                      "\"pinned_pool\":"),
            std::string::npos)
      << with;
}

TEST(Metrics, FingerprintsAppearOnlyWhenRequested) {
  StepMetrics m = sample();
  m.transfers.clear();
  std::string plain = metricsJson(m);
  EXPECT_EQ(plain.find("fingerprints"), std::string::npos);
  EXPECT_NE(plain.find("\"transfers\":{}}"), std::string::npos) << plain;
  m.fingerprints = Fingerprints{sha256Hex("a", 1), sha256Hex("b", 1),
                                sha256Hex("c", 1), sha256Hex("d", 1)};
  std::string with = metricsJson(m);
  EXPECT_NE(with.find(",\"fingerprints\":{\"loss\":\"" + sha256Hex("a", 1) +
                      "\",\"grads\":\"" + sha256Hex("b", 1) +
                      "\",\"params\":\"" + sha256Hex("c", 1) +
                      "\",\"optimizer\":\"" + sha256Hex("d", 1) + "\"}}"),
            std::string::npos)
      << with;
}

TEST(Metrics, EvalLossFollowsTheLossWhenMeasured) {
  StepMetrics m = sample();
  EXPECT_EQ(metricsJson(m).find("eval_loss"), std::string::npos);
  m.evalLoss = 2.5;
  std::string with = metricsJson(m);
  EXPECT_NE(with.find(",\"loss\":3.25,\"eval_loss\":2.5,\"grad_norm\""),
            std::string::npos)
      << with;
}

TEST(Metrics, NumbersReadBackExactlyAndNonFiniteIsNull) {
  EXPECT_EQ(jsonNumber(0.1), "0.1");
  EXPECT_EQ(jsonNumber(-2), "-2");
  EXPECT_EQ(jsonNumber(1e300), "1e+300");
  EXPECT_EQ(jsonNumber(std::nan("")), "null");
  EXPECT_EQ(jsonNumber(std::numeric_limits<double>::infinity()), "null");
  std::mt19937_64 gen(3);
  for (int i = 0; i < 2000; ++i) {
    uint64_t bits = gen();
    double v;
    std::memcpy(&v, &bits, sizeof(v));
    if (!std::isfinite(v))
      continue;
    std::string text = jsonNumber(v);
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), v) << text;
  }
  // A float loss widened to double keeps its exact value.
  float loss = 2.7182817f;
  EXPECT_EQ(static_cast<float>(std::strtod(jsonNumber(loss).c_str(), nullptr)),
            loss);
  StepMetrics m = sample();
  m.loss = std::nan("");
  EXPECT_NE(metricsJson(m).find("\"loss\":null"), std::string::npos);
}

TEST(Metrics, ScopeNamesAreEscaped) {
  EXPECT_EQ(jsonQuote("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\u0001\"");
  StepMetrics m = sample();
  m.transfers.clear();
  m.transfers["we\"ird"] = {};
  EXPECT_NE(metricsJson(m).find("\"we\\\"ird\":{"), std::string::npos);
}

TEST(Metrics, WriterAppendsOneLinePerStep) {
  std::string path = ::testing::TempDir() + "/actplace_metrics_test.jsonl";
  std::remove(path.c_str());
  {
    MetricsWriter w(path);
    ASSERT_TRUE(w.enabled());
    StepMetrics m = sample();
    w.write(m);
    m.step = 13;
    w.write(m);
  }
  {
    MetricsWriter again(path); // appends, never truncates a run's log
    StepMetrics m = sample();
    m.step = 14;
    again.write(m);
  }
  std::ifstream in(path);
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line))
    lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], metricsJson(sample()));
  EXPECT_EQ(lines[2].rfind("{\"step\":14,", 0), 0u);
  MetricsWriter off("");
  EXPECT_FALSE(off.enabled());
  off.write(sample());
  EXPECT_RT_ERROR(MetricsWriter("/nonexistent-dir/x.jsonl"), "cannot open");
}

TEST(Progress, TextShowsRateAndEta) {
  StepMetrics m = sample();
  m.tokensPerS = 1234567.4;
  EXPECT_EQ(progressText(m, 100), "step 12/100  loss 3.2500  lr 3.00e-04  "
                                  "0.125 s/step  1,234,567 tok/s  ETA 11s");
  m.stepTimeS = 2;
  EXPECT_NE(progressText(m, 100).find("ETA 2m56s"), std::string::npos);
  m.step = 100;
  EXPECT_EQ(progressText(m, 100).find("ETA"), std::string::npos);
}

TEST(Progress, NonTerminalOutputIsThrottled) {
  std::FILE *f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressLine line(5, f, /*intervalS=*/3600);
    StepMetrics m = sample();
    for (int s = 1; s <= 5; ++s) {
      m.step = s;
      line.update(m);
    }
    line.finish();
  }
  std::rewind(f);
  char buf[4096] = {};
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  std::string out(buf, n);
  // First and last step only; no carriage returns in a log file.
  EXPECT_NE(out.find("step 1/5"), std::string::npos) << out;
  EXPECT_NE(out.find("step 5/5"), std::string::npos) << out;
  EXPECT_EQ(out.find("step 3/5"), std::string::npos) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos);
}

using FingerprintTest = BackendTest;

/// The documented digest, written out: SHA-256 over the SHA-256 of every
/// 16 MiB leaf of every range, in order.
std::string
leafDigest(const std::vector<std::pair<const uint8_t *, size_t>> &ranges) {
  const size_t leaf = 16 << 20;
  Sha256 root;
  for (auto [p, n] : ranges)
    for (size_t done = 0; done == 0 || done < n; done += leaf) {
      Sha256 one;
      one.update(p + done, std::min(leaf, n - done));
      auto d = one.finish();
      root.update(d.data(), d.size());
      if (n == 0)
        break;
    }
  return Sha256::hex(root.finish());
}

TEST_P(FingerprintTest, DigestCoversDeviceAndHostBytesInOrder) {
  // Larger than one 16 MiB leaf, odd size, random content, and more leaves
  // than one parallel group on any machine (> 16).
  const size_t n = (17 << 20) + 3;
  auto bytes = randomBytes(n, 11);
  auto small = randomBytes(1000, 12);
  device->allocateArena(n);
  device->copyAsync(device->at(0, n), bytes.data(), n, CopyKind::HostToDevice,
                    Stream::Compute);
  PinnedPool pool(*device, PinnedLayout{});
  std::string got =
      fingerprint(*device, pool,
                  {{device->at(0, n), n, true}, {small.data(), 1000, false}});
  EXPECT_EQ(got, leafDigest({{bytes.data(), n}, {small.data(), small.size()}}));
  EXPECT_EQ(pool.stats().inUse, 0u);
  // Reused staging: a second fingerprint allocates nothing new.
  uint64_t allocations = pool.stats().allocations;
  std::string again = fingerprint(*device, pool, {{device->at(0, n), n, true}});
  EXPECT_EQ(again, leafDigest({{bytes.data(), n}}));
  EXPECT_EQ(pool.stats().allocations, allocations);
  // One flipped bit changes the digest; so does the order of the ranges.
  bytes[n / 2] ^= 1;
  EXPECT_NE(leafDigest({{bytes.data(), n}}), again);
  EXPECT_NE(
      fingerprint(*device, pool,
                  {{small.data(), 1000, false}, {device->at(0, n), n, true}}),
      got);
  // Many leaves (more than one parallel group of 16): 40 small host ranges.
  std::vector<ByteRange> many;
  std::vector<std::pair<const uint8_t *, size_t>> manyRef;
  for (size_t i = 0; i < 40; ++i) {
    many.push_back({small.data() + i, 900, false});
    manyRef.push_back({small.data() + i, 900});
  }
  EXPECT_EQ(fingerprint(*device, pool, many), leafDigest(manyRef));
}

TEST_P(FingerprintTest, RuntimePartOfTheLineComesFromDevicePoolAndEngine) {
  device->allocateArena(1 << 20);
  PinnedPool pool(*device, PinnedLayout{1 << 16, {{0, 1 << 16}}});
  OffloadEngine engine(*device, pool);
  auto scope = engine.scope("L0.core_attn");
  EventId produced = device->createEvent(), d2h = device->createEvent(),
          h2d = device->createEvent();
  device->memsetAsync(device->at(0, 4096), 1, 4096, Stream::Compute);
  device->record(produced, Stream::Compute);
  engine.offload(scope, 0, device->at(0, 4096), 4096, produced, d2h);
  engine.reload(scope, 0, device->at(4096, 4096), 4096, d2h, h2d);
  device->synchronize();
  StepMetrics m;
  collectRuntimeMetrics(m, *device, pool, &engine);
  // The backend and device that ran are on every line.
  EXPECT_EQ(m.backend, deviceKindName(GetParam()));
  EXPECT_EQ(m.device, device->deviceName());
  EXPECT_EQ(m.device, GetParam() == DeviceKind::Host ? "CPU" : m.device);
  EXPECT_FALSE(m.device.empty());
  EXPECT_EQ(metricsJson(m).rfind("{\"step\":0,\"backend\":\"" + m.backend +
                                     "\",\"device\":\"" + m.device + "\",",
                                 0),
            0u)
      << metricsJson(m);
  EXPECT_GE(m.devicePeakBytes, 1u << 20);
  EXPECT_EQ(m.pinnedPool.buffers, 1u);
  EXPECT_EQ(m.pinnedPool.bytes, 1u << 16);
  EXPECT_EQ(m.pinnedPool.inUse, 0u);
  ASSERT_EQ(m.transfers.size(), 1u);
  EXPECT_EQ(m.transfers["L0.core_attn"], (TransferCounters{1, 1, 4096, 4096}));
  EXPECT_NE(metricsJson(m).find(
                "\"transfers\":{\"L0.core_attn\":{\"d2h_count\":1,"
                "\"h2d_count\":1,\"d2h_bytes\":4096,\"h2d_bytes\":4096}}"),
            std::string::npos);
  collectRuntimeMetrics(m, *device, pool, nullptr);
  EXPECT_TRUE(m.transfers.empty());
}

AP_RT_INSTANTIATE_BACKENDS(FingerprintTest);

} // namespace
