#!/usr/bin/env python3
#===- tensor_parallel.py - tensor-parallel binaries on the host -----------===#
#
# Binaries compiled with --tensor-parallel=N run on N ranks under mpirun
# (host backend, MPI with rank-order sums). tiny-hybrid has a GDN, a gated
# attention, an MLA and MLP layers, so every split (GDN key/value heads and
# their conv channels, gates and out projection; q/kv heads; MLA up
# projections by head; the MLP width) runs. Cases:
#
#   equivalence  TP 2 against TP 1 at --dtype f32, 3 steps: each step's loss
#                and grad norm within a relative 2e-5 of one rank's (the
#                row-parallel sums and the norm add in another order, so
#                not bitwise), the two TP ranks bitwise equal to each
#                other (replicated values after every sum).
#   untied       an untied LM head (its lm_head.weight split by vocabulary
#                rows): TP 2 and TP 2 + SP against TP 1, f32, the same bound.
#   placement    TP 2 with the Megatron-LM scenario's placement
#                (gdn_core_attn offloaded, gdn_norm_out recomputed) against
#                none, bf16: per-rank fingerprints bitwise equal every step,
#                each offloaded scope copies both ways when on and never
#                when off, the pinned pool empty after each step.
#   dp           TP 2 x DP 2 on 4 ranks against TP 1 x DP 2, f32: the same
#                bound, every rank reporting the global loss.
#   sp           TP 2 with --sequence-parallel against TP 1, f32: the same
#                bound (every rank's loss the whole sequence's: the
#                vocab-parallel head); then with the Megatron-LM scenario's placement
#                against none: per-rank fingerprints bitwise equal, copies
#                per offloaded scope, the pinned pool empty.
#   checkpoint   TP 2 with --sequence-parallel: 3 steps straight against 2
#                steps saved (one file per rank and an index) and resumed
#                for the third: every rank's fingerprints bitwise equal;
#                `actplace-ckpt consolidate` joins
#                the parts into whole tensors whose masters are within
#                2 x the summed learning rates of a TP 1 run's (AdamW moves
#                an element by about lr a step whatever its gradient, so
#                two runs whose bf16 gradients differ slightly drift apart
#                by up to that; a wrong join is off by the weights, 1e-2).
#   pp           TP 2 x PP 2 on 4 ranks with --sequence-parallel against
#                TP 2 alone (--tied-grad-parts), 4 microbatches, f32: loss
#                and grad norm bitwise equal every step on every rank, and
#                every saved tensor (each rank's parts) bitwise equal.
#   zero3        TP 2 x DP 2 with --sequence-parallel and
#                --data-parallel=zero3 on 4 ranks: within the bound of TP 1
#                x DP 2 at f32; 2 steps saved (4 shard files and an index)
#                and resumed for the third, every rank's fingerprints
#                bitwise those of 3 steps straight; with the Megatron-LM
#                placement, fingerprints bitwise per rank and copies
#                counted.
#   reshard      f32: a TP 2 + SP checkpoint of step 2 resumed by a TP 1
#                binary and a TP 1 checkpoint resumed by a TP 2 + SP one
#                (every tensor read whole, parts joined, each rank taking
#                its part): step 3's loss and grad norm within BOUND of the
#                straight run of the other size; resharding into ZeRO-3 is
#                refused naming both sizes.
#   weights      --dump-grads and --init-weights with TP 2 + SP, f32: the
#                whole gradients TP 2 writes (each split parameter's parts
#                joined) are within GRAD_BOUND of TP 1's (per tensor,
#                relative to its largest magnitude), from the seeded init
#                and from a weights file (TP 1's gradient file, which names
#                and shapes every parameter) that each rank splits itself.
#   all          (label long: 8 ranks) TP 2 + SP x PP 2 x DP 2 zero3 against
#                TP 1 x DP 2, f32: within BOUND every step on every rank.
#   errors       a TP 2 binary on 1 or 3 ranks is refused naming the sizes;
#                compile-time refusals name the option and the model field.
#
#===------------------------------------------------------------------------===#
import json
import os
import subprocess
import sys

from data_parallel import replicated_runner
from e2echeck import check, exit_status, placement_steps_agree

