#!/usr/bin/env python3
"""A PyTorch peer of actplace's Qwen3.5-0.8B training step (issue 8): the
same model (tools/torchref, an independent PyTorch implementation of the
family) with fast cores plugged in, the same step (microbatches of
token-mean loss, FP32 main grads, clip, warmup + cosine lr, AdamW on FP32
masters, BF16 weights), timed the same way, and a loss-parity check against
the training binary from the same safetensors weights and token file; with
the memory options a practitioner would reach for (activation checkpointing,
saved tensors in host memory, torch.compile) under a memory cap, and a grid
over them for the fastest setting that fits a budget.

The peer is what a practitioner would build on a GPU (every default there):
flash-linear-attention's (FLA's) GDN kernel, its fused RMSNorm and fused
gated RMSNorm, its fused linear cross-entropy (the LM head never
materialises the logits of the whole microbatch: 248,320 a token, 1 GB of
fp32 per 1024 tokens, several copies at the peak), SDPA for attention, the
model otherwise torchref's, loaded by the same HF names. On the host (no
Triton) the defaults fall back to plain PyTorch: a chunked head and
torchref's norms.

  train    the step, WARMUP + STEPS times; one JSON line per step (the
           binary's keys where they mean the same: step, loss, grad_norm, lr,
           step_time_s, tokens_per_s) and a summary line: tokens/s, memory
           (max_reserved_bytes, device_peak_bytes) and the configuration
           (micro_batch_size, micro_batches, seq, activations, save_on_cpu,
           compiled, memory_cap_gib, gdn, attention, loss, loss_chunk_tokens,
           fused_norms, fused_norm_sites). A CUDA out-of-memory error in any
           step (or while building) ends the run with a summary line
           {"oom": true, ...} and exit code 0, not a traceback
  grid     `train` in one process per configuration (an OOM or a leaked
           allocation cannot touch the next) over budgets x seqs x
           micro-batch sizes x activation modes; one JSONL of every summary
           and, per (budget, seq), the fastest configuration that did not
           OOM and whose device_peak_bytes fits the budget
  prepare  writes weights.safetensors (a seeded random init, F32, HF names)
           and tokens.bin (uint32 ids: the bytes of this repository's text
           files) for a parity run
  compare  per-step loss and grad norm of two metrics files, the largest
           loss difference
  parity   prepare + the binary (--init-weights, --data tokens32:) + the
           peer on the same files + compare, in one command (GPU machine);
           also the binary from weights moved by one bf16 rounding error
           (relative 2^-9, random sign) against the binary: the noise floor.
           The peer runs with --loss / --fused-norms as given, else their
           defaults (FLA's on the GPU)
  selftest (CPU) the chunked PyTorch GDN core against torchref's per-token
           recurrence, values and gradients in float64

Cores (--gdn, --attention):
  fla          flash-linear-attention's chunk_gated_delta_rule from the
               untracked copy third_party_untracked/fla-src (never
               committed). FLA refuses its gated backward on Hopper with
               Triton 3.4..3.7.1 (its issue #640, "incorrect results" in
               chunk_bwd_dqkwg); as bench/notes/gdn.md says, the peer sets
               fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True, so its
               gradients are only as right as that Triton: `parity` runs the
               torch-chunk core too.
  torch-chunk  the chunked (C = 64) forward of docs/model-math.md 1.4 in plain
               PyTorch ops, backward by autograd: slower, independent.
  naive        torchref's per-token recurrence (CPU tests only).
  sdpa         torch.nn.functional.scaled_dot_product_attention, causal.
  naive        torchref's softmax attention.

LM head + loss (--loss; train, parity, grid), the sum of per-token
cross-entropies over labels != -100 that torchref's HybridLM.forward returns
(the step divides by the step's token count); the tied embedding is the
head weight where the config ties them (Qwen3.5-0.8B does):
  fla-fused    FLA's fused_linear_cross_entropy_loss (fla/modules/
               fused_linear_cross_entropy.py, Liger's algorithm; reduction
               "sum"): per chunk of tokens the bf16 logits, their logsumexp
               and loss in fp32, and already in the forward the gradients of
               the hidden states and of the head weight (the weight's
               accumulated in fp32 over the chunks, then kept in bf16 until
               the backward scales it; that accumulation is an fp32 matmul,
               TF32 only where torch allows it). Memory: one chunk's logits
               (bf16, plus an fp32 copy of their gradient), the fp32 weight
               gradient while the forward runs (1 GB at this vocabulary), the
               bf16 one (0.5 GB) and the hidden states' gradient until the
               backward. num_chunks max(8, ceil(tokens / --loss-chunk-tokens))
               (8 is FLA's default; FLA rounds its chunk up to a power of
               two, so it stays within about --loss-chunk-tokens). The
               default on a CUDA device with Triton and the FLA source.
  chunked      plain PyTorch: torchref's head + loss on --loss-chunk-tokens
               tokens (default 1024) at a time, each under non-reentrant
               torch.utils.checkpoint: the forward keeps no logits, the
               backward computes one chunk's logits again with its gradient
               (a second head matmul); memory linear in the chunk (the
               chunk's bf16 and fp32 logits, log-softmax and their
               gradients, some 10 to 16 bytes a logit). The head weight's
               gradient is summed over the chunks in its dtype (bf16). The
               default elsewhere (the host); the same loss and grad norm as
               plain (bench/qwen_torch_peer_test.sh).
  plain        torchref's: the whole microbatch's logits in bf16 and fp32,
               cross-entropy by F.cross_entropy: its fp32 log-softmax (1 GB
               per 1024 tokens) kept until the backward, bf16 and fp32
               logits beside it in the forward, gradients in the backward.

Norms (--fused-norms / --no-fused-norms; default on where FLA can run, as
for --loss): after torchref builds the model, its RMSNorms (input,
post-attention, attention q/k and final norms) become FusedRMSNorm (FLA's
fla.modules.layernorm.rms_norm; Qwen3.5's zero-centred (1 + w) weight is
passed as 1 + w in fp32, as torchref computes it) and its GatedDeltaNets
FusedGatedDeltaNet, whose gated output norm w * (o rstd) * silu(z) is
FLA's fla.modules.fused_norm_gate.rms_norm_gated (swish: the
FusedRMSNormGated of FLA's own GatedDeltaNet layer; torchref's
GatedDeltaNet.gated_norm is the method swapped). Swapped by class:
parameters, their names and the rest of the forward stay torchref's; both
kernels compute in fp32 and write the input's dtype, as torchref does.
GDN's q/k L2 norms stay torchref's PyTorch ops (FLA's in-kernel L2 norm
would need its own core call).

Memory options (train):
  --activations none       autograd keeps what each op saves (the default)
                layer      each decoder layer's forward under
                           torch.utils.checkpoint (non-reentrant): a layer
                           keeps only its input, and its whole forward (GDN
                           or attention core included) runs again in the
                           backward
                selective  checkpoints only what is cheap to recompute but
                           heavy to keep: every RMSNorm (input, post-attention,
                           q/k and final norms: fp32 copies of their input),
                           the GDN short conv + SiLU (Kc shifted copies of
                           the qkv projection) and the SwiGLU MLP (four
                           intermediate-size tensors per token; its gate and
                           up matmuls run again). With --fused-norms the
                           norms are FLA's and not checkpointed: FLA's norm
                           saves only its input (which a checkpoint would
                           keep too) and an fp32 rstd a row. The
                           GDN and attention cores, the mixers' projections,
                           the embedding and the LM head + loss keep their
                           saved tensors (plain: the fp32 logits; chunked:
                           only its input; fla-fused: the gradients it
                           computed in the forward); so do GDN's q/k L2
                           norms (inline in torchref's GatedDeltaNet.forward)
                           and its gated output norm
  --save-on-cpu            the tensors autograd saves (what the mode above
                           still saves) go to pinned host memory in the
                           forward and come back in the backward: the hooks
                           of torch.autograd.graph.save_on_cpu(pin_memory=
                           True), written out here so that the host copies
                           are made on the host (torch's own allocate on the
                           default device, which build_model sets to the GPU)
                           and asynchronously; parameters are not copied
  --memory-cap-gib X       torch.cuda.set_per_process_memory_fraction(
                           X GiB / device total) before the model is built:
                           the caching allocator refuses to grow past X GiB
                           (the CUDA context and modules are outside it)
  --compile                torch.compile on each decoder layer's forward,
                           after the checkpoint wrappers (so a checkpointed
                           layer's recompute is compiled too); if compiling
                           raises (at the first step, forward or backward),
                           it is logged, the layers go back to eager, the step
                           is run again and the summary says "compiled": false
  Memory measures per step and in the summary: max_allocated_bytes and
  max_reserved_bytes (PyTorch's allocator since the model was built) and
  device_peak_bytes, the process's device memory as the driver reports it
  (NVML through pynvml, else nvidia-smi --query-compute-apps; where the
  driver lists no process with this PID, as in a container with its own PID
  namespace, the devices' used memory less what was used before this process
  touched CUDA; device_memory_source says which), sampled after every step and
  every 50 ms by a thread while the steps run; its maximum so far.

Grid (grid):
  Budgets are GiB (the cap given to each run and the bound on its
  device_peak_bytes) or `device` (no cap; any run that does not OOM fits).
  Per seq, each micro-batch size MBS whose MBS x seq divides
  --global-batch-tokens runs with that quotient as its micro-batches (a seq
  longer than the step's tokens runs alone, 1 x 1); others are skipped.
  Runs that need no process are inferred (unless --no-infer): an OOM of the
  same setting at a seq and micro-batch size no larger under a cap no smaller
  is an OOM; a run under a larger cap whose allocator pool stayed within
  this cap ran as it would under this one. --reuse-best-above SEQ: for each
  seq above SEQ only the best setting (micro-batch size, activations,
  save-on-cpu) of the largest seq <= SEQ runs, per budget (its micro-batch
  size lowered until it divides). --resume keeps the finished and OOM rows
  of --out; --max-wall-s stops starting runs after that long, and the best
  rows are written from what ran. TRITON_CACHE_DIR defaults to
  triton-cache/ beside --out (Triton compiles reused between runs); each
  run's stderr goes to OUT.runs.log (OUT: --out less .jsonl).
  --loss, --loss-chunk-tokens and --fused-norms apply to every run; by
  default (as train's) FLA's fused linear cross-entropy and fused norms on
  a CUDA device with Triton and the FLA source, else chunked and
  torchref's norms. The grid decides once, without touching CUDA, passes
  them to every run explicitly, logs them and keeps them in each row, in
  the best rows and in --resume's key (rows of an earlier grid with
  another loss or norms run again).

GPU usage (nothing is compiled there; FLA's fused loss and norms by
default, --loss plain --no-fused-norms for torchref's head and norms):
  python3 bench/qwen_torch_peer.py train --metrics $OUT/peer.jsonl
  python3 bench/qwen_torch_peer.py train --activations selective --compile \\
      --memory-cap-gib 40 --metrics $OUT/peer.jsonl
  python3 bench/qwen_torch_peer.py parity --binary gpu-carry/qwen-bench/none.xz --out $OUT/parity
  python3 bench/qwen_torch_peer.py grid --budgets-gib 16,24,40,80 --seqs 4096 \\
      --global-batch-tokens 65536 --max-wall-s 540 --resume \\
      --out bench/results/peer-grid/budgets.jsonl
  cp bench/results/peer-grid/budgets.* $OUT/   # the JSONL and the runs' log
"""
import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import lzma
import math
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(REPO, "tools"))
FLA_SRC = os.path.join(REPO, "third_party_untracked", "fla-src")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.checkpoint  # noqa: E402

