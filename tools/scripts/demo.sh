#!/usr/bin/env bash
#===- demo.sh - the main job on the embedded default ----------------------===#
#
#   tools/scripts/demo.sh [CONFIG.json] [actplace-import options]
#
# Installs dependencies, builds the compiler tools, imports the model config
# (default: Qwen3.5-0.8B at --seq 4096, 4 microbatches) into the train
# dialect, verifies it and prints the graph summary. The imported graph is
# left in build-demo/model.mlir.
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
cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$dir/configure.log" 2>&1 || {
  cat "$dir/configure.log" >&2
  exit 1
}
ninja -C "$dir" actplace-import actplace-opt
echo "== actplace: importing $config ${options[*]}"
"$dir/bin/actplace-import" "$config" "${options[@]}" -o "$dir/model.mlir"
"$dir/bin/actplace-opt" "$dir/model.mlir" --verify-roundtrip -train-print-summary -o /dev/null
echo "== actplace: graph written to $dir/model.mlir"
