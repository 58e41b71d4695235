//===- step_runner.cpp - The support calls of a generated step --*- C++ -*-===//
//
// See trainer.h (StepRunner). Every op of the step, the data-movement and
// dtype-adapting support ops included, is a kernel entry on the compute
// stream of the chosen backend (or, for recompute kernels the schedule issues
// early, on the side stream); the only host work inside a step is the scalar
// bookkeeping of the microbatch loop and the grad finalisation. The timed
// launch paths (launchOn, waitCopy, collectOpTimes) are in op_timing.cpp.
//
//===----------------------------------------------------------------------===//
#include "runtime/abi.h"
#include "runtime/generated.h"
#include "runtime/pipeline.h"
#include "runtime/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

namespace ap::rt {

using kernels::DType;
using kernels::KernelContext;

StepRunner::StepRunner(const Program &program, Device &device,
                       PinnedPool &pinned, OffloadEngine &offload,
                       bool fingerprints)
    : dev(device), pool(pinned), engine(offload), program_(program),
      fingerprints_(fingerprints) {
  for (uint32_t i = 0; i < program.numEvents; ++i)
    ev.push_back(dev.createEvent());
  for (const std::string &s : program.scopes)
    scope.push_back(engine.scope(s));
  lossParts_.assign(size_t(program.microBatches), 0.f);
  countParts_.assign(size_t(program.microBatches), 0);
}

StepRunner::~StepRunner() = default;

void StepRunner::attachPipeline(Communicator *pp) {
  if (!pp)
    fail("pipeline: no pipeline group");
  if (pp->size() != program_.pipelineSize || pp->rank() != stage())
    fail("pipeline: the pipeline group has ", pp->size(),
         " rank(s) and this is rank ", pp->rank(),
         ", but the program is stage ", stage(), " of ", stages());
  pipeline = pp;
  if (pp->size() == 1)
    return;
  links_ = createPipelineLinks(dev, *pp);
  if (pp->size() > 2) {
    bool ends = stage() == 0 || stage() + 1 == stages();
    tiedGroup_ = pp->split(ends ? 0 : 1, stage());
  }
}

void StepRunner::pipelineSend(uint64_t offset, uint64_t bytes, bool next) {
  if (!links_)
    fail("pipeline_send: stage ", stage(), " of a ", stages(),
         "-stage program has no pipeline neighbours");
  links_->send(dev.at(offset, bytes), bytes,
               next ? PipelinePeer::Next : PipelinePeer::Prev);
}

void StepRunner::pipelineRecv(uint64_t offset, uint64_t bytes, bool next) {
  if (!links_)
    fail("pipeline_recv: stage ", stage(), " of a ", stages(),
         "-stage program has no pipeline neighbours");
  links_->recv(dev.at(offset, bytes), bytes,
               next ? PipelinePeer::Next : PipelinePeer::Prev);
}

char *StepRunner::scratch(uint64_t offset) const {
  return static_cast<char *>(dev.at(program_.scratchOffset + offset));
}

//===----------------------------------------------------------------------===//
// Loop ops
//===----------------------------------------------------------------------===//

void StepRunner::loadInput(const char *name, uint64_t offset, uint64_t bytes,
                           bool tpShard) {
  const std::vector<int32_t> *src = nullptr;
  if (std::strcmp(name, "tokens") == 0)
    src = &tokens;
  else if (std::strcmp(name, "labels") == 0)
    src = &labels;
  else
    fail("load_input: unknown input '", name, "'");
  uint64_t n = uint64_t(program_.batch * program_.seq);
  uint64_t first = 0;
  if (tpShard) {
    // Sequence parallelism: this rank's block of the flattened microbatch.
    int ranks = tensorParallel ? tensorParallel->size() : 1;
    if (ranks != program_.tensorParallelSize || n % uint64_t(ranks) != 0)
      fail("load_input ", name, ": a token shard over ", ranks,
           " tensor-parallel rank(s) of ", n,
           " tokens (the program was "
           "compiled for ",
           program_.tensorParallelSize, ")");
    n /= uint64_t(ranks);
    first = n * uint64_t(tensorParallel ? tensorParallel->rank() : 0);
  }
  if (n * sizeof(int32_t) > bytes)
    fail("load_input ", name, ": ", n * 4, " bytes do not fit the ", bytes,
         "-byte buffer");
  uint64_t perMicrobatch = uint64_t(program_.batch * program_.seq);
  dev.copyAsync(dev.at(offset, n * 4),
                src->data() + uint64_t(microbatch) * perMicrobatch + first,
                n * 4, CopyKind::HostToDevice, Stream::Compute);
}

void StepRunner::yield(uint64_t lossOff, uint64_t countOff) {
  dev.copyAsync(&lossParts_[size_t(microbatch)], dev.at(lossOff, 4), 4,
                CopyKind::DeviceToHost, Stream::Compute);
  dev.copyAsync(&countParts_[size_t(microbatch)], dev.at(countOff, 4), 4,
                CopyKind::DeviceToHost, Stream::Compute);
}

void StepRunner::endLoop() {
  // Every boundary send of the step has been delivered (or its failure,
  // naming the peer, is thrown here).
  if (links_)
    links_->drain();
  dev.synchronize(Stream::Compute);
  // The same order a device-side running sum would use: microbatch 0 first.
  float sum = 0.f;
  int32_t count = 0;
  for (size_t i = 0; i < lossParts_.size(); ++i) {
    sum += lossParts_[i];
    count += countParts_[i];
  }
  lossParts_.assign(lossParts_.size(), sum);
  countParts_.assign(countParts_.size(), count);
  const StateOffsets &s = program_.state;
  dev.copyAsync(dev.at(s.lossSum, 4), &lossParts_[0], 4, CopyKind::HostToDevice,
                Stream::Compute);
  dev.copyAsync(dev.at(s.tokenCount, 4), &countParts_[0], 4,
                CopyKind::HostToDevice, Stream::Compute);
  dev.synchronize(Stream::Compute);
}

void StepRunner::allReduce(uint64_t offset, uint64_t bytes, DType dtype,
                           Stream stream, bool lastMicrobatchOnly,
                           bool overPipeline, bool overTensor) {
  if (stream != Stream::Comm && stream != Stream::Compute)
    fail("all_reduce: stream ", streamName(stream),
         " (expected comm or compute)");
  if (overPipeline && overTensor)
    fail("all_reduce: over the pipeline and the tensor-parallel group at "
         "once");
  if (groupStream_ && *groupStream_ == stream)
    fail("all_reduce: inside a group of all-gathers on the ",
         streamName(stream), " stream (a group holds all-gathers only)");
  if (!dataParallel && !overPipeline && !overTensor)
    fail("all_reduce: the step has no data-parallel communicator");
  if (overTensor && program_.tensorParallelSize > 1 &&
      (!tensorParallel ||
       tensorParallel->size() != program_.tensorParallelSize))
    fail("all_reduce: the program was compiled for ",
         program_.tensorParallelSize,
         " tensor-parallel ranks but the step's "
         "tensor-parallel group has ",
         tensorParallel ? tensorParallel->size() : 0);
  if (lastMicrobatchOnly && microbatch + 1 != program_.microBatches)
    return;
  void *p = dev.at(offset, bytes);
  Communicator *comm = overPipeline ? pipeline
                       : overTensor ? tensorParallel
                                    : dataParallel;
  // A world of one: the sum over "dp" is the buffer itself, so no call (an
  // in-place sum over one rank is the identity on every backend). The same
  // for a pipeline of one stage.
  if (!comm || comm->size() == 1)
    return;
  sumOn(comm, p, size_t(bytes) / dtypeBytes(dtype), dtype, stream);
}

void StepRunner::sumOn(Communicator *comm, void *p, size_t count, DType dtype,
                       Stream stream) {
  if (dev.kind() == DeviceKind::Cuda) {
    // NCCL enqueues on the stream's cudaStream_t: ordered by its events.
    comm->allReduceSum(p, p, count, dtype, dev.nativeStream(stream));
    return;
  }
  // Host: MPI blocks its calling thread, so the call runs on the stream's
  // worker, in that stream's order like a kernel.
  dev.hostCallback(stream, [comm, p, count, dtype] {
    comm->allReduceSum(p, p, count, dtype, nullptr);
  });
}

namespace {
/// The communicator, the element count and a checked stream for a shard
/// collective: `shardBytes` whole elements, the full buffer inside the
/// arena, the comm or compute stream.
size_t shardCount(const char *what, Communicator *comm, Stream stream,
                  uint64_t shardBytes, DType dtype) {
  if (stream != Stream::Comm && stream != Stream::Compute)
    fail(what, ": stream ", streamName(stream), " (expected comm or compute)");
  if (!comm)
    fail(what, ": the step has no such communicator (data-parallel, or "
               "tensor-parallel for a sequence-parallel shard)");
  size_t eb = dtypeBytes(dtype);
  if (shardBytes == 0 || shardBytes % eb != 0)
    fail(what, ": shard of ", shardBytes, " bytes is not a whole number of ",
         eb, "-byte elements");
  return size_t(shardBytes / eb);
}
} // namespace

void StepRunner::allGather(uint64_t shard, uint64_t full, uint64_t shardBytes,
                           DType dtype, Stream stream, bool overTensor) {
  if (groupStream_ && *groupStream_ == stream && overTensor)
    fail("all_gather: over the tensor-parallel ranks inside a group of "
         "data-parallel all-gathers on the ",
         streamName(stream), " stream");
  Communicator *comm = overTensor ? tensorParallel : dataParallel;
  size_t count = shardCount("all_gather", comm, stream, shardBytes, dtype);
  uint64_t ranks = uint64_t(comm->size());
  void *s = dev.at(shard, shardBytes);
  void *f = dev.at(full, shardBytes * ranks);
  if (dev.kind() == DeviceKind::Cuda) {
    comm->allGather(s, f, count, dtype, dev.nativeStream(stream));
    return;
  }
  dev.hostCallback(stream, [comm, s, f, count, dtype] {
    comm->allGather(s, f, count, dtype, nullptr);
  });
}

void StepRunner::commGroupBegin(Stream stream) {
  if (groupStream_)
    fail("comm group: a group is already open on the ",
         streamName(*groupStream_), " stream (groups do not nest)");
  if (stream != Stream::Comm && stream != Stream::Compute)
    fail("comm group: stream ", streamName(stream),
         " (expected comm or compute)");
  groupStream_ = stream;
  if (dataParallel && dev.kind() == DeviceKind::Cuda)
    dataParallel->groupStart();
}

void StepRunner::commGroupEnd(Stream stream) {
  if (!groupStream_ || *groupStream_ != stream)
    fail("comm group: an end on the ", streamName(stream), " stream ",
         groupStream_ ? "while the open group is on the " +
                            std::string(streamName(*groupStream_)) + " stream"
                      : std::string("without a begin"));
  if (dataParallel && dev.kind() == DeviceKind::Cuda)
    dataParallel->groupEnd();
  groupStream_.reset();
  for (EventId e : groupRecords_)
    dev.record(e, stream);
  groupRecords_.clear();
}

void StepRunner::record(EventId event, Stream stream) {
  if (groupStream_ && *groupStream_ == stream) {
    groupRecords_.push_back(event);
    return;
  }
  dev.record(event, stream);
}

void StepRunner::reduceScatter(uint64_t full, uint64_t shard,
                               uint64_t shardBytes, DType dtype, Stream stream,
                               bool accumulate, bool shardBf16,
                               bool overTensor) {
  if (groupStream_ && *groupStream_ == stream)
    fail("reduce_scatter: inside a group of all-gathers on the ",
         streamName(stream), " stream (a group holds all-gathers only)");
  Communicator *comm = overTensor ? tensorParallel : dataParallel;
  size_t count = shardCount("reduce_scatter", comm, stream, shardBytes, dtype);
  uint64_t ranks = uint64_t(comm->size());
  void *f = dev.at(full, shardBytes * ranks);
  if (shardBf16) {
    // A bf16 main-grad shard: shardBytes are the F32 block's, the shard
    // holds half of them.
    if (!accumulate || dtype != DType::F32)
      fail("reduce_scatter: a bf16 shard takes the accumulated sum of an f32 "
           "full buffer (got ",
           accumulate ? "" : "no accumulate, ", "dtype ", int(dtype), ")");
    auto *fs = static_cast<float *>(f);
    auto *bs = static_cast<kernels::bf16 *>(dev.at(shard, shardBytes / 2));
    if (dev.kind() == DeviceKind::Cuda) {
      comm->reduceScatterSumAddBf16(fs, bs, count, dev.nativeStream(stream));
      return;
    }
    dev.hostCallback(stream, [comm, fs, bs, count] {
      comm->reduceScatterSumAddBf16(fs, bs, count, nullptr);
    });
    return;
  }
  void *s = dev.at(shard, shardBytes);
  if (dev.kind() == DeviceKind::Cuda) {
    void *native = dev.nativeStream(stream);
    if (accumulate)
      comm->reduceScatterSumAdd(f, s, count, dtype, native);
    else
      comm->reduceScatterSum(f, s, count, dtype, native);
    return;
  }
  dev.hostCallback(stream, [comm, f, s, count, dtype, accumulate] {
    if (accumulate)
      comm->reduceScatterSumAdd(f, s, count, dtype, nullptr);
    else
      comm->reduceScatterSum(f, s, count, dtype, nullptr);
  });
}

std::vector<double> StepRunner::sumOverRanks(std::vector<double> parts) {
  return sumScalars(dataParallel, std::move(parts));
}

std::vector<double> StepRunner::sumOverStages(std::vector<double> parts) {
  return sumScalars(pipeline, std::move(parts));
}

std::vector<double> StepRunner::sumScalars(Communicator *comm,
                                           std::vector<double> parts) {
  if (!comm || comm->size() == 1 || parts.empty())
    return parts;
  size_t n = parts.size();
  if (n * sizeof(double) > kScratchRankSumsBytes)
    fail("sum over ranks: ", n, " values, room for ",
         kScratchRankSumsBytes / sizeof(double));
  // No collective of the step may still be in flight on another stream:
  // the ranks must issue this one in the same order.
  dev.synchronize();
  auto *p = reinterpret_cast<double *>(scratch(kScratchRankSums));
  dev.copyAsync(p, parts.data(), n * sizeof(double), CopyKind::HostToDevice,
                Stream::Compute);
  if (dev.kind() == DeviceKind::Cuda)
    comm->allReduceSum(p, p, n, DType::F64, dev.nativeStream(Stream::Compute));
  else
    dev.hostCallback(Stream::Compute, [comm, p, n] {
      comm->allReduceSum(p, p, n, DType::F64, nullptr);
    });
  dev.copyToHostSync(parts.data(), p, n * sizeof(double));
  return parts;
}

ShardSpan shardSpan(const ParamEntry &e, int rank) {
  if (e.shardNumel <= 0)
    return {0, e.numel, e.numel};
  int64_t begin = int64_t(rank) * e.shardNumel;
  int64_t count = std::clamp<int64_t>(e.numel - begin, 0, e.shardNumel);
  return {begin, count, e.shardNumel};
}

void StepRunner::zero(uint64_t offset, uint64_t bytes, Stream stream) {
  if (stream != Stream::Comm && stream != Stream::Compute)
    fail("zero: stream ", streamName(stream), " (expected comm or compute)");
  dev.memsetAsync(dev.at(offset, bytes), 0, bytes, stream);
}

//===----------------------------------------------------------------------===//
// Data movement
//===----------------------------------------------------------------------===//

void StepRunner::slice(const char *name, uint64_t x, uint64_t y, int64_t outer,
                       int64_t dimX, int64_t offset, int64_t len, int64_t inner,
                       int64_t eb) {
  kernels::CopyRowsArgs a;
  a.src = static_cast<const char *>(at(x)) + offset * inner * eb;
  a.dst = at(y);
  a.outer = outer;
  a.rowBytes = len * inner * eb;
  a.srcPitch = dimX * inner * eb;
  a.dstPitch = a.rowBytes;
  launch(name, [a](const KernelContext &c) { return kernels::copyRows(c, a); });
}

void StepRunner::concat(const char *name, std::vector<uint64_t> xs,
                        std::vector<int64_t> dims, uint64_t y, int64_t outer,
                        int64_t inner, int64_t eb) {
  int64_t total = 0;
  for (int64_t d : dims)
    total += d;
  int64_t pos = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    kernels::CopyRowsArgs a;
    a.src = at(xs[i]);
    a.dst = static_cast<char *>(at(y)) + pos * inner * eb;
    a.outer = outer;
    a.rowBytes = dims[i] * inner * eb;
    a.srcPitch = a.rowBytes;
    a.dstPitch = total * inner * eb;
    launch(name,
           [a](const KernelContext &c) { return kernels::copyRows(c, a); });
    pos += dims[i];
  }
}

