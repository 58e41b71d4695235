"""Times flash-linear-attention's chunk_gated_delta_rule (fwd, fwd+bwd) at the
Qwen3.5-0.8B GDN shape, from an untracked copy of its source
(third_party_untracked/fla-src, never committed). See bench/notes/gdn.md."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..",
                                "third_party_untracked", "fla-src"))
import torch  # noqa: E402
import triton  # noqa: E402
import fla.ops.common.chunk_o as chunk_o  # noqa: E402
from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: E402

# The FLA version bench/notes/gdn.md names refuses its gated backward on
# Hopper with Triton 3.4..3.7.1 (FLA issue #640); the benchmark overrides the
# guard at run time.
chunk_o.TRITON_ABOVE_3_7_1 = True

print(f"torch {torch.__version__} triton {triton.__version__}")
print(f"{'B':<4} {'T':<5} {'fla_fwd_ms':>10} {'fla_bwd_ms':>10} {'fla_total_ms':>12}")
for B in (1, 2, 4):
    T, H, K, V = 4096, 16, 128, 128
    torch.manual_seed(B)
    dev = "cuda"
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).bfloat16()
    v = torch.randn(B, T, H, V, device=dev).bfloat16()
    g = (-0.005 - 0.3 * torch.rand(B, T, H, device=dev)).float()
    beta = (0.05 + 0.9 * torch.rand(B, T, H, device=dev)).float()
    do = torch.randn(B, T, H, V, device=dev).bfloat16()
    for t in (q, k, v, g, beta):
        t.requires_grad_(True)

    def fwd():
        with torch.no_grad():
            chunk_gated_delta_rule(q, k, v, g, beta, scale=K ** -0.5)

    def fwd_bwd():
        o, _ = chunk_gated_delta_rule(q, k, v, g, beta, scale=K ** -0.5)
        o.backward(do)

    tf = triton.testing.do_bench(fwd, warmup=50, rep=300, return_mode="median")
    tt = triton.testing.do_bench(fwd_bwd, warmup=50, rep=300, return_mode="median")
    print(f"{B:<4} {T:<5} {tf:10.3f} {tt - tf:10.3f} {tt:12.3f}")
