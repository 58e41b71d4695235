//===- abi.cpp - The C ABI over the step runner -----------------*- C++ -*-===//
//
// Each ap_* call checks its arguments against the program (runtime/abi.h
// lists the invariants) and forwards to the StepRunner, the Device or the
// OffloadEngine. Kernel launches go through one table built from
// AP_KERNEL_LIST: the id selects the entry and its argument struct, whose
// size must match what the caller passed; the struct is copied by value into
// the launch, so the caller's storage may end with the call.
//
//===----------------------------------------------------------------------===//
#include "runtime/abi.h"
#include "runtime/abi_program.h"

#include "kernels/kernels.h"
#include "runtime/error.h"
#include "runtime/generated.h"
#include "runtime/trainer.h"

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

using namespace ap;
using namespace ap::rt;

namespace {

StepRunner &runner(ap_step *step) {
  if (!step)
    fail("abi: a call with a null step handle");
  return *reinterpret_cast<StepRunner *>(step);
}

Stream streamOf(const char *call, int32_t s) {
  switch (s) {
  case AP_STREAM_COMPUTE:
    return Stream::Compute;
  case AP_STREAM_D2H:
    return Stream::D2H;
  case AP_STREAM_H2D:
    return Stream::H2D;
  case AP_STREAM_COMM:
    return Stream::Comm;
  case AP_STREAM_SIDE:
    return Stream::Side;
  }
  fail("abi: ", call, ": stream ", s, " is not an AP_STREAM_* value");
}

kernels::DType dtypeOf(const char *call, int32_t d) {
  if (d < AP_DTYPE_BF16 || d > AP_DTYPE_I32)
    fail("abi: ", call, ": dtype ", d, " is not an AP_DTYPE_* value");
  return static_cast<kernels::DType>(d);
}

EventId eventOf(StepRunner &r, const char *call, uint32_t e) {
  if (e >= r.ev.size())
    fail("abi: ", call, ": event ", e, " of a program with ", r.ev.size(),
         " events");
  return r.ev[e];
}

OffloadEngine::ScopeId scopeOf(StepRunner &r, const char *call, uint32_t s) {
  if (s >= r.scope.size())
    fail("abi: ", call, ": scope ", s, " of a program with ", r.scope.size(),
         " offload scopes");
  return r.scope[s];
}

/// A pipeline call's peer (true: the next stage), checked against the
/// stage and the stream (comm only).
bool peerIsNext(StepRunner &r, const char *call, int32_t peer, int32_t stream) {
  Stream s = streamOf(call, stream);
  if (s != Stream::Comm)
    fail("abi: ", call, ": stream ", streamName(s),
         " (pipeline transfers run on the comm stream, AP_STREAM_COMM)");
  if (peer != AP_PEER_PREV && peer != AP_PEER_NEXT)
    fail("abi: ", call, ": peer ", peer,
         " (expected AP_PEER_PREV 0 or AP_PEER_NEXT 1)");
  bool next = peer == AP_PEER_NEXT;
  if (next ? r.stage() + 1 >= r.stages() : r.stage() == 0)
    fail("abi: ", call, ": stage ", r.stage(), " of ", r.stages(), " has no ",
         next ? "next" : "previous", " stage");
  return next;
}

const char *labelOf(const char *call, const char *label) {
  if (!label)
    fail("abi: ", call, ": a null label");
  return label;
}

//===--- The kernel table -------------------------------------------------===//

using Launcher = void (*)(StepRunner &, Stream, const char *, const void *);

/// The tensor-parallel ranks' all-gather, for kernels that exchange data
/// between their launches (the vocab-parallel cross-entropy's statistics).
void vocabAllGather(void *self, const kernels::KernelContext &ctx,
                    const float *send, float *recv, int64_t n) {
  static_cast<Communicator *>(self)->allGather(
      send, recv, size_t(n), kernels::DType::F32,
      ctx.backend == kernels::Backend::Cuda ? ctx.stream : nullptr);
}

/// Completes a launch's args with what only the runtime knows. A
/// vocab-parallel embedding or LM head (the step sets vocabParallel): this
/// tensor-parallel rank's block of the vocabulary and the group's
/// all-gather. Other args are complete as the step wrote them.
template <typename Args>
void completeArgs(StepRunner &, const char *, Args &) {}
template <typename Args>
void completeVocab(StepRunner &r, const char *label, Args &a) {
  if (!a.vocabParallel)
    return;
  Communicator *tp = r.tensorParallel;
  if (!tp)
    fail("abi: ap_launch '", label,
         "': a vocab-parallel launch in a step without a tensor-parallel "
         "group (the program's tensor_parallel_size is ",
         r.program().tensorParallelSize, ")");
  a.group.ranks = tp->size();
  a.group.offset = int64_t(tp->rank()) * a.vocab;
  a.group.allGather = &vocabAllGather;
  a.group.self = tp;
}
template <>
void completeArgs(StepRunner &r, const char *label,
                  kernels::EmbeddingForwardArgs &a) {
  completeVocab(r, label, a);
}
template <>
void completeArgs(StepRunner &r, const char *label,
                  kernels::EmbeddingBackwardArgs &a) {
  completeVocab(r, label, a);
}
template <>
void completeArgs(StepRunner &r, const char *label,
                  kernels::LmHeadCrossEntropyArgs &a) {
  completeVocab(r, label, a);
}

template <typename Args, kernels::Status (*Entry)(
                             const kernels::KernelContext &, const Args &)>
void launchCopy(StepRunner &r, Stream stream, const char *label,
                const void *args) {
  Args a;
  std::memcpy(static_cast<void *>(&a), args, sizeof(Args));
  completeArgs(r, label, a);
  r.launchOn(stream, label,
             [a](const kernels::KernelContext &c) { return Entry(c, a); });
}

struct KernelInfo {
  const char *id;
  uint64_t argsSize;
  Launcher launch;
};

#define AP_KERNEL_INFO(ID, entry, Args)                                        \
  {"AP_KERNEL_" #ID, sizeof(kernels::Args),                                    \
   &launchCopy<kernels::Args, &kernels::entry>},
const KernelInfo kKernels[] = {AP_KERNEL_LIST(AP_KERNEL_INFO)};
#undef AP_KERNEL_INFO
static_assert(sizeof(kKernels) / sizeof(kKernels[0]) == AP_KERNEL_COUNT,
              "one table row per AP_KERNEL_LIST entry");

//===--- The program ------------------------------------------------------===//

/// Program::step for an ABI program: the runner hands itself to the C step.
void runAbiStep(StepRunner &r) {
  r.program().abiStep(reinterpret_cast<ap_step *>(&r));
}

template <typename T>
void checkArray(const char *what, const T *data, uint32_t count) {
  if (count && !data)
    fail("abi: program: ", what, " has ", count, " entries and no data");
}

} // namespace

