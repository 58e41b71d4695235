//===- checkpoint.cpp - Checkpoint save/load and foreign-weight mapping ---===//
#include "runtime/checkpoint.h"

#include "kernels/kernels.h"
#include "runtime/error.h"
#include "runtime/json.h"

#include "runtime/sha256.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ap::rt {
namespace {

constexpr const char *kFormat = "actplace-checkpoint-v1";
constexpr const char *kStepTensor = "train/step";

void makeDir(const std::string &path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
    fail("checkpoint: cannot create directory '", path,
         "': ", std::strerror(errno));
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail("checkpoint: '", path, "' exists and is not a directory");
}

bool fileExists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string readSmallFile(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string stepFolderName(uint64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08llu", (unsigned long long)step);
  return buf;
}

std::string shapeString(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t parseUInt(const std::string &text, const std::string &what) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    fail("checkpoint: ", what, " '", text, "' is not a number");
  return std::stoull(text);
}

/// A string map as a JSON object (metadata values must be strings).
std::string mapToJson(const std::map<std::string, std::string> &m,
                      const std::string &what) {
  return dumpJson(Json(m), what);
}

std::map<std::string, std::string> mapFromJson(const std::string &text,
                                               const std::string &what) {
  Json v = parseJson(text, what);
  if (!v.is_object())
    fail(what, ": not a JSON object");
  std::map<std::string, std::string> m;
  for (const auto &[k, item] : v.items()) {
    if (!item.is_string())
      fail(what, ": field '", k, "' is not a string");
    m[k] = item.get<std::string>();
  }
  return m;
}

constexpr const char *kRunConfigKey = "actplace.run_config";
constexpr const char *kRunConfigHashKey = "actplace.run_config_sha256";
constexpr const char *kPlacementKey = "actplace.placement";

} // namespace

std::string runConfigHash(const std::map<std::string, std::string> &config) {
  Sha256 h;
  for (const auto &[k, v] : config) {
    std::string line = k + "=" + v + "\n";
    h.update(line.data(), line.size());
  }
  return Sha256::hex(h.finish());
}

std::vector<std::string>
diffRunConfig(const std::map<std::string, std::string> &saved,
              const std::map<std::string, std::string> &current) {
  std::set<std::string> names;
  for (const auto &kv : saved)
    names.insert(kv.first);
  for (const auto &kv : current)
    names.insert(kv.first);
  auto value = [](const std::map<std::string, std::string> &m,
                  const std::string &k) {
    auto it = m.find(k);
    return it == m.end() ? std::string("(none)") : "'" + it->second + "'";
  };
  std::vector<std::string> out;
  for (const std::string &k : names) {
    auto a = saved.find(k), b = current.find(k);
    if (a != saved.end() && b != current.end() && a->second == b->second)
      continue;
    out.push_back(k + ": checkpoint " + value(saved, k) + ", this run " +
                  value(current, k));
  }
  return out;
}

std::string checkpointShardName(int rank, int worldSize) {
  if (worldSize == 1)
    return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-rank%05d-of-%05d.safetensors", rank,
                worldSize);
  return buf;
}

