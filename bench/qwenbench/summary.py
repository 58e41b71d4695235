"""One compact summary of a run folder, the record a run commits
(bench/notes/runs/NAME.md): when and where it ran, the commit and the
command, each arm's flags, and the table (medians, ranges, peaks). The
raw folder (logs, binaries, reports, SVGs) stays local."""
import json
import os
import re

from .common import REPO

RUNS_DIR = os.path.join(REPO, "bench", "notes", "runs")


def run_name(manifest):
    """qwen-bench-<run date>-<commit>: the summary's file name."""
    stamp = manifest.get("run", {}).get("started", manifest.get("built", ""))
    return "qwen-bench-%s-%s" % (stamp[:10] or "undated",
                                 manifest.get("commit", "unknown")[:10])


def short_flag(flag):
    """A flag with any absolute path into the repository made relative
    (the build machine's checkout path means nothing elsewhere)."""
    return re.sub(r"=(\S*/)?((bench|models|test)/\S+)", r"=\2", flag)


def build_command(manifest):
    arms = ",".join(manifest.get("arms", {}))
    return ("bench/qwen_train_bench.py build --model " +
            str(manifest.get("model", "?")) +
            f" --seq {manifest.get('seq', '?')} --micro-batch-size "
            f"{manifest.get('micro_batch_size', '?')} --micro-batches "
            f"{manifest.get('micro_batches', '?')} --dtype "
            f"{manifest.get('dtype', '?')} --arms {arms}")


RUN_KEYS = ("device", "warmup", "steps", "rounds", "seed", "data",
            "op_times_steps", "time_limit")


def header(manifest, name):
    run = manifest.get("run", {})
    commit = manifest.get("commit", "unknown")
    dirty = manifest.get("dirty_files") or []
    lines = [f"# {name}", ""]
    when = []
    if run.get("started"):
        when.append("run " + run["started"] +
                    (" to " + run["finished"] if run.get("finished") else ""))
    if manifest.get("built"):
        when.append("built " + manifest["built"])
    lines.append("- date: " + ("; ".join(when) or "not recorded"))
    lines.append("- commit: " + commit +
                 (" + uncommitted changes in " + ", ".join(dirty)
                  if dirty else ""))
    gpu = run.get("gpu_before") or "no nvidia-smi"
    if run:
        lines.append(f"- device: {run.get('device', '?')} on "
                     f"{run.get('host', '?')} ({gpu})")
    lines.append("- command: `" + build_command(manifest) + "`")
    settings = " ".join(f"{k}={run[k]}" for k in RUN_KEYS if k in run)
    if run.get("env"):
        settings += " env=" + ",".join(f"{k}={v}"
                                        for k, v in run["env"].items())
    if settings:
        lines.append("- run settings (`run`): " + settings)
    procs = run.get("processes", [])
    if procs:
        failed = [p for p in procs if p.get("rc") != 0]
        lines.append(f"- processes: {len(procs)}, failed: {len(failed)}" +
                     "".join(f"; {p['arm']} round {p['round']} exit {p['rc']}"
                             for p in failed))
    if run.get("stopped"):
        lines.append("- stopped early: " + json.dumps(run["stopped"]))
    lines.append("- arms (actplace-compile placement flags):")
    for arm, info in manifest.get("arms", {}).items():
        flags = " ".join(short_flag(f) for f in info.get("flags", []))
        chosen = info.get("chosen")
        lines.append(f"  - {arm}: " + (flags or "(none)") +
                     (" -> chose " + " ".join(chosen) if chosen else "") +
                     (f" (variant of {info['variant_of']})"
                      if info.get("variant_of") else ""))
    return lines


def summary(manifest, table, name=None, extra=()):
    """The summary's Markdown: the header from `manifest`, then `table`
    (table's output), then each (title, text) of `extra`."""
    name = name or run_name(manifest)
    lines = header(manifest, name) + ["", table.rstrip("\n")]
    for title, text in extra:
        lines += ["", f"## {title}", "", text.rstrip("\n")]
    return "\n".join(lines) + "\n"


def check_summary(check, name, extra=()):
    """The summary of a `check` folder from its check.json."""
    violations = check.get("violations", [])
    lines = [f"# {name}", "",
             "- commit: " + check.get("commit", "unknown"),
             "- device: " + str(check.get("gpu") or "not recorded"),
             "- command: `bench/qwen_train_bench.py check --arms " +
             ",".join(check.get("arms", [])) +
             f" --steps {check.get('steps', '?')}" +
             (" --fingerprints" if check.get("fingerprints") else "") + "`",
             "- result: " + ("PASS" if not violations else
                             f"FAIL ({len(violations)} violations)")]
    for v in violations[:10]:
        lines.append("  - " + str(v))
    for title, text in extra:
        lines += ["", f"## {title}", "", text.rstrip("\n")]
    return "\n".join(lines) + "\n"


def write(text, name, runs_dir=None):
    """Writes the summary to bench/notes/runs/NAME.md; returns the path."""
    runs_dir = runs_dir or RUNS_DIR
    os.makedirs(runs_dir, exist_ok=True)
    path = os.path.join(runs_dir, name + ".md")
    with open(path, "w") as f:
        f.write(text)
    return path
