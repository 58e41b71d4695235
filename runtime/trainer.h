//===- trainer.h - The training binary's driver -----------------*- C++ -*-===//
//
// The runtime side of a training binary: the program tables (parameters,
// the buffer plan, pinned slots, offload scopes), the StepRunner that
// carries out the step's calls (inputs, the microbatch loss sums, the
// step-level grad finalisation, learning rate and AdamW, and the
// data-movement ops the train dialect keeps as ops: slice, concat, expand),
// and trainMain(), the whole binary: flags, device, arena and pinned pool
// once, parameter init from the Philox RNG, N steps on synthetic (or file)
// data, the metrics line per step, the pinned-pool check and the NaN/Inf
// stop. Under ZeRO-3 (DataParallelMode::Zero3) every parameter buffer holds
// this rank's flat shard (ParamEntry::shardNumel, shardSpan): the init, the
// grad norm, AdamW, the fingerprints and the checkpoints (flat shards with
// an index) work on shards. Generated code does not include this header: it
// reaches all of this through the C ABI of runtime/abi.h (runtime/abi.cpp
// forwards). No MLIR.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_TRAINER_H
#define ACTPLACE_RUNTIME_TRAINER_H

#include "runtime/abi.h"
#include "runtime/runtime.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

struct ap_step; // runtime/abi.h

