#!/bin/bash
# What the placement search finds for Qwen3.5-0.8B (seq 4096, 4 x 1) under
# the run-9 profile and under hypothetical ones derived from it
# (bench/profiles/whatif-d2fc210/: copies free or half price, the norms and
# SwiGLU recomputed for free as if fused into their consumers, the conv at
# its roofline, ...): a 60 % activation cut and a 3 % step budget each.
# Predictions only (actplace-opt, no GPU). Prints a markdown table.
#   bench/whatif_search.sh [BUILD]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
graph=$(mktemp)
trap 'rm -f "$graph"' EXIT
"$build/bin/actplace-import" models/qwen3.5-0.8b.json --seq 4096 \
  --micro-batches 4 -o "$graph"
echo "| profile | goal | removed % | step + % | chosen |"
echo "|---|---|---|---|---|"
for p in bench/profiles/h200-optimes-d2fc210.json bench/profiles/whatif-d2fc210/*.json; do
  for goal in activation-cut=0.6 step-budget=0.03; do
    echo "$(basename "$p") $goal" >&2
    line=$("$build/bin/actplace-opt" "$graph" -train-autodiff \
      "-train-plan-budget=$goal profile=$p log-file=-" -o /dev/null 2>&1 |
      grep '^chose: ') || line="chose: (not reachable)"
    python3 - "$p" "$goal" "$line" <<'PY'
import re, sys, os
p, goal, line = sys.argv[1:]
m = re.match(r"chose: (.*) \(removes ([0-9.]+) % .* step ([+-][0-9.]+) %", line)
if m:
    print(f"| {os.path.basename(p)} | {goal} | {m.group(2)} | {m.group(3)} | {m.group(1)} |")
else:
    print(f"| {os.path.basename(p)} | {goal} | - | - | {line[7:]} |")
PY
  done
done