PLACEMENT = ["--offload-modules=gdn_core_attn", "--recompute-modules=gdn_norm_out",
             "--hide-rule=off"]
# |a - b| <= BOUND x max(|a|, |b|) per step at f32: summing two partial
# products instead of one dot product, and the grad norm's squares in two
# groups, move the last bits of values of order 1 (measured: a few 1e-7).
BOUND = 2e-5
# Per tensor, |a - b| <= GRAD_BOUND x max |a|: every row-parallel sum and
# every f gradient adds partial products in another order (measured up to
# 1e-5 on tiny-hybrid's seeded init). The small GDN gate gradients (A_log, dt_bias) come out of
# cancelling sums over the tokens, which magnify those reorderings relative
# to their largest value; the vocab-parallel LM head, whose hidden gradient
# is a sum of the ranks' partial products, reaches every gradient, and with
# it they measure up to 6.6e-5 on tiny-hybrid's seeded init (1.6e-5 with
# the vocabulary replicated): GATE_GRAD_BOUND for them.
GRAD_BOUND = 2.0 ** -14
GATE_GRAD_BOUND = 2.0 ** -12
GATE_GRADS = ("linear_attn.A_log", "linear_attn.dt_bias")


def close(a, b):
    return abs(a - b) <= BOUND * max(abs(a), abs(b), 1e-30)


def within_bound(what, ref, lines, steps):
    check(len(ref) == steps and len(lines) == steps,
          "%s: %d and %d metrics lines, expected %d" %
          (what, len(ref), len(lines), steps))
    worst = 0.0
    for a, b in zip(ref, lines):
        for key in ("loss", "grad_norm"):
            check(close(a[key], b[key]),
                  "%s step %d: %s %r against %r (bound %g relative)" %
                  (what, a["step"], key, b[key], a[key], BOUND))
            worst = max(worst, abs(a[key] - b[key]) /
                        max(abs(a[key]), 1e-30))
    print("%s: loss and grad norm within %g of one rank over %d steps "
          "(largest relative difference %.3g, last loss %r)" %
          (what, BOUND, steps, worst, lines[-1]["loss"] if lines else None),
          flush=True)


def ranks_identical(what, lines):
    for rank in range(1, len(lines)):
        for a, b in zip(lines[0], lines[rank]):
            check(a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"],
                  "%s: rank %d step %d reports loss %r / grad norm %r, rank 0 "
                  "%r / %r" % (what, rank, a["step"], b["loss"],
                               b["grad_norm"], a["loss"], a["grad_norm"]))


def compare(t, name, ranks_ref, ranks, ref_flags, flags):
    steps = 3
    ref = t.compile(name + "-ref", "--micro-batches", "2", "--dtype", "f32",
                    *ref_flags)
    tp = t.compile(name, "--micro-batches", "2", "--dtype", "f32", *flags)
    r, lref = t.train(ref, ranks_ref, "--steps", str(steps),
                      metrics=name + "-ref.jsonl")
    check(r.returncode == 0, "%s: the reference failed" % name)
    r, ltp = t.train(tp, ranks, "--steps", str(steps),
                     metrics=name + ".jsonl")
    check(r.returncode == 0, "%s: the tensor-parallel run failed" % name)
    ranks_identical(name, ltp)
    within_bound("%s against %d rank(s) without tensor parallelism" %
                 (name, ranks_ref), lref[0], ltp[0], steps)


def case_equivalence(t):
    compare(t, "tp2", 1, 2, [], ["--tensor-parallel=2"])


def case_dp(t):
    compare(t, "tp2dp2", 2, 4, ["--data-parallel-size=2"],
            ["--tensor-parallel=2", "--data-parallel-size=2"])


def case_sp(t):
    compare(t, "tp2sp", 1, 2, [], ["--tensor-parallel=2",
                                    "--sequence-parallel"])
    placement_bitwise(t, "tp2sp", "--sequence-parallel")


