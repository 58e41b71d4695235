"""`table` and `overlap`: what a run folder measured, as Markdown."""
import bisect
import contextlib
import io
import json
import re
import os
import statistics
import sys

from . import summary
from .common import REPO, log, open_result


MIB = 2.0 ** 20


def fmt_mib(b):
    return "-" if b is None else f"{b / MIB:,.1f}"


def overlap_rows(base, placed):
    """Per compute op kind (label less its layer): time added against the
    same launch (label and occurrence) of `base`, split by whether side
    work covered at least a fifth of the launch; microseconds of side work
    beside it; launches. `base`, `placed`: --op-timeline launch lists."""
    side = sorted((l["start_us"], l["end_us"]) for l in placed
                  if l["stream"] == "side")
    starts = [s for s, _ in side]

    def beside(s, e):
        total = 0.0
        # Side launches are serial on their stream: scan from the last one
        # that starts before `s`.
        i = max(0, bisect.bisect_right(starts, s) - 1)
        for a, b in side[i:]:
            if a >= e:
                break
            total += max(0.0, min(b, e) - max(a, s))
        return total

    def by_occurrence(launches):
        seen, out = {}, {}
        for l in launches:
            if l["stream"] != "compute":
                continue
            k = seen.get(l["label"], 0)
            seen[l["label"]] = k + 1
            out[(l["label"], k)] = l
        return out

    ref = by_occurrence(base)
    rows = {}
    for key, l in by_occurrence(placed).items():
        dur = l["end_us"] - l["start_us"]
        b = ref.get(key)
        added = dur - (b["end_us"] - b["start_us"] if b else 0.0)
        ov = beside(l["start_us"], l["end_us"])
        r = rows.setdefault(re.sub(r"^L\d+\.", "", key[0]),
                            {"beside": 0.0, "alone": 0.0, "side_us": 0.0,
                             "launches": 0})
        r["beside" if ov > 0.2 * dur else "alone"] += added
        r["side_us"] += ov
        r["launches"] += 1
    return rows, sum(b - a for a, b in side)


def cmd_overlap(a):
    d = os.path.abspath(a.results)

    def timeline(arm):
        path = os.path.join(d, f"op-timeline-{arm}.json")
        try:
            with open_result(path) as f:
                return json.load(f)["launches"]
        except FileNotFoundError:
            sys.exit(f"overlap: no {path}[.xz]: record it with run "
                     f"--timeline --op-times-arms {arm}")
    rows, side_us = overlap_rows(timeline(a.base), timeline(a.arm))
    order = sorted(rows.items(), key=lambda kv: -abs(kv[1]["beside"]) -
                   abs(kv[1]["alone"]))
    print(f"# {a.arm} against {a.base} ({os.path.basename(d)}): compute "
          "launches, time added against the same launch of the base arm, "
          "split by whether side work covered >= 1/5 of the launch; us per "
          "step")
    print("| compute op | added beside side work | added alone | side work "
          "beside it | launches |")
    print("|---|---|---|---|---|")
    for name, r in order[:a.top]:
        print(f"| {name} | {r['beside']:+.1f} | {r['alone']:+.1f} | "
              f"{r['side_us']:.1f} | {r['launches']} |")
    tb = sum(r["beside"] for r in rows.values())
    ta = sum(r["alone"] for r in rows.values())
    print(f"| all ({len(rows)} ops) | {tb:+.1f} | {ta:+.1f} | "
          f"{sum(r['side_us'] for r in rows.values()):.1f} | "
          f"{sum(r['launches'] for r in rows.values())} |")
    print(f"\nside stream busy {side_us / 1e3:.2f} ms of the step. A launch "
          "matches the base arm's launch of the same label and occurrence: "
          "an op the placement splits (linear_input_grad + linear_grad "
          "around a rebuild) shows as one op added and one shortened; read "
          "them together.")


def cmd_table(a):
    if a.save:
        # Print to the terminal and into the run's summary.
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            print_table(a)
        print(text.getvalue(), end="")
        save_summary(a.results, text.getvalue(), a.runs_dir)
    else:
        print_table(a)


def save_summary(run_dir, table, runs_dir=None):
    """The run's compact summary (summary.py) to
    bench/notes/runs/qwen-bench-<run date>-<commit>.md: what a run commits;
    the raw folder stays where it is."""
    manifest = json.load(open(os.path.join(run_dir, "manifest.json")))
    name = summary.run_name(manifest)
    path = summary.write(summary.summary(manifest, table, name), name,
                         runs_dir)
    log("wrote", os.path.relpath(path, REPO))


