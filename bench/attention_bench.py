#!/usr/bin/env python3
# ===- attention_bench.py - actplace attention vs torch SDPA on one GPU ----===#
#
# Times actplace's CUDA causal attention (forward, backward, forward+backward)
# against torch.nn.functional.scaled_dot_product_attention with the flash and
# the cuDNN backends, in the same process on the same inputs, at the model
# shapes (T = 4096), and states each time against its roofline floor.
#
#   python3 bench/attention_bench.py --lib build-attn/libattention_bench.so
#
# The library is built from kernels/cuda/attention, kernels/reference/attention
# and bench/attention_bench_capi.cpp (see bench/notes/attention.md).
# Floors: causal FLOPs (forward 2 GEMMs, backward the 5 GEMMs of
# FlashAttention-2 over the T(T+1)/2 visible pairs) at the bf16 dense matmul
# rate measured in this run (torch.matmul 8192^3 on random data).
#
# ===----------------------------------------------------------------------===#
import argparse
import ctypes
import json
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CONFIGS = [
    # name, B, T, Hq, Hkv, Dqk, Dv, scale
    ("qwen3.5-gqa", 1, 4096, 8, 2, 256, 256, 1.0 / 16),
    ("mla-16h", 1, 4096, 16, 16, 192, 128, 192 ** -0.5),
    ("mla-128h", 1, 4096, 128, 128, 192, 128, 192 ** -0.5),
]


def timed(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]  # median, ms


def matmul_rate():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = timed(lambda: torch.matmul(a, b), 10)
    return 2 * 8192 ** 3 / (ms * 1e-3)


class Actplace:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        vp, i, d = ctypes.c_void_p, ctypes.c_int, ctypes.c_double
        self.lib.apAttentionForward.argtypes = [vp] * 6 + [i] * 6 + [d]
        self.lib.apAttentionForward.restype = i
        self.lib.apAttentionBackwardWorkspaceBytes.argtypes = [i] * 7
        self.lib.apAttentionBackwardWorkspaceBytes.restype = ctypes.c_size_t
        self.lib.apAttentionBackwardDefaultAlgo.argtypes = [i] * 6
        self.lib.apAttentionBackwardDefaultAlgo.restype = i
        self.lib.apAttentionBackward.argtypes = (
            [vp, vp, ctypes.c_size_t] + [vp] * 9 + [i] * 6 + [d, i])
        self.lib.apAttentionBackward.restype = i
        # Absent from libraries built before the call existed (--baseline).
        self.set_portable = getattr(self.lib, "apAttentionUsePortable", None)
        if self.set_portable is not None:
            self.set_portable.argtypes = [i]
            self.set_portable.restype = None

    def run(self, cfg, q, k, v, dO, algo=-1):
        _, B, T, Hq, Hkv, Dqk, Dv, scale = cfg
        dims = (B, T, Hq, Hkv, Dqk, Dv)
        o = torch.empty(B, T, Hq, Dv, device="cuda", dtype=torch.bfloat16)
        lse = torch.empty(B, Hq, T, device="cuda", dtype=torch.float32)
        dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
        wsb = self.lib.apAttentionBackwardWorkspaceBytes(*dims, algo)
        ws = torch.empty(max(wsb, 256), device="cuda", dtype=torch.uint8)
        p = lambda t: ctypes.c_void_p(t.data_ptr())

        def fwd():
            st = torch.cuda.current_stream().cuda_stream
            rc = self.lib.apAttentionForward(ctypes.c_void_p(st), p(q), p(k),
                                             p(v), p(o), p(lse), *dims, scale)
            assert rc == 0, f"forward status {rc}"

        def bwd():
            st = torch.cuda.current_stream().cuda_stream
            rc = self.lib.apAttentionBackward(
                ctypes.c_void_p(st), p(ws), wsb, p(q), p(k), p(v), p(o),
                p(lse), p(dO), p(dq), p(dk), p(dv), *dims, scale, algo)
            assert rc == 0, f"backward status {rc}"

        return fwd, bwd, (o, dq, dk, dv), wsb