namespace ap::rt {

/// Marks an absent offset (frozen parameters have no master, grad, moments).
inline constexpr uint64_t kNoOffset = ~uint64_t(0);

/// One parameter of the program, in declaration order (HF names).
struct ParamEntry {
  const char *name;
  kernels::DType dtype; ///< storage dtype of the weight
  int32_t rank;
  int64_t shape[4];
  int64_t numel;
  InitKind init;
  double initA, initB;
  bool frozen;
  uint64_t weight, master, grad, adamM, adamV; ///< arena offsets
  /// 0: the buffers hold the whole parameter (replicate). Otherwise
  /// (ZeRO-3) each holds this rank's shard of ceil(numel / ranks) elements,
  /// elements [rank x shardNumel, (rank + 1) x shardNumel) of the flattened
  /// parameter, zeros past numel (runtime/abi.h ap_param.shard_numel).
  int64_t shardNumel = 0;
  /// The main grad (`grad`) is bf16 instead of f32 (runtime/abi.h
  /// ap_param.main_grad_bf16; ZeRO-3 only, never for a frozen parameter):
  /// only the runtime touches it (the reduce-scatter's add and rounding,
  /// zeroing, the grad norm, AdamW, fingerprints, --dump-grads).
  bool mainGradBf16 = false;
  /// Several pipeline stages hold this parameter (the tied embedding /
  /// LM-head weight; runtime/abi.h ap_param.pipeline_tied): finalizeGrads
  /// sums its main grad over the stages holding it, and the grad norm
  /// counts it on the first of them only.
  bool pipelineTied = false;
  /// kNoOffset, or the arena offset of a second f32 main grad of numel
  /// elements (the LM-head part of a tied weight's gradient on a stage that
  /// also holds the embedding part): finalizeGrads adds it into `grad` and
  /// zeroes it (runtime/abi.h ap_param.tied_grad_offset).
  uint64_t tiedGrad = ~uint64_t(0);
  /// Tensor parallelism (runtime/abi.h ap_param.tp_*): -1, or the dimension
  /// along which this rank holds block tpRank of tpSize of every segment of
  /// tpSegments (the whole extents); `shape` is the part's.
  int32_t tpDim = -1;
  std::vector<int64_t> tpSegments;
  /// Replicated, but each rank's main grad is a partial sum (summed over the
  /// tensor-parallel group by the step before finalize_grads).
  bool tpGradSum = false;
  /// The main grad's element type.
  kernels::DType gradDType() const {
    return mainGradBf16 ? kernels::DType::BF16 : kernels::DType::F32;
  }
};

/// The part of a parameter this rank's buffers hold: elements [begin, begin
/// + count) of the flattened parameter, in buffers of bufferNumel elements
/// (the rest, bufferNumel - count, is padding that stays zero). Replicate:
/// the whole parameter. ZeRO-3: begin = rank x shardNumel, count clipped to
/// the parameter (0 on a rank past its end).
struct ShardSpan {
  int64_t begin = 0, count = 0, bufferNumel = 0;
};
ShardSpan shardSpan(const ParamEntry &e, int rank);

/// Bytes of the driver scratch's scalar region (runtime/abi.h
/// AP_SCRATCH_*) that StepRunner::sumOverRanks stages its doubles in: the
/// runtime's own scalars, between the loss slot and the state norms.
inline constexpr uint64_t kScratchRankSums = AP_SCRATCH_RANK_SUMS,
                          kScratchRankSumsBytes = 32;
static_assert(kScratchRankSums + kScratchRankSumsBytes <=
                  AP_SCRATCH_STATE_NORMS,
              "the rank sums end before the state norms");

/// Offsets of the step's state scalars.
struct StateOffsets {
  uint64_t lossSum = kNoOffset, tokenCount = kNoOffset, gradNorm = kNoOffset,
           lr = kNoOffset, loss = kNoOffset;
};

class StepRunner;
class PipelineLinks;

/// One parameter's AdamW hyperparameters (train.adamw's arguments).
struct AdamWSettings {
  int64_t param = 0; ///< index into Program::params
  double beta1 = 0, beta2 = 0, eps = 0, weightDecay = 0;
};

/// The step's optimizer as compiled (the arguments of train.lr_schedule,
/// train.finalize_grads and train.adamw): part of the run configuration a
/// checkpoint records, so that a resume under other settings is refused.
struct OptimizerSettings {
  /// False in a program that does not describe its optimizer (hand-written
  /// ones); the run configuration then leaves these fields out.
  bool known = false;
  double minLr = 0;
  int64_t warmupSteps = 0, totalSteps = 0;
  double maxGradNorm = 0;
  std::vector<AdamWSettings> adamw;
};

/// How data-parallel ranks hold parameters and optimizer state
/// (runtime/abi.h AP_DP_*).
enum class DataParallelMode { Replicate, Zero3 };

/// Everything the generated file describes.
struct Program {
  const char *model = "";
  /// The model settings that shape what it computes (HF field name, exact
  /// text), from the compiler; a checkpoint records them as "model.<field>"
  /// in its run configuration. Empty in a hand-written program.
  std::vector<std::pair<const char *, const char *>> modelConfig;
  int64_t microBatches = 1, batch = 1, seq = 1, vocab = 256;
  /// The plan (exec-plan-memory): [persistent | activations | workspace |
  /// side workspace].
  uint64_t persistentBytes = 0, activationBytes = 0, workspaceBytes = 0,
           arenaBytes = 0, pinnedBytes = 0;
  /// The plan's side workspace region: what the side stream's kernels
  /// declare (0: none).
  uint64_t sideWorkspaceBytes = 0;
  /// The step launches kernels on the side stream (which then get a
  /// workspace large enough for a GEMM even where the plan declares none).
  bool sideKernels = false;
  /// Side runs were issued after their host (exec-defer-side-issue): each
  /// side-stream wait also waits for the host's first launch
  /// (Device::enableSideAfterFirstLaunch), so the side GEMMs take SMs once
  /// the host's SM-filling pass is done (measured: bench/notes/training.md).
  bool sideAfterHostStart = false;
  /// Side-stream GEMMs' share of the SMs in percent (Device::
  /// setSideSmPercent); 0 when the step has no side kernels.
  int32_t sideSmPercent = 0;
  /// The driver scratch, a persistent buffer of the plan at arena offset
  /// scratchOffset (runtime/abi.h AP_SCRATCH_*: scalars, then the GDN
  /// gates' dtype staging).
  uint64_t scratchBytes = 0, scratchOffset = 0;
  std::vector<PinnedSlotSpec> slots;
  std::vector<ParamEntry> params;
  std::vector<std::string> scopes; ///< offload scopes, "L<layer>.<leaf>"
  StateOffsets state;
  uint32_t numEvents = 0;
  /// Peak of the compiled lr schedule (the default of --lr); 0: none.
  double maxLr = 0;
  OptimizerSettings optimizer;
  /// The data-parallel ranks the plan is for; the binary refuses a launch
  /// of another world size.
  int32_t dataParallelSize = 1;
  DataParallelMode dataParallelMode = DataParallelMode::Replicate;
  /// Pipeline stages as compiled (1: no pipeline) and this program's stage.
  int32_t pipelineSize = 1;
  int32_t pipelineStage = 0;
  /// Tensor-parallel ranks as compiled (1: none).
  int32_t tensorParallelSize = 1;
  /// Packed sequences (ap_program.document_separator): -1 none.
  int64_t documentSeparator = -1;
  int64_t ignoreIndex = -100;
  /// Generated kernels (runtime/abi.h ap_generated_kernel; checked by
  /// programOfAbi) and the PTX of their GPU entries (null: none embedded).
  std::vector<ap_generated_kernel> generated;
  const char *generatedPtx = nullptr;
  void (*step)(StepRunner &) = nullptr;
  /// A program that came through the C ABI (runtime/abi.h): its step, which
  /// `step` calls with the runner as the ap_step handle.
  void (*abiStep)(::ap_step *) = nullptr;
};

/// The support calls of a generated step. One per run; the generated step
/// function reads dev/engine/ev/scope and calls the members below.
class StepRunner {
public:
  StepRunner(const Program &program, Device &dev, PinnedPool &pool,
             OffloadEngine &engine, bool fingerprints);
  ~StepRunner();

