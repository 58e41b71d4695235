#!/bin/sh
# Builds bench/dense_bench against the kernels of a CMake build folder
# (default build-dense): the kernel libraries must be built first
# (ninja -C build-dense actplace_kernels_cuda actplace_kernels_reference).
set -e
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-dense}
mkdir -p "$build/bench"
g++ -O2 -std=c++17 -DACTPLACE_HAVE_CUDA=1 -I"$root" -I/usr/local/cuda/include \
  "$root/bench/dense_bench.cpp" -o "$build/bench/dense_bench" \
  -Wl,--start-group "$build/kernels/libactplace_kernels_reference.a" \
  "$build/kernels/libactplace_kernels_cuda.a" -Wl,--end-group \
  -L/usr/local/cuda/lib64 -lcublasLt -lcudart
echo "$build/bench/dense_bench"
