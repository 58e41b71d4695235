#!/usr/bin/env python3
#===- data_parallel.py - replicated data parallelism on the host backend ---===#
#
# Generated binaries of the tiny model (models/tiny-hybrid.json, seq 16)
# trained on 2 ranks under mpirun (host backend, MPI with fixed-order sums).
# One case per run (--case), each registered as its own ctest:
#
#   equivalence  N=2 (--ranks N) ranks with 1 microbatch against one rank
#                with N (the same global batch, the same sequences:
#                docs/tools.md "Running on several ranks"). All ranks hold
#                identical bits every step (equal per-rank fingerprints).
#                Against one rank the loss and the grad norm, the last
#                step's gradients (--dump-grads) and the saved parameters,
#                masters and Adam moments agree within FP32_BOUND relative
#                to each tensor's largest magnitude (the scalars relative to
#                themselves); the losses on a text file too. Not bitwise: a
#                parameter's main grad accumulates several contributions
#                within one microbatch's backward (every token's embedding
#                row, every GEMM's dW added onto the running sum), and one
#                rank with two microbatches adds microbatch 1's
#                contributions onto microbatch 0's running sum one by one,
#                while two ranks sum each microbatch alone and then add the
#                two totals: the same terms, associated differently, a few
#                float roundings apart. The loss sum is one float per
#                microbatch, added in the same order either way. The
#                checkpoint of N ranks is one model.safetensors written by
#                rank 0.
#   placement    N=2 with offload (gdn_core_attn, core_attn, attn_proj),
#                and with side-stream recompute beside it, against N=2
#                without: per-rank fingerprints bitwise equal
#                every step; with offload every rank's every offloaded scope
#                has d2h_count == h2d_count > 0 each step, without it none;
#                the pinned pool is empty after every step on every rank.
#   errors       a world size other than the compiled one is refused naming
#                both numbers and both fixes (N=1 binary on 2 ranks, N=2
#                binary alone); ranks running different programs or
#                different flags are refused naming the ranks and both
#                hashes; a rank that fails after the ranks connected ends
#                the job with an error naming the rank; a rank killed
#                mid-training (SIGKILL) ends the job within 60 s with an
#                error naming it (mpirun's, the rank itself cannot speak).
#   resume       N=2: 2 steps + --save, then --resume to 4 equals 4 steps
#                without stopping, bitwise, on each rank; a checkpoint of
#                N=2 also resumes on N=1 (--resume-ranks 4: on N=4) with
#                the same global batch, saying that the world size differs,
#                loss and grad norm within the bound.
#
#   fsdp         the Megatron-FSDP scenario under ZeRO-3 (case_fsdp says
#                what it checks).
#   torchrun     a torchrun-style launch without mpirun (TCP through rank
#                0): the MPI run's bits on every rank; a rank killed
#                mid-training ends the other within 60 s, naming it.
#
# --mode zero3 runs equivalence, placement and resume with binaries of
# several ranks compiled --data-parallel=zero3 (the one-rank reference of
# equivalence stays replicated): the ranks hold their own shards, so they
# agree on loss and grad norm every step, not on fingerprints; placements
# are still bitwise equal per rank; the checkpoint is index.json and one
# file per rank, which actplace-ckpt consolidates into the tensors one rank
# saves (checked against them within the bound); resume at the same N is
# bitwise, and onto another N (1, or 4 with --resume-ranks 4) reshards.
#
#===------------------------------------------------------------------------===#
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

from e2echeck import check, exit_status, placement_steps_agree, run_logged

# Relative to the largest magnitude of each tensor (and to each scalar):
# 2^-18, 32 float ulps of that magnitude. Measured on this model over 3
# steps: 7e-8 for the grads, 1.8e-7 for the saved state.
FP32_BOUND = 2.0 ** -18
OFFLOAD = ["--offload-modules=gdn_core_attn,core_attn,attn_proj",
           "--hide-rule=off"]


