#!/bin/bash
# Host check of bench/memory_bench.py before GPU time is spent on it: build
# a budget arm, an unreachable budget arm and the two length arms of
# models/tiny-hybrid.json with BUILD_DIR's actplace-compile, run them on the
# host backend and check the rows: the reachable arms ran every step with a
# runtime peak equal to their plan's device figure or above it by at most
# the workspace, the budget arm records its choice, the unreachable budget
# did not compile and says why.
#   bench/memory_bench_test.sh WORKDIR BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
work=$1 build=$2
rm -rf "$work" && mkdir -p "$work"
python3 bench/memory_bench.py build --out "$work/arms" \
  --compile "$build/bin/actplace-compile" --model models/tiny-hybrid.json \
  --profile "" --budgets-gib 1,2 --seq 64 --global-batch-tokens 512 \
  --seqs 64 2> "$work/build.log"
python3 bench/memory_bench.py run --dir "$work/arms" --out "$work/rows.jsonl" \
  --device host --steps 2 2> "$work/run.log" | tee "$work/table.md"
python3 - "$work/rows.jsonl" <<'PY'
import json, sys
rows = {r["name"]: r for r in map(json.loads, open(sys.argv[1]))}
def check(ok, msg):
    if not ok:
        sys.exit("memory_bench_test: " + msg)
check(set(rows) == {"b1", "b2", "s64-none", "s64-placed"}, "arms %s" % sorted(rows))
check(rows["b1"]["fits"] is False and "not more than" in rows["b1"]["error"],
      "b1: %r" % rows["b1"])
for name in ("b2", "s64-none", "s64-placed"):
    r = rows[name]
    check(r["fits"] and r["steps"] == 2 and r["exit"] == 0, "%s: %r" % (name, r))
    check(r["device_peak_bytes"] >= r["planned_arena_bytes"] > 0,
          "%s: peak %s, arena %s" % (name, r["device_peak_bytes"],
                                     r["planned_arena_bytes"]))
    check(r["tokens_per_s"] > 0 and all(l is not None for l in r["losses"]),
          "%s: %r" % (name, r))
check(rows["b2"]["choice"].startswith("micro-batch size "), "b2 choice")
check(rows["b2"]["within_budget"] is None, "b2: a host run has no driver figure")
print("memory_bench_test: ok")
PY
