#!/bin/bash
# End-to-end check of bench/qwen_train_bench.py on the host backend, before
# any GPU time is spent: build every arm of models/tiny-hybrid.json (seq 64,
# 4 microbatches) with build-bench, run 3 + 10 steps per arm in 2 rotated
# rounds with --device host, print the table and check it: every arm has 20
# measured steps, no process failed, no warning, the offloading arms moved
# bytes and the no-offload arm none.
#   bench/qwen_train_bench_test.sh [WORKDIR [BUILD_DIR]]
# WORKDIR: default a fresh temp dir. BUILD_DIR: an existing build whose
# actplace-compile / -import / -opt are used as they are (ctest passes its
# own); default build-bench, brought up to date first.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-$(mktemp -d)}
build_args=() tools_args=()
if [ -n "${2:-}" ]; then
  build_args=(--build-dir "$2" --no-rebuild)
  tools_args=(--build-dir "$2")
fi
mkdir -p "$work"
rm -rf "$work/carry" "$work/run"
python3 bench/qwen_train_bench.py build "${build_args[@]}" --model models/tiny-hybrid.json \
  --seq 64 --micro-batches 4 --carry "$work/carry" 2> "$work/build.log"
python3 bench/qwen_train_bench.py run --carry "$work/carry" \
  --out "$work/run" --device host --rounds 2 --op-times-arms ref,max \
  --timeline 2> "$work/run.log"
python3 bench/qwen_train_bench.py table "$work/run" | tee "$work/table.md"
# Calibration from the binary's own kernel times, then the table again.
test -s "$work/run/op-times.json"
# --timeline: each op-times process wrote its last step's launches.
python3 - "$work/run" <<'PY'
import json, os, sys
m = json.load(open(os.path.join(sys.argv[1], "manifest.json")))["run"]
entries = [m["op_times"]["stream"]] + list(m["op_times_arms"].values())
for e in entries:
    tl = json.load(open(os.path.join(sys.argv[1], e["timeline"])))
    assert tl["launches"] and tl["step"] == e["steps"] + 1, (e, tl["step"])
    assert {l["stream"] for l in tl["launches"]} <= {"compute", "side"}, e
PY
python3 bench/qwen_train_bench.py overlap "$work/run" --arm max > "$work/overlap.md"
grep -q "^| all ([0-9]* ops) |" "$work/overlap.md"
grep -q "^side stream busy" "$work/overlap.md"
# overlap's split on synthetic launches: a norm with side work over half of
# it counts as beside, one without as alone; a split op shows as added.
python3 - <<'PY'
import sys
sys.path.insert(0, "bench")
from qwenbench import tables as qb
L = lambda label, stream, s, e: {"label": label, "stream": stream,
                                 "start_us": s, "end_us": e}
base = [L("L1.attn_norm/rms_norm", "compute", 0, 8),
        L("L0.attn_norm/rms_norm", "compute", 10, 18),
        L("L0.mlp_fc2/linear_grad", "compute", 20, 120)]
placed = [L("L1.attn_norm/rms_norm", "compute", 0, 18),
          L("L9.mlp_fc1/linear(recompute)", "side", 5, 60),
          L("L0.attn_norm/rms_norm", "compute", 70, 78),
          L("L0.mlp_fc2/linear_input_grad", "compute", 80, 130),
          L("L0.mlp_fc2/linear_grad", "compute", 131, 181)]
rows, side = qb.overlap_rows(base, placed)
norm = rows["attn_norm/rms_norm"]
assert side == 55 and norm["beside"] == 10 and norm["alone"] == 0, rows
assert norm["side_us"] == 13 and norm["launches"] == 2, norm
assert rows["mlp_fc2/linear_input_grad"]["alone"] == 50, rows
assert rows["mlp_fc2/linear_grad"]["alone"] == -50, rows
PY
python3 bench/qwen_train_bench.py calibrate "${tools_args[@]}" "$work/run" \
  --op-times "$work/run/op-times.json" --out "$work/profile.json" \
  2> "$work/calibrate.log"