  /// The program this runner runs.
  const Program &program() const { return program_; }

  Device &dev;
  PinnedPool &pool;
  OffloadEngine &engine;
  std::vector<EventId> ev;
  std::vector<OffloadEngine::ScopeId> scope;
  /// The data-parallel group exec.all_reduce sums over.
  Communicator *dataParallel = nullptr;
  /// The pipeline group (every stage of this data-parallel rank; stage s is
  /// rank s), set by attachPipeline; null: no pipeline.
  Communicator *pipeline = nullptr;
  /// The tensor-parallel group (the ranks holding the other parts of this
  /// rank's layers; rank r holds block r of every split parameter); null
  /// or a group of one: no tensor parallelism.
  Communicator *tensorParallel = nullptr;
  /// Makes `pp` the pipeline group: its size must be the program's
  /// pipelineSize and its rank the program's stage. Creates the links
  /// ap_pipeline_send/recv use and, with more than two stages, the group
  /// of the first and the last stage that sums tied grads. Collective over
  /// `pp` (every stage calls it). A group of one: no links.
  void attachPipeline(Communicator *pp);
  /// This program's stage and the number of stages (0 and 1 without a
  /// pipeline).
  int stage() const { return program_.pipelineStage; }
  int stages() const { return program_.pipelineSize; }

  /// Arena address of an offset of the plan (checked).
  void *at(uint64_t offset) const { return dev.at(offset); }
  /// Start of the driver scratch (after the plan).
  char *scratch(uint64_t offset = 0) const;
  /// The compute-stream kernel context (workspace included).
  kernels::KernelContext ctx() const {
    return dev.kernelContext(Stream::Compute);
  }
  /// Runs a kernel entry on the compute stream; a non-Ok status is an error
  /// naming `name`.
  void launch(const char *name, KernelFn fn) {
    launchOn(Stream::Compute, name, std::move(fn));
  }
  /// Runs a kernel entry on `stream` (compute or side) with that stream's
  /// kernel context; --op-times times it on that stream under `name`.
  void launchOn(Stream stream, const char *name, KernelFn fn);
  /// The compute stream waits for a reload's H2D (`event`). With stream-mode
  /// --op-times the wait sits between two timers and is recorded under
  /// `name` ("<scope>/wait"): the compute stream's stall on that copy, the
  /// measured counterpart of the cost model's exposed transfer time.
  void waitCopy(const char *name, EventId event);

  /// --op-times: per launch label, launches and seconds. Null: not timing.
  /// Stream mode (`opTimesInStream`): each launch between two timers, read
  /// by collectOpTimes() after the step's synchronisation. Wait mode: each
  /// launch waited for, less `syncSeconds`, the cost of an empty wait.
  struct OpTime {
    int64_t count = 0;
    double seconds = 0;
  };
  std::map<std::string, OpTime> *opTimes = nullptr;
  /// --op-timeline (stream mode only): collectOpTimes() replaces it with the
  /// launches since the last call, by start. Null: no timeline.
  struct TimelineEntry {
    std::string name;
    Stream stream = Stream::Compute;
    double startS = 0, endS = 0; ///< from the earliest launch's start
  };
  std::vector<TimelineEntry> *timeline = nullptr;
  bool opTimesInStream = true;
  double syncSeconds = 0;
  /// Adds the stream-mode timers of the launches since the last call to
  /// *opTimes; every launch must have completed (call after synchronising).
  void collectOpTimes();

