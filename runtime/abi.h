/*===- abi.h - The compiler-runtime contract (C ABI) ----------------------===*
 *
 * Everything a generated training step may use from the runtime: a
 * versioned, plain-data description of the program (buffer plan, pinned
 * slots, offload scopes, parameters, optimizer settings, the step function)
 * and the calls the step makes (kernel launches by id, stream events,
 * offload and reload, the microbatch loop, the data-movement and step-level
 * ops). C linkage, plain structs, fixed-width integers: what the C++ emitter
 * prints today, an LLVM-dialect lowering can produce as well. The kernels'
 * argument structs come from the kernel library (kernels/kernels.h); the
 * runtime copies them by value, checking each size against the kernel id.
 *
 * Invariants, checked on every call (an error names the call and the value):
 *   - ap_train_main refuses a program whose abi_version is not
 *     AP_ABI_VERSION or whose struct_size differs from sizeof(ap_program);
 *   - arena offsets and byte counts lie inside the program's arena, event,
 *     scope, slot and parameter indices below their counts, streams and
 *     dtypes are values of their enums;
 *   - a kernel id is one of AP_KERNEL_LIST and args_size is the size of
 *     that kernel's argument struct.
 * Handles are opaque: generated code never reaches into runtime members.
 * The version changes whenever a struct layout, an enum value or a call's
 * meaning changes; adding a kernel id at the end of AP_KERNEL_LIST or a call
 * keeps old programs valid and does not change it.
 *
 *===----------------------------------------------------------------------===*/
#ifndef ACTPLACE_RUNTIME_ABI_H
#define ACTPLACE_RUNTIME_ABI_H

#include <stdint.h>

/* The contract's version: generated code stores it in ap_program. */
#define AP_ABI_VERSION 15

/* ap_program.data_parallel_mode: every rank holds all parameters and
   optimizer state (main grads all-reduced), or each holds a flat 1/N shard
   (ZeRO-3). */
enum { AP_DP_REPLICATE = 0, AP_DP_ZERO3 = 1 };

/* Collective flags. AP_REDUCE_LAST_MICROBATCH (ap_all_reduce): issued
   inside the microbatch loop, it runs in the last microbatch only (a main
   grad is final once the last microbatch's backward wrote it).
   AP_REDUCE_ACCUMULATE (ap_reduce_scatter): the shard receives its block of
   the sum added to what it holds (a sharded main grad accumulating
   microbatches), instead of being overwritten. AP_REDUCE_SHARD_BF16
   (ap_reduce_scatter, with AP_REDUCE_ACCUMULATE and an f32 `full`): the
   shard is bf16 (a bf16 main grad): it becomes bf16(float(shard) + the
   block's f32 sum), one rounding per call. AP_REDUCE_PIPELINE
   (ap_all_reduce): the sum runs over the pipeline group (every stage of
   this data-parallel rank, added in stage order) instead of the
   data-parallel group: the loss sum and token count after the loop, which
   only the last stage holds (the others hold 0, so the sum is exact); a
   pipeline of one stage: no-op. AP_REDUCE_TENSOR (ap_all_reduce): the sum
   runs over the tensor-parallel group (the ranks holding the other parts
   of this rank's layers, added in rank order): a row-parallel projection's
   partial output, the input gradient of a column-parallel one (inside the
   microbatch loop, every microbatch, f32 or bf16), or a tp_grad_sum
   parameter's main grad (after the loop); a group of one: no-op. */
enum {
  AP_REDUCE_LAST_MICROBATCH = 1,
  AP_REDUCE_ACCUMULATE = 2,
  AP_REDUCE_SHARD_BF16 = 4,
  AP_REDUCE_PIPELINE = 8,
  AP_REDUCE_TENSOR = 16
};

/* ap_pipeline_send / ap_pipeline_recv peers: the neighbouring stage of
   this pipeline (same data-parallel rank) before or after this one. */
enum { AP_PEER_PREV = 0, AP_PEER_NEXT = 1 };