def case_untied(t):
    """An untied LM head (its own lm_head.weight, split by vocabulary rows
    like the embedding): TP 2 and TP 2 + SP within the bound of TP 1."""
    with open(t.args.model) as f:
        config = json.load(f)
    config["tie_word_embeddings"] = False
    untied = t.path("untied.json")
    os.makedirs(t.work, exist_ok=True)
    with open(untied, "w") as f:
        json.dump(config, f)
    t.args.model = untied
    compare(t, "untied-tp2", 1, 2, [], ["--tensor-parallel=2"])
    compare(t, "untied-tp2sp", 1, 2, [], ["--tensor-parallel=2",
                                           "--sequence-parallel"])


def case_placement(t):
    placement_bitwise(t, "tp2")


def placement_bitwise(t, name, *flags, ranks=2):
    steps = 3
    off = t.compile(name + "-off", "--micro-batches", "2",
                    "--tensor-parallel=2", *flags)
    on = t.compile(name + "-placed", "--micro-batches", "2",
                   "--tensor-parallel=2", *(list(flags) + PLACEMENT))
    r, loff = t.train(off, ranks, "--steps", str(steps), metrics="off.jsonl")
    check(r.returncode == 0, "TP 2 without placement failed")
    r, lon = t.train(on, ranks, "--steps", str(steps), metrics="on.jsonl")
    check(r.returncode == 0, "TP 2 with placement failed")
    for rank in range(ranks):
        check(len(loff[rank]) == steps and len(lon[rank]) == steps,
              "rank %d: missing metrics lines" % rank)
        placement_steps_agree(rank, loff[rank], lon[rank])
        print("rank %d: fingerprints equal with and without placement; "
              "offloaded %s" % (rank, ", ".join(sorted(lon[rank][0]
                                                        ["transfers"]))),
              flush=True)
    # The ranks hold different parts of the split parameters.
    check(loff[0][0]["fingerprints"] != loff[1][0]["fingerprints"],
          "both tensor-parallel ranks hold the same bits")


def case_checkpoint(t):
    flags = ["--micro-batches", "2", "--tensor-parallel=2",
             "--sequence-parallel"]
    tp = t.compile("tp2sp", *flags)
    r, straight = t.train(tp, 2, "--steps", "3", metrics="straight.jsonl")
    check(r.returncode == 0, "3 steps straight failed")
    ckpt = t.path("ckpt")
    r, _ = t.train(tp, 2, "--steps", "2", "--save", ckpt,
                   metrics="first.jsonl")
    check(r.returncode == 0, "2 steps with --save failed")
    step = os.path.join(ckpt, "step-00000002")
    files = sorted(f for f in os.listdir(step) if f.endswith(".safetensors"))
    check(len(files) == 2 and os.path.exists(os.path.join(step,
                                                          "index.json")),
          "expected one file per tensor-parallel rank and an index in %s, "
          "found %s" % (step, sorted(os.listdir(step))))
    r, resumed = t.train(tp, 2, "--steps", "3", "--resume", ckpt,
                         metrics="resumed.jsonl")
    check(r.returncode == 0, "the resume failed")
    for rank in range(2):
        check(len(straight[rank]) == 3 and len(resumed[rank]) == 1,
              "rank %d: %d and %d metrics lines" %
              (rank, len(straight[rank]), len(resumed[rank])))
        if straight[rank] and resumed[rank]:
            check(straight[rank][-1]["fingerprints"] ==
                  resumed[rank][-1]["fingerprints"],
                  "rank %d: step 3 resumed differs from step 3 straight:\n"
                  "  %s\n  %s" % (rank, straight[rank][-1]["fingerprints"],
                                  resumed[rank][-1]["fingerprints"]))
    print("resumed at step 2: both ranks' step-3 fingerprints equal the "
          "straight run's; checkpoint files %s" % ", ".join(files), flush=True)
    one = t.compile("tp1", "--micro-batches", "2")
    # Consolidated, the parts are whole tensors again.
    ck1 = t.path("ckpt1")
    r, l1 = t.train(one, 1, "--steps", "2", "--save", ck1,
                    metrics="ck1.jsonl")
    check(r.returncode == 0, "TP 1 with --save failed")
    drift = 2 * sum(l["lr"] for l in l1[0])
    w1, w2 = t.path("one.safetensors"), t.path("two.safetensors")
    for src, dst in ((ck1, w1), (ckpt, w2)):
        r = t.run([t.args.ckpt, "consolidate", "--with-optimizer", src, dst])
        check(r.returncode == 0, "consolidate %s failed:\n%s" %
              (src, r.stdout + r.stderr))
    from data_parallel import read_f32
    a, b = read_f32(w1), read_f32(w2)
    masters = [n for n in a if n.startswith("master/")]
    check(sorted(a) == sorted(b) and masters,
          "the consolidated files hold other tensors: %s / %s" %
          (sorted(set(a) - set(b))[:3], sorted(set(b) - set(a))[:3]))
    worst = 0.0
    for n in masters:
        d = max(abs(x - y) for x, y in zip(a[n], b[n]))
        check(d <= drift, "consolidated %s differs by %g (bound %g)" %
              (n, d, drift))
        worst = max(worst, d)
    print("consolidated: %d tensors, masters within %.3g of TP 1's (bound "
          "%.3g)" % (len(a), worst, drift), flush=True)