void StepRunner::expand(const char *name, uint64_t x, uint64_t y, int64_t outer,
                        int64_t n, int64_t inner, DType dtype) {
  kernels::CopyRowsArgs a;
  a.src = at(x);
  a.dst = at(y);
  a.outer = outer;
  a.rowBytes = inner * int64_t(dtypeBytes(dtype));
  a.srcPitch = a.rowBytes;
  a.dstPitch = n * a.rowBytes;
  a.repeats = n;
  launch(name, [a](const KernelContext &c) { return kernels::copyRows(c, a); });
}

void StepRunner::expandGrad(const char *name, uint64_t dy, uint64_t dx,
                            int64_t outer, int64_t n, int64_t inner,
                            DType dtype) {
  // Sum of the n copies in increasing order, in Acc, rounded once.
  kernels::SumRepeatsArgs a;
  a.dtype = dtype;
  a.x = at(dy);
  a.y = at(dx);
  a.outer = outer;
  a.repeats = n;
  a.inner = inner;
  launch(name,
         [a](const KernelContext &c) { return kernels::sumRepeats(c, a); });
}

void StepRunner::convert(const char *name, const void *src, DType from,
                         void *dst, DType to, int64_t n) {
  kernels::ConvertArgs a;
  a.from = from;
  a.to = to;
  a.x = src;
  a.y = dst;
  a.n = n;
  launch(name,
         [a](const KernelContext &c) { return kernels::convertDType(c, a); });
}

