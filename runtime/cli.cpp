//===- cli.cpp - Command-line flags of training binaries --------*- C++ -*-===//
#include "runtime/cli.h"

#include "support/ByteSize.h"
#include "support/Version.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace ap::rt {
namespace {

[[noreturn]] void cliFail(const std::string &message) {
  throw CliError(message);
}

std::string doubleText(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

int64_t parseInt(const std::string &flag, const std::string &text) {
  errno = 0;
  char *end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    cliFail("--" + flag + ": expected an integer, got '" + text + "'");
  return v;
}

} // namespace

FlagSet::FlagSet(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

FlagSet::Flag &FlagSet::add(const std::string &name,
                            const std::string &valueName,
                            const std::string &help, std::string defaultText) {
  if (find(name))
    fail("cli: flag --", name, " defined twice");
  flags_.push_back(Flag{name, valueName, help, std::move(defaultText)});
  return flags_.back();
}

FlagSet::Flag *FlagSet::find(const std::string &name) {
  for (Flag &f : flags_)
    if (f.name == name)
      return &f;
  return nullptr;
}
const FlagSet::Flag *FlagSet::find(const std::string &name) const {
  return const_cast<FlagSet *>(this)->find(name);
}

void FlagSet::addInt(const std::string &name, int64_t *target,
                     const std::string &help, int64_t min, int64_t max) {
  add(name, "N", help, std::to_string(*target)).set =
      [name, target, min, max](const std::string &text) {
        int64_t v = parseInt(name, text);
        if (v < min || v > max) {
          std::string range = "--" + name + ": " + text + " is out of range (";
          if (max == std::numeric_limits<int64_t>::max())
            range += "at least " + std::to_string(min) + ")";
          else
            range += std::to_string(min) + ".." + std::to_string(max) + ")";
          cliFail(range);
        }
        *target = v;
      };
}

void FlagSet::addUInt(const std::string &name, uint64_t *target,
                      const std::string &help) {
  add(name, "N", help, std::to_string(*target)).set =
      [name, target](const std::string &text) {
        errno = 0;
        char *end = nullptr;
        unsigned long long v = std::strtoull(text.c_str(), &end, 10);
        if (text.empty() || text[0] == '-' || *end != '\0' || errno == ERANGE)
          cliFail("--" + name + ": expected a non-negative integer, got '" +
                  text + "'");
        *target = v;
      };
}

void FlagSet::addDouble(const std::string &name, double *target,
                        const std::string &help, bool positive) {
  add(name, "X", help, doubleText(*target)).set = [name, target, positive](
                                                      const std::string &text) {
    errno = 0;
    char *end = nullptr;
    double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
      cliFail("--" + name + ": expected a finite number, got '" + text + "'");
    if (positive && !(v > 0))
      cliFail("--" + name + ": must be > 0, got " + text);
    *target = v;
  };
}

void FlagSet::addString(const std::string &name, std::string *target,
                        const std::string &help, const std::string &valueName) {
  add(name, valueName, help, *target).set = [name,
                                             target](const std::string &text) {
    if (text.empty())
      cliFail("--" + name + ": expected a value, got an empty string");
    *target = text;
  };
}

void FlagSet::addBool(const std::string &name, bool *target,
                      const std::string &help) {
  Flag &f = add(name, "", help, *target ? "true" : "false");
  f.isBool = true;
  f.set = [name, target](const std::string &text) {
    if (text == "true" || text == "1")
      *target = true;
    else if (text == "false" || text == "0")
      *target = false;
    else
      cliFail("--" + name + ": expected true or false, got '" + text + "'");
  };
}

void FlagSet::addChoice(const std::string &name, std::string *target,
                        std::vector<std::string> choices,
                        const std::string &help) {
  std::string joined;
  for (const std::string &c : choices)
    joined += (joined.empty() ? "" : "|") + c;
  add(name, joined, help, *target).set = [name, target, choices,
                                          joined](const std::string &text) {
    for (const std::string &c : choices)
      if (c == text) {
        *target = text;
        return;
      }
    cliFail("--" + name + ": expected one of " + joined + ", got '" + text +
            "'");
  };
}

bool FlagSet::parse(int argc, const char *const *argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h")
      return false;
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0)
      cliFail("unexpected argument '" + arg +
              "' (flags start with --; see --help)");
    std::string name = arg.substr(2), value;
    bool hasValue = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      hasValue = true;
    }
    Flag *f = find(name);
    if (!f)
      cliFail("unknown flag --" + name + " (see --help)");
    if (f->given)
      cliFail("flag --" + name + " given twice");
    f->given = true;
    if (!hasValue) {
      if (f->isBool) {
        value = "true";
      } else {
        if (i + 1 >= argc)
          cliFail("--" + name + ": missing value (" + f->valueName + ")");
        value = argv[++i];
      }
    }
    f->set(value);
  }
  return true;
}