def read_f32(path):
    """{name: tuple of floats} of the F32 tensors of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        b, e = t["data_offsets"]
        # A checkpoint names an f32 compute weight "param/<HF name>"; a
        # consolidated file (actplace-ckpt) uses the HF name alone.
        if name.startswith("param/"):
            name = name[len("param/"):]
        out[name] = struct.unpack("<%df" % ((e - b) // 4), data[b:e])
    return out


def compare_tensors(what, a_path, b_path):
    """Checks every F32 tensor of two files within FP32_BOUND; returns the
    worst tensor-relative difference and how many values differ."""
    a, b = read_f32(a_path), read_f32(b_path)
    check(sorted(a) == sorted(b) and a,
          "%s: the files hold other tensors: %s / %s" %
          (what, sorted(a)[:4], sorted(b)[:4]))
    worst, differ, total = 0.0, 0, 0
    for name in sorted(set(a) & set(b)):
        scale = max(abs(x) for x in a[name]) or 1.0
        d = 0.0
        for x, y in zip(a[name], b[name]):
            total += 1
            if x != y:
                differ += 1
                d = max(d, abs(x - y))
        check(d <= FP32_BOUND * scale,
              "%s: %s differs by %g, above %g x max |value| %g" %
              (what, name, d, FP32_BOUND, scale))
        worst = max(worst, d / scale)
    print("%s: %d of %d values differ, worst %.3g of the tensor's largest "
          "magnitude (bound %.3g)" % (what, differ, total, worst, FP32_BOUND),
          flush=True)


def close(a, b):
    return abs(a - b) <= FP32_BOUND * max(abs(a), abs(b))


def replicated_runner(mpirun_required=True, extra=None):
    """The command line the single-mode e2e scripts share (--compile,
    --model, --mpirun, --work, and what `extra(parser)` adds), a fresh
    --work folder and a Runner for replicated ranks: (args, runner)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", required=True)
    ap.add_argument("--model", required=True)
    if mpirun_required:
        ap.add_argument("--mpirun", required=True)
    else:
        ap.add_argument("--mpirun", default="")
    ap.add_argument("--work", required=True)
    if extra:
        extra(ap)
    args = ap.parse_args()
    args.mode = "replicate"
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    return args, Runner(args)


class Runner:
    def __init__(self, args):
        self.args = args
        self.work = args.work
        self.sharded = args.mode == "zero3"

    def path(self, *p):
        return os.path.join(self.work, *p)

    def compile(self, name, *flags, mode=None):
        """Compiles the model; binaries of several ranks use --mode unless
        `mode` names another (a one-rank reference is replicated)."""
        binary = self.path(name)
        cmd = [self.args.compile, self.args.model, "-o", binary, "--seq",
               "16"] + list(flags)
        if mode is None:
            mode = self.args.mode if any(
                f.startswith("--data-parallel-size=") for f in flags) \
                else "replicate"
        if mode != "replicate":
            cmd.append("--data-parallel=" + mode)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            print("FAIL: " + " ".join(cmd))
            sys.exit(1)
        return binary

    def run(self, cmd, timeout=120):
        shown = " ".join(os.path.relpath(c, self.work)
                         if c.startswith(self.work) else c for c in cmd)
        return run_logged(cmd, self.work, timeout=timeout, shown=shown)

    def mpirun(self, n, *rest, timeout=120):
        return self.run([self.args.mpirun, "-np", str(n), "--oversubscribe",
                         "--allow-run-as-root"] + list(rest), timeout=timeout)

    def train(self, binary, ranks, *flags, metrics=None):
        """Runs `binary` on `ranks` ranks (1: no launcher); returns the
        completed process and the metrics lines by rank."""
        if metrics:
            for f in os.listdir(self.work):
                if f == metrics or f.startswith(metrics + ".rank"):
                    os.remove(self.path(f))
        cmd = [binary, "--device", "host"] + list(flags)
        if metrics:
            cmd += ["--fingerprints", "--metrics", self.path(metrics)]
        r = self.mpirun(ranks, *cmd) if ranks > 1 else self.run(cmd)
        lines = []
        for rank in range(ranks if metrics else 0):
            p = self.path(metrics + ("" if rank == 0 else ".rank%d" % rank))
            if not check(os.path.exists(p), "no metrics file " + p):
                lines.append([])
                continue
            with open(p) as f:
                lines.append([json.loads(l) for l in f if l.strip()])
        return r, lines