void StepRunner::gdnGates(const char *name, uint64_t a, uint64_t b,
                          uint64_t aLog, uint64_t dtBias, uint64_t g,
                          uint64_t beta, int64_t tokens, int32_t heads,
                          DType dtype) {
  kernels::GdnGatesArgs args;
  args.dtype = dtype;
  args.tokens = tokens;
  args.heads = heads;
  args.a = at(a);
  args.b = at(b);
  args.aLog = at(aLog);
  args.dtBias = at(dtBias);
  args.g = at(g);
  args.beta = at(beta);
  launch(name, [args](const KernelContext &c) {
    return kernels::gdnGatesForward(c, args);
  });
}

void StepRunner::gdnGatesGrad(const char *name, uint64_t a, uint64_t aLog,
                              uint64_t dtBias, uint64_t beta, uint64_t dg,
                              uint64_t dbeta, uint64_t da, uint64_t db,
                              uint64_t dALog, uint64_t dDtBias, int64_t tokens,
                              int32_t heads, DType dtype) {
  kernels::GdnGatesArgs args;
  args.dtype = dtype;
  args.tokens = tokens;
  args.heads = heads;
  args.a = at(a);
  args.aLog = at(aLog);
  args.dtBias = at(dtBias);
  args.beta = at(beta);
  args.dg = at(dg);
  args.dbeta = at(dbeta);
  args.da = at(da);
  args.db = at(db);
  args.dALog = at(dALog);
  args.dDtBias = at(dDtBias);
  launch(name, [args](const KernelContext &c) {
    return kernels::gdnGatesBackward(c, args);
  });
}

