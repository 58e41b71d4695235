#!/usr/bin/env python3
#===- pipeline_parallel.py - pipeline-parallel binaries on the host -------===#
#
# Binaries compiled with --pipeline-parallel=P run one program per stage on P
# ranks under mpirun (host backend, MPI). Cases:
#
#   equivalence  2 stages x 4 microbatches against one stage: loss and grad
#                norm bitwise equal every step, and every tensor the stages
#                save (weights, masters, Adam moments; the tied embedding
#                on both ends) bitwise equal to the one-stage checkpoint.
#                Pipelining reorders no arithmetic: each stage runs its
#                layers' kernels on the same inputs, main grads accumulate
#                the microbatches in the same order (1F1B keeps backwards
#                in microbatch order), the grad norm's running sum is
#                continued from stage to stage, and a tied weight's two
#                parts are summed once (the one-stage binary is compiled
#                with --tied-grad-parts to sum them the same way).
#   three        3 stages of 2 layers (--pipeline-stages=2,2,2) x 3
#                microbatches against one stage, the same checks.
#   placement    2 stages with the Megatron-LM scenario's placement
#                (gdn_core_attn offloaded, gdn_norm_out recomputed) against
#                none: per-rank fingerprints bitwise equal every step, every
#                offloaded scope copies both ways on the stage that holds
#                it, none without, the pinned pool empty after each step.
#   budget       2 stages, seq 256, --memory-budget=3000000: each stage is
#                searched on its own, the first (which holds 2 microbatches
#                in flight) offloads, the last places nothing, both planned
#                arenas within the budget; the binary's per-rank
#                fingerprints bitwise those of the unplaced one.
#   zero3        2 stages x 2 data-parallel ranks under ZeRO-3 on 4 ranks,
#                f32, against the same under replicate: loss and grad norm
#                within data_parallel.FP32_BOUND every step on every rank;
#                2 steps saved (a shard file per rank and an index) and
#                resumed for the third, every rank's fingerprints bitwise
#                those of 3 steps straight; the Megatron-LM placement
#                bitwise per rank.
#   errors       a 2-stage binary on 1 or 3 ranks is refused naming the
#                numbers; compile-time refusals name the option.
#
#===------------------------------------------------------------------------===#
import glob
import os
import subprocess
import sys

from data_parallel import read_f32, replicated_runner
from e2echeck import check, exit_status, placement_steps_agree

PLACEMENT = ["--offload-modules=gdn_core_attn", "--recompute-modules=gdn_norm_out",
             "--hide-rule=off"]


def saved_tensors(ckpt):
    """{name: floats} over every file of the last save in `ckpt` (a tensor
    held by two stages must hold the same bits in both)."""
    step = sorted(glob.glob(os.path.join(ckpt, "step-*")))[-1]
    out = {}
    for f in sorted(glob.glob(os.path.join(step, "*.safetensors"))):
        for name, values in read_f32(f).items():
            if name in out:
                check(out[name] == values,
                      "%s: %s differs between the stage files" % (step, name))
            out[name] = values
    return out


def same_bits(what, one, staged, steps):
    check(len(one) == steps and len(staged) == steps,
          "%s: %d and %d metrics lines, expected %d" %
          (what, len(one), len(staged), steps))
    for a, b in zip(one, staged):
        check(a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"],
              "%s step %d: loss %r / %r, grad norm %r / %r" %
              (what, a["step"], a["loss"], b["loss"], a["grad_norm"],
               b["grad_norm"]))
    print("%s: loss and grad norm bitwise equal over %d steps (last loss %r)"
          % (what, steps, one[-1]["loss"] if one else None), flush=True)


def compare_checkpoints(what, one_dir, staged_dir):
    a, b = saved_tensors(one_dir), saved_tensors(staged_dir)
    check(sorted(a) == sorted(b) and a,
          "%s: the saves hold other tensors: %d / %d" % (what, len(a), len(b)))
    differ = [n for n in sorted(set(a) & set(b)) if a[n] != b[n]]
    check(not differ, "%s: %d tensors differ, first %s" %
          (what, len(differ), differ[:3]))
    print("%s: %d saved tensors bitwise equal" % (what, len(a)), flush=True)


