#!/usr/bin/env python3
"""A PyTorch peer of actplace's Qwen3.5-0.8B training step (issue 8): the
same model (tools/torchref, an independent PyTorch implementation of the
family) with fast cores plugged in, the same step (microbatches of
token-mean loss, FP32 main grads, clip, warmup + cosine lr, AdamW on FP32
masters, BF16 weights), timed the same way, and a loss-parity check against
the training binary from the same safetensors weights and token file.

  train    the step, WARMUP + STEPS times; one JSON line per step (the
           binary's keys where they mean the same: step, loss, grad_norm, lr,
           step_time_s, tokens_per_s) and a tokens/s summary
  prepare  writes weights.safetensors (a seeded random init, F32, HF names)
           and tokens.bin (uint32 ids: the bytes of this repository's text
           files) for a parity run
  compare  per-step loss and grad norm of two metrics files, the largest
           loss difference
  parity   prepare + the binary (--init-weights, --data tokens32:) + the
           peer on the same files + compare, in one command (GPU machine);
           also the binary from weights moved by one bf16 rounding error
           (relative 2^-9, random sign) against the binary: the noise floor
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

GPU usage (nothing is compiled there):
  python3 bench/qwen_torch_peer.py train --metrics $OUT/peer.jsonl
  python3 bench/qwen_torch_peer.py parity --binary gpu-carry/qwen-bench/none.xz --out $OUT/parity
"""
import argparse
import contextlib
import io
import json
import lzma
import math
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(REPO, "tools"))
FLA_SRC = os.path.join(REPO, "third_party_untracked", "fla-src")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from torchref import safetensors_io  # noqa: E402
from torchref.model import (HybridLM, Kernels, ModelConfig,  # noqa: E402
                            naive_attention_core, naive_gdn_core)
from torchref.train import StepConfig  # noqa: E402


def log(*a):
    print(*a, file=sys.stderr, flush=True)


#===----------------------------------------------------------------------===#
# Cores
#===----------------------------------------------------------------------===#

def fla_gdn_core():
    sys.path.insert(0, FLA_SRC)
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

    def __init__(self, model, step_cfg, grad_accum, device):
        self.model, self.cfg = model, step_cfg
        self.grad_accum = grad_accum
        self.cuda = device.type == "cuda"
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
    return cfg, model


def cmd_train(a):
    device = torch.device(a.device)
    torch.manual_seed(a.seed)
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
    step_cfg = StepConfig()
    if a.lr is not None:
        step_cfg = step_cfg.with_peak_lr(a.lr)
    trainer = Trainer(model, step_cfg, a.grad_accum, device)
    trainer.load_masters(weights)
    del weights
    batches = Batches(a.data, cfg.vocab_size, a.micro_batch_size, a.seq,
                      a.micro_batches, a.seed, device)
    tokens = a.micro_batch_size * a.seq * a.micro_batches
    out = open(a.metrics, "w") if a.metrics else None
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        free0, total = torch.cuda.mem_get_info()
    times = []
    for s in range(a.warmup + a.steps):
        sync()
        t0 = time.perf_counter()
        loss, norm, lr = trainer.step(s, batches)
        sync()
        dt = time.perf_counter() - t0
        row = {"step": s + 1, "loss": float(loss), "grad_norm": float(norm),
               "lr": lr, "step_time_s": dt, "tokens_per_s": tokens / dt,
               "warmup": s < a.warmup}
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info()
            row["max_allocated_bytes"] = torch.cuda.max_memory_allocated()
            row["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
            row["device_used_bytes"] = free0 - free
        if not math.isfinite(row["loss"]):
            row["loss"] = None
        if s >= a.warmup:
            times.append(dt)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
        log("step %d loss %s grad_norm %.4f lr %.3e %.4f s %s tok/s" % (
            s + 1, row["loss"], row["grad_norm"], lr, dt,
            f"{tokens / dt:,.0f}"))
    if times:
        med = statistics.median(times)
        summary = {"summary": True, "gdn": a.gdn, "attention": a.attention,
                   "grad_accum": a.grad_accum, "torch": torch.__version__,
                   "steps": len(times), "step_time_median_s": med,
                   "step_time_min_s": min(times), "step_time_max_s": max(times),
                   "tokens_per_s_median": tokens / med}
        if device.type == "cuda":
            summary["gpu"] = torch.cuda.get_device_name()
            summary["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
        if out:
            out.write(json.dumps(summary) + "\n")
        print(json.dumps(summary))


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
               "--data", data, "--lr", repr(a.lr), "--metrics", peer]
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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
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

    def run_opts(sp, steps):
        sp.add_argument("--steps", type=int, default=steps)
        sp.add_argument("--device", default="cuda")
        sp.add_argument("--gdn", default="fla",
                        choices=["fla", "torch-chunk", "naive"])
        sp.add_argument("--attention", default="sdpa",
                        choices=["sdpa", "naive"])
        sp.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])

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
    sub.add_parser("selftest")
    a = p.parse_args()
    {"train": cmd_train, "prepare": cmd_prepare, "compare": cmd_compare,
     "parity": cmd_parity, "selftest": cmd_selftest}[a.cmd](a)


if __name__ == "__main__":
    main()
