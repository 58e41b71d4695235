"""`run` and `check`, on the GPU machine: python3 only, no compiler."""
import json
import lzma
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

from .common import log, open_result
from .tables import fmt_mib


def gpu_info():
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,"
             "clocks.mem,memory.used,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def open_carry(a, prefix):
    """The carry's manifest, the arms asked for (default: all built), the
    output folder (created) and a temporary folder with each arm's binary
    unpacked from the carry (remove it when done)."""
    carry = os.path.abspath(a.carry)
    manifest = json.load(open(os.path.join(carry, "manifest.json")))
    add_variants(manifest, a.variant)
    arms = a.arms.split(",") if a.arms else list(manifest["arms"])
    for arm in arms:
        if arm not in manifest["arms"]:
            sys.exit(f"--arms names '{arm}': neither a built arm of "
                     f"{carry} nor a --variant")
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    bindir = tempfile.mkdtemp(prefix=prefix)
    for arm in arms:
        info = manifest["arms"][arm]
        path = os.path.join(bindir, arm)
        with lzma.open(os.path.join(carry, info["binary"])) as f, \
                open(path, "wb") as o:
            shutil.copyfileobj(f, o)
        os.chmod(path, 0o755)
    return carry, manifest, arms, out, bindir


def add_variants(manifest, specs):
    """Adds each --variant NAME=ARM:VAR=VALUE[;VAR=VALUE] to the manifest's
    arms: ARM's entry (binary, report, predictions) plus "variant_of" and
    "env", so that run, check and table treat it as an arm of its own."""
    for spec in specs:
        name, sep, rest = spec.partition("=")
        base, sep2, env_text = rest.partition(":")
        if not sep or not sep2 or not name or not base or not env_text:
            sys.exit(f"--variant '{spec}': expected "
                     "NAME=ARM:VAR=VALUE[;VAR=VALUE]")
        if name in manifest["arms"]:
            sys.exit(f"--variant '{spec}': arm '{name}' exists already")
        if base not in manifest["arms"]:
            sys.exit(f"--variant '{spec}': '{base}' is not a built arm "
                     f"(built: {', '.join(manifest['arms'])})")
        env = {}
        for item in env_text.split(";"):
            var, eq, value = item.partition("=")
            if not eq or not var:
                sys.exit(f"--variant '{spec}': '{item}' is not VAR=VALUE")
            env[var] = value
        info = dict(manifest["arms"][base])
        info.update({"variant_of": base, "env": env})
        manifest["arms"][name] = info


def arm_env(info):
    """The environment an arm's process runs in: ours plus its variant's."""
    env = dict(os.environ)
    env.update(info.get("env", {}))
    return env


