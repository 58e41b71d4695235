//===- rng_test.cpp - Philox known answers, keys, init kinds --------------===//
#include "runtime/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

using namespace ap::rt;
using ap::kernels::bf16;
using ap::kernels::DType;

namespace {

// Random123 kat_vectors, "philox4x32 10" lines: counter, key -> output.
TEST(Philox, KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu,
                                     0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u,
                                     0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u,
                                     0x24126ea1u}));
}

std::vector<uint32_t> words(const RngKey &k, size_t n, uint64_t off = 0) {
  std::vector<uint32_t> w(n);
  PhiloxStream(k).fillWords(w.data(), n, off);
  return w;
}

TEST(Philox, ReproducibleAndChunkingInvariant) {
  RngKey k{1234, 7, 2, 1, 99};
  std::vector<uint32_t> a = words(k, 1001);
  EXPECT_EQ(a, words(k, 1001));
  // Any window equals the corresponding slice (odd offsets too).
  for (uint64_t off : {1u, 3u, 4u, 517u}) {
    std::vector<uint32_t> part = words(k, 100, off);
    for (size_t i = 0; i < part.size(); ++i)
      ASSERT_EQ(part[i], a[off + i]) << "offset " << off << " i " << i;
  }
  PhiloxStream s(k);
  EXPECT_EQ(s.word(999), a[999]);
}

TEST(Philox, KeysAreIndependent) {
  RngKey base{1234, 7, 2, 1, 99};
  std::vector<RngKey> keys = {base};
  auto vary = [&](auto mutate) {
    RngKey k = base;
    mutate(k);
    keys.push_back(k);
  };
  vary([](RngKey &k) { k.seed = 1235; });
  vary([](RngKey &k) { k.step = 8; });
  vary([](RngKey &k) { k.microbatch = 3; });
  vary([](RngKey &k) { k.rank = 0; });
  vary([](RngKey &k) { k.stream = 100; });
  vary([](RngKey &k) { k.stream = 99ull | (1ull << 40); });
  // Fields must not alias each other (e.g. swapping rank and microbatch).
  vary([](RngKey &k) { std::swap(k.rank, k.microbatch); });
  std::set<std::vector<uint32_t>> seen;
  std::vector<std::vector<uint32_t>> streams;
  for (const RngKey &k : keys)
    streams.push_back(words(k, 64));
  for (size_t i = 0; i < streams.size(); ++i) {
    EXPECT_TRUE(seen.insert(streams[i]).second) << "key " << i << " repeats";
    // Independent streams agree in about 1/2^32 of positions: allow none.
    for (size_t j = 0; j < i; ++j) {
      int same = 0;
      for (size_t t = 0; t < 64; ++t)
        same += streams[i][t] == streams[j][t];
      EXPECT_EQ(same, 0) << "keys " << i << " and " << j;
    }
  }
  // Each bit is set about half the time across a long stream.
  std::vector<uint32_t> w = words(base, 1 << 16);
  for (int bit = 0; bit < 32; ++bit) {
    size_t ones = 0;
    for (uint32_t x : w)
      ones += (x >> bit) & 1u;
    double frac = double(ones) / double(w.size());
    EXPECT_NEAR(frac, 0.5, 0.01) << "bit " << bit;
  }
}

TEST(Philox, StepOutOfRangeThrows) {
  RngKey k;
  k.step = 1ull << 32;
  EXPECT_THROW(PhiloxStream s(k), std::invalid_argument);
}

TEST(Philox, UniformAndNormalMoments) {
  PhiloxStream s(RngKey{42, 0, 0, 0, 5});
  const size_t n = 200000;
  std::vector<float> u(n), z(n);
  s.fillUniform(u.data(), n, -2.0f, 3.0f);
  s.fillNormal(z.data(), n, 1.5f, 0.25f);
  double mu = 0, mz = 0, vz = 0;
  float umin = 1e9f, umax = -1e9f;
  for (size_t i = 0; i < n; ++i) {
    mu += u[i];
    mz += z[i];
    umin = std::min(umin, u[i]);
    umax = std::max(umax, u[i]);
  }
  mu /= n;
  mz /= n;
  for (float v : z)
    vz += (v - mz) * (v - mz);
  vz /= n;
  EXPECT_GE(umin, -2.0f);
  EXPECT_LT(umax, 3.0f);
  EXPECT_NEAR(mu, 0.5, 0.02);  // 5 / sqrt(12 n) ~ 0.0032: 6 sigma
  EXPECT_NEAR(mz, 1.5, 0.004); // 0.25 / sqrt(n) ~ 0.00056
  EXPECT_NEAR(std::sqrt(vz), 0.25, 0.003);
  // Box-Muller pairs: a shard starting at an even offset matches the slice.
  std::vector<float> part(101);
  s.fillNormal(part.data(), part.size(), 1.5f, 0.25f, 5000);
  for (size_t i = 0; i < part.size(); ++i)
    ASSERT_EQ(part[i], z[5000 + i]);
  EXPECT_THROW(s.fillNormal(part.data(), 4, 0, 1, 3), std::invalid_argument);
  // Standard normal tail mass beyond 3 sigma is 0.27%.
  size_t tail = 0;
  for (float v : z)
    tail += std::fabs((v - 1.5f) / 0.25f) > 3.0f;
  EXPECT_NEAR(double(tail) / n, 0.0027, 0.0008);
}