namespace {

int64_t numelOf(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// The index's "tensors" map of a flat-sharded save: rank r's file holds
/// elements [r x shardNumel, (r + 1) x shardNumel) of every tensor (the
/// same split on every rank, so rank 0 writes it for all), clipped to the
/// tensor; ranks whose slice is all padding hold no piece. A whole tensor
/// among them (shard_numel 0) is read from rank 0's file.
Json flatIndex(const std::vector<CheckpointTensor> &tensors, int worldSize) {
  Json map = Json::object();
  for (const CheckpointTensor &t : tensors) {
    int64_t numel = numelOf(t.shape);
    int64_t s = t.shardNumel > 0 ? t.shardNumel : numel;
    if (t.shardNumel > 0 && s * int64_t(worldSize) < numel)
      fail("checkpoint: '", t.name, "' has ", numel, " elements, more than ",
           worldSize, " shards of ", s);
    Json pieces = Json::array();
    for (int r = 0; r < (t.shardNumel > 0 ? worldSize : 1); ++r) {
      int64_t begin = int64_t(r) * s, end = std::min(begin + s, numel);
      if (begin >= end)
        break;
      pieces.push_back({{"file", checkpointShardName(r, worldSize)},
                        {"begin", begin},
                        {"end", end}});
    }
    map[t.name] = {{"dtype", stDTypeName(t.dtype)},
                   {"shape", t.shape},
                   {"shard_numel", t.shardNumel > 0 ? s : 0},
                   {"data_parallel_size", t.shardNumel > 0 ? worldSize : 1},
                   {"pieces", pieces}};
  }
  return map;
}

/// The index's "tensors" map of a pipelined save: each tensor whole in the
/// file of the stage that holds it.
/// With `group` > 1 (tensor parallelism under ZeRO-3) a flat-sharded
/// tensor placed in file f has its shards in files f .. f + group - 1.
Json placedIndex(const std::vector<std::pair<CheckpointTensor, int>> &placed,
                 int worldSize, int group) {
  Json map = Json::object();
  for (const auto &[t, file] : placed) {
    int files = t.shardNumel > 0 ? group : 1;
    if (file < 0 || file + files > worldSize ||
        (t.shardNumel != 0 && group < 2))
      fail("checkpoint: '", t.name, "' placed in file ", file, " of ",
           worldSize, t.shardNumel ? " as a flat shard" : "");
    int64_t numel = numelOf(t.shape);
    int64_t s = t.shardNumel > 0 ? t.shardNumel : numel;
    if (s * files < numel)
      fail("checkpoint: '", t.name, "' has ", numel, " elements, more than ",
           files, " shards of ", s);
    Json pieces = Json::array();
    for (int r = 0; r < files; ++r) {
      int64_t begin = int64_t(r) * s, end = std::min(begin + s, numel);
      if (begin >= end)
        break;
      pieces.push_back({{"file", checkpointShardName(file + r, worldSize)},
                        {"begin", begin},
                        {"end", end}});
    }
    map[t.name] = {{"dtype", stDTypeName(t.dtype)},
                   {"shape", t.shape},
                   {"shard_numel", t.shardNumel > 0 ? s : 0},
                   {"data_parallel_size", files},
                   {"pieces", pieces}};
    // A tensor-parallel part says which part of which whole it is.
    if (t.part.dim >= 0)
      map[t.name]["tp_part"] = {{"dim", t.part.dim},
                                {"segments", t.part.segments},
                                {"rank", t.partRank},
                                {"ranks", t.part.ranks}};
  }
  return map;
}

/// Writes this rank's shard (and, on rank 0 of a distributed save, the
/// index); returns the step folder.
std::string writeShard(const std::string &dir,
                       const std::vector<CheckpointTensor> &tensors,
                       const TrainingState &state, const ShardInfo &shard,
                       const SaveOptions &options) {
  makeDir(dir);
  std::string stepDir = dir + "/" + stepFolderName(state.step);
  makeDir(stepDir);

  SafetensorsWriter w;
  bool flat = false;
  for (const CheckpointTensor &t : tensors) {
    if (t.name == kStepTensor)
      fail("checkpoint: tensor name '", t.name, "' is reserved");
    // A flat shard is stored as what it is, a 1-D slice; the index says
    // which elements of the whole tensor it holds.
    if (t.shardNumel > 0) {
      flat = true;
      // Without an index nothing would say which elements it holds.
      if (shard.worldSize < 2)
        fail("checkpoint: flat shard of '", t.name,
             "' in a world of one (which holds whole tensors)");
      w.add(t.name, t.dtype, {t.shardNumel}, t.data, t.bytes);
    } else {
      w.add(t.name, t.dtype, t.shape, t.data, t.bytes);
    }
  }
  int64_t step = int64_t(state.step);
  w.add(kStepTensor, StDType::I64, {}, &step, sizeof(step));
  // "format: pt" is what safetensors.torch writes; it lets PyTorch tooling
  // recognise the file.
  w.setMetadata("format", "pt");
  w.setMetadata("actplace.format", kFormat);
  w.setMetadata("actplace.step", std::to_string(state.step));
  w.setMetadata("actplace.rank", std::to_string(shard.rank));
  w.setMetadata("actplace.world_size", std::to_string(shard.worldSize));
  w.setMetadata("actplace.rng", state.rng.serialize());
  if (!state.data.sourceId.empty())
    w.setMetadata("actplace.data_cursor", state.data.serialize());
  if (!state.runConfig.empty()) {
    w.setMetadata(kRunConfigKey,
                  mapToJson(state.runConfig, "checkpoint: run configuration"));
    w.setMetadata(kRunConfigHashKey, runConfigHash(state.runConfig));
  }
  if (!state.placement.empty())
    w.setMetadata(kPlacementKey,
                  mapToJson(state.placement, "checkpoint: placement"));
  for (const auto &[k, v] : state.extra) {
    if (k.rfind("actplace.", 0) == 0 || k == "format")
      fail("checkpoint: extra key '", k, "' is reserved");
    w.setMetadata("extra." + k, v);
  }
  SafetensorsWriter::WriteOptions wo;
  wo.sync = options.sync;
  wo.failAfterBytes = options.failAfterBytes;
  w.write(stepDir + "/" + checkpointShardName(shard.rank, shard.worldSize), wo);

  if (shard.worldSize > 1 && shard.rank == 0) {
    Json index = {{"format", kFormat},
                  {"step", state.step},
                  {"world_size", shard.worldSize},
                  {"shards", Json::array()}};
    for (int r = 0; r < shard.worldSize; ++r)
      index["shards"].push_back(checkpointShardName(r, shard.worldSize));
    if (flat)
      index["tensors"] = flatIndex(tensors, shard.worldSize);
    if (!shard.placedTensors.empty())
      index["tensors"] =
          placedIndex(shard.placedTensors, shard.worldSize, shard.placedGroup);
    writeFileAtomically(stepDir + "/index.json",
                        dumpJson(index, "checkpoint: index.json") + "\n",
                        options.sync);
  }
  return stepDir;
}

/// Runs `phase` on every rank and throws on every rank if it failed on any;
/// the failing rank rethrows its own error. `what` names the phase ("writing
/// the shards of step 100"), `aftermath` what the failure left as it was.
void agreeOrThrow(const ShardInfo &shard, const std::string &what,
                  const std::string &aftermath,
                  const std::function<void()> &phase) {
  std::string error;
  try {
    phase();
  } catch (const std::exception &e) {
    error = e.what();
  }
  if (shard.worldSize == 1) {
    if (!error.empty())
      throw Error(error);
    return;
  }
  bool all = shard.allTrue(error.empty());
  if (!error.empty())
    fail(error, " (rank ", shard.rank, "; ", aftermath, ")");
  if (!all)
    fail("checkpoint: another rank failed while ", what, "; ", aftermath);
}

constexpr const char *kLatestKept =
    "'latest' still names the previous checkpoint";

} // namespace

std::string saveCheckpoint(const std::string &dir,
                           const std::vector<CheckpointTensor> &tensors,
                           const TrainingState &state, const ShardInfo &shard,
                           const SaveOptions &options) {
  if (shard.worldSize < 1 || shard.rank < 0 || shard.rank >= shard.worldSize)
    fail("checkpoint: rank ", shard.rank, " outside world of ",
         shard.worldSize);
  if (shard.worldSize > 1 && !shard.allTrue)
    fail("checkpoint: a distributed save needs ShardInfo::allTrue");
  std::string stepDir;
  // Every shard must be durable on every rank before "latest" may name this
  // step.
  // A replicated save is rank 0's world-of-one file; the others only vote.
  const ShardInfo file = shard.replicated ? ShardInfo{} : shard;
  agreeOrThrow(shard,
               "writing the shards of step " + std::to_string(state.step),
               kLatestKept, [&] {
                 if ((shard.replicated && shard.rank != 0) || !shard.writes)
                   stepDir = dir + "/" + stepFolderName(state.step);
                 else
                   stepDir = writeShard(dir, tensors, state, file, options);
               });
  // Nobody returns before "latest" names this step, so any rank may look it
  // up right after saving.
  agreeOrThrow(
      shard, "publishing step " + std::to_string(state.step), kLatestKept, [&] {
        if (shard.rank == 0 && shard.writes)
          writeFileAtomically(dir + "/latest",
                              stepFolderName(state.step) + "\n", options.sync);
      });
  return stepDir;
}

std::optional<std::string> latestCheckpoint(const std::string &dir) {
  std::string p = dir + "/latest";
  if (!fileExists(p))
    return std::nullopt;
  std::string name = readSmallFile(p);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' '))
    name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos)
    fail("checkpoint: '", p, "' is malformed");
  std::string stepDir = dir + "/" + name;
  if (!fileExists(stepDir))
    fail("checkpoint: '", p, "' names '", name, "', which does not exist");
  return stepDir;
}

