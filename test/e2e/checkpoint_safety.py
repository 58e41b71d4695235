#!/usr/bin/env python3
#===- checkpoint_safety.py - a checkpoint is never poisoned or overwritten ===#
#
# Compiles one tiny binary (models/tiny-hybrid.json, host backend) and runs
# every case of issue 25's "Data" section against it:
#   - a step that is not finite (huge --lr) stops training with exit 3 and
#     an error naming the step; "latest" stays on the last good checkpoint,
#     whose tensors are all finite, and the bad step has no folder;
#   - a fresh run into a folder holding checkpoints is refused, naming the
#     folder and its latest step; --overwrite replaces them;
#   - a second process saving into a folder another one holds is refused,
#     naming the folder and the holder's pid; the lock goes with the
#     holder's death;
#   - N steps on a text file equal k steps + --save + --resume to N,
#     bitwise (loss and fingerprints), and the checkpoint records its data
#     cursor and run configuration;
#   - a resume with another --lr, another data file, or from a checkpoint
#     of another sequence length is refused naming the field; another
#     --seed is refused, the same one accepted;
#   - a checkpoint of another placement resumes, saying so;
#   - a checkpoint whose run configuration was edited is refused; one
#     without it (older actplace) resumes with a warning;
#   - an unwritable --save folder is refused before step 1;
#   - --resume with --steps at the checkpoint's step says so and exits 0,
#     below it exits 2 naming both numbers;
#   - --resume of an empty or missing folder says "no checkpoint in DIR".
# The other checkpoint behaviour (3 + resume + 3 across placements) is in
# placements_bitident.py.
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
import time

from e2echeck import check, exit_status


