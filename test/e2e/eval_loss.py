#!/usr/bin/env python3
#===- eval_loss.py - the evaluation loss of a training binary -------------===#
#
# --eval-data SRC --eval-every K runs the compiled step on held-out batches
# without updating anything and records eval_loss. Checks, host backend:
#
#   exact      a text file holding exactly one step's windows is read again
#              by every step (the sequential reader wraps), so the
#              evaluation after step k sees the batch step k + 1 trains on,
#              at the same parameters: eval_loss(k) == loss(k + 1) bitwise.
#   inert      fingerprints (loss, grads, params, optimizer) of every step
#              are bitwise those of the same run without evaluations.
#   placement  with gdn_core_attn offloaded and gdn_norm_out recomputed the
#              evaluation losses are bitwise those without placement.
#   ranks      2 data-parallel ranks (mpirun) report the same eval_loss;
#              --eval-steps 2 gives the token-weighted mean of two batches.
#   errors     --eval-every or --eval-steps without --eval-data is refused.
#
#===------------------------------------------------------------------------===#
import sys

from data_parallel import replicated_runner
from e2echeck import check, exit_status

PLACEMENT = ["--offload-modules=gdn_core_attn", "--recompute-modules=gdn_norm_out",
             "--hide-rule=off"]


def main():
    args, t = replicated_runner()
    steps = 3

    # exact: 2 microbatches of one 16-token sequence each take 32 bytes.
    one_step = t.path("one-step.txt")
    with open(one_step, "wb") as f:
        f.write(bytes((i * 37 + 11) % 256 for i in range(32)))
    plain = t.compile("plain", "--micro-batches", "2")
    r, lines = t.train(plain, 1, "--steps", str(steps), "--data",
                       "text:" + one_step, "--eval-data", "text:" + one_step,
                       "--eval-every", "1", metrics="exact.jsonl")
    check(r.returncode == 0, "exact: the run failed")
    lines = lines[0]
    check(len(lines) == steps and all("eval_loss" in l for l in lines),
          "exact: expected eval_loss on all %d lines" % steps)
    for a, b in zip(lines, lines[1:]):
        check(a.get("eval_loss") == b["loss"],
              "exact: eval_loss after step %d is %r, step %d's loss %r" %
              (a["step"], a.get("eval_loss"), b["step"], b["loss"]))
    print("exact: eval_loss after step k equals step k+1's loss bitwise "
          "(%s)" % [l.get("eval_loss") for l in lines], flush=True)

    # inert and placement, on synthetic training data.
    eval_flags = ["--eval-data", "text:" + one_step, "--eval-every", "1"]
    r, without = t.train(plain, 1, "--steps", str(steps),
                         metrics="without.jsonl")
    check(r.returncode == 0, "inert: the run without evaluation failed")
    r, with_eval = t.train(plain, 1, "--steps", str(steps), *eval_flags,
                           metrics="with.jsonl")
    check(r.returncode == 0, "inert: the run with evaluation failed")
    for a, b in zip(without[0], with_eval[0]):
        check(a["fingerprints"] == b["fingerprints"],
              "inert: step %d's fingerprints changed by evaluating:\n  %s\n"
              "  %s" % (a["step"], a["fingerprints"], b["fingerprints"]))
    check(len(without[0]) == steps and len(with_eval[0]) == steps and
          "eval_loss" not in without[0][0],
          "inert: metrics lines %d / %d" % (len(without[0]),
                                             len(with_eval[0])))
    placed = t.compile("placed", "--micro-batches", "2", *PLACEMENT)
    r, on = t.train(placed, 1, "--steps", str(steps), *eval_flags,
                    metrics="placed.jsonl")
    check(r.returncode == 0, "placement: the run failed")
    for a, b in zip(with_eval[0], on[0]):
        check(a["eval_loss"] == b.get("eval_loss") and
              a["fingerprints"] == b["fingerprints"],
              "placement: step %d eval_loss %r / %r" %
              (a["step"], a["eval_loss"], b.get("eval_loss")))
        check(b["pinned_pool"]["in_use"] == 0,
              "placement: pinned pool in use after step %d" % b["step"])
    print("inert and placement: fingerprints unchanged by evaluating; "
          "eval losses equal with and without placement", flush=True)

    # ranks: two data-parallel ranks, two eval steps.
    dp2 = t.compile("dp2", "--micro-batches", "2", "--data-parallel-size=2")
    r, ranks = t.train(dp2, 2, "--steps", "2", "--eval-data", "synthetic",
                       "--eval-steps", "2", metrics="dp2.jsonl")
    check(r.returncode == 0, "ranks: the run failed")
    check(len(ranks) == 2 and all(len(l) == 2 for l in ranks),
          "ranks: expected 2 lines per rank")
    if len(ranks) == 2 and all(len(l) == 2 for l in ranks):
        check("eval_loss" not in ranks[0][0] and
              ranks[0][1].get("eval_loss") is not None and
              ranks[0][1]["eval_loss"] == ranks[1][1].get("eval_loss"),
              "ranks: eval_loss after the last step only, equal on both "
              "ranks: %r / %r" % (ranks[0][1].get("eval_loss"),
                                  ranks[1][1].get("eval_loss")))

    for flags in (["--eval-every", "2"], ["--eval-steps", "2"]):
        r = t.run([plain, "--device", "host", "--steps", "1"] + flags)
        check(r.returncode == 2 and "need --eval-data" in r.stdout + r.stderr,
              "%s without --eval-data: rc %d\n%s" %
              (" ".join(flags), r.returncode, r.stdout + r.stderr))
    return exit_status("eval loss: ok")


if __name__ == "__main__":
    sys.exit(main())
