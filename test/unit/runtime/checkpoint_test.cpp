//===- checkpoint_test.cpp - Checkpoint round trip, corruption, mapping ---===//
#include "runtime/checkpoint.h"

#include "kernels/kernels.h"
#include "runtime/error.h"
#include "runtime/json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <thread>
#include <unistd.h>

using namespace ap::rt;
using ap::kernels::bf16;
using ap::kernels::DType;

namespace {

std::string freshDir(const std::string &name) {
  std::string d = ::testing::TempDir() + "/ap_ckpt_" +
                  std::to_string(::getpid()) + "_" + name;
  std::string cmd = "rm -rf '" + d + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return d;
}

void expectError(const std::function<void()> &fn, const std::string &needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what();
  }
}

/// A toy model's full optimizer state: two parameters with bf16 compute
/// copies, fp32 masters and Adam moments, filled from the Philox init.
struct ToyState {
  std::vector<bf16> wq, wn;
  std::vector<float> mq, mn, aq, an, vq, vn;
  explicit ToyState(uint64_t seed) {
    wq.resize(6 * 4);
    wn.resize(4);
    mq.resize(24);
    mn.resize(4);
    aq.resize(24);
    an.resize(4);
    vq.resize(24);
    vn.resize(4);
    initParameter(InitSpec::normal(0, 0.02), paramInitKey(seed, "q"),
                  DType::F32, mq.data(), 24);
    initParameter(InitSpec::uniform(0.5, 1.5), paramInitKey(seed, "n"),
                  DType::F32, mn.data(), 4);
    for (size_t i = 0; i < 24; ++i) {
      wq[i] = bf16(mq[i]);
      aq[i] = mq[i] * 0.1f;
      vq[i] = mq[i] * mq[i];
    }
    for (size_t i = 0; i < 4; ++i) {
      wn[i] = bf16(mn[i]);
      an[i] = -mn[i];
      vn[i] = mn[i] * 3;
    }
  }
  std::vector<CheckpointTensor> tensors() {
    return {
        {paramTensorName("q"), StDType::BF16, {6, 4}, wq.data(), wq.size() * 2},
        {paramTensorName("n"), StDType::BF16, {4}, wn.data(), wn.size() * 2},
        {masterTensorName("q"), StDType::F32, {6, 4}, mq.data(), mq.size() * 4},
        {masterTensorName("n"), StDType::F32, {4}, mn.data(), mn.size() * 4},
        {adamMTensorName("q"), StDType::F32, {6, 4}, aq.data(), aq.size() * 4},
        {adamMTensorName("n"), StDType::F32, {4}, an.data(), an.size() * 4},
        {adamVTensorName("q"), StDType::F32, {6, 4}, vq.data(), vq.size() * 4},
        {adamVTensorName("n"), StDType::F32, {4}, vn.data(), vn.size() * 4},
    };
  }
  bool operator==(const ToyState &o) const {
    auto eqBits = [](const std::vector<bf16> &a, const std::vector<bf16> &b) {
      if (a.size() != b.size())
        return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (a[i].bits != b[i].bits)
          return false;
      return true;
    };
    return eqBits(wq, o.wq) && eqBits(wn, o.wn) && mq == o.mq && mn == o.mn &&
           aq == o.aq && an == o.an && vq == o.vq && vn == o.vn;
  }
};

TrainingState sampleState(uint64_t step) {
  TrainingState st;
  st.step = step;
  st.rng = RngState{99, step};
  DataConfig dc;
  DataLoader dl(dc);
  st.data = dl.cursor();
  st.data.step = step;
  st.extra["lr_schedule"] = "cosine";
  return st;
}

TEST(Checkpoint, RoundTripIsBitExact) {
  std::string dir = freshDir("roundtrip");
  ToyState a(1);
  EXPECT_FALSE(latestCheckpoint(dir).has_value());
  std::string stepDir = saveCheckpoint(dir, a.tensors(), sampleState(100), {});
  EXPECT_EQ(latestCheckpoint(dir), stepDir);
  EXPECT_NE(stepDir.find("step-00000100"), std::string::npos);

  ToyState b(2);
  ASSERT_FALSE(a == b);
  TrainingState st = loadCheckpoint(*latestCheckpoint(dir), b.tensors(), {});
  EXPECT_TRUE(a == b);
  EXPECT_EQ(st.step, 100u);
  EXPECT_EQ(st.rng, (RngState{99, 100}));
  EXPECT_EQ(st.data, sampleState(100).data);
  EXPECT_EQ(st.extra.at("lr_schedule"), "cosine");

  // The file is plain safetensors with the documented names and metadata.
  SafetensorsFile f = SafetensorsFile::open(stepDir + "/model.safetensors");
  EXPECT_EQ(f.meta("format"), "pt");
  EXPECT_EQ(f.meta("actplace.format"), "actplace-checkpoint-v1");
  ASSERT_NE(f.find("train/step"), nullptr);
  EXPECT_EQ(*reinterpret_cast<const int64_t *>(f.data(*f.find("train/step"))),
            100);
  EXPECT_EQ(f.find("param/q")->dtype, StDType::BF16);
  EXPECT_EQ(f.find("adam_v/n")->dtype, StDType::F32);
}

