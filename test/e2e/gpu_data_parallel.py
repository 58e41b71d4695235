#!/usr/bin/env python3
#===- gpu_data_parallel.py - data parallelism in the gpu-check bundle -----===#
#
# Replicated data parallelism on prebuilt binaries of one model (gpu-check
# packs them; the GPU machine has no compiler):
#
#   build  here: compiles into DIR the one-rank binary `dp1` (2
#          microbatches), the two-rank binaries `dp2` (1 microbatch each:
#          the same global batch) and `dp2-offload` (gdn_core_attn, core_attn
#          and attn_proj offloaded), and the same two under ZeRO-3
#          (`z2`, `z2-offload`: --data-parallel=zero3, one gather ahead,
#          core_attn and attn_proj offloaded as in the Megatron-FSDP test).
#   run    there: trains each for --steps steps (the two-rank ones under
#          mpirun, --comm as given: auto is NCCL on cuda, mpi-staged stages
#          device buffers through MPI where the ranks share one GPU) and
#          checks: both ranks hold identical bits every step; offload on and
#          off give bitwise-equal per-rank fingerprints (ZeRO-3: each rank
#          its own shards, equal loss and grad norm), every offloaded
#          scope copies both ways each step on every rank (none without
#          offload) and the pinned pool is empty after every step; two ranks
#          against one rank with the same global batch give the same loss
#          and grad norm within REL_BOUND (not bitwise: a grad's
#          contributions are associated differently, docs/tools.md
#          "Running on several ranks").
#
#===------------------------------------------------------------------------===#
import json
import os
import subprocess
import sys

from e2echeck import (GpuProcessMemory, check, exit_status, prebuilt_cli,
                      run_group)

# What a rank may use beyond its plan, as the driver counts the process: the
# CUDA context and cuBLASLt, the reserve `--memory-budget=process:SIZE`
# keeps back for them (support/DeviceReserve.h, processReserveBytes; ranks
# sharing one GPU through mpi-staged have no NCCL buffers).
RESERVE_MIB = 768 + 256
# Per-process device memory of the last multi-rank arm, by arm name.
PROCESS_MIB = {}

# Relative, on loss and grad norm: the host test's fp32 bound (2^-18)
# widened for bf16 activations, whose roundings the two associations of a
# main grad's terms can carry into the next step.
REL_BOUND = 2.0 ** -10
OFFLOAD = "--offload-modules=gdn_core_attn,core_attn,attn_proj"
ZERO3 = ["--data-parallel=zero3", "--gather-max-inflight=1"]


def build(args):
    os.makedirs(args.dir, exist_ok=True)
    arms = [("dp1", ["--micro-batches", "2"]),
            ("dp2", ["--micro-batches", "1", "--data-parallel-size=2"]),
            ("dp2-offload", ["--micro-batches", "1", "--data-parallel-size=2",
                             "--hide-rule=off", OFFLOAD]),
            ("z2", ["--micro-batches", "1", "--data-parallel-size=2"] +
             ZERO3),
            ("z2-offload", ["--micro-batches", "1", "--data-parallel-size=2",
                            "--hide-rule=off",
                            "--offload-modules=core_attn,attn_proj"] +
             ZERO3)]
    for name, flags in arms:
        cmd = [args.compile, args.model, "--seq", str(args.seq),
               "-o", os.path.join(args.dir, name)] + flags
        print("$ " + " ".join(cmd), flush=True)
        if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
            return 1
    return 0