def case_pp(t):
    from pipeline_parallel import saved_tensors
    steps = 3
    flags = ["--micro-batches", "4", "--dtype", "f32", "--tensor-parallel=2",
             "--sequence-parallel"]
    one = t.compile("tp2", *(flags + ["--tied-grad-parts"]))
    staged = t.compile("tp2pp2", *(flags + ["--pipeline-parallel=2"]))
    r, l1 = t.train(one, 2, "--steps", str(steps), "--save", t.path("ck1"),
                    metrics="tp2.jsonl")
    check(r.returncode == 0, "TP 2 failed")
    r, l2 = t.train(staged, 4, "--steps", str(steps), "--save",
                    t.path("ck2"), metrics="tp2pp2.jsonl")
    check(r.returncode == 0, "TP 2 x PP 2 failed")
    for rank, lines in enumerate(l2):
        check(len(lines) == steps, "rank %d: %d metrics lines" %
              (rank, len(lines)))
        for a, b in zip(l1[0], lines):
            check(a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"],
                  "rank %d step %d: loss %r / %r, grad norm %r / %r" %
                  (rank, a["step"], b["loss"], a["loss"], b["grad_norm"],
                   a["grad_norm"]))
    a, b = saved_tensors(t.path("ck1")), saved_tensors(t.path("ck2"))
    check(sorted(a) == sorted(b) and a,
          "the saves hold other tensors: %d / %d" % (len(a), len(b)))
    differ = [n for n in sorted(set(a) & set(b)) if a[n] != b[n]]
    check(not differ, "%d saved tensors differ, first %s" %
          (len(differ), differ[:3]))
    print("TP 2 x PP 2: loss and grad norm bitwise equal to TP 2 on all 4 "
          "ranks over %d steps; %d saved tensors bitwise equal" %
          (steps, len(a)), flush=True)


def case_zero3(t):
    flags = ["--tensor-parallel=2", "--sequence-parallel",
             "--data-parallel-size=2", "--data-parallel=zero3"]
    compare(t, "tp2z3", 2, 4, ["--data-parallel-size=2"], flags)
    tp = t.path("tp2z3")
    r, straight = t.train(tp, 4, "--steps", "3", metrics="straight.jsonl")
    check(r.returncode == 0, "3 steps straight failed")
    ckpt = t.path("ckpt")
    r, _ = t.train(tp, 4, "--steps", "2", "--save", ckpt,
                   metrics="first.jsonl")
    check(r.returncode == 0, "2 steps with --save failed")
    files = sorted(os.listdir(os.path.join(ckpt, "step-00000002")))
    check(len([f for f in files if f.endswith(".safetensors")]) == 4 and
          "index.json" in files, "expected 4 shard files and an index, "
          "found %s" % files)
    r, resumed = t.train(tp, 4, "--steps", "3", "--resume", ckpt,
                         metrics="resumed.jsonl")
    check(r.returncode == 0, "the resume failed")
    for rank in range(4):
        check(len(straight[rank]) == 3 and len(resumed[rank]) == 1 and
              straight[rank][-1]["fingerprints"] ==
              resumed[rank][-1]["fingerprints"],
              "rank %d: step 3 resumed differs from step 3 straight" % rank)
    print("zero3: resumed at step 2, all 4 ranks' step-3 fingerprints equal "
          "the straight run's", flush=True)
    placement_bitwise(t, "tp2z3p", "--sequence-parallel",
                      "--data-parallel-size=2", "--data-parallel=zero3",
                      ranks=4)


