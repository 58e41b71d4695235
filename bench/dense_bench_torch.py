"""PyTorch peers of bench/dense_bench.cpp on the same card in the same run.

torch.matmul for the GEMMs (x @ W^T, dY @ W, dY^T @ X), torch cross-entropy on
full [T, V] logits (forward + backward, with its peak memory), and
torch.optim.AdamW(fused=True). Prints one JSON line per measurement; medians
of CUDA-event timings, like the C++ bench.
"""
import json
import sys

import torch

T, D, I, V = 4096, 1024, 3584, 248320
dev = "cuda"


def time_ms(fn, warm=3, reps=15):
    for _ in range(warm):
        fn()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    ev[0].record()
    for i in range(reps):
        fn()
        ev[i + 1].record()
    torch.cuda.synchronize()
    ms = sorted(ev[i].elapsed_time(ev[i + 1]) for i in range(reps))
    return ms[reps // 2]


def out(kernel, ms, **kw):
    print(json.dumps({"impl": "torch", "kernel": kernel, "ms": round(ms, 4), **kw}),
          flush=True)


def linear(name, fin, fout):
    x = torch.randn(T, fin, device=dev, dtype=torch.bfloat16)
    w = torch.randn(fout, fin, device=dev, dtype=torch.bfloat16)
    dy = torch.randn(T, fout, device=dev, dtype=torch.bfloat16)
    f = 2.0 * T * fin * fout
    for sub, fn in (("fwd", lambda: torch.matmul(x, w.t())),
                    ("dx", lambda: torch.matmul(dy, w)),
                    ("dw", lambda: torch.matmul(dy.t(), x))):
        ms = time_ms(fn)
        out(f"{name}.{sub}", ms, tflops=round(f / ms / 1e9, 1))
    # The like-for-like weight gradient: accumulate into an fp32 main grad
    # (Megatron's gradient_accumulation_fusion), when this torch has out_dtype.
    main_grad = torch.zeros(fout, fin, device=dev, dtype=torch.float32)
    try:
        torch.addmm(main_grad, dy.t(), x, out_dtype=torch.float32)
        fn = lambda: torch.addmm(main_grad, dy.t(), x, out_dtype=torch.float32)
        tag = "dw_fp32acc_addmm_out_dtype"
    except (TypeError, RuntimeError):
        fn = lambda: main_grad.add_(torch.matmul(dy.t(), x))
        tag = "dw_fp32acc_matmul_then_add"
    ms = time_ms(fn)
    out(f"{name}.{tag}", ms, tflops=round(f / ms / 1e9, 1))


def main():
    quick = "--quick" in sys.argv
    print(json.dumps({"torch": torch.__version__,
                      "device": torch.cuda.get_device_name()}), flush=True)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    linear("gemm.mlp_up_1024x3584", D, I)
    linear("gemm.mlp_gateup_1024x7168", D, 2 * I)
    linear("gemm.mlp_down_3584x1024", I, D)
    linear("gemm.gdn_qkv_1024x6144", D, 6144)
    linear("gemm.gdn_out_2048x1024", 2048, D)

    # Tied LM head + CE on full logits, forward + backward.
    h = (torch.randn(T, D, device=dev, dtype=torch.bfloat16)).requires_grad_()
    w = (0.05 * torch.randn(V, D, device=dev, dtype=torch.bfloat16)).requires_grad_()
    labels = torch.randint(0, V, (T,), device=dev)

    def ce_fwd_bwd():
        h.grad = None
        w.grad = None
        logits = h @ w.t()
        loss = torch.nn.functional.cross_entropy(logits.float(), labels,
                                                 reduction="sum") / T
        loss.backward()

    def ce_fwd():
        with torch.no_grad():
            logits = h @ w.t()
            return torch.nn.functional.cross_entropy(logits.float(), labels,
                                                     reduction="sum")

    ce_fwd_bwd()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    ce_fwd_bwd()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    ms = time_ms(ce_fwd_bwd, 2, 7)
    out("ce.fwd_bwd_full_logits", ms, extra_peak_mib=peak >> 20)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    ce_fwd()
    peak = torch.cuda.max_memory_allocated() - base
    out("ce.fwd_full_logits", time_ms(ce_fwd, 2, 7), extra_peak_mib=peak >> 20)
    del h, w, labels
    torch.cuda.empty_cache()

    # AdamW fused over 0.75B fp32 parameters (one flat tensor; no bf16 copy).
    n = 752_000_000
    p = torch.nn.Parameter(torch.randn(n, device=dev))
    p.grad = 1e-3 * torch.randn(n, device=dev)
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, fused=True)
    ms = time_ms(opt.step, 2, 9)
    out("adamw_752M_fused", ms, gbps=round(28.0 * n / ms / 1e6, 1))
    ms = time_ms(lambda: torch.linalg.vector_norm(p.grad), 2, 9)
    out("gradnorm_752M_vector_norm", ms, gbps=round(4.0 * n / ms / 1e6, 1))


if __name__ == "__main__":
    main()
