//===- checkpoint.h - Training checkpoints on safetensors --------*- C++
//-*-===//
//
// A checkpoint holds everything a bit-exact resume needs: the compute copies
// of the parameters (bf16), the FP32 master weights, the Adam moments, the
// step counter, the RNG state and the data cursor (docs/checkpoint-format.md).
// Tensors are named by the caller; the conventional prefixes are
// "param/", "master/", "adam_m/" and "adam_v/" (see the helpers below).
//
// Directory layout, one folder per saved step:
//   <dir>/step-00000100/model.safetensors                  (world of one)
//   <dir>/step-00000100/model-rank00001-of-00004.safetensors + index.json
// Flat shards (ZeRO-3): each rank's file holds its slice of every tensor as
// a 1-D tensor of shardNumel elements; index.json maps every tensor to the
// files and element ranges that hold it, so any number of ranks can load it.
//   <dir>/latest      text file naming the newest complete step folder
// Every file is written to a temporary name, fsynced and renamed; "latest"
// moves only after all shards are complete, so a crash or a full disk never
// destroys the last good checkpoint.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_CHECKPOINT_H
#define ACTPLACE_RUNTIME_CHECKPOINT_H

#include "runtime/collectives.h"
#include "runtime/data.h"
#include "runtime/rng.h"
#include "runtime/safetensors.h"
#include "runtime/tensor_parts.h"

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ap::rt {

/// A host buffer saved into or restored from a checkpoint. For saving `data`
/// is read; for loading it is written (it must already have `bytes` bytes).
struct CheckpointTensor {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  void *data = nullptr;
  size_t bytes = 0;
  /// Flat shards (ZeRO-3 data parallelism): 0, the buffer holds the whole
  /// tensor. Otherwise `shape` is the whole tensor's and the buffer holds
  /// `shardNumel` elements (`bytes` = shardNumel x element size): elements
  /// [flatBegin, flatBegin + shardNumel) of the flattened tensor, zeros past
  /// its end (the padding of the last ranks).
  int64_t shardNumel = 0;
  int64_t flatBegin = 0;
  /// Tensor parallelism: `part.dim` >= 0 when this is rank `partRank`'s
  /// part of a split tensor (runtime/tensor_parts.h); `shape` is the part's.
  /// A distributed save records the layout in its index ("tp_part"), so
  /// actplace-ckpt can join the parts.
  TensorPartLayout part;
  int partRank = 0;
};

inline std::string paramTensorName(const std::string &p) {
  return "param/" + p;
}
inline std::string masterTensorName(const std::string &p) {
  return "master/" + p;
}
inline std::string adamMTensorName(const std::string &p) {
  return "adam_m/" + p;
}
inline std::string adamVTensorName(const std::string &p) {
  return "adam_v/" + p;
}

/// Scalars of the training loop.
struct TrainingState {
  uint64_t step = 0;
  RngState rng;
  DataCursor data;
  /// Anything else the caller wants back (lr schedule state, model name,
  /// placement used, ...). Keys must not start with "actplace.".
  std::map<std::string, std::string> extra;
  /// What the training's numbers depend on besides the tensors (model,
  /// optimizer settings, data source, sequence length, global batch), field
  /// name -> value text. Stored with its SHA-256 (runConfigHash); a resume
  /// compares it with the new run's and refuses any difference
  /// (diffRunConfig). Empty: not recorded (a checkpoint of an older
  /// actplace, or a caller that does not keep one).
  std::map<std::string, std::string> runConfig;
  /// How the run was laid out (micro-batch split, parallel layout, the
  /// plan): reported when a resume differs, never refused. Empty: not
  /// recorded.
  std::map<std::string, std::string> placement;
};

/// The SHA-256 (hex) of a run configuration: every "name=value" line in
/// name order.
std::string runConfigHash(const std::map<std::string, std::string> &config);
/// One line per field that differs between a checkpoint's record and this
/// run's, "name: checkpoint A, this run B" (a field only one side has
/// shows as "(none)" on the other). Empty when they agree.
std::vector<std::string>
diffRunConfig(const std::map<std::string, std::string> &saved,
              const std::map<std::string, std::string> &current);

/// This process's place in a distributed save/load.
struct ShardInfo {
  int rank = 0;
  int worldSize = 1;
  /// Needed when worldSize > 1: a collective logical AND over all ranks
  /// (Communicator::allTrue), called twice by every rank during a save (after
  /// the shards are written, after rank 0 published "latest"). If any rank
  /// fails, every rank throws and "latest" is not moved. Unused by loads.
  std::function<bool(bool)> allTrue;
  /// Every rank holds the same state (replicated data parallelism): a save
  /// writes one world-of-one checkpoint from rank 0, the other ranks write
  /// nothing, and "latest" still moves only after every rank agreed
  /// (allTrue) that the file is complete. Such a checkpoint loads with
  /// ShardInfo{} on any number of ranks. Unused by locks and loads.
  bool replicated = false;
  /// Pipeline stages (replicated over data-parallel ranks): `rank` is the
  /// stage and `worldSize` the number of stages, the files' names and
  /// records; only the ranks with `writes` (a stage's data-parallel rank 0)
  /// write their stage's file, every rank votes through allTrue, and the
  /// writer of stage 0 publishes "latest". Unused by locks and loads.
  bool writes = true;
  /// Pipeline stages: every tensor of the model (whole, shard_numel 0) with
  /// the stage whose file holds it; stage 0's writer puts them in
  /// index.json's "tensors" map, so a load finds each tensor's file (on any
  /// number of stages, LoadOptions::subset). Empty otherwise.
  std::vector<std::pair<CheckpointTensor, int>> placedTensors;
  /// With placedTensors: a flat-sharded tensor (shard_numel > 0) placed in
  /// file f is split over files f .. f + placedGroup - 1 (the data-parallel
  /// ranks of one tensor-parallel rank under ZeRO-3), rank r of the group
  /// holding elements [r x shard_numel, (r + 1) x shard_numel).
  int placedGroup = 1;

  /// The shard info of `comm`'s ranks (using comm.allTrue).
  static ShardInfo of(Communicator &comm) {
    return ShardInfo{comm.rank(), comm.size(),
                     [&comm](bool ok) { return comm.allTrue(ok); }};
  }
};

struct SaveOptions {
  bool sync = true;
  /// Test hook, passed to the safetensors writer (see WriteOptions).
  uint64_t failAfterBytes = UINT64_MAX;
};

/// Saves a checkpoint of `state.step` under `dir` and returns the step
/// folder. Throws ap::rt::Error; on error "latest" still names the previous
/// checkpoint.
std::string saveCheckpoint(const std::string &dir,
                           const std::vector<CheckpointTensor> &tensors,
                           const TrainingState &state, const ShardInfo &shard,
                           const SaveOptions &options = SaveOptions());

/// The folder "latest" points to, or nullopt when `dir` holds no complete
/// checkpoint.
std::optional<std::string> latestCheckpoint(const std::string &dir);

/// The step folder a --resume argument names: `dir`'s "latest", or `dir`
/// itself when it is a step folder (holds a shard or index.json). Throws
/// ap::rt::Error "no checkpoint in 'DIR'" when it is neither (a missing or
/// empty folder included).
std::string resolveCheckpoint(const std::string &dir);

/// The step recorded in a step folder's name ("step-00000100" -> 100), or
/// nullopt for any other name.
std::optional<uint64_t> stepOfFolderName(const std::string &name);

/// What a checkpoint folder holds: the step "latest" names (none when there
/// is no readable "latest") and every step-NNNNNNNN folder, sorted. A
/// missing folder holds nothing.
struct CheckpointFolderContents {
  std::optional<uint64_t> latestStep;
  std::vector<std::string> stepFolders;
  bool empty() const { return !latestStep && stepFolders.empty(); }
  /// "latest: step 6" or "no 'latest', step folders step-00000004, ...".
  std::string describe() const;
};
CheckpointFolderContents inspectCheckpointFolder(const std::string &dir);
/// Deletes `dir`'s "latest" and its step folders (--overwrite); other files
/// stay. Throws ap::rt::Error naming what could not be removed.
void removeCheckpoints(const std::string &dir);

/// The run id a job's ranks agree on without talking: ACTPLACE_RUN_ID, else
/// the launcher's job id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID[.SLURM_STEP_ID],
/// PMIX_NAMESPACE, MASTER_ADDR:MASTER_PORT). A world of one with none of
/// them gets "<host>:<pid>:<start time>". Several ranks with none of them
/// throw ap::rt::Error (set ACTPLACE_RUN_ID).
std::string
checkpointRunId(int worldSize,
                const std::function<const char *(const char *)> &getenv);

/// Holds a checkpoint folder for one run (one job with several ranks):
/// creates the folder (one level, as saveCheckpoint does), checks that it
/// can be written (a probe file made and removed), then rank 0 takes an
/// exclusive flock on "<dir>/lock" and writes the run id, its pid and host
/// into it; the other ranks read the file and insist on their own run id.
/// Every rank throws when any rank failed (ShardInfo::allTrue, as a save).
/// A second process, or a job with another run id, is refused with an
/// error naming the folder and the holder. The flock goes with the
/// process (also on a crash); the file stays, naming the last holder.
/// flock is advisory and local to one machine unless the file system
/// forwards it (NFS v4 and Lustre with flock do).
class CheckpointLock {
public:
  static CheckpointLock acquire(const std::string &dir, const ShardInfo &shard,
                                const std::string &runId);
  CheckpointLock() = default;
  CheckpointLock(CheckpointLock &&o) noexcept;
  CheckpointLock &operator=(CheckpointLock &&o) noexcept;
  CheckpointLock(const CheckpointLock &) = delete;
  CheckpointLock &operator=(const CheckpointLock &) = delete;
  ~CheckpointLock();
  bool held() const { return fd_ >= 0; }
  void release();

private:
  int fd_ = -1;
};

/// The lock file's name inside a checkpoint folder.
inline constexpr const char *kCheckpointLockFile = "lock";

struct LoadOptions {
  /// Load only the requested tensors: the checkpoint may hold others (a
  /// tool that consolidates the weights alone). Flat layouts only.
  bool subset = false;
  /// Read into the destinations as the files are read, without a staged
  /// copy (half the memory): a failure may leave them partly written, for
  /// callers whose destinations are scratch until the load returns (a tool
  /// that writes them out afterwards). Flat layouts only.
  bool direct = false;
};

/// Loads this rank's part of the checkpoint in `stepDir` (a folder returned
/// by saveCheckpoint / latestCheckpoint) into `tensors` and returns the
/// training state. Verifies the SHA-256 of every file read, that every
/// requested tensor exists with the same dtype and (whole) shape, and that
/// the checkpoint has no tensor that was not requested. Nothing is written
/// into the destination buffers unless all checks pass.
///
/// Layouts: a world-of-one file (replicated state) and flat shards (an
/// index.json with a "tensors" map, docs/checkpoint-format.md) load into
/// whole or flat-sharded destinations on any number of ranks: each
/// destination's element range is read from the files that hold it
/// (resharding). Other per-rank shards need the same world size (`shard`).
TrainingState loadCheckpoint(const std::string &stepDir,
                             const std::vector<CheckpointTensor> &tensors,
                             const ShardInfo &shard,
                             const LoadOptions &options = LoadOptions());

/// A tensor of a checkpoint as a whole: name, dtype and whole shape.
struct CheckpointEntry {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  /// A tensor-parallel part (CheckpointTensor::part): dim < 0 otherwise.
  TensorPartLayout part;
  int partRank = 0;
};
/// The tensors of the checkpoint in `stepDir` (a world-of-one file or flat
/// shards), in file or index order, the step tensor left out. Throws
/// ap::rt::Error naming the file when it is neither or unreadable.
std::vector<CheckpointEntry> listCheckpoint(const std::string &stepDir);

/// The shard file name of `rank` in a world of `worldSize`.
std::string checkpointShardName(int rank, int worldSize);

//===----------------------------------------------------------------------===//
// Foreign (HF-named) weights
//===----------------------------------------------------------------------===//

/// Maps external tensor names (e.g. HF "model.layers.3.mlp.up_proj.weight")
/// to ours. Each rule is a pattern where "{i}" matches a decimal number
/// (a layer index) that the target reuses; literal text must match exactly.
class NameMapping {
public:
  void addRule(const std::string &externalPattern,
               const std::string &internalPattern);
  /// Parses one rule per line, "external -> internal"; '#' starts a comment.
  /// Throws ap::rt::Error naming the line on a malformed rule.
  static NameMapping parse(const std::string &text);
  /// Our name for `external`, or nullopt when no rule matches.
  std::optional<std::string> map(const std::string &external) const;
  size_t size() const { return rules_.size(); }

private:
  std::vector<std::pair<std::string, std::string>> rules_;
};

struct MappedLoadReport {
  std::vector<std::string> loaded;
  /// File tensors that no rule maps (e.g. rotary caches, unused heads).
  std::vector<std::string> unmapped;
};

/// Loads a safetensors file of externally named weights into `tensors`
/// (named with our names). Converts BF16/F16/F32/F64 sources to the
/// destination's BF16/F32/F64 (BF16 by round-to-nearest-even); shapes must
/// match exactly. Throws ap::rt::Error when a destination gets no tensor, two
/// file tensors map to the same destination, a shape differs, or (when
/// `allowUnmapped` is false) a file tensor has no rule.
MappedLoadReport loadMappedWeights(const std::string &path,
                                   const NameMapping &mapping,
                                   const std::vector<CheckpointTensor> &tensors,
                                   bool allowUnmapped = true);

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_CHECKPOINT_H