def replicas_agree(what, lines, steps, sharded=False):
    """Every rank wrote `steps` lines and holds rank 0's bits every step
    (`sharded`, ZeRO-3: its own shards, so only the loss and the grad norm
    are rank 0's)."""
    for rank, ls in enumerate(lines):
        check(len(ls) == steps, "%s rank %d: %d metrics lines, expected %d" %
              (what, rank, len(ls), steps))
        for m in ls:
            check(m.get("rank") == rank and m.get("world_size") == len(lines),
                  "%s rank %d step %s: rank/world_size fields %s/%s" %
                  (what, rank, m.get("step"), m.get("rank"),
                   m.get("world_size")))
            check(m["pinned_pool"]["in_use"] == 0,
                  "%s rank %d step %d: pinned pool in use" %
                  (what, rank, m["step"]))
    for rank in range(1, len(lines)):
        for a, b in zip(lines[0], lines[rank]):
            check((sharded or a["fingerprints"] == b["fingerprints"]) and
                  a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"],
                  "%s step %d: rank %d differs from rank 0:\n  %s\n  %s" %
                  (what, a["step"], rank, a["fingerprints"],
                   b["fingerprints"]))


def case_equivalence(t):
    steps, n = 3, t.args.ranks
    n2 = t.compile("train-n2", "--micro-batches", "1",
                   "--data-parallel-size=%d" % n)
    n1 = t.compile("train-n1", "--micro-batches", str(n))
    r2, l2 = t.train(n2, n, "--steps", str(steps), "--save", t.path("ck-n2"),
                     "--dump-grads", t.path("grads-n2.safetensors"),
                     metrics="n2.jsonl")
    check(r2.returncode == 0, "N=2 run failed")
    r1, l1 = t.train(n1, 1, "--steps", str(steps), "--save", t.path("ck-n1"),
                     "--dump-grads", t.path("grads-n1.safetensors"),
                     metrics="n1.jsonl")
    check(r1.returncode == 0, "N=1 run failed")
    replicas_agree("N=2", l2, steps, t.sharded)
    check(len(l1) == 1 and len(l1[0]) == steps, "N=1 metrics lines")
    check(all("rank" not in m for m in l1[0]),
          "a world of one writes rank fields")
    # Only rank 0 shows progress.
    check(r2.stderr.count("step %d/%d" % (steps, steps)) == 1,
          "N=2: the progress line is not printed once:\n" + r2.stderr)
    bitwise = True
    for a, b in zip(l2[0], l1[0]):
        for key in ("loss", "grad_norm", "lr"):
            check(close(a[key], b[key]), "step %d: %s %r on N=2, %r on N=1" %
                  (a["step"], key, a[key], b[key]))
            bitwise &= a[key] == b[key]
        # The global batch: the same tokens per step either way.
        check(a["tokens_per_s"] * a["step_time_s"] ==
              b["tokens_per_s"] * b["step_time_s"] or
              close(a["tokens_per_s"] * a["step_time_s"],
                    b["tokens_per_s"] * b["step_time_s"]),
              "step %d: tokens per step differ" % a["step"])
    print("losses N=2 %s\n       N=1 %s (%s)" %
          ([m["loss"] for m in l2[0]], [m["loss"] for m in l1[0]],
           "bitwise" if bitwise else "within the bound"), flush=True)
    compare_tensors("last step's grads", t.path("grads-n2.safetensors"),
                    t.path("grads-n1.safetensors"))
    step_dir = "step-%08d" % steps
    files = sorted(os.listdir(t.path("ck-n2", step_dir)))
    saved = t.path("ck-n2", step_dir, "model.safetensors")
    if t.sharded:
        # One file per rank and the index; consolidated, it holds the
        # tensors one rank saves.
        shards = ["model-rank%05d-of-%05d.safetensors" % (r, n)
                  for r in range(n)]
        check(files == sorted(["index.json"] + shards),
              "N=%d zero3 checkpoint: expected index.json and %s, found %s"
              % (n, shards, files))
        saved = t.path("consolidated.safetensors")
        r = t.run([t.args.ckpt_tool, "consolidate", "--with-optimizer",
                   t.path("ck-n2", step_dir), saved])
        check(r.returncode == 0, "actplace-ckpt consolidate failed")
    else:
        check(files == ["model.safetensors"],
              "N=2 checkpoint: expected rank 0's model.safetensors only, "
              "found %s" % files)
    compare_tensors("saved state after %d steps" % steps, saved,
                    t.path("ck-n1", step_dir, "model.safetensors"))
    # A text file (byte tokens): the ranks read consecutive windows of the
    # global batch, so the losses again agree with one rank's.
    src = os.path.dirname(os.path.dirname(os.path.abspath(t.args.model)))
    text = t.path("text.txt")
    with open(text, "w") as out, \
            open(os.path.join(src, "docs", "tools.md")) as f:
        out.write(f.read())
    data = "--data=text:" + text
    r2, l2 = t.train(n2, n, "--steps", "2", data, metrics="n2-text.jsonl")
    r1, l1 = t.train(n1, 1, "--steps", "2", data, metrics="n1-text.jsonl")
    check(r2.returncode == 0 and r1.returncode == 0, "text runs failed")
    replicas_agree("N=%d text" % n, l2, 2, t.sharded)
    for a, b in zip(l2[0] if l2 else [], l1[0] if l1 else []):
        check(close(a["loss"], b["loss"]) and
              close(a["grad_norm"], b["grad_norm"]),
              "text step %d: loss, grad norm %r, %r on N=%d, %r, %r on N=1" %
              (a["step"], a["loss"], a["grad_norm"], n, b["loss"],
               b["grad_norm"]))
    print("text losses N=%d %s, N=1 %s" % (
        n, [m["loss"] for m in l2[0]] if l2 else [],
        [m["loss"] for m in l1[0]] if l1 else []), flush=True)