  // Step state set by trainMain.
  int64_t stepIndex = 0; ///< 0-based optimizer step
  /// Evaluation (--eval-data): the step runs its forward and backward for
  /// the loss, but finalize_grads, the lr schedule and AdamW update nothing
  /// (no norm, no clip, no parameter or moment change); every main grad
  /// (and tied LM-head part) is zeroed instead, so training continues as if
  /// the evaluation had not run.
  bool evaluating = false;
  int64_t microbatch = 0;
  double lrOverride = 0; ///< --lr: peak learning rate of the schedule
  std::vector<int32_t> tokens, labels; ///< all microbatches of the step

  //===--- Loop ops -------------------------------------------------------===//
  /// Writes the microbatch's "tokens" or "labels" at `offset`. `tpShard`:
  /// only block r of tensorParallelSize of them (r this rank in
  /// `tensorParallel`; a sequence-parallel rank's tokens).
  void loadInput(const char *name, uint64_t offset, uint64_t bytes,
                 bool tpShard = false);
  /// train.yield: the microbatch's loss sum and token count (summed over
  /// microbatches in order by endLoop()).
  void yield(uint64_t lossOff, uint64_t countOff);
  /// Before each step: every microbatch's loss and token count start at 0
  /// (a pipeline stage without the loss yields none, so what the previous
  /// step left there must not be summed again).
  /// Generated kernels launched (ap_launch_generated) since beginStep.
  uint64_t generatedLaunches = 0;
  void beginStep() {
    generatedLaunches = 0;
    lossParts_.assign(lossParts_.size(), 0.f);
    countParts_.assign(countParts_.size(), 0);
  }
  /// After the microbatch loop: writes the summed loss and token count into
  /// the state buffers.
  void endLoop();
  /// Sums `bytes` at `offset` over `dataParallel` in place, enqueued on
  /// `stream` (comm or compute; ordered against other streams by the
  /// step's events). `lastMicrobatchOnly`: issued inside the microbatch
  /// loop, it runs in the last microbatch only. A world of one: no call.
  /// `overPipeline` (AP_REDUCE_PIPELINE): the sum runs over `pipeline`
  /// instead (stage order; no pipeline or one stage: no call).
  /// `overTensor` (AP_REDUCE_TENSOR): over `tensorParallel` (rank order;
  /// none or one rank: no call).
  void allReduce(uint64_t offset, uint64_t bytes, kernels::DType dtype,
                 Stream stream = Stream::Compute,
                 bool lastMicrobatchOnly = false, bool overPipeline = false,
                 bool overTensor = false);
  /// ap_pipeline_send / ap_pipeline_recv (runtime/pipeline.h): `bytes` at
  /// `offset` to / from the neighbouring stage `next` (else the previous
  /// one), on the comm stream; a send never blocks it, a receive does.
  void pipelineSend(uint64_t offset, uint64_t bytes, bool next);
  void pipelineRecv(uint64_t offset, uint64_t bytes, bool next);
  /// `shardBytes` at `shard` from every rank of `dataParallel` into `full`
  /// (rank r's at r x shardBytes), enqueued on `stream` (comm or compute).
  /// `overTensor`: over `tensorParallel` instead (a sequence-parallel
  /// activation's token shards).
  void allGather(uint64_t shard, uint64_t full, uint64_t shardBytes,
                 kernels::DType dtype, Stream stream, bool overTensor = false);

  /// This rank's block of the sum over ranks of `full` (ranks x shardBytes)
  /// into `shard`, enqueued on `stream`; `accumulate`: added to what
  /// `shard` holds (the rank-order sum, then one add). `full` is scratch
  /// afterwards. `shardBf16` (with `accumulate` and an F32 `full`): the
  /// shard is bf16 (shardBytes / 2 bytes) and becomes bf16(float(shard) +
  /// the block's F32 sum), rounded once.
  void reduceScatter(uint64_t full, uint64_t shard, uint64_t shardBytes,
                     kernels::DType dtype, Stream stream,
                     bool accumulate = false, bool shardBf16 = false,
                     bool overTensor = false);
  /// Zeroes `bytes` at `offset`, enqueued on `stream` (compute or comm).
  void zero(uint64_t offset, uint64_t bytes, Stream stream);
  /// A group of data-parallel all-gathers on `stream` (ZeRO-3: a window's
  /// parameters): between begin and end only allGather over
  /// `dataParallel` may be issued on `stream`, and records on `stream`
  /// wait until the end (the communicator may launch the group as one, so
  /// nothing of it is enqueued before then). Gathers copy bytes, so a group
  /// changes no bit. Groups do not nest; the end names the begin's stream.
  void commGroupBegin(Stream stream);
  void commGroupEnd(Stream stream);
  /// Records `event` on `stream`, after the open group's end when the group
  /// is on `stream`.
  void record(EventId event, Stream stream);
  /// This rank in the data-parallel group (0 without one).
  int dpRank() const { return dataParallel ? dataParallel->rank() : 0; }
  /// This rank and the size of the tensor-parallel group (0 and 1 without).
  int tpRank() const { return tensorParallel ? tensorParallel->rank() : 0; }
  int tpSize() const { return tensorParallel ? tensorParallel->size() : 1; }
  /// Element-wise sums over the data-parallel ranks of a few doubles (at
  /// most kScratchRankSumsBytes), the same on every rank: one all-reduce
  /// through the driver scratch after all streams are idle (the host
  /// communicators sum in rank order; NCCL as for every other collective).
  /// A world of one returns `parts`. Collective: every rank calls it.
  std::vector<double> sumOverRanks(std::vector<double> parts);
  /// The same over the stages of this pipeline (each stage's own share of
  /// a check: the finiteness norms); no pipeline: `parts`. Collective over
  /// the pipeline group.
  std::vector<double> sumOverStages(std::vector<double> parts);