TEST(Checkpoint, CorruptOrTruncatedFileIsRejectedAndBuffersUntouched) {
  std::string dir = freshDir("corrupt");
  ToyState a(1);
  std::string stepDir = saveCheckpoint(dir, a.tensors(), sampleState(5), {});
  std::string file = stepDir + "/model.safetensors";
  std::vector<char> bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ToyState b(2), bCopy(2);
  // Flip one bit of the last master value.
  std::vector<char> bad = bytes;
  bad[bad.size() - 20] ^= 1;
  std::ofstream(file, std::ios::binary).write(bad.data(), bad.size());
  expectError([&] { loadCheckpoint(stepDir, b.tensors(), {}); }, "corrupt");
  EXPECT_TRUE(b == bCopy);
  // Truncate it.
  std::ofstream(file, std::ios::binary).write(bytes.data(), bytes.size() / 2);
  expectError([&] { loadCheckpoint(stepDir, b.tensors(), {}); }, "truncated");
  EXPECT_TRUE(b == bCopy);
}

TEST(Checkpoint, FailedSaveKeepsLastGoodCheckpoint) {
  std::string dir = freshDir("failsave");
  ToyState a(1);
  std::string good = saveCheckpoint(dir, a.tensors(), sampleState(10), {});
  // Save of step 20 dies half-way: latest must still be step 10.
  ToyState c(3);
  SaveOptions crash;
  crash.failAfterBytes = 300;
  expectError(
      [&] { saveCheckpoint(dir, c.tensors(), sampleState(20), {}, crash); },
      "simulated failure");
  EXPECT_EQ(latestCheckpoint(dir), good);
  ToyState b(2);
  loadCheckpoint(*latestCheckpoint(dir), b.tensors(), {});
  EXPECT_TRUE(a == b);
  // Re-saving the same step over a good checkpoint and failing keeps it too.
  expectError(
      [&] { saveCheckpoint(dir, c.tensors(), sampleState(10), {}, crash); },
      "simulated failure");
  ToyState b2(2);
  loadCheckpoint(good, b2.tensors(), {});
  EXPECT_TRUE(a == b2);
}

TEST(Checkpoint, MismatchedModelIsRejected) {
  std::string dir = freshDir("mismatch");
  ToyState a(1);
  std::string stepDir = saveCheckpoint(dir, a.tensors(), sampleState(1), {});
  ToyState b(2);
  std::vector<CheckpointTensor> t = b.tensors();
  t[0].shape = {4, 6};
  expectError([&] { loadCheckpoint(stepDir, t, {}); },
              "has shape [6,4], expected [4,6]");
  t = b.tensors();
  t[2].dtype = StDType::BF16;
  t[2].bytes = 48;
  expectError([&] { loadCheckpoint(stepDir, t, {}); }, "is F32, expected BF16");
  t = b.tensors();
  t.pop_back();
  expectError([&] { loadCheckpoint(stepDir, t, {}); },
              "unexpected tensor 'adam_v/n'");
  t = b.tensors();
  std::vector<float> extra(3);
  t.push_back({"master/extra", StDType::F32, {3}, extra.data(), 12});
  expectError([&] { loadCheckpoint(stepDir, t, {}); },
              "missing tensor 'master/extra'");
  ShardInfo two;
  two.worldSize = 2;
  two.allTrue = [](bool ok) { return ok; };
  expectError([&] { loadCheckpoint(stepDir, b.tensors(), two); },
              "saved by 1 rank");
  TrainingState reserved = sampleState(1);
  reserved.extra["actplace.step"] = "7";
  expectError([&] { saveCheckpoint(dir, a.tensors(), reserved, {}); },
              "reserved");
}

/// A reusable logical-AND barrier for the in-process "ranks" below.
class ThreadAllTrue {
public:
  explicit ThreadAllTrue(int n) : n_(n) {}
  bool arrive(bool value) {
    std::unique_lock<std::mutex> lk(m_);
    int gen = gen_;
    acc_ = acc_ && value;
    if (++count_ == n_) {
      result_ = acc_;
      acc_ = true;
      count_ = 0;
      ++gen_;
      cv_.notify_all();
      return result_;
    }
    cv_.wait(lk, [&] { return gen != gen_; });
    return result_;
  }

private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
  bool acc_ = true, result_ = true;
};

TEST(Checkpoint, ShardedSaveWithIndex) {
  std::string dir = freshDir("sharded");
  ThreadAllTrue agree(2);
  ToyState s0(10), s1(11);
  std::vector<std::string> stepDirs(2);
  auto save = [&](int rank, ToyState &s) {
    ShardInfo info{rank, 2, [&](bool ok) { return agree.arrive(ok); }};
    stepDirs[rank] = saveCheckpoint(dir, s.tensors(), sampleState(7), info);
  };
  std::thread t0(save, 0, std::ref(s0)), t1(save, 1, std::ref(s1));
  t0.join();
  t1.join();
  EXPECT_EQ(stepDirs[0], stepDirs[1]);
  std::string stepDir = *latestCheckpoint(dir);
  Json idx = parseJson(std::string(std::istreambuf_iterator<char>(
                                       *std::make_unique<std::ifstream>(
                                           stepDir + "/index.json")),
                                   {}),
                       "index");
  ASSERT_TRUE(idx.at("world_size").is_number_unsigned());
  EXPECT_EQ(idx.at("world_size").get<uint64_t>(), 2u);
  ASSERT_EQ(idx.at("shards").size(), 2u);
  EXPECT_EQ(idx.at("shards")[1].get<std::string>(),
            "model-rank00001-of-00002.safetensors");
  // Each rank gets its own shard back.
  ToyState r0(20), r1(21);
  loadCheckpoint(stepDir, r0.tensors(), ShardInfo{0, 2, {}});
  loadCheckpoint(stepDir, r1.tensors(), ShardInfo{1, 2, {}});
  EXPECT_TRUE(r0 == s0);
  EXPECT_TRUE(r1 == s1);
  expectError([&] { loadCheckpoint(stepDir, r0.tensors(), {}); },
              "saved by 2 rank");
}