def lines(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def train(args, name, ranks):
    metrics = os.path.join(args.work, name + ".jsonl")
    for f in os.listdir(args.work):
        if f.startswith(name + ".jsonl"):
            os.remove(os.path.join(args.work, f))
    cmd = [os.path.join(args.dir, name), "--steps", str(args.steps),
           "--device", args.device, "--fingerprints", "--metrics", metrics]
    if ranks > 1:
        # Unbound: Open MPI binds each of 2 ranks to one core by default,
        # and a rank's host work (the fingerprints' hashing threads, the
        # staged collectives' copies) then shares that core.
        cmd = [args.mpirun, "-np", str(ranks), "--oversubscribe",
               "--allow-run-as-root", "--bind-to", "none", "-x",
               "NCCL_NVLS_ENABLE=0"] + cmd + \
              ["--comm", args.comm]
    print("$ " + " ".join(cmd), flush=True)
    with GpuProcessMemory(os.path.join(args.dir, name)) as mem:
        rc = run_group(cmd, args.timeout)
    if args.device == "cuda":
        PROCESS_MIB[name] = mem
    if not check(rc == 0, "%s exited %d" % (name, rc)):
        return None
    out = [lines(metrics)]
    for rank in range(1, ranks):
        out.append(lines("%s.rank%d" % (metrics, rank)))
    return out


def close(a, b):
    return abs(a - b) <= REL_BOUND * max(abs(a), abs(b))


def run(args):
    os.makedirs(args.work, exist_ok=True)
    one = train(args, "dp1", 1)
    args.arm_names = {"replicate": ("dp2", "dp2-offload"),
                      "zero3": ("z2", "z2-offload")}
    for mode, (a, b) in args.arm_names.items():
        if os.path.exists(os.path.join(args.dir, a)):
            check_pair(args, one, mode, train(args, a, 2), train(args, b, 2))
        else:
            check(False, "no %s binary in %s" % (a, args.dir))
    return exit_status("data parallel: ranks identical (zero3: loss and "
                       "norm), offload bitwise, one rank within %g" %
                       REL_BOUND)


def check_pair(args, one, mode, off, on):
    """Two ranks of `mode` without and with offload against one rank."""
    if not (one and off and on):
        check(False, "%s: a run failed" % mode)
        return
    sharded = mode == "zero3"
    for what, ranks in ((mode, off), (mode + " offload", on)):
        check(all(len(r) == args.steps for r in ranks),
              "%s: %s steps per rank" % (what, [len(r) for r in ranks]))
        for a, b in zip(ranks[0], ranks[1]):
            check((sharded or a["fingerprints"] == b["fingerprints"]) and
                  a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"],
                  "%s step %d: the ranks differ" % (what, a["step"]))
        for rank, ms in enumerate(ranks):
            for m in ms:
                check(m["pinned_pool"]["in_use"] == 0,
                      "%s rank %d step %d: pinned pool not empty" %
                      (what, rank, m["step"]))
    for rank in range(2):
        for a, b in zip(off[rank], on[rank]):
            check(a["fingerprints"] == b["fingerprints"],
                  "%s rank %d step %d: offload changed the bits" %
                  (mode, rank, a["step"]))
            check(all(c["d2h_count"] == 0 for c in a["transfers"].values()),
                  "rank %d step %d: copies without offload" %
                  (rank, a["step"]))
            check(b["transfers"] and all(
                c["d2h_count"] > 0 and c["d2h_count"] == c["h2d_count"]
                for c in b["transfers"].values()),
                  "rank %d step %d: an offloaded scope did not copy both "
                  "ways: %s" % (rank, b["step"], b["transfers"]))
    for a, b in zip(one[0], off[0]):
        check(close(a["loss"], b["loss"]) and
              close(a["grad_norm"], b["grad_norm"]),
              "step %d: one rank loss %r grad norm %r, two ranks %r %r" %
              (a["step"], a["loss"], a["grad_norm"], b["loss"],
               b["grad_norm"]))
    print("losses: one rank %s, two ranks (%s) %s" %
          ([m["loss"] for m in one[0]], mode, [m["loss"] for m in off[0]]))
    # Ranks sharing one GPU (mpi-staged) each see both processes' memory in
    # device_peak_bytes; nvidia-smi's per-process numbers are each rank's.
    for what, name, ranks in ((mode, args.arm_names[mode][0], off),
                              (mode + " offload", args.arm_names[mode][1],
                               on)):
        planned = [r[-1].get("planned_peak_bytes") for r in ranks]
        print("%s device peak per rank %s, planned %s bytes" %
              (what, [r[-1].get("device_peak_bytes") for r in ranks],
               planned))
        mem = PROCESS_MIB.get(name)
        if mem is None:
            continue
        print("%s %s" % (what, mem.describe()), flush=True)
        # The ranks' plans are equal here, so the largest process is held
        # to it when the driver's pids cannot be told apart by rank.
        if mem.largest() and all(planned):
            check(mem.largest() <= max(planned) / 2**20 + RESERVE_MIB,
                  "%s: a rank's process peak %d MiB is above the plan %.0f "
                  "MiB + %d MiB reserve" % (what, mem.largest(),
                                            max(planned) / 2**20,
                                            RESERVE_MIB))


def main():
    args = prebuilt_cli("replicated data parallelism on prebuilt binaries", 4096)
    return build(args) if args.mode == "build" else run(args)


if __name__ == "__main__":
    sys.exit(main())