//===----------------------------------------------------------------------===//
// Step-level ops
//===----------------------------------------------------------------------===//

void StepRunner::readSummedState() {
  if ((!dataParallel || dataParallel->size() == 1) &&
      (!pipeline || pipeline->size() == 1) &&
      (!tensorParallel || tensorParallel->size() == 1))
    return;
  // The step's all-reduces summed the state buffers over the ranks (the
  // compute stream waits for them, so a full synchronisation covers them):
  // the loss is the mean over the global batch's tokens, and the grads,
  // summed alike, are divided by the global count.
  dev.synchronize();
  const StateOffsets &s = program_.state;
  if (s.lossSum != kNoOffset)
    dev.copyToHostSync(&lossParts_[0], dev.at(s.lossSum, 4), 4);
  if (s.tokenCount != kNoOffset)
    dev.copyToHostSync(&countParts_[0], dev.at(s.tokenCount, 4), 4);
}

void StepRunner::finalizeGrads(double maxNorm) {
  finalizeGrads(maxNorm, GeneratedNorm());
}

void StepRunner::finalizeGrads(double maxNorm, const GeneratedNorm &generated) {
  generatedNorm_ = generated;
  // Every microbatch is done (endLoop synchronised). The main grads hold
  // sums over the step's tokens; the division by the token count and the
  // clip are folded into one coefficient that AdamW applies (g * coef), so
  // the norm is computed once, in the kernel's fixed order, over the sums.
  readSummedState();
  const StateOffsets &s = program_.state;
  int32_t count = countParts_.empty() ? 0 : countParts_[0];
  if (count <= 0)
    fail("finalize_grads: the step has no valid tokens (token count ", count,
         ")");
  if (evaluating) {
    // Only the loss is wanted; AdamW (also evaluating) zeroes the main
    // grads, the tied LM-head parts are zeroed here.
    for (const ParamEntry &p : program_.params)
      if (!p.frozen && p.tiedGrad != kNoOffset)
        dev.memsetAsync(dev.at(p.tiedGrad, uint64_t(p.numel) * 4), 0,
                        uint64_t(p.numel) * 4, Stream::Compute);
    dev.synchronize(Stream::Compute);
    return;
  }
  // ZeRO-3: each rank's main grads are its shards of the summed grads, so
  // the norm below covers this rank's elements only (the padding past a
  // parameter's end is left out: nothing there is a gradient) and the
  // fingerprint is this rank's.
  const int rank = dpRank();
  // A tied weight's two gradient parts become one (both forms add the
  // embedding part and the LM-head part once), before anything reads them.
  combineTiedGrads();
  const bool pipelined = pipeline && pipeline->size() > 1;
  std::vector<kernels::GradTensor> tensors;
  std::vector<ByteRange> ranges;
  for (const ParamEntry &p : program_.params) {
    if (p.frozen)
      continue;
    ShardSpan span = shardSpan(p, rank);
    if (span.count == 0)
      continue;
    ranges.push_back(
        {at(p.grad), uint64_t(span.count) * dtypeBytes(p.gradDType()), true});
    // A tied weight counts once in the norm: on the first stage holding it.
    if (pipelined && p.pipelineTied && stage() > 0)
      continue;
    tensors.push_back({at(p.grad), span.count, p.gradDType()});
  }
  if (fingerprints_) {
    // Hashing gigabytes is not part of the step: its time is left out of
    // step_time_s (the device is idle meanwhile, so nothing else is lost).
    auto t0 = std::chrono::steady_clock::now();
    gradsFingerprint = fingerprint(dev, pool, ranges);
    fingerprintSeconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
  }
  float *normDev = reinterpret_cast<float *>(scratch(AP_SCRATCH_GRAD_NORM));
  kernels::GradNormArgs args;
  args.tensors = tensors.data();
  args.numTensors = int64_t(tensors.size());
  args.maxNorm = 0; // clip computed below from the mean-gradient norm
  args.norm = normDev;
  args.clipCoef = nullptr;
  float rawNorm = 0;
  if (tensorParallel && tensorParallel->size() > 1) {
    // The split parameters' squares are summed over the tensor-parallel
    // ranks (each holds a part); the replicated ones (the same on every
    // rank once tp_grad_sum grads were summed) count once. Each set is one
    // running sum in parameter order, continued from stage to stage in a
    // pipeline, so a pipelined run has the bits of one stage.
    std::vector<kernels::GradTensor> split, replicated;
    size_t k = 0;
    for (const ParamEntry &p : program_.params) {
      if (p.frozen || shardSpan(p, rank).count == 0 ||
          (pipelined && p.pipelineTied && stage() > 0))
        continue;
      (p.tpDim >= 0 ? split : replicated).push_back(tensors[k++]);
    }
    double splitSquares =
        pipelined ? chainedSquares(split) : localSquares(split);
    double replicatedSquares =
        pipelined ? chainedSquares(replicated) : localSquares(replicated);
    // ZeRO-3: each data-parallel rank holds a shard of both sets.
    if (program_.dataParallelMode == DataParallelMode::Zero3) {
      std::vector<double> both =
          sumOverRanks({splitSquares, replicatedSquares});
      splitSquares = both[0];
      replicatedSquares = both[1];
    }
    splitSquares = sumScalars(tensorParallel, {splitSquares})[0];
    rawNorm = float(std::sqrt(splitSquares + replicatedSquares));
    dev.copyAsync(normDev, &rawNorm, 4, CopyKind::HostToDevice,
                  Stream::Compute);
    dev.synchronize(Stream::Compute);
  } else if (pipelined) {
    // One running sum over the whole model's tensors in parameter order,
    // continued from stage to stage: the bits of one stage's norm.
    rawNorm = float(std::sqrt(chainedSquares(tensors)));
    // The scratch holds the whole model's norm, as on one stage (the
    // kernel left this stage's partial one there).
    dev.copyAsync(normDev, &rawNorm, 4, CopyKind::HostToDevice,
                  Stream::Compute);
    dev.synchronize(Stream::Compute);
  } else if (!tensors.empty()) {
    launch("finalize_grads", gradNormKernel(args));
    dev.copyToHostSync(&rawNorm, normDev, 4);
  }
  if (program_.dataParallelMode == DataParallelMode::Zero3 && dataParallel &&
      dataParallel->size() > 1 &&
      !(tensorParallel && tensorParallel->size() > 1)) {
    // The global norm is the root of the sum over ranks of each rank's sum
    // of squares (the shards partition every parameter), summed in one
    // fixed order that every rank shares, so every rank clips by the same
    // coefficient. The kernel gives each rank's norm, so its square stands
    // for the rank's sum (a relative error of float's rounding). A world of
    // one skips this: its shard is the whole parameter and the kernel's
    // norm is replicate's, bit for bit.
    double squares = double(rawNorm) * double(rawNorm);
    rawNorm = float(std::sqrt(sumOverRanks({squares})[0]));
  }
  gradNorm = rawNorm / float(count);
  float clip = 1.f;
  if (maxNorm > 0)
    clip = std::min(1.f, float(maxNorm / (double(gradNorm) + 1e-6)));
  clipHost_ = clip / float(count);
  dev.copyAsync(scratch(AP_SCRATCH_CLIP_COEF), &clipHost_, 4,
                CopyKind::HostToDevice, Stream::Compute);
  if (s.gradNorm != kNoOffset)
    dev.copyAsync(at(s.gradNorm), &gradNorm, 4, CopyKind::HostToDevice,
                  Stream::Compute);
  dev.synchronize(Stream::Compute);
  if (onGradsFinalized)
    onGradsFinalized(count, clip);
}

