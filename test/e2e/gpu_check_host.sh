#!/usr/bin/env bash
#===- gpu_check_host.sh - the one GPU command, checked on the host --------===#
#
# tools/scripts/gpu-check.sh on a CPU-only build: pack a bundle (two GPU
# tests, short sequences, models/tiny-hybrid.json for the MLA arms and the
# oracle, no compression), unpack it in another folder, check that its test
# binaries load the runtime and kernels from its lib/ (test/unit/
# shared_link_test.sh) and run every part with --device host: GPU tests
# report skipped, every other part must pass.
# Then the same bundle with --device cuda, which a CPU-only build cannot
# serve, must fail: GPU tests that skip and binaries without a GPU are
# failures on the GPU machine, named in the summary, exit 1.
#
#   gpu_check_host.sh SRC_DIR BUILD_DIR WORK_DIR
#
#===------------------------------------------------------------------------===#
set -u -o pipefail
src=$1 build=$2 work=$3
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work/unpacked" || exit 1
"$src/tools/scripts/gpu-check.sh" pack "$build" "$work/b.tar.xz" --no-build \
    --seq 64 --xz-level 0 --tests 'runtime_device_test_cuda|kernels_dense_cuda_test' \
    --mla-model "$src/models/tiny-hybrid.json" \
    --oracle-model "$src/models/tiny-hybrid.json" || fail "pack exited $?"
tar -C "$work/unpacked" -xJf "$work/b.tar.xz" || fail "the bundle does not unpack"
b=$work/unpacked/gpu-check
# The test binaries find the shared runtime and kernels in the bundle's lib/,
# not in the build tree they were linked in.
bash "$src/test/unit/shared_link_test.sh" bundle "$b" || fail "the bundle's test binaries do not use its lib/"
"$b/tools/scripts/gpu-check.sh" run "$b" --device host || fail "run --device host exited $?"
for want in "PASS device" "SKIP unit-tests (0 passed, 2 skipped, 0 failed)" \
    "PASS bitident-tiny (13 placements" "PASS bitident-mla (2 placements" \
    "PASS checkpoint" "PASS data-parallel (2 ranks, --comm auto" "PASS on host"; do
  grep -q "^gpu-check: $want" "$b/gpu-check.log" || fail "no 'gpu-check: $want' in $b/gpu-check.log"
done
grep -q "^gpu-check: \(PASS\|SKIP\) grad-oracle" "$b/gpu-check.log" || fail "no grad-oracle line in $b/gpu-check.log"

"$b/tools/scripts/gpu-check.sh" run "$b" --device cuda --log "$work/cuda.log" > /dev/null
rc=$?
[ $rc -eq 1 ] || fail "run --device cuda from a CPU-only build exited $rc, expected 1"
for want in "FAIL unit-tests (0 passed, 0 skipped, 2 failed)" "FAIL bitident-tiny" \
    "FAIL checkpoint" "FAIL data-parallel (--comm mpi-staged)" "FAIL on cuda"; do
  grep -q "^gpu-check: $want" "$work/cuda.log" || fail "no 'gpu-check: $want' in $work/cuda.log"
done
echo "PASS: gpu-check.sh packs, runs on the host backend, and fails where the GPU is missing"
