#!/usr/bin/env python3
#===- placements_bitident.py - offload/recompute change no bit -------------===#
#
# Compiles the tiny hybrid model with actplace-compile five times (no
# offload; offload of gdn_core_attn, core_attn, attn_proj with the hide rule
# off, at fraction 1 and 0.5; recompute of gdn_norm_out; offload and
# recompute together; SwiGLU, RMSNorm and gated RMSNorm recompute fused
# into their backward and as clones), trains each for 6 steps on the host
# backend with --fingerprints, and checks (docs/architecture.md section 7):
#   - every step's loss is finite and the binaries exit 0;
#   - the fingerprints of loss, grads, params and optimizer state are equal
#     across the binaries, step by step, and equal to the committed golden
#     fingerprints (golden/tiny-hybrid-host.json) when --golden is given;
#   - with offload every offloaded scope has d2h_count == h2d_count > 0 and
#     positive bytes in every step; without offload every count is 0; at
#     fraction 0.5 a proper subset of the fraction-1 scopes is offloaded;
#   - the pinned pool has 0 bytes in use after every step;
#   - 6 continuous steps equal 3 steps + --save + --resume (in the offload
#     binary) + 3 steps, bitwise; a missing checkpoint is an error;
#   - --op-times writes per-label kernel times of steps 2..N in both modes
#     (stream: timers in stream order, changes no bit; wait: each launch
#     waited for), the same launches in each;
#   - a diverging run (--lr 1e30) stops with exit 3 at its first step that
#     is not finite, and an unknown flag exits non-zero;
#   - 50 steps on byte-level text lower the loss;
#   - with frozen parameters, offload still changes no bit;
#   - the loss and its gradient as two ops (--fuse-loss-grad=false) give
#     the bits of the default fused op, whose binary has one LM head
#     launch per microbatch where the unfused one has two;
#   - recompute on the side stream (--recompute-stream=side) gives the
#     same bits, and its binary launches kernels on the side stream;
#   - binaries are built through the LLVM dialect; five placements built
#     from their readable C++ (--emit=cpp, the printed build command) give
#     the same bits as the LLVM-built ones.
#
#===------------------------------------------------------------------------===#
import argparse
import json
import math
import os
import subprocess
import sys

