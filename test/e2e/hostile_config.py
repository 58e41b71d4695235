#!/usr/bin/env python3
#===- hostile_config.py - a model config can never run code ----------------===#
#
# The model's name (name_or_path) reaches the generated step (the program
# table's model name, which the binary writes into its checkpoints and checks
# on resume): a string constant of the LLVM-dialect step that binaries are
# built from, and a literal of the readable C++ (--emit=cpp). Two copies of
# models/tiny-hybrid.json with hostile names are compiled with
# actplace-compile (through LLVM); for each:
#   - the binary is built and trains a step on the host backend;
#   - the payload never runs: no marker file appears, neither where the
#     compiler nor where the binary ran;
#   - the checkpoint records the name byte for byte, and a resume from it
#     (which compares that name with the binary's) is accepted.
# The names:
#   "breakout": closes the string literal and calls system(); the emitter
#     that pasted names unescaped built it and ran the payload at startup.
#   "everything": quotes, backslashes, newlines (a `\` at the end of a line,
#     which would splice a `//` comment onto the next line), `*/`, `??/`
#     (a trigraph before C++17), `//`, `#include`, tabs, control bytes,
#     non-ASCII UTF-8, a `\` at the very end, and the same system() payload.
#
#===------------------------------------------------------------------------===#
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

from e2echeck import check, exit_status

NAMES = {
    "breakout": 'x"; (void)system("touch PWNED"); p.model = "x',
    "everything": ('evil\'"); system("touch PWNED"); //\\\n'
                   '#include <PWNED>\n*/ /* ??/ ??= \\x41 \\101 \t\x01\x7f'
                   ' caf\u00e9 \u2603 ");\nsystem("touch PWNED");\n'
                   'R"(raw)" \\'),
}
MARKER = "PWNED"


def run(cmd, cwd):
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout + r.stderr, flush=True)
    return r


def checkpoint_model(ckpt_dir):
    """extra.model of the newest step's model.safetensors metadata."""
    steps = sorted(d for d in os.listdir(ckpt_dir) if d.startswith("step-"))
    if not steps:
        return None
    path = os.path.join(ckpt_dir, steps[-1], "model.safetensors")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return header.get("__metadata__", {}).get("extra.model")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    with open(args.model) as f:
        base = json.load(f)

    for tag, name in NAMES.items():
        work = os.path.join(args.work, tag)
        os.makedirs(work)
        cfg = dict(base, name_or_path=name)
        config = os.path.join(work, "hostile.json")
        with open(config, "w") as f:
            json.dump(cfg, f)
        binary = os.path.join(work, "train")
        r = run([args.compile, config, "--seq", "16", "-o", binary], work)
        if not check(r.returncode == 0 and os.path.isfile(binary),
                     f"{tag}: actplace-compile did not build the binary"):
            continue
        ckpt = os.path.join(work, "ckpt")
        r = run([binary, "--steps", "1", "--device", "host", "--save", ckpt,
                 "--metrics", "-"], work)
        check(r.returncode == 0 and '"step":1,' in r.stdout,
              f"{tag}: the binary did not train a step")
        got = checkpoint_model(ckpt) if os.path.isdir(ckpt) else None
        check(got == name,
              f"{tag}: the checkpoint's model name is {got!r}, "
              f"expected {name!r}")
        r = run([binary, "--steps", "2", "--device", "host", "--resume", ckpt,
                 "--metrics", "-"], work)
        check(r.returncode == 0 and '"step":2,' in r.stdout,
              f"{tag}: resume from the binary's own checkpoint was refused "
              "(the model name did not round-trip)")
        for where in (work, args.work):
            check(not os.path.exists(os.path.join(where, MARKER)),
                  f"{tag}: the payload ran ({MARKER} in {where})")

    return exit_status("hostile config: binaries built and trained, names "
                       "intact, no payload ran")


if __name__ == "__main__":
    sys.exit(main())
