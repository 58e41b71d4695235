#!/usr/bin/env python3
#===- gpu_tensor_parallel.py - tensor parallelism on the GPU --------------===#
#
# `build` compiles, here, the arms below from one model (tiny-hybrid-gpu in
# gpu-check.sh); `run` runs them, on the GPU machine (or on the host backend
# for the bundle's self-test), in the folder they were built into:
#
#   tp1            one rank, no tensor parallelism (the reference)
#   tp2            --tensor-parallel=2
#   tp2sp          --tensor-parallel=2 --sequence-parallel
#   tp2sp-placed   the same with gdn_core_attn offloaded and gdn_norm_out
#                  recomputed (the Megatron-LM feature's scenario)
#   tp2pp2sp       --tensor-parallel=2 --sequence-parallel
#                  --pipeline-parallel=2 (4 ranks)
#   tp2sp-tied     tp2sp compiled with --tied-grad-parts (the reference of
#                  tp2pp2sp)
#   tp1-tied       tp1 with --tied-grad-parts (the reference of pp2)
#   pp2            --pipeline-parallel=2 (2 ranks)
#   pp2-placed     pp2 with tp2sp-placed's placement
#
# With one GPU the ranks share it through --comm mpi-staged (MPI on device
# buffers staged through pinned memory): bits and peaks, not speed; on two
# or more GPUs --comm auto is NCCL. Checks:
# the tensor-parallel ranks report the same loss and grad norm; tp2 and
# tp2sp are within BOUND of tp1 (bf16: the row-parallel sums round their
# two partial products apart); tp2sp-placed has tp2sp's fingerprints on
# every rank, copies both ways for each offloaded scope and an empty pinned
# pool; tp2pp2sp has tp2sp-tied's loss and grad norm bitwise on every rank
# (the grad norm is one running sum over the blocks' partials continued
# from stage to stage, on the GPU too), and so has pp2 against tp1-tied;
# pp2-placed has pp2's fingerprints per stage, with copies as above. Prints
# one line per arm (loss, grad norm, measured and planned device peak per
# rank, and on a GPU each rank's own process peak from nvidia-smi) and PASS
# or FAIL.
#
#===------------------------------------------------------------------------===#
import json
import os
import subprocess
import sys

from e2echeck import GpuProcessMemory, prebuilt_cli, run_group

# Relative difference of loss and grad norm against one rank, bf16.
BOUND = {"loss": 2e-3, "grad_norm": 3e-2}
PLACED_SCOPES = ("gdn_core_attn",)


PLACED = ["--offload-modules=gdn_core_attn", "--recompute-modules=gdn_norm_out",
          "--hide-rule=off"]
TP2SP = ["--tensor-parallel=2", "--sequence-parallel"]
ARMS = [("tp1", 1, []), ("tp2", 2, ["--tensor-parallel=2"]),
        ("tp2sp", 2, TP2SP), ("tp2sp-placed", 2, TP2SP + PLACED),
        ("tp2sp-tied", 2, TP2SP + ["--tied-grad-parts"]),
        ("tp2pp2sp", 4, TP2SP + ["--pipeline-parallel=2"]),
        ("tp1-tied", 1, ["--tied-grad-parts"]),
        ("pp2", 2, ["--pipeline-parallel=2"]),
        ("pp2-placed", 2, ["--pipeline-parallel=2"] + PLACED)]


def build(args):
    os.makedirs(args.dir, exist_ok=True)
    for name, _, flags in ARMS:
        cmd = [args.compile, args.model, "--seq", str(args.seq),
               "--micro-batches", str(args.micro_batches or 4),
               "-o", os.path.join(args.dir, name)] + flags
        print("$ " + " ".join(cmd), flush=True)
        if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
            return 1
    return 0


def train(args, name, ranks, steps):
    binary = os.path.join(args.dir, name)
    os.makedirs(args.work, exist_ok=True)
    metrics = os.path.join(args.work, name + ".jsonl")
    for f in os.listdir(args.work):
        if f.startswith(name + ".jsonl"):
            os.remove(os.path.join(args.work, f))
    cmd = [binary, "--device", args.device, "--steps", str(steps),
           "--metrics", metrics, "--fingerprints"]
    if ranks > 1:
        # Unbound: Open MPI binds each of 2 ranks to one core by default,
        # and a rank's host work (the fingerprints' hashing threads, the
        # staged collectives' copies) then shares that core.
        cmd = [args.mpirun, "-np", str(ranks), "--oversubscribe",
               "--allow-run-as-root", "--bind-to", "none", "-x",
               "NCCL_NVLS_ENABLE=0"] + cmd
        if args.comm != "auto":
            cmd += ["--comm", args.comm]
    with GpuProcessMemory(binary) as mem:
        rc = run_group(cmd, args.timeout, log=metrics + ".log")
    if rc != 0:
        with open(metrics + ".log", errors="replace") as f:
            print("FAIL: %s exited %d\n%s" % (name, rc, f.read()[-3000:]))
        return None
    lines = []
    for rank in range(ranks):
        p = metrics + ("" if rank == 0 else ".rank%d" % rank)
        with open(p) as f:
            lines.append([json.loads(l) for l in f if l.strip()])
    last = [rank_lines[-1] for rank_lines in lines]
    print("%-13s ranks %d  loss %s  grad norm %s  peak MiB measured/planned "
          "%s" % (name, ranks, [l["loss"] for l in lines[0]],
                  [round(l["grad_norm"], 6) for l in lines[0]],
                  " ".join("%.1f/%.1f" % (l["device_peak_bytes"] / 2**20,
                                          l["planned_peak_bytes"] / 2**20)
                           for l in last)), flush=True)
    if args.device == "cuda":
        print("%-13s %s" % (name, mem.describe()), flush=True)
    return lines