def print_table(a):
    d = os.path.abspath(a.results)
    manifest = json.load(open(os.path.join(d, "manifest.json")))
    run = manifest.get("run", {})
    rows = [json.loads(l)
            for l in open_result(os.path.join(d, "results.jsonl"))
            if l.strip()]
    arms = [arm for arm in manifest["arms"]
            if any(r["arm"] == arm for r in rows)] or list(manifest["arms"])
    micro = manifest["micro_batches"]
    flops = manifest["train_flops_per_step"]
    peak = a.peak_tflops * 1e12

    stats = {}
    for arm in arms:
        meas = [r for r in rows if r["arm"] == arm and not r["warmup"]]
        rep = json.load(
            open_result(os.path.join(d, manifest["arms"][arm]["report"])))
        t = rep["totals"]
        s = {"n": len(meas), "report": t}
        if meas:
            times = [r["step_time_s"] for r in meas]
            s["median"] = statistics.median(times)
            s["min"], s["max"] = min(times), max(times)
            s["tokens"] = statistics.median(r["tokens_per_s"] for r in meas)
            s["planned"] = max(r["planned_peak_bytes"] for r in meas)
            s["device_peak"] = max(r["device_peak_bytes"] for r in meas)
            s["pinned"] = max(r["pinned_pool"]["bytes"] for r in meas)
            s["pinned_in_use"] = max(r["pinned_pool"]["in_use"] for r in meas)
            last = meas[-1]["transfers"]
            s["d2h"] = sum(v["d2h_bytes"] for v in last.values())
            s["h2d"] = sum(v["h2d_bytes"] for v in last.values())
            s["finite"] = all(r["loss"] is not None for r in meas)
        stats[arm] = s
    procs = run.get("processes", [])
    failed = [p for p in procs if p["rc"] != 0]

    # An arm of another microbatch shape (arms.json 'shape'; the same tokens
    # a step) is measured against none like any arm, but its report's
    # predictions are against its own unplaced step, not none's.
    def shape(arm):
        info = manifest["arms"][arm]
        return (info.get("micro_batch_size", manifest["micro_batch_size"]),
                info.get("micro_batches", micro))
    own_shape = {arm: shape(arm) != (manifest["micro_batch_size"], micro)
                 for arm in arms}
    base = stats.get("none", {})
    print(f"# {manifest['model']}: seq {manifest['seq']}, "
          f"{micro} x {manifest['micro_batch_size']} sequences, "
          f"{manifest['dtype']}; commit {manifest['commit'][:10]}"
          + (" + uncommitted changes" if manifest.get("dirty_files") else ""))
    print(f"# {run.get('device', '?')} on {run.get('host', '?')} "
          f"({run.get('gpu_before') or 'no nvidia-smi'}); "
          f"{run.get('warmup')} warm-up + {run.get('steps')} measured steps "
          f"per process, {run.get('rounds')} rounds, arms rotated each round")
    if run.get("stopped"):
        st = run["stopped"]
        print(f"# stopped by --time-limit {st['time_limit_s']:g} s after "
              f"{st['rounds_done']} of {run.get('rounds')} rounds")
    print()
    head = ["arm", "steps", "step ms median [min, max]", "tokens/s", "MFU %",
            "planned peak MiB", "measured peak MiB (vs plan)",
            "predicted peak MiB", "act. peak removed % pred / meas",
            "pinned MiB", "d2h / h2d MiB per step (pred)",
            "pred. exposed ms", "pred. step +ms", "meas. step +ms",
            "meas - pred % of step", "meas. stall ms"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    act_before = base.get("report", {}).get("activation_peak_bytes_before")
    for arm in arms:
        s = stats[arm]
        t = s["report"]
        label = arm
        if own_shape[arm]:
            label += " ({1} x {0})".format(*shape(arm))
        pred_exposed = (t["exposed_transfer_seconds_per_microbatch"] *
                        shape(arm)[1])
        pred_delta = t["step_seconds_after"] - t["step_seconds_before"]
        pred_removed = 100 * (1 - t["activation_peak_bytes_after"] /
                              t["activation_peak_bytes_before"])
        if not s["n"]:
            print(f"| {label} | 0 | no measured steps | | | | | "
                  f"{fmt_mib(t['peak_bytes_after'])} | {pred_removed:.1f} / - "
                  f"| | | {pred_exposed * 1e3:.2f} | {pred_delta * 1e3:.2f} | | "
                  f"| {measured_stall(a.results, arm)} |")
            continue
        mfu = 100 * flops / s["median"] / peak
        vs_plan = 100 * (s["device_peak"] / s["planned"] - 1)
        meas_removed = "-"
        meas_delta = "-"
        err = "-"
        if base.get("n"):
            if act_before and not own_shape[arm]:
                meas_removed = (f"{100 * (base['device_peak'] - s['device_peak']) / act_before:.1f}")
            delta = s["median"] - base["median"]
            meas_delta = f"{delta * 1e3:+.2f}"
            if not own_shape[arm]:
                err = f"{100 * (delta - pred_delta) / base['median']:+.2f}"
        print(f"| {label} | {s['n']} | {s['median'] * 1e3:.2f} "
              f"[{s['min'] * 1e3:.2f}, {s['max'] * 1e3:.2f}] | "
              f"{s['tokens']:,.0f} | {mfu:.3g} | {fmt_mib(s['planned'])} | "
              f"{fmt_mib(s['device_peak'])} ({vs_plan:+.2f}%) | "
              f"{fmt_mib(t['peak_bytes_after'])} | {pred_removed:.1f} / "
              f"{meas_removed} | {fmt_mib(s['pinned'])} | "
              f"{fmt_mib(s['d2h'])} / {fmt_mib(s['h2d'])} "
              f"({fmt_mib(t['d2h_bytes_per_step'])}) | {pred_exposed * 1e3:.2f} | "
              f"{pred_delta * 1e3:+.2f} | {meas_delta} | {err} | "
              f"{measured_stall(a.results, arm)} |")
    print()
    variants = [(arm, manifest["arms"][arm]) for arm in arms
                if "variant_of" in manifest["arms"][arm]]
    if variants:
        print("Variants (the base arm's binary and report, run with these "
              "variables; the prediction is the base arm's): " + "; ".join(
                  f"{arm} = {info['variant_of']} with " + " ".join(
                      f"{k}={v}" for k, v in info["env"].items())
                  for arm, info in variants) + ".")
        print()
    print(f"Model FLOPs: {manifest['forward_flops_per_token'] / 1e9:.4g} "
          f"GFLOP forward per token x 3 (forward + backward) x "
          f"{manifest['tokens_per_step']} tokens = {flops / 1e12:.4g} TFLOP "
          f"per step; MFU against {a.peak_tflops} TFLOP/s (formula: "
          f"bench/qwenbench/__init__.py docstring).")
    print("Measured peak: device_peak_bytes (cudaMemGetInfo over the step "
          "less the context; host backend: the arena); planned: "
          "planned_peak_bytes; predicted: the memory timeline's peak (cost "
          "model). Activation peak removed: predicted from the report's "
          "activation peaks; measured = (no-offload device peak - arm device "
          "peak) / predicted no-offload activation peak.")
    print("Exposed transfer: predicted = stalls of the simulated streams x "
          "microbatches; 'pred. step +ms' = the cost model's step time with "
          "minus without the placement (recompute included); measured = "
          "median step time minus the no-offload arm's median; 'meas. stall "
          "ms' = the compute stream's waits for reloads per step, from the "
          "arm's op times (run --op-times-arms; '-' without them).")
    if any(own_shape.values()):
        print("An arm shown as (M x B) runs M microbatches of B sequences "
              "(the same tokens a step); its step is measured against none's, "
              "its predictions are against its own unplaced step, so its "
              "removed peak and prediction error are not shown.")
    bad = [arm for arm in arms if stats[arm]["n"] and
           (stats[arm]["pinned_in_use"] != 0 or not stats[arm]["finite"])]
    if bad:
        print("WARNING: pinned memory in use after a step or a non-finite "
              "loss in:", ", ".join(bad))
    if failed:
        print("FAILED processes:", ", ".join(
            f"{p['arm']} round {p['round']} (rc {p['rc']})" for p in failed))


def measured_stall(results, arm):
    """Milliseconds a step the compute stream waited for reloads in the
    arm's op times (op-times-ARM.json: the '<scope>/wait' labels), or '-'."""
    path = os.path.join(results, f"op-times-{arm}.json")
    if not os.path.exists(path):
        return "-"
    ot = json.load(open(path))
    waits = sum(v["seconds"] for k, v in ot["ops"].items()
                if k.endswith("/wait"))
    return f"{waits / ot['steps'] * 1e3:.2f}"