TEST(Checkpoint, ShardedSaveFailingOnOneRankMovesNothing) {
  std::string dir = freshDir("shardfail");
  ThreadAllTrue agree(2);
  ToyState s0(10), s1(11);
  auto saveAll = [&](uint64_t step, int failingRank) {
    std::vector<std::string> errors(2);
    auto body = [&](int rank, ToyState &s) {
      ShardInfo info{rank, 2, [&](bool ok) { return agree.arrive(ok); }};
      SaveOptions opt;
      if (rank == failingRank)
        opt.failAfterBytes = 100;
      try {
        saveCheckpoint(dir, s.tensors(), sampleState(step), info, opt);
      } catch (const Error &e) {
        errors[rank] = e.what();
      }
    };
    std::thread t0(body, 0, std::ref(s0)), t1(body, 1, std::ref(s1));
    t0.join();
    t1.join();
    return errors;
  };
  std::vector<std::string> ok = saveAll(1, -1);
  EXPECT_EQ(ok[0], "");
  EXPECT_EQ(ok[1], "");
  std::string good = *latestCheckpoint(dir);
  // Rank 1 dies half-way through step 2: both ranks report it, rank 0 never
  // publishes step 2.
  std::vector<std::string> errs = saveAll(2, 1);
  EXPECT_NE(errs[1].find("simulated failure"), std::string::npos) << errs[1];
  EXPECT_NE(errs[0].find("another rank failed"), std::string::npos) << errs[0];
  EXPECT_EQ(latestCheckpoint(dir), good);
  ToyState r1(21);
  loadCheckpoint(good, r1.tensors(), ShardInfo{1, 2, {}});
  EXPECT_TRUE(r1 == s1);
  // A distributed save without the agreement function is refused.
  ShardInfo lonely{0, 2, {}};
  expectError(
      [&] { saveCheckpoint(dir, s0.tensors(), sampleState(3), lonely); },
      "allTrue");
}

/// Two whole tensors and any rank's flat (ZeRO-3) shards of them: rank r of
/// n holds elements [r x S, (r + 1) x S) of each flattened tensor, S =
/// ceil(numel / n), zeros past its end; n = 0 stands for the whole tensors.
struct FlatModel {
  std::vector<int64_t> shapeA{5, 3}, shapeB;
  std::vector<float> a;
  std::vector<bf16> b;
  FlatModel(float base, int64_t bNumel) : shapeB{bNumel} {
    for (int i = 0; i < 15; ++i)
      a.push_back(base + 0.5f * float(i));
    for (int64_t i = 0; i < bNumel; ++i)
      b.push_back(bf16(base - 0.25f * float(i)));
  }
};
struct FlatShard {
  std::vector<int64_t> shapeA, shapeB;
  int64_t sa = 0, sb = 0, beginA = 0, beginB = 0;
  bool whole = false;
  std::vector<float> a;
  std::vector<bf16> b;
  /// Rank `rank` of `n`'s shards of `m` (n = 0: whole); `fill` instead of
  /// the values (a destination to load into).
  FlatShard(const FlatModel &m, int rank, int n, bool fill = false)
      : shapeA(m.shapeA), shapeB(m.shapeB), whole(n == 0) {
    int64_t na = int64_t(m.a.size()), nb = int64_t(m.b.size());
    sa = whole ? na : (na + n - 1) / n;
    sb = whole ? nb : (nb + n - 1) / n;
    beginA = whole ? 0 : rank * sa;
    beginB = whole ? 0 : rank * sb;
    a.assign(size_t(sa), fill ? -7.f : 0.f);
    b.assign(size_t(sb), bf16(fill ? -7.f : 0.f));
    for (int64_t i = 0; !fill && i < sa && beginA + i < na; ++i)
      a[size_t(i)] = m.a[size_t(beginA + i)];
    for (int64_t i = 0; !fill && i < sb && beginB + i < nb; ++i)
      b[size_t(i)] = m.b[size_t(beginB + i)];
  }
  std::vector<CheckpointTensor> tensors() {
    CheckpointTensor ta{paramTensorName("a"), StDType::F32, shapeA, a.data(),
                        a.size() * 4};
    CheckpointTensor tb{masterTensorName("b"), StDType::BF16, shapeB, b.data(),
                        b.size() * 2};
    if (!whole) {
      ta.shardNumel = sa;
      ta.flatBegin = beginA;
      tb.shardNumel = sb;
      tb.flatBegin = beginB;
    }
    return {ta, tb};
  }
  bool operator==(const FlatShard &o) const {
    if (a != o.a || b.size() != o.b.size())
      return false;
    for (size_t i = 0; i < b.size(); ++i)
      if (b[i].bits != o.b[i].bits)
        return false;
    return true;
  }
};

/// Saves `m`'s shards from `n` threads standing for ranks; the step folder.
std::string saveFlat(const std::string &dir, const FlatModel &m, int n,
                     uint64_t step) {
  ThreadAllTrue agree(n);
  std::vector<std::thread> ranks;
  std::string stepDir;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      FlatShard s(m, r, n);
      ShardInfo info{r, n, [&](bool ok) { return agree.arrive(ok); }};
      std::string d = saveCheckpoint(dir, s.tensors(), sampleState(step), info);
      if (r == 0)
        stepDir = d;
    });
  for (std::thread &t : ranks)
    t.join();
  return stepDir;
}