def equivalent(t, name, stages, micro, *flags):
    steps = 3
    # The one-stage binary sums the tied embedding's two gradient parts
    # apart, as the stages do (--tied-grad-parts).
    one = t.compile(name + "-1", "--micro-batches", str(micro),
                    "--tied-grad-parts")
    staged = t.compile(name + "-%d" % stages, "--micro-batches", str(micro),
                       "--pipeline-parallel=%d" % stages, *flags)
    r, l1 = t.train(one, 1, "--steps", str(steps), "--save",
                    t.path(name + "-ckpt1"), metrics=name + "-1.jsonl")
    check(r.returncode == 0, "one stage failed")
    r, lp = t.train(staged, stages, "--steps", str(steps), "--save",
                    t.path(name + "-ckpt%d" % stages),
                    metrics=name + "-%d.jsonl" % stages)
    check(r.returncode == 0, "%d stages failed" % stages)
    # Every rank reports the step's loss and grad norm (summed over stages).
    for rank, lines in enumerate(lp):
        same_bits("%s: stage %d against one stage" % (name, rank), l1[0],
                  lines, steps)
    compare_checkpoints("%s: checkpoints" % name, t.path(name + "-ckpt1"),
                        t.path(name + "-ckpt%d" % stages))


def case_equivalence(t):
    equivalent(t, "pp2", 2, 4)


def case_three(t):
    equivalent(t, "pp3", 3, 3, "--pipeline-stages=2,2,2")


def case_placement(t):
    steps = 3
    off = t.compile("pp2", "--micro-batches", "4", "--pipeline-parallel=2")
    on = t.compile("pp2-placed", "--micro-batches", "4",
                   "--pipeline-parallel=2", *PLACEMENT)
    r, loff = t.train(off, 2, "--steps", str(steps), metrics="off.jsonl")
    check(r.returncode == 0, "2 stages without placement failed")
    r, lon = t.train(on, 2, "--steps", str(steps), metrics="on.jsonl")
    check(r.returncode == 0, "2 stages with placement failed")
    offloaded = 0
    for rank in range(2):
        check(len(loff[rank]) == steps and len(lon[rank]) == steps,
              "rank %d: missing metrics lines" % rank)
        # A stage may hold no offloaded scope (tiny-hybrid's one GDN
        # layer is on the first); the count below needs one somewhere.
        placement_steps_agree(rank, loff[rank], lon[rank], offloads=False)
        scopes = sorted(lon[rank][0]["transfers"]) if lon[rank] else []
        offloaded += len(scopes)
        print("stage %d offloaded scopes: %s" % (rank, ", ".join(scopes) or
                                                  "none"), flush=True)
    # tiny-hybrid has one GDN layer (layer 0), on the first stage.
    check(offloaded > 0, "no stage offloaded anything")


def case_budget(t):
    import re
    steps = 2
    budget = 3000000
    # No GEMM workspace in the plan (the CPU build's default; a CUDA build
    # plans 32 MiB of cuBLASLt workspace, more than this budget).
    flags = ["--seq", "256", "--micro-batches", "4", "--pipeline-parallel=2",
             "--gemm-workspace-bytes=0"]
    off = t.path("pp2-256")
    on = t.path("pp2-budget")
    for binary, extra in ((off, []), (on, ["--memory-budget=%d" % budget])):
        cmd = [t.args.compile, t.args.model, "-o", binary] + flags + extra
        r = subprocess.run(cmd, capture_output=True, text=True)
        check(r.returncode == 0, "%s failed:\n%s" % (" ".join(cmd),
                                                     r.stdout + r.stderr))
        if binary == on:
            out = r.stdout
    arenas = [int(a) for a in re.findall(r"stage \d planned peak: arena (\d+)",
                                         out)]
    chose = re.findall(r"chose: (.*) \(descent", out)
    check(len(arenas) == 2 and all(a <= budget for a in arenas),
          "planned arenas %s, budget %d" % (arenas, budget))
    check(len(chose) >= 2 and chose[0] != "nothing placed" and
          chose[-1] == "nothing placed",
          "expected the first stage to place and the last not: %s" % chose)
    print("per-stage search: arenas %s within %d; stage 0 %s, stage 1 %s" %
          (arenas, budget, chose[-2], chose[-1]), flush=True)
    r, loff = t.train(off, 2, "--steps", str(steps), metrics="off.jsonl")
    check(r.returncode == 0, "unplaced stages failed")
    r, lon = t.train(on, 2, "--steps", str(steps), metrics="on.jsonl")
    check(r.returncode == 0, "searched stages failed")
    for rank in range(2):
        placement_steps_agree(rank, loff[rank], lon[rank], offloads=False)
    check(lon[0] and any(c["d2h_count"] > 0 for c in
                         lon[0][0]["transfers"].values()),
          "stage 0 copied nothing")


