#!/usr/bin/env python3
#===- install_tree.py - the install tree is relocatable ---------------------===#
#
# `cmake --install BUILD --prefix WORK/stage`, then the tree is moved to
# WORK/moved, so no path fixed at install time can work. With the moved
# actplace-compile:
#   - --version names the release and the compiler-runtime ABI version;
#   - a step build that is made to fail (an unknown compiler flag) prints its
#     command: the headers and archives in it are the moved tree's, none of
#     the build tree's or the source folder's;
#   - models/tiny-hybrid.json (--seq 64, 2 microbatches) compiles into a
#     binary that answers --version and trains 2 steps on the host backend;
#     each metrics line records backend "host" and device "CPU".
# With --no-gpu (a build without CUDA, where no GPU can be used), the same
# binary also shows the device choice: --device cuda exits non-zero naming
# why, --device auto falls back to host and says so.
#
#===------------------------------------------------------------------------===#
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys

from e2echeck import check, exit_status


def run(cmd, **kw):
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="the build folder")
    ap.add_argument("--source", required=True, help="the source folder")
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--version", required=True, help="expected release")
    ap.add_argument("--abi-header", required=True,
                    help="runtime/abi.h, whose AP_ABI_VERSION is expected")
    ap.add_argument("--no-gpu", action="store_true",
                    help="the build has no CUDA: check the device choice")
    a = ap.parse_args()
    with open(a.abi_header) as f:
        m = re.search(r"^#define AP_ABI_VERSION (\d+)", f.read(), re.M)
    if not check(m is not None, f"no AP_ABI_VERSION in {a.abi_header}"):
        return exit_status("")
    abi = m.group(1)

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    stage = os.path.join(a.work, "stage")
    moved = os.path.join(a.work, "moved")
    r = run(["cmake", "--install", a.build, "--prefix", stage])
    if not check(r.returncode == 0, f"cmake --install failed:\n{r.stdout}{r.stderr}"):
        return exit_status("")
    os.rename(stage, moved)
    for rel in ["bin/actplace-compile", "bin/actplace-opt", "bin/actplace-import",
                "bin/actplace-translate", "lib/libactplace_runtime.a",
                "lib/libactplace_kernels_reference.a",
                "include/actplace/runtime/abi.h", "include/actplace/kernels/kernels.h"]:
        check(os.path.exists(os.path.join(moved, rel)), f"install tree lacks {rel}")
    compile_tool = os.path.join(moved, "bin", "actplace-compile")

    version_text = (f"(actplace) {a.version}\ncompiler-runtime ABI {abi}\n")
    r = run([compile_tool, "--version"])
    check(r.returncode == 0 and r.stdout.startswith("actplace-compile " + version_text),
          f"moved actplace-compile --version: rc {r.returncode}, output {r.stdout!r}")

    base = [compile_tool, a.model, "--seq", "64", "--micro-batches", "2"]
    # A failing link prints its command: which archives. The readable C++
    # (--emit=cpp) prints how to build it: which headers and archives.
    r = run(base + ["-o", os.path.join(a.work, "probe"),
                    "--link-flags=-l:actplace-install-probe-no-such-archive.a"],
            cwd=a.work)
    out = r.stdout + r.stderr
    check(r.returncode != 0, "the probe link with a missing archive succeeded")
    command = out[out.find("command:"):] if "command:" in out else ""
    check(command != "", f"no link command printed:\n{out}")
    command = command.splitlines()[1] if command.count("\n") >= 1 else command
    r = run(base + ["-o", os.path.join(a.work, "probe.cpp"), "--emit=cpp"],
            cwd=a.work)
    build = [l for l in r.stdout.splitlines() if l.startswith("build it with: ")]
    check(r.returncode == 0 and len(build) == 1,
          f"--emit=cpp printed no build command:\n{r.stdout}{r.stderr}")
    build = build[0] if build else ""
    check(f"-I'{moved}/include/actplace'" in build,
          f"the C++ build does not take headers from the moved tree: {build}")
    for text in (command, build):
        check(f"'{moved}/lib/libactplace_runtime.a'" in text,
              f"the step does not link the moved tree's runtime: {text}")
        # The work folder may lie inside the build folder: leave its paths out.
        rest = text.replace(os.path.realpath(a.work), "<work>").replace(a.work, "<work>")
        for other in (os.path.realpath(a.build), os.path.realpath(a.source)):
            check(re.search(re.escape(other) + r"(/|'|\s|$)", rest) is None,
                  f"the step still uses {other}: {text}")

    binary = os.path.join(a.work, "train-tiny")
    r = run(base + ["-o", binary], cwd=a.work)
    if not check(r.returncode == 0 and os.path.exists(binary),
                 f"moved actplace-compile failed:\n{r.stdout}{r.stderr}"):
        return exit_status("")

    r = run([binary, "--version"])
    check(r.returncode == 0 and r.stdout == "train-tiny " + version_text,
          f"train-tiny --version: rc {r.returncode}, output {r.stdout!r}")

    metrics = os.path.join(a.work, "metrics.jsonl")
    r = run([binary, "--steps", "2", "--device", "host", "--metrics", metrics],
            cwd=a.work)
    check(r.returncode == 0, f"training failed:\n{r.stdout}{r.stderr}")
    lines = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            lines = [json.loads(line) for line in f if line.strip()]
    check(len(lines) == 2, f"expected 2 metrics lines, got {len(lines)}")
    for line in lines:
        check(line.get("backend") == "host" and line.get("device") == "CPU",
              f"metrics line without backend host / device CPU: {line}")
        check(isinstance(line.get("loss"), float) and math.isfinite(line["loss"]),
              f"loss not finite: {line}")

    if a.no_gpu:
        r = run([binary, "--steps", "1", "--device", "cuda"], cwd=a.work)
        check(r.returncode != 0, "--device cuda without a GPU exited 0")
        check("--device cuda: no usable GPU (this binary was built without CUDA)"
              in r.stderr,
              f"--device cuda without a GPU does not say why: {r.stderr!r}")
        r = run([binary, "--steps", "1", "--metrics", "-"], cwd=a.work)
        check(r.returncode == 0, f"--device auto failed:\n{r.stdout}{r.stderr}")
        check("--device auto: no usable GPU" in r.stderr
              and "falling back to the host backend" in r.stderr,
              f"--device auto does not say it fell back: {r.stderr!r}")
        check('"backend":"host","device":"CPU"' in r.stdout,
              f"--device auto metrics line lacks backend/device: {r.stdout!r}")

    return exit_status("install tree: moved, compiled and trained")


if __name__ == "__main__":
    sys.exit(main())