std::string resolveCheckpoint(const std::string &dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0)
    fail("no checkpoint in '", dir, "' (", std::strerror(errno), ")");
  if (!S_ISDIR(st.st_mode))
    fail("no checkpoint in '", dir, "' (not a folder)");
  if (std::optional<std::string> latest = latestCheckpoint(dir))
    return *latest;
  // A step folder given directly: a world-of-one shard or a sharded index.
  if (fileExists(dir + "/" + checkpointShardName(0, 1)) ||
      fileExists(dir + "/index.json"))
    return dir;
  CheckpointFolderContents c = inspectCheckpointFolder(dir);
  if (!c.stepFolders.empty())
    fail("no checkpoint in '", dir, "': it has no 'latest' file (",
         c.describe(), "; a save that never completed leaves such folders)");
  fail("no checkpoint in '", dir, "' (no 'latest' file and no ",
       checkpointShardName(0, 1), ")");
}

std::optional<uint64_t> stepOfFolderName(const std::string &name) {
  const std::string prefix = "step-";
  if (name.size() != prefix.size() + 8 || name.compare(0, 5, prefix) != 0 ||
      name.find_first_not_of("0123456789", prefix.size()) != std::string::npos)
    return std::nullopt;
  return std::stoull(name.substr(prefix.size()));
}

std::string CheckpointFolderContents::describe() const {
  std::string s;
  if (latestStep)
    s = "latest: step " + std::to_string(*latestStep);
  else
    s = "no 'latest'";
  if (!stepFolders.empty()) {
    s += ", step folders ";
    for (size_t i = 0; i < stepFolders.size() && i < 4; ++i)
      s += (i ? ", " : "") + stepFolders[i];
    if (stepFolders.size() > 4)
      s += ", ... (" + std::to_string(stepFolders.size()) + " in all)";
  }
  return s;
}

CheckpointFolderContents inspectCheckpointFolder(const std::string &dir) {
  CheckpointFolderContents c;
  DIR *d = ::opendir(dir.c_str());
  if (!d)
    return c;
  while (dirent *e = ::readdir(d))
    if (stepOfFolderName(e->d_name))
      c.stepFolders.push_back(e->d_name);
  ::closedir(d);
  std::sort(c.stepFolders.begin(), c.stepFolders.end());
  std::string latest = dir + "/latest";
  if (fileExists(latest)) {
    std::string name = readSmallFile(latest);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' '))
      name.pop_back();
    c.latestStep = stepOfFolderName(name);
  }
  return c;
}

void removeCheckpoints(const std::string &dir) {
  CheckpointFolderContents c = inspectCheckpointFolder(dir);
  std::vector<std::string> paths;
  if (fileExists(dir + "/latest"))
    paths.push_back(dir + "/latest");
  for (const std::string &s : c.stepFolders)
    paths.push_back(dir + "/" + s);
  // "latest" goes first: a crash half way leaves step folders that nothing
  // names, never a "latest" naming a deleted folder.
  for (const std::string &p : paths) {
    std::error_code ec;
    std::filesystem::remove_all(p, ec);
    if (ec)
      fail("checkpoint: cannot remove '", p, "': ", ec.message());
  }
}

std::string
checkpointRunId(int worldSize,
                const std::function<const char *(const char *)> &getenv) {
  auto env = [&](const char *name) -> std::string {
    const char *v = getenv(name);
    return v ? std::string(v) : std::string();
  };
  if (std::string v = env("ACTPLACE_RUN_ID"); !v.empty())
    return v;
  if (std::string v = env("TORCHELASTIC_RUN_ID"); !v.empty())
    return "torchrun:" + v;
  if (std::string v = env("SLURM_JOB_ID"); !v.empty()) {
    std::string stepId = env("SLURM_STEP_ID");
    return "slurm:" + v + (stepId.empty() ? "" : "." + stepId);
  }
  if (std::string v = env("PMIX_NAMESPACE"); !v.empty())
    return "pmix:" + v;
  if (worldSize > 1) {
    std::string addr = env("MASTER_ADDR"), port = env("MASTER_PORT");
    if (!addr.empty() && !port.empty())
      return "rendezvous:" + addr + ":" + port;
    fail("checkpoint: the ", worldSize,
         " ranks of this job need a common run id for the checkpoint folder "
         "lock and the launcher gives none: set ACTPLACE_RUN_ID to the same "
         "value on every rank");
  }
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0)
    std::strcpy(host, "unknown-host");
  auto now = std::chrono::system_clock::now().time_since_epoch();
  return std::string(host) + ":" + std::to_string(::getpid()) + ":" +
         std::to_string(
             std::chrono::duration_cast<std::chrono::nanoseconds>(now).count());
}

namespace {

/// "run <id>\npid <pid>\nhost <host>\n" -> the value of `key`.
std::string lockField(const std::string &text, const std::string &key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, key.size() + 1, key + " ") == 0)
      return line.substr(key.size() + 1);
  return "";
}

std::string describeHolder(const std::string &text) {
  std::string run = lockField(text, "run"), pid = lockField(text, "pid"),
              host = lockField(text, "host");
  if (run.empty())
    return "a process that has not written its run id yet";
  return "run '" + run + "' (pid " + (pid.empty() ? "?" : pid) + " on " +
         (host.empty() ? "?" : host) + ")";
}

/// Makes and removes a probe file: the folder takes new files.
void probeWritable(const std::string &dir, int rank) {
  std::string probe = dir + "/.write-probe." + std::to_string(::getpid()) +
                      "." + std::to_string(rank);
  int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0)
    fail("checkpoint: cannot write into '", dir, "': ", std::strerror(errno));
  bool ok = ::write(fd, "x", 1) == 1;
  int e = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!ok)
    fail("checkpoint: cannot write into '", dir, "': ", std::strerror(e));
}

} // namespace