TEST(Philox, Tokens) {
  PhiloxStream s(RngKey{1, 2, 3, 0, kSyntheticTokenStream});
  std::vector<int32_t> t(100000);
  s.fillTokens(t.data(), t.size(), 1000);
  std::vector<int> hist(1000, 0);
  for (int32_t v : t) {
    ASSERT_GE(v, 0);
    ASSERT_LT(v, 1000);
    ++hist[v];
  }
  int empty = 0;
  for (int h : hist)
    empty += h == 0;
  EXPECT_EQ(empty, 0); // 100 expected per bin
  EXPECT_THROW(s.fillTokens(t.data(), 1, 0), std::invalid_argument);
}

TEST(Init, Kinds) {
  RngKey k = paramInitKey(7, "layers.0.gdn.A_log");
  const size_t n = 4096;
  std::vector<float> f(n);
  initParameter(InitSpec::zeros(), k, DType::F32, f.data(), n);
  for (float v : f)
    ASSERT_EQ(v, 0.0f);
  initParameter(InitSpec::ones(), k, DType::F32, f.data(), n);
  for (float v : f)
    ASSERT_EQ(v, 1.0f);
  initParameter(InitSpec::logUniform(1.0, 16.0), k, DType::F32, f.data(), n);
  // A_log = log(A), A ~ U(1, 16): within [0, log 16), mean of log U(1,16) is
  // (16 ln 16 - 16 - (0 - 1)) / 15 = 1.9574.
  double mean = 0;
  for (float v : f) {
    ASSERT_GE(v, 0.0f);
    ASSERT_LT(v, std::log(16.0f) + 1e-6f);
    mean += v;
  }
  EXPECT_NEAR(mean / n, (16 * std::log(16.0) - 15) / 15, 0.03);
  // log_uniform uses the same words as uniform: exp(value) is the uniform.
  std::vector<float> uni(n);
  initParameter(InitSpec::uniform(1.0, 16.0), k, DType::F32, uni.data(), n);
  for (size_t i = 0; i < n; ++i)
    ASSERT_NEAR(std::exp(double(f[i])), uni[i], 1e-5 * uni[i]);
}

TEST(Init, DtypesAgreeAndShardsMatch) {
  RngKey k = paramInitKey(3, "layers.1.mlp.fc1.weight");
  const size_t n = 10000;
  std::vector<float> f(n);
  std::vector<bf16> h(n);
  std::vector<double> d(n);
  InitSpec spec = InitSpec::normal(0.0, 0.02);
  initParameter(spec, k, DType::F32, f.data(), n);
  initParameter(spec, k, DType::BF16, h.data(), n);
  initParameter(spec, k, DType::F64, d.data(), n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(h[i].bits, bf16(f[i]).bits);
    ASSERT_EQ(d[i], double(f[i]));
  }
  // A tensor-parallel shard [2000, 6000) equals the slice of the full tensor.
  std::vector<float> shard(4000);
  initParameter(spec, k, DType::F32, shard.data(), shard.size(), 2000);
  for (size_t i = 0; i < shard.size(); ++i)
    ASSERT_EQ(shard[i], f[2000 + i]);
  // Another parameter name gives different values.
  std::vector<float> g(n);
  initParameter(spec, paramInitKey(3, "layers.1.mlp.fc2.weight"), DType::F32,
                g.data(), n);
  EXPECT_NE(f, g);
  EXPECT_THROW(initParameter(spec, k, DType::I32, f.data(), 1),
               std::invalid_argument);
}

TEST(Init, ParseAndFormat) {
  for (const char *text : {"zeros", "ones", "normal(0,0.02)", "uniform(-1,1)",
                           "log_uniform(1,16)"}) {
    InitSpec s = parseInitSpec(text);
    InitSpec r = parseInitSpec(formatInitSpec(s));
    EXPECT_EQ(r.kind, s.kind);
    EXPECT_EQ(r.a, s.a);
    EXPECT_EQ(r.b, s.b);
  }
  InitSpec s = parseInitSpec(" normal( 0.5 , 0.25 ) ");
  EXPECT_EQ(s.kind, InitKind::Normal);
  EXPECT_EQ(s.a, 0.5);
  EXPECT_EQ(s.b, 0.25);
  for (const char *bad :
       {"", "gauss(0,1)", "normal(0)", "normal(0,1,2)", "uniform(1,1)",
        "log_uniform(0,1)", "normal(x,1)", "normal(0,-1)", "uniform(0,1"})
    EXPECT_THROW(parseInitSpec(bad), std::invalid_argument) << bad;
}

TEST(RngState, RoundTrip) {
  RngState st{0xfedcba9876543210ull, 123};
  EXPECT_EQ(RngState::deserialize(st.serialize()), st);
  EXPECT_THROW(RngState::deserialize("seed=1"), std::invalid_argument);
  EXPECT_THROW(RngState::deserialize(st.serialize() + "x"),
               std::invalid_argument);
}

TEST(Names, StreamIdsDiffer) {
  EXPECT_NE(streamIdForName("a"), streamIdForName("b"));
  EXPECT_EQ(streamIdForName("layers.0.w"), streamIdForName("layers.0.w"));
  // FNV-1a 64 of "a" (published test value).
  EXPECT_EQ(streamIdForName("a"), 0xaf63dc4c8601ec8cull);
}

} // namespace
