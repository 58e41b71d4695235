#!/usr/bin/env python3
"""Tables from runtime_offload_bench output (one JSON object per line).

usage: runtime_bench.py [results.jsonl] [nvidia-smi.csv ...]   (default: stdin)

Prints the offload-engine vs raw cudaMemcpyAsync bandwidth per size and
direction, the compute-kernel slowdown with copies beside it, and the
issue-4 goals (engine >= 95% of raw from 4 MiB, both directions near
101 GB/s, slowdown <= 5%). With `clocks` output (clock_phase lines) it
prints, per kernel and copy mode, the time, SM clock (in-kernel probe) and
cycles per launch against the neighbouring alone phases, the compute lost
per GB copied, and, given nvidia-smi CSV files sampled during the run
(`--query-gpu=timestamp,...` with `--format=csv,nounits`), the board power
and clock-event reasons inside each phase's window.
"""
import datetime
import json
import statistics
import sys

TIME_FMT = "%Y/%m/%d %H:%M:%S.%f"


def read_smi(paths):
    """nvidia-smi CSV rows as (datetime, {column: value}), all files merged."""
    rows = []
    for path in paths:
        head = None
        for line in open(path):
            cells = [c.strip() for c in line.split(",")]
            if head is None:
                if cells and cells[0] == "timestamp":
                    head = [c.split(" [")[0] for c in cells]
                continue
            if len(cells) != len(head):
                continue
            try:
                t = datetime.datetime.strptime(cells[0], TIME_FMT)
            except ValueError:
                continue
            vals = {}
            for k, v in zip(head[1:], cells[1:]):
                try:
                    vals[k] = int(v, 16) if v.startswith("0x") else float(v)
                except ValueError:
                    pass
            rows.append((t, vals))
    return rows


def smi_window(rows, start, end):
    """Median power/clock and the clock-event reasons seen in [start, end]."""
    t0 = datetime.datetime.strptime(start, TIME_FMT)
    t1 = datetime.datetime.strptime(end, TIME_FMT)
    inside = [v for t, v in rows if t0 <= t <= t1]
    out = {"n": len(inside)}
    for key in ("power.draw.instant", "power.draw", "clocks.sm", "clocks.current.sm"):
        vals = [v[key] for v in inside if key in v]
        if vals:
            out[key] = statistics.median(vals)
    reasons = [v[k] for v in inside for k in v if k.startswith("clocks_event_reasons")]
    if reasons:
        out["reasons"] = 0
        for r in reasons:
            out["reasons"] |= int(r)
        out["pwrcap_frac"] = sum(1 for r in reasons if int(r) & 0x4) / len(reasons)
    return out


def phase_stats(r):
    """Medians over the samples after the first quarter (the copies had time
    to move the clock): ms per sample, MHz, and cycles per sample (M)."""
    ms, mhz = r["ms"], r["mhz"]
    lo = len(ms) // 4
    ms, mhz = ms[lo:], mhz[lo:]
    cyc = [a * f * 1e-3 for a, f in zip(ms, mhz)]  # ms * MHz * 1e3 / 1e6
    return statistics.median(ms), statistics.median(mhz), statistics.median(cyc)


