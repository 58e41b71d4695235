//===- data_test.cpp - Data sources, layout, determinism, resume ----------===//
#include "runtime/data.h"

#include "runtime/error.h"
#include "runtime/rng.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <unistd.h>
#include <vector>

using namespace ap::rt;

namespace {

std::string tempPath(const std::string &name) {
  return ::testing::TempDir() + "/ap_data_" + std::to_string(::getpid()) + "_" +
         name;
}

template <typename T>
std::string writeTokens(const std::string &name, const std::vector<T> &ids) {
  std::string p = tempPath(name);
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char *>(ids.data()), ids.size() * sizeof(T));
  return p;
}

DataConfig baseConfig() {
  DataConfig c;
  c.vocabSize = 1000;
  c.seed = 11;
  c.batch = 3;
  c.seqLen = 8;
  c.microbatchesPerStep = 2;
  return c;
}

TEST(Data, SyntheticLayoutAndDeterminism) {
  DataLoader dl(baseConfig());
  size_t n = dl.microbatchElements();
  ASSERT_EQ(n, 24u);
  std::vector<int32_t> raw(3 * 9), tok(n), lab(n), tok2(n), lab2(n);
  dl.fillRaw(5, 1, raw.data());
  dl.fill(5, 1, tok.data(), lab.data());
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(tok[b * 8 + t], raw[b * 9 + t]);
      EXPECT_EQ(lab[b * 8 + t], raw[b * 9 + t + 1]);
      EXPECT_GE(tok[b * 8 + t], 0);
      EXPECT_LT(tok[b * 8 + t], 1000);
    }
  // Another loader with the same config gives the same microbatch.
  DataLoader again(baseConfig());
  again.fill(5, 1, tok2.data(), lab2.data());
  EXPECT_EQ(tok, tok2);
  EXPECT_EQ(lab, lab2);
  // Each of step, microbatch, rank and seed changes the data.
  dl.fill(6, 1, tok2.data(), lab2.data());
  EXPECT_NE(tok, tok2);
  dl.fill(5, 0, tok2.data(), lab2.data());
  EXPECT_NE(tok, tok2);
  DataConfig r1 = baseConfig();
  r1.rank = 1;
  r1.worldSize = 2;
  DataLoader(r1).fill(5, 1, tok2.data(), lab2.data());
  EXPECT_NE(tok, tok2);
  DataConfig s2 = baseConfig();
  s2.seed = 12;
  DataLoader(s2).fill(5, 1, tok2.data(), lab2.data());
  EXPECT_NE(tok, tok2);
  EXPECT_THROW(dl.fill(5, 2, tok2.data(), lab2.data()), Error);
}

// Packed sequences: a label whose token is the document separator becomes
// the ignored label; nothing else changes.
TEST(Data, DocumentSeparatorIgnoresTheSeparatorsLabel) {
  DataConfig plain = baseConfig();
  plain.vocabSize = 4; // separators are frequent
  DataConfig packed = plain;
  packed.documentSeparator = 2;
  packed.ignoreIndex = -7;
  DataLoader a(plain), b(packed);
  size_t n = a.microbatchElements();
  std::vector<int32_t> ta(n), la(n), tb(n), lb(n);
  int masked = 0;
  for (int mb = 0; mb < 4; ++mb) {
    a.next(ta.data(), la.data());
    b.next(tb.data(), lb.data());
    ASSERT_EQ(ta, tb);
    for (size_t i = 0; i < n; ++i) {
      if (tb[i] == 2) {
        EXPECT_EQ(lb[i], -7) << "microbatch " << mb << " token " << i;
        ++masked;
      } else {
        EXPECT_EQ(lb[i], la[i]) << "microbatch " << mb << " token " << i;
      }
    }
  }
  EXPECT_GT(masked, 0);
}

TEST(Data, ResumeFromCursorMatchesUninterruptedRun) {
  DataConfig c = baseConfig();
  size_t n = size_t(c.batch * c.seqLen);
  DataLoader full(c);
  std::vector<std::vector<int32_t>> ref;
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> t(n), l(n);
    full.next(t.data(), l.data());
    ref.push_back(t);
    ref.push_back(l);
  }
  DataLoader first(c);
  std::vector<int32_t> t(n), l(n);
  for (int i = 0; i < 3; ++i)
    first.next(t.data(), l.data());
  DataCursor cur = first.cursor();
  EXPECT_EQ(cur.step, 1u);
  EXPECT_EQ(cur.microbatch, 1u);
  std::string saved = cur.serialize();
  DataLoader resumed(c);
  resumed.restore(DataCursor::deserialize(saved));
  for (int i = 3; i < 10; ++i) {
    resumed.next(t.data(), l.data());
    EXPECT_EQ(t, ref[2 * i]) << "microbatch " << i;
    EXPECT_EQ(l, ref[2 * i + 1]) << "microbatch " << i;
  }
  // A cursor from another layout is refused.
  DataConfig other = c;
  other.seqLen = 9;
  DataLoader wrong(other);
  EXPECT_THROW(wrong.restore(cur), Error);
  EXPECT_THROW(DataCursor::deserialize("step=1;microbatch=0"), Error);
  EXPECT_THROW(DataCursor::deserialize("step=1;microbatch=0;source=abc"),
               Error);
}

