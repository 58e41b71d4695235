#!/usr/bin/env python3
#===- gpu_bitident.py - placements change no bit, on the GPU ---------------===#
#
# The GPU machine has no compiler (libMLIR cannot travel), so the check runs
# in two phases:
#
#   build  (here)   actplace-compile one model under several placements
#                   ("arms") into DIR, stripped, with each arm's flags and
#                   planned peak in DIR/arms.json;
#   run    (there)  train every arm N steps with --fingerprints on --device
#                   cuda (or host) and check, as placements_bitident.py does
#                   on the host backend: exit 0, one metrics line for each
#                   step asked for (steps 1..N), each recording the backend
#                   asked for, finite losses, pinned pool
#                   empty after every step, fingerprints (loss, grads, params,
#                   optimizer) equal to the first arm's step by step, every
#                   offloaded scope with d2h == h2d > 0 copies and bytes in
#                   every step, none without offload, and the planned peak
#                   of an offload arm below the first arm's. Prints one table
#                   (step time median over steps after the first, tokens/s,
#                   planned and measured device peak, pinned pool, bytes each
#                   way) and writes the raw metrics as JSONL into --out.
#
#   gpu_bitident.py build --compile BIN --model M.json --dir D [--seq N]
#       [--micro-batches K] [--arm NAME=FLAGS]... [--cpp-arm NAME]...
#       (binaries are built through LLVM; --cpp-arm NAME also builds arm
#       cpp-NAME from the placement's readable C++, --emit=cpp)
#   gpu_bitident.py run --dir D [--steps 3] [--device cuda] [--out DIR]
#
# Exit status 1 with a FAIL line on the first violated check.
#
#===------------------------------------------------------------------------===#
import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys

DEFAULT_ARMS = [
    ("none", ""),
    ("gdn_core_attn", "--offload-modules=gdn_core_attn"),
    ("gdn_core_attn+recompute",
     "--offload-modules=gdn_core_attn --recompute-modules=gdn_norm_out"),
]


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def build(args):
    os.makedirs(args.dir, exist_ok=True)
    arms = [tuple(a.split("=", 1)) for a in args.arm] or DEFAULT_ARMS
    meta = {"model": os.path.basename(args.model), "seq": args.seq,
            "micro_batches": args.micro_batches, "arms": []}
    for name, flags in arms:
        binary = os.path.join(args.dir, "train-" + name)
        cmd = ([args.compile, args.model, "-o", binary, "--seq", str(args.seq),
                "--micro-batches", str(args.micro_batches)] +
               shlex.split(flags))
        print("$ " + " ".join(cmd), flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            fail("actplace-compile failed for arm " + name)
        peak = None
        for line in r.stdout.splitlines():
            if line.startswith(("predicted ", "planned peak", "decisions",
                                "transfers per step")):
                print("  " + line)
            if line.startswith("planned peak: arena "):
                peak = int(line.split()[3])
        if peak is None:
            fail("actplace-compile printed no planned peak for " + name)
        subprocess.run(["strip", binary], check=True)
        meta["arms"].append({"name": name, "flags": flags,
                             "planned_arena_bytes": peak,
                             "offload": "--offload-modules" in flags})
        if name in args.cpp_arm:
            # The same placement built from its readable C++ (--emit=cpp,
            # with the command actplace-compile prints): another arm, so
            # run compares its bits with the LLVM-built ones.
            source = os.path.join(args.dir, "cpp-" + name + ".cpp")
            cbin = os.path.join(args.dir, "train-cpp-" + name)
            cmd = ([args.compile, args.model, "-o", source, "--emit=cpp",
                    "--seq", str(args.seq), "--micro-batches",
                    str(args.micro_batches)] + shlex.split(flags))
            r = subprocess.run(cmd, capture_output=True, text=True)
            lines = [l[len("build it with: "):] for l in r.stdout.splitlines()
                     if l.startswith("build it with: ")]
            if r.returncode != 0 or len(lines) != 1:
                print(r.stdout + r.stderr)
                fail("--emit=cpp failed for arm " + name)
            build_cmd = lines[0].replace(" -o BINARY ", " -o %s " %
                                         shlex.quote(cbin))
            print("$ " + build_cmd, flush=True)
            r = subprocess.run(build_cmd, shell=True, capture_output=True,
                               text=True)
            if r.returncode != 0:
                print(r.stdout + r.stderr)
                fail("the C++ build of arm " + name + " failed")
            os.remove(source)
            subprocess.run(["strip", cbin], check=True)
            meta["arms"].append({"name": "cpp-" + name, "flags": flags,
                                 "planned_arena_bytes": peak,
                                 "offload": "--offload-modules" in flags})
    with open(os.path.join(args.dir, "arms.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("built %d arms into %s" % (len(arms), args.dir))


def run(args):
    with open(os.path.join(args.dir, "arms.json")) as f:
        meta = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    runs = {}
    for arm in meta["arms"]:
        name = arm["name"]
        metrics = os.path.join(args.out, "%s-%s.jsonl" %
                               (meta["model"].replace(".json", ""), name))
        if os.path.exists(metrics):
            os.remove(metrics)
        cmd = [os.path.join(args.dir, "train-" + name), "--steps",
               str(args.steps), "--device", args.device, "--fingerprints",
               "--metrics", metrics]
        print("$ " + " ".join(cmd), flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write(r.stderr[-2000:])
        if r.returncode != 0:
            print(r.stdout[-4000:])
            fail("arm %s exited with %d" % (name, r.returncode))
        with open(metrics) as f:
            lines = [json.loads(l) for l in f if l.strip()]
        if len(lines) != args.steps:
            fail("arm %s wrote %d metrics lines, expected %d" %
                 (name, len(lines), args.steps))
        steps = [m.get("step") for m in lines]
        if steps != list(range(1, args.steps + 1)):
            fail("arm %s: metrics lines for steps %s, expected 1..%d" %
                 (name, steps, args.steps))
        for m in lines:
            if m.get("backend") != args.device:
                fail("arm %s step %s ran on backend %r (device %r), not %s" %
                     (name, m.get("step"), m.get("backend"), m.get("device"),
                      args.device))
        runs[name] = lines

    first = meta["arms"][0]
    base = runs[first["name"]]
    for arm in meta["arms"]:
        name = arm["name"]
        for m in runs[name]:
            if m["loss"] is None or not math.isfinite(m["loss"]):
                fail("%s step %d: loss not finite" % (name, m["step"]))
            if m["pinned_pool"]["in_use"] != 0:
                fail("%s step %d: pinned pool in use" % (name, m["step"]))
            for scope, c in m["transfers"].items():
                moved = c["d2h_count"] or c["h2d_count"]
                if not arm["offload"] and moved:
                    fail("%s step %d: scope %s copied without offload" %
                         (name, m["step"], scope))
                if arm["offload"] and not (
                        c["d2h_count"] > 0 and
                        c["d2h_count"] == c["h2d_count"] and
                        c["d2h_bytes"] > 0 and
                        c["d2h_bytes"] == c["h2d_bytes"]):
                    fail("%s step %d: scope %s counters %s" %
                         (name, m["step"], scope, c))
            if arm["offload"] and not m["transfers"]:
                fail("%s step %d: no offload scope" % (name, m["step"]))
        for a, b in zip(base, runs[name]):
            if a["fingerprints"] != b["fingerprints"]:
                fail("step %d: fingerprints of %s differ from %s:\n  %s\n  %s"
                     % (a["step"], name, first["name"], a["fingerprints"],
                        b["fingerprints"]))
        if arm["offload"] and not (arm["planned_arena_bytes"] <
                                   first["planned_arena_bytes"]):
            fail("%s: planned arena %d is not below %s's %d" %
                 (name, arm["planned_arena_bytes"], first["name"],
                  first["planned_arena_bytes"]))

    mib = 1 << 20
    print("\n%s, seq %s, %s microbatches, %d steps on %s; times are medians "
          "of steps 2..%d" % (meta["model"], meta["seq"],
                              meta["micro_batches"], args.steps, args.device,
                              args.steps))
    hdr = ("arm", "step ms", "range ms", "tokens/s", "planned MiB",
           "measured MiB", "pinned bufs", "pinned MiB", "d2h MiB", "h2d MiB",
           "copies")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    base_ms = None
    for arm in meta["arms"]:
        lines = runs[arm["name"]]
        steady = lines[1:] or lines
        ms = [1e3 * m["step_time_s"] for m in steady]
        med = statistics.median(ms)
        if base_ms is None:
            base_ms = med
        last = lines[-1]
        d2h = sum(c["d2h_bytes"] for c in last["transfers"].values())
        h2d = sum(c["h2d_bytes"] for c in last["transfers"].values())
        copies = sum(c["d2h_count"] for c in last["transfers"].values())
        print("| %s | %.1f (%+.2f%%) | %.1f-%.1f | %.0f | %.1f | %.1f | %d | "
              "%.1f | %.1f | %.1f | %d |" %
              (arm["name"], med, 100 * (med / base_ms - 1), min(ms), max(ms),
               statistics.median(m["tokens_per_s"] for m in steady),
               last["planned_peak_bytes"] / mib,
               max(m["device_peak_bytes"] for m in lines) / mib,
               last["pinned_pool"]["buffers"],
               last["pinned_pool"]["bytes"] / mib, d2h / mib, h2d / mib,
               copies))
    print("losses: " + "; ".join(
        "%s %s" % (n, [round(m["loss"], 5) for m in runs[n]]) for n in runs))
    print("PASS: %d arms bit-identical over %d steps" %
          (len(meta["arms"]), args.steps))


def main():
    ap = argparse.ArgumentParser(
        description="placements change no bit: compile here, run on the GPU")
    sub = ap.add_subparsers(dest="phase", required=True)
    b = sub.add_parser("build", help="compile the arms (needs the compiler)")
    b.add_argument("--compile", required=True, help="actplace-compile")
    b.add_argument("--model", required=True)
    b.add_argument("--dir", required=True)
    b.add_argument("--seq", type=int, default=4096)
    b.add_argument("--micro-batches", type=int, default=4)
    b.add_argument("--cpp-arm", action="append", default=[],
                   help="also build this arm from its --emit=cpp C++ "
                        "(arm cpp-NAME): its bits must equal the others'")
    b.add_argument("--arm", action="append", default=[],
                   help="NAME=FLAGS (repeatable; the first is the baseline)")
    r = sub.add_parser("run", help="train the arms and compare")
    r.add_argument("--dir", required=True)
    r.add_argument("--steps", type=int, default=3)
    r.add_argument("--device", default="cuda")
    r.add_argument("--out", default=".")
    args = ap.parse_args()
    build(args) if args.phase == "build" else run(args)


if __name__ == "__main__":
    main()