CheckpointLock CheckpointLock::acquire(const std::string &dir,
                                       const ShardInfo &shard,
                                       const std::string &runId) {
  if (shard.worldSize > 1 && !shard.allTrue)
    fail("checkpoint: a distributed lock needs ShardInfo::allTrue");
  if (runId.empty() || runId.find('\n') != std::string::npos)
    fail("checkpoint: bad run id '", runId, "'");
  std::string lockPath = dir + "/" + kCheckpointLockFile;
  CheckpointLock lock;
  // Rank 0 takes the lock and writes the run id before the others read it.
  const std::string unlocked = "'" + dir + "' is not locked for this job";
  agreeOrThrow(shard, "locking '" + dir + "'", unlocked, [&] {
    if (shard.rank != 0)
      return;
    makeDir(dir);
    probeWritable(dir, shard.rank);
    int fd = ::open(lockPath.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      fail("checkpoint: cannot open the lock file '", lockPath,
           "': ", std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int e = errno;
      std::string holder = readSmallFile(lockPath);
      ::close(fd);
      if (e == EWOULDBLOCK)
        fail("checkpoint folder '", dir, "' is in use by ",
             describeHolder(holder),
             ": two runs saving into one folder would replace each other's "
             "checkpoints (wait for it to end or save elsewhere)");
      fail("checkpoint: cannot lock '", lockPath, "': ", std::strerror(e));
    }
    char host[256] = {0};
    if (::gethostname(host, sizeof(host) - 1) != 0)
      std::strcpy(host, "?");
    std::string text = "run " + runId + "\npid " + std::to_string(::getpid()) +
                       "\nhost " + host + "\n";
    bool ok =
        ::ftruncate(fd, 0) == 0 &&
        ::pwrite(fd, text.data(), text.size(), 0) == ssize_t(text.size()) &&
        ::fsync(fd) == 0;
    if (!ok) {
      int e = errno;
      ::close(fd);
      fail("checkpoint: cannot write the lock file '", lockPath,
           "': ", std::strerror(e));
    }
    lock.fd_ = fd;
  });
  // The other ranks join the holder's run or refuse.
  agreeOrThrow(shard, "checking the lock of '" + dir + "'", unlocked, [&] {
    if (shard.rank == 0)
      return;
    probeWritable(dir, shard.rank);
    std::string text = readSmallFile(lockPath);
    std::string holder = lockField(text, "run");
    if (holder != runId)
      fail("checkpoint folder '", dir, "' is locked by ", describeHolder(text),
           ", not by this job (run '", runId, "') on rank ", shard.rank);
  });
  return lock;
}

CheckpointLock::CheckpointLock(CheckpointLock &&o) noexcept : fd_(o.fd_) {
  o.fd_ = -1;
}

CheckpointLock &CheckpointLock::operator=(CheckpointLock &&o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

CheckpointLock::~CheckpointLock() { release(); }

void CheckpointLock::release() {
  if (fd_ >= 0)
    ::close(fd_); // closing the last descriptor drops the flock
  fd_ = -1;
}

namespace {

/// Where the elements of one whole tensor of a checkpoint are: the files
/// and element ranges (of the flattened tensor) that hold them.
struct FlatPiece {
  std::string file; ///< name inside the step folder
  int64_t begin = 0, end = 0;
};
struct FlatSource {
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  /// "tp_part" of the index (dim < 0: none).
  TensorPartLayout part;
  int partRank = 0;
  /// Elements of the tensor in each file (0: the file holds the whole
  /// tensor under its whole shape).
  int64_t shardNumel = 0;
  std::vector<FlatPiece> pieces;
};
/// A checkpoint's tensors as whole tensors: what a flat load reads.
struct FlatCatalog {
  std::string describedBy; ///< the index or the world-of-one file
  std::vector<std::string> order;
  std::map<std::string, FlatSource> tensors;
  std::string stateFile; ///< the file whose metadata is the training state
  /// Each file's place: its rank among `worldSize` (what its metadata must
  /// say, so a shard copied under another rank's name is caught).
  std::map<std::string, int> fileRank;
  int worldSize = 1;
};

TrainingState stateOf(const SafetensorsFile &f, const std::string &path);

/// A step folder without index.json must hold the world-of-one file.
void requireWholeFile(const std::string &stepDir) {
  std::string name = checkpointShardName(0, 1);
  if (fileExists(stepDir + "/" + name))
    return;
  bool shards = false;
  if (DIR *d = ::opendir(stepDir.c_str())) {
    while (dirent *e = ::readdir(d))
      shards = shards || std::strncmp(e->d_name, "model-rank", 10) == 0;
    ::closedir(d);
  }
  fail("checkpoint: '", stepDir, "' has no ", name,
       shards ? " and no index.json beside its per-rank shards (rank 0 "
                "writes the index; without it nothing says which elements "
                "a shard holds)"
              : "");
}

FlatCatalog catalogOfFile(const std::string &stepDir) {
  FlatCatalog c;
  std::string name = checkpointShardName(0, 1);
  c.describedBy = stepDir + "/" + name;
  c.stateFile = name;
  c.fileRank[name] = 0;
  requireWholeFile(stepDir);
  SafetensorsFile f = SafetensorsFile::open(c.describedBy);
  for (const StTensorInfo &info : f.tensors()) {
    if (info.name == kStepTensor)
      continue;
    FlatSource src;
    src.dtype = info.dtype;
    src.shape = info.shape;
    src.pieces.push_back({name, 0, numelOf(info.shape)});
    c.order.push_back(info.name);
    c.tensors[info.name] = src;
  }
  return c;
}

/// The "tensors" map of a flat index, checked for form (not yet against a
/// model): every value a number where a number belongs, pieces inside the
/// tensor, in files the index lists.
FlatCatalog catalogOfIndex(const std::string &stepDir, const Json &idx) {
  FlatCatalog c;
  c.describedBy = stepDir + "/index.json";
  const std::string &where = c.describedBy;
  std::set<std::string> files;
  const Json *shards = idx.contains("shards") ? &idx["shards"] : nullptr;
  if (!shards || !shards->is_array() || shards->empty())
    fail("checkpoint: '", where, "' lists no shards");
  for (const Json &f : *shards) {
    if (!f.is_string() || f.get<std::string>().empty() ||
        f.get<std::string>().find('/') != std::string::npos)
      fail("checkpoint: '", where, "': shard entry ", f.dump(),
           " is not a file name");
    if (!files.insert(f.get<std::string>()).second)
      fail("checkpoint: '", where, "' lists shard ", f.dump(), " twice");
    c.fileRank[f.get<std::string>()] = int(c.fileRank.size());
  }
  c.worldSize = int(shards->size());
  c.stateFile = (*shards)[0].get<std::string>();
  const Json &map = idx["tensors"];
  if (!map.is_object())
    fail("checkpoint: '", where, "': \"tensors\" is not an object");
  auto integer = [&](const Json &v, const std::string &what) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      fail("checkpoint: '", where, "': ", what, " is ", v.dump(),
           ", not a non-negative integer");
    return v.get<int64_t>();
  };
  for (const auto &[name, t] : map.items()) {
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") ||
        !t.contains("shard_numel") || !t.contains("pieces") ||
        !t["pieces"].is_array() || !t["shape"].is_array())
      fail("checkpoint: '", where, "': tensor '", name,
           "' needs dtype, shape, shard_numel and pieces");
    FlatSource src;
    if (!t["dtype"].is_string() ||
        !parseStDType(t["dtype"].get<std::string>(), src.dtype))
      fail("checkpoint: '", where, "': tensor '", name, "' has dtype ",
           t["dtype"].dump());
    for (const Json &d : t["shape"])
      src.shape.push_back(integer(d, "a dimension of '" + name + "'"));
    src.shardNumel = integer(t["shard_numel"], "shard_numel of '" + name + "'");
    if (t.contains("tp_part")) {
      const Json &tp = t["tp_part"];
      if (!tp.is_object() || !tp.contains("dim") || !tp.contains("segments") ||
          !tp["segments"].is_array() || !tp.contains("rank") ||
          !tp.contains("ranks"))
        fail("checkpoint: '", where, "': tensor '", name,
             "' has a tp_part without dim, segments, rank and ranks");
      src.part.dim = int(integer(tp["dim"], "tp_part dim of '" + name + "'"));
      for (const Json &s : tp["segments"])
        src.part.segments.push_back(
            integer(s, "a tp_part segment of '" + name + "'"));
      src.part.ranks =
          int(integer(tp["ranks"], "tp_part ranks of '" + name + "'"));
      src.partRank = int(integer(tp["rank"], "tp_part rank of '" + name + "'"));
      // The layout must describe this part (throws naming what differs).
      src.part.wholeShape(src.shape);
      if (src.partRank >= src.part.ranks)
        fail("checkpoint: '", where, "': tensor '", name, "' is part ",
             src.partRank, " of ", src.part.ranks);
    }
    int64_t numel = numelOf(src.shape);
    for (const Json &piece : t["pieces"]) {
      if (!piece.is_object() || !piece.contains("file") ||
          !piece["file"].is_string() || !piece.contains("begin") ||
          !piece.contains("end"))
        fail("checkpoint: '", where, "': a piece of '", name,
             "' needs file, begin and end");
      FlatPiece fp{piece["file"].get<std::string>(),
                   integer(piece["begin"], "a begin of '" + name + "'"),
                   integer(piece["end"], "an end of '" + name + "'")};
      if (!files.count(fp.file))
        fail("checkpoint: '", where, "': a piece of '", name, "' is in '",
             fp.file, "', which the index does not list as a shard");
      // shard_numel 0: the file holds the whole tensor, whole-shaped.
      int64_t most = src.shardNumel > 0 ? src.shardNumel : numel;
      if (fp.begin >= fp.end || fp.end > numel || fp.end - fp.begin > most ||
          (src.shardNumel == 0 && fp.begin != 0))
        fail("checkpoint: '", where, "': the piece of '", name, "' in '",
             fp.file, "' holds elements [", fp.begin, ", ", fp.end,
             "), not a range of at most shard_numel ", most, " inside its ",
             numel, " elements");
      src.pieces.push_back(fp);
    }
    std::sort(src.pieces.begin(), src.pieces.end(),
              [](const FlatPiece &a, const FlatPiece &b) {
                return a.begin < b.begin;
              });
    c.order.push_back(name);
    c.tensors[name] = src;
  }
  return c;
}

/// Loads `tensors` (whole or flat shards) from the files `c` names: checks
/// everything (names, dtypes, shapes, that the pieces cover every tensor,
/// each file's checksum and tensors) before it copies anything.
TrainingState loadFlat(const std::string &stepDir, const FlatCatalog &c,
                       const std::vector<CheckpointTensor> &tensors,
                       const LoadOptions &options) {
  std::vector<std::string> problems;
  std::set<std::string> requested;
  for (const CheckpointTensor &t : tensors) {
    requested.insert(t.name);
    auto it = c.tensors.find(t.name);
    if (it == c.tensors.end()) {
      problems.push_back("missing tensor '" + t.name + "'");
      continue;
    }
    const FlatSource &src = it->second;
    int64_t numel = numelOf(t.shape);
    size_t eb = stDTypeSize(t.dtype);
    int64_t want = t.shardNumel > 0 ? t.shardNumel : numel;
    if (src.dtype != t.dtype)
      problems.push_back("tensor '" + t.name + "' is " +
                         stDTypeName(src.dtype) + ", expected " +
                         stDTypeName(t.dtype));
    else if (src.shape != t.shape)
      problems.push_back("tensor '" + t.name + "' has shape " +
                         shapeString(src.shape) + ", expected " +
                         shapeString(t.shape));
    else if (t.bytes != size_t(want) * eb)
      problems.push_back("tensor '" + t.name + "': destination holds " +
                         std::to_string(t.bytes) + " bytes, not " +
                         std::to_string(want) + " elements");
    // The pieces must tile the whole tensor: a gap is state nobody saved.
    int64_t next = 0;
    for (const FlatPiece &p : src.pieces) {
      if (p.begin != next)
        break;
      next = p.end;
    }
    if (next != numel)
      problems.push_back("tensor '" + t.name + "': elements [" +
                         std::to_string(next) + ", " + std::to_string(numel) +
                         ") are in no shard (the index does not cover it)");
  }
  if (!options.subset)
    for (const std::string &name : c.order)
      if (!requested.count(name))
        problems.push_back("unexpected tensor '" + name +
                           "' (the model has no such state)");
  if (!problems.empty())
    fail("checkpoint: '", c.describedBy,
         "' does not match this model:", listProblems(problems, 8));

  // The files this rank needs, the state's file first.
  std::vector<std::string> files{c.stateFile};
  for (const CheckpointTensor &t : tensors) {
    int64_t numel = numelOf(t.shape);
    int64_t lo = t.shardNumel > 0 ? t.flatBegin : 0;
    int64_t hi = t.shardNumel > 0 ? std::min(lo + t.shardNumel, numel) : numel;
    for (const FlatPiece &p : c.tensors.at(t.name).pieces)
      if (p.begin < hi && p.end > lo &&
          std::find(files.begin(), files.end(), p.file) == files.end())
        files.push_back(p.file);
  }
  // Staged copies: the destinations change only once every file checked.
  // (LoadOptions::direct: into the destinations themselves.)
  std::vector<std::vector<uint8_t>> staged(tensors.size());
  std::vector<uint8_t *> into(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (options.direct) {
      into[i] = static_cast<uint8_t *>(tensors[i].data);
      if (tensors[i].bytes)
        std::memset(into[i], 0, tensors[i].bytes);
    } else {
      staged[i].assign(tensors[i].bytes, 0);
      into[i] = staged[i].data();
    }
  }
  TrainingState st;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    const std::string path = stepDir + "/" + files[fi];
    if (!fileExists(path))
      fail("checkpoint: shard '", path, "' is missing (", c.describedBy,
           " names it)");
    SafetensorsFile f = SafetensorsFile::open(path);
    f.verifyChecksum();
    if (f.meta("actplace.format") != kFormat)
      fail("checkpoint: '", path, "' is not an actplace checkpoint (format '",
           f.meta("actplace.format"), "')");
    int fileRank = c.fileRank.at(files[fi]);
    if (f.meta("actplace.rank") != std::to_string(fileRank) ||
        f.meta("actplace.world_size") != std::to_string(c.worldSize))
      fail("checkpoint: '", path, "' is the shard of rank ",
           f.meta("actplace.rank"), " of ", f.meta("actplace.world_size"),
           ", but ", c.describedBy, " lists it as rank ", fileRank, " of ",
           c.worldSize);
    if (fi == 0)
      st = stateOf(f, path);
    else if (f.meta("actplace.step") != std::to_string(st.step))
      fail("checkpoint: '", path, "' is of step ", f.meta("actplace.step"),
           ", '", stepDir + "/" + files[0], "' of step ", st.step,
           " (shards of different saves)");
    for (size_t i = 0; i < tensors.size(); ++i) {
      const CheckpointTensor &t = tensors[i];
      const FlatSource &src = c.tensors.at(t.name);
      int64_t numel = numelOf(t.shape);
      int64_t lo = t.shardNumel > 0 ? t.flatBegin : 0;
      int64_t hi =
          t.shardNumel > 0 ? std::min(lo + t.shardNumel, numel) : numel;
      size_t eb = stDTypeSize(t.dtype);
      for (const FlatPiece &p : src.pieces) {
        if (p.file != files[fi] || p.begin >= hi || p.end <= lo)
          continue;
        const StTensorInfo *info = f.find(t.name);
        std::vector<int64_t> shape = src.shardNumel > 0
                                         ? std::vector<int64_t>{src.shardNumel}
                                         : src.shape;
        if (!info)
          fail("checkpoint: '", path, "' has no tensor '", t.name, "' (",
               c.describedBy, " says it holds elements [", p.begin, ", ", p.end,
               ") of it): a shard of another model or save");
        if (info->dtype != src.dtype || info->shape != shape)
          fail("checkpoint: '", path, "': tensor '", t.name, "' is ",
               stDTypeName(info->dtype), " ", shapeString(info->shape), ", ",
               c.describedBy, " says ", stDTypeName(src.dtype), " ",
               shapeString(shape), ": a shard of another model or save");
        int64_t from = std::max(lo, p.begin), to = std::min(hi, p.end);
        std::memcpy(into[i] + size_t(from - lo) * eb,
                    f.data(*info) + size_t(from - p.begin) * eb,
                    size_t(to - from) * eb);
      }
    }
  }
  for (size_t i = 0; i < tensors.size() && !options.direct; ++i)
    if (tensors[i].bytes)
      std::memcpy(tensors[i].data, staged[i].data(), tensors[i].bytes);
  return st;
}

} // namespace

