"""`build`: every arm compiled with actplace-compile into a carry folder."""
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time

from . import arms as armtable
from . import modules as modlist
from .common import REPO, git, log
from .flops import forward_flops_per_token
from .reports import chosen_flags, goal_options


def cmd_build(a):
    build = os.path.join(REPO, a.build_dir)
    compiler = os.path.join(build, "bin", "actplace-compile")
    if not a.no_rebuild:
        # actplace-compile links the runtime and kernel archives as they are
        # in the build: bring both up to date with the tree first.
        # calibrate and predict use actplace-import and actplace-opt.
        log("cmake --build", a.build_dir,
            "--target actplace-compile actplace-import actplace-opt")
        subprocess.run(["cmake", "--build", build, "-j2", "--target",
                        "actplace-compile", "actplace-import", "actplace-opt"],
                       check=True)
    table = armtable.load()
    arms = a.arms.split(",") if a.arms else table.default
    # Module names as the compiler lists them: an arm naming one it does not
    # know stops the build before anything is compiled.
    try:
        modules = modlist.from_build(os.path.join(build, "bin"))
        arm_flags = {arm: armtable.flags(table.get(arm), modules)
                     for arm in arms}
        arm_shape = {arm: armtable.shape_of(table.get(arm),
                                            a.micro_batch_size,
                                            a.micro_batches, a.seq)
                     for arm in arms}
    except (KeyError, ValueError, OSError, RuntimeError) as e:
        sys.exit(f"build: {e.args[0] if e.args else e}")
    carry = os.path.abspath(a.carry)
    os.makedirs(carry, exist_ok=True)
    model = os.path.abspath(a.model)
    cfg = json.load(open(model))
    name = os.path.splitext(os.path.basename(model))[0]
    tokens = a.micro_batch_size * a.seq * a.micro_batches
    fwd = forward_flops_per_token(cfg, a.seq)
    dirty = [l.split(None, 1)[1] for l in git(
        "status", "--porcelain", "--untracked-files=no").splitlines()
        if l.strip()]
    manifest = {
        "commit": git("rev-parse", "HEAD").strip(),
        "dirty_files": dirty,
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_dir": a.build_dir,
        "model": os.path.relpath(model, REPO),
        "seq": a.seq, "micro_batch_size": a.micro_batch_size,
        "micro_batches": a.micro_batches, "dtype": a.dtype,
        "tokens_per_step": tokens,
        "forward_flops_per_token": fwd,
        "train_flops_per_step": 3 * fwd * tokens,
        "arms": {},
    }
    if dirty:
        log("warning: the tree has uncommitted changes, the binaries include "
            "them:", " ".join(dirty))
    with tempfile.TemporaryDirectory() as tmp:
        for arm in arms:
            flags, what = arm_flags[arm], table.get(arm).what
            base = os.path.join(carry, arm)
            binary = os.path.join(tmp, arm)
            mbs, mb = arm_shape[arm]
            cmd = [compiler, model, "--seq", str(a.seq),
                   "--micro-batch-size", str(mbs),
                   "--micro-batches", str(mb), "--dtype", a.dtype,
                   *flags, "--report-json", base + ".report.json",
                   "--memory-timeline", base + ".svg",
                   "--memory-timeline-title",
                   f"{name} seq {a.seq}, {mb} x {mbs}"
                   f" sequences, {a.dtype}: arm '{arm}'",
                   "-o", binary]
            log(f"[{arm}]", " ".join(cmd[1:]))
            t0 = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True)
            seconds = time.time() - t0
            open(base + ".compile.txt", "w").write(
                "$ " + " ".join(cmd) + "\n" + p.stdout + p.stderr)
            if p.returncode != 0:
                sys.stderr.write(p.stdout + p.stderr)
                sys.exit(f"[{arm}] actplace-compile failed (exit {p.returncode})")
            sys.stderr.write(p.stdout)
            subprocess.run(["strip", binary], check=True)
            with open(binary, "rb") as f, lzma.open(base + ".xz", "wb",
                                                    preset=6) as out:
                shutil.copyfileobj(f, out)
            planned = None
            for line in p.stdout.splitlines():
                if line.startswith("planned peak: arena "):
                    planned = int(line.split()[3])
            manifest["arms"][arm] = {
                "flags": flags, "what": what, "binary": arm + ".xz",
                "report": arm + ".report.json", "svg": arm + ".svg",
                "compile_seconds": round(seconds, 1),
                "planned_arena_bytes": planned,
                "micro_batch_size": mbs, "micro_batches": mb,
            }
            if goal_options(flags):
                manifest["arms"][arm]["chosen"] = chosen_flags(p.stdout)
    json.dump(manifest, open(os.path.join(carry, "manifest.json"), "w"),
              indent=1)
    size = sum(os.path.getsize(os.path.join(carry, f))
               for f in os.listdir(carry))
    log(f"wrote {carry} ({size / 2**20:.1f} MiB, {len(arms)} arms, commit "
        f"{manifest['commit'][:10]}{' + uncommitted changes' if dirty else ''})")

