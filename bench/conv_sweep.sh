#!/bin/sh
# Builds bench/conv_sweep (GDN short-conv kernel variants at the Qwen shape)
# against the kernel libraries of a CMake build folder (default build):
#   ninja -C build actplace_kernels_cuda actplace_kernels_reference
set -e
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
mkdir -p "$build/bench"
/usr/local/cuda/bin/nvcc -O3 -std=c++17 -ccbin=/usr/bin/g++-12 --expt-relaxed-constexpr \
  --generate-code=arch=compute_90a,code=sm_90a -DACTPLACE_HAVE_CUDA=1 \
  -I"$root" "$root/bench/conv_sweep.cu" -o "$build/bench/conv_sweep" \
  -Xlinker --start-group "$build/kernels/libactplace_kernels_reference.a" \
  "$build/kernels/libactplace_kernels_cuda.a" -Xlinker --end-group \
  -lcublasLt -lcudart
echo "$build/bench/conv_sweep"