void StepRunner::combineTiedGrads() {
  const bool pipelined = pipeline && pipeline->size() > 1;
  const bool holdsTied = stage() == 0 || stage() + 1 == stages();
  for (const ParamEntry &p : program_.params) {
    if (p.frozen)
      continue;
    uint64_t bytes = uint64_t(p.numel) * 4;
    if (p.tiedGrad != kNoOffset) {
      // grad = grad + tied (one f32 rounding), then the tied part starts
      // the next step at zero like every main grad.
      auto *g = static_cast<float *>(dev.at(p.grad, bytes));
      auto *t = static_cast<float *>(dev.at(p.tiedGrad, bytes));
      size_t n = size_t(p.numel);
#if defined(ACTPLACE_HAVE_CUDA)
      if (dev.kind() == DeviceKind::Cuda)
        cudaAddInto(DType::F32, g, t, n, dev.nativeStream(Stream::Compute));
      else
#endif
        dev.hostCallback(Stream::Compute,
                         [g, t, n] { detail::addInto(DType::F32, g, t, n); });
      dev.memsetAsync(t, 0, bytes, Stream::Compute);
    }
    if (pipelined && p.pipelineTied) {
      if (!holdsTied)
        fail("finalize_grads: parameter '", p.name,
             "' is pipeline_tied on "
             "stage ",
             stage(), " of ", stages(),
             " (tied weights live on the first and the last stage)");
      // Two addends: stage 0's value + the last stage's, the same bits in
      // either order, on both stages. ZeRO-3: this rank's shard (the same
      // elements on both ends, in the main grad's dtype).
      Communicator *ends = tiedGroup_ ? tiedGroup_.get() : pipeline;
      size_t n = size_t(shardSpan(p, dpRank()).bufferNumel);
      sumOn(ends, dev.at(p.grad, n * dtypeBytes(p.gradDType())), n,
            p.gradDType(), Stream::Compute);
    }
  }
}

