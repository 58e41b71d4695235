#!/usr/bin/env python3
#===- peak_point.py - the peak saving is the bytes placement took away -----===#
#
# Compiles the tiny hybrid model with actplace-compile --report-json three
# times (no placement; offload of gdn_core_attn, core_attn, attn_proj with
# the hide rule off; the same plus recompute of gdn_norm_out) and checks the
# report's peak points (PlacementMemoryDelta):
#   - the placed step's predicted peak is below the peak of the step
#     compiled without placement, and the report's peak before placement is
#     that peak (the step with placement undone is the unplaced step);
#   - at the op where the placed step peaks, the unplaced minus the placed
#     bytes equal the sum of the activations the report lists as off the
#     device there, exactly, with no other term and nothing unaccounted; so
#     at the op where the unplaced step peaks;
#   - those bytes are what the timelines say: the unplaced bytes are the
#     no-placement step's bytes at the same op (train-print-memory-timeline
#     on it, op named alike), the placed bytes the placed step's;
#   - every offloaded value off the device comes back by a reload of an
#     offloaded leaf, every recomputed one by a clone of its producer or,
#     fused (train-fuse-recompute), by its producer's backward; with
#     recompute, recomputed values are among them.
#
#===------------------------------------------------------------------------===#
import argparse
import json
import os
import re
import subprocess
import sys

COMMON = ["--seq", "64", "--micro-batches", "2"]
OFFLOAD = ["--offload-modules=gdn_core_attn,core_attn,attn_proj",
           "--hide-rule=off"]
VARIANTS = {
    "none": [],
    "offload": OFFLOAD,
    "offload+recompute": OFFLOAD + ["--recompute-modules=gdn_norm_out"],
}
OFFLOADED_LEAVES = ("gdn_core_attn", "core_attn", "attn_proj")
RECOMPUTED_LEAVES = ("gdn_norm_out",)

# "#147 train.lm_head_cross_entropy_grad (model.lm_head)"
OP = re.compile(r"^#(\d+) (\S+) \((\S*)\)$")
# "#147 train.lm_head_cross_entropy_grad model.lm_head total=2970888 ..."
POINT = re.compile(r"^#(\d+) (\S+) (\S+) total=(\d+) ")

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL: " + msg, flush=True)
    return cond


def run(cmd, **kw):
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        print("FAIL: exit %d" % r.returncode)
        sys.exit(1)
    return r.stdout


def parse_op(text, what):
    m = OP.match(text or "")
    if not m:
        print("FAIL: %s is not an op: %r" % (what, text))
        sys.exit(1)
    return int(m.group(1)), m.group(2), m.group(3)


def timeline(opt, step, pipeline):
    """Total bytes per body point of the step, by op index in the body."""
    args = [opt, step]
    if pipeline:
        args.append("-train-placement-pipeline=" + pipeline)
    args += ["-train-print-memory-timeline=per-op=true", "-o", "/dev/null"]
    points = {}
    for line in run(args).splitlines():
        m = POINT.match(line)
        if m:
            scope = "" if m.group(3) == "-" else m.group(3)
            points[int(m.group(1))] = (m.group(2), scope, int(m.group(4)))
    return points


def same_op(point, op, what):
    name, scope, _ = point
    return check((name, scope) == op[1:],
                 "%s: the timeline's op is %s (%s), the report's %s (%s)"
                 % (what, name, scope, op[1], op[2]))