bool FlagSet::given(const std::string &name) const {
  const Flag *f = find(name);
  return f && f->given;
}

std::string FlagSet::usage() const {
  std::ostringstream os;
  os << "usage: " << program_ << " [flags]\n";
  if (!summary_.empty())
    os << summary_ << "\n";
  os << "\nflags:\n";
  for (const Flag &f : flags_) {
    std::string head =
        "  --" + f.name + (f.valueName.empty() ? "" : " " + f.valueName);
    os << head;
    if (head.size() < 28)
      os << std::string(28 - head.size(), ' ');
    else
      os << "\n" << std::string(28, ' ');
    os << f.help;
    if (!f.defaultText.empty())
      os << " (default: " << f.defaultText << ")";
    os << "\n";
  }
  os << "  --help                    print this text\n";
  os << "  --version                 print the actplace release and the "
        "compiler-runtime ABI version\n";
  return os.str();
}

uint64_t parseByteSize(const std::string &flag, const std::string &text) {
  std::optional<double> bytes = ap::support::parseByteSize(text);
  if (!bytes || *bytes < 1 || *bytes > 1.8e19)
    throw CliError(flag +
                   " must be a size such as 18GiB, 19.5GB, 512MiB or "
                   "a byte count, got '" +
                   text + "'");
  return uint64_t(*bytes);
}

