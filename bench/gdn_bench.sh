#!/bin/bash
# Builds (here) or runs (on the GPU machine) the GDN benchmark.
#   bench/gdn_bench.sh build   -> build-gdn/gdn_bench (nvcc, sm_90a)
#   bench/gdn_bench.sh run     -> ours, then FLA, in one process tree
#   bench/gdn_bench.sh interleave [N [DIR]] -> ours and FLA alternated, N
#                                 samples each, median and range
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-run}" in
build)
  mkdir -p build-gdn
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
    -Xptxas -v -I. bench/gdn_bench.cu kernels/cuda/gdn/gdn_chunk.cu \
    kernels/cuda/gdn/gdn_state.cu \
    kernels/cuda/gdn/gdn_ops.cu kernels/reference/gdn/*.cpp kernels/workspace.cpp \
    -o build-gdn/gdn_bench
  ;;
run)
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader || true
  ./build-gdn/gdn_bench
  PYTHONUNBUFFERED=1 python3 bench/gdn_bench_fla.py
  ;;
interleave)
  # Ours and FLA alternated in fresh processes, ${2:-5} samples each, with
  # median and range (what a comparison against the peer reports).
  python3 bench/gdn_interleave.py run --samples "${2:-5}" --out "${3:-gdn-interleave}"
  ;;
profile)
  # Per-kernel device time of one fwd + bwd (B=1, then B=4).
  ncu --clock-control none --metrics gpu__time_duration.sum ./build-gdn/gdn_bench once
  ;;
esac