python3 - "$work/profile.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
assert p["computeScale"] > 0 and p["copySlowdownPerByte"] >= 0, p
# The profile says what produced it: the command, the commit, the date and
# the binaries of the run it was fitted to.
prov = p["provenance"]
assert prov["command"].startswith("bench/qwen_train_bench.py calibrate "), prov
assert "--op-times" in prov["command"] and prov["date"][:2] == "20", prov
assert prov["binary"].startswith("actplace-compile of ") and \
    "run folder run" in prov["binary"], prov
assert len(prov["commit"].split()[0]) == 40, prov
for op in ("train.linear", "train.linear_grad", "train.gated_delta_rule"):
    assert p["opScale"].get(op, 0) > 0, (op, p["opScale"])
print("calibrated profile: %d op scales, computeScale %.3g" %
      (len(p["opScale"]), p["computeScale"]))
PY
# Copies that slow the kernels beside them: the measured per-kernel rates
# times a given factor, and times a factor fitted on the offloading arms.
python3 bench/qwen_train_bench.py calibrate "${tools_args[@]}" "$work/run" \
  --op-times "$work/run/op-times.json" --out "$work/profile-beside2.json" \
  --copy-beside bench/notes/data/h200-copy-rates-d29.json \
  --copy-beside-scale 2 --copy-hold-slack 0.3 2> "$work/calibrate-beside2.log"
python3 bench/qwen_train_bench.py calibrate "${tools_args[@]}" "$work/run" \
  --op-times "$work/run/op-times.json" --out "$work/profile-beside.json" \
  --copy-beside bench/notes/data/h200-copy-rates-d29.json \
  2> "$work/calibrate-beside.log"
grep -q 'least squares over' "$work/calibrate-beside.log"
# --also with a copy of the same run folder: every arm counted twice, each
# against its own (equal) none: the same least-squares factor.
rm -rf "$work/run-copy" && cp -r "$work/run" "$work/run-copy"
python3 bench/qwen_train_bench.py calibrate "${tools_args[@]}" "$work/run" \
  --op-times "$work/run/op-times.json" --out "$work/profile-beside-also.json" \
  --copy-beside bench/notes/data/h200-copy-rates-d29.json \
  --also "$work/run-copy" 2> "$work/calibrate-beside-also.log"
grep -q "run-copy:" "$work/calibrate-beside-also.log"
python3 - "$work/profile-beside.json" "$work/profile-beside-also.json" <<'PY'
import json, sys
one, two = (json.load(open(p))["h2dSlowdown"]["*"] for p in sys.argv[1:])
assert abs(one - two) <= 1e-6 * abs(one) + 1e-24, (one, two)
print("calibrate --also: the same folder twice gives the same factor")
PY
python3 - "$work/profile-beside2.json" "$work/profile-beside.json" <<'PY'
import json, sys
rates = json.load(open("bench/notes/data/h200-copy-rates-d29.json"))
given, fitted = (json.load(open(p)) for p in sys.argv[1:])
for p in (given, fitted):
    assert "copySlowdownPerByte" not in p, p.keys()
    assert set(p["h2dSlowdown"]) == set(rates["h2dSlowdown"]), p
assert given["copyHoldSlack"] == 0.3
for key in ("h2dSlowdown", "d2hSlowdown"):
    for op, v in rates[key].items():
        assert abs(given[key][op] - 2e-12 * v) <= 1e-18, (key, op)
k = fitted["h2dSlowdown"]["*"] / (1e-12 * rates["h2dSlowdown"]["*"])
assert k >= 0 and all(
    abs(fitted[key][op] - k * 1e-12 * v) <= 1e-6 * k * 1e-12 * v + 1e-24
    for key in ("h2dSlowdown", "d2hSlowdown")
    for op, v in rates[key].items()), fitted