Program ap::rt::programOfAbi(const ap_program &p) {
  if (p.abi_version != AP_ABI_VERSION)
    fail("abi: the program was generated for runtime ABI version ",
         p.abi_version, "; this runtime implements version ", AP_ABI_VERSION,
         ": rebuild it with the actplace-compile of this release");
  if (p.struct_size != sizeof(ap_program))
    fail("abi: program struct of ", p.struct_size, " bytes; ABI version ",
         AP_ABI_VERSION, " has ", sizeof(ap_program));
  if (!p.step)
    fail("abi: program has no step function");
  checkArray("model_config", p.model_config, p.num_model_config);
  checkArray("slots", p.slots, p.num_slots);
  checkArray("scopes", p.scopes, p.num_scopes);
  checkArray("params", p.params, p.num_params);
  checkArray("adamw", p.adamw, p.num_adamw);
  checkArray("generated", p.generated, p.num_generated);
  Program out;
  for (uint32_t i = 0; i < p.num_generated; ++i) {
    const ap_generated_kernel &g = p.generated[i];
    if (!g.name || !g.params || (!g.host && !g.triton))
      fail("abi: program: generated kernel ", i,
           " has a null name, parameter list or host function");
    size_t n = std::strlen(g.params);
    if (n == 0 || n > AP_GENERATED_MAX_PARAMS ||
        std::strspn(g.params, "plifw") != n)
      fail("abi: program: generated kernel '", g.name, "' has parameters '",
           g.params, "' (expected 1 to ", AP_GENERATED_MAX_PARAMS,
           " of 'p', 'l', 'i', 'f', 'w')");
    if (g.triton &&
        (!g.ptx || g.num_warps < 1 || g.num_warps > 32 || g.shared_bytes < 0 ||
         g.hidden_params < 0 || g.hidden_params > 2 ||
         n + size_t(g.hidden_params) > AP_GENERATED_MAX_PARAMS))
      fail("abi: program: Triton kernel '", g.name,
           "' needs its PTX, 1 to 32 warps, non-negative shared memory and "
           "0 to 2 hidden parameters (has ",
           g.num_warps, " warps, ", g.shared_bytes, " bytes, ", g.hidden_params,
           " hidden)");
    if (g.num_entries == 0 || !g.entries)
      fail("abi: program: generated kernel '", g.name, "' has no GPU entry");
    for (uint32_t e = 0; e < g.num_entries; ++e) {
      const ap_generated_entry &en = g.entries[e];
      if (!en.name)
        fail("abi: program: generated kernel '", g.name, "' entry ", e,
             " has no name");
      if (!g.triton && (en.threads_per_item < 1 || en.threads_per_item > 1024 ||
                        en.block_size < 1 || en.block_size > 1024))
        fail("abi: program: generated kernel '", g.name, "' entry '", en.name,
             "' has ", en.threads_per_item, " threads per item and blocks of ",
             en.block_size, " (1 to 1024 each)");
      if (!g.triton && (en.vector < 1 || en.vector > 65536))
        fail("abi: program: generated kernel '", g.name, "' entry '", en.name,
             "' has items of ", en.vector, " elements (1 to 65536)");
      for (int32_t w : en.work_params)
        if (w != -1 && (w < 0 || size_t(w) >= n || g.params[w] != 'l'))
          fail("abi: program: generated kernel '", g.name, "' entry '", en.name,
               "' counts its threads by parameter ", w,
               ", which is not an int64 parameter of '", g.params, "'");
    }
    out.generated.push_back(g);
  }
  out.generatedPtx = p.generated_ptx;
  out.model = p.model ? p.model : "";
  for (uint32_t i = 0; i < p.num_model_config; ++i) {
    const ap_config_entry &e = p.model_config[i];
    if (!e.key || !e.value)
      fail("abi: program: model_config entry ", i, " has a null key or value");
    out.modelConfig.push_back({e.key, e.value});
  }
  out.microBatches = p.micro_batches;
  out.batch = p.batch;
  out.seq = p.seq;
  out.vocab = p.vocab;
  out.persistentBytes = p.persistent_bytes;
  out.activationBytes = p.activation_bytes;
  out.workspaceBytes = p.workspace_bytes;
  out.sideWorkspaceBytes = p.side_workspace_bytes;
  out.arenaBytes = p.arena_bytes;
  out.pinnedBytes = p.pinned_bytes;
  out.scratchBytes = p.scratch_bytes;
  out.scratchOffset = p.scratch_offset;
  // The driver scratch is a buffer of the plan: inside the arena, with
  // room for the runtime's scalars.
  if (p.scratch_bytes < AP_SCRATCH_SCALAR_BYTES ||
      p.scratch_offset > p.arena_bytes ||
      p.scratch_bytes > p.arena_bytes - p.scratch_offset)
    fail("abi: program: the driver scratch [", p.scratch_offset, ", +",
         p.scratch_bytes, ") is not a buffer of at least ",
         AP_SCRATCH_SCALAR_BYTES, " bytes inside the arena of ", p.arena_bytes,
         " bytes");
  out.sideKernels = p.side_kernels != 0;
  out.sideAfterHostStart = p.side_after_host_start != 0;
  if (p.side_kernels != 0 || p.side_sm_percent != 0) {
    if (p.side_sm_percent < 1 || p.side_sm_percent > 100)
      fail("abi: program: side_sm_percent is ", p.side_sm_percent,
           " (expected 1 to 100, the side-stream GEMMs' share of the SMs, ",
           "set whenever side_kernels is)");
    out.sideSmPercent = p.side_sm_percent;
  }
  for (uint32_t i = 0; i < p.num_slots; ++i)
    out.slots.push_back({p.slots[i].offset, p.slots[i].bytes});
  for (uint32_t i = 0; i < p.num_scopes; ++i) {
    if (!p.scopes[i])
      fail("abi: program: offload scope ", i, " is null");
    out.scopes.push_back(p.scopes[i]);
  }
  if (p.data_parallel_size < 1)
    fail("abi: program: data_parallel_size is ", p.data_parallel_size,
         " (expected 1 or more ranks)");
  if (p.data_parallel_mode != AP_DP_REPLICATE &&
      p.data_parallel_mode != AP_DP_ZERO3)
    fail("abi: program: data_parallel_mode is ", p.data_parallel_mode,
         ", not an AP_DP_* value");
  if (p.pipeline_size < 1)
    fail("abi: program: pipeline_size is ", p.pipeline_size,
         " (expected 1 or more stages)");
  if (p.pipeline_stage < 0 || p.pipeline_stage >= p.pipeline_size)
    fail("abi: program: pipeline_stage is ", p.pipeline_stage,
         " (expected 0 to ", p.pipeline_size - 1, " for pipeline_size ",
         p.pipeline_size, ")");
  if (p.tensor_parallel_size < 0 || p.tensor_parallel_size > 1024)
    fail("abi: program: tensor_parallel_size is ", p.tensor_parallel_size,
         " (expected 0 or 1: none, or up to 1024 ranks)");
  const int32_t tpSize = std::max<int32_t>(p.tensor_parallel_size, 1);
  for (uint32_t i = 0; i < p.num_params; ++i) {
    const ap_param &a = p.params[i];
    if (!a.name)
      fail("abi: program: parameter ", i, " has no name");
    if (a.rank < 1 || a.rank > 4)
      fail("abi: program: parameter '", a.name, "' has rank ", a.rank,
           " (expected 1 to 4)");
    if (a.init < AP_INIT_ZEROS || a.init > AP_INIT_LOG_UNIFORM)
      fail("abi: program: parameter '", a.name, "' has initialiser ", a.init,
           ", not an AP_INIT_* value");
    ParamEntry e;
    e.name = a.name;
    e.dtype = dtypeOf("program", a.dtype);
    e.rank = a.rank;
    for (int d = 0; d < 4; ++d)
      e.shape[d] = a.shape[d];
    e.numel = a.numel;
    e.init = static_cast<InitKind>(a.init);
    e.initA = a.init_a;
    e.initB = a.init_b;
    e.frozen = a.frozen != 0;
    e.weight = a.weight;
    e.master = a.master;
    e.grad = a.grad;
    e.adamM = a.adam_m;
    e.adamV = a.adam_v;
    // Replicate: every buffer holds the whole parameter. ZeRO-3: each holds
    // this rank's flat shard, the parameter padded to a multiple of the
    // ranks and split evenly (what the compiler planned the buffers for).
    int64_t expected =
        p.data_parallel_mode == AP_DP_ZERO3
            ? (a.numel + p.data_parallel_size - 1) / p.data_parallel_size
            : 0;
    if (a.shard_numel != expected)
      fail("abi: program: parameter '", a.name, "' has shard_numel ",
           a.shard_numel, "; expected ", expected,
           p.data_parallel_mode == AP_DP_ZERO3
               ? " (ceil of its numel " + std::to_string(a.numel) +
                     " over data_parallel_size " +
                     std::to_string(p.data_parallel_size) + ", zero3)"
               : std::string(" (replicate: the buffers hold the whole "
                             "parameter)"));
    e.shardNumel = a.shard_numel;
    // A bf16 main grad is only ever touched by the runtime under ZeRO-3
    // (backward kernels accumulate into f32 window buffers that the
    // reduce-scatter adds into it); replicate's kernels write main grads as
    // f32, and a frozen parameter has none.
    if (a.main_grad_bf16 != 0 && a.main_grad_bf16 != 1)
      fail("abi: program: parameter '", a.name, "' has main_grad_bf16 ",
           a.main_grad_bf16, " (expected 0: f32, or 1: bf16)");
    if (a.main_grad_bf16 && a.frozen)
      fail("abi: program: parameter '", a.name,
           "' is frozen and has main_grad_bf16 1 (a frozen parameter has no "
           "main grad)");
    if (a.main_grad_bf16 && p.data_parallel_mode != AP_DP_ZERO3)
      fail("abi: program: parameter '", a.name,
           "' has main_grad_bf16 1 under data_parallel_mode ",
           p.data_parallel_mode,
           " (bf16 main grads need AP_DP_ZERO3, where only the runtime's "
           "reduce-scatter, norm and AdamW touch them; replicate's backward "
           "kernels accumulate into f32 main grads)");
    e.mainGradBf16 = a.main_grad_bf16 != 0;
    if (a.pipeline_tied != 0 && a.pipeline_tied != 1)
      fail("abi: program: parameter '", a.name, "' has pipeline_tied ",
           a.pipeline_tied, " (expected 0 or 1)");
    if (a.pipeline_tied && a.frozen)
      fail("abi: program: parameter '", a.name,
           "' is frozen and has pipeline_tied 1 (a frozen parameter has no "
           "main grad to sum over the stages)");
    e.pipelineTied = a.pipeline_tied != 0;
    // A second main grad of the whole parameter in f32: only a replicated,
    // trainable parameter has the f32 main grad it is added into.
    if (a.tied_grad_offset != AP_NO_OFFSET) {
      if (a.frozen || a.shard_numel != 0 || a.main_grad_bf16)
        fail("abi: program: parameter '", a.name, "' has tied_grad_offset ",
             a.tied_grad_offset,
             " but is frozen, sharded or has a bf16 main grad (the tied "
             "gradient is added into a whole f32 main grad)");
      if (a.numel < 0 || a.tied_grad_offset > p.arena_bytes ||
          uint64_t(a.numel) * 4 > p.arena_bytes - a.tied_grad_offset)
        fail("abi: program: parameter '", a.name, "' has tied_grad_offset ",
             a.tied_grad_offset, ": ", a.numel,
             " f32 elements there do not fit the arena of ", p.arena_bytes,
             " bytes");
    }
    e.tiedGrad = a.tied_grad_offset;
    // Tensor parallelism: a split parameter's part is whole blocks of its
    // segments; a tp_grad_sum one is replicated and trainable.
    if (a.tp_grad_sum != 0 && a.tp_grad_sum != 1)
      fail("abi: program: parameter '", a.name, "' has tp_grad_sum ",
           a.tp_grad_sum, " (expected 0 or 1)");
    if (a.tp_num_segments < 0 || a.tp_num_segments > 4)
      fail("abi: program: parameter '", a.name, "' has tp_num_segments ",
           a.tp_num_segments, " (expected 0: replicated, or 1 to 4)");
    if (a.tp_num_segments > 0) {
      if (tpSize < 2)
        fail("abi: program: parameter '", a.name, "' is split along dim ",
             a.tp_dim, " but tensor_parallel_size is ", p.tensor_parallel_size);
      if (a.tp_dim < 0 || a.tp_dim >= a.rank)
        fail("abi: program: parameter '", a.name, "' has tp_dim ", a.tp_dim,
             " (expected 0 to its rank ", a.rank, " - 1)");
      if (a.tp_grad_sum)
        fail("abi: program: parameter '", a.name,
             "' is split by tensor parallelism and tp_grad_sum (a replicated "
             "parameter's flag)");
      int64_t whole = 0;
      for (int32_t s = 0; s < a.tp_num_segments; ++s) {
        if (a.tp_segments[s] <= 0 || a.tp_segments[s] % tpSize != 0)
          fail("abi: program: parameter '", a.name, "' has segment ", s, " of ",
               a.tp_segments[s],
               " elements (expected a positive "
               "multiple of tensor_parallel_size ",
               tpSize, ")");
        whole += a.tp_segments[s];
        e.tpSegments.push_back(a.tp_segments[s]);
      }
      if (whole / tpSize != a.shape[a.tp_dim])
        fail("abi: program: parameter '", a.name, "' holds ", a.shape[a.tp_dim],
             " along dim ", a.tp_dim, "; its segments (", whole,
             " in all) over ", tpSize, " ranks give ", whole / tpSize);
      e.tpDim = a.tp_dim;
    } else if (a.tp_grad_sum && (a.frozen || tpSize < 2)) {
      fail("abi: program: parameter '", a.name,
           "' has tp_grad_sum 1 but is frozen or the program has no tensor "
           "parallelism");
    }
    e.tpGradSum = a.tp_grad_sum != 0;
    out.params.push_back(e);
  }
  out.state.lossSum = p.state_loss_sum;
  out.state.tokenCount = p.state_token_count;
  out.state.gradNorm = p.state_grad_norm;
  out.state.lr = p.state_lr;
  out.state.loss = p.state_loss;
  out.numEvents = p.num_events;
  out.maxLr = p.max_lr;
  out.optimizer.known = p.optimizer_known != 0;
  out.optimizer.minLr = p.min_lr;
  out.optimizer.warmupSteps = p.warmup_steps;
  out.optimizer.totalSteps = p.total_steps;
  out.optimizer.maxGradNorm = p.max_grad_norm;
  for (uint32_t i = 0; i < p.num_adamw; ++i) {
    const ap_adamw &w = p.adamw[i];
    if (w.param < 0 || uint64_t(w.param) >= p.num_params)
      fail("abi: program: adamw entry ", i, " names parameter ", w.param,
           " of ", p.num_params);
    out.optimizer.adamw.push_back(
        {w.param, w.beta1, w.beta2, w.eps, w.weight_decay});
  }
  out.dataParallelSize = p.data_parallel_size;
  out.dataParallelMode = p.data_parallel_mode == AP_DP_ZERO3
                             ? DataParallelMode::Zero3
                             : DataParallelMode::Replicate;
  out.pipelineSize = p.pipeline_size;
  out.pipelineStage = p.pipeline_stage;
  out.tensorParallelSize = tpSize;
  if (p.document_separator < -1 || p.document_separator >= p.vocab)
    fail("abi: program: document_separator is ", p.document_separator,
         ", expected -1 (none) or a token id below the vocabulary's ", p.vocab);
  if (p.ignore_index > INT32_MAX || p.ignore_index < INT32_MIN)
    fail("abi: program: ignore_index ", p.ignore_index,
         " is not a 32-bit label");
  out.documentSeparator = p.document_separator;
  out.ignoreIndex = p.ignore_index;
  out.abiStep = p.step;
  out.step = runAbiStep;
  return out;
}

