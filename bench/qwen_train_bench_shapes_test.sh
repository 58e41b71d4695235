#!/bin/bash
# bench/qwen_train_bench.py's arms of another microbatch shape on the host
# backend (seconds; bench/qwen_train_bench_test.sh covers the rest).
#   bench/qwen_train_bench_shapes_test.sh [WORKDIR [BUILD_DIR]]
# Arguments as bench/qwen_train_bench_test.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-$(mktemp -d)}
build_args=()
if [ -n "${2:-}" ]; then
  build_args=(--build-dir "$2" --no-rebuild)
fi
mkdir -p "$work"
# Arms of another microbatch shape (arms.json 'shape', the same tokens a
# step): built with their own --micro-batch-size / --micro-batches, measured
# against none, labelled with their shape; fingerprints are not compared
# across shapes (check refuses before running anything). Few steps: the
# harness's plumbing is under test here, not the times.
rm -rf "$work/carry-shapes" "$work/run-shapes"
python3 bench/qwen_train_bench.py build "${build_args[@]}" --model models/tiny-hybrid.json \
  --seq 64 --micro-batches 4 --arms none,none-2x2 \
  --carry "$work/carry-shapes" 2> "$work/build-shapes.log"
grep -q -- "--micro-batch-size 2 --micro-batches 2" "$work/carry-shapes/none-2x2.compile.txt"
python3 bench/qwen_train_bench.py run --carry "$work/carry-shapes" \
  --out "$work/run-shapes" --device host --rounds 1 --warmup 1 --steps 2 \
  --op-times-steps 0 2> "$work/run-shapes.log"
python3 bench/qwen_train_bench.py table "$work/run-shapes" > "$work/table-shapes.md"
grep -q "^| none-2x2 (2 x 2) | 2 | " "$work/table-shapes.md"
grep -q "^| none | 2 | " "$work/table-shapes.md"
if python3 bench/qwen_train_bench.py check --carry "$work/carry-shapes" \
    --out "$work/check-shapes" --device host --fingerprints --steps 2 \
    > "$work/check-shapes.log" 2>&1; then
  echo "check --fingerprints across shapes should refuse" >&2; exit 1
fi
grep -q "check: --fingerprints compares arms of one microbatch shape; none-2x2 is 2 x 2, none 4 x 1" "$work/check-shapes.log"
echo "qwen_train_bench_test: shapes ok"