KernelFn StepRunner::gradNormKernel(const kernels::GradNormArgs &args) {
  if (generatedNorm_.finish < 0)
    return
        [args](const KernelContext &c) { return kernels::gradNorm(c, args); };
  // kernelgen's grad norm: per tensor its sums of squares (grad, partial,
  // n) into consecutive f64 partials of the workspace, then the finish
  // (partial, initial, norm, clipCoef, squares, parts, maxNormBits).
  auto kernelAt = [&](int64_t index, const char *params,
                      const char *what) -> const ap_generated_kernel * {
    if (index < 0)
      return nullptr;
    const ap_generated_kernel &k = program_.generated.at(size_t(index));
    if (std::strcmp(k.params, params) != 0)
      fail("finalize_grads: generated kernel '", k.name, "' takes parameters '",
           k.params, "', not a grad norm ", what, "'s ('", params, "')");
    return &k;
  };
  const ap_generated_kernel *squares16 =
      kernelAt(generatedNorm_.squaresBf16, "ppl", "sums of squares");
  const ap_generated_kernel *squares32 =
      kernelAt(generatedNorm_.squaresF32, "ppl", "sums of squares");
  const ap_generated_kernel *finish =
      kernelAt(generatedNorm_.finish, "pppppll", "finish");
  for (int64_t t = 0; t < args.numTensors; ++t)
    if (!(args.tensors[t].dtype == DType::BF16 ? squares16 : squares32))
      fail("finalize_grads: no generated sums of squares for a ",
           args.tensors[t].dtype == DType::BF16 ? "bf16" : "f32",
           " main grad (the program's "
           "ap_finalize_grads_generated names none)");
  const char *ptx = program_.generatedPtx;
  uint64_t *counter = &generatedLaunches;
  return [args, squares16, squares32, finish, ptx,
          counter](const KernelContext &c) {
    auto ptr = [](const void *q) { return uint64_t(uintptr_t(q)); };
    int64_t parts = 0;
    for (int64_t t = 0; t < args.numTensors; ++t)
      parts += kernels::gradNormParts(args.tensors[t].n);
    uint64_t need = uint64_t(std::max<int64_t>(parts, 1)) * sizeof(double);
    if (!c.workspace || c.workspaceBytes < need)
      fail("finalize_grads: the generated grad norm needs ", need,
           " bytes of kernel workspace for its partials, the stream has ",
           c.workspace ? c.workspaceBytes : 0);
    auto *partial = static_cast<double *>(c.workspace);
    int64_t off = 0;
    for (int64_t t = 0; t < args.numTensors; ++t) {
      const kernels::GradTensor &g = args.tensors[t];
      if (g.n == 0)
        continue;
      GeneratedLaunch l;
      l.kernel = g.dtype == DType::BF16 ? squares16 : squares32;
      l.ptx = ptx;
      uint64_t slots[3] = {ptr(g.data), ptr(partial + off), uint64_t(g.n)};
      std::memcpy(l.slots, slots, sizeof slots);
      launchGenerated(c, l);
      ++*counter;
      off += kernels::gradNormParts(g.n);
    }
    GeneratedLaunch l;
    l.kernel = finish;
    l.ptx = ptx;
    uint64_t maxNormBits;
    std::memcpy(&maxNormBits, &args.maxNorm, sizeof maxNormBits);
    uint64_t slots[7] = {ptr(partial),      ptr(args.initialSquares),
                         ptr(args.norm),    ptr(args.clipCoef),
                         ptr(args.squares), uint64_t(off),
                         maxNormBits};
    std::memcpy(l.slots, slots, sizeof slots);
    launchGenerated(c, l);
    ++*counter;
    return kernels::Status::Ok;
  };
}