def torch_runner(backend, cfg, q, k, v, dO, expand=False):
    _, B, T, Hq, Hkv, Dqk, Dv, scale = cfg
    if expand:  # outside the timed region: kv heads repeated to Hq
        k = k.repeat_interleave(Hq // Hkv, dim=2)
        v = v.repeat_interleave(Hq // Hkv, dim=2)
    # SDPA wants [B, H, T, D]; the transposes are views (last dim contiguous).
    qt = q.detach().transpose(1, 2).requires_grad_(True)
    kt = k.detach().transpose(1, 2).requires_grad_(True)
    vt = v.detach().transpose(1, 2).requires_grad_(True)
    dOt = dO.transpose(1, 2)
    gqa = q.shape[2] != k.shape[2]
    state = {}

    def fwd():
        with sdpa_kernel([backend]):
            state["o"] = F.scaled_dot_product_attention(
                qt, kt, vt, is_causal=True, scale=scale, enable_gqa=gqa)

    def fwdbwd():
        fwd()
        state["g"] = torch.autograd.grad(state["o"], (qt, kt, vt), dOt)

    return fwd, fwdbwd, state


def relerr(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--configs", default=",".join(c[0] for c in CONFIGS),
                    help="comma-separated subset of the configs")
    ap.add_argument("--algos", default="recompute,storedds",
                    help="backward algorithms to time one by one")
    ap.add_argument("--baseline-lib", default=None,
                    help="an earlier build of the library, timed alongside")
    ap.add_argument("--portable", action="store_true",
                    help="also time the portable mma.sync kernels "
                    "(apAttentionUsePortable)")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name()
    rate = matmul_rate()
    print(f"device {dev}; torch {torch.__version__}; cudnn "
          f"{torch.backends.cudnn.version()}; bf16 matmul 8192^3 "
          f"{rate / 1e12:.0f} TFLOP/s (the floor's rate)")
    ours = Actplace(args.lib)
    base = Actplace(args.baseline_lib) if args.baseline_lib else None
    rows = []
    for cfg in [c for c in CONFIGS if c[0] in args.configs.split(",")]:
        name, B, T, Hq, Hkv, Dqk, Dv, scale = cfg
        q = torch.randn(B, T, Hq, Dqk, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, T, Hkv, Dqk, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, T, Hkv, Dv, device="cuda", dtype=torch.bfloat16)
        dO = torch.randn(B, T, Hq, Dv, device="cuda", dtype=torch.bfloat16)
        pairs = B * Hq * T * (T + 1) / 2
        fl_f = 2 * pairs * (Dqk + Dv)
        fl_b = 2 * pairs * (3 * Dqk + 2 * Dv)
        row = {"config": name, "B": B, "T": T, "Hq": Hq, "Hkv": Hkv,
               "Dqk": Dqk, "Dv": Dv,
               "floor_fwd_ms": fl_f / rate * 1e3,
               "floor_bwd_ms": fl_b / rate * 1e3}
        row["floor_fwdbwd_ms"] = row["floor_fwd_ms"] + row["floor_bwd_ms"]

        dims = (B, T, Hq, Hkv, Dqk, Dv)
        row["default_algo"] = ("RecomputeDq", "StoredDs")[
            ours.lib.apAttentionBackwardDefaultAlgo(*dims)]
        # The non-default backward algorithm first (times only, checked
        # against torch below through the default's outputs and here).
        algos = [a for a in ((0, "recompute"), (1, "storedds"))
                 if a[1] in args.algos.split(",")]
        for algo, tag in algos:
            f2, b2, outs2, wsb2 = ours.run(cfg, q, k, v, dO, algo)
            f2()
            row[f"ours_bwd_{tag}_ms"] = timed(b2, args.iters)
            row[f"ours_bwd_{tag}_ws_mib"] = wsb2 / 2 ** 20
            b2(); torch.cuda.synchronize()
            row[f"ours_bwd_{tag}_outputs"] = outs2
            del f2, b2
        others = [("baseline", base)] if base is not None else []
        if args.portable:
            others.append(("portable", ours))
        for tag, lib in others:
            # portable: the mma.sync kernels of the same library.
            if tag == "portable":
                lib.set_portable(1)
            f0, b0, _, _ = lib.run(cfg, q, k, v, dO)
            row[f"{tag}_fwd_ms"] = timed(f0, args.iters)
            f0()
            row[f"{tag}_bwd_ms"] = timed(b0, args.iters)
            row[f"{tag}_fwdbwd_ms"] = timed(lambda: (f0(), b0()), args.iters)
            if tag == "portable":
                lib.set_portable(0)
            del f0, b0
        fwd, bwd, outs, wsb = ours.run(cfg, q, k, v, dO)
        row["ours_fwd_ms"] = timed(fwd, args.iters)
        fwd()
        row["ours_bwd_ms"] = timed(bwd, args.iters)
        row["ours_fwdbwd_ms"] = timed(lambda: (fwd(), bwd()), args.iters)
        row["ours_fwd_tflops"] = fl_f / row["ours_fwd_ms"] * 1e-9
        row["ours_bwd_tflops"] = fl_b / row["ours_bwd_ms"] * 1e-9
        fwd(); bwd(); torch.cuda.synchronize()
        try:  # per-kernel split of our fwd+bwd (CUPTI sees the .so's kernels)
            from torch.profiler import profile, ProfilerActivity
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    fwd(); bwd()
                torch.cuda.synchronize()
            import re
            row["ours_kernels_us"] = {}
            for e in prof.key_averages():
                if e.device_time_total <= 0:
                    continue
                m = re.search(r"(attn\w+)", e.key)
                name = m.group(1) if m else e.key[:40]
                tmpl = re.search(r"<([^()]*)>", e.key)
                if tmpl:
                    name += "<" + tmpl.group(1) + ">"
                row["ours_kernels_us"][name] = (
                    row["ours_kernels_us"].get(name, 0) +
                    e.device_time_total / 5)
        except Exception as e:
            row["profile_error"] = str(e)[:200]

        for label, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                               ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            for expand in (False, True):
                if expand and Hq == Hkv:
                    break
                try:
                    tf, tfb, st = torch_runner(backend, cfg, q, k, v, dO,
                                               expand)
                    row[f"{label}_fwd_ms"] = timed(tf, args.iters)
                    row[f"{label}_fwdbwd_ms"] = timed(tfb, args.iters)
                    tfb(); torch.cuda.synchronize()
                    # Cross-check against torch on the same inputs.
                    o_t = st["o"].transpose(1, 2)
                    dq_t, dk_t, dv_t = (g.transpose(1, 2) for g in st["g"])
                    if expand:
                        r = Hq // Hkv
                        dk_t = dk_t.unflatten(2, (Hkv, r)).float().sum(3)
                        dv_t = dv_t.unflatten(2, (Hkv, r)).float().sum(3)
                        row[f"{label}_note"] = ("enable_gqa refused: kv "
                                                "expanded to Hq heads")
                    row[f"relerr_vs_{label}"] = {
                        "o": relerr(outs[0], o_t), "dq": relerr(outs[1], dq_t),
                        "dk": relerr(outs[2], dk_t),
                        "dv": relerr(outs[3], dv_t)}
                    for _, tag in algos:
                        o2 = row[f"ours_bwd_{tag}_outputs"]
                        row[f"relerr_vs_{label}"][f"dq_{tag}"] = relerr(
                            o2[1], dq_t)
                        row[f"relerr_vs_{label}"][f"dk_{tag}"] = relerr(
                            o2[2], dk_t)
                    row[f"speed_vs_{label}"] = (row[f"{label}_fwdbwd_ms"] /
                                                row["ours_fwdbwd_ms"])
                    row.pop(f"{label}_error", None)
                    break
                except Exception as e:  # backend refuses the shape
                    row[f"{label}_error"] = str(e).splitlines()[0][:200]
        for _, tag in algos:
            row.pop(f"ours_bwd_{tag}_outputs")
        rows.append(row)
        print(json.dumps(row), flush=True)
        del q, k, v, dO, outs
        torch.cuda.empty_cache()

    print("\nconfig        ours fwd/bwd/fwd+bwd ms   floor f+b ms  "
          "flash f+b ms  cudnn f+b ms  speed vs flash  vs cudnn  "
          "portable f+b ms")
    for r in rows:
        def g(key):
            return f"{r[key]:.3f}" if key in r else "n/a"
        print(f"{r['config']:<13} {r['ours_fwd_ms']:.3f}/{r['ours_bwd_ms']:.3f}/"
              f"{r['ours_fwdbwd_ms']:.3f}      {r['floor_fwdbwd_ms']:.3f}"
              f"         {g('flash_fwdbwd_ms')}         {g('cudnn_fwdbwd_ms')}"
              f"         {g('speed_vs_flash')}          {g('speed_vs_cudnn')}"
              f"     {g('portable_fwdbwd_ms')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "matmul_tflops": rate / 1e12,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