print("calibrate --copy-beside: rates x 2 as given, x %.3g fitted" % k)
PY
# The fit itself, on predictions linear in the factor: arms whose measured
# increase is what factor 1.7 predicts give back 1.7.
python3 - "$work" <<'PY'
import argparse, json, os, sys
sys.path.insert(0, "bench")
from qwenbench import calibrate as q
out = os.path.join(sys.argv[1], "profile-fit-synthetic.json")
slope = {"a": 0.004, "b": 0.010}   # s per unit factor
base = {"a": 0.001, "b": 0.003}    # predicted increase at factor 0
def predicted(arm, profile):
    k = profile["h2dSlowdown"]["*"] / (1e-12 * 0.793)
    return 0.3 + (0 if arm == "none" else base[arm] + k * slope[arm])
med = {"none": (0.3, {}), **{arm: (0.3 + base[arm] + 1.7 * slope[arm],
                                   {"offloaded_bytes": 1}) for arm in base}}
a = argparse.Namespace(copy_beside="bench/notes/data/h200-copy-rates-d29.json",
                       copy_beside_scale=None, out=out, side_capacity_arms="",
                       side_copy_arms="")
q.write_copy_beside(a, {"computeScale": 1.0}, med, [], predicted, 1.0,
                    0.3, 0.3)
k = json.load(open(out))["h2dSlowdown"]["*"] / (1e-12 * 0.793)
assert abs(k - 1.7) < 1e-4, k
print("calibrate --copy-beside fit: factor 1.7 recovered (%.5f)" % k)
# calibrate --also: arms of a second run folder join the fit, each against
# its own none (0.31 s there, 0.3 s here). Run B alone would say 2.5: the
# fit over both must land between, at the least-squares value.
def predicted_b(arm, profile):
    k = profile["h2dSlowdown"]["*"] / (1e-12 * 0.793)
    return 0.31 + (0 if arm == "none" else 0.002 + k * 0.006)
med_a = {"none": (0.3, {}), "a": (0.3 + 0.001 + 1.7 * 0.004,
                                  {"offloaded_bytes": 1})}
run_b = q.FitRun("B", {"none": (0.31, {}),
                       "c": (0.31 + 0.002 + 2.5 * 0.006,
                             {"offloaded_bytes": 1})},
                 predicted_b, 0.31, 0.31)
q.write_copy_beside(a, {"computeScale": 1.0}, med_a, ["a", "c"], predicted,
                    1.0, 0.3, 0.3, [run_b])
k = json.load(open(out))["h2dSlowdown"]["*"] / (1e-12 * 0.793)
want = (1.7 * 0.004 ** 2 + 2.5 * 0.006 ** 2) / (0.004 ** 2 + 0.006 ** 2)
assert abs(k - want) < 1e-4, (k, want)
print("calibrate --also: factor %.4f over two run folders (want %.4f)"
      % (k, want))
# calibrate --side-capacity-arms: each arm's predicted increase falls
# linearly with the side capacity; measured at capacity 0.37.
gain = {"a": 0.004, "b": 0.009}
def predicted_side(arm, profile):
    c = profile["sideCapacity"]["train.gated_delta_rule_grad"]
    return 0.3 + (0 if arm == "none" else gain[arm] * (1 - c))
med = {"none": (0.3, {}), **{arm: (0.3 + g * (1 - 0.37), {})
                              for arm, g in gain.items()}}
a = argparse.Namespace(side_capacity_arms="a,b",
                       side_capacity_op="train.gated_delta_rule_grad")
prof = {}
q.fit_side_capacity(a, prof, med, predicted_side, 0.3, 0.3)
c = prof["sideCapacity"]["train.gated_delta_rule_grad"]
assert abs(c - 0.37) <= 0.01, c
# Arms whose predictions ignore the capacity: an error, not a fit.
try:
    q.fit_side_capacity(a, {}, med, lambda arm, p: 0.3, 0.3, 0.3)
    assert False, "a flat fit was accepted"
except SystemExit as e:
    assert "do not depend on the side capacity" in str(e), e
