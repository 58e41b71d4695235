"""The command line: one subcommand per step."""
import argparse
import os

import qwenbench

from . import arms as armtable
from . import profiles
from .build import cmd_build
from .calibrate import cmd_calibrate
from .common import REPO
from .device import cmd_check, cmd_run
from .reports import cmd_frontier, cmd_predict
from .tables import cmd_overlap, cmd_table


def add_shape_args(sp):
    """The model and step shape a placement is made for."""
    sp.add_argument("--model", default=os.path.join(REPO, "models",
                                                    "qwen3.5-0.8b.json"))
    sp.add_argument("--seq", type=int, default=4096)
    sp.add_argument("--micro-batch-size", type=int, default=1)
    sp.add_argument("--micro-batches", type=int, default=4)
    sp.add_argument("--dtype", default="bf16")


def add_process_args(sp, arms_help):
    """Where the built binaries are and how each process runs (run, check)."""
    sp.add_argument("--carry", default=os.path.join(REPO, "gpu-carry",
                                                    "qwen-bench"))
    sp.add_argument("--out", required=True)
    sp.add_argument("--arms", default="", help=arms_help)
    sp.add_argument("--device", default="cuda")
    sp.add_argument("--seed", type=int, default=1)
    sp.add_argument("--data", default="synthetic")
    sp.add_argument("--timeout", type=float, default=300,
                    help="seconds per process")
    sp.add_argument("--pack", metavar="FILE.tgz",
                    help="when done, also pack the output folder into one "
                    "gzipped tar (what a device call should bring back)")
    sp.add_argument("--variant", action="append", default=[],
                    metavar="NAME=ARM:VAR=VALUE[;VAR=VALUE]",
                    help="an extra arm NAME: ARM's binary run with the "
                    "environment variables given (ACTPLACE_* switches); "
                    "name it in --arms like a built arm (repeatable)")


