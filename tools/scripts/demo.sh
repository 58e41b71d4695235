#!/usr/bin/env bash
#===- demo.sh - the main job on the embedded default ----------------------===#
#
#   tools/scripts/demo.sh [CONFIG.json] [actplace-import options]
#
# Installs dependencies, builds the compiler tools, imports the model config
# (default: Qwen3.5-0.8B at --seq 4096, 4 microbatches) into the train
# dialect, prints the graph summary, builds the training step
# (train-autodiff) and places its activations (offload gdn_core_attn,
# recompute gdn_norm_out; override with PLACEMENT="offload-modules=...
# recompute-modules=..."), then prints the placement report's totals. Then it
# compiles the tiny hybrid model (GDN, gated attention, MLA, MLP layers) with
# offload into a training binary (actplace-compile) and trains it 30 steps on
# this README's bytes on the host backend. Files are left in build-demo/:
# model.mlir, step.mlir, placed.mlir, report.txt, train-tiny, metrics.jsonl.
# The demo builds without CUDA and trains on the host backend unless a GPU is
# usable (nvcc and a driver); ACTPLACE_DEMO_CUDA=0/1 forces either way.
#
#===----------------------------------------------------------------------===#
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
"$root/tools/scripts/install-deps.sh"

config="$root/models/qwen3.5-0.8b.json"
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then
  config=$1
  shift
fi
options=("$@")
if [ ${#options[@]} -eq 0 ]; then
  options=(--seq 4096 --micro-batches 4)
fi

dir="$root/build-demo"
mkdir -p "$dir"
echo "== actplace: building the compiler tools in $dir"
# A usable GPU (driver answering, nvcc to build for it) turns on the CUDA
# build and trains there; ACTPLACE_DEMO_CUDA=0/1 overrides the detection.
gpu=0
if [ -x /usr/local/cuda/bin/nvcc ] && command -v nvidia-smi >/dev/null 2>&1 &&
  nvidia-smi -L >/dev/null 2>&1; then
  gpu=1
fi
cuda=OFF
if [ "${ACTPLACE_DEMO_CUDA:-$gpu}" = 1 ]; then
  cuda=ON
fi
device=host
if [ "$cuda" = ON ] && [ "$gpu" = 1 ]; then
  device=cuda
fi
cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DACTPLACE_ENABLE_CUDA=$cuda >"$dir/configure.log" 2>&1 || {
  cat "$dir/configure.log" >&2
  exit 1
}
ninja -C "$dir" actplace-import actplace-opt
echo "== actplace: importing $config ${options[*]}"
"$dir/bin/actplace-import" "$config" "${options[@]}" -o "$dir/model.mlir"
"$dir/bin/actplace-opt" "$dir/model.mlir" --verify-roundtrip -train-print-summary -o /dev/null
echo "== actplace: building the training step (forward + backward + AdamW)"
"$dir/bin/actplace-opt" "$dir/model.mlir" -train-autodiff -o "$dir/step.mlir"
placement=${PLACEMENT:-"offload-modules=gdn_core_attn recompute-modules=gdn_norm_out"}
echo "== actplace: placement: $placement"
"$dir/bin/actplace-opt" "$dir/step.mlir" \
  "-train-placement-pipeline=$placement report=true report-file=$dir/report.txt" \
  -o "$dir/placed.mlir"
echo "   decisions: $(grep -c '| offload |' "$dir/report.txt") values offloaded," \
  "$(grep -c '| recompute |' "$dir/report.txt") recomputed," \
  "$(grep -c '| keep |' "$dir/report.txt") kept per microbatch"
grep -E '^(totals|transfers|predicted)' "$dir/report.txt"
echo "== actplace: full report in $dir/report.txt; placed step in $dir/placed.mlir"

echo "== actplace: building actplace-compile, the runtime and the kernels"
ninja -C "$dir" actplace-compile
# On the GPU the tiny model with head dims the CUDA attention kernels take.
tiny="$root/models/tiny-hybrid.json"
tinyseq=64
if [ "$device" = cuda ]; then
  tiny="$root/models/tiny-hybrid-gpu.json"
  tinyseq=256
fi
echo "== actplace: compiling $tiny with offload into a training binary"
"$dir/bin/actplace-compile" "$tiny" --seq $tinyseq --micro-batches 2 \
  --offload-modules=gdn_core_attn,core_attn,attn_proj --hide-rule=off \
  -o "$dir/train-tiny" | grep -E '^(planned peak|predicted activation peak:|wrote)'
echo "== actplace: training it for 30 steps on the bytes of README.md ($device backend)"
rm -f "$dir/metrics.jsonl"
"$dir/train-tiny" --steps 30 --device $device --data "text:$root/README.md" \
  --lr 3e-3 --metrics "$dir/metrics.jsonl"
python3 - "$dir/metrics.jsonl" <<'PY'
import json, sys
steps = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
d2h = sum(t["d2h_count"] for t in steps[-1]["transfers"].values())
print("   loss %.4f -> %.4f over %d steps; last step: %d offload copies, pinned pool in use %d"
      % (steps[0]["loss"], steps[-1]["loss"], len(steps), d2h,
         steps[-1]["pinned_pool"]["in_use"]))
PY
