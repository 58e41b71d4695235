#!/bin/sh
# Builds the library bench/attention_bench.py loads: the attention kernels
# (CUDA and reference) with kernels/workspace.cpp (the shared argument check
# and workspace queries)
# and the flat C entries of bench/attention_bench_capi.cpp, with the CUDA
# runtime linked statically so that it loads next to PyTorch's.
#   sh bench/attention_bench.sh [build folder, default build-attn]
#   python3 bench/attention_bench.py --lib build-attn/libattention_bench.so
set -e
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-attn}
mkdir -p "$build"
/usr/local/cuda/bin/nvcc -ccbin g++ -std=c++17 -O3 -I"$root" \
  --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
  -DACTPLACE_HAVE_CUDA=1 -Xcompiler -fPIC -shared -cudart static \
  "$root/kernels/cuda/attention/attention.cu" \
  "$root/kernels/reference/attention/attention.cpp" \
  "$root/kernels/workspace.cpp" \
  "$root/bench/attention_bench_capi.cpp" -o "$build/libattention_bench.so"
echo "$build/libattention_bench.so"
