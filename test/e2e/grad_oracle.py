#!/usr/bin/env python3
#===- grad_oracle.py - compiled f32 step vs an independent PyTorch model ---===#
#
# Bit-identity across placements proves placement is harmless, not that the
# gradients are right (docs/architecture.md section 7, Oracle). This test compiles the
# tiny hybrid model (GDN, gated attention, MLA, MLP layers) with f32
# parameters and activations, runs one training step on the host backend
# from random weights (--init-weights) on a token file it wrote, and checks
# against tools/torchref (PyTorch, float64, naive GDN recurrence) loaded from
# the same weights on the same tokens:
#   - the step's loss, the token count, grad norm, clip coefficient and lr;
#   - every parameter's gradient (--dump-grads: token mean before clipping);
#   - every parameter after the AdamW step (the checkpoint's FP32 masters)
#     and the update itself (after - before), against PyTorch's AdamW with
#     our lr schedule, clip and weight-decay rule applied to the binary's
#     own gradients;
# each within RTOL relative (L2 norm of the difference over the L2 norm of the
# reference, per tensor; the max over tensors is printed).
#
# Why the optimizer gets the binary's gradients: Adam's first step is
# m / (sqrt(v) + eps) = g / (|g| + eps), about sign(g), so an element whose
# gradient is below the gradients' absolute rounding error (~1e-6 here; f32
# PyTorch against float64 PyTorch shows the same) gets an arbitrary update of
# full size lr in any f32 implementation. Gradients checked against the
# independent model plus the optimizer checked on identical gradients cover
# the whole step; the fully independent post-step numbers are printed too.
#
# The shape covers
# the corners: 2 sequences per microbatch (states and convolutions reset per
# row), 2 microbatches (gradient accumulation, token-mean loss), a sequence of
# 160 tokens (GDN chunks of 64, 64 and a 32-token tail) and LM-head chunks of
# 96 tokens (a tail chunk too).
#
# Exit 77 (CTest SKIP_RETURN_CODE) when `import torch` fails.
#
#===------------------------------------------------------------------------===#
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import time

SKIP = 77
RTOL = 1e-4
SEQ, MICRO_BATCH_SIZE, MICRO_BATCHES, LOSS_CHUNK = 160, 2, 2, 96
# A peak lr whose first warmup step (peak / 100) moves the weights far more
# than f32 rounding does, so the update is compared, not just the weights.
PEAK_LR = 1.0
SEED = 1234

try:
    import torch
except ImportError as e:
    print("SKIP: the gradient oracle needs PyTorch (%s); install Debian's "
          "python3-torch (tools/scripts/install-deps.sh does) and configure "
          "with that interpreter (-DACTPLACE_TORCH_PYTHON=/usr/bin/python3)" % e)
    sys.exit(SKIP)

# No __pycache__ in the source tree.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "tools"))
from torchref import safetensors_io  # noqa: E402
from torchref.model import HybridLM, ModelConfig  # noqa: E402
from torchref.train import (StepConfig, forward_backward,  # noqa: E402
                            make_optimizer, optimizer_step)


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def run(cmd, expect_ok=True):
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if expect_ok and r.returncode != 0:
        print(r.stdout + r.stderr)
        fail("%s exited with %d" % (os.path.basename(cmd[0]), r.returncode))
    return r