  //===--- Data movement ops (kernels on the compute stream) -----------===//
  /// y[outer, len, inner] = x[outer, offset:offset+len, inner]; x has `dimX`.
  void slice(const char *name, uint64_t x, uint64_t y, int64_t outer,
             int64_t dimX, int64_t offset, int64_t len, int64_t inner,
             int64_t elemBytes);
  /// y[outer, sum dims, inner] = concat of inputs along the middle dim.
  void concat(const char *name, std::vector<uint64_t> xs,
              std::vector<int64_t> dims, uint64_t y, int64_t outer,
              int64_t inner, int64_t elemBytes);
  /// y[outer, n, inner] = x[outer, 1, inner] broadcast; grad sums n copies.
  void expand(const char *name, uint64_t x, uint64_t y, int64_t outer,
              int64_t n, int64_t inner, kernels::DType dtype);
  void expandGrad(const char *name, uint64_t dy, uint64_t dx, int64_t outer,
                  int64_t n, int64_t inner, kernels::DType dtype);
  /// The GDN gates: forward writes g (Acc) and beta (storage); backward
  /// takes a, A_log, dt_bias, beta, dg (Acc), dbeta (storage).
  void gdnGates(const char *name, uint64_t a, uint64_t b, uint64_t aLog,
                uint64_t dtBias, uint64_t g, uint64_t beta, int64_t tokens,
                int32_t heads, kernels::DType dtype);
  void gdnGatesGrad(const char *name, uint64_t a, uint64_t aLog,
                    uint64_t dtBias, uint64_t beta, uint64_t dg, uint64_t dbeta,
                    uint64_t da, uint64_t db, uint64_t dALog, uint64_t dDtBias,
                    int64_t tokens, int32_t heads, kernels::DType dtype);
  /// Copies n elements between dtypes (storage <-> Acc staging).
  void convert(const char *name, const void *src, kernels::DType from,
               void *dst, kernels::DType to, int64_t n);

  //===--- Step-level ops -------------------------------------------------===//
  /// The grad norm's generated kernels (indices into the program's generated
  /// kernels; -1: none): the sums of squares of bf16 and of f32 main grads,
  /// and the finish. With no finish, the library kernel runs.
  struct GeneratedNorm {
    int64_t squaresBf16 = -1, squaresF32 = -1, finish = -1;
  };
  void finalizeGrads(double maxNorm, const GeneratedNorm &generated);
  void finalizeGrads(double maxNorm);
  void lrSchedule(double maxLr, double minLr, int64_t warmup, int64_t total);
  /// The AdamW update of one parameter: the library kernel, or generated
  /// kernel `generated` (an index into the program's generated kernels)
  /// with the same arguments.
  void adamw(size_t param, double beta1, double beta2, double eps,
             double weightDecay, int64_t generated = -1);
  void lossMean();