namespace {
/// The training state a checkpoint file's metadata and step tensor record.
TrainingState stateOf(const SafetensorsFile &f, const std::string &path) {
  const StTensorInfo *stepInfo = f.find(kStepTensor);
  if (!stepInfo || stepInfo->dtype != StDType::I64 || !stepInfo->shape.empty())
    fail("checkpoint: '", path, "': missing scalar I64 '", kStepTensor, "'");
  TrainingState st;
  st.step = parseUInt(f.meta("actplace.step"), "step");
  int64_t stepTensor;
  std::memcpy(&stepTensor, f.data(*stepInfo), sizeof(stepTensor));
  if (uint64_t(stepTensor) != st.step)
    fail("checkpoint: '", path, "': step tensor ", stepTensor,
         " disagrees with metadata step ", st.step);
  try {
    st.rng = RngState::deserialize(f.meta("actplace.rng"));
  } catch (const std::exception &e) {
    fail("checkpoint: '", path, "': ", e.what());
  }
  if (!f.meta("actplace.data_cursor").empty())
    st.data = DataCursor::deserialize(f.meta("actplace.data_cursor"));
  // The data section's checksum does not cover the header: the record
  // carries its own, so an edited record is found instead of trusted.
  if (!f.meta(kRunConfigKey).empty()) {
    st.runConfig = mapFromJson(f.meta(kRunConfigKey),
                               "checkpoint: '" + path + "': " + kRunConfigKey);
    std::string recorded = f.meta(kRunConfigHashKey);
    if (recorded != runConfigHash(st.runConfig))
      fail("checkpoint: '", path, "': ", kRunConfigKey,
           " does not match its SHA-256 ", kRunConfigHashKey, " ('", recorded,
           "'): the header was edited or damaged");
  }
  if (!f.meta(kPlacementKey).empty())
    st.placement = mapFromJson(f.meta(kPlacementKey),
                               "checkpoint: '" + path + "': " + kPlacementKey);
  for (const auto &[k, v] : f.metadata())
    if (k.rfind("extra.", 0) == 0)
      st.extra[k.substr(6)] = v;
  return st;
}
} // namespace

