#!/usr/bin/env python3
"""Ours against flash-linear-attention's chunked gated delta rule, in
interleaved processes: ours (build-gdn/gdn_bench), then FLA
(bench/gdn_bench_fla.py), N times over, on one GPU in one call; then, per
batch size, the median and range of each implementation's forward, backward
and forward + backward times over the N samples, and the ratio of the
medians. Each sample is one process's median of many calls (gdn_bench: 30
CUDA-event timings; FLA: triton.testing.do_bench), so the samples show
process-to-process and drift spread, which one process cannot.

  python3 bench/gdn_interleave.py run --samples 5 --out DIR
      (on the GPU machine: carry build-gdn/gdn_bench and
      third_party_untracked/fla-src; FLA's Triton cache lives in DIR/triton,
      so only the first FLA process compiles)
  python3 bench/gdn_interleave.py table DIR   (here or there)
  python3 bench/gdn_interleave.py selftest    (the parser, no GPU)
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A result line of either program: B, T, fwd ms, bwd ms, fwd + bwd ms, at the
# start of the line (gdn_bench's indented lines, floors and splits, are not
# results).
ROW = re.compile(r"^(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)")


def parse(text):
    """{B: (fwd, bwd, total)} from one process's output."""
    rows = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            rows[int(m.group(1))] = tuple(float(m.group(i)) for i in (3, 4, 5))
    return rows


def run(a):
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(a.out, "triton"),
               PYTHONUNBUFFERED="1")
    ours = [os.path.join(REPO, "build-gdn", "gdn_bench")]
    fla = [sys.executable, os.path.join(REPO, "bench", "gdn_bench_fla.py")]
    for i in range(a.samples):
        for name, cmd in (("ours", ours), ("fla", fla)):
            path = os.path.join(a.out, f"{name}.{i}.txt")
            t0 = time.time()
            with open(path, "w") as f:
                try:
                    rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                                        env=env, timeout=a.timeout).returncode
                except subprocess.TimeoutExpired:
                    rc = "timeout"
            print(f"sample {i + 1} of {a.samples}: {name} rc={rc} "
                  f"{time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    table(a.out)


def samples(out, name):
    """Per B, the list of (fwd, bwd, total) over the sample files."""
    by_b = {}
    i = 0
    while os.path.exists(os.path.join(out, f"{name}.{i}.txt")):
        with open(os.path.join(out, f"{name}.{i}.txt")) as f:
            for b, v in parse(f.read()).items():
                by_b.setdefault(b, []).append(v)
        i += 1
    return by_b


def summary(values):
    """'median [min, max]' of a list of floats."""
    return (f"{statistics.median(values):.3f} [{min(values):.3f}, "
            f"{max(values):.3f}]")


def table(out):
    ours, fla = samples(out, "ours"), samples(out, "fla")
    if not ours and not fla:
        sys.exit(f"table: no ours.N.txt or fla.N.txt results in {out}")
    print("| B | impl | samples | fwd ms | bwd ms | fwd+bwd ms |")
    print("|---|---|---|---|---|---|")
    for b in sorted(set(ours) | set(fla)):
        for name, runs in (("ours", ours.get(b, [])), ("FLA", fla.get(b, []))):
            if not runs:
                print(f"| {b} | {name} | 0 | | | |")
                continue
            cols = [summary([r[k] for r in runs]) for k in range(3)]
            print(f"| {b} | {name} | {len(runs)} | " + " | ".join(cols) + " |")
        if ours.get(b) and fla.get(b):
            mo = statistics.median(r[2] for r in ours[b])
            mf = statistics.median(r[2] for r in fla[b])
            print(f"| {b} | FLA / ours (fwd+bwd medians) | | | | "
                  f"{mf / mo:.2f}x |")


def selftest():
    ours = """B    T        fwd_ms    bwd_ms  total_ms  fwd_GFLOP  bwd_GFLOP
1    4096      0.276     0.639     0.913       11.8       33.3       76.3
     floors at 4.3 TB/s: fwd 0.018 ms, bwd 0.030 ms
     split slices/CTA   fwd_ms   bwd_ms total_ms  bits
         4          1    0.268    0.623    0.885  equal
4    4096      0.730     1.789     2.443       47.2      133.1      305.1
"""
    fla = """torch 2.11.0 triton 3.6.0
B    T     fla_fwd_ms fla_bwd_ms fla_total_ms
1    4096       0.506      2.632        3.138
4    4096       0.762      2.230        2.992
"""
    assert parse(ours) == {1: (0.276, 0.639, 0.913), 4: (0.730, 1.789, 2.443)}
    assert parse(fla) == {1: (0.506, 2.632, 3.138), 4: (0.762, 2.230, 2.992)}
    assert summary([3.0, 1.0, 2.0]) == "2.000 [1.000, 3.000]"
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        for i, (o, f) in enumerate(((ours, fla), (ours.replace("0.913", "0.915"),
                                                 fla))):
            open(os.path.join(d, f"ours.{i}.txt"), "w").write(o)
            open(os.path.join(d, f"fla.{i}.txt"), "w").write(f)
        got = samples(d, "ours")
        assert [r[2] for r in got[1]] == [0.913, 0.915], got
    print("gdn_interleave selftest: ok")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="ours and FLA alternated, N samples each")
    r.add_argument("--samples", type=int, default=5)
    r.add_argument("--out", required=True)
    r.add_argument("--timeout", type=float, default=300,
                   help="seconds per process (FLA's first compiles Triton)")
    t = sub.add_parser("table", help="the table of a run folder")
    t.add_argument("out")
    sub.add_parser("selftest", help="the parser on fixed outputs")
    a = p.parse_args()
    if a.cmd == "run":
        if a.samples < 1:
            sys.exit("run: --samples must be at least 1")
        run(a)
    elif a.cmd == "table":
        table(a.out)
    else:
        selftest()


if __name__ == "__main__":
    main()
