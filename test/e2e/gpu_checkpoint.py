#!/usr/bin/env python3
#===- gpu_checkpoint.py - checkpoint save/resume on a chosen backend -------===#
#
# The GPU half of checkpoint_safety.py, for binaries compiled elsewhere (the
# GPU machine has no compiler): takes two arms of one model built by
# gpu_bitident.py build (an offload arm and a baseline) and checks on
# --device:
#   - a step that is not finite (--lr 1e300) exits 3 and saves nothing (no
#     "latest", no step folder);
#   - 6 steps straight equal 2 steps + --save, a resume to 4 with the same
#     binary, and a resume to 6 under the other placement, bitwise (loss and
#     fingerprints, step by step, on a text file so the data cursor counts);
#     a resume under another placement is accepted and says so
#     (runtime/trainer.cpp: same model and data, another plan);
#   - a fresh run into a folder holding checkpoints is refused, and a resume
#     with another --lr is refused naming the field.
#
#   gpu_checkpoint.py --dir ARMS --arm OFFLOAD_ARM --other BASE_ARM
#       [--device cuda] --work DIR
#
#===------------------------------------------------------------------------===#
import argparse
import json
import os
import random
import shutil
import subprocess
import sys

from e2echeck import check, exit_status


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True, help="gpu_bitident.py build dir")
    ap.add_argument("--arm", required=True, help="arm that saves")
    ap.add_argument("--other", required=True,
                    help="arm of another placement that resumes")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    w = lambda name: os.path.join(args.work, name)
    first = os.path.join(args.dir, "train-" + args.arm)
    other = os.path.join(args.dir, "train-" + args.other)
    text = w("text.txt")
    rng = random.Random(25)
    with open(text, "w") as f:
        for _ in range(20000):
            f.write("".join(rng.choices("abcdefgh ijklmnop\n", k=80)))

    def train(binary, *flags, metrics=None):
        cmd = [binary, "--device", args.device, "--data", "text:" + text,
               "--fingerprints"] + list(flags)
        if metrics:
            cmd += ["--metrics", metrics]
        print("$ " + " ".join(cmd), flush=True)
        r = subprocess.run(cmd, capture_output=True, text=True)
        print("  exit %d; %s" % (r.returncode,
                                 (r.stderr.strip().splitlines() or [""])[-1]))
        return r

    def lines(metrics):
        if not os.path.exists(metrics):
            return []
        with open(metrics) as f:
            return [json.loads(l) for l in f if l.strip()]

    # A step that is not finite saves nothing.
    r = train(first, "--steps", "1", "--lr", "1e300", "--save", w("nan"))
    check(r.returncode == 3, "--lr 1e300 exited %d, expected 3:\n%s" %
          (r.returncode, r.stderr[-1500:]))
    left = sorted(os.listdir(w("nan"))) if os.path.isdir(w("nan")) else []
    check(not [n for n in left if n == "latest" or n.startswith("step")],
          "--lr 1e300 left %s in its --save folder" % left)

    # 6 straight = 2 + resume to 4 (same arm) + resume to 6 (other arm).
    r = train(first, "--steps", "6", "--save", w("full"),
              metrics=w("full.jsonl"))
    check(r.returncode == 0, "6 straight steps exited %d" % r.returncode)
    parts = []
    for i, (binary, steps, resume) in enumerate(
            [(first, 2, False), (first, 4, True), (other, 6, True)]):
        flags = ["--steps", str(steps), "--save", w("ck")]
        if resume:
            flags += ["--resume", w("ck")]
        r = train(binary, *flags, metrics=w("part%d.jsonl" % i))
        check(r.returncode == 0, "part %d (%s to step %d) exited %d:\n%s" %
              (i, os.path.basename(binary), steps, r.returncode,
               r.stderr[-1500:]))
        if binary == other:
            check("resumed under a different placement" in r.stderr,
                  "a resume under %s did not say it is another placement:\n%s"
                  % (args.other, r.stderr[-1500:]))
        parts += lines(w("part%d.jsonl" % i))
    full = lines(w("full.jsonl"))
    check([m["step"] for m in full] == list(range(1, 7)),
          "straight run steps %s" % [m["step"] for m in full])
    check([m["step"] for m in parts] == list(range(1, 7)),
          "resumed runs steps %s" % [m["step"] for m in parts])
    for m in full + parts:
        check(m.get("backend") == args.device,
              "step %s ran on %r, not %s" % (m.get("step"), m.get("backend"),
                                            args.device))
    for a, b in zip(full, parts):
        check(a["loss"] == b["loss"] and a["fingerprints"] == b["fingerprints"],
              "step %d: resumed run differs from the straight one:\n  %s %s\n"
              "  %s %s" % (a["step"], a["loss"], a["fingerprints"], b["loss"],
                           b["fingerprints"]))

    # Refusals: a fresh run into checkpoints, a resume with another --lr.
    r = train(first, "--steps", "2", "--save", w("ck"))
    check(r.returncode != 0 and "checkpoint" in r.stderr,
          "a fresh run into a folder with checkpoints gave exit %d:\n%s" %
          (r.returncode, r.stderr[-1500:]))
    r = train(other, "--steps", "7", "--resume", w("ck"), "--save", w("ck"),
              "--lr", "1e-3")
    check(r.returncode != 0 and "lr" in r.stderr,
          "a resume with another --lr gave exit %d without naming lr:\n%s" %
          (r.returncode, r.stderr[-1500:]))
    return exit_status("PASS: checkpoint save/resume on %s (%s, resumed "
                       "under %s)" % (args.device, args.arm, args.other))


if __name__ == "__main__":
    sys.exit(main())