from torchref import safetensors_io  # noqa: E402
from torchref.model import (IGNORE_INDEX, GatedDeltaNet,  # noqa: E402
                            HybridLM, Kernels, ModelConfig, RMSNorm,
                            SwiGLUMLP, acc_dtype, naive_attention_core,
                            naive_gdn_core)
from torchref.train import StepConfig  # noqa: E402


def log(*a):
    print(*a, file=sys.stderr, flush=True)


#===----------------------------------------------------------------------===#
# Cores
#===----------------------------------------------------------------------===#

def import_fla(name):
    """A module of FLA from the untracked source (FLA_SRC)."""
    if FLA_SRC not in sys.path:
        sys.path.insert(0, FLA_SRC)
    return importlib.import_module(name)


def fla_usable(device):
    """Whether FLA's Triton kernels can run for `device`: a CUDA device, the
    untracked FLA source and an importable Triton. Imports nothing of FLA and
    touches no CUDA, so that grid's parent process can decide too (the
    defaults of --loss and --fused-norms)."""
    return (str(device).startswith("cuda") and
            os.path.isdir(os.path.join(FLA_SRC, "fla")) and
            importlib.util.find_spec("triton") is not None)


def fla_gdn_core():
    import_fla("fla")
    import fla.ops.common.chunk_o as chunk_o
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    chunk_o.TRITON_ABOVE_3_7_1 = True

    def core(q, k, v, g, beta, scale):
        o, _ = chunk_gated_delta_rule(q.contiguous(), k.contiguous(),
                                      v.contiguous(), g.float().contiguous(),
                                      beta.contiguous(), scale=scale,
                                      output_final_state=False)
        return o
    return core


def torch_chunk_gdn_core(q, k, v, g, beta, scale, chunk=64):
    """The gated delta rule in chunks of `chunk` tokens (docs/model-math.md 1.4),
    state and products in at least fp32, backward by autograd.

    Shapes as torchref's naive core: q, k [B, T, H, dk], v [B, T, H, dv],
    g, beta [B, T, H]; returns [B, T, H, dv] in v's dtype.
    """
    acc = torch.promote_types(v.dtype, torch.float32)
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    C = chunk
    n = (T + C - 1) // C
    pad = n * C - T

    def chunks(x):
        # [B, T, H, ...] -> [B, H, n, C, ...]; padded tokens have g = 0,
        # beta = 0 and zero q, k, v, so they change nothing before them.
        x = x.to(acc)
        if pad:
            x = F.pad(x, (0, 0) * (x.dim() - 3) + (0, 0, 0, pad))
        x = x.reshape(B, n, C, H, *x.shape[3:])
        return x.movedim(3, 1)

    Q, K, V = chunks(q), chunks(k), chunks(v)
    Gl, Bt = chunks(g), chunks(beta)
    G = Gl.cumsum(-1)                                   # [B, H, n, C]
    idx = torch.arange(C, device=q.device)
    incl = idx[:, None] >= idx[None, :]                 # s <= r
    strict = idx[:, None] > idx[None, :]
    # Exponents masked before exp: G_r - G_s <= 0 where used, and the
    # unused upper triangle never reaches exp (no inf, no inf * 0).
    diff = G[..., :, None] - G[..., None, :]
    D = torch.exp(torch.where(incl, diff, torch.full_like(diff, -math.inf)))
    KK = K @ K.transpose(-1, -2)
    A = torch.where(strict, Bt[..., :, None] * KK * D, torch.zeros_like(KK))
    eye = torch.eye(C, dtype=acc, device=q.device).expand_as(A)
    Tinv = torch.linalg.solve_triangular(eye + A, eye, upper=False,
                                         unitriangular=True)
    Gam = torch.exp(G)
    W = Tinv @ ((Bt * Gam)[..., None] * K)              # [B, H, n, C, dk]
    U = Tinv @ (Bt[..., None] * V)                      # [B, H, n, C, dv]
    QK = torch.where(incl, (Q @ K.transpose(-1, -2)) * D,
                     torch.zeros_like(KK))
    S = torch.zeros(B, H, dk, dv, dtype=acc, device=q.device)
    outs = []
    for c in range(n):
        Vnew = U[:, :, c] - W[:, :, c] @ S
        outs.append(scale * ((Gam[:, :, c, :, None] * Q[:, :, c]) @ S +
                             QK[:, :, c] @ Vnew))
        last = G[:, :, c, -1]
        decay = torch.exp(last[..., None] - G[:, :, c])  # <= 1
        S = torch.exp(last)[..., None, None] * S + \
            (K[:, :, c] * decay[..., None]).transpose(-1, -2) @ Vnew
    o = torch.stack(outs, dim=2)                        # [B, H, n, C, dv]
    o = o.movedim(1, 3).reshape(B, n * C, H, dv)[:, :T]
    return o.to(v.dtype)


def sdpa_attention_core(q, k, v, scale):
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                       v.transpose(1, 2), is_causal=True,
                                       scale=scale)
    return o.transpose(1, 2)


def make_kernels(gdn, attention):
    gdn_cores = {"fla": fla_gdn_core, "torch-chunk": lambda: torch_chunk_gdn_core,
                 "naive": lambda: naive_gdn_core}
    attn_cores = {"sdpa": sdpa_attention_core, "naive": naive_attention_core}
    return Kernels(gdn=gdn_cores[gdn](), attention=attn_cores[attention])


#===----------------------------------------------------------------------===#
# The practitioner's modules: LM head + loss (--loss), fused norms
# (--fused-norms). Swapped in after torchref builds the model, by class:
# parameter names (HF's) and torchref's own behaviour stay as they are.
#===----------------------------------------------------------------------===#

LOSSES = ("fla-fused", "chunked", "plain")

# FLA's functions once loaded (fla_modules): rms_norm, rms_norm_gated,
# fused_linear_cross_entropy_loss.
FLA = types.SimpleNamespace()


def fla_modules():
    """FLA's fused norm and fused linear cross-entropy functions, into FLA."""
    if not hasattr(FLA, "rms_norm"):
        FLA.rms_norm = import_fla("fla.modules.layernorm").rms_norm
        FLA.rms_norm_gated = import_fla(
            "fla.modules.fused_norm_gate").rms_norm_gated
        FLA.fused_linear_cross_entropy_loss = import_fla(
            "fla.modules.fused_linear_cross_entropy"
        ).fused_linear_cross_entropy_loss
    return FLA


def _chunk_loss(h, labels, weight):
    """torchref's head and loss on one chunk of tokens: logits in h's dtype
    (bf16: the same matmul as HybridLM.forward), cross-entropy in at least
    fp32, summed over labels != IGNORE_INDEX."""
    logits = F.linear(h, weight).to(acc_dtype(h.dtype))
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX,
                           reduction="sum")


def chunked_head_loss(h, weight, labels, chunk):
    """--loss chunked: HybridLM's head + loss over `chunk` tokens at a time,
    each chunk under non-reentrant torch.utils.checkpoint: the forward keeps
    no logits, the backward computes one chunk's logits again, its gradient,
    and frees them before the next; memory is linear in the chunk. The
    head weight's gradient is summed over the chunks by autograd, in the
    weight's dtype. h [B, T, D], labels [B, T]; returns the fp32 sum."""
    h = h.reshape(-1, h.shape[-1])
    labels = labels.reshape(-1).long()
    parts = [torch.utils.checkpoint.checkpoint(
        _chunk_loss, h[s:s + chunk], labels[s:s + chunk], weight,
        use_reentrant=False, preserve_rng_state=False)
        for s in range(0, h.shape[0], chunk)]
    return parts[0] if len(parts) == 1 else torch.stack(parts).sum()


