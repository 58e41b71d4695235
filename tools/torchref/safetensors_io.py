"""Minimal safetensors reader and writer (the documented layout: an 8-byte
little-endian header length, a JSON header {name: {dtype, shape,
data_offsets}, "__metadata__": {...}}, then the data), so the reference needs
nothing beyond PyTorch. Tensors are read into (copied) torch tensors."""
import json
import struct

import torch

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def load(path):
    """Returns ({name: tensor}, {metadata key: value})."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("%s: too short for a safetensors file" % path)
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, t in header.items():
        if t["dtype"] not in _DTYPES:
            raise ValueError("%s: tensor %s has unsupported dtype %s" %
                             (path, name, t["dtype"]))
        begin, end = t["data_offsets"]
        buf = bytearray(data[begin:end])
        dtype = _DTYPES[t["dtype"]]
        if len(buf) == 0:
            out[name] = torch.zeros(t["shape"], dtype=dtype)
        else:
            out[name] = torch.frombuffer(buf, dtype=dtype).reshape(t["shape"])
    return out, meta


def save(path, tensors, metadata=None):
    """Writes {name: tensor} (contiguous copies, little-endian) and string
    metadata."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in _NAMES:
            raise ValueError("tensor %s: unsupported dtype %s" % (name, t.dtype))
        if t.dtype == torch.bfloat16:
            blob = t.view(torch.int16).numpy().tobytes()
        else:
            blob = t.numpy().tobytes()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