def clock_tables(phases, smi):
    by_gemm = {}
    for r in phases:
        by_gemm.setdefault(r["gemm"], []).append(r)
    for gemm, rs in by_gemm.items():
        # Each traffic phase sits between two alone phases: compare with both.
        per_mode = {}
        for i, r in enumerate(rs):
            if r["traffic"] == "none":
                continue
            alone = [rs[j] for j in (i - 1, i + 1)
                     if 0 <= j < len(rs) and rs[j]["traffic"] == "none"]
            a = [phase_stats(x) for x in alone]
            w = phase_stats(r)
            a_ms = statistics.mean(x[0] for x in a)
            a_mhz = statistics.mean(x[1] for x in a)
            a_cyc = statistics.mean(x[2] for x in a)
            gb_per_sample = r["copy_gbps"] * w[0] * 1e-3
            row = {
                "alone_ms": a_ms, "ms": w[0], "slow": 100 * (w[0] / a_ms - 1),
                "alone_mhz": a_mhz, "mhz": w[1], "dclk": 100 * (w[1] / a_mhz - 1),
                "alone_cyc": a_cyc, "cyc": w[2], "dcyc": 100 * (w[2] / a_cyc - 1),
                "gbps": r["copy_gbps"], "covered": r["covered"],
                "ms_per_gb": (w[0] - a_ms) / gb_per_sample if gb_per_sample > 0 else 0.0,
            }
            if smi:
                ws = smi_window(smi, r["start"], r["end"])
                wa = [smi_window(smi, x["start"], x["end"]) for x in alone]
                row["smi"], row["smi_alone"] = ws, wa
            per_mode.setdefault(r["traffic"], []).append(row)
        print(f"\nClock experiment: {gemm} (median over rounds; each with-copies phase "
              "against the mean of the alone phases on either side)\n")
        print("| copies beside | rounds | copy GB/s | alone ms | with ms | slowdown % | "
              "alone MHz | with MHz | clock % | cycles % | ms lost per GB | "
              "W alone / with | SW power cap samples alone / with |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        med = statistics.median
        for mode, rows in per_mode.items():
            watts, cap = "-", "-"
            if smi:
                def pw(w):
                    return w.get("power.draw.instant", w.get("power.draw"))
                wa = [pw(x) for row in rows for x in row["smi_alone"] if pw(x) is not None]
                ww = [pw(row["smi"]) for row in rows if pw(row["smi"]) is not None]
                if wa and ww:
                    watts = f"{med(wa):.0f} / {med(ww):.0f}"
                ca = [x["pwrcap_frac"] for row in rows for x in row["smi_alone"] if "pwrcap_frac" in x]
                cw = [row["smi"]["pwrcap_frac"] for row in rows if "pwrcap_frac" in row["smi"]]
                if ca and cw:
                    cap = f"{100 * med(ca):.0f}% / {100 * med(cw):.0f}%"
            print(f"| {mode} | {len(rows)} | {med([x['gbps'] for x in rows]):.1f} | "
                  f"{med([x['alone_ms'] for x in rows]):.4f} | {med([x['ms'] for x in rows]):.4f} | "
                  f"{med([x['slow'] for x in rows]):.2f} "
                  f"({min(x['slow'] for x in rows):.1f}..{max(x['slow'] for x in rows):.1f}) | "
                  f"{med([x['alone_mhz'] for x in rows]):.0f} | {med([x['mhz'] for x in rows]):.0f} | "
                  f"{med([x['dclk'] for x in rows]):.2f} | {med([x['dcyc'] for x in rows]):.2f} | "
                  f"{med([x['ms_per_gb'] for x in rows]):.3f} | {watts} | {cap} |"
                  + ("" if all(x["covered"] for x in rows) else " (copy streams idle at the end: expected when paced)"))


def main():
    src = open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin
    smi = read_smi(sys.argv[2:])
    bw, slow, other, phases = {}, [], [], []
    for line in src:
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r["kind"] == "bw":
            bw[(r["bytes"], r["path"], r["dir"])] = r["gbps"]
        elif r["kind"] == "slowdown":
            slow.append(r)
        elif r["kind"] == "kernel_run":
            continue
        elif r["kind"] == "clock_phase":
            phases.append(r)
        else:
            other.append(r)
    for r in other:
        print(" ".join(f"{k}={v}" for k, v in r.items()))
    sizes = sorted({k[0] for k in bw})
    dirs = ["d2h", "h2d", "both"]
    head = "| MiB |" + "".join(f" raw {d} | engine {d} | ratio |" for d in dirs)
    if sizes:
        print("\nBandwidth, GB/s (both = D2H + H2D bytes over the same time)\n")
        print(head)
        print("|" + "---|" * (1 + 3 * len(dirs)))
    goals = []
    for s in sizes:
        row = f"| {s >> 20} |"
        for d in dirs:
            raw, eng = bw.get((s, "raw", d)), bw.get((s, "engine", d))
            if raw is None or eng is None:
                row += " - | - | - |"
                continue
            ratio = eng / raw
            row += f" {raw:.1f} | {eng:.1f} | {ratio:.3f} |"
            if s >= 4 << 20:
                goals.append((s, d, ratio, eng))
        print(row)
    if slow:
        print("\nCompute kernel with offload/reload copies beside it\n")
        print("| kernel | copies beside | alone ms | rate alone | with copies ms | slowdown % | copies covered window |")
        print("|---|---|---|---|---|---|---|")
        for r in slow:
            print(f"| {r['kernel']} | {r.get('traffic', 'engine_both')} | {r['alone_ms']:.3f} | "
                  f"{r['rate_alone']:.1f} {r['unit']} | {r['with_copies_ms']:.3f} | "
                  f"{r['slowdown_pct']:.2f} | {r['copies_covered']} |")
    if goals:
        worst = min(goals, key=lambda g: g[2])
        both = [g[3] for g in goals if g[1] == "both"]
        print("\nGoals")
        print(f"- engine/raw >= 0.95 for >= 4 MiB: worst {worst[2]:.3f} "
              f"({worst[0] >> 20} MiB {worst[1]}) -> {'met' if worst[2] >= 0.95 else 'NOT met'}")
        if both:
            print(f"- both directions: engine {min(both):.1f}..{max(both):.1f} GB/s (goal near 101)")
    if phases:
        clock_tables(phases, smi)
    for r in slow:
        print(f"- {r['kernel']} with {r.get('traffic', 'engine_both')} slowdown {r['slowdown_pct']:.2f}% -> "
              f"{'met' if r['slowdown_pct'] <= 5 else 'NOT met'} (goal <= 5%)")


if __name__ == "__main__":
    main()
