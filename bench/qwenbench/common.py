"""What every part of the harness shares: the repository root, logging,
run-folder reading, git."""
import lzma
import os
import subprocess
import sys


# bench/qwenbench/common.py -> the repository root.
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def open_result(path):
    """A run folder's file as text, or its xz-compressed copy (PATH.xz):
    run folders may keep their reports and step records compressed, to
    leave room in what a device call carries back."""
    if path.endswith(".xz"):
        return lzma.open(path, "rt")
    if not os.path.exists(path) and os.path.exists(path + ".xz"):
        return lzma.open(path + ".xz", "rt")
    return open(path)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def git(*args):
    return subprocess.run(["git", "-C", REPO, *args], capture_output=True,
                          text=True).stdout