  // Results of the step.
  float loss = 0, gradNorm = 0, lr = 0;
  /// The last step's token count (summed over microbatches and ranks), as
  /// its loss mean divided by.
  int32_t lastTokenCount() const {
    return countParts_.empty() ? 0 : countParts_[0];
  }
  std::string gradsFingerprint;
  /// Seconds spent hashing inside the step (--fingerprints), left out of
  /// the step time.
  double fingerprintSeconds = 0;
  /// Called at the end of finalizeGrads, before the optimizer, while the
  /// main grads still hold the step's sums over tokens: the step's token
  /// count and the clip coefficient that AdamW applies on top of 1 / count.
  /// --dump-grads reads the gradients here.
  std::function<void(int32_t tokenCount, float clipCoef)> onGradsFinalized;

private:
  /// On several data-parallel ranks: the loss sum and token count the
  /// step's all-reduces summed into the state buffers replace this rank's
  /// host copies (a world of one keeps them).
  void readSummedState();
  /// The grad norm's sum of squares over this stage's main grads, started
  /// from the previous stages' sum and passed on (finalizeGrads).
  double chainedSquares(const std::vector<kernels::GradTensor> &tensors);
  /// The sum of squares of `tensors` on this rank (one running sum in list
  /// order, as one stage of chainedSquares); 0 for none.
  double localSquares(const std::vector<kernels::GradTensor> &tensors);
  /// The grad norm over args' tensors as one kernel entry: the library's
  /// kernels::gradNorm, or the generated kernels of generatedNorm_ (the
  /// same partials and order, in the launching stream's workspace).
  KernelFn gradNormKernel(const kernels::GradNormArgs &args);
  GeneratedNorm generatedNorm_;
  /// Adds each tied_grad_offset buffer into its main grad and zeroes it;
  /// sums pipeline_tied main grads over the first and the last stage.
  void combineTiedGrads();
  /// In-place f32/f64/... sum of `count` elements at `p` over `comm`,
  /// issued on `stream` (host: on its worker; cuda: on its native stream).
  void sumOn(Communicator *comm, void *p, size_t count, kernels::DType dtype,
             Stream stream);
  std::vector<double> sumScalars(Communicator *comm, std::vector<double> parts);

  struct PendingOpTime {
    std::string name; ///< a copy: read after the step, whoever made it
    uint32_t start, end;
    Stream stream;
  };
  std::vector<uint32_t> timers_; ///< reused every step, two per launch
  std::vector<PendingOpTime> pendingOpTimes_;

  const Program &program_;
  bool fingerprints_;
  std::unique_ptr<PipelineLinks> links_;
  /// The first and the last stage (more than two stages): tied grads are
  /// summed over it. With two stages, `pipeline` itself.
  std::unique_ptr<Communicator> tiedGroup_;
  std::vector<float> lossParts_;
  std::vector<int32_t> countParts_;
  float clipHost_ = 1.f;
  /// The open all-gather group's stream and the records it holds back.
  std::optional<Stream> groupStream_;
  std::vector<EventId> groupRecords_;
};

/// The training binary: parses the train flags, runs `program`. Returns the
/// process exit code:
///   0  done (also: --resume at a checkpoint whose step equals --steps,
///      nothing to train; said on stderr);
///   1  an error (a checkpoint that does not fit this run, a locked or
///      unwritable --save folder, a folder holding checkpoints without
///      --overwrite, ...);
///   2  a bad flag (also: --steps below the checkpoint's step, a --seed
///      other than the checkpoint's);
///   3  a step that is not finite (loss, grad norm, or the updated master
///      weights or Adam moments): training stops and that step is not
///      saved, so "latest" keeps naming the last good checkpoint.
int trainMain(int argc, char **argv, const Program &program);
/// A pipelined binary (runtime/abi.h ap_train_main_stages): `stages[s]` is
/// stage s of stages.size(); the world must have data-parallel size x
/// stages ranks, and each runs its stage's program (world rank = dp rank +
/// data-parallel size x stage). One program: trainMain.
int trainMainStages(int argc, char **argv, const std::vector<Program> &stages);

/// The shortest decimal text that reads back as `v` exactly.
std::string exactNumberText(double v);

/// The run configuration a checkpoint records (TrainingState::runConfig):
/// model (name, vocabulary, parameter table digest), sequence length,
/// global batch in tokens, data source identity, peak lr, lr schedule,
/// gradient clipping and AdamW settings. `dataSource` is
/// DataLoader::sourceDescription().
std::map<std::string, std::string> runConfigOf(const Program &program,
                                               double lr,
                                               const std::string &dataSource,
                                               int worldSize);
/// How the run is laid out (TrainingState::placement): micro-batch split,
/// world size, device kind and the buffer plan. Reported, never refused.
std::map<std::string, std::string>
placementOf(const Program &program, const std::string &device, int worldSize);

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_TRAINER_H
