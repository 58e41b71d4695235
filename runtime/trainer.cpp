//===- trainer.cpp - The training binary's driver ---------------*- C++ -*-===//
//
// See trainer.h. trainMain: the flags, the checkpoint to resume and the
// --save folder checked before the device starts, device, arena and pinned
// pool once, parameter init, the run loop (metrics line per step, the
// finiteness check, checkpoints) and the run configuration a checkpoint
// records. The step's support calls are in step_runner.cpp, the --op-times
// and --op-timeline collection in op_timing.cpp, the parameters' init,
// --init-weights and --dump-grads in train_params.cpp.
//
//===----------------------------------------------------------------------===//
#include "runtime/trainer.h"
#include "runtime/abi.h"
#include "runtime/op_timing.h"
#include "runtime/tensor_parts.h"
#include "runtime/train_params.h"
#include "runtime/weights.h"
#include "support/DeviceReserve.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <set>
#include <sys/stat.h>
#include <thread>

namespace ap::rt {

using kernels::DType;
using kernels::KernelContext;
using kernels::Status;

namespace {

/// A tensor-parallel rank's part of a split parameter's tensor in a
/// checkpoint: "<tensor>#tp<rank>of<size>" (docs/checkpoint-format.md).
std::string tensorPartName(const std::string &name, int tpRank, int tpSize) {
  return name + "#tp" + std::to_string(tpRank) + "of" + std::to_string(tpSize);
}

/// What a checkpoint holds of `p` on `rank` (no data yet): every
/// parameter's compute copy and, when trainable, its FP32 master and Adam
/// moments, each with its arena offset. ZeRO-3 on several ranks: this
/// rank's flat shards (CheckpointTensor::shardNumel).
std::vector<std::pair<CheckpointTensor, uint64_t>>
describeCheckpointTensors(const Program &p, int rank, int tpRank = 0) {
  std::vector<std::pair<CheckpointTensor, uint64_t>> out;
  bool flat =
      p.dataParallelMode == DataParallelMode::Zero3 && p.dataParallelSize > 1;
  auto add = [&](const std::string &name, StDType dt, const ParamEntry &e,
                 uint64_t offset, size_t elemSize) {
    ShardSpan span = shardSpan(e, rank);
    CheckpointTensor t;
    t.name = e.tpDim >= 0 ? tensorPartName(name, tpRank, p.tensorParallelSize)
                          : name;
    if (e.tpDim >= 0) {
      t.part = partLayoutOf(e, p.tensorParallelSize);
      t.partRank = tpRank;
    }
    t.dtype = dt;
    t.shape.assign(e.shape, e.shape + e.rank);
    t.bytes = size_t(span.bufferNumel) * elemSize;
    if (flat) {
      t.shardNumel = span.bufferNumel;
      t.flatBegin = span.begin;
    }
    out.push_back({t, offset});
  };
  for (const ParamEntry &e : p.params) {
    add(paramTensorName(e.name), stDTypeOf(e.dtype), e, e.weight,
        size_t(elemBytes(e.dtype)));
    if (e.frozen)
      continue;
    add(masterTensorName(e.name), StDType::F32, e, e.master, 4);
    add(adamMTensorName(e.name), StDType::F32, e, e.adamM, 4);
    add(adamVTensorName(e.name), StDType::F32, e, e.adamV, 4);
  }
  return out;
}

/// The tensor-parallel size a checkpoint was saved with: T from its
/// parts' "#tp<r>of<T>" names, 1 without any; 0 when its tensors cannot be
/// listed (loadCheckpoint then says why).
int savedTensorParallel(const std::string &stepDir) {
  std::vector<CheckpointEntry> entries;
  try {
    entries = listCheckpoint(stepDir);
  } catch (const Error &) {
    return 0;
  }
  for (const CheckpointEntry &e : entries) {
    size_t at = e.name.rfind("#tp");
    size_t of = at == std::string::npos ? at : e.name.find("of", at);
    if (of != std::string::npos)
      return std::atoi(e.name.c_str() + of + 2);
  }
  return 1;
}

/// Loads a checkpoint saved under another tensor-parallel size into
/// `mirror` (this rank's tensors under `tpSize`): every tensor is read
/// whole (a saved part's siblings joined by the index's tp_part layout),
/// and this rank takes its part of each split one. Whole tensors only (no
/// ZeRO-3 flat shards on either side).
TrainingState loadResharded(const std::string &stepDir,
                            std::vector<CheckpointTensor> &mirror, int tpRank,
                            int tpSize) {
  std::vector<CheckpointEntry> entries = listCheckpoint(stepDir);
  auto baseOf = [](const std::string &name) {
    size_t at = name.rfind("#tp");
    return at == std::string::npos ? name : name.substr(0, at);
  };
  // The saved tensors of each whole tensor: itself, or its parts by rank.
  std::map<std::string, std::vector<const CheckpointEntry *>> saved;
  for (const CheckpointEntry &e : entries) {
    auto &slot = saved[baseOf(e.name)];
    if (e.part.dim < 0) {
      slot.assign(1, &e);
      continue;
    }
    slot.resize(size_t(e.part.ranks), nullptr);
    slot[size_t(e.partRank)] = &e;
  }
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<CheckpointTensor> requests;
  std::vector<std::vector<size_t>> sources(mirror.size());
  buffers.reserve(entries.size());
  for (size_t i = 0; i < mirror.size(); ++i) {
    const CheckpointTensor &m = mirror[i];
    if (m.shardNumel > 0)
      fail("--resume: resharding a tensor-parallel checkpoint into ZeRO-3 "
           "shards is not supported (resume with --tensor-parallel as saved)");
    auto it = saved.find(baseOf(m.name));
    if (it == saved.end())
      fail("--resume: checkpoint '", stepDir, "' has no tensor '",
           baseOf(m.name), "' (nor parts of it)");
    for (const CheckpointEntry *e : it->second) {
      if (!e)
        fail("--resume: checkpoint '", stepDir, "' misses a part of '",
             it->first, "'");
      int64_t n = 1;
      for (int64_t d : e->shape)
        n *= d;
      buffers.emplace_back(size_t(n) * stDTypeSize(e->dtype));
      CheckpointTensor r;
      r.name = e->name;
      r.dtype = e->dtype;
      r.shape = e->shape;
      r.data = buffers.back().data();
      r.bytes = buffers.back().size();
      requests.push_back(r);
      sources[i].push_back(requests.size() - 1);
    }
  }
  LoadOptions lo;
  lo.subset = true;
  lo.direct = true;
  TrainingState st = loadCheckpoint(stepDir, requests, ShardInfo{}, lo);
  for (size_t i = 0; i < mirror.size(); ++i) {
    CheckpointTensor &m = mirror[i];
    const std::vector<const CheckpointEntry *> &from =
        saved.find(baseOf(m.name))->second;
    const CheckpointEntry &first = *from.front();
    if (first.dtype != m.dtype)
      fail("--resume: tensor '", first.name, "' is ", stDTypeName(first.dtype),
           ", this run holds ", stDTypeName(m.dtype));
    size_t elem = stDTypeSize(m.dtype);
    // The whole tensor: the saved one, or its parts joined.
    std::vector<uint8_t> joined;
    const void *whole = requests[sources[i].front()].data;
    std::vector<int64_t> wholeShape = first.shape;
    if (first.part.dim >= 0) {
      std::vector<const void *> parts;
      for (size_t k : sources[i])
        parts.push_back(requests[k].data);
      wholeShape = first.part.wholeShape(first.shape);
      joined.resize(requests[sources[i].front()].bytes * parts.size());
      first.part.join(first.shape, elem, parts, joined.data());
      whole = joined.data();
    }
    if (m.part.dim >= 0) {
      if (m.part.wholeShape(m.shape) != wholeShape)
        fail("--resume: tensor '", baseOf(m.name),
             "' is saved with another "
             "whole shape than this model's");
      m.part.take(m.shape, tpRank, elem, whole, m.data);
    } else {
      if (wholeShape != m.shape)
        fail("--resume: tensor '", m.name,
             "' is saved with another shape "
             "than this model's");
      std::memcpy(m.data, whole, m.bytes);
    }
  }
  (void)tpSize;
  return st;
}

/// Tensor parallelism: every tensor of the checkpoint with the file that
/// holds it, tensor-parallel rank r's parts of split parameters in file r,
/// the replicated tensors (the same on every rank) in file 0.
/// With pipeline stages too: file stage x T + r. Under ZeRO-3 (no stages)
/// each tensor-parallel rank's tensors are flat-sharded over its
/// data-parallel ranks: file r x DP + d holds rank (r, d)'s shards, and a
/// tensor is placed at the first file of its group (ShardInfo::
/// placedGroup).
std::vector<std::pair<CheckpointTensor, int>>
tensorParallelFiles(const std::vector<Program> &stages) {
  std::vector<std::pair<CheckpointTensor, int>> out;
  std::set<std::string> placed;
  const Program &p0 = stages.at(0);
  const int tp = p0.tensorParallelSize;
  const int group =
      p0.dataParallelMode == DataParallelMode::Zero3 ? p0.dataParallelSize : 1;
  for (size_t s = 0; s < stages.size(); ++s)
    for (int r = 0; r < tp; ++r)
      for (auto &[t, offset] : describeCheckpointTensors(stages[s], 0, r))
        if (placed.insert(t.name).second)
          out.push_back(
              {t, (int(s) * tp +
                   (t.name.find("#tp") != std::string::npos ? r : 0)) *
                      group});
  return out;
}

/// Host copies of everything a checkpoint holds: parameters (storage
/// dtype), FP32 masters and Adam moments. Main grads are zero between steps
/// (AdamW zeroes them) and are not saved.
struct CheckpointMirror {
  std::vector<std::vector<char>> buffers;
  std::vector<CheckpointTensor> tensors;
  std::vector<std::pair<uint64_t, size_t>> device; ///< arena offset, index

