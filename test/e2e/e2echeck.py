#===- e2echeck.py - what the e2e scripts share ------------------------------===#
#
# A check records its failure and goes on, so that one run of a script
# reports every failed check; the script exits nonzero at the end when any
# failed (exit_status). Imported by the scripts beside it (their folder is
# on sys.path when they run).
#
#===------------------------------------------------------------------------===#
import argparse
import os
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
    b.add_argument("--micro-batches", type=int, default=None,
                   help="microbatches per rank (each script's default "
                        "otherwise)")
    r = sub.add_parser("run")
    r.add_argument("--dir", required=True)
    r.add_argument("--work", required=True)
    r.add_argument("--mpirun", default="mpirun")
    r.add_argument("--device", default="cuda", choices=("cuda", "host"))
    r.add_argument("--comm", default="auto", choices=("auto", "mpi-staged"))
    r.add_argument("--steps", type=int, default=3)
    r.add_argument("--timeout", type=int, default=600,
                   help="seconds per run before its ranks are killed")
    r.add_argument("--arms", default="",
                   help="comma-separated arms to run (default: all built)")
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


def run_group(cmd, timeout, log=None):
    """Runs `cmd` (an mpirun line or a binary) in a session of its own, its
    output to the file `log` (else inherited); on timeout kills the whole
    session, ranks included (mpirun killed alone leaves them holding the
    GPU), and returns 124; else the exit status."""
    import signal
    out = open(log, "w") if log else None
    try:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if out
                             else None, start_new_session=True)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            print("timed out after %d s: %s" % (timeout, " ".join(cmd)),
                  flush=True)
            return 124
    finally:
        if out:
            out.close()


class GpuProcessMemory:
    """Samples each process's device memory with nvidia-smi while a
    multi-rank run shares one GPU (cudaMemGetInfo, behind the binaries'
    device_peak_bytes, sees every process on the GPU, so a rank's own peak
    comes from here). A process is named by its MPI or torchrun rank, read
    from /proc/PID/environ; pids the driver reports from outside this pid
    namespace stay unnamed (a pid is named only when its command line holds
    `binary`). Use as a context manager; `peaks` then maps rank -> largest
    sampled MiB (the process's CUDA context included), `unnamed` pid ->
    MiB."""

    def __init__(self, binary, period_s=0.2):
        self.binary = os.path.abspath(binary).encode()
        import shutil
        import threading
        self.period_s = period_s
        self.peaks = {}
        self.unnamed = {}
        self.available = shutil.which("nvidia-smi") is not None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _rank(self, pid):
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if self.binary not in f.read():
                    return None
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0")
                           if b"=" in kv)
        except OSError:
            return None
        for key in (b"OMPI_COMM_WORLD_RANK", b"PMI_RANK", b"RANK"):
            if key in env:
                return int(env[key])
        return 0

    def _run(self):
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-compute-apps=pid,used_memory",
                     "--format=csv,noheader,nounits"], capture_output=True,
                    text=True, timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                out = ""
            for line in out.splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) != 2 or not parts[0].isdigit() or \
                        not parts[1].isdigit():
                    continue
                pid, mib = int(parts[0]), int(parts[1])
                rank = self._rank(pid)
                into = self.peaks if rank is not None else self.unnamed
                key = rank if rank is not None else pid
                into[key] = max(into.get(key, 0), mib)
            self._stop.wait(self.period_s)

    def __enter__(self):
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.available:
            self._stop.set()
            self._thread.join()
        return False

    def describe(self):
        if not self.available:
            return "no nvidia-smi"
        text = "per-process MiB by rank %s" % dict(sorted(self.peaks.items()))
        if self.unnamed:
            text += ", unnamed pids %s" % self.unnamed
        return text

    def largest(self):
        """The largest sampled process, named or not (MiB; 0 if none)."""
        return max(list(self.peaks.values()) + list(self.unnamed.values()),
                   default=0)