def fla_fused_head_loss(h, weight, labels, chunk):
    """--loss fla-fused: FLA's fused_linear_cross_entropy_loss (Liger's
    algorithm): per chunk of tokens the logits in h's dtype, their
    logsumexp and loss in fp32 and, in the forward, the gradients of h and
    of the weight (the weight's accumulated in fp32 over the chunks, kept in
    its dtype for the backward, which only scales them by the incoming
    gradient). reduction "sum" (the loss sum HybridLM.forward returns; the
    step divides by the step's token count), ignore_index IGNORE_INDEX, no
    bias, no label smoothing, softcapping or L2 warp. num_chunks: FLA's
    default 8, more where the microbatch has more than 8 x `chunk` tokens
    (FLA rounds the chunk up to a power of two), so that its chunk stays
    within about `chunk` tokens. h [B, T, D], labels [B, T]; the fp32 sum."""
    x = h.reshape(-1, h.shape[-1]).contiguous()
    n = x.shape[0]
    return FLA.fused_linear_cross_entropy_loss(
        x, labels.reshape(-1).long().contiguous(), weight.contiguous(), None,
        ignore_index=IGNORE_INDEX, reduction="sum",
        num_chunks=max(8, -(-n // chunk)))


class PeerLM(HybridLM):
    """torchref's HybridLM with the head + loss of --loss: forward runs the
    same embedding, layers and final norm as HybridLM.forward, then
    head_loss(h, head weight (the tied embedding where tied), labels,
    loss_chunk). Set by use_loss."""

    def forward(self, tokens, labels):
        h = self.model.embed_tokens.weight[tokens]
        for layer in self.model.layers:
            h = layer(h)
        h = self.model.norm(h)
        loss_sum = self.head_loss(h, self.head_weight(), labels,
                                  self.loss_chunk)
        return loss_sum, int((labels != IGNORE_INDEX).sum())


def use_loss(model, loss, chunk):
    """--loss: `plain` leaves HybridLM.forward (fp32 logits of the whole
    microbatch); the others make the model a PeerLM."""
    if loss == "plain":
        return
    if loss == "fla-fused":
        fla_modules()
    model.__class__ = PeerLM
    model.head_loss = {"chunked": chunked_head_loss,
                       "fla-fused": fla_fused_head_loss}[loss]
    model.loss_chunk = chunk


class FusedRMSNorm(RMSNorm):
    """torchref's RMSNorm through FLA's fused RMSNorm (fla.modules.layernorm
    .rms_norm: one Triton kernel each way, statistics and the product in
    fp32, output in x's dtype). Zero-centred norms ((1 + w) * x rstd, as
    Qwen3.5's) pass 1 + w in fp32, as torchref computes it, so the kernel
    multiplies by the same factor; autograd takes the weight's gradient
    through the addition."""

    def forward(self, x):
        w = self.weight
        if self.zero_centered:
            w = 1 + w.to(acc_dtype(w.dtype))
        return FLA.rms_norm(x, w, None, eps=self.eps)


class FusedGatedDeltaNet(GatedDeltaNet):
    """torchref's GatedDeltaNet with its gated output norm
    (w * (o rstd) * silu(z), plain w) through FLA's fused gated RMSNorm
    (fla.modules.fused_norm_gate.rms_norm_gated, activation swish: what
    FLA's own GatedDeltaNet layer uses as its FusedRMSNormGated o_norm)."""

    def gated_norm(self, o, z, dtype):
        return FLA.rms_norm_gated(o, z, self.norm.weight, None,
                                  activation="swish", eps=self.eps).to(dtype)


def fuse_norms(model):
    """--fused-norms: every RMSNorm of the model (input, post-attention,
    attention q/k and final norms) becomes a FusedRMSNorm and every
    GatedDeltaNet a FusedGatedDeltaNet. Returns the counts."""
    fla_modules()
    counts = {"rms_norm": 0, "gated_norm": 0}
    for m in model.modules():
        if type(m) is RMSNorm:
            m.__class__ = FusedRMSNorm
            counts["rms_norm"] += 1
        elif type(m) is GatedDeltaNet:
            m.__class__ = FusedGatedDeltaNet
            counts["gated_norm"] += 1
    return counts


def resolve_practice(a):
    """The defaults of --loss and --fused-norms (None where not given):
    FLA's fused linear cross-entropy and fused norms where FLA can run
    (fla_usable), else the chunked head and torchref's norms."""
    usable = fla_usable(a.device)
    if a.loss is None:
        a.loss = "fla-fused" if usable else "chunked"
    if a.fused_norms is None:
        a.fused_norms = usable
    if a.loss_chunk_tokens < 1:
        sys.exit("--loss-chunk-tokens must be positive")
    wants = [x for x, on in (("--loss fla-fused", a.loss == "fla-fused"),
                             ("--fused-norms", a.fused_norms)) if on]
    if wants and not usable:
        sys.exit("%s: FLA's Triton kernels need a CUDA device, Triton and "
                 "%s" % (", ".join(wants), FLA_SRC))


#===----------------------------------------------------------------------===#
# Memory: activation checkpointing, saved tensors on the host, compile, the
# driver's view of the process
#===----------------------------------------------------------------------===#

ACTIVATIONS = ("none", "layer", "selective")


def checkpoint_method(module, name="forward"):
    """Replaces module.<name> (a method of its class) by one that runs under
    non-reentrant torch.utils.checkpoint: the tensors it would save are
    dropped after the forward and recomputed in the backward; only its
    inputs stay. Set on the instance, so parameter names (HF's) do not
    change, and bound to the module, so that torch.compile sees the same
    code with a module `self` for every layer of a kind. No RNG state is
    kept: the model draws no random numbers."""
    plain = getattr(type(module), name)

    def run(self, *args):
        return torch.utils.checkpoint.checkpoint(
            plain, self, *args, use_reentrant=False, preserve_rng_state=False)
    setattr(module, name, types.MethodType(run, module))


def apply_activations(model, mode):
    """--activations: installs the checkpoints of `mode` (module docstring)
    and returns how many call sites it wrapped."""
    sites = []
    if mode == "layer":
        sites = [(layer, "forward") for layer in model.model.layers]
    elif mode == "selective":
        for m in model.modules():
            if isinstance(m, FusedRMSNorm):
                # FLA's norm keeps only its input (which a checkpoint keeps
                # too) and one fp32 rstd a row: nothing to gain.
                continue
            if isinstance(m, (RMSNorm, SwiGLUMLP)):
                sites.append((m, "forward"))
            elif isinstance(m, GatedDeltaNet):
                sites.append((m, "short_conv"))
    for module, name in sites:
        checkpoint_method(module, name)
    return len(sites)


class SaveOnHost(torch.autograd.graph.saved_tensors_hooks):
    """What torch.autograd.graph.save_on_cpu(pin_memory=True) does, with the
    host named: torch's version allocates its copies without a device, so
    under torch.set_default_device (build_model sets the GPU) they would
    land on the GPU. Device tensors are copied to pinned host memory when
    autograd saves them and copied back when the backward needs them, both
    asynchronously on the current stream (stream order keeps the copy
    before any reuse of the source's memory, and the copy back after the
    copy out). Parameters and views of them (a linear layer saves its
    weight transposed) stay where they are: they live on anyway, copying
    them would free nothing. Host tensors (CPU runs) are kept as they are."""

    def __init__(self, pin):
        def pack(t):
            base = t if t._base is None else t._base
            if t.device.type == "cpu" or isinstance(base, torch.nn.Parameter):
                return t
            host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout,
                               device="cpu", pin_memory=pin)
            host.copy_(t, non_blocking=pin)
            return (t.device, host)

        def unpack(packed):
            if isinstance(packed, torch.Tensor):
                return packed
            device, host = packed
            return host.to(device, non_blocking=pin)
        super().__init__(pack, unpack)


class LayerCompiler:
    """--compile: torch.compile on each decoder layer's forward, and the way
    back to eager. Compile errors surface at the first call (the forward, or
    the backward, compiled lazily), not at torch.compile, so the caller
    catches them around the step and calls fallback()."""

    def __init__(self, model):
        self.layers = list(model.model.layers)
        # The forwards as they are now (checkpoint wrappers included).
        self.eager = [layer.forward for layer in self.layers]
        self.active = False
        self.error = None

    def enable(self):
        if not hasattr(torch, "compile"):
            self.error = "torch %s has no torch.compile" % torch.__version__
            log("compile: " + self.error)
            return False
        try:
            from torch import _dynamo
            cfg = _dynamo.config
            # The layers share their code: where Dynamo keys a compiled
            # graph by layer, 24 layers must not run into its default limit
            # of 8 graphs per code (past it, it runs eager without a word).
            for knob in ("recompile_limit", "cache_size_limit"):
                if hasattr(cfg, knob):
                    setattr(cfg, knob, max(getattr(cfg, knob), 64))
            for layer, forward in zip(self.layers, self.eager):
                layer.forward = torch.compile(forward, dynamic=False)
        except Exception as e:  # noqa: BLE001 (any failure means eager)
            self.fallback("%s: %s" % (type(e).__name__, e))
            return False
        self.active = True
        return True

    def fallback(self, error, detail=""):
        """Back to the eager forwards; `error` (one line) goes to the
        summary, `detail` (a traceback) to the log."""
        log("compile failed, the layers run eager from here: %s\n%s" %
            (error[:2000], detail[-4000:]))
        for layer, forward in zip(self.layers, self.eager):
            layer.forward = forward
        self.active = False
        self.error = error.strip().split("\n")[0][:500]
        try:
            torch._dynamo.reset()
        except Exception:  # noqa: BLE001
            pass

    @staticmethod
    def graph_breaks():
        """Dynamo's count of graph breaks so far (None where not known)."""
        try:
            from torch._dynamo.utils import counters
            return int(sum(counters["graph_break"].values()))
        except Exception:  # noqa: BLE001
            return None


def is_oom(e):
    """A device allocation failure, as PyTorch's allocator (over the cap of
    --memory-cap-gib too) or a library allocating through it reports it."""
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(e, oom):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and (
        "CUDA out of memory" in text or "CUBLAS_STATUS_ALLOC_FAILED" in text
        or "CUDA error: out of memory" in text)


class DeviceMemory:
    """The process's device memory as the driver reports it, independent of
    PyTorch's allocator (the CUDA context, cuBLAS and Triton modules count
    too): the used memory NVML (pynvml, where importable) or nvidia-smi
    lists for this PID, summed over the devices. Where the driver lists no
    process with this PID (a container with its own PID namespace), the
    devices' used memory less `baseline`, their used memory when this object
    was made: make it before anything touches CUDA. sample() keeps the
    maximum in `peak` (and the source of that reading); start() samples in
    a thread every `interval` seconds until stop()."""

    def __init__(self):
        self.pid = os.getpid()
        self.peak = None
        self.source = None
        self.lock = threading.Lock()
        self.thread = None
        self.stopping = threading.Event()
        self.nvml = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                            for i in range(pynvml.nvmlDeviceGetCount())]
            self.nvml = pynvml
        except Exception:  # noqa: BLE001 (no pynvml, no driver library)
            self.nvml = None
        self.smi = None if self.nvml else shutil.which("nvidia-smi")
        self.baseline = self.devices_used()

    def smi_query(self, query):
        try:
            r = subprocess.run([self.smi, query,
                                "--format=csv,noheader,nounits"],
                               stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True,
                               timeout=10)
        except (OSError, subprocess.SubprocessError):
            return []
        return [[f.strip() for f in line.split(",")]
                for line in r.stdout.splitlines() if line.strip()]

    def process_used(self):
        """Bytes the driver lists for this PID, or None where it lists none."""
        found = []
        if self.nvml:
            for h in self.handles:
                try:
                    procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(h)
                except self.nvml.NVMLError:
                    continue
                found += [p.usedGpuMemory for p in procs
                          if p.pid == self.pid and p.usedGpuMemory is not None]
        elif self.smi:
            # used_memory in MiB; "[N/A]" where the driver does not say.
            for f in self.smi_query("--query-compute-apps=pid,used_memory"):
                if len(f) == 2 and f[0] == str(self.pid) and f[1].isdigit():
                    found.append(int(f[1]) << 20)
        return sum(found) if found else None

    def devices_used(self):
        """Used bytes over all devices, every process's; None if unknown."""
        if self.nvml:
            try:
                return sum(self.nvml.nvmlDeviceGetMemoryInfo(h).used
                           for h in self.handles)
            except self.nvml.NVMLError:
                return None
        if self.smi:
            rows = self.smi_query("--query-gpu=memory.used")
            if rows and all(len(f) == 1 and f[0].isdigit() for f in rows):
                return sum(int(f[0]) << 20 for f in rows)
        return None

    def sample(self):
        source = "nvml" if self.nvml else "nvidia-smi"
        used = self.process_used()
        if used is not None:
            with self.lock:
                if self.source != source:
                    # The PID is listed: the device-wide readings taken
                    # before (other processes in them) no longer count.
                    self.peak, self.source = None, source
        elif self.source == source or self.baseline is None:
            return None
        else:
            now = self.devices_used()
            if now is None:
                return None
            used, source = max(0, now - self.baseline), \
                source + "-device-delta"
        with self.lock:
            if self.peak is None or used > self.peak:
                self.peak, self.source = used, source
        return used

    def start(self, interval=0.05):
        def loop():
            while not self.stopping.wait(interval):
                self.sample()
        self.stopping.clear()
        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    def stop(self):
        if self.thread:
            self.stopping.set()
            self.thread.join()
            self.thread = None


#===----------------------------------------------------------------------===#
# Weights and data
#===----------------------------------------------------------------------===#

def random_weights(model, seed, init_range):
    """A seeded init in the spirit of the binary's (never zeros where a
    product would vanish): matrices and embeddings N(0, init_range), the
    conv U(+-1/sqrt(Kc)), (1 + w) norms 0 and plain norms 1, A_log
    log U(1, 16), dt_bias 1. F32, HF names."""
    gen = torch.Generator().manual_seed(seed)
    # On the CPU even where the default device is the GPU (build_model).
    cpu = {"device": "cpu"}
    out = {}
    zero_centered = model.cfg.zero_centered_norms
    for name, p in sorted(model.named_parameters()):
        shape = tuple(p.shape)
        if name.endswith("A_log"):
            w = (1 + 15 * torch.rand(shape, generator=gen, **cpu)).log()
        elif name.endswith("dt_bias"):
            w = torch.ones(shape, **cpu)
        elif name.endswith("conv1d.weight"):
            bound = 1 / math.sqrt(shape[-1])
            w = (2 * torch.rand(shape, generator=gen, **cpu) - 1) * bound
        elif "norm" in name:
            plain = ("q_a_layernorm" in name or "kv_a_layernorm" in name or
                     name.endswith("linear_attn.norm.weight"))
            w = torch.zeros(shape, **cpu) if zero_centered and not plain \
                else torch.ones(shape, **cpu)
        else:
            w = torch.randn(shape, generator=gen, **cpu) * init_range
        out[name] = w.float()
    return out


def repo_text_tokens(count):
    """`count` token ids: the bytes of the repository's docs and sources in
    a fixed order, repeated if the tree is shorter. Real text, so the loss
    falls within a few steps (random ids would leave it at ln V)."""
    data = bytearray()
    roots = ["README.md", "docs", "passes", "runtime", "kernels", "codegen",
             "dialect", "tools", "bench", "test"]
    for root in roots:
        path = os.path.join(REPO, root)
        files = [path] if os.path.isfile(path) else sorted(
            os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs)
        for f in files:
            if f.endswith((".md", ".cpp", ".h", ".td", ".py", ".cu", ".sh",
                           ".mlir", ".test")):
                with open(f, "rb") as fh:
                    data += fh.read()
            if len(data) >= count:
                return bytes(data[:count])
    while len(data) < count:
        data += data
    return bytes(data[:count])


class Batches:
    """The binary's data order (runtime/data.cpp): sample
    s = (step * M + microbatch) * B + row reads window s mod W of T + 1
    tokens starting at window * T, W = (tokens - 1) // T; tokens = [:T],
    labels = [1:]. Synthetic data is uniform ids from a seeded generator
    (not the binary's Philox stream: for timing only)."""

    def __init__(self, spec, vocab, B, T, M, seed, device):
        self.B, self.T, self.M, self.vocab = B, T, M, vocab
        self.device = device
        self.gen = torch.Generator(device="cpu").manual_seed(seed)
        self.ids = None
        if spec != "synthetic":
            kind, _, path = spec.partition(":")
            width = {"tokens": 2, "tokens16": 2, "tokens32": 4}[kind]
            raw = open(path, "rb").read()
            n = len(raw) // width
            self.ids = torch.tensor(struct.unpack(
                "<%d%s" % (n, "H" if width == 2 else "I"), raw[:n * width]),
                dtype=torch.int64, device="cpu")
            if int(self.ids.max()) >= vocab:
                raise ValueError("%s: id %d >= vocab %d" %
                                 (path, int(self.ids.max()), vocab))
            self.windows = (n - 1) // T

    def get(self, step, mb):
        B, T = self.B, self.T
        if self.ids is None:
            raw = torch.randint(0, self.vocab, (B, T + 1), generator=self.gen,
                                device="cpu")
        else:
            rows = []
            for b in range(B):
                w = ((step * self.M + mb) * B + b) % self.windows
                rows.append(self.ids[w * T:w * T + T + 1])
            raw = torch.stack(rows)
        raw = raw.to(self.device)
        return raw[:, :T].contiguous(), raw[:, 1:].contiguous()


#===----------------------------------------------------------------------===#
# The step
#===----------------------------------------------------------------------===#

class Trainer:
    """BF16 model, FP32 main grads and masters, AdamW on the masters, the
    binary's clip, lr schedule and decay rule (torchref.train.StepConfig)."""

    def __init__(self, model, step_cfg, grad_accum, device,
                 save_on_cpu=False):
        self.model, self.cfg = model, step_cfg
        self.grad_accum = grad_accum
        self.cuda = device.type == "cuda"
        self.save_on_cpu = save_on_cpu
        self.named = [(n, p) for n, p in model.named_parameters()
                      if p.requires_grad]
        self.params = [p for _, p in self.named]
        self.masters = [p.detach().float().clone() for p in self.params]
        self.main_grads = [torch.zeros_like(m) for m in self.masters]
        for m, g in zip(self.masters, self.main_grads):
            m.grad = g
        decay = [m for (n, p), m in zip(self.named, self.masters)
                 if step_cfg.decays(n, p)]
        plain = [m for (n, p), m in zip(self.named, self.masters)
                 if not step_cfg.decays(n, p)]
        groups = [{"params": decay, "weight_decay": step_cfg.weight_decay},
                  {"params": plain, "weight_decay": 0.0}]
        kw = {"fused": True} if self.cuda else {"foreach": False}
        self.opt = torch.optim.AdamW(groups, lr=step_cfg.max_lr,
                                     betas=(step_cfg.beta1, step_cfg.beta2),
                                     eps=step_cfg.eps, **kw)

    def saved_tensors(self):
        """Where autograd keeps what the backward needs: on the device, or
        with --save-on-cpu in (pinned) host memory."""
        if self.save_on_cpu:
            return SaveOnHost(pin=self.cuda)
        return contextlib.nullcontext()

    def reset_grads(self):
        """Drops a failed step's partial gradients (the compile fallback runs
        the step again; no optimizer state has moved by then)."""
        for p in self.params:
            p.grad = None
        for g in self.main_grads:
            g.zero_()

    def load_masters(self, weights):
        """FP32 masters from the file's values (the bf16 weights are their
        rounding), as the binary's --init-weights does."""
        for (n, _), m in zip(self.named, self.masters):
            m.copy_(weights[n].to(m.device, torch.float32))

    def step(self, step, batches):
        """One optimizer step; returns (loss, grad norm, lr) as tensors/float
        without synchronising (the caller times around it)."""
        M = batches.M
        labels_all = [batches.get(step, mb) for mb in range(M)]
        count = sum(int((lab != -100).sum()) for _, lab in labels_all)
        loss_total = torch.zeros((), dtype=torch.float64,
                                 device=self.masters[0].device)
        for tokens, labels in labels_all:
            with self.saved_tensors():
                loss_sum, _ = self.model(tokens, labels)
                (loss_sum / count).backward()
            loss_total += loss_sum.detach().double()
            if self.grad_accum == "fp32":
                grads = [p.grad for p in self.params]
                torch._foreach_add_(self.main_grads, grads)
                for p in self.params:
                    p.grad = None
        if self.grad_accum == "bf16":
            for g, p in zip(self.main_grads, self.params):
                g.copy_(p.grad)
                p.grad = None
        # Multi-tensor kernels where this PyTorch has them (one launch per
        # group of tensors instead of one per parameter).
        if hasattr(torch, "_foreach_norm"):
            norms = torch._foreach_norm(self.main_grads)
        else:
            norms = [torch.linalg.vector_norm(g) for g in self.main_grads]
        norm = torch.linalg.vector_norm(torch.stack(norms))
        if self.cfg.max_grad_norm > 0:
            coef = torch.clamp(self.cfg.max_grad_norm / (norm + 1e-6), max=1.0)
            try:
                torch._foreach_mul_(self.main_grads, coef)
            except (TypeError, RuntimeError):
                # Older PyTorch: no tensor scalar for the foreach multiply.
                for g in self.main_grads:
                    g.mul_(coef)
        lr = self.cfg.lr(step)
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.step()
        with torch.no_grad():
            try:
                torch._foreach_copy_(self.params, self.masters)
            except (AttributeError, RuntimeError, TypeError):
                # No multi-tensor copy (or none across dtypes) here.
                for p, m in zip(self.params, self.masters):
                    p.copy_(m)
        if hasattr(torch, "_foreach_zero_"):
            torch._foreach_zero_(self.main_grads)
        else:
            for g in self.main_grads:
                g.zero_()
        return loss_total / count, norm, lr


def build_model(a, device):
    cfg = ModelConfig.from_json(a.model)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[a.dtype]
    if device.type == "cuda" and hasattr(torch, "set_default_device"):
        # torchref builds some tensors (RoPE angles, masks) without a
        # device argument: they must land on the GPU.
        torch.set_default_device(device)
    model = HybridLM(cfg, dtype=dtype,
                     kernels=make_kernels(a.gdn, a.attention)).to(device)
    # The practitioner's modules (before any checkpoint wrapper or compile
    # takes the forwards).
    use_loss(model, a.loss, a.loss_chunk_tokens)
    model.fused_norm_sites = fuse_norms(model) if a.fused_norms else None
    return cfg, model


def cmd_train(a):
    """`train`: the setup around train_steps and its summary line; a CUDA
    OOM anywhere from the model build on is a result (a summary with
    "oom": true, exit code 0), so a grid can go on."""
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    resolve_practice(a)
    torch.manual_seed(a.seed)
    # Before anything touches CUDA: the devices' used memory without this
    # process (DeviceMemory's fallback where the driver hides our PID).
    devmem = DeviceMemory() if cuda else None
    summary = {"summary": True, "oom": False,
               "micro_batch_size": a.micro_batch_size,
               "micro_batches": a.micro_batches, "seq": a.seq,
               "tokens_per_step": a.micro_batch_size * a.seq *
               a.micro_batches,
               "activations": a.activations, "save_on_cpu": a.save_on_cpu,
               "compile": a.compile, "compiled": False,
               "memory_cap_gib": a.memory_cap_gib, "gdn": a.gdn,
               "attention": a.attention, "loss": a.loss,
               "loss_chunk_tokens": a.loss_chunk_tokens,
               "fused_norms": a.fused_norms, "grad_accum": a.grad_accum,
               "warmup_steps": a.warmup, "torch": torch.__version__}
    if a.memory_cap_gib is not None:
        if cuda:
            # The caching allocator's limit; above the device's memory it is
            # the whole device.
            # The allocator's cap takes a device index ("cuda" has none).
            index = device.index if device.index is not None else \
                torch.cuda.current_device()
            total = torch.cuda.get_device_properties(index).total_memory
            fraction = min(1.0, a.memory_cap_gib * 2 ** 30 / total)
            torch.cuda.set_per_process_memory_fraction(fraction, index)
            summary["memory_cap_fraction"] = fraction
        else:
            log("--memory-cap-gib: no cap on device %s" % device)
    out = open(a.metrics, "w") if a.metrics else None
    run = {"stage": "build", "compiler": None}
    try:
        times = train_steps(a, device, devmem, summary, out, run)
    except Exception as e:  # noqa: BLE001 (re-raised unless a CUDA OOM)
        if not (cuda and is_oom(e)):
            raise
        summary["oom"] = True
        summary["oom_at"] = run["stage"]
        summary["error"] = str(e).strip().split("\n")[0][:500]
        log("out of device memory at %s: %s" % (run["stage"],
                                               summary["error"]))
        times = []
    finally:
        if devmem:
            devmem.stop()
    compiler = run["compiler"]
    if compiler:
        summary["compiled"] = compiler.active
        summary["compile_graph_breaks"] = compiler.graph_breaks()
        if compiler.error:
            summary["compile_error"] = compiler.error
    if cuda:
        devmem.sample()
        summary["gpu"] = torch.cuda.get_device_name(device)
        summary["device_total_bytes"] = \
            torch.cuda.get_device_properties(device).total_memory
        summary["max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        summary["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
        summary["device_peak_bytes"] = devmem.peak
        summary["device_memory_source"] = devmem.source
    if times or summary["oom"]:
        if out:
            out.write(json.dumps(summary) + "\n")
        print(json.dumps(summary), flush=True)
    if out:
        out.close()


def train_steps(a, device, devmem, summary, out, run):
    """Builds the model and the trainer (with --activations, --save-on-cpu,
    --compile), runs WARMUP + STEPS steps writing one row each, fills the
    step statistics of `summary` and returns the timed steps' seconds.
    run["stage"] names what is running (for an OOM report) and
    run["compiler"] is the LayerCompiler under --compile."""
    cuda = device.type == "cuda"
    cfg, model = build_model(a, device)
    if a.init_weights:
        weights, _ = safetensors_io.load(a.init_weights)
    else:
        weights = random_weights(model, a.seed, a.init_range)
    missing = set(n for n, _ in model.named_parameters()) ^ set(weights)
    if missing:
        sys.exit("weights and model differ in: %s" % sorted(missing)[:10])
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(weights[n].to(device, p.dtype))
    summary["fused_norm_sites"] = model.fused_norm_sites
    summary["checkpointed_sites"] = apply_activations(model, a.activations)
    step_cfg = StepConfig()
    if a.lr is not None:
        step_cfg = step_cfg.with_peak_lr(a.lr)
    trainer = Trainer(model, step_cfg, a.grad_accum, device, a.save_on_cpu)
    trainer.load_masters(weights)
    del weights
    if a.compile:
        run["compiler"] = LayerCompiler(model)
        run["compiler"].enable()
    batches = Batches(a.data, cfg.vocab_size, a.micro_batch_size, a.seq,
                      a.micro_batches, a.seed, device)
    tokens = a.micro_batch_size * a.seq * a.micro_batches
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        free0, total = torch.cuda.mem_get_info()
        devmem.sample()
        devmem.start(0.05)
    times = []
    loss_last = grad_norm_last = None
    for s in range(a.warmup + a.steps):
        run["stage"] = "step %d" % (s + 1)
        sync()
        t0 = time.perf_counter()
        data_state = batches.gen.get_state()
        for attempt in range(2):
            failed = None
            try:
                loss, norm, lr = trainer.step(s, batches)
            except Exception as e:  # noqa: BLE001 (re-raised unless compile)
                compiler = run["compiler"]
                if attempt or is_oom(e) or not (compiler and
                                                 compiler.active):
                    raise
                # Outside this handler, so that the failed attempt's tensors
                # (held by the traceback) are gone before the retry.
                failed = ("%s: %s" % (type(e).__name__, e),
                          traceback.format_exc())
            if failed is None:
                break
            run["compiler"].fallback(failed[0], failed[1])
            trainer.reset_grads()
            batches.gen.set_state(data_state)   # the same step's data again
            sync()
            t0 = time.perf_counter()
        sync()
        dt = time.perf_counter() - t0
        row = {"step": s + 1, "loss": float(loss), "grad_norm": float(norm),
               "lr": lr, "step_time_s": dt, "tokens_per_s": tokens / dt,
               "warmup": s < a.warmup}
        peak = ""
        if cuda:
            free, _ = torch.cuda.mem_get_info()
            devmem.sample()
            row["max_allocated_bytes"] = torch.cuda.max_memory_allocated()
            row["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
            row["device_used_bytes"] = free0 - free
            row["device_peak_bytes"] = devmem.peak
            if devmem.peak is not None:
                peak = " device peak %.2f GiB" % (devmem.peak / 2 ** 30)
        if not math.isfinite(row["loss"]):
            row["loss"] = None
        loss_last, grad_norm_last = row["loss"], row["grad_norm"]
        if s >= a.warmup:
            times.append(dt)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
        log("step %d loss %s grad_norm %.4f lr %.3e %.4f s %s tok/s%s" % (
            s + 1, row["loss"], row["grad_norm"], lr, dt,
            f"{tokens / dt:,.0f}", peak))
    run["stage"] = "done"
    if times:
        med = statistics.median(times)
        summary.update({"steps": len(times), "step_time_median_s": med,
                        "step_time_min_s": min(times),
                        "step_time_max_s": max(times),
                        "tokens_per_s_median": tokens / med,
                        "loss_last": loss_last,
                        "grad_norm_last": grad_norm_last})
    return times


def cmd_prepare(a):
    cfg = ModelConfig.from_json(a.model)
    model = HybridLM(cfg, dtype=torch.float32)
    os.makedirs(a.out, exist_ok=True)
    weights = random_weights(model, a.seed, a.init_range)
    safetensors_io.save(os.path.join(a.out, "weights.safetensors"), weights)
    count = a.steps * a.micro_batches * a.micro_batch_size * a.seq + 1
    ids = repo_text_tokens(count)
    with open(os.path.join(a.out, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<%dI" % len(ids), *ids))
    log("wrote %s: weights (%d tensors), %d tokens" % (a.out, len(weights),
                                                       len(ids)))


def read_metrics(path):
    rows = {}
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            if "step" in r:
                rows[r["step"]] = r
    return rows


def cmd_compare(a):
    ours, peer = read_metrics(a.ours), read_metrics(a.peer)
    steps = sorted(set(ours) & set(peer))
    if not steps:
        sys.exit("no common steps")
    print("| step | loss ours | loss peer | diff | rel | grad norm ours | "
          "grad norm peer |")
    print("|---|---|---|---|---|---|---|")
    worst = (0.0, 0)
    for s in steps:
        lo, lp = ours[s]["loss"], peer[s]["loss"]
        if lo is None or lp is None:
            print(f"| {s} | {lo} | {lp} | non-finite | | | |")
            worst = (math.inf, s)
            continue
        d = lo - lp
        worst = max(worst, (abs(d), s))
        print(f"| {s} | {lo:.6f} | {lp:.6f} | {d:+.6f} | {d / lp:+.2e} | "
              f"{ours[s]['grad_norm']:.5f} | {peer[s]['grad_norm']:.5f} |")
    print(f"largest |loss difference|: {worst[0]:.6f} at step {worst[1]} "
          f"over {len(steps)} steps")
    return worst[0]


def cmd_parity(a):
    """Large files (weights, tokens, the unpacked binary) go to a work
    folder, removed at the end unless --work names one: only metrics, logs
    and the comparison land in --out (on the GPU machine, $OUT comes back)."""
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    work = os.path.abspath(a.work) if a.work else \
        tempfile.mkdtemp(prefix="qwen-parity-")
    try:
        parity(a, out, work)
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)


def parity(a, out, work):
    open(os.path.join(out, "parity.md"), "w").close()
    a.out = work
    cmd_prepare(a)
    binary = a.binary
    if binary.endswith(".xz"):
        target = os.path.join(work, os.path.basename(binary)[:-3])
        with lzma.open(binary) as f, open(target, "wb") as o:
            shutil.copyfileobj(f, o)
        os.chmod(target, 0o755)
        binary = target
    weights = os.path.join(work, "weights.safetensors")
    data = "tokens32:" + os.path.join(work, "tokens.bin")

    def run_ours(weights, name):
        cmd = [binary, "--steps", str(a.steps), "--device",
               "cuda" if a.device.startswith("cuda") else "host",
               "--init-weights", weights, "--data", data, "--lr", repr(a.lr),
               "--metrics", os.path.join(out, name + ".jsonl")]
        log("$ " + " ".join(cmd))
        r = subprocess.run(cmd, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        open(os.path.join(out, name + ".log"), "w").write(r.stdout)
        if r.returncode != 0:
            log(r.stdout[-3000:])
            sys.exit("the binary failed (exit %d)" % r.returncode)

    run_ours(weights, "ours")
    if a.noise_floor:
        # What "bf16 noise" amounts to over these steps: the same binary
        # from weights moved by one bf16 rounding error each (a relative
        # 2^-9, random sign, seeded). Its loss difference from the
        # unperturbed run is the yardstick for ours against the peer.
        tensors, _ = safetensors_io.load(weights)
        gen = torch.Generator().manual_seed(a.seed + 1)
        for name in sorted(tensors):
            t = tensors[name]
            sign = torch.randint(0, 2, t.shape, generator=gen) * 2 - 1
            tensors[name] = t * (1 + sign.to(t.dtype) * 2.0 ** -9)
        perturbed = os.path.join(work, "weights-perturbed.safetensors")
        safetensors_io.save(perturbed, tensors)
        run_ours(perturbed, "ours-perturbed")
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            print("\n## noise floor: ours vs ours from weights moved by one "
                  "bf16 rounding error (relative 2^-9, random sign)\n")
            cmd_compare(argparse.Namespace(
                ours=os.path.join(out, "ours.jsonl"),
                peer=os.path.join(out, "ours-perturbed.jsonl")))
        print(text.getvalue(), end="")
        with open(os.path.join(out, "parity.md"), "a") as f:
            f.write(text.getvalue())
    for gdn in a.gdn_cores.split(","):
        peer = os.path.join(out, "peer-%s.jsonl" % gdn)
        cmd = [sys.executable, os.path.abspath(__file__), "train",
               "--model", a.model, "--seq", str(a.seq), "--micro-batches",
               str(a.micro_batches), "--micro-batch-size",
               str(a.micro_batch_size), "--steps", str(a.steps), "--warmup",
               "0", "--device", a.device, "--gdn", gdn, "--attention",
               a.attention, "--dtype", a.dtype, "--init-weights", weights,
               "--data", data, "--lr", repr(a.lr), "--metrics", peer,
               "--loss-chunk-tokens", str(a.loss_chunk_tokens)]
        cmd += practice_args(a)
        log("$ " + " ".join(cmd))
        if subprocess.run(cmd).returncode != 0:
            log("peer with --gdn %s failed" % gdn)
            continue
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            print("\n## ours vs peer (--gdn %s, --attention %s)\n" %
                  (gdn, a.attention))
            cmd_compare(argparse.Namespace(
                ours=os.path.join(out, "ours.jsonl"), peer=peer))
        print(text.getvalue(), end="")
        with open(os.path.join(out, "parity.md"), "a") as f:
            f.write(text.getvalue())


#===----------------------------------------------------------------------===#
# Grid
#===----------------------------------------------------------------------===#

def csv_list(conv, choices=None):
    """An argparse type: a comma-separated list, each item in `choices`
    (where given) and converted by conv."""
    def parse(text):
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError("an empty list")
        bad = [x for x in items if choices and x not in choices]
        if bad:
            raise argparse.ArgumentTypeError("%s: not one of %s" % (
                ",".join(bad), ",".join(choices)))
        try:
            return [conv(x) for x in items]
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e))
    return parse


def parse_budget(text):
    """`device` (no cap) or a positive number of GiB (an int where whole,
    for the labels)."""
    if text == "device":
        return text
    v = float(text)
    if not v > 0 or math.isinf(v):
        raise ValueError("budget %s: not a positive number of GiB" % text)
    return int(v) if v == int(v) else v


def budget_gib(budget):
    """A budget as GiB for comparisons: `device` is above every number."""
    return math.inf if budget == "device" else budget


def budget_text(budget):
    return "device" if budget == "device" else "%g GiB" % budget


def practice_args(a):
    """train's --loss and --fused-norms as `a` has them (None: not given,
    train's default)."""
    cmd = [] if a.loss is None else ["--loss", a.loss]
    if a.fused_norms is not None:
        cmd.append("--fused-norms" if a.fused_norms else "--no-fused-norms")
    return cmd


def grid_micro_batches(tokens, seq, mbs):
    """Micro-batches per step for `mbs` sequences of `seq` tokens per
    micro-batch and `tokens` per step; None where mbs * seq does not divide
    tokens. A sequence longer than the step's tokens runs alone (1 x 1)."""
    if tokens % (mbs * seq) == 0:
        return tokens // (mbs * seq)
    if mbs == 1 and seq > tokens:
        return 1
    return None


def grid_config(seq, mbs, micro_batches, activations, save_on_cpu):
    return {"seq": seq, "micro_batch_size": mbs,
            "micro_batches": micro_batches, "activations": activations,
            "save_on_cpu": save_on_cpu}


def grid_key(a, budget, cfg):
    """The identity of one run (what --resume matches): its budget and
    configuration, and the grid's settings that change its result."""
    return json.dumps(dict(cfg, budget_gib=budget, gdn=a.gdn,
                           attention=a.attention, loss=a.loss,
                           loss_chunk_tokens=a.loss_chunk_tokens,
                           fused_norms=a.fused_norms, compile=a.compile,
                           steps=a.steps, warmup=a.warmup, lr=a.lr,
                           device=a.device, model=os.path.basename(a.model)),
                      sort_keys=True)


def grid_fit(row, budget):
    """(fits, bytes, measure) of a row under `budget`: a run that finished
    (no OOM, timeout or error) fits where its device_peak_bytes (else, when
    the driver gave none, its max_reserved_bytes, named in `measure`) is
    within the budget; under `device` every finished run fits."""
    if row.get("oom") or not row.get("tokens_per_s_median"):
        return False, None, None
    used, measure = row.get("device_peak_bytes"), "device_peak_bytes"
    if used is None:
        used, measure = row.get("max_reserved_bytes"), "max_reserved_bytes"
    if used is None:
        measure = None
    if budget == "device":
        return True, used, measure
    return used is not None and used <= budget * 2 ** 30, used, measure


def grid_best(rows, budget):
    """The fastest row (tokens/s) that fits `budget`, the first of equals,
    with its measure; or (None, None)."""
    best, best_measure = None, None
    for r in rows:
        fits, _, measure = grid_fit(r, budget)
        if fits and (best is None or r["tokens_per_s_median"] >
                     best["tokens_per_s_median"]):
            best, best_measure = r, measure
    return best, best_measure


def grid_infer(done, budget, cfg):
    """A row for (budget, cfg) that needs no run, from the rows in `done`
    ((budget, cfg, row) of this grid so far), or None:
      * an OOM of the same activations and save-on-cpu at a seq and a
        micro-batch size each no larger, under a cap no smaller: the live
        tensors grow with both and do not depend on the cap;
      * a finished run of the same configuration under a larger cap whose
        allocator pool (max_reserved_bytes) stayed within this cap: the cap
        never acted there, so this run would have gone the same way."""
    cap = budget_gib(budget)
    for b, c, r in done:
        if budget_gib(b) < cap or (c["activations"], c["save_on_cpu"]) != \
                (cfg["activations"], cfg["save_on_cpu"]):
            continue
        if r.get("oom") and c["seq"] <= cfg["seq"] and \
                c["micro_batch_size"] <= cfg["micro_batch_size"]:
            return dict(cfg, summary=True, oom=True, oom_at="inferred",
                        tokens_per_step=cfg["seq"] * cfg["micro_batch_size"]
                        * cfg["micro_batches"],
                        memory_cap_gib=None if budget == "device" else budget,
                        inferred_from=r.get("grid_key"))
        reserved = r.get("max_reserved_bytes")
        if c == cfg and budget_gib(b) > cap and not r.get("oom") and \
                r.get("tokens_per_s_median") and reserved is not None and \
                reserved <= cap * 2 ** 30:
            row = dict(r, memory_cap_gib=budget,
                       inferred_from=r.get("grid_key"))
            row.pop("memory_cap_fraction", None)
            row.pop("run_wall_s", None)
            return row
    return None


def grid_run(a, budget, cfg, env, log_path, timeout):
    """One `train` process; its summary line, or a row saying why none came
    (timeout, exit code). Its stderr is appended to log_path. The process
    gets its own process group (not its own session, so that whatever ends
    this command's session ends it too), killed whole on a timeout."""
    cmd = [sys.executable, os.path.abspath(__file__), "train",
           "--model", a.model, "--device", a.device,
           "--seq", str(cfg["seq"]),
           "--micro-batch-size", str(cfg["micro_batch_size"]),
           "--micro-batches", str(cfg["micro_batches"]),
           "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--gdn", a.gdn, "--attention", a.attention,
           "--activations", cfg["activations"],
           "--loss-chunk-tokens", str(a.loss_chunk_tokens)]
    cmd += practice_args(a)
    if cfg["save_on_cpu"]:
        cmd.append("--save-on-cpu")
    if budget != "device":
        cmd += ["--memory-cap-gib", str(budget)]
    if a.compile:
        cmd.append("--compile")
    if a.lr is not None:
        cmd += ["--lr", repr(a.lr)]
    failed = dict(cfg, summary=True, gdn=a.gdn, attention=a.attention,
                  loss=a.loss, loss_chunk_tokens=a.loss_chunk_tokens,
                  fused_norms=a.fused_norms, compile=a.compile,
                  memory_cap_gib=None if budget == "device" else budget)
    t0 = time.time()
    with open(log_path, "a") as err:
        err.write("\n=== %s  %s\n$ %s\n" % (
            time.strftime("%Y-%m-%d %H:%M:%S"), grid_describe(budget, cfg),
            " ".join(cmd)))
        err.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err,
                                text=True, env=env, preexec_fn=os.setpgrp)

        def kill():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill()
            return dict(failed, timeout=True, timeout_s=timeout,
                        run_wall_s=time.time() - t0)
        except BaseException:
            kill()
            raise
    summary = None
    for line in reversed(stdout.splitlines()):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and r.get("summary"):
            summary = r
            break
    if summary is None or proc.returncode != 0:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(log_path) - 1500))
            tail = f.read().decode("utf-8", "replace")
        return dict(failed, error="exit code %d%s" % (
            proc.returncode, "" if summary else ", no summary line"),
            stderr_tail=tail, run_wall_s=time.time() - t0)
    summary["run_wall_s"] = time.time() - t0
    return summary


