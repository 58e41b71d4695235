#!/usr/bin/env python3
#===- tsan_offload.py - the generated step under ThreadSanitizer -----------===#
#
# The host backend runs streams as worker threads; the offload schedule's
# events are what keeps them from racing. This compiles the tiny hybrid
# model with offload (gdn_core_attn, core_attn, attn_proj; hide rule off),
# keeps the generated source, rebuilds it with -fsanitize=thread against the
# ThreadSanitizer build of the runtime and reference kernels, and runs 2
# steps: exit 0, no ThreadSanitizer report, a finite loss, transfers > 0.
#
#===------------------------------------------------------------------------===#
import argparse
import json
import math
import os
import subprocess
import sys


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--cxx", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--tsan-lib", required=True)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    ref = os.path.join(args.work, "train-offload")
    cmd = [args.compile, args.model, "--seq", "64", "--micro-batches", "2",
           "--offload-modules=gdn_core_attn,core_attn,attn_proj",
           "--hide-rule=off", "--keep-source", "-o", ref]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        fail("actplace-compile: " + r.stdout + r.stderr)
    binary = os.path.join(args.work, "train-tsan")
    cmd = [args.cxx, "-std=c++17", "-g", "-O1", "-fsanitize=thread",
           "-I" + args.src, ref + ".cpp", "-o", binary, args.tsan_lib,
           "-lpthread", "-ldl"]
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        fail("TSan build: " + r.stdout + r.stderr)
    metrics = os.path.join(args.work, "tsan.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1")
    r = subprocess.run([binary, "--steps", "2", "--device", "host",
                        "--fingerprints", "--metrics", metrics],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0 or "ThreadSanitizer" in r.stderr:
        print(r.stderr[-20000:])
        fail("TSan run exited %d" % r.returncode)
    with open(metrics) as f:
        lines = [json.loads(l) for l in f if l.strip()]
    if len(lines) != 2:
        fail("expected 2 metrics lines, got %d" % len(lines))
    for m in lines:
        if m["loss"] is None or not math.isfinite(m["loss"]):
            fail("step %d: loss not finite" % m["step"])
        if m["pinned_pool"]["in_use"] != 0:
            fail("step %d: pinned pool in use" % m["step"])
        if not m["transfers"] or any(c["d2h_count"] == 0 or
                                     c["h2d_count"] != c["d2h_count"]
                                     for c in m["transfers"].values()):
            fail("step %d: transfers %s" % (m["step"], m["transfers"]))
    print("PASS: 2 offload steps under ThreadSanitizer, no report")


if __name__ == "__main__":
    main()
