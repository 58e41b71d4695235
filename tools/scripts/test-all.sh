#!/usr/bin/env bash
#===- test-all.sh - build and run every actplace test ---------------------===#
#
# Installs dependencies, then builds and tests both configurations users have:
#   build-test-cpu   CPU only (-DACTPLACE_ENABLE_CUDA=OFF), the compiler
#                    included: `ctest` runs the lit suite, every gtest binary,
#                    the MPI (mpirun -np 2) and ThreadSanitizer tests, the
#                    end-to-end tests and the benchmark harness on the host
#                    backend (bench/qwen_train_bench_test.sh);
#   build-test-cuda  with CUDA, when nvcc is installed: the runtime and
#                    kernels only (-DACTPLACE_BUILD_COMPILER=OFF, not built
#                    twice), and `ctest -L gpu`, the tests that need CUDA
#                    (each test runs in one configuration); they skip
#                    themselves on a machine without a GPU.
# The CUDA configuration runs first, the CPU tests last (after the fuzz
# stage), so a log ends with the report of the tests that ran.
# The fuzz stage: build-test-fuzz (clang-22, ASan + UBSan, libFuzzer;
# only the fuzz targets are built) runs each fuzz target for
# ACTPLACE_FUZZ_SECONDS (default 20, so 60 s for the three) on seeds from
# test/ and models/; a crash fails the run (docs/fuzzing.md). 0 skips it.
#
# Tests labelled `long` (larger matrices) are left out unless --long is
# given. After each ctest run one summary line gives the passed / skipped /
# failed counts and the time, then the skipped tests and the 10 slowest
# (tools/scripts/ctest_summary.py). A GPU test that could not run here is
# counted as skipped, never as passed.
#
#===----------------------------------------------------------------------===#
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
ctest_labels=(-LE long)
for arg in "$@"; do
  case "$arg" in
  --long) ctest_labels=() ;;
  -h | --help)
    echo "usage: test-all.sh [--long]   (--long: also the tests labelled long)"
    exit 0
    ;;
  *)
    echo "test-all.sh: unknown argument '$arg' (expected --long)" >&2
    exit 2
    ;;
  esac
done
"$root/tools/scripts/install-deps.sh"

jobs=${ACTPLACE_JOBS:-$(nproc)}
# Each configuration's summary, printed again together at the end.
summaries=$(mktemp)
trap 'rm -f "$summaries"' EXIT
build_config() {
  local name=$1
  shift
  local dir="$root/build-test-$name"
  local start=$SECONDS
  mkdir -p "$dir"
  echo "== actplace: configure and build ($name) in $dir"
  cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >"$dir.configure.log" 2>&1 || {
    cat "$dir.configure.log" >&2
    return 1
  }
  ninja -C "$dir" -j "$jobs"
  echo "== actplace: build ($name) took $((SECONDS - start)) s"
}
test_config() {
  local name=$1
  shift
  local dir="$root/build-test-$name"
  local ctest_start=$SECONDS rc=0
  echo "== actplace: running ctest ($name)"
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" ${ctest_labels[@]+"${ctest_labels[@]}"} \
    "$@" --output-junit "$dir/ctest-junit.xml" || rc=$?
  python3 "$root/tools/scripts/ctest_summary.py" "$name" "$dir/ctest-junit.xml" \
    --wall $((SECONDS - ctest_start)) | tee -a "$summaries" || true
  [ "$rc" -eq 0 ] || return "$rc"
  echo "== actplace: $name tests passed in $((SECONDS - ctest_start)) s"
}

# Order: the CUDA configuration first (on a machine without a GPU its tests
# all skip), then the CPU build, the fuzz stage (which uses the CPU build's
# tools) and the CPU tests last, so that the last test report a log ends
# with is the one that ran everything a GPU-less machine can run.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  # Each test runs in one configuration: the CUDA one compiles the CUDA code
  # (runtime and kernels; the compiler is built in the CPU configuration) and
  # runs what needs it, the tests labelled gpu (skipped where no GPU is
  # usable). GPU binaries for the GPU machine come from a CUDA build with the
  # compiler (tools/scripts/gpu-check.sh pack).
  build_config cuda -DACTPLACE_ENABLE_CUDA=ON -DACTPLACE_BUILD_COMPILER=OFF
  test_config cuda -L gpu
else
  echo "== actplace: nvcc not found: the CUDA configuration was not built"
fi

build_config cpu -DACTPLACE_ENABLE_CUDA=OFF

fuzz_seconds=${ACTPLACE_FUZZ_SECONDS:-20}
if [ "$fuzz_seconds" -gt 0 ]; then
  start=$SECONDS
  echo "== actplace: fuzz stage ($fuzz_seconds s per target) in $root/build-test-fuzz"
  "$root/tools/scripts/fuzz.sh" --build "$root/build-test-fuzz" --tools "$root/build-test-cpu/bin" \
    --time "$fuzz_seconds" all
  echo "== actplace: fuzz stage passed in $((SECONDS - start)) s"
fi

test_config cpu
echo "== actplace: all configurations passed; per configuration:"
cat "$summaries"