print("calibrate --side-capacity-arms fit: capacity 0.37 recovered (%.3f)" % c)
# Over two run folders: the same arm measured at 0.37 here and at 0.37
# against another none there gives 0.37 back; the arm only in the other
# folder is fitted too.
run_b = q.FitRun("B", {"none": (0.31, {}), "a": (0.31 + 0.004 * 0.63, {}),
                       "c": (0.31 + 0.006 * 0.63, {})},
                 lambda arm, p: 0.31 + (0 if arm == "none" else
                                        {"a": 0.004, "c": 0.006}[arm] *
                                        (1 - p["sideCapacity"][
                                            "train.gated_delta_rule_grad"])),
                 0.31, 0.31)
a2 = argparse.Namespace(side_capacity_arms="a,c",
                        side_capacity_op="train.gated_delta_rule_grad")
prof = {}
q.fit_side_capacity(a2, prof, med, predicted_side, 0.3, 0.3, [run_b])
c = prof["sideCapacity"]["train.gated_delta_rule_grad"]
assert abs(c - 0.37) <= 0.01, c
try:
    q.fit_side_capacity(argparse.Namespace(
        side_capacity_arms="zz", side_capacity_op="x"), {}, med,
        predicted_side, 0.3, 0.3, [run_b])
    assert False, "an arm no folder measured was accepted"
except SystemExit as e:
    assert "no run folder measured" in str(e), e
print("calibrate --also, side capacity over two folders: %.3f" % c)
# calibrate --side-copy-arms: predictions linear in sideStreamCopyScale,
# arm a here measured at scale 2.75 and arm c in folder B at 2.75 against
# its own none: 2.75 back; an arm whose prediction ignores it is an error.
def lin(none, base, slope):
    return lambda arm, p: none + (0 if arm == "none" else
                                  base[arm] + slope[arm] *
                                  p.get("sideStreamCopyScale", 1.0))
pred_a = lin(0.3, {"a": 0.004}, {"a": 0.002})
run_a = q.FitRun("", {"none": (0.3, {}), "a": (0.3 + 0.004 + 2.75 * 0.002,
                                              {})}, pred_a, 0.3, 0.3)
pred_c = lin(0.31, {"c": 0.001}, {"c": 0.003})
run_c = q.FitRun("B", {"none": (0.31, {}), "c": (0.31 + 0.001 + 2.75 * 0.003,
                                                {})}, pred_c, 0.31, 0.31)
prof = {}
q.fit_side_copy_scale(argparse.Namespace(side_copy_arms="a,c"), prof,
                      [run_a, run_c])
s = prof["sideStreamCopyScale"]
assert abs(s - 2.75) < 1e-3, s
flat = q.FitRun("", {"none": (0.3, {}), "a": (0.31, {})},
                lambda arm, p: 0.3, 0.3, 0.3)
for arms, runs, what in (("a", [flat], "do not depend"),
                         ("zz", [run_a], "no run folder measured")):
    try:
        q.fit_side_copy_scale(argparse.Namespace(side_copy_arms=arms), {},
                              runs)
        assert False, "accepted: " + what
    except SystemExit as e:
        assert what in str(e), e
print("calibrate --side-copy-arms: scale 2.75 recovered over two folders "
      "(%.4f)" % s)
PY
python3 bench/qwen_train_bench.py predict "${tools_args[@]}" "$work/run" \
  --profile "$work/profile.json" --out "$work/calibrated" 2> "$work/predict.log"
python3 bench/qwen_train_bench.py table "$work/calibrated" > "$work/table-calibrated.md"
# Bit identity and stability: three arms with fingerprints, then a longer
# run of the most aggressive arm; and the checker must see a violation.
python3 bench/qwen_train_bench.py check --carry "$work/carry" \
  --out "$work/check" --device host --arms none,elem46-fc1,max,max-1rank \
  --variant 'max-1rank=max:RANK=0;WORLD_SIZE=1' --steps 3 \
  --fingerprints 2> "$work/check.log" | tee "$work/check.md"
grep -q '^PASS: 4 arms, 3 steps, fingerprints equal' "$work/check.md"
# A variant's environment reaches its process: a bad launcher value fails it.
if python3 bench/qwen_train_bench.py check --carry "$work/carry" \
    --out "$work/variant-bad" --device host --arms none-bad \
    --variant 'none-bad=none:RANK=0;WORLD_SIZE=half' --steps 1 \
    > "$work/variant-bad.md" 2> "$work/variant-bad.log"; then
  echo "a variant with WORLD_SIZE=half passed" >&2; exit 1