def case_placement(t):
    steps = 3
    off = t.compile("train-n2", "--micro-batches", "2",
                    "--data-parallel-size=2")
    on = t.compile("train-n2-offload", "--micro-batches", "2",
                   "--data-parallel-size=2", *OFFLOAD)
    r, loff = t.train(off, 2, "--steps", str(steps), metrics="off.jsonl")
    check(r.returncode == 0, "N=2 without offload failed")
    r, lon = t.train(on, 2, "--steps", str(steps), metrics="on.jsonl")
    check(r.returncode == 0, "N=2 with offload failed")
    replicas_agree("no offload", loff, steps, t.sharded)
    replicas_agree("offload", lon, steps, t.sharded)
    for rank in range(2):
        placement_steps_agree(rank, loff[rank], lon[rank])
        scopes = sorted(lon[rank][0]["transfers"]) if lon[rank] else []
        for leaf in ("gdn_core_attn", "core_attn", "attn_proj"):
            check(any(s.endswith("." + leaf) for s in scopes),
                  "rank %d: no offloaded %s scope in %s" % (rank, leaf,
                                                           scopes))
        print("rank %d offloaded scopes: %s" % (rank, ", ".join(scopes)),
              flush=True)
    # Recompute issued on the side stream (layer 0's in_proj and gdn_prep
    # beside its GDN chunk backward, as in placements_bitident.py) with
    # offload: the same bits per rank again (side kernels and the comm
    # stream's bucketed sums ordered by the schedule's events).
    side = t.compile("train-n2-side", "--micro-batches", "2",
                     "--data-parallel-size=2",
                     "--recompute-modules=gdn_in_proj,gdn_prep,mlp_fc1",
                     "--recompute-stream=side", "--offload-modules=core_attn",
                     "--hide-rule=off")
    r, lside = t.train(side, 2, "--steps", str(steps), metrics="side.jsonl")
    check(r.returncode == 0, "N=2 with side-stream recompute failed")
    replicas_agree("side-stream recompute", lside, steps, t.sharded)
    for rank in range(2):
        for a, b in zip(loff[rank], lside[rank]):
            check(a["fingerprints"] == b["fingerprints"],
                  "rank %d step %d: side-stream recompute changed the bits"
                  % (rank, a["step"]))