def check_point(name, label, pp, report, none_points, placed_points):
    what = "%s, %s peak" % (name, label)
    placed_op = parse_op(pp["op"], what + " op")
    before_op = parse_op(pp["op_before"], what + " op_before")
    off = pp["off_device"]
    off_sum = sum(v["bytes"] for v in off)
    diff = pp["bytes_before"] - pp["bytes_after"]
    print("%s: at %s (before placement %s): %d -> %d bytes, difference %d, "
          "off the device %d bytes in %d values (%d offloaded, %d recomputed)"
          % (what, pp["op"], pp["op_before"], pp["bytes_before"],
             pp["bytes_after"], diff, off_sum, len(off),
             sum(v["bytes"] for v in off if v["kind"] == "offloaded"),
             sum(v["bytes"] for v in off if v["kind"] == "recomputed")),
          flush=True)
    check(diff == pp["difference_bytes"], what + ": difference_bytes")
    check(off_sum == pp["off_device_bytes"], what + ": off_device_bytes is "
          "not the sum of the listed values")
    check(diff == off_sum,
          "%s: the difference %d != the bytes off the device %d (other "
          "terms %s, unaccounted %d)" % (what, diff, off_sum,
                                         pp["other_terms"],
                                         pp["unaccounted_bytes"]))
    check(not pp["other_terms"] and pp["other_terms_bytes"] == 0,
          "%s: other terms %s" % (what, pp["other_terms"]))
    check(pp["unaccounted_bytes"] == 0, what + ": unaccounted bytes")
    check(diff > 0, what + ": placement took nothing off the device")

    # The two sides against the timelines of the steps themselves.
    if same_op(none_points[before_op[0]], before_op,
               what + ", no-placement step"):
        check(none_points[before_op[0]][2] == pp["bytes_before"],
              "%s: the no-placement step holds %d bytes at %s, the report "
              "says %d" % (what, none_points[before_op[0]][2],
                           pp["op_before"], pp["bytes_before"]))
    if same_op(placed_points[placed_op[0]], placed_op, what + ", placed step"):
        check(placed_points[placed_op[0]][2] == pp["bytes_after"],
              what + ": the placed timeline disagrees with bytes_after")

    # Each value off the device comes back the way its placement says.
    for v in off:
        back = parse_op(v["back_at"], what + " back_at")
        parse_op(v["left_after"], what + " left_after")
        check(back[0] > placed_op[0] and parse_op(v["left_after"], "")[0] <
              placed_op[0], "%s: %s is not off the device at the peak"
              % (what, v["value"]))
        leaf = back[2].split(".")[-1]
        if v["kind"] == "offloaded":
            check(back[1] == "train.reload" and leaf in OFFLOADED_LEAVES,
                  "%s: offloaded %s comes back by %s" % (what, v["value"],
                                                         v["back_at"]))
        else:
            # By a clone of its producer, or (train-fuse-recompute, the
            # default) by its producer's backward, which writes it.
            producer = v["value"].split(" ")[1].split("#")[0]
            check(v["kind"] == "recomputed" and leaf in RECOMPUTED_LEAVES and
                  back[1] in (producer, producer + "_grad",
                              producer + "_grad_rebuild"),
                  "%s: %s %s comes back by %s" % (what, v["kind"], v["value"],
                                                  v["back_at"]))
    return off


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", required=True)
    ap.add_argument("--import-tool", required=True)
    ap.add_argument("--opt", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)

    reports = {}
    for name, flags in VARIANTS.items():
        tag = name.replace("+", "-")
        path = os.path.join(args.work, tag + ".json")
        run([args.compile, args.model, "-o",
             os.path.join(args.work, "train-" + tag), "--report-json",
             path] + COMMON + flags)
        reports[name] = json.load(open(path))

    # The autodiffed step, for the timelines of both sides.
    step = os.path.join(args.work, "step.mlir")
    graph = run([args.import_tool, args.model] + COMMON)
    open(step + ".fwd", "w").write(graph)
    run([args.opt, step + ".fwd", "-train-autodiff", "-o", step])
    none_points = timeline(args.opt, step, "")

    unplaced_peak = reports["none"]["totals"]["peak_bytes_after"]
    check(reports["none"]["totals"]["peak_bytes_before"] == unplaced_peak,
          "without placement the report's peaks before and after differ")
    for name in ("offload", "offload+recompute"):
        report = reports[name]
        totals = report["totals"]
        print("%s: predicted peak %d -> %d bytes" %
              (name, totals["peak_bytes_before"], totals["peak_bytes_after"]))
        check(totals["peak_bytes_before"] == unplaced_peak,
              "%s: the peak before placement %d is not the no-placement "
              "step's peak %d" % (name, totals["peak_bytes_before"],
                                  unplaced_peak))
        check(totals["peak_bytes_after"] < unplaced_peak,
              "%s: the placed peak %d is not below the unplaced peak %d"
              % (name, totals["peak_bytes_after"], unplaced_peak))
        pps = report["peak_points"]
        placed = pps["placed_peak"]
        check(placed["bytes_after"] == totals["peak_bytes_after"],
              name + ": the placed peak point is not at the placed peak")
        check(pps["unplaced_peak"]["bytes_before"] ==
              totals["peak_bytes_before"],
              name + ": the unplaced peak point is not at the unplaced peak")
        pipeline = " ".join(f.lstrip("-") for f in VARIANTS[name])
        placed_points = timeline(args.opt, step, pipeline)
        off = check_point(name, "placed", placed, report, none_points,
                          placed_points)
        check_point(name, "unplaced", pps["unplaced_peak"], report,
                    none_points, placed_points)
        if "recompute" in name:
            check(any(v["kind"] == "recomputed" for v in off),
                  name + ": no recomputed value off the device at the peak")
        check(any(v["kind"] == "offloaded" for v in off),
              name + ": no offloaded value off the device at the peak")

    if failures:
        print("%d check(s) failed" % len(failures))
        sys.exit(1)
    print("peak points ok")


if __name__ == "__main__":
    main()
