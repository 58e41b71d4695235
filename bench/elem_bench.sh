#!/bin/sh
# Builds bench/elem_bench (the row-wise and elementwise kernels at model
# shapes): bench/cuda_bench.sh elem_bench [BUILD].
exec "$(dirname "$0")/cuda_bench.sh" elem_bench "$@"