def random_weights(model, seed):
    """Random values for every parameter, never the binary's init and never
    zeros, scaled so that activations stay O(1) and the GDN decays keep a
    memory of a few tokens to a few dozen."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in sorted(model.named_parameters()):
        shape = tuple(p.shape)
        normal = lambda std: torch.randn(shape, generator=gen,
                                         dtype=torch.float64) * std
        uniform = lambda a, b: a + (b - a) * torch.rand(
            shape, generator=gen, dtype=torch.float64)
        if name.endswith("A_log"):
            w = uniform(0.5, 4.0).log()
        elif name.endswith("dt_bias"):
            w = normal(0.5) - 1.0
        elif name.endswith("conv1d.weight"):
            w = normal(0.5)
        elif name == "model.embed_tokens.weight":
            w = normal(0.25)
        elif "norm" in name:
            # (1 + w) model norms around 0, plain ones around 1.
            zero_centered = model.cfg.zero_centered_norms and not (
                "q_a_layernorm" in name or "kv_a_layernorm" in name or
                name.endswith("linear_attn.norm.weight"))
            w = normal(0.2) + (0.0 if zero_centered else 1.0)
        else:
            w = normal(1.0 / math.sqrt(shape[-1]))
        out[name] = w.to(torch.float32)
    return out


def rel_err(got, want):
    got, want = got.double(), want.double()
    den = float(want.norm())
    return float((got - want).norm()) / (den if den > 0 else 1.0), den


def compare(what, got, want, names):
    """Per-tensor relative errors; returns the max."""
    worst, worst_name = 0.0, ""
    rows = []
    for n in names:
        if n not in got:
            fail("%s: the binary wrote no tensor '%s'" % (what, n))
        if tuple(got[n].shape) != tuple(want[n].shape):
            fail("%s: '%s' has shape %s, the reference %s" %
                 (what, n, tuple(got[n].shape), tuple(want[n].shape)))
        e, den = rel_err(got[n], want[n])
        if not math.isfinite(e):
            e = float("inf")
        rows.append((e, n, den))
        if e >= worst:
            worst, worst_name = e, n
    for e, n, den in sorted(rows, reverse=True):
        print("  %-12s rel %.3e  |ref| %.3e  %s" % (what, e, den, n))
    print("%s: max relative error %.3e (%s) over %d tensors" %
          (what, worst, worst_name, len(names)), flush=True)
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--import-tool", required=True)
    ap.add_argument("--compile", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    start = time.time()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    w = lambda name: os.path.join(args.work, name)

    # The compiled f32 step: import (with short LM-head chunks) -> compile.
    graph, binary = w("tiny-f32.mlir"), w("train-f32")
    run([args.import_tool, args.model, "--dtype", "f32", "--seq", str(SEQ),
         "--micro-batch-size", str(MICRO_BATCH_SIZE), "--micro-batches",
         str(MICRO_BATCHES), "--loss-chunk-tokens", str(LOSS_CHUNK), "-o",
         graph])
    run([args.compile, graph, "-o", binary])

    cfg = ModelConfig.from_json(args.model)
    model = HybridLM(cfg, dtype=torch.float64)
    weights = random_weights(model, SEED)
    safetensors_io.save(w("init.safetensors"), weights)

    # Tokens: step 0 reads window (mb * B + b) of T + 1 tokens starting at
    # (mb * B + b) * T (runtime/data.cpp, sequential uint16 windows).
    gen = torch.Generator().manual_seed(SEED + 1)
    n_tokens = MICRO_BATCHES * MICRO_BATCH_SIZE * SEQ + 1
    stream = torch.randint(0, cfg.vocab_size, (n_tokens,), generator=gen)
    with open(w("tokens.bin"), "wb") as f:
        f.write(struct.pack("<%dH" % n_tokens, *stream.tolist()))
    windows = torch.stack([stream[i * SEQ:i * SEQ + SEQ + 1] for i in
                           range(MICRO_BATCHES * MICRO_BATCH_SIZE)])
    windows = windows.reshape(MICRO_BATCHES, MICRO_BATCH_SIZE, SEQ + 1)
    tokens, labels = windows[..., :-1], windows[..., 1:]

    for f in ("grads.safetensors", "metrics.jsonl"):
        if os.path.exists(w(f)):
            os.remove(w(f))
    # A fresh run refuses a --save folder that holds checkpoints (from the
    # last run of this test).
    subprocess.run(["rm", "-rf", w("ckpt")], check=True)
    t0 = time.time()
    run([binary, "--steps", "1", "--device", "host", "--init-weights",
         w("init.safetensors"), "--dump-grads", w("grads.safetensors"),
         "--data", "tokens:" + w("tokens.bin"), "--lr", repr(PEAK_LR),
         "--metrics", w("metrics.jsonl"), "--save", w("ckpt")])
    print("binary step: %.2f s" % (time.time() - t0))
    with open(w("metrics.jsonl")) as f:
        metrics = [json.loads(l) for l in f if l.strip()]
    if len(metrics) != 1:
        fail("expected one metrics line, got %d" % len(metrics))
    m = metrics[0]
    grads, gmeta = safetensors_io.load(w("grads.safetensors"))
    with open(os.path.join(w("ckpt"), "latest")) as f:
        step_dir = os.path.join(w("ckpt"), f.read().strip())
    ckpt, _ = safetensors_io.load(os.path.join(step_dir, "model.safetensors"))

    # The reference step.
    t0 = time.time()
    model.load_state_dict({k: v.double() for k, v in weights.items()},
                          strict=True)
    step = StepConfig().with_peak_lr(PEAK_LR)
    loss, count = forward_backward(model, tokens, labels)
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = make_optimizer(model, step)
    norm, coef, lr = optimizer_step(model, opt, step, 0)
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    print("reference step: %.2f s" % (time.time() - t0))
    names = sorted(ref_grads)

    worst = {}
    print("loss: binary %.9g reference %.9g" % (m["loss"], loss))
    worst["loss"] = abs(m["loss"] - loss) / abs(loss)
    if int(gmeta.get("actplace.token_count", -1)) != count:
        fail("token count %s, reference %d" %
             (gmeta.get("actplace.token_count"), count))
    print("grad norm: binary %.9g reference %.9g; clip %s / %.9g; lr %.9g / "
          "%.9g" % (m["grad_norm"], norm, gmeta.get("actplace.clip_coef"),
                    coef, m["lr"], lr))
    worst["grad_norm"] = abs(m["grad_norm"] - norm) / norm
    worst["clip_coef"] = abs(float(gmeta["actplace.clip_coef"]) - coef) / coef
    worst["lr"] = abs(m["lr"] - lr) / lr
    if set(grads) != set(names):
        fail("gradient names differ: only binary %s, only reference %s" %
             (sorted(set(grads) - set(names)), sorted(set(names) - set(grads))))
    worst["grads"] = compare("grad", grads, ref_grads, names)
    masters = {n: ckpt["master/" + n] for n in names if "master/" + n in ckpt}
    updates = {n: masters[n].double() - weights[n].double() for n in names}
    print("independent step (not bounded; see the header): params %.3e, "
          "updates %.3e" % (
              max(rel_err(masters[n], after[n])[0] for n in names),
              max(rel_err(updates[n], after[n] - before[n])[0]
                  for n in names)))

    # PyTorch's AdamW with our schedule, clip and decay rule on the binary's
    # gradients.
    model.load_state_dict({k: v.double() for k, v in weights.items()},
                          strict=True)
    for n, p in model.named_parameters():
        p.grad = grads[n].double().clone()
    opt = make_optimizer(model, step)
    optimizer_step(model, opt, step, 0)
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    worst["params"] = compare("param", masters, after, names)
    worst["updates"] = compare("update", updates,
                               {n: after[n] - before[n] for n in names}, names)
    # The f32 compute copies are the masters.
    for n in names:
        if not torch.equal(ckpt["param/" + n], ckpt["master/" + n]):
            fail("f32 compute copy of %s differs from its master" % n)

    # A weights file that does not fit is a clear error, not a silent init.
    bad = dict(weights)
    bad.pop("model.norm.weight")
    bad["model.layers.0.linear_attn.extra"] = torch.ones(2)
    bad["model.embed_tokens.weight"] = weights[
        "model.embed_tokens.weight"][:-1]
    safetensors_io.save(w("bad.safetensors"), bad)
    r = run([binary, "--steps", "1", "--device", "host", "--init-weights",
             w("bad.safetensors")], expect_ok=False)
    for want in ("missing 'model.norm.weight'",
                 "'model.layers.0.linear_attn.extra' is not a parameter",
                 "'model.embed_tokens.weight' has shape [255, 64]"):
        if r.returncode == 0 or want not in r.stderr:
            fail("a bad --init-weights file gave exit %d without '%s':\n%s" %
                 (r.returncode, want, r.stderr))

    print("summary (relative errors, bound %.0e): %s" % (RTOL, ", ".join(
        "%s %.3e" % kv for kv in worst.items())))
    print("total %.1f s" % (time.time() - start))
    bad_checks = [k for k, v in worst.items() if not v <= RTOL]
    if bad_checks:
        fail("above %.0e: %s" % (RTOL, ", ".join(bad_checks)))
    print("PASS")


if __name__ == "__main__":
    main()