fi
grep -q "WORLD_SIZE='half'" "$work/variant-bad/none-bad.check.log"
python3 bench/qwen_train_bench.py check --carry "$work/carry" \
  --out "$work/stability" --device host --arms max --steps 30 \
  2> "$work/stability.log" > "$work/stability.md"
grep -q '^PASS: 1 arms, 30 steps' "$work/stability.md"
# --baseline: one arm's fingerprints against an earlier check's (here
# none's, xz-compressed as run folders may keep them); one changed
# fingerprint in the baseline must fail it; one arm without a baseline says
# it compared nothing. --pack leaves the folder as one tar.
python3 - "$work/check/none.check.jsonl" "$work/none-base.check.jsonl.xz" <<'PY'
import lzma, shutil, sys
with open(sys.argv[1], "rb") as f, lzma.open(sys.argv[2], "wb") as o:
    shutil.copyfileobj(f, o)
PY
python3 bench/qwen_train_bench.py check --carry "$work/carry" \
  --out "$work/check-base" --device host --arms elem46-fc1 --steps 3 \
  --fingerprints --baseline "$work/none-base.check.jsonl.xz" \
  --pack "$work/check-base.tgz" 2> "$work/check-base.log" \
  | tee "$work/check-base.md"
grep -q '^PASS: 1 arms, 3 steps, fingerprints equal at every step (1 arm against .*none-base.check.jsonl.xz)' "$work/check-base.md"
# (Listings go to files first: under pipefail a grep -q that stops reading
# early fails the command before it.)
tar -tzf "$work/check-base.tgz" > "$work/check-base.list"
grep -q '^check-base/check.json$' "$work/check-base.list"
python3 - "$work/check/none.check.jsonl" "$work/none-bad.check.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
lines[1]["fingerprints"]["grads"] = "0" * 64
open(sys.argv[2], "w").write("".join(json.dumps(l) + "\n" for l in lines))
PY
if python3 bench/qwen_train_bench.py check --carry "$work/carry" \
    --out "$work/check-bad-base" --device host --arms elem46-fc1 --steps 3 \
    --fingerprints --baseline "$work/none-bad.check.jsonl" \
    > "$work/check-bad-base.md" 2> "$work/check-bad-base.log"; then
  echo "check passed against a baseline with a changed fingerprint" >&2; exit 1
fi
grep -q '^FAIL: step 2: fingerprints of elem46-fc1 .* differ from .*none-bad.check.jsonl' "$work/check-bad-base.md"
python3 bench/qwen_train_bench.py check --carry "$work/carry" \
  --out "$work/check-one" --device host --arms max --steps 2 --fingerprints \
  2> "$work/check-one.log" > "$work/check-one.md"
grep -q 'fingerprints recorded, not compared' "$work/check-one.md"
if python3 bench/qwen_train_bench.py check --carry "$work/carry" \
    --out "$work/check-nobase" --device host --arms max --steps 2 \
    --fingerprints --baseline "$work/no-such.check.jsonl" 2> "$work/check-nobase.log"; then
  echo "check ran with a missing baseline" >&2; exit 1
fi
grep -q 'no such file' "$work/check-nobase.log"
test ! -e "$work/check-nobase/max.check.jsonl"
# A baseline shorter than --steps is refused before any process too.
if python3 bench/qwen_train_bench.py check --carry "$work/carry" \
    --out "$work/check-shortbase" --device host --arms max --steps 4 \
    --fingerprints --baseline "$work/check/none.check.jsonl" \
    2> "$work/check-shortbase.log"; then
  echo "check ran with a 3-step baseline for 4 steps" >&2; exit 1
