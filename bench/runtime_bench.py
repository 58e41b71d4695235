#!/usr/bin/env python3
"""Tables from runtime_offload_bench output (one JSON object per line).

usage: runtime_bench.py [results.jsonl]   (default: stdin)

Prints the offload-engine vs raw cudaMemcpyAsync bandwidth per size and
direction, the compute-kernel slowdown with copies beside it, and the
issue-4 goals (engine >= 95% of raw from 4 MiB, both directions near
101 GB/s, slowdown <= 5%).
"""
import json
import sys


def main():
    src = open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin
    bw, slow, other = {}, [], []
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
        else:
            other.append(r)
    for r in other:
        print(" ".join(f"{k}={v}" for k, v in r.items()))
    sizes = sorted({k[0] for k in bw})
    dirs = ["d2h", "h2d", "both"]
    head = "| MiB |" + "".join(f" raw {d} | engine {d} | ratio |" for d in dirs)
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
    for r in slow:
        print(f"- {r['kernel']} with {r.get('traffic', 'engine_both')} slowdown {r['slowdown_pct']:.2f}% -> "
              f"{'met' if r['slowdown_pct'] <= 5 else 'NOT met'} (goal <= 5%)")


if __name__ == "__main__":
    main()