def main():
    p = argparse.ArgumentParser(
        description=qwenbench.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the arms into a carry folder")
    b.add_argument("--build-dir", default="build-bench")
    add_shape_args(b)
    b.add_argument("--arms", default="",
                   help="',' between names (default: the arms.json arms "
                   "marked default: " + ",".join(armtable.load().default) +
                   ")")
    b.add_argument("--carry", default=os.path.join(REPO, "gpu-carry",
                                                   "qwen-bench"))
    b.add_argument("--no-rebuild", action="store_true",
                   help="use the build's archives as they are")
    r = sub.add_parser("run", help="run every arm (GPU machine)")
    add_process_args(r, "default: every built arm")
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--steps", type=int, default=10)
    r.add_argument("--rounds", type=int, default=1)
    r.add_argument("--time-limit", type=float, default=0, metavar="SECONDS",
                   help="start no round that would end past SECONDS from the "
                   "start (estimated from the longest process so far; the "
                   "first round always runs); the manifest records where "
                   "it stopped (0: no limit)")
    r.add_argument("--op-times-steps", type=int, default=3,
                   help="timed steps of the no-placement binary with "
                   "--op-times after the arms (0: none); writes op-times.json")
    r.add_argument("--op-times-arms", default="",
                   help="placed arms whose op times to record too (',' "
                   "between names; stream mode, --op-times-steps steps): "
                   "their waits for reloads, the table's measured stall")
    r.add_argument("--timeline", action="store_true",
                   help="the stream-mode op-times processes also write the "
                   "last timed step's launches with their streams and spans "
                   "(--op-timeline): op-timeline-ARM.json")
    r.add_argument("--op-times-modes", default="stream",
                   help="the binary's --op-times-mode for those steps, ',' "
                   "between modes (stream: in stream order, nothing waits; "
                   "wait: each launch waited for); the first writes "
                   "op-times.json, others op-times-MODE.json")
    k = sub.add_parser("check", help="bit identity and stability of arms "
                       "(GPU machine): fingerprints, pool, peak, finiteness")
    add_process_args(k, "default: every built arm; the first is the "
                     "fingerprint baseline")
    k.add_argument("--steps", type=int, default=3)
    k.add_argument("--fingerprints", action="store_true",
                   help="SHA-256 fingerprints, compared with the first arm "
                   "(or with --baseline)")
    k.add_argument("--baseline", metavar="NAME.check.jsonl",
                   help="an earlier check's metrics (or its .xz): every arm's "
                   "fingerprints compared with its steps instead of the "
                   "first arm's")
    t = sub.add_parser("table", help="print the table of a run folder")
    t.add_argument("results")
    t.add_argument("--peak-tflops", type=float, default=989.5)
    t.add_argument("--save", action="store_true",
                   help="also write the run's compact summary (date, commit, "
                   "command, arms, the table) to bench/notes/runs/"
                   "qwen-bench-DATE-COMMIT.md: what a run commits")
    t.add_argument("--runs-dir", default=None, help=argparse.SUPPRESS)
    c = sub.add_parser("calibrate", help="fit computeScale and "
                       "copySlowdownPerByte to a run; writes a device profile")
    c.add_argument("results")
    c.add_argument("--out", required=True, help="profile JSON to write")
    c.add_argument("--op-scale", default="",
                   help="JSON object: op name -> measured / predicted time "
                   "of that kernel")
    c.add_argument("--op-times", default="",
                   help="the no-placement binary's --op-times JSON: opScale "
                   "for every op it timed (overrides --op-scale entries)")
    c.add_argument("--generated-op-times", default="",
                   help="the --op-times JSON of the same model compiled with "
                   "--kernels=generated (qwen_train_bench.py run "
                   "--op-times-arms gen writes op-times-gen.json): the "
                   "profile's generatedKernelRatio, which --kernels=auto "
                   "reads")
    c.add_argument("--copy-slowdown-from", default="",
                   help="profile whose copySlowdownPerByte to keep when the "
                   "run has no offload-only arm to fit it on")
    c.add_argument("--copy-hold-slack", type=float, default=None,
                   help="copyHoldSlack to write into the profile (offloaded "
                   "bytes held (1 + F) x the predicted D2H time after its "
                   "issue)")
    c.add_argument("--copy-beside", default="",
                   help="JSON of measured per-kernel copy slowdowns, "
                   "{\"h2dSlowdown\": {op or \"*\": ms per GB}, "
                   "\"d2hSlowdown\": {...}} (bench/notes/data/"
                   "h200-copy-rates-d29.json): write them, times one "
                   "factor, as the profile's h2dSlowdown / d2hSlowdown in "
                   "place of copySlowdownPerByte")
    c.add_argument("--copy-beside-scale", type=float, default=None,
                   help="that factor (default: least squares over "
                   "--fit-arms)")
    c.add_argument("--side-capacity-arms", default="",
                   help="arms with recompute on the side stream to fit the "
                   "side capacity of --side-capacity-op on (',' between "
                   "names; least squares, golden-section search)")
    c.add_argument("--side-copy-arms", default="",
                   help="arms with side-stream recompute and offload to fit "
                   "the profile's sideStreamCopyScale on (',' between names; "
                   "least squares, after the copy factor and the side "
                   "capacity; --copy-beside only)")
    c.add_argument("--side-capacity-op",
                   default="train.gated_delta_rule_grad",
                   help="the host op whose side capacity is fitted")
    c.add_argument("--fit-arms", default="",
                   help="arms to fit the copy slowdown on (',' between "
                   "names; default: the offload-only arms)")
    c.add_argument("--also", action="append", default=[],
                   metavar="RUN_DIR",
                   help="another run folder (repeatable) whose --fit-arms "
                   "and --side-capacity-arms join the fits, each arm against "
                   "its own folder's none (--copy-beside only); the op "
                   "scales and computeScale still come from RESULTS")
    c.add_argument("--build-dir", default="build-bench")
    f = sub.add_parser("frontier", help="predicted activation-peak cut "
                       "and step-time cost of recompute sets (reports only)")
    f.add_argument("--profile", default=profiles.path("h200"),
                   help="device profile to place and predict under ('' for "
                   "the H200 defaults)")
    f.add_argument("--sets", default="",
                   help="recompute sets, ';' between sets, ',' between "
                   "leaves (default: frontier_sets in "
                   "bench/qwenbench/arms.json)")
    add_shape_args(f)
    f.add_argument("--recompute-only", action="store_true",
                   help="also each recompute set with nothing offloaded")
    f.add_argument("--leaf-costs", action="store_true",
                   help="instead: recompute the leaves of --sets (one set, "
                   "',' between leaves; default every leaf the passes "
                   "recompute together) and print each leaf's predicted "
                   "recompute time and bytes spared, summed over layers")
    f.add_argument("--build-dir", default="build-bench")
    o = sub.add_parser("overlap", help="what side-stream work costs the "
                       "compute kernels beside it, from run --timeline's "
                       "timelines")
    o.add_argument("results")
    o.add_argument("--arm", required=True, help="the placed arm")
    o.add_argument("--base", default="none", help="the arm to compare with")
    o.add_argument("--top", type=int, default=20, help="rows to print")
    pr = sub.add_parser("predict", help="the run's reports under another "
                        "profile, into a copy of the run folder")
    pr.add_argument("results")
    pr.add_argument("--profile", required=True)
    pr.add_argument("--out", required=True)
    pr.add_argument("--build-dir", default="build-bench")
    a = p.parse_args()
    {"build": cmd_build, "run": cmd_run, "table": cmd_table,
     "calibrate": cmd_calibrate, "predict": cmd_predict,
     "frontier": cmd_frontier, "check": cmd_check,
     "overlap": cmd_overlap}[a.cmd](a)