Json readIndex(const std::string &stepDir) {
  std::ifstream in(stepDir + "/index.json");
  return parseJson(std::string(std::istreambuf_iterator<char>(in), {}),
                   "index");
}

// ZeRO-3 checkpoints: each rank saves its flat shards, rank 0 an index
// mapping every tensor to (file, element range); any number of ranks loads
// it back, each reading the elements it holds from whichever files hold
// them (resharding), padding zero.
TEST(CheckpointFlat, SavedByTwoRanksLoadsOnAnyNumberOfRanks) {
  std::string dir = freshDir("flat");
  FlatModel m(1.f, 7);
  std::string stepDir = saveFlat(dir, m, 2, 5);
  EXPECT_EQ(*latestCheckpoint(dir), stepDir);
  Json idx = readIndex(stepDir);
  const Json &a = idx.at("tensors").at("param/a");
  EXPECT_EQ(a.at("shape"), Json({5, 3}));
  EXPECT_EQ(a.at("shard_numel").get<int64_t>(), 8);
  EXPECT_EQ(a.at("data_parallel_size").get<int64_t>(), 2);
  ASSERT_EQ(a.at("pieces").size(), 2u);
  EXPECT_EQ(a.at("pieces")[1].at("file").get<std::string>(),
            "model-rank00001-of-00002.safetensors");
  EXPECT_EQ(a.at("pieces")[1].at("begin").get<int64_t>(), 8);
  EXPECT_EQ(a.at("pieces")[1].at("end").get<int64_t>(), 15);
  // The shard files hold the slices as 1-D tensors of shard_numel.
  SafetensorsFile f1 =
      SafetensorsFile::open(stepDir + "/model-rank00001-of-00002.safetensors");
  EXPECT_EQ(f1.find("master/b")->shape, std::vector<int64_t>{4});
  for (int n : {0, 1, 2, 3, 4})
    for (int r = 0; r < std::max(n, 1); ++r) {
      FlatShard got(m, r, n, /*fill=*/true), want(m, r, n);
      TrainingState st = loadCheckpoint(stepDir, got.tensors(), ShardInfo{});
      EXPECT_EQ(st.step, 5u);
      EXPECT_TRUE(got == want) << "rank " << r << " of " << n;
    }
  std::vector<CheckpointEntry> list = listCheckpoint(stepDir);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].name, "param/a"); // the save's order
  EXPECT_EQ(list[1].name, "master/b");
  EXPECT_EQ(list[1].shape, std::vector<int64_t>{7});
  EXPECT_EQ(list[1].dtype, StDType::BF16);
  // Some tensors only (a consolidation of the weights), on request.
  FlatShard whole(m, 0, 0, true), want(m, 0, 0);
  std::vector<CheckpointTensor> onlyA = {whole.tensors()[0]};
  expectError([&] { loadCheckpoint(stepDir, onlyA, ShardInfo{}); },
              "unexpected tensor 'master/b'");
  loadCheckpoint(stepDir, onlyA, ShardInfo{}, LoadOptions{true});
  EXPECT_EQ(whole.a, want.a);
  // Straight into the destinations (no staged copy), padding zeroed.
  FlatShard direct(m, 3, 4, true), want3(m, 3, 4);
  loadCheckpoint(stepDir, direct.tensors(), ShardInfo{},
                 LoadOptions{false, true});
  EXPECT_TRUE(direct == want3);
}

// A whole tensor beside flat shards (shard_numel 0 in the index) is read
// from rank 0's file.
TEST(CheckpointFlat, WholeTensorBesideShards) {
  std::string dir = freshDir("flatmixed");
  FlatModel m(1.5f, 7);
  ThreadAllTrue agree(2);
  std::vector<std::thread> ranks;
  std::string stepDir;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      FlatShard s(m, r, 2), whole(m, 0, 0);
      std::vector<CheckpointTensor> t = {whole.tensors()[0], s.tensors()[1]};
      ShardInfo info{r, 2, [&](bool ok) { return agree.arrive(ok); }};
      std::string d = saveCheckpoint(dir, t, sampleState(2), info);
      if (r == 0)
        stepDir = d;
    });
  for (std::thread &t : ranks)
    t.join();
  EXPECT_EQ(readIndex(stepDir).at("tensors").at("param/a").at("shard_numel"),
            0);
  for (int n : {0, 3})
    for (int r = 0; r < std::max(n, 1); ++r) {
      FlatShard got(m, r, n, true), want(m, r, n);
      loadCheckpoint(stepDir, got.tensors(), ShardInfo{});
      EXPECT_TRUE(got == want) << "rank " << r << " of " << n;
    }
}

// A world-of-one checkpoint (replicate) loads into flat shards: each rank
// takes its slice.
TEST(CheckpointFlat, WholeCheckpointLoadsIntoShards) {
  std::string dir = freshDir("flatwhole");
  FlatModel m(2.f, 9);
  FlatShard whole(m, 0, 0);
  std::string stepDir =
      saveCheckpoint(dir, whole.tensors(), sampleState(3), ShardInfo{});
  for (int r = 0; r < 4; ++r) {
    FlatShard got(m, r, 4, true), want(m, r, 4);
    loadCheckpoint(stepDir, got.tensors(), ShardInfo{});
    EXPECT_TRUE(got == want) << "rank " << r << " of 4";
  }
  // A world of one holds whole tensors: a flat shard there is refused.
  FlatShard one(m, 0, 1);
  expectError(
      [&] { saveCheckpoint(dir, one.tensors(), sampleState(4), ShardInfo{}); },
      "flat shard of 'param/a' in a world of one");
}

