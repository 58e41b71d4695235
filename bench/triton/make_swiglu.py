#!/usr/bin/env python3
#===- make_swiglu.py - a Triton SwiGLU kernel for --triton-kernel ----------===#
#
# Runs where Triton 3.x is installed (the GPU machine: Triton 3.6, no GPU
# needed to compile): compiles a SwiGLU forward kernel, y = silu(g) * u in
# bf16 with f32 math, for sm_90 and writes what actplace-compile's
# --triton-kernel takes into OUT: the PTX, the metadata JSON in the shape
# Triton writes to its cache, and a manifest mapping train.swiglu's buffers
# to the kernel's parameters.
#
#   python3 bench/triton/make_swiglu.py OUT
#   actplace-compile MODEL.json --triton-kernel=OUT/manifest.json -o train
#
# The kernel computes silu as g / (1 + exp(-g)) through Triton's exp, so it
# is checked against the reference within the bf16 element-wise bound, not
# bitwise.
#
#===------------------------------------------------------------------------===#
import json
import os
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BLOCK = 1024


@triton.jit
def swiglu_fwd_kernel(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask).to(tl.float32)
    y = (g / (1.0 + tl.exp(-g))) * u
    tl.store(y_ptr + offs, y.to(tl.bfloat16), mask=mask)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "triton-swiglu"
    os.makedirs(out, exist_ok=True)
    src = ASTSource(fn=swiglu_fwd_kernel,
                    signature={"g_ptr": "*bf16", "u_ptr": "*bf16",
                               "y_ptr": "*bf16", "n": "i32",
                               "BLOCK": "constexpr"},
                    constexprs={"BLOCK": BLOCK})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4})
    name = k.metadata.name
    with open(os.path.join(out, name + ".ptx"), "w") as f:
        f.write(k.asm["ptx"])
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(k.metadata._asdict(), f, default=vars)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"op": "train.swiglu", "metadata": name + ".json",
                   "args": ["in0", "in1", "out0", "n"],
                   "grid": ["cdiv(n, %d)" % BLOCK, 1, 1]}, f)
    print("wrote %s/{%s.ptx,%s.json,manifest.json} (triton %s)" %
          (out, name, name, triton.__version__))


if __name__ == "__main__":
    main()