  /// ZeRO-3 on several ranks: this rank's flat shards (CheckpointTensor::
  /// shardNumel), saved one file per rank with an index; a world of one
  /// holds whole tensors and saves them as replicate does.
  CheckpointMirror(const Program &p, int rank, int tpRank = 0) {
    for (auto [t, offset] : describeCheckpointTensors(p, rank, tpRank)) {
      buffers.emplace_back(t.bytes);
      tensors.push_back(t);
      device.push_back({offset, tensors.size() - 1});
    }
    for (size_t i = 0; i < tensors.size(); ++i)
      tensors[i].data = buffers[i].data();
  }

  void fromDevice(Device &dev) {
    dev.synchronize();
    for (auto [offset, i] : device)
      dev.copyToHostSync(buffers[i].data(), dev.at(offset, tensors[i].bytes),
                         tensors[i].bytes);
  }
  void toDevice(Device &dev) {
    for (auto [offset, i] : device)
      dev.copyAsync(dev.at(offset, tensors[i].bytes), buffers[i].data(),
                    tensors[i].bytes, CopyKind::HostToDevice, Stream::Compute);
    dev.synchronize();
  }
};

/// The first tensor of the mirror holding a value that is not finite (NaN
/// or +-Inf), or "" when all are.
std::string firstNonFinite(const CheckpointMirror &mirror) {
  for (size_t i = 0; i < mirror.tensors.size(); ++i) {
    const CheckpointTensor &t = mirror.tensors[i];
    const char *b = mirror.buffers[i].data();
    bool finite = true;
    if (t.dtype == StDType::BF16) {
      for (size_t j = 0; finite && j < t.bytes / 2; ++j) {
        uint16_t v;
        std::memcpy(&v, b + 2 * j, 2);
        finite = (v & 0x7f80u) != 0x7f80u;
      }
    } else if (t.dtype == StDType::F32) {
      for (size_t j = 0; finite && j < t.bytes / 4; ++j) {
        float v;
        std::memcpy(&v, b + 4 * j, 4);
        finite = std::isfinite(v);
      }
    } else if (t.dtype == StDType::F64) {
      for (size_t j = 0; finite && j < t.bytes / 8; ++j) {
        double v;
        std::memcpy(&v, b + 8 * j, 8);
        finite = std::isfinite(v);
      }
    }
    if (!finite)
      return t.name;
  }
  return "";
}

/// `v` for a message ("nan" whatever its sign bit).
std::string valueText(float v) {
  if (std::isnan(v))
    return "nan";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", double(v));
  return buf;
}

/// After a step: what of it is not finite ("" when all is). The loss and
/// the grad norm are the step's host scalars; the updated master weights
/// and Adam moments are reduced on the device, one L2-norm launch over each
/// (a NaN or Inf anywhere makes the norm NaN or Inf; so does a value near
/// float's limit, whose square overflows: no healthier), only when
/// `checkState`. Compute copies are roundings of the masters. `sharded`
/// (ZeRO-3 on several ranks): each rank reduces its shards and the norms
/// are combined over the ranks (root of the rank-order sum of squares), so
/// every rank sees the same verdict and all stop together; every rank must
/// then call it alike (it is collective).
std::string nonFiniteInStep(StepRunner &r,
                            const std::vector<kernels::GradTensor> &masters,
                            const std::vector<kernels::GradTensor> &moments1,
                            const std::vector<kernels::GradTensor> &moments2,
                            bool checkState, bool sharded, bool pipelined) {
  if (!std::isfinite(r.loss))
    return "the loss is " + valueText(r.loss);
  if (!std::isfinite(r.gradNorm))
    return "the grad norm is " + valueText(r.gradNorm) + " (loss " +
           valueText(r.loss) + ")";
  if ((masters.empty() && !sharded && !pipelined) || !checkState)
    return "";
  const std::vector<kernels::GradTensor> *groups[] = {&masters, &moments1,
                                                      &moments2};
  const char *names[] = {"the master weights", "the Adam first moments",
                         "the Adam second moments"};
  float *out = reinterpret_cast<float *>(r.scratch(AP_SCRATCH_STATE_NORMS));
  float norms[3] = {0, 0, 0};
  for (int g = 0; g < 3 && !masters.empty(); ++g) {
    kernels::GradNormArgs args;
    args.tensors = groups[g]->data();
    args.numTensors = int64_t(groups[g]->size());
    args.maxNorm = 0;
    args.norm = out + g;
    r.dev.launch(
        Stream::Compute, "check_finite",
        [args](const KernelContext &c) { return kernels::gradNorm(c, args); });
  }
  if (!masters.empty())
    r.dev.copyToHostSync(norms, out, sizeof(norms));
  if (sharded || pipelined) {
    // Pipeline stages: each holds its own parameters, so the verdict is
    // over all of them (the same on every stage, which all stop together).
    std::vector<double> squares(3);
    for (int g = 0; g < 3; ++g)
      squares[g] = double(norms[g]) * double(norms[g]);
    if (sharded)
      squares = r.sumOverRanks(squares);
    if (pipelined)
      squares = r.sumOverStages(squares);
    for (int g = 0; g < 3; ++g)
      norms[g] = float(std::sqrt(squares[g]));
  }
  for (int g = 0; g < 3; ++g)
    if (!std::isfinite(norms[g]))
      return std::string(names[g]) +
             " are not finite after the update (L2 norm " +
             valueText(norms[g]) + "; loss " + valueText(r.loss) +
             ", grad norm " + valueText(r.gradNorm) + ")";
  return "";
}

/// The step folder's parent: the folder a --resume argument saves into.
std::string parentFolder(const std::string &stepDir) {
  size_t slash = stepDir.find_last_of('/');
  return slash == std::string::npos ? std::string(".")
                                    : stepDir.substr(0, slash ? slash : 1);
}

/// Whether two paths name one existing folder.
bool sameFolder(const std::string &a, const std::string &b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 &&
         sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/// "; 'DIR/latest' still names step-00000003" (or that none was saved).
std::string latestNote(const std::string &saveDir) {
  if (saveDir.empty())
    return "";
  CheckpointFolderContents c = inspectCheckpointFolder(saveDir);
  if (!c.latestStep)
    return "; no checkpoint was saved in '" + saveDir + "'";
  return "; '" + saveDir + "/latest' still names step " +
         std::to_string(*c.latestStep);
}

/// This process's place in the run, for trainMain's error lines: set by
/// run() once the launch is known; `communicating` once the world
/// communicator exists (an error then ends the process at once, see
/// trainMain).
struct RankContext {
  int rank = 0, worldSize = 1;
  bool communicating = false;
};
RankContext rankContext;

/// SHA-256 of what every rank must agree on to train one model together:
/// the program (model and its settings, shapes, microbatches, the plan's
/// sizes, slots, scopes, state offsets and events, the parameter table
/// with its offsets, the optimizer, the data-parallel size and mode) and,
/// second half, the flags that decide the numbers or the collectives each
/// step makes (steps, seed, lr, data, resume, init weights, saving).
std::pair<std::string, std::string> runDigests(const Program &p,
                                               const TrainFlags &flags) {
  std::string prog = std::string(p.model) + "\n";
  for (const auto &[field, value] : p.modelConfig)
    prog += std::string(field) + "=" + value + "\n";
  auto add = [&](auto... v) {
    ((prog += std::to_string(v) + " "), ...);
    prog += "\n";
  };
  add(p.microBatches, p.batch, p.seq, p.vocab);
  add(p.persistentBytes, p.activationBytes, p.workspaceBytes, p.arenaBytes,
      p.pinnedBytes, p.sideWorkspaceBytes, p.scratchBytes, p.scratchOffset);
  add(int(p.sideKernels), int(p.sideAfterHostStart), p.sideSmPercent,
      p.numEvents, p.dataParallelSize, int(p.dataParallelMode), p.pipelineSize,
      p.pipelineStage);
  const StateOffsets &st = p.state;
  add(st.lossSum, st.tokenCount, st.gradNorm, st.lr, st.loss);
  for (const PinnedSlotSpec &sl : p.slots)
    add(sl.offset, sl.bytes);
  for (const std::string &sc : p.scopes)
    prog += sc + "\n";
  for (const ParamEntry &e : p.params) {
    prog += std::string(e.name) + " ";
    add(int(e.dtype), e.rank, e.shape[0], e.shape[1], e.shape[2], e.shape[3],
        int(e.init), int(e.frozen), e.weight, e.master, e.grad, e.adamM,
        e.adamV, e.shardNumel, int(e.mainGradBf16), int(e.pipelineTied),
        e.tiedGrad);
    prog += exactNumberText(e.initA) + " " + exactNumberText(e.initB) + "\n";
  }
  const OptimizerSettings &o = p.optimizer;
  prog += exactNumberText(p.maxLr) + " " + exactNumberText(o.minLr) + " " +
          exactNumberText(o.maxGradNorm) + "\n";
  add(int(o.known), o.warmupSteps, o.totalSteps);
  for (const AdamWSettings &a : o.adamw)
    prog += std::to_string(a.param) + " " + exactNumberText(a.beta1) + " " +
            exactNumberText(a.beta2) + " " + exactNumberText(a.eps) + " " +
            exactNumberText(a.weightDecay) + "\n";
  std::string run = std::to_string(flags.steps) + "\n" +
                    std::to_string(flags.seed) + "\n" +
                    exactNumberText(flags.lr) + "\n" + flags.data + "\n" +
                    flags.resume + "\n" + flags.initWeights + "\n" +
                    flags.save + "\n" + std::to_string(flags.saveEvery) + "\n" +
                    (flags.overwrite ? "overwrite" : "") + "\n";
  auto digest = [](const std::string &text) {
    Sha256 h;
    h.update(text.data(), text.size());
    std::array<uint8_t, 32> d = h.finish();
    return std::string(reinterpret_cast<const char *>(d.data()), d.size());
  };
  return {digest(prog), digest(run)};
}

/// Every rank's `mine` (the same size on every rank, a multiple of 4
/// bytes), by rank. The communicator's backend decides where the buffers
/// live: host memory for self and MPI; for NCCL the start of the device
/// arena, which must be allocated and hold nothing yet.
std::vector<std::string> allGatherBytes(Communicator &world, Device *dev,
                                        const std::string &mine) {
  size_t n = mine.size(), ranks = size_t(world.size());
  std::string all(n * ranks, '\0');
  if (world.backend() == kernels::Backend::Host) {
    world.allGather(mine.data(), all.data(), n / 4, DType::I32, nullptr);
  } else {
    if (!dev || !dev->hasArena())
      fail("the ranks' program check needs the device arena");
    void *send = dev->at(0, n), *recv = dev->at(n, n * ranks);
    dev->copyAsync(send, mine.data(), n, CopyKind::HostToDevice,
                   Stream::Compute);
    dev->synchronize();
    world.allGather(send, recv, n / 4, DType::I32,
                    dev->nativeStream(Stream::Compute));
    dev->synchronize();
    dev->copyToHostSync(all.data(), recv, all.size());
  }
  std::vector<std::string> out;
  for (size_t r = 0; r < ranks; ++r)
    out.push_back(all.substr(r * n, n));
  return out;
}

/// Refuses ranks that run different programs or different training flags
/// (they would deadlock in mismatched collectives or silently average
/// different models): collective over `world`, every rank fails alike,
/// naming the ranks that differ from rank 0 and both hashes.
void checkSameRun(Communicator &world, Device *dev,
                  const std::vector<Program> &stages, const TrainFlags &flags) {
  // A pipelined binary: every rank holds every stage's program.
  auto [prog, run] = runDigests(stages.at(0), flags);
  if (stages.size() > 1) {
    Sha256 h;
    for (const Program &p : stages) {
      std::string d = runDigests(p, flags).first;
      h.update(d.data(), d.size());
    }
    std::array<uint8_t, 32> d = h.finish();
    prog.assign(reinterpret_cast<const char *>(d.data()), d.size());
  }
  std::vector<std::string> all = allGatherBytes(world, dev, prog + run);
  auto hex = [](const std::string &d) {
    std::array<uint8_t, 32> a;
    std::memcpy(a.data(), d.data(), 32);
    return Sha256::hex(a).substr(0, 16);
  };
  std::vector<std::string> problems;
  for (size_t r = 1; r < all.size(); ++r) {
    std::string p0 = all[0].substr(0, 32), pr = all[r].substr(0, 32);
    std::string f0 = all[0].substr(32), fr = all[r].substr(32);
    if (pr != p0)
      problems.push_back("rank " + std::to_string(r) +
                         " runs another program than rank 0 (program hash " +
                         hex(pr) + " on rank " + std::to_string(r) + ", " +
                         hex(p0) + " on rank 0)");
    else if (fr != f0)
      problems.push_back("rank " + std::to_string(r) +
                         " was started with other training flags than rank "
                         "0 (--steps, --seed, --lr, --data, --resume, "
                         "--init-weights, --save, --save-every, --overwrite; "
                         "flags hash " +
                         hex(fr) + " on rank " + std::to_string(r) + ", " +
                         hex(f0) + " on rank 0)");
  }
  if (!problems.empty())
    fail("the ", all.size(), " ranks must run one binary with the same flags:",
         listProblems(problems, 8));
}

/// Refuses, before anything is allocated, a plan that cannot fit: the
/// arena (and any workspace tail) plus the reserve above must be free on
/// the device (cuda: measured, capped by --device-memory; host: only when
/// --device-memory simulates a capacity). The message names both numbers.
/// Returns the free memory the backend measured (none on the host), before
/// any --device-memory cap, for the metrics.
std::optional<uint64_t> checkPlanFits(Device &dev,
                                      std::optional<uint64_t> deviceMemory,
                                      int worldSize, uint64_t allocBytes,
                                      uint64_t planBytes) {
  const std::optional<uint64_t> measured = dev.backend().deviceMemoryFree();
  std::optional<uint64_t> freeBytes = measured;
  uint64_t reserve = 0;
  // Device memory the run needs beside the arena: the cuBLASLt handle and,
  // on several ranks, NCCL's buffers (support/DeviceReserve.h, the numbers
  // the compiler's --memory-budget=device keeps back too). A stated
  // margin, not a measurement; the host backend allocates nothing beside
  // the arena.
  if (dev.kind() == DeviceKind::Cuda)
    reserve = ap::support::startReserveBytes(worldSize);
  if (deviceMemory)
    freeBytes = freeBytes ? std::min(*freeBytes, *deviceMemory) : *deviceMemory;
  if (!freeBytes)
    return measured;
  uint64_t need = allocBytes + reserve;
  if (need <= *freeBytes)
    return measured;
  auto gib = [](uint64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(1ull << 30));
    return std::string(buf);
  };
  fail("the compiled plan does not fit this device: it needs ", need,
       " bytes (", gib(need), ": the planned arena of ", planBytes, " bytes",
       allocBytes > planBytes
           ? ", workspace beyond the plan " +
                 std::to_string(allocBytes - planBytes) + " bytes"
           : std::string(),
       reserve ? ", a reserve of " + std::to_string(reserve) +
                     " bytes for cuBLASLt" +
                     (worldSize > 1 ? std::string(" and NCCL") : "")
               : std::string(),
       ") and the device has ", *freeBytes, " bytes (", gib(*freeBytes),
       ") free", deviceMemory ? " (--device-memory)" : "",
       "; recompile with a placement that removes more (actplace-compile "
       "--memory-budget, --offload-modules, --recompute-modules) or a smaller "
       "micro-batch");
}

int run(int argc, char **argv, const std::vector<Program> &stages) {
  rankContext = RankContext();
  const Program &p0 = stages.at(0);
  TrainFlags defaults;
  if (p0.maxLr > 0)
    defaults.lr = p0.maxLr; // the compiled schedule's peak
  TrainFlags flags = parseTrainFlags(argc, argv, defaults);
  if (flags.help) {
    std::fputs(flags.usage.c_str(), stdout);
    return 0;
  }
  // Data parallelism: the plan is per rank and static, so the world size
  // is compiled in; every rank trains the whole model on its share of the
  // global batch and the step sums the loss, the token count and the main
  // grads over the ranks.
  LaunchInfo launchInfo = detectLaunch();
  const int worldSize = launchInfo.worldSize;
  const int rank = launchInfo.rank;
  rankContext.rank = rank;
  rankContext.worldSize = worldSize;
  const bool zero3 = p0.dataParallelMode == DataParallelMode::Zero3;
  // Pipeline parallelism: one program per stage, world rank = dp + DP x
  // stage (ParallelGroups with tensor parallel 1).
  const int stageCount = int(stages.size());
  const int dpSize = p0.dataParallelSize;
  // Tensor parallelism: world rank = tp + TP x (dp + DP x stage).
  const int tpSize = p0.tensorParallelSize;
  if (tpSize > 1 && worldSize != tpSize * dpSize * stageCount)
    fail("the launcher (", launcherName(launchInfo.launcher), ") started ",
         worldSize, " rank(s) but this binary was compiled for ", tpSize,
         " tensor-parallel x ", dpSize, " data-parallel x ", stageCount,
         " pipeline rank(s) = ", tpSize * dpSize * stageCount,
         " rank(s): launch ", tpSize * dpSize * stageCount, " (mpirun -np ",
         tpSize * dpSize * stageCount,
         ") or recompile with other --tensor-parallel / "
         "--data-parallel-size / --pipeline-parallel");
  if (tpSize == 1 && stageCount > 1 && worldSize != dpSize * stageCount)
    fail("the launcher (", launcherName(launchInfo.launcher), ") started ",
         worldSize, " rank(s) but this binary was compiled for ", dpSize,
         " data-parallel rank(s) x ", stageCount,
         " pipeline stages = ", dpSize * stageCount, " rank(s): launch ",
         dpSize * stageCount, " rank(s) (mpirun -np ", dpSize * stageCount,
         ") or recompile with other --data-parallel-size / "
         "--pipeline-parallel");
  if (worldSize != p0.dataParallelSize * stageCount * tpSize)
    fail("the launcher (", launcherName(launchInfo.launcher), ") started ",
         worldSize, " rank(s) but this binary was compiled for ",
         p0.dataParallelSize,
         " data-parallel rank(s) (the plan is per rank, so the world size is "
         "a compile option): launch ",
         p0.dataParallelSize, " rank(s) (mpirun -np ", p0.dataParallelSize,
         ") or recompile with actplace-compile --data-parallel-size=",
         worldSize);
  // Several ranks: the device (the GPU of the local rank) and the world
  // communicator come first, so that everything after may agree over it
  // (the --save lock, the checkpoint writes). A world of one keeps its
  // device start after the checks below.
  std::unique_ptr<Device> device;
  auto startDevice = [&] {
    DeviceOptions dopts;
    dopts.device = flags.device;
    dopts.deviceIndex = launchInfo.localRank;
    dopts.shareDevices = flags.comm == "mpi-staged";
    dopts.quiet = rank != 0;
    device = std::make_unique<Device>(dopts);
    // Kernels Triton compiled have no host form: refuse before any step.
    if (device->kind() == DeviceKind::Host)
      for (const Program &stage : stages)
        for (const ap_generated_kernel &g : stage.generated)
          if (g.triton)
            throw CliError(std::string("this binary runs the Triton kernel '") +
                           g.name +
                           "' (actplace-compile --triton-kernel), which has no "
                           "host form: run it on the cuda backend (--device "
                           "cuda), or compile without --triton-kernel");
  };
  std::unique_ptr<Communicator> world;
  if (worldSize > 1) {
    startDevice();
    CommOptions copts;
    copts.stagedMpi =
        flags.comm == "mpi-staged" && device->kind() == DeviceKind::Cuda;
    world = createWorldCommunicator(device->kind() == DeviceKind::Cuda
                                        ? kernels::Backend::Cuda
                                        : kernels::Backend::Host,
                                    launchInfo, copts);
    rankContext.communicating = true;
    // NCCL gathers through device memory: checked once the arena exists.
    if (world->backend() == kernels::Backend::Host)
      checkSameRun(*world, nullptr, stages, flags);
  } else {
    world = createSelfCommunicator();
  }
  // The data-parallel and pipeline groups; without stages the world is the
  // data-parallel group.
  ParallelGroups groups;
  int dpRank = rank, stage = 0, tpRank = 0;
  const bool grouped = stageCount > 1 || tpSize > 1;
  if (grouped) {
    groups = makeParallelGroups(*world, tpSize, stageCount);
    dpRank = groups.dpRank;
    stage = groups.ppRank;
    tpRank = groups.tpRank;
  }
  const Program &p = stages[size_t(stage)];
  // Only rank 0 prints the notes every rank would print alike.
  std::FILE *notes = rank == 0 ? stderr : nullptr;
  auto note = [&](const std::string &text) {
    if (notes)
      std::fprintf(notes, "%s\n", text.c_str());
  };

  // Whatever can refuse the run is checked before the first step (in a
  // world of one also before the device starts): the checkpoint to resume
  // and the flags against it, the data, the --save folder.
  // (Several ranks start their device above.)
  if (stageCount > 1 && !flags.dumpGrads.empty())
    throw CliError("--dump-grads with pipeline stages: each stage holds its "
                   "own parameters' grads and gathering them into one file "
                   "is not supported yet (run the one-stage binary)");
  if ((zero3 || tpSize > 1) && !flags.dumpGrads.empty() && worldSize > 1 &&
      device && device->kind() == DeviceKind::Cuda)
    throw CliError(std::string("--dump-grads with ") +
                   (zero3 ? "--data-parallel=zero3" : "--tensor-parallel") +
                   " on several ranks gathers the grad parts through host "
                   "memory: run it on the host backend (--device host)");
  CheckpointMirror mirror(p, dpRank, tpRank);
  std::optional<TrainingState> resumed;
  std::string resumeDir;
  if (!flags.resume.empty()) {
    resumeDir = resolveCheckpoint(flags.resume);
    // Pipeline stages read their own tensors out of whatever files hold
    // them (a checkpoint's index names the file of every tensor).
    // Each rank holds its part of every split parameter: only a run of the
    // same tensor-parallel size can resume (said before any tensor is
    // compared).
    // A checkpoint of another tensor-parallel size is resharded: every
    // tensor read whole (parts joined), each rank taking its part.
    if (int saved = savedTensorParallel(resumeDir);
        saved > 0 && saved != tpSize) {
      if (zero3)
        fail("--resume: checkpoint '", resumeDir, "' holds the parts of ",
             saved,
             " tensor-parallel rank(s) but this binary was compiled "
             "for ",
             tpSize,
             " with --data-parallel=zero3: resharding into "
             "ZeRO-3 shards is not supported (resume with "
             "--tensor-parallel=",
             saved, ")");
      resumed = loadResharded(resumeDir, mirror.tensors, tpRank, tpSize);
      note("note: --resume: checkpoint '" + resumeDir + "' of " +
           std::to_string(saved) + " tensor-parallel rank(s) resharded onto " +
           std::to_string(tpSize));
    } else {
      LoadOptions lo;
      lo.subset = stageCount > 1 || tpSize > 1;
      resumed = loadCheckpoint(resumeDir, mirror.tensors, ShardInfo{}, lo);
    }
    auto model = resumed->extra.find("model");
    if (model != resumed->extra.end() && model->second != p.model)
      fail("--resume: checkpoint of model '", model->second,
           "', this binary trains '", p.model, "'");
    uint64_t at = resumed->step;
    // --steps counts from the start of the run. Asking for the step the
    // checkpoint already reached is a finished job run again: nothing to
    // do, not an error. Fewer steps cannot be had.
    if (uint64_t(flags.steps) == at) {
      note("note: --steps " + std::to_string(flags.steps) +
           " is the step of checkpoint '" + resumeDir +
           "': nothing to train (--steps is the total from the start of the "
           "run, not the steps to add)");
      return 0;
    }
    if (uint64_t(flags.steps) < at)
      throw CliError("--steps " + std::to_string(flags.steps) +
                     " is below the step of checkpoint '" + resumeDir + "', " +
                     std::to_string(at) +
                     ": a resumed run cannot go back (--steps is the total "
                     "from the start of the run; pass more than " +
                     std::to_string(at) + ")");
    // The random streams (synthetic tokens, the shuffle, dropout) are keyed
    // by the seed; a resumed run continues the checkpoint's, so another
    // seed would silently start other streams mid-run.
    if (flags.seedGiven && flags.seed != resumed->rng.seed)
      throw CliError("--seed " + std::to_string(flags.seed) +
                     " differs from the seed of checkpoint '" + resumeDir +
                     "', " + std::to_string(resumed->rng.seed) +
                     ": a resumed run continues the checkpoint's random "
                     "streams (leave --seed out or pass " +
                     std::to_string(resumed->rng.seed) + ")");
  }
  const uint64_t seed = resumed ? resumed->rng.seed : flags.seed;

  DataConfig dc;
  parseDataSource(flags.data, dc);
  dc.vocabSize = uint32_t(p.vocab);
  dc.documentSeparator = p.documentSeparator;
  dc.ignoreIndex = int32_t(p.ignoreIndex);
  dc.seed = seed;
  dc.batch = p.batch;
  dc.seqLen = p.seq;
  dc.microbatchesPerStep = uint32_t(p.microBatches);
  // Every stage of a pipeline reads its data-parallel rank's batch (the
  // first stage the tokens, the last the labels).
  dc.rank = uint32_t(dpRank);
  dc.worldSize = uint32_t(dpSize);
  DataLoader data(dc);
  // Held-out data: the same shape and share per rank, read from its start
  // at every evaluation.
  std::optional<DataLoader> evalData;
  DataCursor evalStart;
  if (!flags.evalData.empty()) {
    DataConfig edc = dc;
    parseDataSource(flags.evalData, edc);
    evalData.emplace(edc);
    evalStart = evalData->cursor();
  }
  // The whole model's record, the same for any number of stages.
  const Program whole = stageCount > 1 ? wholeModelOf(stages) : Program();
  const std::map<std::string, std::string> runConfig = runConfigOf(
      stageCount > 1 ? whole : p, flags.lr, data.sourceDescription(), dpSize);
  if (resumed) {
    if (resumed->runConfig.empty()) {
      // Checkpoints of an older actplace have no record: they still load
      // (what they hold is complete), and the binary says what it could
      // not check.
      note("warning: checkpoint '" + resumeDir +
           "' has no run configuration (saved by an older actplace): the "
           "model, optimizer settings, data and batch are not checked "
           "against it");
      DataCursor at = data.cursor();
      at.step = resumed->step;
      at.microbatch = 0;
      data.restore(at);
    } else {
      std::vector<std::string> diffs =
          diffRunConfig(resumed->runConfig, runConfig);
      if (!diffs.empty())
        fail("--resume: checkpoint '", resumeDir,
             "' was saved by a run with other settings; resuming would "
             "change the training:",
             listProblems(diffs, 16));
      if (resumed->data.step != resumed->step || resumed->data.microbatch != 0)
        fail("--resume: checkpoint '", resumeDir, "' has data cursor step ",
             resumed->data.step, " microbatch ", resumed->data.microbatch,
             ", not the start of its step ", resumed->step);
      data.restore(resumed->data);
    }
  }

  // The --save folder: locked for this run, writable, and holding no other
  // run's checkpoints unless --overwrite.
  CheckpointLock lock;
  const ShardInfo ranks = worldSize > 1 ? ShardInfo::of(*world) : ShardInfo{};
  if (!flags.save.empty()) {
    lock = CheckpointLock::acquire(
        flags.save, ranks, checkpointRunId(worldSize, [](const char *n) {
          return std::getenv(n);
        }));
    CheckpointFolderContents held = inspectCheckpointFolder(flags.save);
    bool continuing =
        resumed && sameFolder(parentFolder(resumeDir), flags.save);
    if (!held.empty() && !continuing) {
      if (!flags.overwrite)
        fail("--save folder '", flags.save, "' already holds checkpoints (",
             held.describe(), "): ",
             resumed ? "this run, resumed from '" + resumeDir + "',"
                     : std::string("a fresh run"),
             " would overwrite them; continue that run with --resume ",
             flags.save,
             ", save elsewhere, or pass --overwrite to replace "
             "them");
      // Every rank has looked before rank 0 alone removes.
      world->barrier();
      if (rank == 0)
        removeCheckpoints(flags.save);
      note("note: --overwrite: removed the checkpoints of '" + flags.save +
           "' (" + held.describe() + ")");
    }
    world->barrier();
  }

  if (!device)
    startDevice();
  Device &dev = *device;
  // The plan (its workspace region included) plus the driver scratch; the
  // kernel workspace the runtime hands out is sized by the plan's largest
  // declared workspace and the grad-norm query.
  std::vector<kernels::GradTensor> all;
  for (const ParamEntry &e : p.params)
    if (!e.frozen)
      all.push_back({nullptr, e.numel});
  kernels::GradNormArgs gq;
  gq.tensors = all.data();
  gq.numTensors = int64_t(all.size());
  kernels::Backend kb = dev.kind() == DeviceKind::Cuda ? kernels::Backend::Cuda
                                                       : kernels::Backend::Host;
  uint64_t ws = std::max<uint64_t>(p.workspaceBytes,
                                   kernels::gradNormWorkspaceBytes(kb, gq));
  ws = std::max<uint64_t>(ws, kernels::linearWorkspaceBytes(kb));
  // The plan ends with its workspace regions ([persistent | activations |
  // workspace | side workspace]): kernels use them when large enough, so
  // the arena is the whole device footprint the compiler planned;
  // otherwise a separate tail holds the larger workspace.
  uint64_t planWorkspaceOffset = p.persistentBytes + p.activationBytes;
  bool planWorkspaceFits =
      p.workspaceBytes >= ws &&
      planWorkspaceOffset + p.workspaceBytes <= p.arenaBytes &&
      planWorkspaceOffset % 256 == 0;
  // The side stream's workspace likewise: the plan's region after the
  // workspace when it is large enough, else a tail of its own. Side
  // kernels include GEMMs, so it holds at least one GEMM's workspace.
  uint64_t sideWs = 0;
  if (p.sideAfterHostStart)
    dev.enableSideAfterFirstLaunch();
  if (p.sideSmPercent > 0)
    dev.setSideSmPercent(p.sideSmPercent);
  if (p.sideWorkspaceBytes > 0 || p.sideKernels)
    sideWs = std::max<uint64_t>(p.sideWorkspaceBytes,
                                kernels::linearWorkspaceBytes(kb));
  uint64_t planSideOffset = planWorkspaceOffset + p.workspaceBytes;
  bool planSideFits = sideWs > 0 && p.sideWorkspaceBytes >= sideWs &&
                      planSideOffset + p.sideWorkspaceBytes <= p.arenaBytes &&
                      planSideOffset % 256 == 0;
  const std::optional<uint64_t> freeAtStart =
      checkPlanFits(dev, flags.deviceMemory, worldSize,
                    p.arenaBytes + (planWorkspaceFits ? 0 : alignUp(ws, 256)) +
                        (planSideFits ? 0 : alignUp(sideWs, 256)),
                    p.arenaBytes);
  dev.allocateArena(p.arenaBytes, planWorkspaceFits ? 0 : alignUp(ws, 256),
                    planSideFits ? 0 : alignUp(sideWs, 256));
  if (planWorkspaceFits)
    dev.useWorkspaceInArena(planWorkspaceOffset, p.workspaceBytes);
  if (planSideFits)
    dev.useSideWorkspaceInArena(planSideOffset, p.sideWorkspaceBytes);
  PinnedLayout layout;
  layout.totalBytes = std::max<uint64_t>(p.pinnedBytes, 256);
  layout.slots = p.slots;
  PinnedPool pool(dev, layout);
  OffloadEngine engine(dev, pool);
  if (worldSize > 1 && world->backend() != kernels::Backend::Host)
    checkSameRun(*world, &dev, stages, flags);
  StepRunner r(p, dev, pool, engine, flags.fingerprints);
  r.dataParallel = grouped ? groups.dp.get() : world.get();
  if (stageCount > 1)
    r.attachPipeline(groups.pp.get());
  if (tpSize > 1)
    r.tensorParallel = groups.tp.get();
  r.lrOverride = flags.lr;

  // Everything persistent starts at zero (grads, moments, state); then the
  // parameters from the Philox stream keyed by (seed, name).
  dev.memsetAsync(dev.at(0, p.persistentBytes), 0, p.persistentBytes,
                  Stream::Compute);
  dev.synchronize();
  // ZeRO-3: every rank takes its slice of the whole tensor's values (the
  // same Philox keys), so any world size starts from the same model.
  // Tensor parallelism: every rank takes its part of the whole tensor's
  // values, so any number of ranks starts from the same model.
  for (const ParamEntry &e : p.params)
    writeParameter(
        r, e,
        e.tpDim >= 0
            ? sliceOf(tensorParallelPart(e, tpRank, tpSize, flags.seed),
                      shardSpan(e, dpRank))
            : initialValues(e, shardSpan(e, dpRank), flags.seed));

  if (!flags.initWeights.empty())
    loadInitWeights(stageCount > 1 ? whole : p, p, r, flags.initWeights);
  // Every rank holds the same summed grads (replicate) or gathers its
  // shards to rank 0 (ZeRO-3, all ranks take part): rank 0 writes them.
  if (!flags.dumpGrads.empty() && (rank == 0 || zero3 || tpSize > 1))
    r.onGradsFinalized = [&](int32_t tokenCount, float clipCoef) {
      if (r.stepIndex + 1 == flags.steps)
        dumpGrads(p, r, flags.dumpGrads, tokenCount, clipCoef);
    };

  // --resume continues a run: weights, masters, moments, the step counter
  // and the data/seed stream come from the checkpoint; --steps is the total.
  int64_t firstStep = 0;
  std::map<std::string, std::string> placement = placementOf(
      p, dev.kind() == DeviceKind::Cuda ? "cuda" : "host", worldSize);
  if (stageCount > 1)
    placement["pipeline_stages"] = std::to_string(stageCount);
  if (tpSize > 1)
    placement["tensor_parallel"] = std::to_string(tpSize);
  if (resumed) {
    mirror.toDevice(dev);
    firstStep = int64_t(resumed->step);
    // Another placement, kernel choice, micro-batch split or parallel
    // layout trains the same model on the same data: said, not refused.
    if (!resumed->placement.empty()) {
      std::vector<std::string> diffs =
          diffRunConfig(resumed->placement, placement);
      if (!diffs.empty()) {
        std::string text;
        for (const std::string &d : diffs)
          text += (text.empty() ? "" : "; ") + d;
        note("note: resumed under a different placement (" + text + ")");
      }
    }
  }
  size_t mbElems = data.microbatchElements();
  r.tokens.assign(mbElems * size_t(p.microBatches), 0);
  r.labels.assign(mbElems * size_t(p.microBatches), 0);
  // The device buffers the per-step finiteness check reduces.
  // ZeRO-3: this rank's shards, padding left out.
  std::vector<kernels::GradTensor> masters, moments1, moments2;
  for (const ParamEntry &e : p.params) {
    int64_t n = shardSpan(e, dpRank).count;
    if (!e.frozen && n > 0) {
      masters.push_back({static_cast<const float *>(r.at(e.master)), n});
      moments1.push_back({static_cast<const float *>(r.at(e.adamM)), n});
      moments2.push_back({static_cast<const float *>(r.at(e.adamV)), n});
    }
  }
  const bool shardedState = zero3 && worldSize > 1;
  // Pipeline stages save the tensors the index places in their file (a
  // tied weight's state goes with the first stage holding it).
  std::vector<CheckpointTensor> ownTensors;
  if (stageCount > 1 || tpSize > 1) {
    std::set<std::string> mine;
    // Under ZeRO-3 every data-parallel rank of a tensor-parallel rank
    // writes its shards of the tensors placed at the group's first file.
    const int group = zero3 ? dpSize : 1;
    for (const auto &[t, file] : tensorParallelFiles(stages))
      if (file == (stage * tpSize + tpRank) * group)
        mine.insert(t.name);
    for (const CheckpointTensor &t : mirror.tensors)
      if (mine.count(t.name))
        ownTensors.push_back(t);
  }

  std::map<std::string, StepRunner::OpTime> opTimes;
  std::vector<StepRunner::TimelineEntry> timeline;
  int64_t timedSteps = 0;
  r.opTimesInStream = flags.opTimesMode == "stream";
  if (!flags.opTimeline.empty() && flags.steps - firstStep < 2)
    fail("--op-timeline records a step after the first (untimed) one: run "
         "at least 2 steps (",
         flags.steps - firstStep, " to run)");
  if (!flags.opTimes.empty() && !r.opTimesInStream)
    r.syncSeconds = emptyLaunchSeconds(dev);

  // Rank 0 writes --metrics PATH (and "-", stdout); rank R > 0 its own
  // PATH.rank<R> (its transfers, pool, times and fingerprints), so every
  // rank's state can be compared. Only rank 0 shows progress.
  std::string metricsPath = flags.metrics;
  if (rank > 0)
    metricsPath = flags.metrics.empty() || flags.metrics == "-"
                      ? std::string()
                      : flags.metrics + ".rank" + std::to_string(rank);
  MetricsWriter writer(metricsPath);
  ProgressLine progress(flags.steps, notes);
  // One evaluation: the compiled step over --eval-steps batches of the
  // held-out data, updating nothing (StepRunner::evaluating); the loss is
  // the token-weighted mean (each step's loss is its token mean, weighted
  // by its token count).
  auto evaluate = [&](int64_t afterStep) -> double {
    evalData->restore(evalStart);
    double lossTokens = 0, tokens = 0;
    // The step's own scalars stay what the step computed (its metrics line
    // and fingerprints read them afterwards).
    const float stepLoss = r.loss, stepNorm = r.gradNorm, stepLr = r.lr;
    r.evaluating = true;
    for (int64_t e = 0; e < flags.evalSteps; ++e) {
      for (int64_t mb = 0; mb < p.microBatches; ++mb)
        evalData->next(r.tokens.data() + mb * mbElems,
                       r.labels.data() + mb * mbElems);
      r.beginStep();
      p.step(r);
      dev.synchronize();
      pool.assertNoneInUse("evaluation after step " +
                           std::to_string(afterStep));
      engine.assertAllReloaded("evaluation after step " +
                               std::to_string(afterStep));
      double count = double(r.lastTokenCount());
      lossTokens += double(r.loss) * count;
      tokens += count;
    }
    r.evaluating = false;
    r.loss = stepLoss;
    r.gradNorm = stepNorm;
    r.lr = stepLr;
    return tokens > 0 ? lossTokens / tokens : NAN;
  };
  for (int64_t step = firstStep; step < flags.steps; ++step) {
    // The first step builds library plans and warms caches: not timed.
    bool timed = (!flags.opTimes.empty() || !flags.opTimeline.empty()) &&
                 step > firstStep;
    r.opTimes = timed ? &opTimes : nullptr;
    r.timeline = timed && !flags.opTimeline.empty() ? &timeline : nullptr;
    timedSteps += timed;
    auto t0 = std::chrono::steady_clock::now();
    // The data loader's cursor (restored on --resume) is the position.
    if (data.cursor().step != uint64_t(step) || data.cursor().microbatch != 0)
      fail("data: cursor at step ", data.cursor().step, " microbatch ",
           data.cursor().microbatch, " before step ", step + 1);
    for (int64_t mb = 0; mb < p.microBatches; ++mb)
      data.next(r.tokens.data() + mb * mbElems, r.labels.data() + mb * mbElems);
    r.stepIndex = step;
    r.fingerprintSeconds = 0;
    r.beginStep();
    p.step(r);
    dev.synchronize();
    if (r.opTimes)
      r.collectOpTimes();
    pool.assertNoneInUse("step " + std::to_string(step + 1));
    engine.assertAllReloaded("step " + std::to_string(step + 1));
    auto t1 = std::chrono::steady_clock::now();
    // Nothing of a step that is not finite may reach a checkpoint.
    // The loss and grad norm are checked every step (scalars the step has
    // anyway); the updated state, three reductions over every master and
    // moment, only where it matters: before a save and after the last step.
    // A non-finite update shows in the next step's loss or grad norm.
    bool saving = !flags.save.empty() &&
                  ((flags.saveEvery > 0 && (step + 1) % flags.saveEvery == 0) ||
                   step + 1 == flags.steps);
    std::string bad = nonFiniteInStep(r, masters, moments1, moments2,
                                      saving || step + 1 == flags.steps,
                                      shardedState, stageCount > 1);

    StepMetrics m;
    m.step = step + 1;
    m.loss = r.loss;
    m.gradNorm = r.gradNorm;
    m.lr = r.lr;
    if (!p.generated.empty())
      m.generatedLaunches = r.generatedLaunches;
    // The evaluation runs after the step's own numbers are taken (it reuses
    // the runner's scalars) and before its time is: it is not the step's.
    double evalSeconds = 0;
    if (evalData &&
        ((flags.evalEvery > 0 && (step + 1) % flags.evalEvery == 0) ||
         step + 1 == flags.steps)) {
      auto e0 = std::chrono::steady_clock::now();
      m.evalLoss = evaluate(step + 1);
      evalSeconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - e0)
              .count();
      progress.finish();
      note("eval after step " + std::to_string(step + 1) + ": loss " +
           jsonNumber(*m.evalLoss) + " (" + std::to_string(flags.evalSteps) +
           " step(s) of " + flags.evalData + ", " +
           jsonNumber(std::round(evalSeconds * 1000) / 1000) + " s)");
    }
    m.stepTimeS =
        std::chrono::duration<double>(t1 - t0).count() - r.fingerprintSeconds;
    // The step's tokens over all ranks (the global batch).
    m.tokensPerS =
        m.stepTimeS > 0
            ? double(mbElems * size_t(p.microBatches) * size_t(dpSize)) /
                  m.stepTimeS
            : 0;
    m.rank = rank;
    m.worldSize = worldSize;
    m.plannedPeakBytes = p.arenaBytes;
    m.deviceFreeAtStartBytes = freeAtStart;
    collectRuntimeMetrics(m, dev, pool, &engine);
    if (flags.fingerprints) {
      Fingerprints f;
      f.loss = fingerprint(dev, pool, {{&r.loss, 4, false}});
      f.grads = r.gradsFingerprint;
      f.params = fingerprint(dev, pool, paramRanges(p, r));
      // Per rank: ZeRO-3 ranks fingerprint their shards.
      std::vector<ByteRange> opt;
      for (const ParamEntry &e : p.params)
        if (!e.frozen)
          opt.push_back(
              {r.at(e.adamM), uint64_t(shardSpan(e, dpRank).count) * 4, true});
      for (const ParamEntry &e : p.params)
        if (!e.frozen)
          opt.push_back(
              {r.at(e.adamV), uint64_t(shardSpan(e, dpRank).count) * 4, true});
      int64_t stepCount = step + 1;
      opt.push_back({&stepCount, 8, false});
      f.optimizer = fingerprint(dev, pool, opt);
      m.fingerprints = f;
    }
    writer.write(m);
    engine.resetCounters();
    progress.update(m);
    // Every rank sees the same summed loss, grad norm and state, so all
    // stop here together; rank 0 says why.
    auto stopNotFinite = [&](const std::string &what) {
      progress.finish();
      note("error: step " + std::to_string(step + 1) +
           " is not finite: " + what + "; training stopped without saving it" +
           latestNote(flags.save));
      return 3;
    };
    if (!bad.empty())
      return stopNotFinite(bad);
    if (saving) {
      mirror.fromDevice(dev);
      // Every saved value, compute copies included, checked on the host;
      // ZeRO-3 ranks check their shards and agree before anyone saves.
      std::string name = firstNonFinite(mirror);
      bool allFinite = name.empty();
      if (shardedState || stageCount > 1 || tpSize > 1)
        allFinite = world->allTrue(allFinite);
      if (!allFinite)
        return stopNotFinite(name.empty()
                                 ? std::string("a shard of another rank holds "
                                               "NaN or Inf")
                                 : "tensor '" + name + "' holds NaN or Inf");
      TrainingState st;
      st.step = uint64_t(step + 1);
      st.rng.seed = seed;
      st.rng.step = uint64_t(step + 1);
      st.data = data.cursor();
      st.extra["model"] = p.model;
      st.runConfig = runConfig;
      st.placement = placement;
      // Replicated state: rank 0 writes the world-of-one checkpoint and
      // it counts ("latest" moves) once every rank agreed it is complete.
      // ZeRO-3: every rank writes its shards, rank 0 the index.
      ShardInfo save = ranks;
      save.replicated = worldSize > 1 && !zero3;
      if (stageCount > 1 || tpSize > 1) {
        // One file per (stage, tensor-parallel rank): its parts of split
        // parameters, the stage's tensors (a tied weight's in the first
        // stage's file), the replicated ones in its tensor-parallel rank 0
        // file; written by data-parallel rank 0 (replicated state) or, under
        // ZeRO-3, by every rank (its flat shards, file x DP + dp). The index
        // names every tensor's file (or group of shard files).
        const int group = zero3 ? dpSize : 1;
        save.replicated = false;
        save.rank = (stage * tpSize + tpRank) * group + (zero3 ? dpRank : 0);
        save.worldSize = stageCount * tpSize * group;
        save.writes = zero3 || dpRank == 0;
        save.placedTensors = tensorParallelFiles(stages);
        save.placedGroup = group;
      }
      saveCheckpoint(flags.save,
                     stageCount > 1 || tpSize > 1 ? ownTensors : mirror.tensors,
                     st, save);
    }
  }
  progress.finish();
  r.opTimes = nullptr;
  r.timeline = nullptr;
  // Rank 0's times stand for the run (the ranks run the same step).
  if (!flags.opTimes.empty() && rank == 0)
    writeOpTimes(flags.opTimes, opTimes, timedSteps, r.syncSeconds,
                 flags.opTimesMode, dev);
  if (!flags.opTimeline.empty() && rank == 0)
    writeOpTimeline(flags.opTimeline, timeline, flags.steps, dev);
  return 0;
}

} // namespace

