#!/bin/sh
# Builds the single-file CUDA benchmark bench/NAME.cu into BUILD/bench/NAME
# against the kernel libraries of a CMake build folder (default build):
#   ninja -C build actplace_kernels_cuda actplace_kernels_reference
# Usage: bench/cuda_bench.sh NAME [BUILD]
set -e
root=$(cd "$(dirname "$0")/.." && pwd)
name=${1:?usage: bench/cuda_bench.sh NAME [BUILD]}
build=${2:-$root/build}
mkdir -p "$build/bench"
/usr/local/cuda/bin/nvcc -O3 -std=c++17 -ccbin=/usr/bin/g++-12 --expt-relaxed-constexpr \
  --generate-code=arch=compute_90a,code=sm_90a -DACTPLACE_HAVE_CUDA=1 \
  -I"$root" "$root/bench/$name.cu" -o "$build/bench/$name" \
  -Xlinker --start-group "$build/kernels/libactplace_kernels_reference.a" \
  "$build/kernels/libactplace_kernels_cuda.a" -Xlinker --end-group \
  -lcublasLt -lcudart
echo "$build/bench/$name"