double
StepRunner::localSquares(const std::vector<kernels::GradTensor> &tensors) {
  if (tensors.empty())
    return 0;
  auto *sq = reinterpret_cast<double *>(scratch(kScratchRankSums));
  kernels::GradNormArgs args;
  args.tensors = tensors.data();
  args.numTensors = int64_t(tensors.size());
  args.maxNorm = 0;
  args.norm = reinterpret_cast<float *>(scratch(AP_SCRATCH_GRAD_NORM));
  args.squares = sq;
  launch("finalize_grads", gradNormKernel(args));
  double total = 0;
  dev.copyToHostSync(&total, sq, sizeof total);
  return total;
}

double
StepRunner::chainedSquares(const std::vector<kernels::GradTensor> &tensors) {
  // Scratch doubles: [0] the sum so far (from the previous stage), [1] the
  // sum after this stage's tensors.
  auto *sq = reinterpret_cast<double *>(scratch(kScratchRankSums));
  Communicator *pp = pipeline;
  const int s = stage(), n = stages();
  const bool cuda = dev.kind() == DeviceKind::Cuda;
  void *native = dev.nativeStream(Stream::Compute);
  // Host: the calls block this thread once the compute stream is idle;
  // cuda: they are enqueued on the compute stream.
  auto hostIdle = [&] {
    if (!cuda)
      dev.synchronize(Stream::Compute);
  };
  if (s == 0) {
    double zero = 0;
    dev.copyAsync(sq, &zero, sizeof zero, CopyKind::HostToDevice,
                  Stream::Compute);
    dev.synchronize(Stream::Compute);
  } else {
    hostIdle();
    pp->recv(sq, 1, DType::F64, s - 1, native);
  }
  kernels::GradNormArgs args;
  args.tensors = tensors.data();
  args.numTensors = int64_t(tensors.size());
  args.maxNorm = 0;
  args.norm = reinterpret_cast<float *>(scratch(AP_SCRATCH_GRAD_NORM));
  args.initialSquares = sq;
  args.squares = sq + 1;
  launch("finalize_grads", gradNormKernel(args));
  hostIdle();
  if (s + 1 < n)
    pp->send(sq + 1, 1, DType::F64, s + 1, native);
  pp->broadcast(sq + 1, 1, DType::F64, n - 1, native);
  double total = 0;
  dev.copyToHostSync(&total, sq + 1, sizeof total);
  return total;
}