def case_zero3(t):
    from data_parallel import close
    steps = 3
    flags = ["--micro-batches", "4", "--dtype", "f32", "--pipeline-parallel=2",
             "--data-parallel-size=2"]
    rep = t.compile("pp2dp2", *flags, mode="replicate")
    z3 = t.compile("pp2z3", *flags, mode="zero3")
    r, lrep = t.train(rep, 4, "--steps", str(steps), metrics="rep.jsonl")
    check(r.returncode == 0, "replicate failed")
    r, lz = t.train(z3, 4, "--steps", str(steps), metrics="z3.jsonl")
    check(r.returncode == 0, "zero3 failed")
    for rank in range(4):
        check(len(lz[rank]) == steps, "rank %d: %d lines" %
              (rank, len(lz[rank])))
        for a, b in zip(lrep[0], lz[rank]):
            check(close(a["loss"], b["loss"]) and
                  close(a["grad_norm"], b["grad_norm"]),
                  "rank %d step %d: loss %r / %r, grad norm %r / %r" %
                  (rank, a["step"], b["loss"], a["loss"], b["grad_norm"],
                   a["grad_norm"]))
    ckpt = t.path("ckpt")
    r, _ = t.train(z3, 4, "--steps", "2", "--save", ckpt)
    check(r.returncode == 0, "zero3 with --save failed")
    files = sorted(os.listdir(os.path.join(ckpt, "step-00000002")))
    check(len([f for f in files if f.endswith(".safetensors")]) == 4 and
          "index.json" in files, "expected 4 shard files and an index: %s" %
          files)
    r, resumed = t.train(z3, 4, "--steps", str(steps), "--resume", ckpt,
                         metrics="resumed.jsonl")
    check(r.returncode == 0, "zero3 resume failed")
    for rank in range(4):
        check(len(resumed[rank]) == 1 and lz[rank] and
              resumed[rank][-1]["fingerprints"] == lz[rank][-1]["fingerprints"],
              "rank %d: step 3 resumed differs from step 3 straight" % rank)
    on = t.compile("pp2z3-placed", *(flags + PLACEMENT), mode="zero3")
    r, lon = t.train(on, 4, "--steps", str(steps), metrics="on.jsonl")
    check(r.returncode == 0, "zero3 with placement failed")
    for rank in range(4):
        placement_steps_agree(rank, lz[rank], lon[rank], offloads=False)
    check(any(c["d2h_count"] > 0 for rank in (0, 1) for l in lon[rank]
              for c in l["transfers"].values()),
          "no rank of the first stage copied anything")
    print("zero3 stages: within the bound of replicate on all 4 ranks; "
          "resume bitwise; placement bitwise", flush=True)


def case_errors(t):
    pp2 = t.compile("pp2", "--micro-batches", "2", "--pipeline-parallel=2")
    for ranks in (1, 3):
        r = t.mpirun(ranks, pp2, "--device", "host", "--steps", "1") \
            if ranks > 1 else t.run([pp2, "--device", "host", "--steps", "1"])
        out = r.stdout + r.stderr
        check(r.returncode != 0, "2 stages ran on %d ranks" % ranks)
        check("2" in out and str(ranks) in out and "stage" in out,
              "2 stages on %d ranks: the error does not name the sizes:\n%s" %
              (ranks, out))
    refusals = [
        (["--pipeline-parallel=2", "--micro-batches", "1"],
         "--micro-batches=1 is smaller than --pipeline-parallel=2"),
        (["--pipeline-parallel=7", "--micro-batches", "8"],
         "--pipeline-parallel=7: more stages than the 6 decoder layers"),
        (["--pipeline-parallel=2", "--pipeline-stages=4,3",
          "--micro-batches", "2"],
         "--pipeline-stages adds up to 7 layers; the model has 6"),
        (["--pipeline-stages=3,3", "--micro-batches", "2"],
         "--pipeline-stages needs --pipeline-parallel"),
    ]
    for flags, message in refusals:
        cmd = [t.args.compile, t.args.model, "--seq", "16", "-o",
               t.path("refused")] + flags
        r = subprocess.run(cmd, capture_output=True, text=True)
        check(r.returncode != 0 and message in r.stdout + r.stderr,
              "%s: expected an error with %r, got rc %d:\n%s" %
              (" ".join(flags), message, r.returncode, r.stdout + r.stderr))


CASES = {"equivalence": case_equivalence, "three": case_three,
         "placement": case_placement, "budget": case_budget,
         "zero3": case_zero3,
         "errors": case_errors}


def main():
    args, t = replicated_runner(extra=lambda ap: ap.add_argument(
        "--case", required=True, choices=sorted(CASES)))
    CASES[args.case](t)
    return exit_status("pipeline parallel %s: ok" % args.case)


if __name__ == "__main__":
    sys.exit(main())