def read_st(path):
    """(header dict, data bytes) of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def write_st(path, header, data):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(data)


def run_config_hash(config):
    # runConfigHash: SHA-256 of "name=value\n" in name order.
    h = hashlib.sha256()
    for k in sorted(config):
        h.update((k + "=" + config[k] + "\n").encode())
    return h.hexdigest()


def latest(ckpt):
    with open(os.path.join(ckpt, "latest")) as f:
        return f.read().strip()


def all_finite(path):
    header, data = read_st(path)
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = data[b:e]
        if t["dtype"] == "F32":
            for (v,) in struct.iter_unpack("<f", raw):
                if v != v or v in (float("inf"), float("-inf")):
                    return False, name
        elif t["dtype"] == "BF16":
            for (v,) in struct.iter_unpack("<H", raw):
                if v & 0x7f80 == 0x7f80:
                    return False, name
    return True, ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    work = args.work
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    w = lambda *p: os.path.join(work, *p)

    binary = w("train")
    t0 = time.time()
    r = subprocess.run([args.compile, args.model, "-o", binary, "--seq", "16",
                        "--micro-batches", "2"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        print("FAIL: actplace-compile failed")
        return 1
    print("compile: %.1f s" % (time.time() - t0), flush=True)

    def train(*flags, metrics=None):
        cmd = [binary, "--device", "host"] + list(flags)
        if metrics:
            if os.path.exists(metrics):
                os.remove(metrics)  # --metrics appends
            cmd += ["--fingerprints", "--metrics", metrics]
        r = subprocess.run(cmd, capture_output=True, text=True)
        print("$ %s -> %d" % (" ".join(cmd[1:]), r.returncode), flush=True)
        if r.stderr.strip():
            print("  " + r.stderr.strip().replace("\n", "\n  "), flush=True)
        return r

    def lines(metrics):
        if not os.path.exists(metrics):
            return []
        with open(metrics) as f:
            return [json.loads(l) for l in f if l.strip()]

    # Byte-level text (the model's vocabulary is 256): the repository's
    # docs, and another text for "another data file".
    src = os.path.dirname(os.path.dirname(os.path.abspath(args.model)))
    text = w("text.txt")
    with open(text, "w") as out:
        for name in sorted(os.listdir(os.path.join(src, "docs"))):
            if name.endswith(".md"):
                with open(os.path.join(src, "docs", name)) as f:
                    out.write(f.read())
    other_text = w("other.txt")
    with open(text) as f, open(other_text, "w") as out:
        out.write(f.read()[::-1])

    # --- A step that is not finite is never saved. -----------------------
    # --lr 1e300: step 1's loss and grad norm are finite, its update is not
    # (the lr is inf as a float): nothing may be saved. The updated state
    # is checked before a save and after the last step: with one step, the
    # master weights are named; with two (no save after step 1), step 2's
    # loss stops the run.
    ck = w("ck-nan-update-2")
    r = train("--steps", "2", "--lr", "1e300", "--save", ck)
    check(r.returncode == 3 and "step 2 is not finite: the loss is" in
          r.stderr and not os.path.exists(os.path.join(ck, "latest")),
          "--lr 1e300, 2 steps: exit %d: %s" % (r.returncode, r.stderr))
    ck = w("ck-nan-update")
    r = train("--steps", "1", "--lr", "1e300", "--save", ck)
    check(r.returncode == 3, "--lr 1e300: exit %d, expected 3" % r.returncode)
    check("step 1 is not finite: the master weights are not finite" in
          r.stderr and "no checkpoint was saved" in r.stderr,
          "--lr 1e300: the error does not name step 1's master weights: " +
          r.stderr)
    check(not os.path.exists(os.path.join(ck, "latest")) and
          not os.path.exists(os.path.join(ck, "step-00000001")),
          "--lr 1e300: the poisoned step 1 was saved")
    # --lr 1e6: step 1 is good and saved, step 2's loss is not finite.
    ck = w("ck-nan-loss")
    r = train("--steps", "4", "--lr", "1e6", "--save", ck, "--save-every",
              "1")
    check(r.returncode == 3 and "step 2 is not finite" in r.stderr and
          "still names step 1" in r.stderr,
          "--lr 1e6: exit %d: %s" % (r.returncode, r.stderr))
    if check(os.path.exists(os.path.join(ck, "latest")),
             "--lr 1e6: no checkpoint of the good step 1"):
        check(latest(ck) == "step-00000001" and
              not os.path.exists(os.path.join(ck, "step-00000002")),
              "--lr 1e6: 'latest' is %s, expected step-00000001" % latest(ck))
        ok, name = all_finite(os.path.join(ck, latest(ck),
                                           "model.safetensors"))
        check(ok, "--lr 1e6: 'latest' holds a non-finite tensor " + name)

    # --- A fresh run into a folder with checkpoints. ---------------------
    ck = w("ck-fresh")
    check(train("--steps", "2", "--save", ck).returncode == 0,
          "fresh: first run failed")
    r = train("--steps", "1", "--save", ck)
    check(r.returncode != 0, "fresh: a second fresh run into %s was not "
          "refused" % ck)
    check(ck in r.stderr and "latest: step 2" in r.stderr and
          "--overwrite" in r.stderr,
          "fresh: the refusal does not name the folder, its latest step "
          "and --overwrite: " + r.stderr)
    check(latest(ck) == "step-00000002", "fresh: 'latest' moved on refusal")
    r = train("--steps", "1", "--save", ck, "--overwrite")
    check(r.returncode == 0, "fresh: --overwrite failed: " + r.stderr)
    check(latest(ck) == "step-00000001" and
          not os.path.exists(os.path.join(ck, "step-00000002")),
          "fresh: --overwrite did not replace the old checkpoints")

    # --- Two processes saving into one folder. ---------------------------
    ck = w("ck-lock")
    holder = subprocess.Popen([binary, "--device", "host", "--steps",
                               "1000000", "--save", ck],
                              stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        lock = os.path.join(ck, "lock")
        deadline = time.time() + 30
        while time.time() < deadline:
            if os.path.exists(lock):
                with open(lock) as f:
                    if "pid %d" % holder.pid in f.read():
                        break
            time.sleep(0.05)
        r = train("--steps", "1", "--save", ck)
        check(r.returncode != 0, "lock: a second process saving into %s was "
              "not refused" % ck)
        check(ck in r.stderr and ("pid %d" % holder.pid) in r.stderr,
              "lock: the refusal does not name the folder and the holder "
              "(pid %d): %s" % (holder.pid, r.stderr))
    finally:
        holder.terminate()
        holder.wait()
    r = train("--steps", "1", "--save", ck)
    check(r.returncode == 0, "lock: the lock outlived its holder: " + r.stderr)

    # --- Resume restores the data position. ------------------------------
    ck = w("ck-data")
    full = lines(w("full.jsonl")) if train(
        "--steps", "4", "--data", "text:" + text,
        metrics=w("full.jsonl")).returncode == 0 else []
    a = train("--steps", "2", "--data", "text:" + text, "--save", ck,
              metrics=w("first.jsonl"))
    b = train("--steps", "4", "--data", "text:" + text, "--resume", ck,
              "--save", ck, metrics=w("second.jsonl"))
    both = lines(w("first.jsonl")) + lines(w("second.jsonl"))
    check(a.returncode == 0 and b.returncode == 0,
          "data: 2 + resume to 4 failed")
    check([m["step"] for m in both] == [1, 2, 3, 4],
          "data: resumed steps %s" % [m["step"] for m in both])
    check(len(full) == 4 and
          [(m["loss"], m["fingerprints"]) for m in full] ==
          [(m["loss"], m["fingerprints"]) for m in both],
          "data: 4 steps on text differ from 2 + resume to 4")
    header, _ = read_st(os.path.join(ck, "step-00000002", "model.safetensors"))
    meta = header["__metadata__"]
    check(meta.get("actplace.data_cursor", "").startswith(
        "step=2;microbatch=0;"), "data: cursor %r" %
        meta.get("actplace.data_cursor"))
    config = json.loads(meta.get("actplace.run_config", "{}"))
    check(config.get("data", "").startswith("text, ") and
          "sha256" in config.get("data", "") and
          meta.get("actplace.run_config_sha256") == run_config_hash(config),
          "data: run configuration %r" % meta.get("actplace.run_config"))

    # --- What would change the training is refused, naming it. -----------
    r = train("--steps", "5", "--data", "text:" + text, "--resume", ck,
              "--lr", "0.001")
    check(r.returncode != 0 and "lr: checkpoint" in r.stderr,
          "config: another --lr was not refused naming lr: " + r.stderr)
    r = train("--steps", "5", "--data", "text:" + other_text, "--resume", ck)
    check(r.returncode != 0 and "data: checkpoint" in r.stderr,
          "config: another data file was not refused naming data: " +
          r.stderr)
    r = train("--steps", "5", "--data", "text:" + text, "--resume", ck,
              "--seed", "5")
    check(r.returncode == 2 and "--seed 5" in r.stderr and "0" in r.stderr,
          "config: another --seed was not refused: " + r.stderr)
    r = train("--steps", "5", "--data", "text:" + text, "--resume", ck,
              "--seed", "0")
    check(r.returncode == 0, "config: the checkpoint's own --seed was "
          "refused: " + r.stderr)

    # Checkpoints forged from step 2 (header edits; the data checksum
    # stays valid): another sequence length, another placement, an edited
    # record, no record.
    shard = os.path.join(ck, "step-00000002", "model.safetensors")
    header, data = read_st(shard)

    def forged(name, edit):
        d = w("ck-" + name, "step-00000002")
        os.makedirs(d)
        h = json.loads(json.dumps(header))
        edit(h["__metadata__"])
        write_st(os.path.join(d, "model.safetensors"), h, data)
        return d

    def other_seq(m):
        c = json.loads(m["actplace.run_config"])
        c["seq"] = "8"
        c["global_batch_tokens"] = str(int(c["global_batch_tokens"]) // 2)
        m["actplace.run_config"] = json.dumps(c)
        m["actplace.run_config_sha256"] = run_config_hash(c)
    r = train("--steps", "3", "--data", "text:" + text, "--resume",
              forged("seq", other_seq))
    check(r.returncode != 0 and "seq: checkpoint '8', this run '16'" in
          r.stderr and "global_batch_tokens" in r.stderr,
          "config: another sequence length was not refused naming seq: " +
          r.stderr)

    def other_placement(m):
        p = json.loads(m["actplace.placement"])
        p["micro_batches"] = "1"
        p["micro_batch_size"] = "2"
        m["actplace.placement"] = json.dumps(p)
    r = train("--steps", "3", "--data", "text:" + text, "--resume",
              forged("placement", other_placement))
    check(r.returncode == 0 and "resumed under a different placement" in
          r.stderr and "micro_batches: checkpoint '1', this run '2'" in
          r.stderr, "placement: another placement was not resumed and "
          "reported: " + r.stderr)

    def edited(m):
        c = json.loads(m["actplace.run_config"])
        c["lr"] = "0.5"
        m["actplace.run_config"] = json.dumps(c)
    r = train("--steps", "3", "--data", "text:" + text, "--resume",
              forged("edited", edited))
    check(r.returncode != 0 and "does not match its SHA-256" in r.stderr,
          "config: an edited run configuration was trusted: " + r.stderr)

    def older(m):
        for k in ("actplace.run_config", "actplace.run_config_sha256",
                  "actplace.placement"):
            del m[k]
    r = train("--steps", "3", "--data", "text:" + text, "--resume",
              forged("older", older), metrics=w("older.jsonl"))
    older_lines = lines(w("older.jsonl"))
    check(r.returncode == 0 and "no run configuration" in r.stderr and
          len(older_lines) == 1 and len(both) == 4 and
          older_lines[0]["fingerprints"] == both[2]["fingerprints"],
          "older: a checkpoint without a run configuration did not resume "
          "with a warning to the same step 3: " + r.stderr)

    # A resumed run (of an older checkpoint: its lr is not checked) whose
    # step 3 has a finite loss and a non-finite update keeps 'latest' on
    # step 2.
    ck_old = w("ck-older")
    with open(os.path.join(ck_old, "latest"), "w") as f:
        f.write("step-00000002\n")
    r = train("--steps", "4", "--data", "text:" + text, "--resume", ck_old,
              "--save", ck_old, "--save-every", "1", "--lr", "1e300")
    check(r.returncode == 3 and
          "step 3 is not finite: the master weights" in r.stderr and
          latest(ck_old) == "step-00000002" and
          not os.path.exists(os.path.join(ck_old, "step-00000003")),
          "older + --lr 1e300: exit %d, latest %s: %s" %
          (r.returncode, latest(ck_old), r.stderr))

    # --- A model setting that shapes no parameter (rms_norm_eps) --------
    # reaches the checkpoint through the compiler: a binary of the same
    # model with another eps refuses the checkpoint naming the field.
    with open(args.model) as f:
        cfg = json.load(f)
    cfg["rms_norm_eps"] = 2.5e-5
    other_model = w("other-eps.json")
    with open(other_model, "w") as f:
        json.dump(cfg, f)
    other_binary = w("train-other-eps")
    r = subprocess.run([args.compile, other_model, "-o", other_binary,
                        "--seq", "16", "--micro-batches", "2"],
                       capture_output=True, text=True)
    check(r.returncode == 0, "eps: the second compile failed: " + r.stderr)
    if r.returncode == 0:
        r = subprocess.run([other_binary, "--device", "host", "--steps", "5",
                            "--data", "text:" + text, "--resume", ck],
                           capture_output=True, text=True)
        check(r.returncode != 0 and
              "model.rms_norm_eps: checkpoint '1e-06', this run '2.5e-05'"
              in r.stderr,
              "eps: another rms_norm_eps was not refused naming it: " +
              r.stderr)

    # --- --steps at or below the checkpoint's step. ----------------------
    r = train("--steps", "4", "--data", "text:" + text, "--resume", ck)
    check(r.returncode == 0 and "--steps 4" in r.stderr and
          "nothing to train" in r.stderr,
          "steps: --steps at the checkpoint's step was silent: " + r.stderr)
    r = train("--steps", "3", "--data", "text:" + text, "--resume", ck)
    check(r.returncode == 2 and "--steps 3" in r.stderr and ", 4:" in r.stderr,
          "steps: --steps below the checkpoint's step: " + r.stderr)

    # --- An unwritable --save folder is found before step 1. -------------
    blocker = w("a-file")
    with open(blocker, "w") as f:
        f.write("not a folder\n")
    r = train("--steps", "2", "--save", os.path.join(blocker, "ckpt"),
              metrics=w("unwritable.jsonl"))
    check(r.returncode != 0 and os.path.join(blocker, "ckpt") in r.stderr and
          lines(w("unwritable.jsonl")) == [],
          "unwritable: --save under a file was not refused before step 1: " +
          r.stderr)
    if os.geteuid() != 0:  # root writes into read-only folders
        ro = w("read-only")
        os.makedirs(ro)
        os.chmod(ro, 0o555)
        r = train("--steps", "2", "--save", ro, metrics=w("ro.jsonl"))
        os.chmod(ro, 0o755)
        check(r.returncode != 0 and "cannot write into" in r.stderr and
              lines(w("ro.jsonl")) == [],
              "unwritable: a read-only --save folder was not refused before "
              "step 1: " + r.stderr)

    # --- --resume of an empty or missing folder. -------------------------
    empty = w("empty")
    os.makedirs(empty)
    for d in (empty, w("missing")):
        r = train("--steps", "2", "--resume", d)
        check(r.returncode != 0 and ("no checkpoint in '%s'" % d) in r.stderr
              and "model.safetensors'" not in r.stderr,
              "empty: --resume %s: %s" % (d, r.stderr))

    print("total: %.1f s" % (time.time() - t0))
    return exit_status("checkpoint safety: all cases passed")


if __name__ == "__main__":
    sys.exit(main())