// Bad input: a missing shard, a shard of another model, of another rank or
// of another save, an index that does not cover the model, a model that
// differs: each named, and the destination keeps what it held.
TEST(CheckpointFlat, BadShardsAreNamedAndNothingIsWritten) {
  FlatModel m(1.f, 7), other(3.f, 9);
  auto untouched = [&](FlatShard &s) {
    FlatShard fresh(m, 0, 0, true);
    EXPECT_TRUE(s == fresh) << "the destination was written";
  };
  {
    std::string stepDir = saveFlat(freshDir("flatmissing"), m, 2, 5);
    std::filesystem::remove(stepDir + "/model-rank00001-of-00002.safetensors");
    FlatShard got(m, 0, 0, true);
    expectError([&] { loadCheckpoint(stepDir, got.tensors(), ShardInfo{}); },
                "shard '" + stepDir +
                    "/model-rank00001-of-00002.safetensors' is missing");
    untouched(got);
    // Rank 0 of two needs only rank 0's file.
    FlatShard r0(m, 0, 2, true), want(m, 0, 2);
    loadCheckpoint(stepDir, r0.tensors(), ShardInfo{});
    EXPECT_TRUE(r0 == want);
    std::filesystem::remove(stepDir + "/index.json");
    expectError([&] { loadCheckpoint(stepDir, got.tensors(), ShardInfo{}); },
                "has no model.safetensors and no index.json beside its "
                "per-rank shards");
    untouched(got);
  }
  {
    std::string stepDir = saveFlat(freshDir("flatforeign"), m, 2, 5);
    std::string foreign = saveFlat(freshDir("flatother"), other, 2, 5);
    std::filesystem::copy_file(
        foreign + "/model-rank00001-of-00002.safetensors",
        stepDir + "/model-rank00001-of-00002.safetensors",
        std::filesystem::copy_options::overwrite_existing);
    FlatShard got(m, 0, 0, true);
    expectError([&] { loadCheckpoint(stepDir, got.tensors(), ShardInfo{}); },
                "model-rank00001-of-00002.safetensors': tensor 'master/b' "
                "is BF16 [5], " +
                    stepDir +
                    "/index.json says BF16 [4]: a shard of another model");
    untouched(got);
  }
  {
    // A shard copied under another rank's name, and one of another save.
    std::string dir = freshDir("flatswap");
    std::string stepDir = saveFlat(dir, m, 2, 5);
    std::string later = saveFlat(dir, m, 2, 6);
    std::string r0 = "/model-rank00000-of-00002.safetensors",
                r1 = "/model-rank00001-of-00002.safetensors";
    std::filesystem::copy_file(
        stepDir + r0, stepDir + r1,
        std::filesystem::copy_options::overwrite_existing);
    FlatShard got(m, 0, 0, true);
    expectError([&] { loadCheckpoint(stepDir, got.tensors(), ShardInfo{}); },
                stepDir + r1 + "' is the shard of rank 0 of 2, but " + stepDir +
                    "/index.json lists it as rank 1 of 2");
    untouched(got);
    std::filesystem::copy_file(
        later + r1, stepDir + r1,
        std::filesystem::copy_options::overwrite_existing);
    expectError([&] { loadCheckpoint(stepDir, got.tensors(), ShardInfo{}); },
                stepDir + r1 + "' is of step 6, '" + stepDir + r0 +
                    "' of step 5 (shards of different saves)");
    untouched(got);
  }
  {
    std::string stepDir = saveFlat(freshDir("flatcover"), m, 2, 5);
    Json idx = readIndex(stepDir);
    idx["tensors"]["param/a"]["pieces"].erase(1);
    std::ofstream(stepDir + "/index.json") << idx.dump();
    FlatShard got(m, 0, 0, true);
    expectError([&] { loadCheckpoint(stepDir, got.tensors(), ShardInfo{}); },
                "tensor 'param/a': elements [8, 15) are in no shard (the "
                "index does not cover it)");
    untouched(got);
    idx["tensors"].erase("master/b");
    std::ofstream(stepDir + "/index.json") << idx.dump();
    expectError([&] { loadCheckpoint(stepDir, got.tensors(), ShardInfo{}); },
                "missing tensor 'master/b'");
    untouched(got);
  }
  {
    std::string stepDir = saveFlat(freshDir("flatshape"), m, 2, 5);
    FlatShard got(m, 0, 0, true);
    got.shapeA = {3, 5};
    expectError([&] { loadCheckpoint(stepDir, got.tensors(), ShardInfo{}); },
                stepDir + "/index.json' does not match this model:");
    expectError([&] { loadCheckpoint(stepDir, got.tensors(), ShardInfo{}); },
                "tensor 'param/a' has shape [5,3], expected [3,5]");
  }
}