def case_errors(t):
    n1 = t.compile("train-n1")
    n2 = t.compile("train-n2", "--data-parallel-size=2")
    n2b = t.compile("train-n2-seq8", "--data-parallel-size=2", "--seq", "8")
    # The N=1 binary on 2 ranks.
    r = t.mpirun(2, n1, "--device", "host", "--steps", "1")
    check(r.returncode != 0, "an N=1 binary trained on 2 ranks")
    check("started 2 rank(s) but this binary was compiled for 1" in r.stderr
          and "--data-parallel-size=2" in r.stderr and "mpirun -np 1" in
          r.stderr, "N=1 on 2 ranks: the error does not name both numbers "
          "and both fixes:\n" + r.stderr)
    # The N=2 binary alone.
    r = t.run([n2, "--device", "host", "--steps", "1"])
    check(r.returncode == 1, "an N=2 binary trained alone (exit %d)" %
          r.returncode)
    check("started 1 rank(s) but this binary was compiled for 2" in r.stderr
          and "--data-parallel-size=1" in r.stderr and "mpirun -np 2" in
          r.stderr, "N=2 alone: the error does not name both numbers:\n" +
          r.stderr)
    # Two programs (another sequence length) in one job.
    r = t.run([t.args.mpirun, "--oversubscribe", "--allow-run-as-root",
               "-np", "1", n2, "--device", "host", "--steps", "1", ":",
               "-np", "1", n2b, "--device", "host", "--steps", "1"])
    check(r.returncode != 0, "two programs trained together")
    check("rank 1 runs another program than rank 0 (program hash" in r.stderr,
          "two programs: the error does not name the ranks and hashes:\n" +
          r.stderr)
    # One program with other flags on rank 1.
    r = t.run([t.args.mpirun, "--oversubscribe", "--allow-run-as-root",
               "-np", "1", n2, "--device", "host", "--steps", "2", ":",
               "-np", "1", n2, "--device", "host", "--steps", "3"])
    check(r.returncode != 0, "ranks with other --steps trained together")
    check("rank 1 was started with other training flags than rank 0" in
          r.stderr and "flags hash" in r.stderr,
          "other flags: the error does not name the ranks and hashes:\n" +
          r.stderr)
    # A rank that fails after the ranks connected (rank 1 cannot open its
    # metrics file: a folder is in the way) ends the job, naming the rank,
    # while rank 0 waits in the first step's collectives.
    os.makedirs(t.path("fail.jsonl.rank1"), exist_ok=True)
    r = t.mpirun(2, n2, "--device", "host", "--steps", "2", "--metrics",
                 t.path("fail.jsonl"), timeout=60)
    check(r.returncode not in (0, 124), "a failing rank: exit %d" %
          r.returncode)
    check("error: rank 1 of 2:" in r.stderr and "fail.jsonl.rank1" in
          r.stderr, "a failing rank: no error naming rank 1 and its file:\n"
          + r.stderr)
    killed_rank(t, n2)