fi
grep -q 'has 3 steps, fewer than --steps 4' "$work/check-shortbase.log"
test ! -e "$work/check-shortbase/max.check.jsonl"
# run --time-limit: the first round always runs, a second that cannot end
# inside the limit does not start; the manifest says where it stopped and
# --pack holds the results. Run twice into one folder: the second run's
# rows are its own (the binary appends to a metrics file left there).
rm -rf "$work/run-limit"
for i in 1 2; do
  python3 bench/qwen_train_bench.py run --carry "$work/carry" \
    --out "$work/run-limit" --device host --arms none,ref --rounds 3 \
    --op-times-steps 0 --time-limit 0.001 --pack "$work/run-limit.tgz" \
    2> "$work/run-limit.log"
done
grep -q 'stopping after 1 of 3 rounds' "$work/run-limit.log"
grep -q 'process 2 of 6, about [0-9]* s left' "$work/run-limit.log"
tar -tzf "$work/run-limit.tgz" > "$work/run-limit.list"
grep -q '^run-limit/results.jsonl$' "$work/run-limit.list"
python3 bench/qwen_train_bench.py table "$work/run-limit" > "$work/run-limit.md"
grep -q '^# stopped by --time-limit 0.001 s after 1 of 3 rounds' "$work/run-limit.md"
# A limit with room for every round stops nothing.
python3 bench/qwen_train_bench.py run --carry "$work/carry" \
  --out "$work/run-roomy" --device host --arms none --rounds 2 \
  --op-times-steps 0 --time-limit 3600 2> "$work/run-roomy.log"
if grep -q stopping "$work/run-roomy.log"; then
  echo "run stopped with an hour's limit" >&2; exit 1
fi
test -s "$work/run-roomy/none.r1.jsonl"
python3 - "$work/run-limit" <<'PY'
import json, os, sys
m = json.load(open(os.path.join(sys.argv[1], "manifest.json")))["run"]
assert m["stopped"]["rounds_done"] == 1, m["stopped"]
rows = [json.loads(l) for l in open(os.path.join(sys.argv[1], "results.jsonl"))]
assert {(r["arm"], r["round"]) for r in rows} == {("none", 0), ("ref", 0)}
assert len(rows) == 2 * 13, len(rows)
PY
python3 - "$work/check/max.check.jsonl" <<'PY'
import copy, json, sys
sys.path.insert(0, "bench")
from qwenbench.device import check_arm_lines
lines = [json.loads(l) for l in open(sys.argv[1])]
assert check_arm_lines("max", lines, 3) == []
leak = copy.deepcopy(lines); leak[2]["pinned_pool"]["in_use"] = 4096
grow = copy.deepcopy(lines); grow[2]["device_peak_bytes"] += 1
nan = copy.deepcopy(lines); nan[1]["grad_norm"] = float("nan")
for case, what in ((leak, "in use"), (grow, "device peak"),
                   (nan, "not finite")):
    bad = check_arm_lines("max", case, 3)
    assert len(bad) == 1 and what in bad[0], bad
assert "expected 4" in check_arm_lines("max", lines, 4)[0]
print("check_arm_lines: flags a leak, a growing peak, a NaN, a lost step")
PY
# The predicted frontier of two recompute sets (reports only).
python3 bench/qwen_train_bench.py frontier "${tools_args[@]}" --model models/tiny-hybrid.json \
  --seq 64 --profile "" --sets "layernorm;layernorm,mlp_act,gdn_norm_out" \
  2> "$work/frontier.log" > "$work/frontier.md"
test "$(grep -c '^| layernorm' "$work/frontier.md")" = 2
# --recompute-only adds each set with nothing offloaded: a row of its own,
# with less of the activation peak removed than the set with offload.
python3 bench/qwen_train_bench.py frontier "${tools_args[@]}" --model models/tiny-hybrid.json \
  --seq 64 --profile "" --sets "layernorm;layernorm,mlp_act,gdn_norm_out" \
  --recompute-only 2> "$work/frontier-ro.log" > "$work/frontier-ro.md"
python3 - "$work/frontier-ro.md" <<'PY'
import re, sys
rows = re.findall(r"^\| ([a-z_,]+)( \(no offload\))? \| ([0-9.]+) \| ",
                  open(sys.argv[1]).read(), re.M)