def compare_tensors(what, a_path, b_path):
    from data_parallel import read_f32
    a, b = read_f32(a_path), read_f32(b_path)
    check(sorted(a) == sorted(b) and a, "%s: the files hold other tensors" %
          what)
    worst = worst_gate = 0.0
    for name in sorted(set(a) & set(b)):
        check(len(a[name]) == len(b[name]), "%s: %s has %d / %d values" %
              (what, name, len(a[name]), len(b[name])))
        scale = max(abs(x) for x in a[name]) or 1.0
        d = max(abs(x - y) for x, y in zip(a[name], b[name]))
        gate = name.endswith(GATE_GRADS)
        bound = GATE_GRAD_BOUND if gate else GRAD_BOUND
        check(d <= bound * scale, "%s: %s differs by %g, above %g x "
              "max |value| %g" % (what, name, d, bound, scale))
        if gate:
            worst_gate = max(worst_gate, d / scale)
        else:
            worst = max(worst, d / scale)
    print("%s: %d tensors, worst difference %.3g of the tensor's largest "
          "magnitude (bound %.3g), GDN gates %.3g (bound %.3g)" %
          (what, len(a), worst, GRAD_BOUND, worst_gate, GATE_GRAD_BOUND),
          flush=True)


def case_reshard(t):
    common = ["--micro-batches", "2", "--dtype", "f32"]
    one = t.compile("tp1", *common)
    two = t.compile("tp2sp", *(common + ["--tensor-parallel=2",
                                         "--sequence-parallel"]))
    straight = {}
    for name, binary, ranks in (("one", one, 1), ("two", two, 2)):
        r, lines = t.train(binary, ranks, "--steps", "3",
                           metrics=name + ".jsonl")
        check(r.returncode == 0, "%s straight failed" % name)
        straight[name] = lines[0]
        r, _ = t.train(binary, ranks, "--steps", "2", "--save",
                       t.path("ck-" + name))
        check(r.returncode == 0, "%s with --save failed" % name)
    for saved, binary, ranks, other in (("two", one, 1, "one"),
                                        ("one", two, 2, "two")):
        r, lines = t.train(binary, ranks, "--steps", "3", "--resume",
                           t.path("ck-" + saved),
                           metrics="from-%s.jsonl" % saved)
        check(r.returncode == 0 and "resharded onto" in r.stdout + r.stderr,
              "resuming the %s-rank checkpoint failed or said nothing:\n%s" %
              (saved, r.stdout + r.stderr))
        for rank in range(ranks):
            check(len(lines[rank]) == 1, "rank %d: %d lines" %
                  (rank, len(lines[rank])))
        if lines[0] and straight[other]:
            within_bound("checkpoint of %s resumed on %s, step 3" %
                         (saved, other), straight[other][2:], lines[0], 1)
    z3 = t.compile("tp2z3", *(common + ["--tensor-parallel=2",
                                        "--data-parallel-size=2",
                                        "--data-parallel=zero3"]))
    r, _ = t.train(z3, 4, "--steps", "3", "--resume", t.path("ck-one"))
    check(r.returncode != 0 and "resharding into ZeRO-3 shards is not "
          "supported" in r.stdout + r.stderr,
          "resharding into zero3: expected a refusal:\n%s" %
          (r.stdout + r.stderr))


