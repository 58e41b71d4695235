#!/bin/bash
# Host check of bench/qwen_torch_peer.py before any GPU time: the chunked
# PyTorch GDN core against torchref's recurrence (selftest), then the whole
# parity flow on models/tiny-hybrid.json (seq 64, 4 microbatches, bf16):
# prepare weights + tokens, 10 steps of the training binary (build-bench,
# host backend) and of the peer on the CPU (--gdn torch-chunk and naive,
# --attention naive), compared step by step, and the binary from weights
# moved by one bf16 rounding error (the noise floor). Fails when a loss
# differs by more than 1e-3 (bf16 noise at this size is about 1e-4) or the
# perturbed run is bit-equal to the unperturbed one.
#   bench/qwen_torch_peer_test.sh [WORKDIR]
# No machine here has both the compiler and torch: compile on the build
# machine (the command below) and give the binary as TRAIN=PATH on the
# machine with torch.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-$(mktemp -d)}
mkdir -p "$work"
py=${PYTHON:-python3}
"$py" -c "import torch" 2>/dev/null || py=/usr/bin/python3
"$py" bench/qwen_torch_peer.py selftest
train=${TRAIN:-$work/train}
if [ -z "${TRAIN:-}" ]; then
  build-bench/bin/actplace-compile models/tiny-hybrid.json --seq 64 \
    --micro-batches 4 -o "$train" > "$work/compile.log"
fi
"$py" bench/qwen_torch_peer.py parity --binary "$train" \
  --out "$work/parity" --model models/tiny-hybrid.json --seq 64 \
  --micro-batches 4 --device cpu --gdn-cores torch-chunk,naive \
  --attention naive 2> "$work/parity.log" | tee "$work/parity.md"
"$py" - "$work/parity.md" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
# One section per comparison: "## <title>", a table, "largest |loss ...".
sections = {sec.split("\n")[0]: float(m.group(1))
            for sec in text.split("\n## ")[1:]
            for m in [re.search(r"largest \|loss difference\|: ([0-9.]+)", sec)]
            if m}
assert len(sections) == 3, "expected three comparisons, got %s" % sections
floor = [v for k, v in sections.items() if k.startswith("noise floor")]
peers = [v for k, v in sections.items() if k.startswith("ours vs peer")]
assert len(floor) == 1 and len(peers) == 2, sections
floor = floor[0]
assert max(peers) < 1e-3, "loss differs by %g" % max(peers)
assert 0 < floor < 1e-2, "noise floor %g" % floor
print("qwen_torch_peer_test: ok (largest loss difference %.2e, noise floor "
      "%.2e)" % (max(peers), floor))
PY