TEST(Checkpoint, ReplicatedSaveIsRankZerosFileAgreedByAll) {
  // Replicated data parallelism: every rank holds the same state; rank 0
  // writes one world-of-one file, the others write nothing, and "latest"
  // moves once both agreed. It loads with ShardInfo{} on any rank.
  std::string dir = freshDir("replicated");
  ThreadAllTrue agree(2);
  ToyState s(10);
  auto saveAll = [&](uint64_t step, bool rank0Fails) {
    std::vector<std::string> errors(2), stepDirs(2);
    auto body = [&](int rank) {
      ShardInfo info{rank, 2, [&](bool ok) { return agree.arrive(ok); }};
      info.replicated = true;
      SaveOptions opt;
      if (rank == 0 && rank0Fails)
        opt.failAfterBytes = 100;
      try {
        stepDirs[rank] =
            saveCheckpoint(dir, s.tensors(), sampleState(step), info, opt);
      } catch (const Error &e) {
        errors[rank] = e.what();
      }
    };
    std::thread t0(body, 0), t1(body, 1);
    t0.join();
    t1.join();
    return std::make_pair(errors, stepDirs);
  };
  auto [ok, dirs] = saveAll(4, false);
  EXPECT_EQ(ok[0], "");
  EXPECT_EQ(ok[1], "");
  EXPECT_EQ(dirs[0], dirs[1]);
  std::string good = *latestCheckpoint(dir);
  EXPECT_EQ(good, dirs[0]);
  std::vector<std::string> files;
  for (const auto &e : std::filesystem::directory_iterator(good))
    files.push_back(e.path().filename().string());
  EXPECT_EQ(files, std::vector<std::string>{"model.safetensors"});
  ToyState back(20);
  loadCheckpoint(good, back.tensors(), {});
  EXPECT_TRUE(back == s);
  // Rank 0's write fails: both ranks report it, "latest" stays.
  auto [errs, unused] = saveAll(5, true);
  EXPECT_NE(errs[0].find("simulated failure"), std::string::npos) << errs[0];
  EXPECT_NE(errs[1].find("another rank failed"), std::string::npos) << errs[1];
  EXPECT_EQ(latestCheckpoint(dir), good);
}

TEST(Checkpoint, RunConfigAndPlacementRoundTripWithTheirHash) {
  std::string dir = freshDir("runconfig");
  ToyState a(1);
  TrainingState st = sampleState(3);
  st.runConfig = {{"lr", "0.0003"}, {"seq", "64"}, {"data", "synthetic"}};
  st.placement = {{"micro_batches", "2"}};
  saveCheckpoint(dir, a.tensors(), st, {});
  ToyState b(2);
  TrainingState got = loadCheckpoint(*latestCheckpoint(dir), b.tensors(), {});
  EXPECT_EQ(got.runConfig, st.runConfig);
  EXPECT_EQ(got.placement, st.placement);
  // The hash is SHA-256 over "name=value\n" lines in name order.
  EXPECT_EQ(runConfigHash({{"b", "2"}, {"a", "1"}}),
            runConfigHash({{"a", "1"}, {"b", "2"}}));
  EXPECT_NE(runConfigHash({{"a", "1"}}), runConfigHash({{"a", "2"}}));
  EXPECT_EQ(runConfigHash({}), "e3b0c44298fc1c149afbf4c8996fb924"
                               "27ae41e4649b934ca495991b7852b855");
  // A checkpoint without a record loads with an empty one.
  std::string old = freshDir("runconfig_old");
  saveCheckpoint(old, a.tensors(), sampleState(3), {});
  EXPECT_TRUE(loadCheckpoint(*latestCheckpoint(old), b.tensors(), {})
                  .runConfig.empty());
}

TEST(Checkpoint, RunConfigDiffNamesEachField) {
  std::vector<std::string> d =
      diffRunConfig({{"lr", "0.0003"}, {"seq", "64"}, {"old", "x"}},
                    {{"lr", "0.001"}, {"seq", "64"}, {"new", "y"}});
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0], "lr: checkpoint '0.0003', this run '0.001'");
  EXPECT_EQ(d[1], "new: checkpoint (none), this run 'y'");
  EXPECT_EQ(d[2], "old: checkpoint 'x', this run (none)");
  EXPECT_TRUE(diffRunConfig({{"a", "1"}}, {{"a", "1"}}).empty());
}

TEST(Checkpoint, ResolveSaysNoCheckpointForMissingOrEmptyFolders) {
  std::string dir = freshDir("resolve");
  expectError([&] { resolveCheckpoint(dir); },
              "no checkpoint in '" + dir + "'");
  ASSERT_EQ(std::system(("mkdir -p '" + dir + "'").c_str()), 0);
  expectError([&] { resolveCheckpoint(dir); },
              "no checkpoint in '" + dir + "' (no 'latest' file");
  // A step folder left by a save that never completed.
  ASSERT_EQ(std::system(("mkdir -p '" + dir + "/step-00000004'").c_str()), 0);
  expectError([&] { resolveCheckpoint(dir); }, "step-00000004");
  ToyState a(1);
  saveCheckpoint(dir, a.tensors(), sampleState(5), {});
  EXPECT_EQ(resolveCheckpoint(dir), dir + "/step-00000005");
  // A step folder named directly.
  EXPECT_EQ(resolveCheckpoint(dir + "/step-00000005"), dir + "/step-00000005");
}