TEST(Data, TokenFileSequentialWindows) {
  // ids 0..99 as uint16: window w covers [w*T, w*T+T].
  std::vector<uint16_t> ids(100);
  for (int i = 0; i < 100; ++i)
    ids[i] = uint16_t(i * 7 % 100);
  std::string p = writeTokens("seq.bin", ids);
  DataConfig c = baseConfig();
  parseDataSource("tokens:" + p, c);
  c.batch = 2;
  c.seqLen = 10;
  c.worldSize = 2;
  c.rank = 1;
  DataLoader dl(c);
  EXPECT_EQ(dl.numTokens(), 100u);
  std::vector<int32_t> t(20), l(20);
  // Step 1, microbatch 1, rank 1: samples ((1*2+1)*2+1)*2 = 14, 15; 9
  // windows per epoch ((100-1)/10) -> windows 5 and 6.
  dl.fill(1, 1, t.data(), l.data());
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 10; ++i) {
      int start = (5 + b) * 10;
      EXPECT_EQ(t[b * 10 + i], ids[start + i]);
      EXPECT_EQ(l[b * 10 + i], ids[start + i + 1]);
    }
  // Rank 0 of the same microbatch reads the two windows before.
  DataConfig c0 = c;
  c0.rank = 0;
  std::vector<int32_t> t0(20), l0(20);
  DataLoader(c0).fill(1, 1, t0.data(), l0.data());
  EXPECT_EQ(t0[0], ids[30]);
  EXPECT_EQ(t0[10], ids[40]);
  std::remove(p.c_str());
}

TEST(Data, AnotherMicrobatchSplitReadsTheSameSequences) {
  std::vector<uint16_t> ids(400);
  for (int i = 0; i < 400; ++i)
    ids[i] = uint16_t(i * 13 % 1000);
  std::string p = writeTokens("split.bin", ids);
  DataConfig a = baseConfig();
  parseDataSource("tokens:" + p, a);
  a.batch = 2;
  a.microbatchesPerStep = 2;
  DataConfig b = a;
  b.batch = 4;
  b.microbatchesPerStep = 1;
  DataLoader la(a), lb(b);
  // Same global batch: one source id, so a cursor carries over.
  EXPECT_EQ(la.cursor().sourceId, lb.cursor().sourceId);
  DataCursor at = la.cursor();
  at.step = 3;
  lb.restore(at);
  size_t T = size_t(a.seqLen);
  std::vector<int32_t> ta(4 * T), tmp(4 * T), tb(4 * T);
  la.fill(3, 0, ta.data(), tmp.data());
  la.fill(3, 1, ta.data() + 2 * T, tmp.data());
  lb.next(tb.data(), tmp.data());
  EXPECT_EQ(ta, tb);
  // Another global batch is another stream.
  DataConfig c = a;
  c.batch = 3;
  EXPECT_NE(DataLoader(c).cursor().sourceId, la.cursor().sourceId);
  // The description names the content, not the path.
  std::string copy = writeTokens("split-copy.bin", ids);
  DataConfig d = a;
  parseDataSource("tokens:" + copy, d);
  EXPECT_EQ(DataLoader(d).sourceDescription(), la.sourceDescription());
  EXPECT_EQ(la.sourceDescription().rfind("tokens16, 800 bytes, sha256 ", 0), 0u)
      << la.sourceDescription();
  EXPECT_EQ(DataLoader(baseConfig()).sourceDescription(), "synthetic");
  std::remove(p.c_str());
  std::remove(copy.c_str());
}