std::string exactNumberText(double v) {
  // The metrics writer already prints the shortest exact text; only its
  // spelling of non-finite values (JSON null) differs.
  if (std::isfinite(v))
    return jsonNumber(v);
  return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
}

std::map<std::string, std::string> runConfigOf(const Program &p, double lr,
                                               const std::string &dataSource,
                                               int worldSize) {
  std::map<std::string, std::string> c;
  c["model"] = p.model;
  for (const auto &[field, value] : p.modelConfig)
    c["model." + std::string(field)] = value;
  c["vocab"] = std::to_string(p.vocab);
  // The parameter table stands for the architecture: every parameter's
  // name, dtype, shape, initialiser and frozen flag (the arena offsets are
  // the plan's and stay out).
  Sha256 table;
  int64_t values = 0;
  for (const ParamEntry &e : p.params) {
    // Whole shapes: a tensor-parallel part stands for its whole tensor, so
    // any tensor-parallel size has the same record (checkpoints reshard).
    std::string line =
        std::string(e.name) + " " + std::to_string(int(e.dtype)) + " [";
    std::vector<int64_t> shape = wholeShape(e);
    for (size_t i = 0; i < shape.size(); ++i)
      line += (i ? "," : "") + std::to_string(shape[i]);
    line += "] " + std::to_string(int(e.init)) + " " +
            exactNumberText(e.initA) + " " + exactNumberText(e.initB) +
            (e.frozen ? " frozen" : "") + "\n";
    table.update(line.data(), line.size());
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    values += n;
  }
  c["parameters"] = std::to_string(p.params.size()) + " tensors, " +
                    std::to_string(values) + " values, sha256 " +
                    Sha256::hex(table.finish()).substr(0, 16);
  c["seq"] = std::to_string(p.seq);
  c["global_batch_tokens"] =
      std::to_string(p.batch * p.microBatches * p.seq * int64_t(worldSize));
  c["data"] = dataSource;
  c["lr"] = p.maxLr > 0 ? exactNumberText(lr) : "none (no lr schedule)";
  const OptimizerSettings &o = p.optimizer;
  if (o.known) {
    c["lr_schedule"] = "compiled peak " + exactNumberText(p.maxLr) +
                       ", floor " + exactNumberText(o.minLr) + ", warmup " +
                       std::to_string(o.warmupSteps) +
                       " steps, cosine to step " + std::to_string(o.totalSteps);
    c["grad_clip"] = "max norm " + exactNumberText(o.maxGradNorm);
    // Distinct settings with how many parameters use each (weight decay
    // usually differs between matrices and norms), plus a digest of which
    // parameter has which.
    std::map<std::string, int> distinct;
    Sha256 which;
    for (const AdamWSettings &a : o.adamw) {
      std::string text = "beta1 " + exactNumberText(a.beta1) + ", beta2 " +
                         exactNumberText(a.beta2) + ", eps " +
                         exactNumberText(a.eps) + ", weight decay " +
                         exactNumberText(a.weightDecay);
      distinct[text] += 1;
      std::string line = std::to_string(a.param) + " " + text + "\n";
      which.update(line.data(), line.size());
    }
    std::string adamw;
    for (const auto &[text, n] : distinct)
      adamw += (adamw.empty() ? "" : "; ") + text + " (" + std::to_string(n) +
               " parameters)";
    c["adamw"] =
        adamw + "; sha256 " + Sha256::hex(which.finish()).substr(0, 16);
  }
  return c;
}