std::vector<CheckpointEntry> listCheckpoint(const std::string &stepDir) {
  std::string indexPath = stepDir + "/index.json";
  FlatCatalog c;
  if (fileExists(indexPath)) {
    Json idx = parseJson(readSmallFile(indexPath), "checkpoint: " + indexPath);
    if (!idx.is_object() || !idx.contains("tensors"))
      fail("checkpoint: '", indexPath,
           "' has no \"tensors\" map (per-rank shards that are not flat)");
    c = catalogOfIndex(stepDir, idx);
  } else if (fileExists(stepDir + "/" + checkpointShardName(0, 1))) {
    c = catalogOfFile(stepDir);
  } else {
    fail("checkpoint: '", stepDir, "' holds neither index.json nor ",
         checkpointShardName(0, 1));
  }
  std::vector<CheckpointEntry> out;
  for (const std::string &name : c.order) {
    const FlatSource &s = c.tensors.at(name);
    out.push_back({name, s.dtype, s.shape, s.part, s.partRank});
  }
  return out;
}

TrainingState loadCheckpoint(const std::string &stepDir,
                             const std::vector<CheckpointTensor> &tensors,
                             const ShardInfo &shard,
                             const LoadOptions &options) {
  // The index (present for distributed saves) tells a world-size mismatch
  // apart from a missing file.
  std::string indexPath = stepDir + "/index.json";
  int savedWorld = 1;
  bool sharded = false;
  for (const CheckpointTensor &t : tensors)
    sharded = sharded || t.shardNumel > 0;
  if (fileExists(indexPath)) {
    Json idx = parseJson(readSmallFile(indexPath), "checkpoint: " + indexPath);
    auto ws = idx.find("world_size"); // end() when idx is no object
    if (ws == idx.end() || !ws->is_number_unsigned() ||
        ws->get<uint64_t>() == 0 || ws->get<uint64_t>() > uint64_t(INT_MAX))
      fail("checkpoint: '", indexPath, "' has no valid world_size");
    savedWorld = int(ws->get<uint64_t>());
    if (idx.contains("tensors"))
      return loadFlat(stepDir, catalogOfIndex(stepDir, idx), tensors, options);
  } else if (sharded || options.subset) {
    return loadFlat(stepDir, catalogOfFile(stepDir), tensors, options);
  } else {
    requireWholeFile(stepDir);
  }
  if (sharded)
    fail("checkpoint: '", stepDir, "' holds per-rank shards without a flat ",
         "index; a flat-sharded (ZeRO-3) run cannot load it");
  if (options.subset)
    fail("checkpoint: '", stepDir, "': loading some tensors needs a flat ",
         "index or a world-of-one file");
  if (savedWorld != shard.worldSize)
    fail("checkpoint: '", stepDir, "' was saved by ", savedWorld,
         " rank(s) but this run has ", shard.worldSize,
         " (per-rank shards without a flat index load only on as many ranks)");
  std::string path =
      stepDir + "/" + checkpointShardName(shard.rank, shard.worldSize);
  SafetensorsFile f = SafetensorsFile::open(path);
  f.verifyChecksum();
  if (f.meta("actplace.format") != kFormat)
    fail("checkpoint: '", path, "' is not an actplace checkpoint (format '",
         f.meta("actplace.format"), "')");
  if (f.meta("actplace.rank") != std::to_string(shard.rank) ||
      f.meta("actplace.world_size") != std::to_string(shard.worldSize))
    fail("checkpoint: '", path, "' belongs to rank ", f.meta("actplace.rank"),
         " of ", f.meta("actplace.world_size"));

  // Check everything first, copy afterwards: a failed load leaves the
  // destination buffers untouched.
  std::vector<std::string> problems;
  std::set<std::string> requested;
  for (const CheckpointTensor &t : tensors) {
    requested.insert(t.name);
    const StTensorInfo *info = f.find(t.name);
    if (!info) {
      problems.push_back("missing tensor '" + t.name + "'");
      continue;
    }
    if (info->dtype != t.dtype)
      problems.push_back("tensor '" + t.name + "' is " +
                         stDTypeName(info->dtype) + ", expected " +
                         stDTypeName(t.dtype));
    else if (info->shape != t.shape)
      problems.push_back("tensor '" + t.name + "' has shape " +
                         shapeString(info->shape) + ", expected " +
                         shapeString(t.shape));
    else if (info->bytes() != t.bytes)
      problems.push_back("tensor '" + t.name + "': destination holds " +
                         std::to_string(t.bytes) + " bytes, file " +
                         std::to_string(info->bytes()));
  }
  for (const StTensorInfo &info : f.tensors())
    if (info.name != kStepTensor && !requested.count(info.name))
      problems.push_back("unexpected tensor '" + info.name +
                         "' (the model has no such state)");
  const StTensorInfo *stepInfo = f.find(kStepTensor);
  if (!stepInfo || stepInfo->dtype != StDType::I64 || !stepInfo->shape.empty())
    problems.push_back(std::string("missing scalar I64 '") + kStepTensor + "'");
  if (!problems.empty())
    fail("checkpoint: '", path,
         "' does not match this model:", listProblems(problems, 8));

  TrainingState st = stateOf(f, path);

  for (const CheckpointTensor &t : tensors)
    if (t.bytes)
      std::memcpy(t.data, f.data(*f.find(t.name)), t.bytes);
  return st;
}