TEST(Data, RankSplitOfAGlobalBatchReadsTheSameSequences) {
  // The global batch of a step, M microbatches on each of N ranks, is the
  // same sequences as M*N microbatches on one rank: microbatch m of rank r
  // reads what microbatch m*N+r reads alone. Both sources; file windows
  // also sequential and shuffled.
  std::vector<uint16_t> ids(600);
  for (int i = 0; i < 600; ++i)
    ids[i] = uint16_t(i * 17 % 1000);
  std::string p = writeTokens("ranks.bin", ids);
  for (std::string spec : {std::string("synthetic"), "tokens:" + p}) {
    for (bool shuffle : {false, true}) {
      DataConfig one = baseConfig();
      parseDataSource(spec, one);
      one.shuffle = shuffle;
      one.microbatchesPerStep = 4;
      DataLoader alone(one);
      size_t n = alone.microbatchElements();
      for (uint32_t world : {2u, 4u}) {
        for (uint32_t rank = 0; rank < world; ++rank) {
          DataConfig c = one;
          c.microbatchesPerStep = 4 / world;
          c.worldSize = world;
          c.rank = rank;
          DataLoader part(c);
          EXPECT_EQ(part.cursor().sourceId, alone.cursor().sourceId);
          for (uint64_t step : {0u, 3u})
            for (uint32_t mb = 0; mb < c.microbatchesPerStep; ++mb) {
              std::vector<int32_t> a(n), b(n), l(n);
              part.fill(step, mb, a.data(), l.data());
              alone.fill(step, mb * world + rank, b.data(), l.data());
              EXPECT_EQ(a, b) << spec << " shuffle " << shuffle << " world "
                              << world << " rank " << rank << " step " << step
                              << " microbatch " << mb;
            }
        }
      }
    }
  }
  // A world of one keys synthetic tokens by (seed, step, microbatch) with
  // rank 0, as before ranks existed: the golden fingerprints of the e2e
  // tests depend on it.
  DataConfig c = baseConfig();
  DataLoader dl(c);
  std::vector<int32_t> raw(3 * 9), want(3 * 9);
  dl.fillRaw(5, 1, raw.data());
  PhiloxStream(RngKey{c.seed, 5, 1, 0, kSyntheticTokenStream})
      .fillTokens(want.data(), want.size(), c.vocabSize);
  EXPECT_EQ(raw, want);
  std::remove(p.c_str());
}

TEST(Data, ContentDigestOfLargeFilesSamplesBlocks) {
  // Whole below the limit: any byte counts.
  std::vector<uint8_t> small(1000, 7);
  std::string d0 = DataLoader::contentDigest(small.data(), small.size());
  small[500] = 8;
  EXPECT_NE(DataLoader::contentDigest(small.data(), small.size()), d0);
  // Above it: the evenly spaced blocks (first and last included) count,
  // the bytes between them do not.
  size_t n = DataLoader::kWholeDigestBytes + 3 * DataLoader::kDigestBlockBytes;
  std::vector<uint8_t> big(n, 1);
  std::string b0 = DataLoader::contentDigest(big.data(), n);
  big[n - 1] = 2;
  std::string b1 = DataLoader::contentDigest(big.data(), n);
  EXPECT_NE(b1, b0);
  big[0] = 2;
  EXPECT_NE(DataLoader::contentDigest(big.data(), n), b1);
  std::string b2 = DataLoader::contentDigest(big.data(), n);
  big[DataLoader::kDigestBlockBytes + 10] = 9; // before the second block
  EXPECT_EQ(DataLoader::contentDigest(big.data(), n), b2);
}

TEST(Data, TokenFile32AndShuffle) {
  std::vector<uint32_t> ids(1000);
  for (int i = 0; i < 1000; ++i)
    ids[i] = uint32_t(70000 + i);
  std::string p = writeTokens("u32.bin", ids);
  DataConfig c = baseConfig();
  c.vocabSize = 80000;
  parseDataSource("tokens32:" + p, c);
  c.shuffle = true;
  DataLoader dl(c);
  std::vector<int32_t> t(24), l(24), t2(24), l2(24);
  dl.fill(3, 0, t.data(), l.data());
  DataLoader(c).fill(3, 0, t2.data(), l2.data());
  EXPECT_EQ(t, t2);
  for (int b = 0; b < 3; ++b) {
    // Each row is a contiguous window starting at a multiple of T.
    int start = t[b * 8] - 70000;
    EXPECT_EQ(start % 8, 0);
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(t[b * 8 + i], 70000 + start + i);
      EXPECT_EQ(l[b * 8 + i], 70000 + start + i + 1);
    }
  }
  dl.fill(4, 0, t2.data(), l2.data());
  EXPECT_NE(t, t2);
  // The same file with a vocabulary that is too small: a clear error.
  DataConfig small = c;
  small.vocabSize = 1000;
  DataLoader bad(small);
  try {
    bad.fill(0, 0, t.data(), l.data());
    FAIL() << "expected an out-of-vocabulary error";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"),
              std::string::npos)
        << e.what();
  }
  // Reading it as uint16 works (even byte count) but a 3-byte file does not.
  std::string odd = writeTokens("odd.bin", std::vector<uint8_t>{1, 2, 3});
  DataConfig oc = baseConfig();
  parseDataSource("tokens16:" + odd, oc);
  EXPECT_THROW(DataLoader x(oc), Error);
  std::remove(p.c_str());
  std::remove(odd.c_str());
}

