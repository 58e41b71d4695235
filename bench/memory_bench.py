#!/usr/bin/env python3
"""Our side of the memory benchmarks (issue 31): Qwen3.5-0.8B trained
under memory budgets and at long sequences, built here and run on the GPU
machine in one call.

  build   compiles the arms with actplace-compile (here: the compiler cannot
          travel) into DIR, strips them and writes DIR/arms.json (each arm's
          flags and the compile's planned arena, or why it did not compile:
          an unreachable budget is a result, not an error):
            budget arms  b<B>: --memory-budget=process:<B>GiB
                         --global-batch-tokens=<N> --seq <S> (the micro-batch
                         size and placement chosen together, for the whole
                         process as the driver counts it)
            length arms  s<T>-none: seq T, micro-batch 1 x 1, no placement;
                         s<T>-placed: the same with --memory-budget=device
  run     there: each binary for --steps steps (--metrics), nvidia-smi's
          per-process memory sampled every 0.25 s; one JSON line per arm
          (step time median of the steps after the first, tokens/s, the
          binary's device_peak_bytes, its planned_peak_bytes, the driver's
          peak, the budget) in --out, and a markdown table on stdout. A
          binary the start-up check refuses (its plan does not fit the free
          memory: exit 1 naming both numbers) is recorded as not fitting.

GPU usage (after `build --out gpu-carry/mem` here, carried as a tar):
  python3 bench/memory_bench.py run --dir /tmp/mem --out $OUT/mem.jsonl
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def csv_ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


#===----------------------------------------------------------------------===#
# build
#===----------------------------------------------------------------------===#

def arms_of(a):
    arms = []
    for b in a.budgets_gib:
        arms.append({"name": "b%d" % b, "kind": "budget", "budget_gib": b,
                     "seq": a.seq, "tokens_per_step": a.global_batch_tokens,
                     "flags": ["--seq", str(a.seq),
                               "--memory-budget=process:%dGiB" % b,
                               "--global-batch-tokens=%d" %
                               a.global_batch_tokens]})
    for t in a.seqs:
        one = ["--seq", str(t), "--micro-batch-size", "1",
               "--micro-batches", "1"]
        arms.append({"name": "s%d-none" % t, "kind": "length", "seq": t,
                     "tokens_per_step": t, "flags": one})
        arms.append({"name": "s%d-placed" % t, "kind": "length", "seq": t,
                     "tokens_per_step": t,
                     "flags": one + ["--memory-budget=device"]})
    return arms


def cmd_build(a):
    os.makedirs(a.out, exist_ok=True)
    arms = arms_of(a)
    for arm in arms:
        binary = os.path.join(a.out, arm["name"])
        cmd = [a.compile, a.model, "-o", binary] + arm["flags"]
        if a.profile:
            cmd.append("--profile=" + a.profile)
        log("$ " + " ".join(cmd))
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        arm["compile_s"] = round(time.time() - t0, 1)
        with open(binary + ".log", "w") as f:
            f.write(r.stdout + r.stderr)
        if r.returncode != 0:
            err = [l for l in (r.stdout + r.stderr).splitlines()
                   if "error:" in l]
            arm["compiled"] = False
            arm["error"] = err[-1] if err else "exit %d" % r.returncode
            log("  did not compile: " + arm["error"])
            continue
        arm["compiled"] = True
        m = re.search(r"^planned peak: arena (\d+) bytes", r.stdout, re.M)
        arm["planned_arena_bytes"] = int(m.group(1)) if m else None
        m = re.search(r"^micro-batch choice: (micro-batch size .*)$",
                      r.stdout, re.M)
        if m:
            arm["choice"] = m.group(1).split(" (")[0]
        subprocess.run(["strip", binary], check=True)
        log("  %s: arena %s bytes, %.0f s" % (
            arm["name"], arm["planned_arena_bytes"], arm["compile_s"]))
    with open(os.path.join(a.out, "arms.json"), "w") as f:
        json.dump({"model": os.path.basename(a.model), "arms": arms}, f,
                  indent=1)
    print("built %d of %d arms into %s" % (
        sum(1 for x in arms if x.get("compiled")), len(arms), a.out))


#===----------------------------------------------------------------------===#
# run
#===----------------------------------------------------------------------===#

class DriverPeak:
    """The largest per-process used memory nvidia-smi reports for `pid`
    while running (bytes), sampled every `period` seconds."""

    def __init__(self, pid, period=0.25):
        self.pid, self.period, self.peak = pid, period, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while not self.stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-compute-apps=pid,used_memory",
                     "--format=csv,noheader,nounits"], capture_output=True,
                    text=True, timeout=5).stdout
            except (OSError, subprocess.SubprocessError):
                return
            for line in out.splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) == 2 and parts[0] == str(self.pid) and \
                        parts[1].isdigit():
                    self.peak = max(self.peak, int(parts[1]) << 20)
            self.stop.wait(self.period)

    def finish(self):
        self.stop.set()
        self.thread.join()
        return self.peak


def run_arm(arm, binary, a, work):
    metrics = os.path.join(work, arm["name"] + ".jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [binary, "--steps", str(a.steps), "--device", a.device,
           "--metrics", metrics]
    log("$ " + " ".join(cmd))
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    sampler = DriverPeak(p.pid)
    try:
        out, err = p.communicate(timeout=a.timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        err += "\n(killed after %d s)" % a.timeout_s
    driver = sampler.finish()
    row = {k: arm.get(k) for k in ("name", "kind", "budget_gib", "seq",
                                  "tokens_per_step", "choice",
                                  "planned_arena_bytes")}
    row["wall_s"] = round(time.time() - t0, 1)
    row["exit"] = p.returncode
    row["driver_peak_bytes"] = driver or None
    lines = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            lines = [json.loads(l) for l in f if l.strip()]
    if p.returncode != 0 or len(lines) != a.steps:
        tail = [l for l in err.splitlines() if l.strip()][-3:]
        row["fits"] = False if "free" in err and "needs" in err else None
        row["error"] = " | ".join(tail)
        log("  exit %d: %s" % (p.returncode, row["error"]))
        return row
    times = [l["step_time_s"] for l in lines[1:]] or \
        [lines[0]["step_time_s"]]
    med = statistics.median(times)
    row.update({"fits": True, "steps": len(lines), "step_s_median": med,
                "step_s_range": [min(times), max(times)],
                "tokens_per_s": arm["tokens_per_step"] / med,
                "device_peak_bytes": max(l.get("device_peak_bytes", 0)
                                         for l in lines),
                "planned_peak_bytes": lines[-1].get("planned_peak_bytes"),
                # What the driver and the context held at start: the
                # capacity less this (metrics, cuda only).
                "device_free_at_start_bytes":
                    lines[0].get("device_free_at_start_bytes"),
                "losses": [l.get("loss") for l in lines]})
    if arm.get("budget_gib"):
        budget = arm["budget_gib"] << 30
        row["budget_bytes"] = budget
        # Unknown without the driver's figure (no nvidia-smi, host runs).
        row["within_budget"] = driver <= budget if driver else None
    log("  %.3f s/step, %.0f tokens/s, peak %s (driver %s)" % (
        med, row["tokens_per_s"], row["device_peak_bytes"], driver))
    return row


def table(rows):
    gb = lambda b: "-" if not b else "%.2f" % (b / 1e9)
    out = ["| arm | choice | planned GB | runtime peak GB | driver peak GB "
           "| s/step | tokens/s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("fits"):
            out.append("| %s | %s | %s | %s | %s%s | %.3f | %.0f |" % (
                r["name"], r.get("choice") or "-",
                gb(r.get("planned_arena_bytes")), gb(r["device_peak_bytes"]),
                gb(r["driver_peak_bytes"]),
                {True: " (within)", False: " (OVER)"}.get(
                    r.get("within_budget"), ""),
                r["step_s_median"], r["tokens_per_s"]))
        else:
            out.append("| %s | %s | %s | - | - | - | %s |" % (
                r["name"], r.get("choice") or "-",
                gb(r.get("planned_arena_bytes")),
                r.get("error") or "did not run"))
    return "\n".join(out)


def cmd_run(a):
    with open(os.path.join(a.dir, "arms.json")) as f:
        meta = json.load(f)
    work = a.work or os.path.join(a.dir, "work")
    os.makedirs(work, exist_ok=True)
    wanted = set(a.arms.split(",")) if a.arms else None
    rows = []
    with open(a.out, "w") as out:
        for arm in meta["arms"]:
            if wanted and arm["name"] not in wanted:
                continue
            if not arm.get("compiled"):
                row = {"name": arm["name"], "kind": arm["kind"],
                       "fits": False, "error": arm.get("error")}
            else:
                row = run_arm(arm, os.path.join(a.dir, arm["name"]), a, work)
            rows.append(row)
            out.write(json.dumps(row) + "\n")
            out.flush()
    print(table(rows))
    return 0


def main():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the arms here")
    b.add_argument("--out", required=True)
    b.add_argument("--compile", default=os.path.join(
        REPO, "build-cuda", "bin", "actplace-compile"))
    b.add_argument("--model", default=os.path.join(REPO, "models",
                                                   "qwen3.5-0.8b.json"))
    b.add_argument("--profile", default=os.path.join(REPO, "bench",
                                                     "profiles", "h200.json"))
    b.add_argument("--budgets-gib", type=csv_ints, default=[16, 24, 40, 80])
    b.add_argument("--seq", type=int, default=4096)
    b.add_argument("--global-batch-tokens", type=int, default=65536)
    b.add_argument("--seqs", type=csv_ints, default=[],
                   help="length arms, e.g. 4096,16384,32768,65536,131072")
    r = sub.add_parser("run", help="run the built arms (GPU machine)")
    r.add_argument("--dir", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--work", default="")
    r.add_argument("--arms", default="", help="comma-separated subset")
    r.add_argument("--steps", type=int, default=3)
    r.add_argument("--device", default="cuda")
    r.add_argument("--timeout-s", type=int, default=300)
    a = p.parse_args()
    if a.cmd == "build":
        if not shutil.which(a.compile) and not os.path.exists(a.compile):
            sys.exit("memory_bench: no actplace-compile at %s (--compile)"
                     % a.compile)
        cmd_build(a)
        return 0
    return cmd_run(a)


if __name__ == "__main__":
    sys.exit(main())
