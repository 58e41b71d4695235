#!/usr/bin/env python3
#===- zero3_checkpoint.py - ZeRO-3 checkpoints of generated binaries -------===#
#
# The tiny model (models/tiny-hybrid.json, seq 16) compiled with
# --data-parallel=zero3 and trained on 2 ranks under mpirun (host backend).
# One case per run (--case), each its own ctest:
#
#   consolidate  A zero3 checkpoint is one shard file per rank plus an
#                index.json whose pieces tile every tensor.
#                `actplace-ckpt consolidate` joins it into bare-named whole
#                tensors that equal the shards' slices byte for byte, and
#                the parameters (and with --with-optimizer the masters and
#                moments) of a replicate run of the same ranks and batch
#                within FP32_BOUND (zero3's grad norm is the rank-order sum
#                of squared shard norms, a rounding away from replicate's,
#                and the clip acts on this model); the file trains as
#                --init-weights on one rank and on two. Bad input (a
#                missing shard, an index that does not cover a tensor, bad
#                usage) exits nonzero naming the file and leaves OUT as it
#                was.
#   reshard      Same N: 2 steps + --resume to 3 equals 3 steps, per-rank
#                fingerprints bitwise, also resumed by a binary that
#                offloads (another placement). Another N: the N=2 zero3 checkpoint
#                resumes on one replicated rank (the same global batch) and
#                a one-rank checkpoint on two zero3 ranks, each saying the
#                layout differs; the next step's loss and grad norm and the
#                saved state (tensor by tensor, consolidated) agree with
#                the run that did not change N within FP32_BOUND. A resume
#                from a checkpoint with a missing shard, a shard of another
#                save or an index that does not cover the model fails
#                naming the file, and the checkpoint folder keeps every
#                byte and its "latest".
#
#===------------------------------------------------------------------------===#
import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

from e2echeck import check, exit_status, run_logged

# Relative to each tensor's largest magnitude (as data_parallel.py): 2^-18.
FP32_BOUND = 2.0 ** -18
R0 = "model-rank00000-of-00002.safetensors"
R1 = "model-rank00001-of-00002.safetensors"


