//===- cli_test.cpp - Training binary flags ---------------------*- C++ -*-===//
#include "runtime/cli.h"
#include "support/Version.h"

#include <gtest/gtest.h>

#include <vector>

using namespace ap::rt;

namespace {

TrainFlags parse(std::vector<const char *> args,
                 const TrainFlags &defaults = {}) {
  args.insert(args.begin(), "./train");
  return parseTrainFlags(static_cast<int>(args.size()), args.data(), defaults);
}

std::string errorOf(std::vector<const char *> args) {
  try {
    parse(std::move(args));
  } catch (const CliError &e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Cli, EveryFlagInBothSpellings) {
  TrainFlags f = parse({"--steps", "50", "--device=host", "--seed",
                        "18446744073709551615", "--lr=1e-3", "--data",
                        "corpus.txt", "--metrics=-", "--fingerprints", "--save",
                        "ckpt", "--save-every=10", "--resume", "old"});
  EXPECT_EQ(f.steps, 50);
  EXPECT_EQ(f.device, DeviceKind::Host);
  EXPECT_EQ(f.seed, 18446744073709551615ull);
  EXPECT_DOUBLE_EQ(f.lr, 1e-3);
  EXPECT_EQ(f.data, "corpus.txt");
  EXPECT_EQ(f.metrics, "-");
  EXPECT_TRUE(f.fingerprints);
  EXPECT_EQ(f.save, "ckpt");
  EXPECT_EQ(f.saveEvery, 10);
  EXPECT_EQ(f.resume, "old");
  EXPECT_FALSE(f.help);
  EXPECT_EQ(parse({"--device", "cuda"}).device, DeviceKind::Cuda);
  EXPECT_EQ(parse({"--device", "auto"}).device, std::nullopt);
  TrainFlags hostDefault;
  hostDefault.device = DeviceKind::Host;
  EXPECT_EQ(parse({"--device", "auto"}, hostDefault).device, std::nullopt);
  EXPECT_FALSE(parse({"--fingerprints=false"}).fingerprints);
}

TEST(Cli, DefaultsComeFromTheCompiledModel) {
  TrainFlags defaults;
  defaults.steps = 7;
  defaults.lr = 0.01;
  TrainFlags f = parse({}, defaults);
  EXPECT_EQ(f.steps, 7);
  EXPECT_DOUBLE_EQ(f.lr, 0.01);
  EXPECT_EQ(f.device, std::nullopt); // auto: cuda when usable
  EXPECT_EQ(f.data, "synthetic");
  EXPECT_TRUE(f.metrics.empty());
}

TEST(Cli, MistakesAreClearErrors) {
  EXPECT_EQ(errorOf({"--stpes", "3"}), "unknown flag --stpes (see --help)");
  EXPECT_EQ(errorOf({"--steps"}), "--steps: missing value (N)");
  EXPECT_EQ(errorOf({"--steps", "ten"}),
            "--steps: expected an integer, got 'ten'");
  EXPECT_EQ(errorOf({"--steps=0"}), "--steps: 0 is out of range (at least 1)");
  EXPECT_EQ(errorOf({"--steps=3x"}), "--steps: expected an integer, got '3x'");
  EXPECT_EQ(errorOf({"--device", "gpu"}),
            "--device: expected one of auto|cuda|host, got 'gpu'");
  EXPECT_EQ(errorOf({"--lr", "0"}), "--lr: must be > 0, got 0");
  EXPECT_EQ(errorOf({"--lr", "nan"}),
            "--lr: expected a finite number, got 'nan'");
  EXPECT_EQ(errorOf({"--seed", "-1"}),
            "--seed: expected a non-negative integer, got '-1'");
  EXPECT_EQ(errorOf({"--steps", "1", "--steps", "2"}),
            "flag --steps given twice");
  EXPECT_EQ(errorOf({"extra"}),
            "unexpected argument 'extra' (flags start with --; see --help)");
  EXPECT_EQ(errorOf({"--fingerprints=yes"}),
            "--fingerprints: expected true or false, got 'yes'");
  EXPECT_EQ(errorOf({"--save-every", "5"}), "--save-every needs --save DIR");
  EXPECT_EQ(errorOf({"--save-every=-1", "--save", "d"}),
            "--save-every: -1 is out of range (at least 0)");
  EXPECT_EQ(errorOf({"--data="}),
            "--data: expected a value, got an empty string");
  EXPECT_EQ(errorOf({"--overwrite"}), "--overwrite needs --save DIR");
  EXPECT_EQ(errorOf({"--eval-every", "5"}),
            "--eval-every and --eval-steps need --eval-data SRC (the held-out "
            "data to evaluate on)");
  EXPECT_EQ(errorOf({"--eval-steps=0", "--eval-data", "synthetic"}),
            "--eval-steps: 0 is out of range (at least 1)");
  EXPECT_EQ(errorOf({"--eval-every=-2", "--eval-data", "synthetic"}),
            "--eval-every: -2 is out of range (at least 0)");
}

TEST(Cli, OverwriteAndWhetherTheSeedWasGiven) {
  const char *plain[] = {"train", "--save", "d"};
  TrainFlags f = parseTrainFlags(3, plain);
  EXPECT_FALSE(f.overwrite);
  EXPECT_FALSE(f.seedGiven);
  // The default seed written out is still "given": a resume compares it.
  const char *both[] = {"train", "--save", "d", "--overwrite", "--seed", "0"};
  f = parseTrainFlags(6, both);
  EXPECT_TRUE(f.overwrite);
  EXPECT_TRUE(f.seedGiven);
  EXPECT_EQ(f.seed, 0u);
}

TEST(Cli, VersionNamesTheReleaseAndTheAbi) {
  TrainFlags f = parse({"--steps", "3", "--version"});
  EXPECT_TRUE(f.help);
  EXPECT_TRUE(f.version);
  EXPECT_EQ(f.usage, "train (actplace) " ACTPLACE_VERSION_STRING
                     "\ncompiler-runtime ABI " +
                         std::to_string(AP_ABI_VERSION) + "\n");
  EXPECT_NE(parse({"--help"}).usage.find("--version"), std::string::npos);
}

TEST(Cli, HelpListsEveryFlag) {
  TrainFlags f = parse({"--steps", "3", "--help", "--bogus"});
  EXPECT_TRUE(f.help);
  for (const char *flag :
       {"--steps N", "--device auto|cuda|host", "--seed N", "--lr X",
        "--data SRC", "--metrics PATH", "--fingerprints", "--save DIR",
        "--save-every N", "--resume DIR", "--help"})
    EXPECT_NE(f.usage.find(flag), std::string::npos) << flag << "\n" << f.usage;
  EXPECT_EQ(f.usage.rfind("usage: ./train [flags]", 0), 0u);
}

TEST(Cli, WeightsInAndGradientsOut) {
  TrainFlags f =
      parse({"--init-weights", "w.safetensors", "--dump-grads=g.safetensors"});
  EXPECT_EQ(f.initWeights, "w.safetensors");
  EXPECT_EQ(f.dumpGrads, "g.safetensors");
  EXPECT_TRUE(parse({}).initWeights.empty());
  EXPECT_TRUE(parse({}).dumpGrads.empty());
  EXPECT_EQ(errorOf({"--init-weights", "w", "--resume", "ckpt"}),
            "--init-weights and --resume exclude each other (a checkpoint "
            "already holds the weights)");
  std::string usage = parse({"--help"}).usage;
  EXPECT_NE(usage.find("--init-weights FILE"), std::string::npos) << usage;
  EXPECT_NE(usage.find("--dump-grads FILE"), std::string::npos) << usage;
  EXPECT_NE(usage.find("BEFORE clipping"), std::string::npos) << usage;
}

TEST(Cli, OpTimelineIsStreamOrderOnly) {
  EXPECT_EQ(parse({"--op-timeline", "t.json"}).opTimeline, "t.json");
  EXPECT_EQ(parse({"--op-timeline=t.json", "--op-times", "o.json"}).opTimes,
            "o.json");
  EXPECT_EQ(errorOf({"--op-timeline", "t.json", "--op-times-mode", "wait"}),
            "--op-timeline times launches in stream order: it excludes "
            "--op-times-mode wait");
  EXPECT_NE(parse({"--help"}).usage.find("--op-timeline FILE"),
            std::string::npos);
}

TEST(Cli, FlagSetForOtherTools) {
  int64_t n = 1;
  std::string mode = "a";
  FlagSet flags("tool", "");
  flags.addInt("n", &n, "count", 0, 10);
  flags.addChoice("mode", &mode, {"a", "b"}, "mode");
  const char *argv[] = {"tool", "--n=10", "--mode", "b"};
  EXPECT_TRUE(flags.parse(4, argv));
  EXPECT_EQ(n, 10);
  EXPECT_EQ(mode, "b");
  EXPECT_TRUE(flags.given("mode"));
  FlagSet again("tool", "");
  again.addInt("n", &n, "count", 0, 10);
  const char *bad[] = {"tool", "--n=11"};
  EXPECT_THROW(again.parse(2, bad), CliError);
  EXPECT_THROW(again.addInt("n", &n, "dup"), Error);
}

} // namespace

TEST(Cli, DeviceMemoryTakesSizesWithUnits) {
  EXPECT_EQ(parse({}).deviceMemory, std::nullopt);
  EXPECT_EQ(parse({"--device-memory", "4096"}).deviceMemory, 4096u);
  EXPECT_EQ(parse({"--device-memory=1MiB"}).deviceMemory, 1048576u);
  EXPECT_EQ(parse({"--device-memory", "19.5GB"}).deviceMemory, 19500000000u);
  EXPECT_EQ(parse({"--device-memory", "2GiB"}).deviceMemory, uint64_t(2) << 30);
  for (const char *bad : {"GiB", "12XB", "1.2.3GB", "-5", "0"}) {
    try {
      parse({"--device-memory", bad});
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const CliError &e) {
      EXPECT_NE(std::string(e.what()).find(
                    "--device-memory must be a size such as 18GiB"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Cli, CommChoosesHowRanksCommunicate) {
  EXPECT_EQ(parse({}).comm, "auto");
  EXPECT_EQ(parse({"--comm", "mpi-staged"}).comm, "mpi-staged");
  EXPECT_NE(errorOf({"--comm", "gloo"}).find("--comm"), std::string::npos);
}