#ifdef __cplusplus
extern "C" {
#endif

/* The step's handle (the runtime's step runner). */
typedef struct ap_step ap_step;

/* Streams of the device (the values of the exec dialect's streams). */
enum {
  AP_STREAM_COMPUTE = 0,
  AP_STREAM_D2H = 1,
  AP_STREAM_H2D = 2,
  AP_STREAM_COMM = 3,
  AP_STREAM_SIDE = 4
};

/* Element types (the kernel library's DType values). */
enum {
  AP_DTYPE_BF16 = 0,
  AP_DTYPE_F32 = 1,
  AP_DTYPE_F64 = 2,
  AP_DTYPE_I32 = 3
};

/* Parameter initialisers (the runtime's Philox-based InitKind). */
enum {
  AP_INIT_ZEROS = 0,
  AP_INIT_ONES = 1,
  AP_INIT_NORMAL = 2,
  AP_INIT_UNIFORM = 3,
  AP_INIT_LOG_UNIFORM = 4
};

/* An arena offset that is absent (frozen parameters have no master, grad,
   moments; a program without a state scalar). */
#define AP_NO_OFFSET UINT64_MAX

/* The driver scratch: an exec buffer of the plan (role `scratch`, declared by
   convert-train-to-exec, placed by exec-plan-memory like any other buffer),
   at arena offset ap_program.scratch_offset, scratch_bytes long. Its first
   AP_SCRATCH_SCALAR_BYTES hold the scalars of the runtime's step-level
   calls at these offsets; after them the step stages the GDN gates in the
   kernels' accumulation type (beta in, then dbeta out, each half of the
   rest). ap_scratch addresses it. */
#define AP_SCRATCH_GRAD_NORM 0    /* float: global grad norm */
#define AP_SCRATCH_CLIP_COEF 4    /* float: gradient clip coefficient */
#define AP_SCRATCH_LOSS_DISCARD 8 /* Acc: a loss sum nobody reads */
#define AP_SCRATCH_RANK_SUMS 32   /* 32 bytes: the runtime's sums over ranks */
#define AP_SCRATCH_STATE_NORMS 64 /* 3 floats: norms of the optimizer state */
#define AP_SCRATCH_SCALAR_BYTES 256

/* The kernel entries a step launches: X(ID, entry, args struct) with the
   entry and struct of kernels/kernels.h. Ids are positions in this list;
   new kernels go at the end. */
#define AP_KERNEL_LIST(X)                                                      \
  X(EMBEDDING_FORWARD, embeddingForward, EmbeddingForwardArgs)                 \
  X(EMBEDDING_BACKWARD, embeddingBackward, EmbeddingBackwardArgs)              \
  X(RMS_NORM_FORWARD, rmsNormForward, RmsNormForwardArgs)                      \
  X(RMS_NORM_BACKWARD, rmsNormBackward, RmsNormBackwardArgs)                   \
  X(LINEAR_FORWARD, linearForward, LinearForwardArgs)                          \
  X(LINEAR_BACKWARD, linearBackward, LinearBackwardArgs)                       \
  X(ROPE_FORWARD, ropeForward, RopeArgs)                                       \
  X(ROPE_BACKWARD, ropeBackward, RopeArgs)                                     \
  X(SWIGLU_FORWARD, swiGluForward, SwiGluForwardArgs)                          \
  X(SWIGLU_BACKWARD, swiGluBackward, SwiGluBackwardArgs)                       \
  X(SIGMOID_GATE_FORWARD, sigmoidGateForward, SigmoidGateForwardArgs)          \
  X(SIGMOID_GATE_BACKWARD, sigmoidGateBackward, SigmoidGateBackwardArgs)       \
  X(RESIDUAL_ADD_FORWARD, residualAddForward, ResidualAddArgs)                 \
  X(LM_HEAD_CROSS_ENTROPY_FORWARD, lmHeadCrossEntropyForward,                  \
    LmHeadCrossEntropyArgs)                                                    \
  X(LM_HEAD_CROSS_ENTROPY_BACKWARD, lmHeadCrossEntropyBackward,                \
    LmHeadCrossEntropyArgs)                                                    \
  X(GDN_CONV_FORWARD, gdnConvForward, GdnConvArgs)                             \
  X(GDN_CONV_BACKWARD, gdnConvBackward, GdnConvArgs)                           \
  X(GDN_L2_NORM_FORWARD, gdnL2NormForward, GdnL2NormArgs)                      \
  X(GDN_L2_NORM_BACKWARD, gdnL2NormBackward, GdnL2NormArgs)                    \
  X(GDN_CHUNK_FORWARD, gdnChunkForward, GdnChunkArgs)                          \
  X(GDN_CHUNK_BACKWARD, gdnChunkBackward, GdnChunkArgs)                        \
  X(GDN_GATED_NORM_FORWARD, gdnGatedNormForward, GdnGatedNormArgs)             \
  X(GDN_GATED_NORM_BACKWARD, gdnGatedNormBackward, GdnGatedNormArgs)           \
  X(ATTENTION_FORWARD, attentionForward, AttentionForwardArgs)                 \
  X(ATTENTION_BACKWARD, attentionBackward, AttentionBackwardArgs)              \
  X(DOCUMENT_STARTS, documentStarts, DocumentStartsArgs)

#define AP_KERNEL_ENUM_ENTRY(id, entry, args) AP_KERNEL_##id,
enum { AP_KERNEL_LIST(AP_KERNEL_ENUM_ENTRY) AP_KERNEL_COUNT };
#undef AP_KERNEL_ENUM_ENTRY

/* One parameter, in declaration order (HF names). */
typedef struct ap_param {
  const char *name;
  int32_t dtype;    /* AP_DTYPE_*: the weight's storage type */
  int32_t rank;     /* 1..4 */
  int64_t shape[4]; /* unused dims are 1 */
  int64_t numel;
  int32_t init; /* AP_INIT_* */
  int32_t frozen;
  double init_a, init_b;
  /* arena offsets; AP_NO_OFFSET for the absent roles of a frozen one */
  uint64_t weight, master, grad, adam_m, adam_v;
  /* 0: the five buffers hold the whole parameter (data_parallel_mode
     AP_DP_REPLICATE). Otherwise (AP_DP_ZERO3) each holds this rank's shard:
     shard_numel = ceil(numel / data_parallel_size) elements, elements
     [rank x shard_numel, (rank + 1) x shard_numel) of the flattened
     parameter, zeros past numel (the last ranks' padding). */
  int64_t shard_numel;
  /* 0: the main grad (`grad`) is f32. 1: it is bf16 (only under
     AP_DP_ZERO3, where backward kernels accumulate into f32 per-window
     buffers and only the runtime reads and writes the main-grad shard:
     reduce-scatter with AP_REDUCE_SHARD_BF16, the norm, AdamW). */
  int32_t main_grad_bf16;
  /* Nonzero: several stages of the pipeline hold this parameter (the tied
     embedding / LM-head weight, on the first and the last stage). With
     pipeline_size > 1, ap_finalize_grads first sums its main grad over the
     stages holding it, in stage order (first stage's + last stage's, one
     f32 rounding), and the grad norm counts it once (on the first stage
     holding it). Both stages then hold the same grad and apply the same
     AdamW update. */
  int32_t pipeline_tied;
  /* AP_NO_OFFSET, or the arena offset of a second f32 main-grad buffer of
     the same shape (numel elements) holding the LM-head part of a tied
     weight's gradient on a stage that also holds the embedding part (the
     one-stage case). ap_finalize_grads, before the norm, sets
     grad[i] = grad[i] + tied[i] (one f32 rounding) and zeroes the tied
     buffer. Either form gives embedding part + LM-head part, so the
     one-stage and the pipelined step have the same bits. Only with
     shard_numel 0 and main_grad_bf16 0. */
  uint64_t tied_grad_offset;
  /* Tensor parallelism (ap_program.tensor_parallel_size N > 1).
     tp_num_segments 0: every tensor-parallel rank holds the whole parameter
     (replicated; tp_dim is ignored); with tp_grad_sum 1 its main grad on
     each rank is a partial sum that the step sums over the tensor-parallel
     group before the norm. tp_num_segments 1..4: `shape` is this rank's
     part; along tp_dim the whole tensor is the concatenation of
     tp_num_segments segments of tp_segments[i] elements each, and
     tensor-parallel rank r holds block r of N of every segment, in segment
     order (initialised as that part of the whole tensor's values, so any N
     starts from the same model). */
  int32_t tp_dim;
  int32_t tp_num_segments;
  int64_t tp_segments[4];
  int32_t tp_grad_sum;
} ap_param;

/* A pinned host slot: offset from the slot region's start, bytes. */
typedef struct ap_slot {
  uint64_t offset, bytes;
} ap_slot;

/* One parameter's AdamW hyperparameters (train.adamw's arguments). */
typedef struct ap_adamw {
  int64_t param; /* index into ap_program.params */
  double beta1, beta2, eps, weight_decay;
} ap_adamw;

/* One model setting (HF field name, exact text). */
typedef struct ap_config_entry {
  const char *key, *value;
} ap_config_entry;

/* The most parameters a generated kernel may take. */
#define AP_GENERATED_MAX_PARAMS 32

/* A generated kernel's GPU entry (PTX function name) and its launch: work
   is the product of the int64 parameters at work_params[0] and
   work_params[1] (-1: factor 1), the last present factor first rounded up
   to whole vectors of `vector` elements (1 to 65536: an item is that many
   consecutive elements; 1: one), so work = p0 * ceil(p1 / vector); each
   item takes threads_per_item threads (1 to 1024), launched as
   ceil(work * threads_per_item / block_size) blocks of block_size threads
   (1 to 1024; the kernel's .maxntid). Unused (0) in a Triton kernel's
   entry. */
typedef struct ap_generated_entry {
  const char *name;
  int32_t work_params[2];
  int32_t threads_per_item, block_size;
  int32_t vector;
} ap_generated_entry;

/* A kernel the compiler generated (kernelgen: a group of element-wise and
   row-wise ops) or took from Triton (--triton-kernel). Its arguments are one
   8-byte slot per parameter, in order ('p' a pointer, 'l' an int64_t, 'i'
   an int32_t, 'f' a float in the slot's first 4 bytes, or 'w' the
   launching stream's kernel workspace: the slot holds the bytes the kernel
   needs, and the runtime checks that the workspace has them and passes its
   address in their place). The host backend
   calls `host` with an array pointing at the slots; the cuda backend
   launches `entries` in order, on the same array, from the program's
   generated_ptx.
   A Triton kernel (`triton` nonzero) has no host function (the host backend
   refuses it) and one entry; its PTX is `ptx`; its launch args hold three
   more int64 slots after the parameters, the grid (x, y, z); the block is
   32 x num_warps threads with shared_bytes of dynamic shared memory, and
   hidden_params null pointers follow the parameters (Triton's scratch
   pointers). */
typedef struct ap_generated_kernel {
  const char *name;
  const char *params; /* one of 'p', 'l', 'i', 'f', 'w' per parameter */
  void (*host)(void **params);
  const ap_generated_entry *entries;
  uint32_t num_entries;
  int32_t triton;
  int32_t num_warps, shared_bytes, hidden_params;
  const char *ptx;
} ap_generated_kernel;

/* The whole program. Zero-initialise, then set every field. */
typedef struct ap_program {
  uint32_t abi_version; /* AP_ABI_VERSION */
  uint32_t struct_size; /* sizeof(ap_program) */
  const char *model;
  const ap_config_entry *model_config;
  uint32_t num_model_config;
  int64_t micro_batches, batch, seq, vocab;
  /* The plan (exec-plan-memory): arena = [persistent | activations |
     workspace | side workspace], the driver scratch one of its persistent
     buffers (scratch_offset, scratch_bytes); then the pinned slot region. */
  uint64_t persistent_bytes, activation_bytes, workspace_bytes,
      side_workspace_bytes, arena_bytes, pinned_bytes, scratch_bytes,
      scratch_offset;
  /* Nonzero: the step launches kernels on the side stream. */
  int32_t side_kernels;
  /* Nonzero: side runs were issued after their host kernel
     (exec-defer-side-issue); side waits also wait for its first launch. */
  int32_t side_after_host_start;
  /* Side-stream GEMMs' share of the device's SMs, percent (1 to 100):
     what the compiler's cost model measured side capacity under. Required
     when side_kernels is nonzero; 0 otherwise. */
  int32_t side_sm_percent;
  const ap_slot *slots;
  uint32_t num_slots;
  const char *const *scopes; /* offload scopes, "L<layer>.<leaf>" */
  uint32_t num_scopes;
  const ap_param *params;
  uint32_t num_params;
  uint32_t num_events;
  /* Arena offsets of the step's state scalars (AP_NO_OFFSET: absent). */
  uint64_t state_loss_sum, state_token_count, state_grad_norm, state_lr,
      state_loss;
  /* Peak of the compiled lr schedule (the default of --lr); 0: none. */
  double max_lr;
  /* The optimizer as compiled; optimizer_known 0: not described. */
  int32_t optimizer_known;
  int64_t warmup_steps, total_steps;
  double min_lr, max_grad_norm;
  const ap_adamw *adamw;
  uint32_t num_adamw;
  /* Data parallelism as compiled: the ranks the plan is for (1: one rank)
     and how parameters and optimizer state are held (AP_DP_*). The binary
     refuses a launch of another world size. */
  int32_t data_parallel_size;
  int32_t data_parallel_mode;
  /* Pipeline parallelism as compiled: the number of stages (>= 1; 1: no
     pipeline) and this program's stage (0-based, < pipeline_size). A
     pipelined binary holds one program per stage and starts through
     ap_train_main_stages; world rank = dp + data_parallel_size x stage
     (ParallelGroups with tensor parallel 1). */
  int32_t pipeline_size;
  int32_t pipeline_stage;
  /* Tensor parallelism as compiled: ranks sharing each layer (0 or 1:
     none). World rank = tp + N x (dp + data_parallel_size x stage). */
  int32_t tensor_parallel_size;
  /* Packed sequences: the token id that ends each document (-1: one
     sequence per row), and the label value the LM head ignores. The data
     loader gives every separator's next-token label (the next document's
     first token) that value. */
  int64_t document_separator;
  int64_t ignore_index;
  /* Generated kernels (ap_launch_generated) and the PTX of their GPU entries
     (NUL-terminated; null when the compiler had no CUDA toolkit, and then a
     generated launch on the cuda backend fails naming the kernel). */
  const ap_generated_kernel *generated;
  uint32_t num_generated;
  const char *generated_ptx;
  void (*step)(ap_step *);
} ap_program;

/* The training binary: parses the train flags and runs `program`; returns
   the process exit code (0 done, 1 error, 2 bad flag, 3 a step that is not
   finite; docs/tools.md). */
int ap_train_main(int argc, char **argv, const ap_program *program);
/* The pipelined training binary: `stages` holds num_stages programs,
   stages[s]->pipeline_stage == s and every pipeline_size == num_stages (all
   checked, as is each program as by ap_train_main). The world size must be
   data_parallel_size x num_stages; each rank runs the program of its stage
   (world rank / data_parallel_size). Returns as ap_train_main. */
int ap_train_main_stages(int argc, char **argv, const ap_program *const *stages,
                         int32_t num_stages);

/*--- Addresses ------------------------------------------------------------*/
/* The arena address of a plan offset. */
void *ap_at(ap_step *step, uint64_t offset);
/* An address inside the driver scratch (AP_SCRATCH_*). */
void *ap_scratch(ap_step *step, uint64_t offset);

/*--- Kernels and streams --------------------------------------------------*/
/* Launches kernel `kernel` (AP_KERNEL_*) on `stream` (compute or side) with
   a copy of `args` (its kernels/kernels.h struct, `args_size` bytes);
   `label` names it in errors and --op-times. */
void ap_launch(ap_step *step, int32_t stream, const char *label, int32_t kernel,
               const void *args, uint64_t args_size);
/* Launches generated kernel `kernel` (an index into ap_program.generated)
   on `stream` (compute or side) with a copy of `args`: 8 bytes per
   parameter (args_size must be 8 x the parameter count, plus 24 for a
   Triton kernel's grid). */
void ap_launch_generated(ap_step *step, int32_t stream, const char *label,
                         uint32_t kernel, const void *args, uint64_t args_size);
void ap_record(ap_step *step, uint32_t event, int32_t stream);
void ap_wait(ap_step *step, int32_t stream, uint32_t event);
/* The compute stream waits for a reload's H2D event; --op-times records
   the stall under `label` ("<scope>/wait"). */
void ap_wait_copy(ap_step *step, const char *label, uint32_t event);
/* D2H of `bytes` at arena `offset` into pinned slot `slot` after
   `producer`; records `done`. */
void ap_offload(ap_step *step, uint32_t scope, uint32_t slot, uint64_t offset,
                uint64_t bytes, uint32_t producer, uint32_t done);
/* H2D of slot `slot` into arena `offset` after the D2H's `d2h_done`;
   records `done` and frees the slot once the copy is done. */
void ap_reload(ap_step *step, uint32_t scope, uint32_t slot, uint64_t offset,
               uint64_t bytes, uint32_t d2h_done, uint32_t done);

/*--- The microbatch loop --------------------------------------------------*/
void ap_begin_microbatch(ap_step *step, int64_t microbatch);
void ap_load_input(ap_step *step, const char *name, uint64_t offset,
                   uint64_t bytes);
/* Sequence parallelism: as ap_load_input, but only block r of
   tensor_parallel_size of the microbatch's flattened ids (r this rank in
   the tensor-parallel group). */
void ap_load_input_shard(ap_step *step, const char *name, uint64_t offset,
                         uint64_t bytes);
/* train.yield: the microbatch's loss sum and token count. */
void ap_yield(ap_step *step, uint64_t loss_offset, uint64_t count_offset);
void ap_end_loop(ap_step *step);
/* Sums `bytes` at arena `offset` over the data-parallel ranks (with
   AP_REDUCE_PIPELINE: over the stages of this pipeline) in place, on
   `stream` (comm: ordered by the step's events; compute: after the compute
   stream's earlier work). `flags`: AP_REDUCE_*. A group of one: no-op. */
void ap_all_reduce(ap_step *step, uint64_t offset, uint64_t bytes,
                   int32_t dtype, int32_t stream, int32_t flags);
/* A group of data-parallel all-gathers on `stream` (a ZeRO-3 window's
   parameters, issued back to back): between begin and end only
   ap_all_gather without AP_REDUCE_TENSOR, ap_wait and ap_record may be
   called on `stream`; the communicator may launch the gathers as one (NCCL
   group calls), and ap_record on `stream` takes effect at the end. Gathers
   copy bytes, so the group changes no bit. Groups do not nest; the end
   names the begin's stream. */
void ap_comm_group_begin(ap_step *step, int32_t stream);
void ap_comm_group_end(ap_step *step, int32_t stream);
/* Gathers `shard_bytes` at arena `shard` from every data-parallel rank (with
   AP_REDUCE_TENSOR in `flags`: tensor-parallel rank) into arena `full` (rank
   r's at byte r x shard_bytes) on `stream` (comm or compute). A world of one
   copies. */
void ap_all_gather(ap_step *step, uint64_t shard, uint64_t full,
                   uint64_t shard_bytes, int32_t dtype, int32_t stream,
                   int32_t flags);

/* Sums `full` (ranks x shard_bytes at arena `full`) over the data-parallel
   ranks and writes this rank's block of the sum to arena `shard`, on
   `stream` (AP_REDUCE_TENSOR: over the tensor-parallel ranks, a
   sequence-parallel region's exit); with AP_REDUCE_ACCUMULATE in `flags`
   adds it to `shard`
   instead. `full` is scratch afterwards (its contents are unspecified). A
   world of one copies (or adds). */
void ap_reduce_scatter(ap_step *step, uint64_t full, uint64_t shard,
                       uint64_t shard_bytes, int32_t dtype, int32_t stream,
                       int32_t flags);
/* Sets `bytes` at arena `offset` to zero on `stream` (compute or comm):
   the per-microbatch gradient buffers of ZeRO-3 sharding, which backward
   kernels accumulate into. */
void ap_zero(ap_step *step, uint64_t offset, uint64_t bytes, int32_t stream);

/*--- Pipeline point-to-point ----------------------------------------------*/
/* Sends `bytes` at arena `offset` to the neighbouring stage `peer`
   (AP_PEER_PREV / AP_PEER_NEXT; an error if this stage has none) on
   `stream`, which must be AP_STREAM_COMM. Messages between two neighbours
   in one direction are matched in call order (each side issues them in the
   same order; no tags). A send never blocks the comm stream: once the comm
   stream reaches it, the bytes are copied out of the arena (the buffer may
   be reused by work ordered after the send on the comm stream) and
   delivered in the background; ap_end_loop waits until every send of the
   step completed and reports a failed one naming the peer. */
void ap_pipeline_send(ap_step *step, uint64_t offset, uint64_t bytes,
                      int32_t peer, int32_t stream);
/* Receives the next message from `peer` into `bytes` at arena `offset` on
   `stream` (AP_STREAM_COMM): the comm stream blocks until it arrived, so
   work that waits on an event recorded on the comm stream after it sees the
   data. The sender's byte count must equal `bytes`. */
void ap_pipeline_recv(ap_step *step, uint64_t offset, uint64_t bytes,
                      int32_t peer, int32_t stream);

/*--- Data movement (compute stream) ---------------------------------------*/
/* y[outer, len, inner] = x[outer, first:first+len, inner]; x has dim_x. */
void ap_slice(ap_step *step, const char *label, uint64_t x, uint64_t y,
              int64_t outer, int64_t dim_x, int64_t first, int64_t len,
              int64_t inner, int64_t elem_bytes);
/* y[outer, sum dims, inner] = the n inputs joined along the middle dim. */
void ap_concat(ap_step *step, const char *label, const uint64_t *xs,
               const int64_t *dims, uint32_t n, uint64_t y, int64_t outer,
               int64_t inner, int64_t elem_bytes);
void ap_expand(ap_step *step, const char *label, uint64_t x, uint64_t y,
               int64_t outer, int64_t n, int64_t inner, int32_t dtype);
void ap_expand_grad(ap_step *step, const char *label, uint64_t dy, uint64_t dx,
                    int64_t outer, int64_t n, int64_t inner, int32_t dtype);
void ap_gdn_gates(ap_step *step, const char *label, uint64_t a, uint64_t b,
                  uint64_t a_log, uint64_t dt_bias, uint64_t g, uint64_t beta,
                  int64_t tokens, int32_t heads, int32_t dtype);
void ap_gdn_gates_grad(ap_step *step, const char *label, uint64_t a,
                       uint64_t a_log, uint64_t dt_bias, uint64_t beta,
                       uint64_t dg, uint64_t dbeta, uint64_t da, uint64_t db,
                       uint64_t d_a_log, uint64_t d_dt_bias, int64_t tokens,
                       int32_t heads, int32_t dtype);
/* Copies n elements between dtypes; src and dst are ap_at / ap_scratch
   addresses. */
void ap_convert(ap_step *step, const char *label, const void *src, int32_t from,
                void *dst, int32_t to, int64_t n);

/*--- Step-level ops -------------------------------------------------------*/
/* Finishes the main grads: adds tied_grad_offset buffers in, sums
   pipeline_tied grads over the stages holding them, computes the global
   grad norm (one running sum of squares in parameter order; with stages,
   continued from stage to stage in stage order, each tied parameter
   counted on the first stage holding it, the total then sent to every
   stage) into AP_SCRATCH_GRAD_NORM and the clip coefficient for
   `max_norm` into AP_SCRATCH_CLIP_COEF. */
void ap_finalize_grads(ap_step *step, double max_norm);
/* ap_finalize_grads with the grad norm through generated kernels (indices
   into ap_program.generated; AP_GENERATED_NONE where the program has no
   main grad of that dtype): kernelgen's sums of squares of bf16 and of f32
   main grads (grad, partial, n) and its finish (partial, initial, norm,
   clipCoef, squares, parts, maxNormBits), the library kernel's blocking
   and order; the runtime passes the partials in the stream's workspace. */
#define AP_GENERATED_NONE 0xffffffffu
void ap_finalize_grads_generated(ap_step *step, double max_norm,
                                 uint32_t squares_bf16, uint32_t squares_f32,
                                 uint32_t finish);
void ap_lr_schedule(ap_step *step, double max_lr, double min_lr, int64_t warmup,
                    int64_t total);
void ap_adamw_step(ap_step *step, uint32_t param, double beta1, double beta2,
                   double eps, double weight_decay);
/* ap_adamw_step through generated kernel `kernel` (an index into
   ap_program.generated: kernelgen's AdamW over the parameter's flat f32
   buffers, parameters master, expAvg, expAvgSq, grad, clipCoef,
   computeCopy, n, then the six f32 scalars of kernels::adamWScalars); the
   runtime fills the arguments from the parameter's buffers, its shard
   under ZeRO-3, the step's learning rate and step index, as for the
   library kernel. */
void ap_adamw_step_generated(ap_step *step, uint32_t param, uint32_t kernel,
                             double beta1, double beta2, double eps,
                             double weight_decay);
void ap_loss_mean(ap_step *step);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ACTPLACE_RUNTIME_ABI_H */