def grid_describe(budget, cfg):
    return "budget %s, seq %d, %d x %d, %s%s" % (
        budget_text(budget), cfg["seq"], cfg["micro_batch_size"],
        cfg["micro_batches"], cfg["activations"],
        ", save-on-cpu" if cfg["save_on_cpu"] else "")


def grid_result(row, budget):
    if row.get("timeout"):
        return "timeout after %g s" % row["timeout_s"]
    if row.get("error"):
        return "failed: " + row["error"]
    if row.get("oom"):
        at = row.get("oom_at")
        return "OOM" if at == "inferred" else "OOM at %s" % at
    text = f"{row['tokens_per_s_median']:,.0f} tok/s"
    for key, name in (("device_peak_bytes", "device peak"),
                      ("max_reserved_bytes", "reserved")):
        if row.get(key) is not None:
            text += ", %s %.2f GiB" % (name, row[key] / 2 ** 30)
    if not grid_fit(row, budget)[0]:
        text += ", over the budget"
    if row.get("compile") and not row.get("compiled"):
        text += ", compile fell back to eager"
    return text


def cmd_grid(a):
    # --loss and --fused-norms resolved here (without touching CUDA), so
    # that every run gets them explicitly and --resume's keys name them.
    resolve_practice(a)
    log("grid: loss %s, %s norms" % (a.loss, "FLA's fused" if a.fused_norms
                                      else "torchref's"))
    out = os.path.abspath(a.out)
    folder = os.path.dirname(out)
    os.makedirs(folder, exist_ok=True)
    log_path = (out[:-len(".jsonl")] if out.endswith(".jsonl") else out) \
        + ".runs.log"
    env = dict(os.environ)
    env.setdefault("TRITON_CACHE_DIR", os.path.join(folder, "triton-cache"))
    os.makedirs(env["TRITON_CACHE_DIR"], exist_ok=True)
    env["PYTHONUNBUFFERED"] = "1"   # the step lines reach the log as they come
    budgets = sorted(set(a.budgets_gib), key=budget_gib, reverse=True)
    seqs = sorted(set(a.seqs))
    mbs_list = sorted(set(a.mbs))
    ref = None
    if a.reuse_best_above:
        ref = max((q for q in seqs if q <= a.reuse_best_above), default=None)
        if ref is None:
            sys.exit("--reuse-best-above %d: no seq at or below it in --seqs"
                     % a.reuse_best_above)
    # --resume: every earlier row is kept in the file; those that finished
    # or ran out of memory stand for their run.
    earlier, previous = [], {}
    if a.resume and os.path.exists(out):
        for line in open(out):
            if line.strip():
                r = json.loads(line)
                if r.get("best"):
                    continue
                earlier.append(r)
                if r.get("grid_key") and (r.get("oom") or
                                          r.get("tokens_per_s_median")):
                    previous[r["grid_key"]] = r
    f = open(out, "w")
    for r in earlier:
        f.write(json.dumps(r) + "\n")
    f.flush()
    start = time.time()
    rows = {}       # (budget, seq) -> rows
    done = []       # (budget, cfg, row), for grid_infer
    count = 0
    stopped = False
    for seq in seqs:
        for budget in budgets:
            if stopped:
                break
            if ref is not None and seq > ref:
                # The best setting at the reference seq, its micro-batch size
                # lowered until it divides the step.
                best, _ = grid_best(rows.get((budget, ref), []), budget)
                if best is None:
                    log("grid: budget %s: nothing fits at seq %d, so nothing "
                        "to reuse at seq %d" % (budget_text(budget), ref, seq))
                    continue
                mbs = best["micro_batch_size"]
                while mbs > 1 and grid_micro_batches(
                        a.global_batch_tokens, seq, mbs) is None:
                    mbs -= 1
                mb = grid_micro_batches(a.global_batch_tokens, seq, mbs)
                if mb is None:
                    log("grid: seq %d does not divide %d tokens: skipped" %
                        (seq, a.global_batch_tokens))
                    continue
                configs = [grid_config(seq, mbs, mb, best["activations"],
                                       best["save_on_cpu"])]
            else:
                configs = []
                for mbs in mbs_list:
                    mb = grid_micro_batches(a.global_batch_tokens, seq, mbs)
                    if mb is None:
                        if budget == budgets[0]:
                            log("grid: seq %d, micro-batch size %d: %d does "
                                "not divide %d tokens, skipped" % (
                                    seq, mbs, mbs * seq,
                                    a.global_batch_tokens))
                        continue
                    configs += [grid_config(seq, mbs, mb, act, soc)
                                for act in a.activations
                                for soc in a.save_on_cpu]
            for cfg in configs:
                key = grid_key(a, budget, cfg)
                count += 1
                tag = "grid [%d] %s" % (count, grid_describe(budget, cfg))
                if key in previous:
                    row = previous[key]
                    log("%s: %s (from the earlier file)" % (
                        tag, grid_result(row, budget)))
                else:
                    row = None if a.no_infer else grid_infer(done, budget,
                                                             cfg)
                    if row is not None:
                        row["grid_source"] = "inferred"
                        log("%s: %s (inferred, no run)" % (
                            tag, grid_result(row, budget)))
                    else:
                        timeout = a.timeout_s
                        if a.max_wall_s:
                            left = a.max_wall_s - (time.time() - start)
                            if left < 1:
                                log("grid: --max-wall-s %g reached, no more "
                                    "runs" % a.max_wall_s)
                                stopped = True
                                break
                            timeout = min(timeout, left)
                        log("%s: running" % tag)
                        row = grid_run(a, budget, cfg, env, log_path, timeout)
                        row["grid_source"] = "run"
                        log("%s: %s (%.0f s)" % (tag, grid_result(row, budget),
                                                 row.get("run_wall_s", 0)))
                    row.update(budget_gib=budget, grid_key=key)
                    for k in ("loss", "loss_chunk_tokens", "fused_norms"):
                        row.setdefault(k, getattr(a, k))
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                done.append((budget, cfg, row))
                rows.setdefault((budget, seq), []).append(row)
    # Per (budget, seq): the fastest setting that fits.
    table = ["| budget | seq | best setting | tokens/s | device peak GiB | "
             "reserved GiB | fitting / rows |",
             "|---|---|---|---|---|---|---|"]
    for budget in budgets:
        for seq in seqs:
            cell = rows.get((budget, seq), [])
            best, measure = grid_best(cell, budget)
            fitting = sum(1 for r in cell if grid_fit(r, budget)[0])
            b = {"best": True, "budget_gib": budget, "seq": seq,
                 "found": best is not None, "rows": len(cell),
                 "fitting": fitting, "complete": not stopped}
            setting, speed, peak, reserved = "none fits", "", "", ""
            if best is not None:
                for k in ("micro_batch_size", "micro_batches", "activations",
                          "save_on_cpu", "loss", "loss_chunk_tokens",
                          "fused_norms", "compiled", "tokens_per_s_median",
                          "step_time_median_s", "device_peak_bytes",
                          "max_reserved_bytes", "grid_key"):
                    b[k] = best.get(k)
                b["measure"] = measure
                setting = "%d x %d, %s%s%s" % (
                    best["micro_batch_size"], best["micro_batches"],
                    best["activations"],
                    ", save-on-cpu" if best["save_on_cpu"] else "",
                    ", compiled" if best.get("compiled") else "")
                speed = f"{best['tokens_per_s_median']:,.0f}"
                peak, reserved = (
                    "" if best.get(k) is None else "%.2f" % (best[k] / 2 ** 30)
                    for k in ("device_peak_bytes", "max_reserved_bytes"))
            f.write(json.dumps(b) + "\n")
            table.append("| %s | %d | %s | %s | %s | %s | %d / %d |" % (
                budget_text(budget), seq, setting, speed, peak, reserved,
                fitting, len(cell)))
    f.close()
    print("\n".join(table))
    log("grid: %s, %d rows%s (%.0f s)" % (
        out, count, ", stopped at --max-wall-s" if stopped else "",
        time.time() - start))


