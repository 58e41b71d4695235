"""Device profiles: one current file per device in bench/profiles/
(NAME.json), each carrying its own provenance (what produced it: the
command, the commit, the date, the binaries measured), which the compiler
accepts and ignores."""
import json
import os
import shlex
import sys
import time

from .common import REPO, git

PROFILES_DIR = os.path.join(REPO, "bench", "profiles")
# What a profile's provenance must say (the compiler requires strings).
PROVENANCE_KEYS = ("command", "commit", "date", "binary")


def path(device, profiles_dir=None):
    """The current profile of `device` (e.g. "h200")."""
    return os.path.join(profiles_dir or PROFILES_DIR, device + ".json")


def provenance(run_manifest=None, run_dir="", argv=None, **more):
    """The provenance of a profile written now by this process: the command
    line, the tree's commit, the date, and (from the run folder's manifest)
    the commit and device of the binaries it was fitted to."""
    argv = sys.argv if argv is None else argv
    commit = git("rev-parse", "HEAD").strip() or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no").strip()
    out = {
        "command": "bench/qwen_train_bench.py " + shlex.join(argv[1:]),
        "commit": commit + (" + uncommitted changes" if dirty else ""),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "binary": "none (written without a run)",
    }
    if run_manifest is not None:
        run = run_manifest.get("run", {})
        out["binary"] = (
            "actplace-compile of " + run_manifest.get("commit", "?")[:10] +
            (" + uncommitted changes" if run_manifest.get("dirty_files")
             else "") + ", " + run_manifest.get("model", "?") + " seq " +
            str(run_manifest.get("seq", "?")) + ", run folder " +
            os.path.basename(os.path.normpath(run_dir)) + " (" +
            str(run.get("started", run_manifest.get("built", "?"))) + ")")
        if run.get("gpu_before"):
            out["device"] = run["gpu_before"]
    out.update({k: str(v) for k, v in more.items()})
    return out


def check_provenance(profile, source):
    """A profile's provenance must exist and say PROVENANCE_KEYS, as
    strings."""
    prov = profile.get("provenance")
    if not isinstance(prov, dict):
        raise ValueError(f"{source}: no 'provenance' object (the command, "
                         "commit, date and binary that produced it)")
    for key in PROVENANCE_KEYS:
        if not isinstance(prov.get(key), str) or not prov[key]:
            raise ValueError(f"{source}: provenance has no '{key}'")
    bad = [k for k, v in prov.items() if not isinstance(v, str)]
    if bad:
        raise ValueError(f"{source}: provenance['{bad[0]}'] must be a string")


def write(out, profile, prov):
    """`profile` (a dict of the compiler's fields) with `prov` as its
    provenance, to the file `out`; the provenance first, so that it is the
    first thing a reader sees."""
    body = dict(profile)
    body.pop("provenance", None)
    data = {"provenance": prov, **body}
    check_provenance(data, out)
    with open(out, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
