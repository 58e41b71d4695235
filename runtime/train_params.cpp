//===- train_params.cpp - a training run's parameters ---------------------===//
//
// See train_params.h: parameter init (in parallel, tensor-parallel parts of
// whole tensors), --init-weights, --dump-grads and the whole model of a
// pipeline's stages, for trainer.cpp's run().
//
//===----------------------------------------------------------------------===//
#include "runtime/train_params.h"

#include "runtime/abi.h"
#include "runtime/launch.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

namespace ap::rt {

using kernels::DType;
using kernels::KernelContext;
using kernels::Status;

/// Bytes of one element of `d` (collectives.h's dtypeBytes, signed for
/// the offset arithmetic here).
int64_t elemBytes(DType d) { return int64_t(dtypeBytes(d)); }

/// initParameter over n FP32 values on all cores: the Philox stream is
/// counter based, so pieces that start at multiples of its 4096-value block
/// give the same bits as one sequential pass (a 0.8B model took tens of
/// seconds to initialise on one core).
static void initParameterInParallel(const InitSpec &spec, const RngKey &key,
                                    float *out, size_t n, size_t first = 0) {
  constexpr size_t kBlock = 4096, kMinPiece = size_t(1) << 20;
  size_t threads = std::clamp<size_t>(usableCores(), 1, 16);
  size_t piece =
      std::max(kMinPiece, (n / threads + kBlock - 1) / kBlock * kBlock);
  std::vector<std::thread> workers;
  for (size_t start = 0; start < n; start += piece)
    workers.emplace_back([&, start] {
      size_t count = std::min(piece, n - start);
      initParameter(spec, key, DType::F32, out + start, count, first + start);
    });
  for (std::thread &t : workers)
    t.join();
}

/// This rank's elements of parameter `e`'s FP32 initial values: the slice
/// [span.begin, span.begin + span.count) of the whole tensor's Philox
/// values (generated from a 4096-value block boundary, so the bits are
/// those of one pass over the whole tensor), zeros up to span.bufferNumel.
std::vector<float> initialValues(const ParamEntry &e, const ShardSpan &span,
                                 uint64_t seed) {
  InitSpec spec{e.init, e.initA, e.initB};
  RngKey key = paramInitKey(seed, e.name);
  std::vector<float> out(size_t(span.bufferNumel), 0.f);
  if (span.count == 0)
    return out;
  if (span.begin == 0 && span.count == span.bufferNumel) {
    initParameterInParallel(spec, key, out.data(), size_t(span.count));
    return out;
  }
  size_t first = size_t(span.begin) / 4096 * 4096;
  size_t lead = size_t(span.begin) - first;
  std::vector<float> run(lead + size_t(span.count));
  initParameterInParallel(spec, key, run.data(), run.size(), first);
  std::copy(run.begin() + long(lead), run.end(), out.begin());
  return out;
}

/// A split parameter's layout (runtime/tensor_parts.h).
TensorPartLayout partLayoutOf(const ParamEntry &e, int ranks) {
  TensorPartLayout l;
  l.dim = e.tpDim;
  l.segments = e.tpSegments;
  l.ranks = ranks;
  return l;
}

static std::vector<int64_t> partShapeOf(const ParamEntry &e) {
  return std::vector<int64_t>(e.shape, e.shape + e.rank);
}

/// Rank r of T's part of the whole tensor's values `whole`.
std::vector<float> partOfWhole(const ParamEntry &e,
                               const std::vector<float> &whole, int r, int T) {
  std::vector<float> out(size_t(e.numel));
  partLayoutOf(e, T).take(partShapeOf(e), r, sizeof(float), whole.data(),
                          out.data());
  return out;
}

/// The whole tensor from the T ranks' parts, `parts` holding them one after
/// another in rank order (an all-gather over the tensor-parallel group).
std::vector<float> wholeOfParts(const ParamEntry &e,
                                const std::vector<float> &parts, int T) {
  std::vector<const void *> each;
  for (int r = 0; r < T; ++r)
    each.push_back(parts.data() + size_t(r) * size_t(e.numel));
  std::vector<float> out(parts.size());
  partLayoutOf(e, T).join(partShapeOf(e), sizeof(float), each, out.data());
  return out;
}

/// The whole shape of a parameter (its part's shape with tpDim widened to
/// the segments' sum for a split one).
std::vector<int64_t> wholeShape(const ParamEntry &e) {
  if (e.tpDim < 0)
    return partShapeOf(e);
  int64_t sum = 0;
  for (int64_t s : e.tpSegments)
    sum += s;
  std::vector<int64_t> shape = partShapeOf(e);
  shape[size_t(e.tpDim)] = sum;
  return shape;
}

/// A tensor-parallel parameter's part on rank `rank` of `size`: that part
/// of the whole tensor's initial values (the same Philox stream as one
/// rank's), so any number of ranks starts from the same model.
std::vector<float> tensorParallelPart(const ParamEntry &e, int rank, int size,
                                      uint64_t seed) {
  ParamEntry whole = e;
  whole.numel = e.numel * size;
  std::vector<float> all =
      initialValues(whole, ShardSpan{0, whole.numel, whole.numel}, seed);
  return partOfWhole(e, all, rank, size);
}

/// The elements of the whole flattened tensor `full` that this rank holds,
/// zeros up to span.bufferNumel (`full` itself when it is all of them).
std::vector<float> sliceOf(std::vector<float> full, const ShardSpan &span) {
  if (span.begin == 0 && span.count == span.bufferNumel &&
      int64_t(full.size()) == span.count)
    return full;
  std::vector<float> out(size_t(span.bufferNumel), 0.f);
  std::copy(full.begin() + span.begin, full.begin() + span.begin + span.count,
            out.begin());
  return out;
}

/// Writes parameter `e`'s master (when trainable) and compute copy from
/// this rank's FP32 values `v` (span.bufferNumel of them): the compute copy
/// is each value rounded once to the storage dtype (RNE for bf16), exactly
/// what initParameter gives and AdamW refreshes.
void writeParameter(StepRunner &r, const ParamEntry &e,
                    const std::vector<float> &v) {
  if (!e.frozen)
    r.dev.copyAsync(r.at(e.master), v.data(), v.size() * sizeof(float),
                    CopyKind::HostToDevice, Stream::Compute);
  std::vector<char> weight(v.size() * size_t(elemBytes(e.dtype)));
  kernels::ConvertArgs c;
  c.from = DType::F32;
  c.to = e.dtype;
  c.x = v.data();
  c.y = weight.data();
  c.n = int64_t(v.size());
  if (c.n > 0 &&
      kernels::convertDType(kernels::KernelContext{}, c) != Status::Ok)
    fail("parameter ", e.name, ": unsupported storage dtype");
  r.dev.copyAsync(r.at(e.weight), weight.data(), uint64_t(weight.size()),
                  CopyKind::HostToDevice, Stream::Compute);
  r.dev.synchronize();
}

/// This rank's parameters and masters (ZeRO-3: its shards, the padding
/// left out), for the params fingerprint.
std::vector<ByteRange> paramRanges(const Program &p, StepRunner &r) {
  std::vector<ByteRange> out;
  int rank = r.dpRank();
  for (const ParamEntry &e : p.params)
    out.push_back({r.at(e.weight),
                   uint64_t(shardSpan(e, rank).count * elemBytes(e.dtype)),
                   true});
  for (const ParamEntry &e : p.params)
    if (!e.frozen)
      out.push_back(
          {r.at(e.master), uint64_t(shardSpan(e, rank).count) * 4, true});
  return out;
}

StDType stDTypeOf(DType d) {
  return d == DType::BF16  ? StDType::BF16
         : d == DType::F64 ? StDType::F64
                           : StDType::F32;
}

/// The parameters (all, or the trainable ones) as weights files name them.
static std::vector<WeightSpec> weightSpecs(const Program &p,
                                           bool trainableOnly) {
  std::vector<WeightSpec> specs;
  for (const ParamEntry &e : p.params)
    if (!trainableOnly || !e.frozen)
      specs.push_back({e.name, stDTypeOf(e.dtype), wholeShape(e)});
  return specs;
}

/// --init-weights: the FP32 values of the file become the masters, and the
/// compute copies are those values in their storage dtype (rounded once,
/// RNE for bf16), as AdamW refreshes them after every step.
/// ZeRO-3: each rank takes its slice of every whole tensor of the file.
/// Pipeline stages: the file holds the whole model (`whole`), and this
/// stage takes its own parameters (`p`) by name.
void loadInitWeights(const Program &whole, const Program &p, StepRunner &r,
                     const std::string &path) {
  std::vector<std::vector<float>> values =
      readWeightsF32(path, weightSpecs(whole, /*trainableOnly=*/false));
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < whole.params.size(); ++i)
    index[whole.params[i].name] = i;
  for (const ParamEntry &e : p.params) {
    auto it = index.find(e.name);
    if (it == index.end())
      fail("--init-weights: parameter '", e.name, "' is not in the model");
    // Tensor parallelism: this rank's part of the whole tensor first.
    const std::vector<float> &v = values[it->second];
    writeParameter(
        r, e,
        sliceOf(e.tpDim >= 0 ? partOfWhole(e, v, r.tpRank(), r.tpSize()) : v,
                shardSpan(e, r.dpRank())));
  }
}

