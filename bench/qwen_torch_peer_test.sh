#!/bin/bash
# Host check of bench/qwen_torch_peer.py before any GPU time: the chunked
# PyTorch GDN core against torchref's recurrence (selftest), then the whole
# parity flow on models/tiny-hybrid.json (seq 64, 4 microbatches, bf16):
# prepare weights + tokens, 10 steps of the training binary (build-bench,
# host backend) and of the peer on the CPU (--gdn torch-chunk and naive,
# --attention naive), compared step by step. Fails when a loss differs by
# more than 1e-3 (bf16 noise at this size is about 1e-4).
#   bench/qwen_torch_peer_test.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-$(mktemp -d)}
mkdir -p "$work"
py=${PYTHON:-python3}
"$py" -c "import torch" 2>/dev/null || py=/usr/bin/python3
"$py" bench/qwen_torch_peer.py selftest
build-bench/bin/actplace-compile models/tiny-hybrid.json --seq 64 \
  --micro-batches 4 -o "$work/train" > "$work/compile.log"
"$py" bench/qwen_torch_peer.py parity --binary "$work/train" \
  --out "$work/parity" --model models/tiny-hybrid.json --seq 64 \
  --micro-batches 4 --device cpu --gdn-cores torch-chunk,naive \
  --attention naive 2> "$work/parity.log" | tee "$work/parity.md"
"$py" - "$work/parity.md" <<'PY'
import re, sys
diffs = [float(m) for m in re.findall(r"largest \|loss difference\|: ([0-9.]+)",
                                      open(sys.argv[1]).read())]
assert len(diffs) == 2, "expected two comparisons, got %d" % len(diffs)
assert max(diffs) < 1e-3, "loss differs by %g" % max(diffs)
print("qwen_torch_peer_test: ok (largest loss difference %.2e)" % max(diffs))
PY