std::map<std::string, std::string>
placementOf(const Program &p, const std::string &device, int worldSize) {
  std::map<std::string, std::string> c;
  c["micro_batches"] = std::to_string(p.microBatches);
  c["micro_batch_size"] = std::to_string(p.batch);
  c["world_size"] = std::to_string(worldSize);
  c["device"] = device;
  c["arena_bytes"] = std::to_string(p.arenaBytes);
  c["pinned_bytes"] = std::to_string(p.pinnedBytes);
  c["offload_scopes"] = std::to_string(p.scopes.size());
  c["side_stream"] = p.sideKernels ? "yes" : "no";
  // Only where it is not the default, so that replicate checkpoints of
  // before ZeRO-3 resume without a note.
  if (p.dataParallelMode == DataParallelMode::Zero3)
    c["data_parallel"] = "zero3";
  // The rest of the plan (regions, slots, scopes, parameter offsets) as
  // one digest: equal plans place every buffer alike.
  std::string plan = std::to_string(p.persistentBytes) + " " +
                     std::to_string(p.activationBytes) + " " +
                     std::to_string(p.workspaceBytes) + " " +
                     std::to_string(p.sideWorkspaceBytes) + " " +
                     std::to_string(p.scratchBytes) + "@" +
                     std::to_string(p.scratchOffset) + " " +
                     std::to_string(p.numEvents) + " " +
                     (p.sideAfterHostStart ? "after-host" : "with-run") + "\n";
  for (const PinnedSlotSpec &sl : p.slots)
    plan += "slot " + std::to_string(sl.offset) + " " +
            std::to_string(sl.bytes) + "\n";
  for (const std::string &sc : p.scopes)
    plan += "scope " + sc + "\n";
  for (const ParamEntry &e : p.params)
    plan += std::to_string(e.weight) + " " + std::to_string(e.master) + " " +
            std::to_string(e.grad) + " " + std::to_string(e.adamM) + " " +
            std::to_string(e.adamV) + "\n";
  Sha256 h;
  h.update(plan.data(), plan.size());
  c["plan"] = Sha256::hex(h.finish()).substr(0, 16);
  return c;
}

namespace {
/// Prints an error of this rank and gives the exit code. On several ranks
/// the line names the rank; once the world communicator exists the process
/// ends here (std::_Exit, no MPI_Finalize), because the other ranks may be
/// waiting in a collective that this one will never join: the launcher
/// (mpirun, torchrun) sees a rank exit with an error and ends the job.
int rankError(const char *what, int code) {
  if (rankContext.worldSize > 1)
    std::fprintf(stderr, "error: rank %d of %d: %s\n", rankContext.rank,
                 rankContext.worldSize, what);
  else
    std::fprintf(stderr, "error: %s\n", what);
  if (rankContext.communicating) {
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return code;
}
} // namespace

int trainMain(int argc, char **argv, const Program &program) {
  return trainMainStages(argc, argv, {program});
}

int trainMainStages(int argc, char **argv, const std::vector<Program> &stages) {
  try {
    if (stages.empty())
      fail("a training binary without a program");
    return run(argc, argv, stages);
  } catch (const CliError &e) {
    return rankError(e.what(), 2);
  } catch (const std::exception &e) {
    return rankError(e.what(), 1);
  }
}

} // namespace ap::rt
