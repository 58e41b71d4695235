#===- e2echeck.py - what the e2e scripts share ------------------------------===#
#
# A check records its failure and goes on, so that one run of a script
# reports every failed check; the script exits nonzero at the end when any
# failed (exit_status). Imported by the scripts beside it (their folder is
# on sys.path when they run).
#
#===------------------------------------------------------------------------===#
import argparse
import subprocess

failures = []


def prebuilt_cli(description, default_seq):
    """The command line of the GPU checks that build binaries here and run
    them on the GPU machine (gpu-check.sh): `build --compile --model --dir
    [--seq]` and `run --dir --work [--mpirun --device --comm --steps]`."""
    ap = argparse.ArgumentParser(description=description)
    sub = ap.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("build")
    b.add_argument("--compile", required=True)
    b.add_argument("--model", required=True)
    b.add_argument("--dir", required=True)
    b.add_argument("--seq", type=int, default=default_seq)
    r = sub.add_parser("run")
    r.add_argument("--dir", required=True)
    r.add_argument("--work", required=True)
    r.add_argument("--mpirun", default="mpirun")
    r.add_argument("--device", default="cuda", choices=("cuda", "host"))
    r.add_argument("--comm", default="auto", choices=("auto", "mpi-staged"))
    r.add_argument("--steps", type=int, default=3)
    return ap.parse_args()


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL: " + msg, flush=True)
    return cond


def placement_steps_agree(rank, off, on, offloads=True):
    """One rank's metrics lines without (`off`) and with (`on`) a placement:
    the same fingerprints every step, the pinned pool empty, no copies
    without placement and, with it, each scope copied both ways (at least
    one scope when `offloads`)."""
    for a, b in zip(off, on):
        check(a["fingerprints"] == b["fingerprints"],
              "rank %d step %d: the placement changed the bits:\n  %s\n"
              "  %s" % (rank, a["step"], a["fingerprints"], b["fingerprints"]))
        check(b["pinned_pool"]["in_use"] == 0,
              "rank %d step %d: pinned pool in use" % (rank, b["step"]))
        for scope, c in a["transfers"].items():
            check(c["d2h_count"] == 0 and c["h2d_count"] == 0,
                  "rank %d step %d: %s copied without placement" %
                  (rank, a["step"], scope))
        if offloads:
            check(b["transfers"], "rank %d step %d: nothing offloaded" %
                  (rank, b["step"]))
        for scope, c in b["transfers"].items():
            check(c["d2h_count"] > 0 and c["d2h_count"] == c["h2d_count"] and
                  c["d2h_bytes"] > 0 and c["h2d_bytes"] > 0,
                  "rank %d step %d: scope %s counters %s" %
                  (rank, b["step"], scope, c))


def exit_status(ok_message):
    """1 after printing the count of failures, else 0 after ok_message."""
    if failures:
        print(f"{len(failures)} failure(s)", flush=True)
        return 1
    print(ok_message, flush=True)
    return 0


def run_logged(cmd, cwd, timeout=120, shown=None):
    """Runs `cmd` in `cwd`, printing it (as `shown`, if given), its exit
    status and, when it fails, its stderr; a timeout is a failed check and
    exit status 124."""
    print("$ " + (shown or " ".join(cmd)), flush=True)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        check(False, "timed out after %d s: %s" % (timeout, cmd))
        return subprocess.CompletedProcess(cmd, 124, "", "timeout")
    print("  -> %d" % r.returncode, flush=True)
    if r.returncode != 0 and r.stderr.strip():
        print("  " + r.stderr.strip().replace("\n", "\n  "), flush=True)
    return r