def run(args):
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)
            print("FAIL: " + what, flush=True)

    out = {name: train(args, name, ranks, args.steps)
           for name, ranks, _ in ARMS
           if not args.arms or name in args.arms.split(",")}
    for name, lines in out.items():
        if lines is None:
            failures.append(name + " did not run")
            continue
        for rank, rl in enumerate(lines):
            check(len(rl) == args.steps, "%s rank %d: %d metrics lines" %
                  (name, rank, len(rl)))
            for a, b in zip(lines[0], rl):
                check(a["loss"] == b["loss"] and
                      a["grad_norm"] == b["grad_norm"],
                      "%s rank %d step %d: loss %r / grad norm %r, rank 0 "
                      "%r / %r" % (name, rank, b["step"], b["loss"],
                                   b["grad_norm"], a["loss"], a["grad_norm"]))
    ref = out.get("tp1")
    for name in ("tp2", "tp2sp"):
        if ref and out.get(name):
            worst = {}
            for a, b in zip(ref[0], out[name][0]):
                for key, bound in BOUND.items():
                    d = abs(a[key] - b[key]) / max(abs(a[key]), 1e-30)
                    worst[key] = max(worst.get(key, 0), d)
                    check(d <= bound, "%s step %d: %s %r against %r "
                          "(relative %.3g > %g)" % (name, a["step"], key,
                                                    b[key], a[key], d, bound))
            print("%s against tp1: largest relative difference loss %.3g, "
                  "grad norm %.3g" % (name, worst.get("loss", 0),
                                      worst.get("grad_norm", 0)), flush=True)
    # Every tensor-parallel rank holds a part of every GDN layer; a pipeline
    # stage may hold none.
    for base_name, placed_name, every in (("tp2sp", "tp2sp-placed", True),
                                          ("pp2", "pp2-placed", False)):
        placement_agrees(out, base_name, placed_name, every, check, failures)
    for ref_name, staged_name in (("tp2sp-tied", "tp2pp2sp"),
                                  ("tp1-tied", "pp2")):
        tied, staged = out.get(ref_name), out.get(staged_name)
        if not (tied and staged):
            continue
        for rank, rl in enumerate(staged):
            for a, b in zip(tied[0], rl):
                check(a["loss"] == b["loss"] and
                      a["grad_norm"] == b["grad_norm"],
                      "%s rank %d step %d: loss %r / grad norm %r, %s %r / "
                      "%r" % (staged_name, rank, b["step"], b["loss"],
                              b["grad_norm"], ref_name, a["loss"],
                              a["grad_norm"]))
    print("gpu tensor parallel: %s" %
          ("PASS" if not failures else "FAIL (%d)" % len(failures)))
    return 0 if not failures else 1


def placement_agrees(out, base_name, placed_name, every_rank, check,
                     failures):
    """`placed_name` has `base_name`'s fingerprints on every rank, copies
    each scope it offloads both ways and leaves the pinned pool empty; a
    placed scope is copied on every rank (`every_rank`) or on one at
    least."""
    base, placed = out.get(base_name), out.get(placed_name)
    if base and placed:
        before = len(failures)
        placed_ranks = set()
        for rank in range(len(base)):
            for a, b in zip(base[rank], placed[rank]):
                check(a["fingerprints"] == b["fingerprints"],
                      "%s rank %d step %d: fingerprints differ from %s" %
                      (placed_name, rank, a["step"], base_name))
                check(b["pinned_pool"]["in_use"] == 0,
                      "%s rank %d step %d: pinned pool in use" %
                      (placed_name, rank, b["step"]))
                check(all(c["d2h_count"] == c["h2d_count"]
                          for c in b["transfers"].values()),
                      "%s rank %d step %d: transfers %s" %
                      (placed_name, rank, b["step"], b["transfers"]))
                if any(p in s and c["d2h_count"] > 0
                       for s, c in b["transfers"].items()
                       for p in PLACED_SCOPES):
                    placed_ranks.add(rank)
                for s, c in a["transfers"].items():
                    check(c["d2h_count"] == 0,
                          "%s rank %d: %s copied without placement" %
                          (base_name, rank, s))
        check(placed_ranks == set(range(len(base))) if every_rank
              else bool(placed_ranks),
              "%s: %s copied on ranks %s only" %
              (placed_name, "/".join(PLACED_SCOPES), sorted(placed_ranks)))
        if len(failures) == before:
            print("%s: fingerprints equal to %s on every rank every step; "
                  "offloaded %s" % (placed_name, base_name, ", ".join(
                      sorted(placed[0][0]["transfers"]))), flush=True)


def main():
    args = prebuilt_cli("tensor parallelism on prebuilt binaries", 1024)
    return build(args) if args.mode == "build" else run(args)


if __name__ == "__main__":
    sys.exit(main())