/// The whole model of a pipelined binary as one program would describe it:
/// the stages' parameters in stage order (a tied weight once, where it
/// first appears) with their AdamW settings, and stage 0's model, shapes
/// and optimizer schedule. What the run configuration records and
/// --init-weights reads, the same as the one-stage binary's.
Program wholeModelOf(const std::vector<Program> &stages) {
  Program w = stages.at(0);
  w.params.clear();
  w.optimizer.adamw.clear();
  std::map<std::string, int64_t> at;
  for (const Program &s : stages) {
    std::vector<int64_t> local(s.params.size(), -1);
    for (size_t i = 0; i < s.params.size(); ++i) {
      auto [it, fresh] = at.emplace(s.params[i].name, int64_t(w.params.size()));
      local[i] = fresh ? it->second : -1;
      if (fresh)
        w.params.push_back(s.params[i]);
    }
    for (AdamWSettings a : s.optimizer.adamw) {
      if (a.param < 0 || size_t(a.param) >= local.size() || local[a.param] < 0)
        continue;
      a.param = local[size_t(a.param)];
      w.optimizer.adamw.push_back(a);
    }
  }
  return w;
}

static std::string numberText(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

/// --dump-grads: the main grads hold sums over the step's tokens; the file
/// gets them divided by the token count (the gradient of the step's mean
/// loss, before clipping), the clip coefficient AdamW applies on top in the
/// metadata.
/// ZeRO-3: the ranks' shards are gathered (host backend: the communicator
/// works on host memory) and rank 0 writes the whole grads; every rank
/// calls it.
void dumpGrads(const Program &p, StepRunner &r, const std::string &path,
               int32_t tokenCount, float clipCoef) {
  std::vector<WeightSpec> specs = weightSpecs(p, /*trainableOnly=*/true);
  std::vector<std::vector<float>> values;
  bool sharded = p.dataParallelMode == DataParallelMode::Zero3 &&
                 r.dataParallel && r.dataParallel->size() > 1;
  r.dev.synchronize();
  for (const ParamEntry &e : p.params) {
    if (e.frozen)
      continue;
    ShardSpan span = shardSpan(e, r.dpRank());
    std::vector<float> g(size_t(span.bufferNumel));
    if (e.mainGradBf16) {
      // A bf16 main grad is written widened to f32 (exactly), as the file's
      // every tensor is.
      std::vector<kernels::bf16> b(g.size());
      r.dev.copyToHostSync(b.data(), r.at(e.grad), b.size() * 2);
      for (size_t k = 0; k < b.size(); ++k)
        g[k] = float(b[k]);
    } else {
      r.dev.copyToHostSync(g.data(), r.at(e.grad), g.size() * sizeof(float));
    }
    if (sharded) {
      std::vector<float> all(g.size() * size_t(r.dataParallel->size()));
      r.dataParallel->allGather(g.data(), all.data(), g.size(), DType::F32,
                                nullptr);
      all.resize(size_t(e.numel));
      g = std::move(all);
    }
    // Tensor parallelism: the ranks' parts joined into the whole grad.
    if (e.tpDim >= 0 && r.tpSize() > 1) {
      std::vector<float> parts(g.size() * size_t(r.tpSize()));
      r.tensorParallel->allGather(g.data(), parts.data(), g.size(), DType::F32,
                                  nullptr);
      g = wholeOfParts(e, parts, r.tpSize());
    }
    for (float &x : g)
      x /= float(tokenCount);
    values.push_back(std::move(g));
  }
  if (r.dpRank() != 0 || r.tpRank() != 0)
    return;
  writeTensorsF32(
      path, specs, values,
      {{"actplace.grads", "token mean over the step, before clipping"},
       {"actplace.step", std::to_string(r.stepIndex + 1)},
       {"actplace.token_count", std::to_string(tokenCount)},
       {"actplace.grad_norm", numberText(r.gradNorm)},
       {"actplace.clip_coef", numberText(clipCoef)}});
}

} // namespace ap::rt