by = {(name, bool(no)): float(removed) for name, no, removed in rows}
assert len(by) == 4, by
for name in ("layernorm", "layernorm,mlp_act,gdn_norm_out"):
    assert 0 < by[(name, True)] < by[(name, False)], by
print("frontier --recompute-only: 2 sets with and without offload")
PY
# Goal arms: actplace-compile chooses the placement (train-plan-budget);
# the build's report and `predict`'s (the choice made again) meet the goal.
python3 bench/qwen_train_bench.py build "${build_args[@]}" --model models/tiny-hybrid.json \
  --seq 64 --micro-batches 4 --arms none,auto60,auto3 \
  --carry "$work/carry-goal" 2> "$work/build-goal.log"
grep -q 'chose: ' "$work/build-goal.log"
python3 - "$work/carry-goal" <<'PY'
import json, os, sys
sys.path.insert(0, "bench")
from qwenbench import common, profiles, reports
carry = sys.argv[1]
manifest = json.load(open(os.path.join(carry, "manifest.json")))
for arm, floor in (("auto60", 60.0), ("auto3", 0.0)):
    assert manifest["arms"][arm]["chosen"] is not None, arm
    path = os.path.join(carry, manifest["arms"][arm]["report"])
    for report in (path, path + ".again"):
        if report.endswith(".again"):
            reports.write_report(
                manifest, arm, profiles.path("h200"), report,
                os.path.join(common.REPO, manifest["build_dir"], "bin"))
        t = json.load(open(report))["totals"]
        cut = 100 * (1 - t["activation_peak_bytes_after"] /
                     t["activation_peak_bytes_before"])
        extra = t["step_seconds_after"] / t["step_seconds_before"] - 1
        assert cut >= floor, (arm, report, cut)
        assert arm != "auto3" or extra <= 0.03 + 1e-9, (arm, extra)
print("goal arms: auto60 removes >= 60 %, auto3 within 3 % (predicted)")
PY
# Each leaf's predicted recompute time, from one report (every leaf).
python3 bench/qwen_train_bench.py frontier "${tools_args[@]}" --model models/tiny-hybrid.json \
  --seq 64 --profile "" --leaf-costs 2> "$work/leaf-costs.log" \
  > "$work/leaf-costs.md"
python3 - "$work/leaf-costs.md" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
rows = re.findall(r"^\| (\w+) \| ([0-9.]+) \| ([0-9.]+) \| [0-9.]+ \|$", text,
                  re.M)
leaves = {r[0] for r in rows}
assert {"mlp_fc1", "mlp_act", "attn_norm", "gdn_norm_out"} <= leaves, leaves
assert all(float(r[2]) > 0 for r in rows), rows
assert re.search(r"^total: [0-9.]+ GB recomputed in [0-9.]*[1-9][0-9.]* ms",
                 text, re.M), text
print("leaf costs: %d leaves priced" % len(rows))
PY
python3 - "$work/table.md" <<'PY'
import sys
ARMS = ("none", "ref", "ref+norm", "all", "max", "cal3", "elem46", "elem60",
        "elem46-fc1")
rows = {}
text = open(sys.argv[1]).read()
for line in text.splitlines():
    cells = [c.strip() for c in line.strip("|").split("|")]
    if len(cells) > 10 and cells[0] in ARMS:
        rows[cells[0]] = cells
assert set(rows) == set(ARMS), rows.keys()
for arm, c in rows.items():
    assert c[1] == "20", (arm, "measured steps", c[1])
    moved = c[10].split()[0]
    assert (moved == "0.0") == (arm == "none"), (arm, "d2h MiB", c[10])
    # The measured stall: from the op times of the arms that recorded them
    # (--op-times-arms ref,max), '-' for the others.
    stall = c[15]
    if arm in ("ref", "max"):
        assert float(stall) >= 0, (arm, "meas. stall ms", stall)
    else:
        assert stall == "-", (arm, "meas. stall ms", stall)
assert "WARNING" not in text and "FAILED" not in text, "table flags a problem"
print("qwen_train_bench_test: ok (%d arms, 20 measured steps each)" % len(ARMS))
PY