std::vector<Program>
ap::rt::programsOfAbiStages(const ap_program *const *stages,
                            int32_t numStages) {
  if (numStages < 1 || !stages)
    fail("abi: ap_train_main_stages with ", numStages, " stage(s)",
         stages ? "" : " and a null array", " (expected 1 or more programs)");
  std::vector<Program> out;
  for (int32_t s = 0; s < numStages; ++s) {
    const ap_program *p = stages[s];
    if (!p)
      fail("abi: ap_train_main_stages: stage ", s, " has a null program");
    Program prog = programOfAbi(*p);
    if (p->pipeline_size != numStages || p->pipeline_stage != s)
      fail("abi: ap_train_main_stages: program ", s, " of ", numStages,
           " has pipeline_stage ", p->pipeline_stage, " and pipeline_size ",
           p->pipeline_size, " (expected stage ", s, " of ", numStages,
           ": the stages in order)");
    if (s > 0) {
      const ap_program *q = stages[0];
      if (p->data_parallel_size != q->data_parallel_size ||
          p->data_parallel_mode != q->data_parallel_mode ||
          p->micro_batches != q->micro_batches || p->batch != q->batch ||
          p->seq != q->seq || p->vocab != q->vocab)
        fail("abi: ap_train_main_stages: stage ", s, " has data_parallel_size ",
             p->data_parallel_size, ", mode ", p->data_parallel_mode,
             ", micro_batches ", p->micro_batches, ", batch ", p->batch,
             ", seq ", p->seq, ", vocab ", p->vocab, "; stage 0 has ",
             q->data_parallel_size, ", ", q->data_parallel_mode, ", ",
             q->micro_batches, ", ", q->batch, ", ", q->seq, ", ", q->vocab,
             " (the stages of one pipeline train one batch)");
      if (std::max(p->tensor_parallel_size, 1) !=
          std::max(q->tensor_parallel_size, 1))
        fail("abi: ap_train_main_stages: stage ", s,
             " has tensor_parallel_size ", p->tensor_parallel_size,
             ", stage 0 has ", q->tensor_parallel_size,
             " (every stage splits its layers over the same ranks)");
    }
    out.push_back(std::move(prog));
  }
  return out;
}

