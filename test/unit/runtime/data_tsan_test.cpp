//===- data_tsan_test.cpp - Concurrent microbatch reads under TSan --------===//
//
// DataLoader::fill is documented const and thread-safe (prefetch threads read
// microbatches while the step runs): concurrent fills must equal sequential
// ones and raise no TSan report.
//
//===----------------------------------------------------------------------===//
#include "runtime/data.h"

#include <gtest/gtest.h>

#include <fstream>
#include <thread>
#include <unistd.h>

using namespace ap::rt;

namespace {

TEST(DataTsan, ConcurrentFillsMatchSequential) {
  std::string p = ::testing::TempDir() + "/ap_data_tsan_" +
                  std::to_string(::getpid()) + ".bin";
  {
    std::vector<uint16_t> ids(5000);
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = uint16_t((i * 31) % 1000);
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char *>(ids.data()), ids.size() * 2);
  }
  for (const char *spec : {"synthetic", "tokens:"}) {
    DataConfig c;
    parseDataSource(
        std::string(spec) == "synthetic" ? "synthetic" : "tokens:" + p, c);
    c.vocabSize = 1000;
    c.batch = 4;
    c.seqLen = 32;
    c.microbatchesPerStep = 4;
    DataLoader dl(c);
    const size_t n = dl.microbatchElements();
    std::vector<std::vector<int32_t>> seq(16, std::vector<int32_t>(n)),
        par(16, std::vector<int32_t>(n));
    std::vector<int32_t> labels(n);
    for (int i = 0; i < 16; ++i)
      dl.fill(uint64_t(i / 4), uint32_t(i % 4), seq[i].data(), labels.data());
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        std::vector<int32_t> lab(n);
        for (int i = t; i < 16; i += 4)
          dl.fill(uint64_t(i / 4), uint32_t(i % 4), par[i].data(), lab.data());
      });
    for (auto &th : threads)
      th.join();
    EXPECT_EQ(seq, par) << spec;
  }
  std::remove(p.c_str());
}

} // namespace
