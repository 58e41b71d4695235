//===- cli.h - Command-line flags of training binaries ----------*- C++ -*-===//
//
// A small flag parser for the generated `./train` binaries (and any tool of
// the runtime): `--name value` and `--name=value`, typed values with range
// checks, `--help`. Every mistake (unknown flag, missing or malformed value,
// a flag given twice, a positional argument) is a CliError whose message
// names the flag and what was expected, so the binary can print it and exit 2.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_CLI_H
#define ACTPLACE_RUNTIME_CLI_H

#include "runtime/backend.h"
#include "runtime/error.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace ap::rt {

class CliError : public Error {
public:
  explicit CliError(const std::string &message) : Error(message) {}
};

class FlagSet {
public:
  FlagSet(std::string program, std::string summary);

  void addInt(const std::string &name, int64_t *target, const std::string &help,
              int64_t min = std::numeric_limits<int64_t>::min(),
              int64_t max = std::numeric_limits<int64_t>::max());
  void addUInt(const std::string &name, uint64_t *target,
               const std::string &help);
  /// Finite doubles; `positive` additionally requires > 0.
  void addDouble(const std::string &name, double *target,
                 const std::string &help, bool positive = false);
  void addString(const std::string &name, std::string *target,
                 const std::string &help, const std::string &valueName = "STR");
  /// `--name` sets true; `--name=true|false|1|0` also accepted.
  void addBool(const std::string &name, bool *target, const std::string &help);
  void addChoice(const std::string &name, std::string *target,
                 std::vector<std::string> choices, const std::string &help);

  /// Parses argv[1..argc). Returns false when --help was given (print
  /// usage() and exit 0); throws CliError on any mistake.
  bool parse(int argc, const char *const *argv);
  /// True when the flag appeared on the command line.
  bool given(const std::string &name) const;
  std::string usage() const;

private:
  struct Flag {
    std::string name, valueName, help, defaultText;
    bool isBool = false;
    bool given = false;
    std::function<void(const std::string &)> set;
  };
  Flag &add(const std::string &name, const std::string &valueName,
            const std::string &help, std::string defaultText);
  Flag *find(const std::string &name);
  const Flag *find(const std::string &name) const;

  std::string program_, summary_;
  std::vector<Flag> flags_;
};

/// The flags of a generated training binary (issue 7).
struct TrainFlags {
  int64_t steps = 10;
  /// nullopt: cuda when a GPU is usable, else host.
  std::optional<DeviceKind> device;
  uint64_t seed = 0;
  double lr = 3e-4;
  /// "synthetic", a token file (.bin, uint16/uint32) or a text file.
  std::string data = "synthetic";
  /// Metrics JSONL path, "-" for stdout, empty for none.
  std::string metrics;
  bool fingerprints = false;
  /// Checkpoint directory to write, empty for none.
  std::string save;
  /// Save every N steps (0: only at the end, when --save is given).
  int64_t saveEvery = 0;
  /// Held-out data (a --data source) the evaluation loss is measured on,
  /// every `evalEvery` steps (0: after the last step only), over
  /// `evalSteps` steps' worth of batches read from its start each time.
  std::string evalData;
  int64_t evalEvery = 0;
  int64_t evalSteps = 1;
  /// Checkpoint to resume from, empty for a fresh run.
  std::string resume;
  /// Let a run replace the checkpoints a --save folder already holds
  /// (without it such a run is refused, naming the folder's latest step).
  bool overwrite = false;
  /// --seed was on the command line (a resume refuses a seed other than
  /// the checkpoint's instead of ignoring it).
  bool seedGiven = false;
  /// safetensors file of every parameter by its HF name, replacing the
  /// seeded init (empty: none). Excludes --resume.
  std::string initWeights;
  /// safetensors file to write the last step's gradients into (empty: none).
  std::string dumpGrads;
  /// JSON file to write per-op kernel times into (empty: no timing).
  std::string opTimes;
  /// How --op-times times a launch: "stream" (timers recorded around it in
  /// stream order, nothing waits: the kernel as it runs inside the step) or
  /// "wait" (the launch synchronised and timed on the host, less an empty
  /// wait: the kernel alone, launch latency included).
  std::string opTimesMode = "stream";
  /// JSON file to write the last timed step's launches into, each with its
  /// stream and its span from the step's first launch (empty: none).
  std::string opTimeline;
  /// --device-memory: the device's free memory in bytes for the start-up
  /// check (host: a simulated device of that size; cuda: the smaller of it
  /// and the measured free memory); nullopt: measured (host: unchecked).
  std::optional<uint64_t> deviceMemory;
  /// --comm: how several ranks communicate. "auto": NCCL on cuda, MPI on
  /// host; "mpi-staged": on cuda, MPI on device buffers staged through
  /// pinned memory, ranks sharing GPUs allowed (bits, not speed).
  std::string comm = "auto";
  /// --help or --version was given: print `usage` (the usage text, or for
  /// --version the release and compiler-runtime ABI version) and exit 0.
  bool help = false;
  /// --version was given (`usage` then holds the version text).
  bool version = false;
  std::string usage;
};

/// Parses a byte size: a count, or a number with a unit B, KB, MB, GB, TB
/// (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024): "18GiB",
/// "19.5GB", "4096". Throws CliError naming `flag` and the text.
uint64_t parseByteSize(const std::string &flag, const std::string &text);

/// Parses the training flags over `defaults` (the compiled model's values).
/// Throws CliError on a mistake; sets `help` and `usage` for --help and
/// --version.
TrainFlags parseTrainFlags(int argc, const char *const *argv,
                           const TrainFlags &defaults = {});

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_CLI_H