static_assert(uint64_t(AP_NO_OFFSET) == kNoOffset,
              "AP_NO_OFFSET is the runtime's absent offset");
static_assert(int(InitKind::LogUniform) == AP_INIT_LOG_UNIFORM &&
                  int(InitKind::Normal) == AP_INIT_NORMAL,
              "AP_INIT_* are InitKind's values");
static_assert(int(kernels::DType::I32) == AP_DTYPE_I32 &&
                  int(kernels::DType::F32) == AP_DTYPE_F32,
              "AP_DTYPE_* are DType's values");

extern "C" {

int ap_train_main(int argc, char **argv, const ap_program *program) {
  std::vector<Program> p;
  try {
    if (!program)
      fail("abi: ap_train_main with a null program");
    p.push_back(programOfAbi(*program));
    if (program->pipeline_size != 1)
      fail("abi: ap_train_main with a program of pipeline_size ",
           program->pipeline_size,
           " (a pipelined binary starts through ap_train_main_stages with "
           "every stage's program)");
  } catch (const std::exception &e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return trainMainStages(argc, argv, p);
}

int ap_train_main_stages(int argc, char **argv, const ap_program *const *stages,
                         int32_t numStages) {
  std::vector<Program> programs;
  try {
    programs = programsOfAbiStages(stages, numStages);
  } catch (const std::exception &e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return trainMainStages(argc, argv, programs);
}

void *ap_at(ap_step *step, uint64_t offset) { return runner(step).at(offset); }

void *ap_scratch(ap_step *step, uint64_t offset) {
  StepRunner &r = runner(step);
  if (offset >= r.program().scratchBytes)
    fail("ap_scratch: offset ", offset, " is outside the driver scratch of ",
         r.program().scratchBytes, " bytes");
  return r.scratch(offset);
}

void ap_launch(ap_step *step, int32_t stream, const char *label, int32_t kernel,
               const void *args, uint64_t argsSize) {
  StepRunner &r = runner(step);
  labelOf("ap_launch", label);
  Stream s = streamOf("ap_launch", stream);
  if (s != Stream::Compute && s != Stream::Side)
    fail("abi: ap_launch '", label,
         "': kernels run on the compute or the "
         "side stream, not ",
         streamName(s));
  if (kernel < 0 || kernel >= AP_KERNEL_COUNT)
    fail("abi: ap_launch '", label, "': kernel id ", kernel,
         " (this runtime has ", int(AP_KERNEL_COUNT), ")");
  const KernelInfo &k = kKernels[kernel];
  if (!args || argsSize != k.argsSize)
    fail("abi: ap_launch '", label, "': ", k.id, " takes ", k.argsSize,
         " bytes of arguments, got ", args ? argsSize : 0);
  k.launch(r, s, label, args);
}

void ap_launch_generated(ap_step *step, int32_t stream, const char *label,
                         uint32_t kernel, const void *args, uint64_t argsSize) {
  StepRunner &r = runner(step);
  labelOf("ap_launch_generated", label);
  Stream s = streamOf("ap_launch_generated", stream);
  if (s != Stream::Compute && s != Stream::Side)
    fail("abi: ap_launch_generated '", label,
         "': kernels run on the compute or the side stream, not ",
         streamName(s));
  const Program &prog = r.program();
  if (kernel >= prog.generated.size())
    fail("abi: ap_launch_generated '", label, "': generated kernel ", kernel,
         " (the program has ", prog.generated.size(), ")");
  const ap_generated_kernel &k = prog.generated[kernel];
  size_t n = std::strlen(k.params);
  size_t slots = n + (k.triton ? 3 : 0);
  if (!args || argsSize != 8 * slots)
    fail("abi: ap_launch_generated '", label, "': ", k.name, " takes ",
         8 * slots, " bytes of arguments (", n, " parameters",
         k.triton ? " and the grid" : "", "), got ", args ? argsSize : 0);
  ++r.generatedLaunches;
  GeneratedLaunch launch;
  launch.kernel = &k;
  launch.ptx = prog.generatedPtx;
  std::memcpy(launch.slots, args, argsSize);
  r.launchOn(s, label, [launch](const kernels::KernelContext &c) mutable {
    return launchGenerated(c, launch);
  });
}

void ap_record(ap_step *step, uint32_t event, int32_t stream) {
  StepRunner &r = runner(step);
  r.record(eventOf(r, "ap_record", event), streamOf("ap_record", stream));
}

void ap_comm_group_begin(ap_step *step, int32_t stream) {
  runner(step).commGroupBegin(streamOf("ap_comm_group_begin", stream));
}

void ap_comm_group_end(ap_step *step, int32_t stream) {
  runner(step).commGroupEnd(streamOf("ap_comm_group_end", stream));
}

void ap_wait(ap_step *step, int32_t stream, uint32_t event) {
  StepRunner &r = runner(step);
  r.dev.wait(streamOf("ap_wait", stream), eventOf(r, "ap_wait", event));
}

void ap_wait_copy(ap_step *step, const char *label, uint32_t event) {
  StepRunner &r = runner(step);
  r.waitCopy(labelOf("ap_wait_copy", label), eventOf(r, "ap_wait_copy", event));
}

void ap_offload(ap_step *step, uint32_t scope, uint32_t slot, uint64_t offset,
                uint64_t bytes, uint32_t producer, uint32_t done) {
  StepRunner &r = runner(step);
  r.engine.offload(
      scopeOf(r, "ap_offload", scope), slot, r.dev.at(offset, bytes), bytes,
      eventOf(r, "ap_offload", producer), eventOf(r, "ap_offload", done));
}

void ap_reload(ap_step *step, uint32_t scope, uint32_t slot, uint64_t offset,
               uint64_t bytes, uint32_t d2hDone, uint32_t done) {
  StepRunner &r = runner(step);
  r.engine.reload(scopeOf(r, "ap_reload", scope), slot, r.dev.at(offset, bytes),
                  bytes, eventOf(r, "ap_reload", d2hDone),
                  eventOf(r, "ap_reload", done));
}

void ap_begin_microbatch(ap_step *step, int64_t microbatch) {
  StepRunner &r = runner(step);
  if (microbatch < 0 || microbatch >= r.program().microBatches)
    fail("abi: ap_begin_microbatch ", microbatch, " of a program with ",
         r.program().microBatches, " microbatches");
  r.microbatch = microbatch;
}

void ap_load_input(ap_step *step, const char *name, uint64_t offset,
                   uint64_t bytes) {
  runner(step).loadInput(labelOf("ap_load_input", name), offset, bytes);
}

void ap_load_input_shard(ap_step *step, const char *name, uint64_t offset,
                         uint64_t bytes) {
  runner(step).loadInput(labelOf("ap_load_input_shard", name), offset, bytes,
                         /*tpShard=*/true);
}

void ap_yield(ap_step *step, uint64_t lossOffset, uint64_t countOffset) {
  runner(step).yield(lossOffset, countOffset);
}

void ap_end_loop(ap_step *step) { runner(step).endLoop(); }

void ap_all_reduce(ap_step *step, uint64_t offset, uint64_t bytes,
                   int32_t dtype, int32_t stream, int32_t flags) {
  if (flags & ~int32_t(AP_REDUCE_LAST_MICROBATCH | AP_REDUCE_PIPELINE |
                       AP_REDUCE_TENSOR))
    fail("ap_all_reduce: flags ", flags, " (expected AP_REDUCE_* bits)");
  runner(step).allReduce(offset, bytes, dtypeOf("ap_all_reduce", dtype),
                         streamOf("ap_all_reduce", stream),
                         (flags & AP_REDUCE_LAST_MICROBATCH) != 0,
                         (flags & AP_REDUCE_PIPELINE) != 0,
                         (flags & AP_REDUCE_TENSOR) != 0);
}

void ap_all_gather(ap_step *step, uint64_t shard, uint64_t full,
                   uint64_t shardBytes, int32_t dtype, int32_t stream,
                   int32_t flags) {
  if (flags & ~int32_t(AP_REDUCE_TENSOR))
    fail("ap_all_gather: flags ", flags, " (expected 0 or AP_REDUCE_TENSOR)");
  runner(step).allGather(
      shard, full, shardBytes, dtypeOf("ap_all_gather", dtype),
      streamOf("ap_all_gather", stream), (flags & AP_REDUCE_TENSOR) != 0);
}

void ap_reduce_scatter(ap_step *step, uint64_t full, uint64_t shard,
                       uint64_t shardBytes, int32_t dtype, int32_t stream,
                       int32_t flags) {
  if (flags &
      ~int32_t(AP_REDUCE_ACCUMULATE | AP_REDUCE_SHARD_BF16 | AP_REDUCE_TENSOR))
    fail("ap_reduce_scatter: flags ", flags,
         " (expected 0, AP_REDUCE_ACCUMULATE or AP_REDUCE_ACCUMULATE | "
         "AP_REDUCE_SHARD_BF16, or AP_REDUCE_TENSOR)");
  const bool shardBf16 = (flags & AP_REDUCE_SHARD_BF16) != 0;
  if (shardBf16 && !(flags & AP_REDUCE_ACCUMULATE))
    fail("ap_reduce_scatter: flags ", flags,
         ": AP_REDUCE_SHARD_BF16 without AP_REDUCE_ACCUMULATE (a bf16 shard "
         "is a main grad the block sum is added into)");
  if (shardBf16 && dtype != AP_DTYPE_F32)
    fail("ap_reduce_scatter: AP_REDUCE_SHARD_BF16 with dtype ", dtype,
         " (the full buffer must be AP_DTYPE_F32, ", int(AP_DTYPE_F32),
         "; the shard is bf16)");
  runner(step).reduceScatter(full, shard, shardBytes,
                             dtypeOf("ap_reduce_scatter", dtype),
                             streamOf("ap_reduce_scatter", stream),
                             (flags & AP_REDUCE_ACCUMULATE) != 0, shardBf16,
                             (flags & AP_REDUCE_TENSOR) != 0);
}

void ap_zero(ap_step *step, uint64_t offset, uint64_t bytes, int32_t stream) {
  runner(step).zero(offset, bytes, streamOf("ap_zero", stream));
}

void ap_pipeline_send(ap_step *step, uint64_t offset, uint64_t bytes,
                      int32_t peer, int32_t stream) {
  StepRunner &r = runner(step);
  r.pipelineSend(offset, bytes,
                 peerIsNext(r, "ap_pipeline_send", peer, stream));
}

void ap_pipeline_recv(ap_step *step, uint64_t offset, uint64_t bytes,
                      int32_t peer, int32_t stream) {
  StepRunner &r = runner(step);
  r.pipelineRecv(offset, bytes,
                 peerIsNext(r, "ap_pipeline_recv", peer, stream));
}

void ap_slice(ap_step *step, const char *label, uint64_t x, uint64_t y,
              int64_t outer, int64_t dimX, int64_t first, int64_t len,
              int64_t inner, int64_t elemBytes) {
  runner(step).slice(labelOf("ap_slice", label), x, y, outer, dimX, first, len,
                     inner, elemBytes);
}

void ap_concat(ap_step *step, const char *label, const uint64_t *xs,
               const int64_t *dims, uint32_t n, uint64_t y, int64_t outer,
               int64_t inner, int64_t elemBytes) {
  labelOf("ap_concat", label);
  if (n == 0 || !xs || !dims)
    fail("abi: ap_concat '", label, "': ", n, " inputs",
         n ? " and a null array" : "");
  runner(step).concat(label, std::vector<uint64_t>(xs, xs + n),
                      std::vector<int64_t>(dims, dims + n), y, outer, inner,
                      elemBytes);
}

void ap_expand(ap_step *step, const char *label, uint64_t x, uint64_t y,
               int64_t outer, int64_t n, int64_t inner, int32_t dtype) {
  runner(step).expand(labelOf("ap_expand", label), x, y, outer, n, inner,
                      dtypeOf("ap_expand", dtype));
}

void ap_expand_grad(ap_step *step, const char *label, uint64_t dy, uint64_t dx,
                    int64_t outer, int64_t n, int64_t inner, int32_t dtype) {
  runner(step).expandGrad(labelOf("ap_expand_grad", label), dy, dx, outer, n,
                          inner, dtypeOf("ap_expand_grad", dtype));
}

void ap_gdn_gates(ap_step *step, const char *label, uint64_t a, uint64_t b,
                  uint64_t aLog, uint64_t dtBias, uint64_t g, uint64_t beta,
                  int64_t tokens, int32_t heads, int32_t dtype) {
  runner(step).gdnGates(labelOf("ap_gdn_gates", label), a, b, aLog, dtBias, g,
                        beta, tokens, heads, dtypeOf("ap_gdn_gates", dtype));
}

void ap_gdn_gates_grad(ap_step *step, const char *label, uint64_t a,
                       uint64_t aLog, uint64_t dtBias, uint64_t beta,
                       uint64_t dg, uint64_t dbeta, uint64_t da, uint64_t db,
                       uint64_t dALog, uint64_t dDtBias, int64_t tokens,
                       int32_t heads, int32_t dtype) {
  runner(step).gdnGatesGrad(labelOf("ap_gdn_gates_grad", label), a, aLog,
                            dtBias, beta, dg, dbeta, da, db, dALog, dDtBias,
                            tokens, heads, dtypeOf("ap_gdn_gates_grad", dtype));
}

void ap_convert(ap_step *step, const char *label, const void *src, int32_t from,
                void *dst, int32_t to, int64_t n) {
  runner(step).convert(labelOf("ap_convert", label), src,
                       dtypeOf("ap_convert", from), dst,
                       dtypeOf("ap_convert", to), n);
}

void ap_finalize_grads(ap_step *step, double maxNorm) {
  runner(step).finalizeGrads(maxNorm);
}

void ap_finalize_grads_generated(ap_step *step, double maxNorm,
                                 uint32_t squaresBf16, uint32_t squaresF32,
                                 uint32_t finish) {
  StepRunner &r = runner(step);
  size_t kernels = r.program().generated.size();
  auto index = [&](uint32_t k, const char *what, bool optional) -> int64_t {
    if (optional && k == AP_GENERATED_NONE)
      return -1;
    if (k >= kernels)
      fail("abi: ap_finalize_grads_generated: ", what, " kernel ", k,
           " (the program has ", kernels, " generated kernels)");
    return int64_t(k);
  };
  StepRunner::GeneratedNorm g;
  g.squaresBf16 = index(squaresBf16, "bf16 sums of squares", true);
  g.squaresF32 = index(squaresF32, "f32 sums of squares", true);
  g.finish = index(finish, "finish", false);
  r.finalizeGrads(maxNorm, g);
}

void ap_lr_schedule(ap_step *step, double maxLr, double minLr, int64_t warmup,
                    int64_t total) {
  runner(step).lrSchedule(maxLr, minLr, warmup, total);
}

void ap_adamw_step(ap_step *step, uint32_t param, double beta1, double beta2,
                   double eps, double weightDecay) {
  StepRunner &r = runner(step);
  if (param >= r.program().params.size())
    fail("abi: ap_adamw_step: parameter ", param, " of ",
         r.program().params.size());
  r.adamw(param, beta1, beta2, eps, weightDecay);
}

void ap_adamw_step_generated(ap_step *step, uint32_t param, uint32_t kernel,
                             double beta1, double beta2, double eps,
                             double weightDecay) {
  StepRunner &r = runner(step);
  if (param >= r.program().params.size())
    fail("abi: ap_adamw_step_generated: parameter ", param, " of ",
         r.program().params.size());
  if (kernel >= r.program().generated.size())
    fail("abi: ap_adamw_step_generated: generated kernel ", kernel,
         " (the program has ", r.program().generated.size(), ")");
  r.adamw(param, beta1, beta2, eps, weightDecay, int64_t(kernel));
}

void ap_loss_mean(ap_step *step) { runner(step).lossMean(); }

} // extern "C"