TEST(Data, ShuffleVisitsEveryWindowOncePerEpoch) {
  std::vector<uint32_t> ids(1000);
  for (int i = 0; i < 1000; ++i)
    ids[i] = uint32_t(i);
  std::string p = writeTokens("perm.bin", ids);
  DataConfig c = baseConfig(); // B = 3, T = 8, 2 microbatches
  parseDataSource("tokens32:" + p, c);
  c.shuffle = true;
  DataLoader dl(c);
  const uint64_t W = 999 / 8; // windows per epoch
  ASSERT_EQ(W, 124u);
  // Window of every sample, in sample order, over two epochs and a bit.
  std::vector<uint64_t> windows;
  std::vector<int32_t> raw(3 * 9);
  for (uint64_t step = 0; windows.size() < 2 * W + 6; ++step)
    for (uint32_t mb = 0; mb < 2; ++mb) {
      dl.fillRaw(step, mb, raw.data());
      for (int b = 0; b < 3; ++b) {
        ASSERT_EQ(raw[b * 9] % 8, 0);
        windows.push_back(uint64_t(raw[b * 9]) / 8);
      }
    }
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<uint64_t> e(windows.begin() + epoch * W,
                            windows.begin() + (epoch + 1) * W);
    std::vector<uint64_t> sorted = e;
    std::sort(sorted.begin(), sorted.end());
    for (uint64_t w = 0; w < W; ++w)
      ASSERT_EQ(sorted[w], w) << "epoch " << epoch;
    int inPlace = 0;
    for (uint64_t w = 0; w < W; ++w)
      inPlace += e[w] == w;
    EXPECT_LT(inPlace, 10) << "epoch " << epoch << " looks unshuffled";
  }
  EXPECT_FALSE(
      std::equal(windows.begin(), windows.begin() + W, windows.begin() + W))
      << "two epochs in the same order";
  // Two data-parallel ranks of one step read disjoint windows.
  DataConfig r0 = c, r1 = c;
  r0.worldSize = r1.worldSize = 2;
  r1.rank = 1;
  std::vector<int32_t> a(27), b(27);
  DataLoader(r0).fillRaw(4, 1, a.data());
  DataLoader(r1).fillRaw(4, 1, b.data());
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      EXPECT_NE(a[i * 9], b[j * 9]);
  std::remove(p.c_str());
}

TEST(Data, ByteTextAndErrors) {
  std::string text = "The quick brown fox jumps over the lazy dog. ";
  std::string all;
  for (int i = 0; i < 4; ++i)
    all += text;
  std::string p = tempPath("text.txt");
  std::ofstream(p) << all;
  DataConfig c = baseConfig();
  parseDataSource("text:" + p, c);
  c.batch = 1;
  c.seqLen = 16;
  c.microbatchesPerStep = 1;
  DataLoader dl(c);
  std::vector<int32_t> t(16), l(16);
  dl.fill(0, 0, t.data(), l.data());
  EXPECT_EQ(byteDecode(t.data(), 16), all.substr(0, 16));
  EXPECT_EQ(byteDecode(l.data(), 16), all.substr(1, 16));
  dl.fill(1, 0, t.data(), l.data());
  EXPECT_EQ(byteDecode(t.data(), 16), all.substr(16, 16));
  EXPECT_EQ(byteEncode("A\xff"), (std::vector<int32_t>{65, 255}));

  DataConfig tiny = c;
  tiny.vocabSize = 100;
  EXPECT_THROW(DataLoader x(tiny), Error); // bytes need 256 ids
  DataConfig missing = baseConfig();
  parseDataSource("text:/nonexistent/file.txt", missing);
  EXPECT_THROW(DataLoader x(missing), Error);
  DataConfig shortFile = c;
  shortFile.seqLen = 1000;
  EXPECT_THROW(DataLoader x(shortFile), Error);
  DataConfig any;
  EXPECT_THROW(parseDataSource("csv:x", any), Error);
  EXPECT_THROW(parseDataSource("tokens:", any), Error);
  std::remove(p.c_str());
}

} // namespace