def cmd_selftest(a):
    """The chunked core against the per-token recurrence (float64), forward
    and gradients of every input, at a length with a tail chunk."""
    torch.manual_seed(0)
    B, T, H, dk, dv = 2, 45, 3, 8, 6
    q = F.normalize(torch.randn(B, T, H, dk, dtype=torch.float64), dim=-1)
    k = F.normalize(torch.randn(B, T, H, dk, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, H, dv, dtype=torch.float64)
    g = -0.3 * torch.rand(B, T, H, dtype=torch.float64) - 0.005
    beta = 0.05 + 0.9 * torch.rand(B, T, H, dtype=torch.float64)
    do = torch.randn(B, T, H, dv, dtype=torch.float64)
    worst = 0.0
    results = []
    for core in (naive_gdn_core,
                 lambda *x: torch_chunk_gdn_core(*x, chunk=16)):
        ins = [t.clone().requires_grad_(True) for t in (q, k, v, g, beta)]
        o = core(*ins, dk ** -0.5)
        (o * do).sum().backward()
        results.append([o.detach()] + [t.grad for t in ins])
    for name, want, got in zip(["o", "dq", "dk", "dv", "dg", "dbeta"],
                               results[0], results[1]):
        err = float((got - want).norm() / want.norm())
        worst = max(worst, err)
        print("selftest %-6s rel err %.2e" % (name, err))
    if worst > 1e-10:
        sys.exit("selftest: the chunked core disagrees with the recurrence")
    print("selftest: ok (max rel err %.2e)" % worst)


def main():
    head, _, rest = __doc__.partition("\n\n")
    p = argparse.ArgumentParser(description=head, epilog=rest,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def shape(sp):
        sp.add_argument("--model", default=os.path.join(REPO, "models",
                                                        "qwen3.5-0.8b.json"))
        sp.add_argument("--seq", type=int, default=4096)
        sp.add_argument("--micro-batch-size", type=int, default=1)
        sp.add_argument("--micro-batches", type=int, default=4)
        sp.add_argument("--seed", type=int, default=1)
        sp.add_argument("--init-range", type=float, default=0.02)

    def practice(sp):
        sp.add_argument("--loss", default=None, choices=LOSSES,
                        help="the LM head + cross-entropy: fla-fused (FLA's "
                        "fused linear cross-entropy), chunked (plain PyTorch, "
                        "checkpointed chunks of --loss-chunk-tokens) or plain "
                        "(fp32 logits of the whole microbatch); default "
                        "fla-fused where FLA can run (a CUDA device, Triton, "
                        "the untracked FLA source), else chunked")
        sp.add_argument("--loss-chunk-tokens", type=int, default=1024,
                        help="tokens per chunk of --loss chunked, and the "
                        "bound on FLA's chunk for fla-fused (default 1024)")
        sp.add_argument("--fused-norms", dest="fused_norms",
                        action="store_true", default=None,
                        help="FLA's fused RMSNorm for every RMSNorm and its "
                        "fused gated RMSNorm for the GDN output norm (default "
                        "where FLA can run)")
        sp.add_argument("--no-fused-norms", dest="fused_norms",
                        action="store_false", default=None,
                        help="torchref's norms (PyTorch ops)")

    def run_opts(sp, steps):
        sp.add_argument("--steps", type=int, default=steps)
        sp.add_argument("--device", default="cuda")
        sp.add_argument("--gdn", default="fla",
                        choices=["fla", "torch-chunk", "naive"])
        sp.add_argument("--attention", default="sdpa",
                        choices=["sdpa", "naive"])
        sp.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
        practice(sp)

    t = sub.add_parser("train")
    shape(t)
    run_opts(t, 10)
    t.add_argument("--warmup", type=int, default=3)
    t.add_argument("--grad-accum", default="fp32", choices=["fp32", "bf16"],
                   help="FP32 main grads per microbatch (as the binary) or "
                   "bf16 .grad accumulation converted once")
    t.add_argument("--init-weights", default="")
    t.add_argument("--data", default="synthetic")
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--metrics", default="")
    t.add_argument("--activations", default="none", choices=ACTIVATIONS,
                   help="none: autograd keeps what it saves; layer: each "
                   "decoder layer checkpointed (recomputed whole in the "
                   "backward); selective: only the RMSNorms, the GDN short "
                   "conv + SiLU and the SwiGLU MLP checkpointed, the GDN and "
                   "attention cores, projections and LM head + loss (as "
                   "--loss has it) keep their saved tensors")
    t.add_argument("--save-on-cpu", action="store_true",
                   help="saved tensors in pinned host memory between the "
                   "forward and the backward (save_on_cpu's hooks)")
    t.add_argument("--memory-cap-gib", type=float, default=None,
                   help="the caching allocator's limit, in GiB "
                   "(set_per_process_memory_fraction); a CUDA OOM ends the "
                   "run with a summary line {\"oom\": true} and exit code 0")
    t.add_argument("--compile", action="store_true",
                   help="torch.compile each decoder layer; eager where "
                   "compiling fails (\"compiled\": false in the summary)")
    pr = sub.add_parser("prepare")
    shape(pr)
    pr.add_argument("--steps", type=int, default=10)
    pr.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("ours")
    c.add_argument("peer")
    pa = sub.add_parser("parity")
    shape(pa)
    run_opts(pa, 10)
    pa.add_argument("--binary", required=True)
    pa.add_argument("--out", required=True,
                    help="metrics, logs and the comparison")
    pa.add_argument("--work", default="",
                    help="weights, tokens, the binary (default: a temporary "
                    "folder, removed afterwards)")
    pa.add_argument("--gdn-cores", default="fla,torch-chunk")
    pa.add_argument("--no-noise-floor", dest="noise_floor",
                    action="store_false",
                    help="skip the run of the binary from weights moved by "
                    "one bf16 rounding error (the yardstick for the loss "
                    "differences)")
    pa.add_argument("--lr", type=float, default=0.03,
                    help="peak lr of both (warmup: step s uses peak (s+1)/100)")
    g = sub.add_parser("grid")
    g.add_argument("--model", default=os.path.join(REPO, "models",
                                                   "qwen3.5-0.8b.json"))
    g.add_argument("--device", default="cuda")
    g.add_argument("--gdn", default="fla",
                   choices=["fla", "torch-chunk", "naive"])
    g.add_argument("--attention", default="sdpa", choices=["sdpa", "naive"])
    practice(g)
    g.add_argument("--compile", action="store_true",
                   help="every run with --compile")
    g.add_argument("--budgets-gib", type=csv_list(parse_budget),
                   default=[16, 24, 40, 80],
                   help="GiB, or `device` for the whole device without a "
                   "cap (default 16,24,40,80)")
    g.add_argument("--seqs", type=csv_list(int), default=[4096],
                   help="sequence lengths (default 4096)")
    g.add_argument("--global-batch-tokens", type=int, default=65536,
                   help="tokens per step: micro-batches = tokens / (mbs x "
                   "seq); a micro-batch size that does not divide is skipped")
    g.add_argument("--mbs", type=csv_list(int), default=[1, 2, 4],
                   help="micro-batch sizes (default 1,2,4)")
    g.add_argument("--activations", type=csv_list(str, ACTIVATIONS),
                   default=["layer", "selective"],
                   help="activation modes (default layer,selective)")
    g.add_argument("--save-on-cpu", type=csv_list(
        lambda x: x == "on", ("off", "on")), default=[False],
                   help="off, on or off,on (default off)")
    g.add_argument("--steps", type=int, default=3)
    g.add_argument("--warmup", type=int, default=2)
    g.add_argument("--lr", type=float, default=None,
                   help="peak lr of every run (train's --lr)")
    g.add_argument("--reuse-best-above", type=int, default=0, metavar="SEQ",
                   help="for seqs above SEQ run only the best setting of the "
                   "largest seq <= SEQ (per budget)")
    g.add_argument("--out", required=True,
                   help="the JSONL; its folder also gets OUT.runs.log and "
                   "triton-cache/")
    g.add_argument("--timeout-s", type=float, default=600,
                   help="per run (default 600)")
    g.add_argument("--max-wall-s", type=float, default=0,
                   help="start no run after this many seconds (0: no limit)")
    g.add_argument("--resume", action="store_true",
                   help="keep the rows of an existing --out; its finished "
                   "and OOM runs are not run again")
    g.add_argument("--no-infer", action="store_true",
                   help="run every configuration, none inferred from others")
    sub.add_parser("selftest")
    a = p.parse_args()
    {"train": cmd_train, "grid": cmd_grid, "prepare": cmd_prepare,
     "compare": cmd_compare, "parity": cmd_parity,
     "selftest": cmd_selftest}[a.cmd](a)


if __name__ == "__main__":
    main()
