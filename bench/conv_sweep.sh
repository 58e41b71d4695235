#!/bin/sh
# Builds bench/conv_sweep (GDN short-conv kernel variants at the Qwen
# shape): bench/cuda_bench.sh conv_sweep [BUILD].
exec "$(dirname "$0")/cuda_bench.sh" conv_sweep "$@"