TrainFlags parseTrainFlags(int argc, const char *const *argv,
                           const TrainFlags &defaults) {
  TrainFlags out = defaults;
  std::string device = defaults.device ? deviceKindName(*defaults.device) : "";
  FlagSet flags(argc > 0 ? argv[0] : "train",
                "Runs the compiled training step (actplace).");
  flags.addInt("steps", &out.steps, "optimizer steps to run", 1);
  flags.addChoice("device", &device, {"auto", "cuda", "host"},
                  "backend; auto (the default): cuda when a GPU is usable, "
                  "else host, saying so; cuda without a usable GPU is an "
                  "error");
  flags.addUInt("seed", &out.seed, "seed of parameter init and synthetic data");
  flags.addDouble("lr", &out.lr, "peak learning rate", /*positive=*/true);
  flags.addString("data", &out.data,
                  "'synthetic', tokens:PATH (uint16 ids; tokens32:PATH for "
                  "uint32) or text:PATH (bytes as ids)",
                  "SRC");
  flags.addString("metrics", &out.metrics,
                  "append one JSON line per step to PATH ('-': stdout); on "
                  "several ranks rank 0 writes PATH, rank R PATH.rank<R>",
                  "PATH");
  flags.addBool("fingerprints", &out.fingerprints,
                "add SHA-256 fingerprints of loss, grads, params, optimizer");
  flags.addString("save", &out.save, "checkpoint directory to write", "DIR");
  flags.addInt("save-every", &out.saveEvery,
               "save every N steps (0: at the end only)", 0);
  flags.addString("eval-data", &out.evalData,
                  "held-out data (as --data) for an evaluation loss: the "
                  "compiled step on --eval-steps batches of it, from its "
                  "start each time, without updating anything; recorded as "
                  "eval_loss in that step's metrics line",
                  "SRC");
  flags.addInt("eval-every", &out.evalEvery,
               "evaluate every N steps (0: after the last step only)", 0);
  flags.addInt("eval-steps", &out.evalSteps,
               "steps' worth of --eval-data batches per evaluation (the "
               "loss is their token-weighted mean)",
               1);
  flags.addString("resume", &out.resume,
                  "checkpoint to resume from (a --save folder or one of its "
                  "step folders); --steps stays the total, --seed may only "
                  "repeat the checkpoint's",
                  "DIR");
  flags.addBool("overwrite", &out.overwrite,
                "let --save replace the checkpoints DIR already holds (they "
                "are deleted before the first step); without it such a run "
                "is refused");
  flags.addString("init-weights", &out.initWeights,
                  "start from these weights instead of the seeded init: a "
                  "safetensors file holding exactly the model's parameters by "
                  "HF name, F32 or the parameter's own dtype",
                  "FILE");
  flags.addString("dump-grads", &out.dumpGrads,
                  "write the last step's gradient of every trainable "
                  "parameter (F32, by HF name) to a safetensors file: the "
                  "token mean over the step BEFORE clipping; AdamW uses it "
                  "times the metadata 'clip_coef'",
                  "FILE");
  flags.addString("op-times", &out.opTimes,
                  "time every kernel launch of steps 2..N and write the "
                  "seconds per launch label, summed, as JSON: the profile "
                  "bench/qwen_train_bench.py calibrate --op-times reads",
                  "FILE");
  flags.addChoice("op-times-mode", &out.opTimesMode, {"stream", "wait"},
                  "stream (default): timers around each launch in stream "
                  "order, nothing waits, so each kernel is timed as it runs "
                  "in the step; wait: each launch waited for and timed on "
                  "the host less an empty wait (slow; launch latency "
                  "included)");
  flags.addString("op-timeline", &out.opTimeline,
                  "time the launches of steps 2..N in stream order (as "
                  "--op-times-mode stream) and write the last step's, each "
                  "with its label, stream and start and end in us from the "
                  "step's first launch, as JSON: which kernels ran beside "
                  "which on the compute and side streams",
                  "FILE");
  std::string deviceMemory;
  flags.addString("device-memory", &deviceMemory,
                  "the device's free memory for the start-up check that the "
                  "compiled plan fits (18GiB, 19.5GB, bytes): on the host "
                  "backend a simulated device of that size, on cuda the "
                  "smaller of it and the free memory measured",
                  "SIZE");
  flags.addChoice("comm", &out.comm, {"auto", "mpi-staged"},
                  "collectives of several ranks: auto (default: NCCL on "
                  "cuda, MPI on host) or mpi-staged (cuda: MPI on device "
                  "buffers staged through pinned memory, under mpirun; ranks "
                  "may share a GPU; checks bits and memory, not speed)");
  out.usage = flags.usage();
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--version") {
      std::string program = argc > 0 ? argv[0] : "train";
      out.help = out.version = true;
      out.usage = ap::versionText(program.substr(program.rfind('/') + 1));
      return out;
    }
  if (!flags.parse(argc, argv)) {
    out.help = true;
    return out;
  }
  if (!device.empty() && device != "auto")
    out.device = parseDeviceKind(device);
  else if (device == "auto")
    out.device = std::nullopt;
  out.seedGiven = flags.given("seed");
  if (flags.given("device-memory"))
    out.deviceMemory = parseByteSize("--device-memory", deviceMemory);
  if (out.overwrite && out.save.empty())
    throw CliError("--overwrite needs --save DIR");
  if (flags.given("save-every") && out.save.empty())
    throw CliError("--save-every needs --save DIR");
  if ((flags.given("eval-every") || flags.given("eval-steps")) &&
      out.evalData.empty())
    throw CliError("--eval-every and --eval-steps need --eval-data SRC (the "
                   "held-out data to evaluate on)");
  if (!out.opTimeline.empty() && out.opTimesMode != "stream")
    throw CliError("--op-timeline times launches in stream order: it "
                   "excludes --op-times-mode wait");
  if (!out.initWeights.empty() && !out.resume.empty())
    throw CliError("--init-weights and --resume exclude each other (a "
                   "checkpoint already holds the weights)");
  return out;
}

} // namespace ap::rt
