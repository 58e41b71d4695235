#!/usr/bin/env python3
#===- check_swiglu.py - a binary with a Triton kernel against the library ---===#
#
# Runs on the GPU machine (python3 only): a training binary compiled with
# --triton-kernel=OUT/manifest.json (make_swiglu.py's SwiGLU) and the same
# model compiled without it, STEPS steps each on the cuda backend, and
# checks that the Triton binary launched its kernel every step
# (generated_launches) and that its losses and grad norms stay within the
# bf16 element-wise bound of the library binary's: Triton's silu uses the
# approximate exp2, so outputs differ from the library's in the last bf16
# bit, not more.
#
#   python3 bench/triton/check_swiglu.py LIB_BINARY TRITON_BINARY [--steps N]
#
# Exit 0 when every check holds, 1 otherwise; prints one line per step.
#
#===------------------------------------------------------------------------===#
import argparse
import json
import subprocess
import sys

LOSS_TOL = 2e-3       # relative, per step
GRAD_NORM_TOL = 2e-2  # relative, per step


def run(binary, steps, metrics):
    cmd = [binary, "--device", "cuda", "--steps", str(steps), "--metrics",
           metrics]
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-2000:] + r.stderr[-2000:])
        sys.exit("check_swiglu: %s exited %d" % (binary, r.returncode))
    with open(metrics) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser(description="A binary with a Triton kernel against the library binary on the GPU.")
    ap.add_argument("library")
    ap.add_argument("triton")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    lib = run(args.library, args.steps, "lib.jsonl")
    tri = run(args.triton, args.steps, "triton.jsonl")
    bad = 0
    if len(lib) != args.steps or len(tri) != args.steps:
        print("FAIL: %d / %d metrics lines, expected %d" %
              (len(lib), len(tri), args.steps))
        return 1
    for a, b in zip(lib, tri):
        launches = b.get("generated_launches", 0)
        rl = abs(a["loss"] - b["loss"]) / abs(a["loss"])
        rg = abs(a["grad_norm"] - b["grad_norm"]) / abs(a["grad_norm"])
        ok = launches > 0 and rl <= LOSS_TOL and rg <= GRAD_NORM_TOL
        bad += not ok
        print("step %d: loss %.6f vs %.6f (relative %.1e), grad norm %.5f vs "
              "%.5f (relative %.1e), %d Triton launches: %s" %
              (a["step"], b["loss"], a["loss"], rl, b["grad_norm"],
               a["grad_norm"], rg, launches, "ok" if ok else "FAIL"))
    print("PASS" if not bad else "FAIL: %d step(s) out of bounds" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