//===----------------------------------------------------------------------===//
// Name mapping
//===----------------------------------------------------------------------===//

namespace {

constexpr const char *kIndex = "{i}";

std::vector<std::string> splitPattern(const std::string &p) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t at = p.find(kIndex, start);
    if (at == std::string::npos) {
      parts.push_back(p.substr(start));
      return parts;
    }
    parts.push_back(p.substr(start, at - start));
    start = at + 3;
  }
}

/// Matches `name` against literal parts separated by "{i}" slots (one or
/// more digits each); fills the captured numbers.
bool matchPattern(const std::vector<std::string> &parts,
                  const std::string &name, std::vector<std::string> &captures) {
  captures.clear();
  size_t pos = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (name.compare(pos, parts[i].size(), parts[i]) != 0)
      return false;
    pos += parts[i].size();
    if (i + 1 == parts.size())
      return pos == name.size();
    size_t digits = pos;
    while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9')
      ++digits;
    if (digits == pos)
      return false;
    captures.push_back(name.substr(pos, digits - pos));
    pos = digits;
  }
  return false;
}

size_t countSlots(const std::string &p) { return splitPattern(p).size() - 1; }

float halfToFloat(uint16_t h) {
  uint32_t sign = uint32_t(h >> 15) << 31;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    // Zero or subnormal: value = mant * 2^-24 exactly representable in float.
    float v = std::ldexp(float(mant), -24);
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else {
    bits = sign | (uint32_t(exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

bool isFloat(StDType t) {
  return t == StDType::BF16 || t == StDType::F16 || t == StDType::F32 ||
         t == StDType::F64;
}

double readFloat(const uint8_t *p, StDType t, size_t i) {
  switch (t) {
  case StDType::BF16: {
    uint16_t b;
    std::memcpy(&b, p + 2 * i, 2);
    return ap::kernels::bf16::toFloat(b);
  }
  case StDType::F16: {
    uint16_t b;
    std::memcpy(&b, p + 2 * i, 2);
    return halfToFloat(b);
  }
  case StDType::F32: {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  default: {
    double d;
    std::memcpy(&d, p + 8 * i, 8);
    return d;
  }
  }
}

void writeFloat(void *dst, StDType t, size_t i, double v) {
  switch (t) {
  case StDType::BF16: {
    // Round once from the source value: via float is exact for BF16/F16/F32
    // sources; F64 sources round twice (to float, then bf16), documented.
    uint16_t b = ap::kernels::bf16::fromFloat(float(v));
    std::memcpy(static_cast<uint8_t *>(dst) + 2 * i, &b, 2);
    break;
  }
  case StDType::F32: {
    float f = float(v);
    std::memcpy(static_cast<uint8_t *>(dst) + 4 * i, &f, 4);
    break;
  }
  default:
    std::memcpy(static_cast<uint8_t *>(dst) + 8 * i, &v, 8);
    break;
  }
}

} // namespace

void NameMapping::addRule(const std::string &externalPattern,
                          const std::string &internalPattern) {
  if (externalPattern.empty() || internalPattern.empty())
    fail("name mapping: empty pattern");
  if (countSlots(externalPattern) != countSlots(internalPattern))
    fail("name mapping: '", externalPattern, "' -> '", internalPattern,
         "' use different numbers of {i} slots");
  if (externalPattern.find(std::string(kIndex) + kIndex) != std::string::npos)
    fail("name mapping: '", externalPattern, "' has adjacent {i} slots");
  rules_.emplace_back(externalPattern, internalPattern);
}

NameMapping NameMapping::parse(const std::string &text) {
  NameMapping m;
  std::istringstream in(text);
  std::string line;
  int lineNo = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    size_t hash = line.find('#');
    if (hash != std::string::npos)
      line.resize(hash);
    size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos)
      continue;
    size_t arrow = line.find("->");
    if (arrow == std::string::npos)
      fail("name mapping: line ", lineNo, ": expected 'external -> internal'");
    auto trim = [](std::string s) {
      size_t x = s.find_first_not_of(" \t\r");
      size_t y = s.find_last_not_of(" \t\r");
      return x == std::string::npos ? std::string() : s.substr(x, y - x + 1);
    };
    std::string ext = trim(line.substr(0, arrow));
    std::string in2 = trim(line.substr(arrow + 2));
    if (ext.empty() || in2.empty() || ext.find(' ') != std::string::npos ||
        in2.find(' ') != std::string::npos)
      fail("name mapping: line ", lineNo, ": expected 'external -> internal'");
    try {
      m.addRule(ext, in2);
    } catch (const Error &e) {
      fail("name mapping: line ", lineNo, ": ", e.what());
    }
  }
  return m;
}

std::optional<std::string> NameMapping::map(const std::string &external) const {
  std::vector<std::string> caps;
  for (const auto &[ext, internal] : rules_) {
    if (!matchPattern(splitPattern(ext), external, caps))
      continue;
    std::vector<std::string> parts = splitPattern(internal);
    std::string out = parts[0];
    for (size_t i = 1; i < parts.size(); ++i)
      out += caps[i - 1] + parts[i];
    return out;
  }
  return std::nullopt;
}

MappedLoadReport loadMappedWeights(const std::string &path,
                                   const NameMapping &mapping,
                                   const std::vector<CheckpointTensor> &tensors,
                                   bool allowUnmapped) {
  SafetensorsFile f = SafetensorsFile::open(path);
  // External files rarely carry our checksum; verify it when they do.
  if (!f.meta("actplace.sha256").empty())
    f.verifyChecksum();
  std::map<std::string, const CheckpointTensor *> dest;
  for (const CheckpointTensor &t : tensors)
    dest[t.name] = &t;
  std::map<std::string, const StTensorInfo *> source; // our name -> file tensor
  MappedLoadReport report;
  std::vector<std::string> problems;
  for (const StTensorInfo &info : f.tensors()) {
    std::optional<std::string> ours = mapping.map(info.name);
    if (!ours || !dest.count(*ours)) {
      report.unmapped.push_back(info.name);
      if (!allowUnmapped)
        problems.push_back(ours ? "'" + info.name + "' maps to '" + *ours +
                                      "', which the model does not have"
                                : "no rule maps '" + info.name + "'");
      continue;
    }
    if (source.count(*ours)) {
      problems.push_back("'" + info.name + "' and '" + source[*ours]->name +
                         "' both map to '" + *ours + "'");
      continue;
    }
    source[*ours] = &info;
    const CheckpointTensor &t = *dest[*ours];
    if (info.shape != t.shape)
      problems.push_back("'" + info.name + "' has shape " +
                         shapeString(info.shape) + " but '" + t.name +
                         "' needs " + shapeString(t.shape));
    else if (info.dtype != t.dtype &&
             !(isFloat(info.dtype) &&
               (t.dtype == StDType::BF16 || t.dtype == StDType::F32 ||
                t.dtype == StDType::F64)))
      problems.push_back("'" + info.name + "' is " + stDTypeName(info.dtype) +
                         ", cannot convert to " + stDTypeName(t.dtype));
    else if (t.bytes != info.numElements() * stDTypeSize(t.dtype))
      problems.push_back("destination '" + t.name + "' has the wrong size");
  }
  for (const CheckpointTensor &t : tensors)
    if (!source.count(t.name))
      problems.push_back("no tensor in the file maps to '" + t.name + "'");
  if (!problems.empty())
    fail("checkpoint: cannot load weights from '", path,
         "':", listProblems(problems, 8));
  for (const auto &[ours, info] : source) {
    const CheckpointTensor &t = *dest[ours];
    if (info->dtype == t.dtype) {
      std::memcpy(t.data, f.data(*info), size_t(info->bytes()));
    } else {
      size_t n = size_t(info->numElements());
      for (size_t i = 0; i < n; ++i)
        writeFloat(t.data, t.dtype, i,
                   readFloat(f.data(*info), info->dtype, i));
    }
    report.loaded.push_back(info->name);
  }
  return report;
}

} // namespace ap::rt