def tensors_of(path):
    """{name: (dtype, shape, bytes)} of a safetensors file, and its
    metadata."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    return {k: (v["dtype"], v["shape"],
                data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}, meta


def values(dtype, raw):
    """The floats of a BF16 or F32 tensor's bytes."""
    if dtype == "F32":
        return struct.unpack("<%df" % (len(raw) // 4), raw)
    halves = struct.unpack("<%dH" % (len(raw) // 2), raw)
    return [struct.unpack("<f", struct.pack("<I", h << 16))[0]
            for h in halves]


def element_size(dtype):
    return {"BF16": 2, "F32": 4, "I64": 8}[dtype]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def within_bound(what, a, b, names):
    """Each tensor of `names` in a and b ({name: (dtype, shape, bytes)})
    within FP32_BOUND of its largest magnitude; prints how many differ."""
    differ = total = 0
    worst = 0.0
    for name in names:
        if not check(name in a and name in b, "%s: %s missing" % (what, name)):
            continue
        (da, sa, ba), (db, sb, bb) = a[name], b[name]
        if not check(da == db and sa == sb, "%s: %s is %s %s vs %s %s" %
                     (what, name, da, sa, db, sb)):
            continue
        if ba == bb:
            total += numel(sa)
            continue
        va, vb = values(da, ba), values(db, bb)
        scale = max(abs(x) for x in va) or 1.0
        d = 0.0
        for x, y in zip(va, vb):
            total += 1
            if x != y:
                differ += 1
                d = max(d, abs(x - y))
        # A BF16 tensor is a rounding of its master: a master apart by the
        # bound may round to the neighbouring BF16 value.
        bound = (2.0 ** -8 if da == "BF16" else FP32_BOUND) * scale
        check(d <= bound, "%s: %s differs by %g, above %g" %
              (what, name, d, bound))
        worst = max(worst, d / scale)
    print("%s: %d of %d values differ, worst %.3g of the tensor's largest "
          "magnitude" % (what, differ, total, worst), flush=True)


def folder_digest(path):
    """SHA-256 of every file name and content under `path` but the lock
    file (each run that saves there writes its own run id into it)."""
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(path)):
        for f in sorted(files):
            if f == "lock" and root == path:
                continue
            p = os.path.join(root, f)
            h.update(os.path.relpath(p, path).encode())
            with open(p, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


class T:
    def __init__(self, args):
        self.args = args
        self.work = args.work

    def path(self, *p):
        return os.path.join(self.work, *p)

    def compile(self, name, ranks, mode, micro_batches, *flags):
        cmd = [self.args.compile, self.args.model, "-o", self.path(name),
               "--seq", "16", "--micro-batches", str(micro_batches),
               "--data-parallel-size=%d" % ranks, "--data-parallel=" + mode]
        cmd += list(flags)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            print("FAIL: " + " ".join(cmd))
            sys.exit(1)
        return self.path(name)

    def run(self, cmd, timeout=120):
        return run_logged(cmd, self.work, timeout)

    def train(self, binary, ranks, *flags, metrics=None):
        """Runs `binary` on `ranks` ranks (1: no launcher); the completed
        process and rank 0's metrics lines (plus every rank's, by rank)."""
        cmd = [binary, "--device", "host"] + list(flags)
        if metrics:
            for f in os.listdir(self.work):
                if f == metrics or f.startswith(metrics + ".rank"):
                    os.remove(self.path(f))
            cmd += ["--fingerprints", "--metrics", self.path(metrics)]
        if ranks > 1:
            cmd = [self.args.mpirun, "-np", str(ranks), "--oversubscribe",
                   "--allow-run-as-root"] + cmd
        r = self.run(cmd)
        lines = []
        for rank in range(ranks if metrics else 0):
            p = self.path(metrics + ("" if rank == 0 else ".rank%d" % rank))
            if check(os.path.exists(p), "no metrics file " + p):
                with open(p) as f:
                    lines.append([json.loads(l) for l in f if l.strip()])
        return r, lines

    def ckpt(self, *args):
        return self.run([self.args.ckpt] + list(args))


def check_index(step_dir):
    """The index maps every tensor of the shards to pieces that tile it."""
    with open(os.path.join(step_dir, "index.json")) as f:
        idx = json.load(f)
    check(idx.get("world_size") == 2 and idx.get("shards") == [R0, R1],
          "index: world_size/shards %s/%s" % (idx.get("world_size"),
                                              idx.get("shards")))
    shards = [tensors_of(os.path.join(step_dir, s))[0] for s in (R0, R1)]
    names = set(shards[0]) - {"train/step"}
    check(set(idx.get("tensors", {})) == names,
          "index: tensors %d, shards hold %d" %
          (len(idx.get("tensors", {})), len(names)))
    for name, t in idx.get("tensors", {}).items():
        n, s = numel(t["shape"]), t["shard_numel"]
        check(s == (n + 1) // 2 and t["data_parallel_size"] == 2,
              "index: %s shard_numel %d of %d" % (name, s, n))
        ends = [(p["begin"], p["end"]) for p in t["pieces"]]
        want = [(0, min(s, n))] + ([(s, n)] if n > s else [])
        check(ends == want, "index: %s pieces %s, expected %s" %
              (name, ends, want))
        check(shards[0][name][1] == [s], "shard 0: %s has shape %s" %
              (name, shards[0][name][1]))
    return idx, shards


def case_consolidate(t):
    z3 = t.compile("z3n2", 2, "zero3", 1)
    rep = t.compile("repn2", 2, "replicate", 1)
    rep1 = t.compile("repn1", 1, "replicate", 2)
    r, _ = t.train(z3, 2, "--steps", "3", "--save", t.path("ck-z3"))
    check(r.returncode == 0, "zero3 N=2 run failed")
    r, _ = t.train(rep, 2, "--steps", "3", "--save", t.path("ck-rep"))
    check(r.returncode == 0, "replicate N=2 run failed")
    step_dir = t.path("ck-z3", "step-00000003")
    idx, shards = check_index(step_dir)

    out = t.path("weights.safetensors")
    r = t.ckpt("consolidate", t.path("ck-z3"), out)
    check(r.returncode == 0 and "wrote" in r.stderr,
          "consolidate failed: " + r.stderr)
    got, meta = tensors_of(out)
    check(meta.get("actplace.step") == "3", "consolidated step %s" %
          meta.get("actplace.step"))
    # Byte for byte the shards' slices, joined.
    params = sorted(n for n in idx["tensors"] if n.startswith("param/"))
    check(sorted("param/" + n for n in got) == params,
          "consolidated names %s" % sorted(got)[:4])
    for name in params:
        t_ = idx["tensors"][name]
        size = element_size(t_["dtype"])
        joined = b"".join(
            shards[0 if p["file"] == R0 else 1][name][2]
            [:(p["end"] - p["begin"]) * size] for p in t_["pieces"])
        bare = name[len("param/"):]
        check(bare in got and got[bare][2] == joined and
              got[bare][1] == t_["shape"] and got[bare][0] == t_["dtype"],
              "consolidated %s is not its shards joined" % bare)
    replicate, _ = tensors_of(t.path("ck-rep", "step-00000003",
                                     "model.safetensors"))
    within_bound("parameters against replicate", got,
                 {k[len("param/"):]: v for k, v in replicate.items()
                  if k.startswith("param/")}, sorted(got))
    full = t.path("full.safetensors")
    r = t.ckpt("consolidate", "--with-optimizer", step_dir, full)
    check(r.returncode == 0, "consolidate --with-optimizer failed")
    fgot, _ = tensors_of(full)
    state = sorted(n for n in replicate if n.split("/")[0] in
                   ("master", "adam_m", "adam_v"))
    check(state and all(n in fgot for n in state),
          "--with-optimizer: missing %s" % [n for n in state
                                            if n not in fgot][:4])
    within_bound("masters and moments against replicate", fgot, replicate,
                 state)

    # The weights train as --init-weights, on one rank and on two.
    r, l1 = t.train(rep1, 1, "--steps", "1", "--init-weights", out,
                    metrics="init1.jsonl")
    check(r.returncode == 0, "--init-weights on one rank failed")
    r, l2 = t.train(z3, 2, "--steps", "1", "--init-weights", out,
                    metrics="init2.jsonl")
    check(r.returncode == 0, "--init-weights on two zero3 ranks failed")
    if l1 and l2 and l1[0] and l2[0]:
        a, b = l1[0][0]["loss"], l2[0][0]["loss"]
        check(abs(a - b) <= FP32_BOUND * abs(a),
              "--init-weights: loss %r on one rank, %r on two" % (a, b))

    # Bad input: named, and OUT keeps what it held.
    with open(out, "rb") as f:
        before = f.read()
    broken = t.path("broken")
    shutil.copytree(step_dir, broken)
    os.remove(os.path.join(broken, R1))
    r = t.ckpt("consolidate", broken, out)
    check(r.returncode == 1 and "shard '%s' is missing" %
          os.path.join(broken, R1) in r.stderr,
          "missing shard: rc %d, %s" % (r.returncode, r.stderr))
    shutil.copy(os.path.join(step_dir, R1), os.path.join(broken, R1))
    with open(os.path.join(broken, "index.json")) as f:
        bad = json.load(f)
    bad["tensors"][params[0]]["pieces"].pop()
    with open(os.path.join(broken, "index.json"), "w") as f:
        json.dump(bad, f)
    r = t.ckpt("consolidate", broken, out)
    check(r.returncode == 1 and "tensor '%s': elements [" % params[0] in
          r.stderr and "are in no shard" in r.stderr,
          "uncovered tensor: rc %d, %s" % (r.returncode, r.stderr))
    with open(out, "rb") as f:
        check(f.read() == before, "a failed consolidate changed " + out)
    r = t.ckpt("consolidate", step_dir)
    check(r.returncode == 2 and "takes CKPT and OUT.safetensors" in r.stderr,
          "bad usage: rc %d" % r.returncode)
    r = t.ckpt("--help")
    check(r.returncode == 0 and "consolidate" in r.stdout, "--help")


def case_reshard(t):
    z3 = t.compile("z3n2", 2, "zero3", 2)
    rep1 = t.compile("repn1", 1, "replicate", 4)
    r, straight = t.train(z3, 2, "--steps", "3", "--save", t.path("z3-3"),
                          metrics="straight.jsonl")
    check(r.returncode == 0, "zero3 N=2 run to step 3 failed")
    ck = t.path("ck")
    r, _ = t.train(z3, 2, "--steps", "2", "--save", ck, "--save-every", "1")
    check(r.returncode == 0, "zero3 N=2 run to step 2 failed")
    r, resumed = t.train(z3, 2, "--steps", "3", "--save", t.path("z3-res"),
                         "--resume", ck, metrics="resumed.jsonl")
    check(r.returncode == 0 and "note:" not in r.stderr,
          "zero3 resume at N=2: rc %d, %s" % (r.returncode, r.stderr))
    # Also under another placement (offload), which keeps every bit.
    offload = t.compile("z3n2-offload", 2, "zero3", 2,
                        "--offload-modules=gdn_core_attn,core_attn,attn_proj",
                        "--hide-rule=off")
    r, placed = t.train(offload, 2, "--steps", "3", "--save",
                        t.path("z3-placed"), "--resume", ck,
                        metrics="placed.jsonl")
    check(r.returncode == 0 and "resumed under a different placement" in
          r.stderr, "zero3 resume under offload: rc %d, %s" %
          (r.returncode, r.stderr))
    for what, got in (("resumed", resumed), ("resumed with offload", placed)):
        for rank in range(2):
            a = straight[rank][-1] if rank < len(straight) else {}
            b = got[rank][-1] if rank < len(got) else {}
            check(a.get("fingerprints") == b.get("fingerprints") and
                  a.get("loss") == b.get("loss"),
                  "%s rank %d step 3: %s, straight %s" %
                  (what, rank, b.get("fingerprints"), a.get("fingerprints")))

    # N=2 zero3 -> one replicated rank, and one rank -> N=2 zero3.
    r, one = t.train(rep1, 1, "--steps", "3", "--save", t.path("one-res"),
                     "--resume", ck, metrics="one.jsonl")
    check(r.returncode == 0 and "world_size: checkpoint '2', this run '1'" in
          r.stderr and "data_parallel: checkpoint 'zero3'" in r.stderr,
          "N=2 -> 1 resume: rc %d, %s" % (r.returncode, r.stderr))
    ck1 = t.path("ck1")
    r, _ = t.train(rep1, 1, "--steps", "2", "--save", ck1)
    check(r.returncode == 0, "one-rank run to step 2 failed")
    r, one3 = t.train(rep1, 1, "--steps", "3", "--save", t.path("one-3"),
                      metrics="one3.jsonl")
    check(r.returncode == 0, "one-rank run to step 3 failed")
    r, two = t.train(z3, 2, "--steps", "3", "--save", t.path("two-res"),
                     "--resume", ck1, metrics="two.jsonl")
    check(r.returncode == 0 and "world_size: checkpoint '1', this run '2'" in
          r.stderr, "N=1 -> 2 resume: rc %d, %s" % (r.returncode, r.stderr))
    for what, a, b in (("N=2 -> 1", straight, one), ("N=1 -> 2", one3, two)):
        if not check(a and b and a[0] and b[0], what + ": no metrics"):
            continue
        x, y = a[0][-1], b[0][-1]
        for key in ("loss", "grad_norm"):
            check(abs(x[key] - y[key]) <= FP32_BOUND * abs(x[key]),
                  "%s step 3: %s %r, %r without the change" %
                  (what, key, y[key], x[key]))
    # The saved state, tensor by tensor, whole.
    for what, tag, a, b in (
            ("N=2 -> 1 state", "to1", t.path("z3-3"), t.path("one-res")),
            ("N=1 -> 2 state", "to2", t.path("one-3"), t.path("two-res"))):
        wa, wb = t.path(tag + "-a.safetensors"), t.path(tag + "-b.safetensors")
        ra, rb = t.ckpt("consolidate", "--with-optimizer", a, wa), \
            t.ckpt("consolidate", "--with-optimizer", b, wb)
        if check(ra.returncode == 0 and rb.returncode == 0,
                 what + ": consolidate failed"):
            ta, tb = tensors_of(wa)[0], tensors_of(wb)[0]
            check(sorted(ta) == sorted(tb), what + ": other tensors")
            within_bound(what, ta, tb, sorted(ta))

    # Bad checkpoints: the resume fails naming the file; the folder (a
    # continuation: --save is the checkpoint's own) keeps every byte.
    step2 = os.path.join(ck, "step-00000002")
    step1 = os.path.join(ck, "step-00000001")
    saved = t.path("step2-saved")
    shutil.copytree(step2, saved)

    def damaged(what, damage, needle):
        shutil.rmtree(step2)
        shutil.copytree(saved, step2)
        damage()
        digest = folder_digest(ck)
        r = t.run([t.args.mpirun, "-np", "2", "--oversubscribe",
                   "--allow-run-as-root", z3, "--device", "host", "--steps",
                   "3", "--save", ck, "--resume", ck])
        check(r.returncode != 0 and needle in r.stderr,
              "%s: rc %d, expected an error containing %r:\n%s" %
              (what, r.returncode, needle, r.stderr))
        check(folder_digest(ck) == digest,
              "%s: the failed resume changed the checkpoint folder" % what)
        with open(os.path.join(ck, "latest")) as f:
            check(f.read().strip() == "step-00000002",
                  what + ": 'latest' moved")

    damaged("missing shard", lambda: os.remove(os.path.join(step2, R1)),
            "shard '%s' is missing" % os.path.join(step2, R1))
    damaged("shard of another save",
            lambda: shutil.copy(os.path.join(step1, R1),
                                os.path.join(step2, R1)),
            "'%s' is of step 1" % os.path.join(step2, R1))

    def uncover():
        with open(os.path.join(step2, "index.json")) as f:
            idx = json.load(f)
        name = sorted(idx["tensors"])[0]
        idx["tensors"][name]["pieces"].pop()
        with open(os.path.join(step2, "index.json"), "w") as f:
            json.dump(idx, f)
    damaged("index that does not cover the model", uncover,
            "are in no shard (the index does not cover it)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--case", required=True,
                    choices=["consolidate", "reshard"])
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    t = T(args)
    {"consolidate": case_consolidate, "reshard": case_reshard}[args.case](t)
    return exit_status("zero3 checkpoint %s: ok" % args.case)


if __name__ == "__main__":
    sys.exit(main())
