#!/usr/bin/env bash
#===- memory_call_prepare.sh - build what bench/memory_call.sh carries ----===#
#
# Here (the compiler cannot travel): compiles the memory arms
# (bench/memory_bench.py build: budgets 16/24/40/80 GiB, lengths 4k-128k)
# and the MLA/MLP arms (test/e2e/gpu_bitident.py build: none and core_attn +
# attn_proj offloaded) with build-cuda's actplace-compile, and packs the
# binaries a call runs into gpu-carry/arms.tar.xz (about 7 MB). With
# FLA_REPO=<a git clone of flash-linear-attention> it also writes
# third_party_untracked/fla-src from commit bc3b101 (never committed).
#
#   bench/memory_call_prepare.sh
#
# Then run `DEADLINE=580 bench/memory_call.sh PHASE...` on the device,
# carrying gpu-carry/arms.tar.xz and third_party_untracked/fla-src (and
# gpu-carry/peer-state/, a Triton cache from an earlier call, if kept).
#
#===------------------------------------------------------------------------===#
set -euo pipefail
case "${1:-}" in
-h | --help)
  sed -n '2,/^#===-*===#$/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
  ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
compile=build-cuda/bin/actplace-compile
[ -x "$compile" ] || {
  echo "memory_call_prepare.sh: $compile not built (cmake -S . -B build-cuda -G Ninja" \
    "-DCMAKE_BUILD_TYPE=Release -DACTPLACE_ENABLE_CUDA=ON && ninja -C build-cuda actplace-compile)" >&2
  exit 1
}
if [ -n "${FLA_REPO:-}" ]; then
  mkdir -p third_party_untracked/fla-src
  git -C "$FLA_REPO" archive bc3b101d fla | tar -x -C third_party_untracked/fla-src
fi
mkdir -p gpu-carry
python3 bench/memory_bench.py build --compile "$compile" --out gpu-carry/mem \
  --seqs 4096,16384,32768,65536,131072
python3 test/e2e/gpu_bitident.py build --compile "$compile" \
  --model models/hybrid-mla-mlp-2k.json --dir gpu-carry/mla2k --seq 4096 \
  --micro-batches 4 --arm none= --arm "core_attn+attn_proj=--offload-modules=core_attn,attn_proj"
cd gpu-carry
files=(mem/arms.json mla2k/arms.json mla2k/train-none mla2k/train-core_attn+attn_proj)
for arm in b16 b24 b40 b80 s4096-none s16384-none s32768-none s65536-none \
  s65536-placed s131072-none s131072-placed; do
  [ -e "mem/$arm" ] && files+=("mem/$arm")
done
tar -cf - "${files[@]}" | xz -9 -T2 >arms.tar.xz
ls -la arms.tar.xz