def killed_rank(t, binary):
    """A rank killed mid-training (SIGKILL: no error path of its own runs)
    ends the job within 60 s with an error naming the rank, while the other
    rank waits in a collective: mpirun sees the death and stops the job."""
    import signal
    import time
    metrics = t.path("killed.jsonl")
    cmd = [t.args.mpirun, "-np", "2", "--oversubscribe", "--allow-run-as-root",
           binary, "--device", "host", "--steps", "100000", "--metrics",
           metrics]
    print("$ " + " ".join(cmd) + "   (rank 1 killed after a step)", flush=True)
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, cwd=t.work)
    victim = None
    deadline = time.time() + 60
    while victim is None and time.time() < deadline and job.poll() is None:
        time.sleep(0.2)
        if not (os.path.exists(metrics + ".rank1") and
                os.path.getsize(metrics + ".rank1") > 0):
            continue
        # Rank 1 is the process of the binary whose MPI rank is 1.
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    argv0 = f.read().split(b"\0")[0].decode()
                with open("/proc/%s/environ" % pid, "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if argv0 == binary and b"OMPI_COMM_WORLD_RANK=1" in env:
                victim = int(pid)
                break
    if not check(victim is not None, "killed rank: rank 1 never trained a "
                 "step or was not found"):
        job.kill()
        job.communicate()
        return
    killed = time.time()
    os.kill(victim, signal.SIGKILL)
    try:
        _, err = job.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        job.kill()
        job.communicate()
        check(False, "killed rank: the job still ran 60 s after rank 1 died")
        return
    took = time.time() - killed
    print("  -> %d after %.1f s" % (job.returncode, took), flush=True)
    check(job.returncode != 0, "killed rank: the job exited 0")
    check("rank 1" in err, "killed rank: no error naming rank 1:\n" + err)


def case_resume(t):
    n2 = t.compile("train-n2", "--micro-batches", "2",
                   "--data-parallel-size=2")
    # Another world size with the same global batch (4 microbatches).
    other_n = t.args.resume_ranks
    n1 = t.compile("train-other", "--micro-batches", str(4 // other_n),
                   "--data-parallel-size=%d" % other_n)
    r, full = t.train(n2, 2, "--steps", "4", metrics="full.jsonl")
    check(r.returncode == 0, "uninterrupted N=2 run failed")
    ck = t.path("ck")
    r, first = t.train(n2, 2, "--steps", "2", "--save", ck,
                       metrics="first.jsonl")
    check(r.returncode == 0, "N=2 run to step 2 failed")
    check(open(os.path.join(ck, "latest")).read().strip() == "step-00000002",
          "N=2: 'latest' does not name step 2")
    r, rest = t.train(n2, 2, "--steps", "4", "--resume", ck,
                      metrics="rest.jsonl")
    check(r.returncode == 0, "N=2 resume failed")
    check("note:" not in r.stderr,
          "N=2 resume at the same layout printed a note:\n" + r.stderr)
    replicas_agree("resumed", rest, 2, t.sharded)
    for rank in range(2):
        got = first[rank] + rest[rank]
        check([m["step"] for m in got] == [1, 2, 3, 4],
              "rank %d: steps %s" % (rank, [m["step"] for m in got]))
        for a, b in zip(full[rank], got):
            check(a["fingerprints"] == b["fingerprints"] and
                  a["loss"] == b["loss"],
                  "rank %d step %d: 2 + resume + 2 differs from 4 steps:\n"
                  "  %s\n  %s" % (rank, a["step"], a["fingerprints"],
                                  b["fingerprints"]))
    # The replicated checkpoint is one world-of-one file: another N with
    # the same global batch resumes it, saying the layout differs, and
    # trains on the same sequences (within the bound; see equivalence).
    r, other = t.train(n1, other_n, "--steps", "4", "--resume", ck,
                       metrics="other.jsonl")
    check(r.returncode == 0, "N=%d resume of the N=2 checkpoint failed" %
          other_n)
    check("note: resumed under a different placement" in r.stderr and
          "world_size: checkpoint '2', this run '%d'" % other_n in r.stderr,
          "N=%d resume: no note naming the world size:\n%s" %
          (other_n, r.stderr))
    if other_n > 1:
        replicas_agree("resumed on N=%d" % other_n, other, 2, t.sharded)
    check(other and len(other[0]) == 2, "N=%d resume: 2 metrics lines" %
          other_n)
    for a, b in zip(full[0][2:], other[0] if other else []):
        check(close(a["loss"], b["loss"]) and
              close(a["grad_norm"], b["grad_norm"]),
              "step %d: loss, grad norm %r, %r on N=2, %r, %r on N=%d after "
              "resume" % (a["step"], a["loss"], a["grad_norm"], b["loss"],
                          b["grad_norm"], other_n))


# bf16 main grads against fp32 ones (ZeRO-3, same model, steps and data):
# each main-grad element is rounded to bf16 once per reduce-scatter (2^-9
# relative at most), so the grad norm moves by about that much and the
# parameters by a fraction of lr per step; the loss follows the parameters.
# Measured on the tiny model over 5 steps at N=2: grad norm 4.2e-4, loss
# 7.2e-6 relative (equal for the first steps, where lr is tiny).
BF16_NORM_BOUND = 2.0 ** -7
BF16_LOSS_BOUND = 1e-4


def check_offload_pair(what, off, on, n):
    """Per rank, `on` (core_attn and attn_proj offloaded) holds `off`'s bits
    every step, copies per offloaded scope (D2H = H2D > 0) where `off` has
    none."""
    for rank in range(n):
        for a, b in zip(off[rank], on[rank]):
            check(a["fingerprints"] == b["fingerprints"],
                  "%s rank %d step %d: offload changed the bits" %
                  (what, rank, a["step"]))
            check(all(c["d2h_count"] == 0 and c["h2d_count"] == 0
                      for c in a["transfers"].values()),
                  "%s rank %d step %d: copies without offload" %
                  (what, rank, a["step"]))
            scopes = sorted(b["transfers"])
            check(scopes and all(s.endswith((".core_attn", ".attn_proj"))
                                 for s in scopes),
                  "%s rank %d step %d: offloaded scopes %s" %
                  (what, rank, b["step"], scopes))
            for scope, c in b["transfers"].items():
                check(c["d2h_count"] > 0 and
                      c["d2h_count"] == c["h2d_count"],
                      "%s rank %d step %d: scope %s counters %s" %
                      (what, rank, b["step"], scope, c))


def case_fsdp(t):
    """The Megatron-FSDP scenario: ZeRO-3 on N ranks, MLA core_attn and
    attn_proj offloaded, one gather in flight ahead, clipping at 1.0 (the
    default max-grad-norm; the tiny model's norms exceed it, so every step
    clips), several steps, fp32 and bf16 main grads (fp32 masters either
    way). Placement on and off bitwise per rank, D2H and H2D counted per
    offloaded scope when on and none when off, the pinned pool empty after
    every step, and one replicated rank with the same global batch within
    the bound (fp32 main grads); bf16 main grads: the ranks agree, a smaller
    planned peak per rank, loss and grad norm within the bf16 bounds of the
    fp32 run, and not bitwise equal to it (the rounding shows)."""
    steps, n = 5, t.args.ranks
    common = ["--micro-batches", "1", "--data-parallel-size=%d" % n,
              "--gather-max-inflight=1"]
    offload = ["--hide-rule=off", "--offload-modules=core_attn,attn_proj"]
    bf16 = ["--main-grad-dtype=bf16"]
    off = t.compile("fsdp-off", *common, mode="zero3")
    on = t.compile("fsdp-on", *common, *offload, mode="zero3")
    boff = t.compile("fsdp-bf16-off", *common, *bf16, mode="zero3")
    bon = t.compile("fsdp-bf16-on", *common, *bf16, *offload, mode="zero3")
    one = t.compile("fsdp-n1", "--micro-batches", str(n))
    r, loff = t.train(off, n, "--steps", str(steps), metrics="off.jsonl")
    check(r.returncode == 0, "zero3 without offload failed")
    r, lon = t.train(on, n, "--steps", str(steps), metrics="on.jsonl")
    check(r.returncode == 0, "zero3 with offload failed")
    r, lboff = t.train(boff, n, "--steps", str(steps),
                       metrics="bf16-off.jsonl")
    check(r.returncode == 0, "zero3 bf16 main grads without offload failed")
    r, lbon = t.train(bon, n, "--steps", str(steps), metrics="bf16-on.jsonl")
    check(r.returncode == 0, "zero3 bf16 main grads with offload failed")
    r, l1 = t.train(one, 1, "--steps", str(steps), metrics="n1.jsonl")
    check(r.returncode == 0, "one rank failed")
    replicas_agree("zero3", loff, steps, sharded=True)
    replicas_agree("zero3 offload", lon, steps, sharded=True)
    replicas_agree("zero3 bf16", lboff, steps, sharded=True)
    replicas_agree("zero3 bf16 offload", lbon, steps, sharded=True)
    check_offload_pair("fp32 main grads", loff, lon, n)
    check_offload_pair("bf16 main grads", lboff, lbon, n)
    differ = False
    for a, b in zip(loff[0] if loff else [], lboff[0] if lboff else []):
        check(b["planned_peak_bytes"] < a["planned_peak_bytes"],
              "step %d: bf16 main grads plan %d bytes per rank, fp32 %d" %
              (a["step"], b["planned_peak_bytes"], a["planned_peak_bytes"]))
        check(abs(b["grad_norm"] - a["grad_norm"]) <=
              BF16_NORM_BOUND * abs(a["grad_norm"]) and
              abs(b["loss"] - a["loss"]) <= BF16_LOSS_BOUND * abs(a["loss"]),
              "step %d: loss, grad norm %r, %r with bf16 main grads, %r, %r "
              "with fp32 (bounds %g, %g relative)" %
              (a["step"], b["loss"], b["grad_norm"], a["loss"],
               a["grad_norm"], BF16_LOSS_BOUND, BF16_NORM_BOUND))
        differ |= a["grad_norm"] != b["grad_norm"]
    check(differ, "bf16 main grads gave the fp32 grad norms bit for bit: "
          "were they rounded at all?")
    check(loff and any(m["grad_norm"] > 1.0 for m in loff[0]),
          "no step's grad norm exceeds 1.0: clipping was not exercised")
    for a, b in zip(loff[0] if loff else [], l1[0] if l1 else []):
        check(close(a["loss"], b["loss"]) and
              close(a["grad_norm"], b["grad_norm"]),
              "step %d: loss, grad norm %r, %r on zero3 N=%d, %r, %r on one "
              "rank" % (a["step"], a["loss"], a["grad_norm"], n, b["loss"],
                        b["grad_norm"]))
    print("zero3 N=%d losses %s, bf16 main grads %s, one rank %s" %
          (n, [m["loss"] for m in loff[0]] if loff else [],
           [m["loss"] for m in lboff[0]] if lboff else [],
           [m["loss"] for m in l1[0]] if l1 else []), flush=True)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_env(rank, n, port):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("OMPI_", "PMI_", "PMIX_", "SLURM_")):
            del env[k]
    env.update({"RANK": str(rank), "WORLD_SIZE": str(n),
                "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(n),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    return env


def case_torchrun(t):
    """A torchrun-style launch (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
    no mpirun): the host backend's TCP communicator gives the bits of the
    MPI run on every rank; a rank killed mid-training (SIGKILL, no launcher
    to clean up) makes the other exit within 60 s with an error naming
    it."""
    import signal
    import time
    n, steps = t.args.ranks, 3
    binary = t.compile("train-n%d" % n, "--micro-batches", "1",
                       "--data-parallel-size=%d" % n)
    r, mpi = t.train(binary, n, "--steps", str(steps), metrics="mpi.jsonl")
    check(r.returncode == 0, "the mpirun run failed")
    port = free_port()
    metrics = t.path("tcp.jsonl")
    cmd = [binary, "--device", "host", "--steps", str(steps),
           "--fingerprints", "--metrics", metrics]
    print("$ RANK=0..%d WORLD_SIZE=%d MASTER_PORT=%d %s" %
          (n - 1, n, port, " ".join(cmd)), flush=True)
    procs = [subprocess.Popen(cmd, env=torchrun_env(rank, n, port),
                              cwd=t.work, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for rank in range(n)]
    for rank, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        check(p.returncode == 0, "torchrun-style rank %d exited %d:\n%s" %
              (rank, p.returncode, err))
    for rank in range(n):
        path = metrics + ("" if rank == 0 else ".rank%d" % rank)
        if not check(os.path.exists(path), "no metrics file " + path):
            continue
        with open(path) as f:
            got = [json.loads(l) for l in f if l.strip()]
        check(len(got) == steps and all(
            a["fingerprints"] == b["fingerprints"] and a["loss"] == b["loss"]
            for a, b in zip(got, mpi[rank])),
              "rank %d: the TCP run differs from the MPI run" % rank)
    print("torchrun-style launch: every rank's fingerprints equal mpirun's",
          flush=True)
    # Rank 1 killed after its first step: no launcher stops rank 0.
    port = free_port()
    metrics = t.path("killed.jsonl")
    cmd = [binary, "--device", "host", "--steps", "100000", "--metrics",
           metrics]
    procs = [subprocess.Popen(cmd, env=torchrun_env(rank, n, port),
                              cwd=t.work, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for rank in range(n)]
    deadline = time.time() + 60
    while time.time() < deadline and not (
            os.path.exists(metrics + ".rank1") and
            os.path.getsize(metrics + ".rank1") > 0):
        time.sleep(0.1)
    if not check(procs[1].poll() is None,
                 "rank 1 ended before it could be killed"):
        for p in procs:
            p.kill()
        return
    killed = time.time()
    os.kill(procs[1].pid, signal.SIGKILL)
    procs[1].communicate()
    try:
        _, err = procs[0].communicate(timeout=60)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        procs[0].communicate()
        check(False, "rank 0 still ran 60 s after rank 1 was killed")
        return
    took = time.time() - killed
    print("  rank 0 -> %d %.1f s after rank 1 was killed" %
          (procs[0].returncode, took), flush=True)
    check(procs[0].returncode != 0, "rank 0 exited 0 after rank 1 died")
    check("rank 1 closed its connection" in err and "error: rank 0 of 2" in
          err, "rank 0's error does not name rank 1:\n" + err)


CASES = {"equivalence": case_equivalence, "placement": case_placement,
         "errors": case_errors, "resume": case_resume, "fsdp": case_fsdp,
         "torchrun": case_torchrun}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--case", required=True, choices=sorted(CASES))
    ap.add_argument("--resume-ranks", type=int, default=1, choices=(1, 4),
                    help="resume: the other world size that resumes the "
                    "N=2 checkpoint")
    ap.add_argument("--ckpt-tool", default="actplace-ckpt",
                    help="zero3: actplace-ckpt, to consolidate checkpoints")
    ap.add_argument("--mode", default="replicate",
                    choices=("replicate", "zero3"),
                    help="--data-parallel of the binaries of several ranks")
    ap.add_argument("--ranks", type=int, default=2,
                    help="equivalence: N ranks x 1 microbatch against one "
                    "rank x N")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    CASES[args.case](Runner(args))
    return exit_status("data parallel %s: ok" % args.case)


if __name__ == "__main__":
    sys.exit(main())