TEST(Checkpoint, FolderContentsAndRemoval) {
  std::string dir = freshDir("contents");
  EXPECT_TRUE(inspectCheckpointFolder(dir).empty());
  ToyState a(1);
  saveCheckpoint(dir, a.tensors(), sampleState(2), {});
  saveCheckpoint(dir, a.tensors(), sampleState(6), {});
  std::ofstream(dir + "/notes.txt") << "keep me\n"; // closed here
  CheckpointFolderContents c = inspectCheckpointFolder(dir);
  ASSERT_TRUE(c.latestStep.has_value());
  EXPECT_EQ(*c.latestStep, 6u);
  EXPECT_EQ(c.stepFolders,
            (std::vector<std::string>{"step-00000002", "step-00000006"}));
  EXPECT_NE(c.describe().find("latest: step 6"), std::string::npos);
  EXPECT_EQ(stepOfFolderName("step-00000042"), std::optional<uint64_t>(42));
  EXPECT_FALSE(stepOfFolderName("step-42").has_value());
  EXPECT_FALSE(stepOfFolderName("step-0000004x").has_value());
  removeCheckpoints(dir);
  EXPECT_TRUE(inspectCheckpointFolder(dir).empty());
  EXPECT_FALSE(latestCheckpoint(dir).has_value());
  EXPECT_TRUE(std::ifstream(dir + "/notes.txt").good());
}

TEST(Checkpoint, LockRefusesASecondHolderNamingTheFirst) {
  std::string dir = freshDir("lock");
  CheckpointLock first = CheckpointLock::acquire(dir, {}, "run-a");
  EXPECT_TRUE(first.held());
  // Another open file description conflicts like another process would.
  expectError([&] { CheckpointLock::acquire(dir, {}, "run-b"); },
              "checkpoint folder '" + dir + "' is in use by run 'run-a' (pid " +
                  std::to_string(::getpid()));
  first.release();
  CheckpointLock second = CheckpointLock::acquire(dir, {}, "run-b");
  EXPECT_TRUE(second.held());
  // A folder that cannot be made is reported at once.
  std::string file = freshDir("lock_file");
  std::ofstream(file) << "x"; // closed here
  expectError([&] { CheckpointLock::acquire(file + "/ckpt", {}, "run-c"); },
              "cannot create directory '" + file + "/ckpt'");
}

TEST(Checkpoint, ShardedLockIsTheJobsOnRankZero) {
  std::string dir = freshDir("lock_sharded");
  ThreadAllTrue agree(2);
  auto lockAll = [&](const std::string &id0, const std::string &id1) {
    std::vector<std::string> errors(2);
    std::vector<bool> held(2);
    auto body = [&](int rank, std::string id) {
      ShardInfo info{rank, 2, [&](bool ok) { return agree.arrive(ok); }};
      try {
        CheckpointLock l = CheckpointLock::acquire(dir, info, id);
        held[rank] = l.held();
      } catch (const Error &e) {
        errors[rank] = e.what();
      }
    };
    std::thread t0(body, 0, id0), t1(body, 1, id1);
    t0.join();
    t1.join();
    return std::make_pair(errors, held);
  };
  auto [ok, held] = lockAll("job-7", "job-7");
  EXPECT_EQ(ok[0], "");
  EXPECT_EQ(ok[1], "");
  EXPECT_TRUE(held[0]);  // rank 0 holds the flock
  EXPECT_FALSE(held[1]); // the others only checked the run id
  auto [bad, unused] = lockAll("job-7", "job-8");
  EXPECT_NE(bad[1].find("is locked by run 'job-7'"), std::string::npos)
      << bad[1];
  EXPECT_NE(bad[1].find("(run 'job-8') on rank 1"), std::string::npos)
      << bad[1];
  EXPECT_NE(bad[0].find("another rank failed while checking the lock"),
            std::string::npos)
      << bad[0];
}

