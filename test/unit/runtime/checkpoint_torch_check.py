#!/usr/bin/env python3
"""Reads a checkpoint written by `runtime_checkpoint_test` (test
Checkpoint.ExportForExternalReaders, with AP_CHECKPOINT_EXPORT=DIR) the way a
PyTorch user would, and checks names, dtypes, shapes, values and metadata.

Uses safetensors.torch.load_file when the package is installed; otherwise
parses the documented layout with the standard library and torch.frombuffer,
so it doubles as a check of docs/checkpoint-format.md.

usage: checkpoint_torch_check.py DIR
"""
import hashlib
import json
import struct
import sys

import torch


def parse_by_hand(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    meta = header.pop("__metadata__", {})
    assert meta["actplace.sha256"] == hashlib.sha256(data).hexdigest(), "checksum"
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32, "I64": torch.int64}
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        buf = bytearray(data[b:e])
        out[name] = torch.frombuffer(buf, dtype=dtypes[t["dtype"]]).reshape(t["shape"])
    return out, meta


def main():
    d = sys.argv[1]
    with open(d + "/latest") as f:
        step_dir = d + "/" + f.read().strip()
    path = step_dir + "/model.safetensors"
    tensors, meta = parse_by_hand(path)
    try:
        from safetensors import safe_open
        from safetensors.torch import load_file

        lib = load_file(path)
        assert set(lib) == set(tensors), (sorted(lib), sorted(tensors))
        for k in lib:
            assert torch.equal(lib[k], tensors[k]), k
        with safe_open(path, framework="pt") as f:
            assert f.metadata()["actplace.step"] == "42"
        print("safetensors.torch.load_file: OK")
    except ImportError:
        print("safetensors package not installed: checked by hand-parsing only")
    q = tensors["param/q"]
    assert q.dtype == torch.bfloat16 and list(q.shape) == [6, 4]
    want = torch.arange(24, dtype=torch.float32).reshape(6, 4) * 0.5 - 3.0
    assert torch.equal(q.float(), want), q
    m = tensors["master/q"]
    assert m.dtype == torch.float32
    assert torch.equal(m, torch.arange(24, dtype=torch.float32).reshape(6, 4) * 0.25 + 0.125)
    assert int(tensors["train/step"]) == 42 and tensors["train/step"].dim() == 0
    assert meta["actplace.format"] == "actplace-checkpoint-v1"
    assert meta["actplace.rng"] == "philox4x32_10;seed=99;step=42"
    assert sorted(k.split("/")[0] for k in tensors) == sorted(
        ["adam_m"] * 2 + ["adam_v"] * 2 + ["master"] * 2 + ["param"] * 2 + ["train"]
    )
    print("checkpoint readable from PyTorch: OK (%d tensors)" % len(tensors))


if __name__ == "__main__":
    main()