void StepRunner::lrSchedule(double maxLr, double minLr, int64_t warmup,
                            int64_t total) {
  if (evaluating)
    return;
  // --lr replaces the compiled peak; the floor keeps its ratio to it.
  if (program_.maxLr > 0 && lrOverride > 0) {
    minLr *= lrOverride / maxLr;
    maxLr = lrOverride;
  }
  double st = double(stepIndex), v;
  if (stepIndex < warmup) {
    v = maxLr * (st + 1) / double(warmup);
  } else {
    double p =
        (st - double(warmup)) / double(std::max<int64_t>(1, total - warmup));
    p = std::min(1.0, p);
    v = minLr + (maxLr - minLr) * (1 + std::cos(M_PI * p)) / 2;
  }
  lr = float(v);
  if (program_.state.lr != kNoOffset) {
    dev.copyAsync(at(program_.state.lr), &lr, 4, CopyKind::HostToDevice,
                  Stream::Compute);
    dev.synchronize(Stream::Compute);
  }
}

void StepRunner::adamw(size_t param, double beta1, double beta2, double eps,
                       double weightDecay, int64_t generated) {
  const ParamEntry &p = program_.params.at(param);
  if (p.frozen)
    return;
  // ZeRO-3: this rank's shard; the padding past the parameter's end is
  // skipped, so it stays zero whatever eps is (0 / (sqrt(0) + 0) would not).
  ShardSpan span = shardSpan(p, dpRank());
  if (evaluating) {
    dev.memsetAsync(at(p.grad), 0,
                    uint64_t(span.bufferNumel) * dtypeBytes(p.gradDType()),
                    Stream::Compute);
    return;
  }
  kernels::AdamWArgs args;
  args.master = static_cast<float *>(at(p.master));
  args.expAvg = static_cast<float *>(at(p.adamM));
  args.expAvgSq = static_cast<float *>(at(p.adamV));
  args.grad = at(p.grad);
  args.gradDType = p.gradDType();
  args.clipCoef =
      reinterpret_cast<const float *>(scratch(AP_SCRATCH_CLIP_COEF));
  args.computeCopy = at(p.weight);
  args.computeDType = p.dtype;
  args.n = span.count;
  args.lr = double(lr);
  args.beta1 = beta1;
  args.beta2 = beta2;
  args.eps = eps;
  args.weightDecay = weightDecay;
  args.step = stepIndex + 1;
  if (span.count > 0 && generated >= 0) {
    // kernelgen's AdamW: master, expAvg, expAvgSq, grad, clipCoef,
    // computeCopy, n, stepSize, bc2Sqrt, decay, beta1, beta2, eps.
    const ap_generated_kernel &k = program_.generated.at(size_t(generated));
    if (std::strcmp(k.params, "pppppplffffff") != 0)
      fail("adamw of '", p.name, "': generated kernel '", k.name,
           "' takes parameters '", k.params,
           "', not an AdamW's (6 pointers, n, 6 floats)");
    GeneratedLaunch g;
    g.kernel = &k;
    g.ptx = program_.generatedPtx;
    auto ptr = [](const void *q) { return uint64_t(uintptr_t(q)); };
    kernels::AdamWScalars s = kernels::adamWScalars(args);
    float f[6] = {s.stepSize, s.bc2Sqrt, s.decay, s.beta1, s.beta2, s.eps};
    uint64_t slots[13] = {ptr(args.master),   ptr(args.expAvg),
                          ptr(args.expAvgSq), ptr(args.grad),
                          ptr(args.clipCoef), ptr(args.computeCopy),
                          uint64_t(args.n)};
    for (int i = 0; i < 6; ++i)
      std::memcpy(&slots[7 + i], &f[i], sizeof(float));
    std::memcpy(g.slots, slots, sizeof(slots));
    ++generatedLaunches;
    launch(p.name, [g](const KernelContext &c) mutable {
      return launchGenerated(c, g);
    });
  } else if (span.count > 0) {
    launch(p.name, [args](const KernelContext &c) {
      return kernels::adamWStep(c, args);
    });
  }
  // The main grad (the whole shard) starts the next step at zero
  // (gradients accumulate into it), in its element size.
  dev.memsetAsync(at(p.grad), 0,
                  uint64_t(span.bufferNumel) * dtypeBytes(p.gradDType()),
                  Stream::Compute);
}

void StepRunner::lossMean() {
  readSummedState();
  int32_t count = countParts_.empty() ? 0 : countParts_[0];
  loss = lossParts_.empty() || count <= 0 ? NAN : lossParts_[0] / float(count);
  if (program_.state.loss != kNoOffset) {
    dev.copyAsync(at(program_.state.loss), &loss, 4, CopyKind::HostToDevice,
                  Stream::Compute);
    dev.synchronize(Stream::Compute);
  }
}

} // namespace ap::rt