TEST(Checkpoint, RunIdFromTheLauncher) {
  std::map<std::string, std::string> env;
  auto get = [&](const char *n) -> const char * {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  std::string own = checkpointRunId(1, get);
  EXPECT_NE(own.find(":" + std::to_string(::getpid()) + ":"), std::string::npos)
      << own;
  expectError([&] { checkpointRunId(2, get); }, "ACTPLACE_RUN_ID");
  env["MASTER_ADDR"] = "node1";
  env["MASTER_PORT"] = "29500";
  EXPECT_EQ(checkpointRunId(2, get), "rendezvous:node1:29500");
  env["SLURM_JOB_ID"] = "123";
  env["SLURM_STEP_ID"] = "4";
  EXPECT_EQ(checkpointRunId(2, get), "slurm:123.4");
  env["TORCHELASTIC_RUN_ID"] = "abc";
  EXPECT_EQ(checkpointRunId(2, get), "torchrun:abc");
  env["ACTPLACE_RUN_ID"] = "mine";
  EXPECT_EQ(checkpointRunId(2, get), "mine");
}

// Writes a checkpoint for an external reader when AP_CHECKPOINT_EXPORT names
// a folder (test/unit/runtime/checkpoint_torch_check.py reads it with
// safetensors/PyTorch where those are installed); skipped otherwise.
TEST(Checkpoint, ExportForExternalReaders) {
  const char *out = std::getenv("AP_CHECKPOINT_EXPORT");
  if (!out || !*out)
    GTEST_SKIP() << "AP_CHECKPOINT_EXPORT not set";
  ToyState a(1);
  // Known values the python side checks exactly.
  for (size_t i = 0; i < a.wq.size(); ++i) {
    a.wq[i] = bf16(float(i) * 0.5f - 3.0f);
    a.mq[i] = float(i) * 0.25f + 0.125f;
  }
  std::string stepDir = saveCheckpoint(out, a.tensors(), sampleState(42), {});
  std::printf("exported %s/model.safetensors\n", stepDir.c_str());
}

TEST(NameMappingTest, Rules) {
  NameMapping m = NameMapping::parse(R"(
# HF Qwen-style names -> ours
model.embed_tokens.weight -> embedding.weight
model.layers.{i}.mlp.up_proj.weight -> layers.{i}.mlp_fc1.up.weight   # trailing comment
model.layers.{i}.self_attn.experts.{i}.w -> layers.{i}.e{i}.w
)");
  EXPECT_EQ(m.size(), 3u);
  EXPECT_EQ(m.map("model.embed_tokens.weight"), "embedding.weight");
  EXPECT_EQ(m.map("model.layers.12.mlp.up_proj.weight"),
            "layers.12.mlp_fc1.up.weight");
  EXPECT_EQ(m.map("model.layers.3.self_attn.experts.7.w"), "layers.3.e7.w");
  EXPECT_FALSE(m.map("model.layers.x.mlp.up_proj.weight").has_value());
  EXPECT_FALSE(m.map("model.layers.1.mlp.up_proj.weight.extra").has_value());
  EXPECT_FALSE(m.map("lm_head.weight").has_value());
  EXPECT_THROW(NameMapping::parse("a.{i} -> b"), Error);
  EXPECT_THROW(NameMapping::parse("no arrow here"), Error);
  EXPECT_THROW(NameMapping::parse("a b -> c"), Error);
}

TEST(NameMappingTest, LoadsHfNamedWeightsWithConversion) {
  std::string dir = freshDir("hf");
  std::string cmd = "mkdir -p '" + dir + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  // An HF-style file: bf16 embedding, f32 norm, f16 projection, plus a
  // buffer our model does not have.
  std::vector<bf16> emb(8);
  for (int i = 0; i < 8; ++i)
    emb[i] = bf16(0.25f * float(i) - 1.0f);
  std::vector<float> norm = {1.0f, 1.0f / 3.0f, -2.5f, 1e-3f};
  std::vector<uint16_t> proj = {0x3c00, 0xc000, 0x3555,
                                0x0001}; // 1, -2, ~1/3, 2^-24
  std::vector<float> rotary(2, 9.0f);
  SafetensorsWriter w;
  w.add("model.embed_tokens.weight", StDType::BF16, {4, 2}, emb.data(), 16);
  w.add("model.layers.0.input_layernorm.weight", StDType::F32, {4}, norm.data(),
        16);
  w.add("model.layers.0.mlp.up_proj.weight", StDType::F16, {2, 2}, proj.data(),
        8);
  w.add("model.rotary.inv_freq", StDType::F32, {2}, rotary.data(), 8);
  w.setMetadata("format", "pt");
  SafetensorsWriter::WriteOptions noSum;
  noSum.checksumKey.clear(); // HF files carry no checksum of ours
  std::string path = dir + "/hf.safetensors";
  w.write(path, noSum);

  NameMapping m = NameMapping::parse(
      "model.embed_tokens.weight -> embedding\n"
      "model.layers.{i}.input_layernorm.weight -> layers.{i}.attn_norm\n"
      "model.layers.{i}.mlp.up_proj.weight -> layers.{i}.up\n");
  std::vector<float> embF(8);  // bf16 -> f32 (exact)
  std::vector<bf16> normB(4);  // f32 -> bf16 (RNE)
  std::vector<float> projF(4); // f16 -> f32 (exact)
  std::vector<CheckpointTensor> dst = {
      {"embedding", StDType::F32, {4, 2}, embF.data(), 32},
      {"layers.0.attn_norm", StDType::BF16, {4}, normB.data(), 8},
      {"layers.0.up", StDType::F32, {2, 2}, projF.data(), 16},
  };
  MappedLoadReport rep = loadMappedWeights(path, m, dst);
  EXPECT_EQ(rep.loaded.size(), 3u);
  ASSERT_EQ(rep.unmapped.size(), 1u);
  EXPECT_EQ(rep.unmapped[0], "model.rotary.inv_freq");
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(embF[i], 0.25f * float(i) - 1.0f);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(normB[i].bits, bf16(norm[i]).bits);
  EXPECT_EQ(projF[0], 1.0f);
  EXPECT_EQ(projF[1], -2.0f);
  EXPECT_EQ(projF[2], 0.333251953125f);
  EXPECT_EQ(projF[3], std::ldexp(1.0f, -24));

  expectError([&] { loadMappedWeights(path, m, dst, /*allowUnmapped=*/false); },
              "no rule maps 'model.rotary.inv_freq'");
  std::vector<CheckpointTensor> wrongShape = dst;
  wrongShape[2].shape = {4};
  expectError([&] { loadMappedWeights(path, m, wrongShape); },
              "has shape [2,2]");
  std::vector<float> more(2);
  std::vector<CheckpointTensor> missing = dst;
  missing.push_back({"layers.0.down", StDType::F32, {2}, more.data(), 8});
  expectError([&] { loadMappedWeights(path, m, missing); },
              "no tensor in the file maps to 'layers.0.down'");
  std::vector<int32_t> ints(4);
  std::vector<CheckpointTensor> intDst = dst;
  intDst[2] = {"layers.0.up", StDType::I32, {2, 2}, ints.data(), 16};
  expectError([&] { loadMappedWeights(path, m, intDst); }, "cannot convert");
  NameMapping collide = NameMapping::parse(
      "model.embed_tokens.weight -> embedding\n"
      "model.rotary.inv_freq -> embedding\n"
      "model.layers.{i}.input_layernorm.weight -> layers.{i}.attn_norm\n"
      "model.layers.{i}.mlp.up_proj.weight -> layers.{i}.up\n");
  expectError([&] { loadMappedWeights(path, collide, dst); },
              "both map to 'embedding'");
}

} // namespace