def cmd_run(a):
    carry, manifest, arms, out, bindir = open_carry(a, "qwen-bench-")
    for arm in arms:
        info = manifest["arms"][arm]
        for key in ("report", "svg"):
            shutil.copy(os.path.join(carry, info[key]), out)
    total_steps = a.warmup + a.steps
    run = {"host": socket.gethostname(), "device": a.device,
           "gpu_before": gpu_info(), "warmup": a.warmup, "steps": a.steps,
           "rounds": a.rounds, "seed": a.seed, "data": a.data,
           # Kernel switches the binaries read at startup.
           "env": {k: v for k, v in sorted(os.environ.items())
                   if k.startswith("ACTPLACE_")},
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "processes": []}
    results = open(os.path.join(out, "results.jsonl"), "w")
    run_start = time.time()
    walls = []
    total_processes = a.rounds * len(arms)
    for r in range(a.rounds):
        # --time-limit: a round is started only if one more round as long
        # as the longest so far still ends inside the limit, so that every
        # arm has the same number of processes and the rotation stays fair.
        # The first round always runs.
        elapsed = time.time() - run_start
        if a.time_limit and r > 0:
            need = max(walls) * len(arms)
            if elapsed + need > a.time_limit:
                run["stopped"] = {"rounds_done": r, "elapsed_s":
                                  round(elapsed, 1), "time_limit_s":
                                  a.time_limit, "next_round_estimate_s":
                                  round(need, 1)}
                log(f"stopping after {r} of {a.rounds} rounds: {elapsed:.0f}"
                    f" s spent, a round takes about {need:.0f} s, the limit "
                    f"is {a.time_limit:g} s")
                break
        # Rotate the order each round: every arm runs early and late.
        order = arms[r % len(arms):] + arms[:r % len(arms)]
        for pos, arm in enumerate(order):
            metrics = os.path.join(out, f"{arm}.r{r}.jsonl")
            logf = os.path.join(out, f"{arm}.r{r}.log")
            if os.path.exists(metrics):
                # The binary appends: a folder run into again would count
                # the earlier process's steps as this one's.
                os.remove(metrics)
            cmd = [os.path.join(bindir, arm), "--steps", str(total_steps),
                   "--device", a.device, "--seed", str(a.seed),
                   "--data", a.data, "--metrics", metrics]
            done = len(walls)
            eta = (f", about {statistics.mean(walls) * (total_processes - done):.0f} s left"
                   if walls else "")
            log(f"round {r} #{pos} {arm} (process {done + 1} of "
                f"{total_processes}{eta}): {' '.join(cmd[1:])}")
            t0 = time.time()
            try:
                with open(logf, "w") as lf:
                    rc = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT,
                                        env=arm_env(manifest["arms"][arm]),
                                        timeout=a.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            wall = time.time() - t0
            walls.append(wall)
            lines = []
            if os.path.exists(metrics):
                lines = [json.loads(l) for l in open(metrics) if l.strip()]
            for m in lines:
                row = {"commit": manifest["commit"], "arm": arm, "round": r,
                       "position": pos, "warmup": m["step"] <= a.warmup}
                row.update(m)
                results.write(json.dumps(row) + "\n")
            results.flush()
            # Start time (epoch s): lines up a process with GPU clock and
            # power samples taken beside the run.
            proc = {"arm": arm, "round": r, "position": pos, "rc": rc,
                    "started_s": round(t0, 2), "wall_s": round(wall, 2),
                    "steps_written": len(lines)}
            run["processes"].append(proc)
            log(f"  rc={rc} wall={wall:.1f}s steps={len(lines)}"
                + (f" last step {lines[-1]['step_time_s']:.4f}s" if lines
                   else ""))
            if rc != 0:
                log("  log tail:", open(logf).read()[-2000:])
    results.close()
    def record_op_times(arm, path, mode):
        """One process of `arm` with --op-times into `path`; its entry for
        the manifest."""
        cmd = [os.path.join(bindir, arm), "--steps",
               str(a.op_times_steps + 1), "--device", a.device, "--seed",
               str(a.seed), "--data", a.data, "--op-times", path,
               "--op-times-mode", mode]
        timeline = None
        if a.timeline and mode == "stream":
            # The last timed step's launches on their streams (what ran
            # beside what): op-timeline-ARM.json.
            timeline = f"op-timeline-{arm}.json"
            cmd += ["--op-timeline", os.path.join(out, timeline)]
        log(f"op times of {arm}: " + " ".join(cmd[1:]))
        try:
            rc = subprocess.run(cmd, stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT,
                                env=arm_env(manifest["arms"][arm]),
                                timeout=a.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        log(f"  rc={rc}")
        entry = {"rc": rc, "steps": a.op_times_steps,
                 "file": os.path.basename(path)}
        if timeline:
            entry["timeline"] = timeline
        return entry

    if a.op_times_steps and "none" in arms:
        # The kernel times `calibrate --op-times` turns into opScale, from
        # the no-placement binary: op-times.json in the first mode named,
        # op-times-MODE.json for another.
        run["op_times"] = {}
        for i, mode in enumerate(a.op_times_modes.split(",")):
            path = os.path.join(out, "op-times.json" if i == 0
                                else f"op-times-{mode}.json")
            run["op_times"][mode] = record_op_times("none", path, mode)
    stall_arms = [n for n in a.op_times_arms.split(",") if n]
    if a.op_times_steps and stall_arms:
        # Placed arms' op times (stream mode): besides their kernels they
        # time each compute-stream wait for a reload ("<scope>/wait"), the
        # measured stall the table sets beside the predicted exposed time.
        run["op_times_arms"] = {}
        for arm in stall_arms:
            if arm not in arms:
                sys.exit(f"run: --op-times-arms names '{arm}', which is not "
                         "an arm of this run")
            run["op_times_arms"][arm] = record_op_times(
                arm, os.path.join(out, f"op-times-{arm}.json"), "stream")
    run["gpu_after"] = gpu_info()
    run["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    manifest["run"] = run
    json.dump(manifest, open(os.path.join(out, "manifest.json"), "w"), indent=1)
    shutil.rmtree(bindir, ignore_errors=True)
    log(f"wrote {out}")
    pack_folder(a, out)


def pack_folder(a, out):
    """--pack FILE: the output folder as one gzipped tar (its own name at the
    top), written as soon as the folder is complete: a device call brings
    back a few files, not the hundred a run writes."""
    if not a.pack:
        return
    with tarfile.open(a.pack, "w:gz") as t:
        t.add(out, arcname=os.path.basename(out.rstrip("/")))
    log(f"packed {out} into {a.pack} ({os.path.getsize(a.pack)} bytes)")


def check_arm_lines(arm, lines, steps):
    """The stability conditions of issue 8 on one process's metrics; returns
    a list of violations (empty: the arm is stable)."""
    bad = []
    if len(lines) != steps:
        bad.append(f"{arm}: {len(lines)} metrics lines, expected {steps}")
    for m in lines:
        for key in ("loss", "grad_norm"):
            v = m.get(key)
            if v is None or not math.isfinite(v):
                bad.append(f"{arm} step {m['step']}: {key} {v} not finite")
        if m["pinned_pool"]["in_use"] != 0:
            bad.append(f"{arm} step {m['step']}: pinned pool "
                       f"{m['pinned_pool']['in_use']} bytes in use after "
                       "the step")
    # Everything the runtime allocates is allocated in step 1: from then on
    # the pool and the device peak must not move.
    for key, get in (("pinned buffers", lambda m: m["pinned_pool"]["buffers"]),
                     ("pinned bytes", lambda m: m["pinned_pool"]["bytes"]),
                     ("device peak", lambda m: m["device_peak_bytes"])):
        seen = sorted({get(m) for m in lines})
        if len(seen) > 1:
            bad.append(f"{arm}: {key} not constant over the steps: {seen}")
    return bad


def arm_shape(manifest, arm):
    """(micro_batch_size, micro_batches) of a built arm: its own (arms.json
    'shape') or the build's."""
    info = manifest["arms"][arm]
    return (info.get("micro_batch_size", manifest["micro_batch_size"]),
            info.get("micro_batches", manifest["micro_batches"]))


def shape_text(shape):
    mbs, mb = shape
    return f"{mb} x {mbs}"


def cmd_check(a):
    """Bit identity and stability: every arm STEPS steps with
    --fingerprints in its own process; fingerprints (loss, grads, params,
    optimizer) equal to the first arm's at every step, finite losses and
    grad norms, pinned pool constant and empty after every step, device peak
    constant."""
    if a.baseline and not a.fingerprints:
        sys.exit("check: --baseline compares fingerprints; add --fingerprints")
    reference = None
    if a.baseline:
        # Read before any process runs: a late error would waste the call.
        if not os.path.exists(a.baseline):
            sys.exit(f"check: --baseline {a.baseline}: no such file")
        with open_result(a.baseline) as f:
            reference = [json.loads(l) for l in f if l.strip()]
        if len(reference) < a.steps:
            sys.exit(f"check: --baseline {a.baseline} has {len(reference)} "
                     f"steps, fewer than --steps {a.steps}")
    _, manifest, arms, out, bindir = open_carry(a, "qwen-check-")
    if a.fingerprints and reference is None:
        # Bits compare only between arms of one microbatch shape: another
        # shape accumulates the step's gradients in another order.
        shapes = {arm: arm_shape(manifest, arm) for arm in arms}
        other = [arm for arm in arms if shapes[arm] != shapes[arms[0]]]
        if other:
            shutil.rmtree(bindir, ignore_errors=True)
            sys.exit(f"check: --fingerprints compares arms of one microbatch "
                     f"shape; {other[0]} is {shape_text(shapes[other[0]])}, "
                     f"{arms[0]} {shape_text(shapes[arms[0]])}")
    runs, bad = {}, []
    for arm in arms:
        path = os.path.join(bindir, arm)
        metrics = os.path.join(out, f"{arm}.check.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        cmd = [path, "--steps", str(a.steps), "--device", a.device, "--seed",
               str(a.seed), "--data", a.data, "--metrics", metrics]
        if a.fingerprints:
            cmd.append("--fingerprints")
        log(f"{arm}: {' '.join(cmd[1:])}")
        t0 = time.time()
        with open(os.path.join(out, f"{arm}.check.log"), "w") as lf:
            try:
                rc = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT,
                                    env=arm_env(manifest["arms"][arm]),
                                    timeout=a.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        lines = ([json.loads(l) for l in open(metrics) if l.strip()]
                 if os.path.exists(metrics) else [])
        log(f"  rc={rc} wall={time.time() - t0:.1f}s steps={len(lines)}")
        if rc != 0:
            bad.append(f"{arm}: exit status {rc}")
        bad += check_arm_lines(arm, lines, a.steps)
        runs[arm] = lines
    shutil.rmtree(bindir, ignore_errors=True)
    compared = 0
    if a.fingerprints:
        # The reference: an earlier check's NAME.check.jsonl (--baseline;
        # e.g. `none` of another call, so that one new arm is compared
        # with something), else the first arm of this check.
        if reference is not None:
            first, others = a.baseline, arms
        else:
            first, reference, others = arms[0], runs[arms[0]], arms[1:]
        for arm in others:
            compared += 1
            for x, y in zip(reference, runs[arm]):
                if x.get("fingerprints") is None or \
                        x.get("fingerprints") != y.get("fingerprints"):
                    bad.append(f"step {x['step']}: fingerprints of {arm} "
                               f"{y.get('fingerprints')} differ from "
                               f"{first}'s {x.get('fingerprints')}")
                    break
    print(f"| arm | steps | first / last loss | last grad norm | pinned "
          f"buffers | pinned MiB | device peak MiB | median step s |")
    print("|---|---|---|---|---|---|---|---|")
    for arm in arms:
        lines = runs[arm]
        if not lines:
            print(f"| {arm} | 0 | | | | | | |")
            continue
        last = lines[-1]
        print(f"| {arm} | {len(lines)} | {lines[0]['loss']:.5f} / "
              f"{last['loss']:.5f} | {last['grad_norm']:.4g} | "
              f"{last['pinned_pool']['buffers']} | "
              f"{fmt_mib(last['pinned_pool']['bytes'])} | "
              f"{fmt_mib(last['device_peak_bytes'])} | "
              f"{statistics.median(m['step_time_s'] for m in lines[1:] or lines):.4f} |")
    json.dump({"commit": manifest["commit"], "arms": arms, "steps": a.steps,
               "fingerprints": a.fingerprints,
               "fingerprint_baseline": first if a.fingerprints else None,
               "violations": bad, "gpu": gpu_info()},
              open(os.path.join(out, "check.json"), "w"), indent=1)
    pack_folder(a, out)
    for b in bad:
        print("FAIL: " + b)
    if bad:
        sys.exit(1)
    if not a.fingerprints:
        said = ""
    elif compared:
        said = (f", fingerprints equal at every step ({compared} arm"
                f"{'s' if compared > 1 else ''} against {first})")
    else:
        # One arm and nothing to hold it against: say so, not "equal".
        said = (", fingerprints recorded, not compared (one arm, no "
                "--baseline)")
    print(f"PASS: {len(arms)} arms, {a.steps} steps" + said
          + "; finite, pinned pool constant and empty, device peak constant")