def case_weights(t):
    common = ["--micro-batches", "2", "--dtype", "f32"]
    one = t.compile("tp1", *common)
    two = t.compile("tp2sp", *(common + ["--tensor-parallel=2",
                                         "--sequence-parallel"]))
    g1, g2 = t.path("g1.safetensors"), t.path("g2.safetensors")
    r, _ = t.train(one, 1, "--steps", "1", "--dump-grads", g1)
    check(r.returncode == 0, "TP 1 --dump-grads failed")
    r, _ = t.train(two, 2, "--steps", "1", "--dump-grads", g2)
    check(r.returncode == 0, "TP 2 --dump-grads failed")
    compare_tensors("seeded init: TP 2 + SP grads against TP 1", g1, g2)
    h1, h2 = t.path("h1.safetensors"), t.path("h2.safetensors")
    r, l1 = t.train(one, 1, "--steps", "1", "--init-weights", g1,
                    "--dump-grads", h1, metrics="w1.jsonl")
    check(r.returncode == 0, "TP 1 --init-weights failed")
    r, l2 = t.train(two, 2, "--steps", "1", "--init-weights", g1,
                    "--dump-grads", h2, metrics="w2.jsonl")
    check(r.returncode == 0, "TP 2 --init-weights failed")
    compare_tensors("--init-weights: TP 2 + SP grads against TP 1", h1, h2)
    if l1 and l2 and l1[0] and l2[0]:
        check(close(l1[0][0]["loss"], l2[0][0]["loss"]),
              "--init-weights: loss %r against %r" % (l2[0][0]["loss"],
                                                      l1[0][0]["loss"]))


def case_all(t):
    compare(t, "all8", 2, 8, ["--data-parallel-size=2"],
            ["--tensor-parallel=2", "--sequence-parallel",
             "--pipeline-parallel=2", "--data-parallel-size=2",
             "--data-parallel=zero3"])


def case_errors(t):
    tp2 = t.compile("tp2", "--micro-batches", "2", "--tensor-parallel=2")
    for ranks in (1, 3):
        r = t.mpirun(ranks, tp2, "--device", "host", "--steps", "1") \
            if ranks > 1 else t.run([tp2, "--device", "host", "--steps", "1"])
        out = r.stdout + r.stderr
        check(r.returncode != 0, "TP 2 ran on %d ranks" % ranks)
        check("2 tensor-parallel" in out and "started %d rank" % ranks in out,
              "TP 2 on %d ranks: the error does not name the sizes:\n%s" %
              (ranks, out))
    refusals = [
        (["--tensor-parallel=3"],
         "--tensor-parallel=3: the model's num_attention_heads (4) is not a "
         "multiple of the tensor-parallel size"),
        (["--tensor-parallel=4"],
         "--tensor-parallel=4: the model's num_key_value_heads (2) is not a "
         "multiple"),
        (["--tensor-parallel=0"], "--tensor-parallel must be in [1, 1024]"),
        (["--sequence-parallel"],
         "--sequence-parallel needs --tensor-parallel of at least 2"),
        (["--tensor-parallel=2", "--sequence-parallel", "--seq", "15"],
         "--tensor-parallel=2: --sequence-parallel splits a microbatch's 15 "
         "tokens (--micro-batch-size x --seq) over the ranks; they are not a "
         "multiple of the tensor-parallel size"),
    ]
    for flags, message in refusals:
        seq = [] if "--seq" in flags else ["--seq", "16"]
        cmd = [t.args.compile, t.args.model, "--micro-batches", "2", "-o",
               t.path("refused")] + seq + flags
        r = subprocess.run(cmd, capture_output=True, text=True)
        check(r.returncode != 0 and message in r.stdout + r.stderr,
              "%s: expected an error with %r, got rc %d:\n%s" %
              (" ".join(flags), message, r.returncode, r.stdout + r.stderr))


CASES = {"equivalence": case_equivalence, "placement": case_placement,
         "dp": case_dp, "sp": case_sp, "checkpoint": case_checkpoint,
         "pp": case_pp, "zero3": case_zero3, "weights": case_weights,
         "reshard": case_reshard, "all": case_all,
         "errors": case_errors, "untied": case_untied}


def main():
    def extra(ap):
        ap.add_argument("--ckpt", default="actplace-ckpt")
        ap.add_argument("--case", required=True, choices=sorted(CASES))
    args, t = replicated_runner(extra=extra)
    CASES[args.case](t)
    return exit_status("tensor parallel %s: ok" % args.case)


if __name__ == "__main__":
    sys.exit(main())