STEPS = 6
COMMON = ["--seq", "64", "--micro-batches", "2"]
VARIANTS = {
    "none": [],
    "offload": ["--offload-modules=gdn_core_attn,core_attn,attn_proj",
                "--hide-rule=off"],
    "recompute": ["--recompute-modules=gdn_norm_out"],
    "fraction": ["--offload-modules=gdn_core_attn,core_attn,attn_proj",
                 "--hide-rule=off", "--fraction=0.5"],
    "both": ["--offload-modules=gdn_core_attn,core_attn,attn_proj",
             "--hide-rule=off", "--recompute-modules=gdn_norm_out"],
    # The loss and its gradient as two ops (a second logits pass), not the
    # default fused one: the same bits.
    "unfused-loss": ["--fuse-loss-grad=false"],
    # SwiGLU recomputed inside its backward kernel (train-fuse-recompute,
    # the default) and by a separate clone: the same bits as keeping it.
    "recompute-mlp": ["--recompute-modules=mlp_act,mlp_norm,gdn_norm_out",
                      "--keep-source"],
    "recompute-mlp-clone": ["--recompute-modules=mlp_act,mlp_norm,gdn_norm_out",
                            "--fuse-recompute=false", "--keep-source"],
    # Recompute issued ahead on the side stream (train-recompute-stream):
    # layer 0's in_proj and gdn_prep recompute beside its GDN chunk
    # backward, with offload in the same step; the same bits. Side work
    # enqueued where its run sits, right before the chunk backward.
    "recompute-side": ["--recompute-modules=gdn_in_proj,gdn_prep,mlp_fc1",
                       "--recompute-stream=side",
                       "--offload-modules=core_attn", "--hide-rule=off",
                       "--side-issue=with-run", "--keep-source"],
    # Same, with the side work enqueued after the kernel it overlaps
    # (exec-defer-side-issue, the default; the program then also asks the
    # runtime to hold it until that kernel's first launch): only the
    # host's issue order differs.
    "recompute-side-after-host": [
        "--recompute-modules=gdn_in_proj,gdn_prep,mlp_fc1",
        "--recompute-stream=side", "--offload-modules=core_attn",
        "--hide-rule=off", "--keep-source"],
}
WITH_OFFLOAD = ("offload", "fraction", "both")
# Placements also built from their readable C++ (--emit=cpp), compared
# with the LLVM-built binaries bit for bit.
CPP_PATH = ("none", "offload", "recompute", "both", "recompute-side")
OFFLOADED_LEAVES = ("gdn_core_attn", "core_attn", "attn_proj")


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--import-tool", required=True)
    ap.add_argument("--golden",
                    help="committed fingerprints every placement must equal")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)

    runs = {}
    peaks = {}
    for name, flags in VARIANTS.items():
        binary = os.path.join(args.work, "train-" + name)
        cmd = [args.compile, args.model, "-o", binary] + COMMON + flags
        print("$ " + " ".join(cmd), flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        print(r.stdout + r.stderr, flush=True)
        if r.returncode != 0:
            fail("actplace-compile failed for " + name)
        for l in r.stdout.splitlines():
            if l.startswith("planned peak: arena "):
                peaks[name] = int(l.split()[3])
        if name not in peaks:
            fail("actplace-compile printed no planned peak for " + name)
        metrics = os.path.join(args.work, name + ".jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        cmd = [binary, "--steps", str(STEPS), "--device", "host",
               "--fingerprints", "--metrics", metrics]
        print("$ " + " ".join(cmd), flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            fail(name + " binary exited with " + str(r.returncode))
        with open(metrics) as f:
            lines = [json.loads(l) for l in f if l.strip()]
        if len(lines) != STEPS:
            fail("%s wrote %d metrics lines, expected %d" %
                 (name, len(lines), STEPS))
        runs[name] = lines

    for name, lines in runs.items():
        for m in lines:
            if m["loss"] is None or not math.isfinite(m["loss"]):
                fail("%s step %d: loss not finite" % (name, m["step"]))
            if m["pinned_pool"]["in_use"] != 0:
                fail("%s step %d: pinned pool in use" % (name, m["step"]))
            fp = m.get("fingerprints")
            if not fp or any(len(fp[k]) != 64 for k in
                             ("loss", "grads", "params", "optimizer")):
                fail("%s step %d: missing fingerprints" % (name, m["step"]))
        print("%-9s losses %s" % (name, [m["loss"] for m in lines]))

    base = runs["none"]
    for name in VARIANTS:
        for a, b in zip(base, runs[name]):
            if a["fingerprints"] != b["fingerprints"]:
                fail("step %d: fingerprints of '%s' differ from no offload:"
                     "\n  %s\n  %s" % (a["step"], name, a["fingerprints"],
                                       b["fingerprints"]))
            if a["loss"] != b["loss"]:
                fail("step %d: loss of '%s' differs" % (a["step"], name))

    # Equal across placements is not enough: a change that moved every
    # placement's bits together (a kernel, the emitter, the runtime) must
    # show too. The golden file was taken before such restructuring.
    if args.golden:
        with open(args.golden) as f:
            golden = json.load(f)
        if golden["compile_flags"] != COMMON:
            fail("golden file %s was taken with %s, this test compiles with %s"
                 % (args.golden, golden["compile_flags"], COMMON))
        if len(golden["steps"]) != STEPS:
            fail("golden file %s has %d steps, this test runs %d" %
                 (args.golden, len(golden["steps"]), STEPS))
        for name in VARIANTS:
            for g, m in zip(golden["steps"], runs[name]):
                if g["fingerprints"] != m["fingerprints"]:
                    fail("step %d of '%s' differs from the golden fingerprints"
                         " in %s:\n  golden %s\n  now    %s" %
                         (m["step"], name, args.golden, g["fingerprints"],
                          m["fingerprints"]))
        print("golden: %d placements x %d steps equal %s" %
              (len(VARIANTS), STEPS, os.path.basename(args.golden)))

    # Binaries are built through the LLVM dialect; the readable C++ of the
    # same step (--emit=cpp), built with the command actplace-compile
    # prints, trains to the same bits.
    for name in CPP_PATH:
        source = os.path.join(args.work, "cpp-" + name + ".cpp")
        binary = os.path.join(args.work, "cpp-" + name)
        cmd = ([args.compile, args.model, "-o", source, "--emit=cpp"] +
               COMMON + VARIANTS[name])
        r = subprocess.run(cmd, capture_output=True, text=True)
        build = [l[len("build it with: "):] for l in r.stdout.splitlines()
                 if l.startswith("build it with: ")]
        if r.returncode != 0 or len(build) != 1 or " -o BINARY " not in build[0]:
            fail("--emit=cpp for %s: rc %d, no build command:\n%s%s" %
                 (name, r.returncode, r.stdout, r.stderr))
        build = build[0].replace(" -o BINARY ", " -o '%s' " % binary)
        r = subprocess.run(build, shell=True, capture_output=True, text=True)
        if r.returncode != 0:
            fail("the printed build of %s failed:\n%s\n%s%s" %
                 (name, build, r.stdout, r.stderr))
        metrics = os.path.join(args.work, "cpp-" + name + ".jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        r = subprocess.run([binary, "--steps", str(STEPS), "--device", "host",
                            "--fingerprints", "--metrics", metrics],
                           capture_output=True, text=True)
        if r.returncode != 0:
            fail("C++-built %s exited with %d: %s" %
                 (name, r.returncode, r.stderr))
        with open(metrics) as f:
            lines = [json.loads(l) for l in f if l.strip()]
        if len(lines) != STEPS:
            fail("C++-built %s wrote %d metrics lines" % (name, len(lines)))
        for a, b in zip(runs[name], lines):
            if a["fingerprints"] != b["fingerprints"] or a["loss"] != b["loss"]:
                fail("step %d of '%s': the LLVM-built binary and the one built"
                     " from its C++ differ:\n  llvm %s\n  c++  %s" %
                     (a["step"], name, a["fingerprints"], b["fingerprints"]))
    print("LLVM path = C++ path: %d placements x %d steps" %
          (len(CPP_PATH), STEPS))

    # The fused binary rebuilds each SwiGLU and each mlp_norm in its
    # backward launch: one SwiGLU forward launch per MLP layer where the
    # clone binary has two, one RMSNorm forward launch fewer per MLP layer
    # than the clone binary, the same backward launches.
    def launches(name, op):
        with open(os.path.join(args.work, "train-" + name + ".cpp")) as f:
            src = f.read()
        return (src.count(", AP_KERNEL_" + op + "_FORWARD, "),
                src.count(", AP_KERNEL_" + op + "_BACKWARD, "))
    fwdF, bwdF = launches("recompute-mlp", "SWIGLU")
    fwdC, bwdC = launches("recompute-mlp-clone", "SWIGLU")
    if not (fwdF > 0 and bwdF == bwdC and fwdC == 2 * fwdF and bwdF == fwdF):
        fail("swiglu launches: fused %d forward / %d backward, clone %d / %d"
             % (fwdF, bwdF, fwdC, bwdC))
    nF, nbF = launches("recompute-mlp", "RMS_NORM")
    nC, nbC = launches("recompute-mlp-clone", "RMS_NORM")
    if not (nbF == nbC and nC - nF == fwdF):
        fail("rms norm launches: fused %d forward / %d backward, clone %d / %d"
             " (expected one forward fewer per MLP layer)" % (nF, nbF, nC, nbC))
    gF, gbF = launches("recompute-mlp", "GDN_GATED_NORM")
    gC, gbC = launches("recompute-mlp-clone", "GDN_GATED_NORM")
    if not (gF > 0 and gbF == gbC and gC == 2 * gF):
        fail("gated norm launches: fused %d forward / %d backward, clone %d /"
             " %d" % (gF, gbF, gC, gbC))
    print("swiglu launches per microbatch: fused %d + %d, clone %d + %d; "
          "rms norm: fused %d + %d, clone %d + %d; gated norm: fused %d + %d,"
          " clone %d + %d" %
          (fwdF, bwdF, fwdC, bwdC, nF, nbF, nC, nbC, gF, gbF, gC, gbC))

    # The side-stream binary launches recompute on the side stream; none of
    # the others does.
    sideLaunches = {}
    for name in ("recompute-side", "recompute-mlp"):
        with open(os.path.join(args.work, "train-" + name + ".cpp")) as f:
            sideLaunches[name] = f.read().count("ap_launch(r, AP_STREAM_SIDE, ")
    if not (sideLaunches["recompute-side"] > 0 and
            sideLaunches["recompute-mlp"] == 0):
        fail("side-stream launches: %s" % sideLaunches)
    print("side-stream launches per microbatch: %d" %
          sideLaunches["recompute-side"])

    # Issue order: the compute launch nearest to each side launch is the
    # GDN chunk backward it overlaps; it follows the side run with
    # --side-issue=with-run and precedes it by default (after-host), where
    # the program also holds side work until the host's first launch
    # (p.side_after_host_start). Same side launches.
    def neighbour_launches(name):
        with open(os.path.join(args.work, "train-" + name + ".cpp")) as f:
            lines = [l for l in f if "ap_launch(r, AP_STREAM_COMPUTE, " in l or
                     "ap_launch(r, AP_STREAM_SIDE, " in l]
        before, after = [], []
        for i, l in enumerate(lines):
            if "AP_STREAM_SIDE" not in l:
                continue
            j = i - 1
            while j >= 0 and "AP_STREAM_SIDE" in lines[j]:
                j -= 1
            k = i + 1
            while k < len(lines) and "AP_STREAM_SIDE" in lines[k]:
                k += 1
            before.append(lines[j] if j >= 0 else "")
            after.append(lines[k] if k < len(lines) else "")
        return before, after
    _, nextLaunch = neighbour_launches("recompute-side")
    prevLaunch, _ = neighbour_launches("recompute-side-after-host")
    if not (nextLaunch and
            all("gated_delta_rule_grad" in l for l in nextLaunch) and
            len(prevLaunch) == len(nextLaunch) and
            all("gated_delta_rule_grad" in l for l in prevLaunch)):
        fail("side issue order: with-run next %s, after-host previous %s" %
             (nextLaunch, prevLaunch))
    flags = {}
    for name in ("recompute-side", "recompute-side-after-host"):
        with open(os.path.join(args.work, "train-" + name + ".cpp")) as f:
            flags[name] = "p.side_after_host_start = 1;" in f.read()
    if flags != {"recompute-side": False, "recompute-side-after-host": True}:
        fail("p.side_after_host_start in the programs: %s" % flags)
    print("side issue order: %d side launches before their chunk backward "
          "(with-run), after it (after-host)" % len(nextLaunch))

    for name in ("none", "recompute", "recompute-mlp", "recompute-mlp-clone"):
        for m in runs[name]:
            for scope, c in m["transfers"].items():
                if c["d2h_count"] or c["h2d_count"]:
                    fail("%s step %d: scope %s transferred without offload" %
                         (name, m["step"], scope))
    scopeSets = {}
    for name in WITH_OFFLOAD:
        scopes = scopeSets.setdefault(name, set())
        for m in runs[name]:
            if not m["transfers"]:
                fail("%s step %d: no offload scopes" % (name, m["step"]))
            for scope, c in m["transfers"].items():
                scopes.add(scope)
                if not (c["d2h_count"] > 0 and
                        c["d2h_count"] == c["h2d_count"] and
                        c["d2h_bytes"] > 0 and c["h2d_bytes"] > 0):
                    fail("%s step %d: scope %s counters %s" %
                         (name, m["step"], scope, c))
    # fraction 0.5 offloads the earlier half of the eligible scopes only.
    if not scopeSets["fraction"] < scopeSets["offload"]:
        fail("fraction 0.5 scopes %s are not a proper subset of %s" %
             (sorted(scopeSets["fraction"]), sorted(scopeSets["offload"])))
    scopes = scopeSets["offload"]
    for leaf in OFFLOADED_LEAVES:
        if not any(s.endswith("." + leaf) for s in scopes):
            fail("no offloaded scope for " + leaf + " in " + str(sorted(scopes)))
    print("offloaded scopes: " + ", ".join(sorted(scopes)))
    if not peaks["offload"] < peaks["none"]:
        fail("planned peak with offload %d is not below %d without" %
             (peaks["offload"], peaks["none"]))
    print("planned peaks: " + str(peaks))

    # The comparison is not vacuous: another seed changes the fingerprints.
    metrics = os.path.join(args.work, "seed1.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    r = subprocess.run([os.path.join(args.work, "train-none"), "--steps", "1",
                        "--device", "host", "--seed", "1", "--fingerprints",
                        "--metrics", metrics], capture_output=True, text=True)
    if r.returncode != 0:
        fail("seed 1 run failed: " + r.stderr)
    with open(metrics) as f:
        other = json.loads(f.readline())
    if other["fingerprints"]["params"] == base[0]["fingerprints"]["params"]:
        fail("--seed 1 gave the same parameter fingerprint as seed 0")
    # 6 continuous steps == 3 steps + save + a new process (another
    # placement) + --resume + 3 steps, bitwise.
    ckpt = os.path.join(args.work, "ckpt")
    subprocess.run(["rm", "-rf", ckpt], check=True)

    def train(binary, steps, extra, name):
        out = os.path.join(args.work, name + ".jsonl")
        if os.path.exists(out):
            os.remove(out)
        r = subprocess.run([os.path.join(args.work, binary), "--steps",
                            str(steps), "--device", "host", "--fingerprints",
                            "--metrics", out] + extra,
                           capture_output=True, text=True)
        if r.returncode != 0:
            fail("%s %s exited %d: %s" % (binary, extra, r.returncode,
                                          r.stderr))
        with open(out) as f:
            return [json.loads(l) for l in f if l.strip()]

    full = train("train-none", 6, [], "full6")
    first = train("train-none", 3, ["--save", ckpt], "first3")
    second = train("train-offload", 6, ["--resume", ckpt], "resumed3")
    if [m["step"] for m in first + second] != [1, 2, 3, 4, 5, 6]:
        fail("resumed run steps %s" % [m["step"] for m in first + second])
    for a, b in zip(full, first + second):
        if a["fingerprints"] != b["fingerprints"]:
            fail("step %d: resumed run differs from the continuous run" %
                 a["step"])
    print("resume: 3 + save + 3 (offload binary) == 6 continuous steps")
    r = subprocess.run([os.path.join(args.work, "train-none"), "--steps", "1",
                        "--device", "host", "--resume",
                        os.path.join(args.work, "no-such-checkpoint")],
                       capture_output=True, text=True)
    if r.returncode == 0:
        fail("--resume of a missing checkpoint exited 0")

    # Training learns: 50 steps on byte-level text (the repository's own
    # docs) with the default lr lower the mean loss of the last 10 steps
    # below that of the first 10.
    text = os.path.join(args.work, "text.txt")
    src = os.path.dirname(os.path.dirname(os.path.abspath(args.model)))
    with open(text, "w") as out:
        for name in ["README.md"] + sorted(os.listdir(os.path.join(src, "docs"))):
            path = os.path.join(src, name) if name == "README.md" else \
                os.path.join(src, "docs", name)
            if path.endswith(".md"):
                with open(path) as f:
                    out.write(f.read())
    learn = train("train-none", 50, ["--data", "text:" + text], "text50")
    first10 = sum(m["loss"] for m in learn[:10]) / 10
    last10 = sum(m["loss"] for m in learn[-10:]) / 10
    if not last10 < first10 - 0.1:
        fail("loss on text did not decrease: first 10 steps %.4f, last 10 "
             "%.4f" % (first10, last10))
    print("text: mean loss %.4f (steps 1-10) -> %.4f (steps 41-50)" %
          (first10, last10))

    # Frozen parameters (weight only, no optimizer state): offload still
    # changes no bit, and the frozen weights never move.
    graph = os.path.join(args.work, "frozen.mlir")
    freeze = "model.layers.1.,model.layers.2.self_attn.q_norm"
    r = subprocess.run([args.import_tool, args.model, "--seq", "64",
                        "--micro-batches", "2", "--freeze=" + freeze, "-o",
                        graph], capture_output=True, text=True)
    if r.returncode != 0:
        fail("actplace-import --freeze: " + r.stderr)
    frozen = {}
    for name, flags in (("frozen-none", []),
                        ("frozen-offload", VARIANTS["offload"])):
        r = subprocess.run([args.compile, graph, "-o",
                            os.path.join(args.work, "train-" + name)] + flags,
                           capture_output=True, text=True)
        if r.returncode != 0:
            fail("actplace-compile " + name + ": " + r.stdout + r.stderr)
        frozen[name] = train("train-" + name, STEPS, [], name)
    for a, b in zip(frozen["frozen-none"], frozen["frozen-offload"]):
        if a["fingerprints"] != b["fingerprints"]:
            fail("frozen model step %d: offload changed the fingerprints" %
                 a["step"])
    if frozen["frozen-none"][-1]["fingerprints"] == base[-1]["fingerprints"]:
        fail("freezing parameters changed nothing")
    print("frozen: offload == no offload over %d steps" % STEPS)

    # --op-times: every launch of steps 2..N timed, by launch label; the
    # GDN core's forward runs once per microbatch per timed step. Stream mode
    # (the default) changes no bit of the run, and its kernel spans fit
    # inside the timed steps; wait mode times the same launches.
    plain = os.path.join(args.work, "op-times-plain.jsonl")
    if os.path.exists(plain):
        os.remove(plain)  # --metrics appends
    r = subprocess.run([os.path.join(args.work, "train-none"), "--steps", "3",
                        "--device", "host", "--fingerprints", "--metrics",
                        plain], capture_output=True, text=True)
    if r.returncode != 0:
        fail("3-step run failed: " + r.stderr)
    with open(plain) as f:
        plain_steps = [json.loads(l) for l in f if l.strip()]
    by_mode = {}
    for mode in ("stream", "wait"):
        times = os.path.join(args.work, "op-times-%s.json" % mode)
        metrics = os.path.join(args.work, "op-times-%s.jsonl" % mode)
        if os.path.exists(metrics):
            os.remove(metrics)
        r = subprocess.run([os.path.join(args.work, "train-none"), "--steps",
                            "3", "--device", "host", "--op-times", times,
                            "--op-times-mode", mode, "--fingerprints",
                            "--metrics", metrics],
                           capture_output=True, text=True)
        if r.returncode != 0:
            fail("--op-times-mode %s run failed: %s" % (mode, r.stderr))
        with open(times) as f:
            ot = json.load(f)
        with open(metrics) as f:
            steps = [json.loads(l) for l in f if l.strip()]
        gdn = ot["ops"].get("L0.gdn_core_attn/gated_delta_rule")
        if ot["steps"] != 2 or ot.get("mode") != mode or not gdn or \
                gdn["seconds"] <= 0 or gdn["count"] < 2 * 2:
            fail("--op-times %s: unexpected %s" % (mode,
                                                   json.dumps(ot)[:400]))
        if [m["fingerprints"] for m in steps] != \
                [m["fingerprints"] for m in plain_steps]:
            fail("--op-times-mode %s changed the run's fingerprints" % mode)
        total = sum(t["seconds"] for t in ot["ops"].values())
        timed = sum(m["step_time_s"] for m in steps[1:])
        if mode == "stream" and not 0 < total <= timed:
            fail("stream op times sum to %.4f s, more than the %.4f s of "
                 "the timed steps" % (total, timed))
        by_mode[mode] = ot
        print("op times (%s): %d labels, GDN forward %d launches in %.3f ms, "
              "%.1f ms of %.1f ms timed" %
              (mode, len(ot["ops"]), gdn["count"], gdn["seconds"] * 1e3,
               total * 1e3, timed * 1e3))
    counts = {m: {k: v["count"] for k, v in ot["ops"].items()}
              for m, ot in by_mode.items()}
    if counts["stream"] != counts["wait"]:
        fail("the two --op-times modes timed different launches")

    # The fused loss (default) launches the LM head once per microbatch; the
    # unfused pair launches it twice (forward, then the grad's second
    # logits pass). Equal fingerprints (above) with different launches.
    times = os.path.join(args.work, "op-times-unfused.json")
    r = subprocess.run([os.path.join(args.work, "train-unfused-loss"),
                        "--steps", "3", "--device", "host", "--op-times",
                        times], capture_output=True, text=True)
    if r.returncode != 0:
        fail("unfused --op-times run failed: " + r.stderr)
    with open(times) as f:
        unfused = {k: v["count"] for k, v in json.load(f)["ops"].items()}
    lm = {name: {k: c for k, c in cs.items() if k.startswith("lm_head/")}
          for name, cs in (("fused", counts["stream"]),
                           ("unfused", unfused))}
    micro = 2 * 2  # 2 timed steps x 2 microbatches
    if lm["fused"] != {"lm_head/lm_head_cross_entropy_with_grad": micro}:
        fail("fused binary's LM head launches: %s" % lm["fused"])
    if lm["unfused"] != {"lm_head/lm_head_cross_entropy": micro,
                         "lm_head/lm_head_cross_entropy_grad": micro}:
        fail("unfused binary's LM head launches: %s" % lm["unfused"])
    print("fused loss: %s; unfused: %s" % (lm["fused"], lm["unfused"]))

    # With offload, stream-mode --op-times also times each compute-stream
    # wait for a reload, under "<scope>/wait" (the stall: the measured
    # exposed transfer time), for every offloaded leaf; the run's bits stay
    # the offload binary's.
    times = os.path.join(args.work, "op-times-offload.json")
    fp = {}
    for label, flags in (("plain", []), ("timed", ["--op-times", times])):
        metrics = os.path.join(args.work, "op-times-offload-%s.jsonl" % label)
        if os.path.exists(metrics):
            os.remove(metrics)  # --metrics appends
        r = subprocess.run([os.path.join(args.work, "train-offload"),
                            "--steps", "3", "--device", "host",
                            "--fingerprints", "--metrics", metrics] + flags,
                           capture_output=True, text=True)
        if r.returncode != 0:
            fail("offload %s 3-step run failed: %s" % (label, r.stderr))
        with open(metrics) as f:
            fp[label] = [json.loads(l)["fingerprints"] for l in f if l.strip()]
    if fp["plain"] != fp["timed"] or len(fp["timed"]) != 3:
        fail("--op-times changed the offload binary's fingerprints")
    with open(times) as f:
        ops = json.load(f)["ops"]
    waits = {k: v for k, v in ops.items() if k.endswith("/wait")}
    leaves = {k.split("/")[0].split(".", 1)[1] for k in waits}
    if leaves != set(OFFLOADED_LEAVES) or any(
            v["count"] < 2 * 2 or v["seconds"] < 0 for v in waits.values()):
        fail("offload op times' waits: %s" % json.dumps(waits)[:400])
    print("op times with offload: %d wait labels (%s), %d waits timed" %
          (len(waits), ", ".join(sorted(leaves)),
           sum(v["count"] for v in waits.values())))

    # --op-timeline: the last timed step's launches, each on its stream from
    # the step's first launch: the side-stream binary's recompute on side,
    # one stream's launches one after another, as many launches as
    # --op-times counts for one step; 1 step (nothing timed) is an error.
    timeline = os.path.join(args.work, "op-timeline-side.json")
    times = os.path.join(args.work, "op-times-side.json")
    r = subprocess.run([os.path.join(args.work, "train-recompute-side"),
                        "--steps", "3", "--device", "host", "--op-times",
                        times, "--op-timeline", timeline],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail("--op-timeline run failed: " + r.stderr)
    with open(timeline) as f:
        tl = json.load(f)
    with open(times) as f:
        per_step = sum(v["count"] for v in json.load(f)["ops"].values()) // 2
    launches = tl["launches"]
    side = [l for l in launches if l["stream"] == "side"]
    if tl["step"] != 3 or len(launches) != per_step or not side or \
            not all("(recompute)" in l["label"] for l in side) or \
            min(l["start_us"] for l in launches) != 0:
        fail("--op-timeline: unexpected %s" % json.dumps(tl)[:400])
    for stream in ("compute", "side"):
        spans = [(l["start_us"], l["end_us"]) for l in launches
                 if l["stream"] == stream]
        if any(b[0] < a[1] - 1e-3 or a[1] < a[0]
               for a, b in zip(spans, spans[1:])):
            fail("--op-timeline: %s launches overlap: %s" % (stream, spans))
    r = subprocess.run([os.path.join(args.work, "train-none"), "--steps", "1",
                        "--device", "host", "--op-timeline", timeline],
                       capture_output=True, text=True)
    if r.returncode == 0 or "run at least 2 steps" not in r.stderr:
        fail("--op-timeline with 1 step: exit %d, %s" % (r.returncode,
                                                         r.stderr[-400:]))
    print("op timeline: %d launches, %d on side, step %.1f ms" %
          (len(launches), len(side), max(l["end_us"] for l in launches) /
           1e3))

    # A diverging run stops with a clear message and exit 3 at the first
    # step that is not finite (here step 2's grad norm, before the loss of
    # step 3 follows).
    r = subprocess.run([os.path.join(args.work, "train-none"), "--steps", "6",
                        "--device", "host", "--lr", "1e30"],
                       capture_output=True, text=True)
    if r.returncode != 3 or "is not finite: the " not in r.stderr or \
            "training stopped" not in r.stderr:
        fail("--lr 1e30 did not stop on a non-finite step (exit %d): %s" %
             (r.returncode, r.stderr[-2000:]))
    # A bad flag is an error too.
    r = subprocess.run([os.path.join(args.work, "train-none"), "--stepz", "1"],
                       capture_output=True, text=True)
    if r.returncode == 0:
        fail("an unknown flag exited 0")

    print("PASS: %d steps bit-identical across %s" %
          (STEPS, ", ".join(VARIANTS)))


if __name__ == "__main__":
    main()
