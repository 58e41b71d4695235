#!/usr/bin/env bash
#===- memory_call.sh - issue 31's GPU runs, in one device call -------------===#
#
# Runs on the GPU machine, from the repository root (after
# bench/memory_call_prepare.sh here), what
# bench/notes/long-context.md records: our arms (built here beforehand with
# bench/memory_bench.py build and test/e2e/gpu_bitident.py build, packed into
# one or more gpu-carry/*.tar.xz holding mem/ and mla2k/) and the PyTorch
# peer (bench/qwen_torch_peer.py, FLA from third_party_untracked/fla-src).
#
#   DEADLINE=<s> bench/memory_call.sh PHASE...
#
# Phases, run in the order given, each cut to the seconds left:
#   ours-budgets    mem/ arms b16,b24,b40,b80
#   ours-lengths    mem/ arms $LEN_ARMS (default the 4k-128k length arms)
#   mla             mla2k/ arms: bits, copies, step time (gpu_bitident.py)
#   mla-peer        ours (mla2k/train-none) and the peer, alternately,
#                   $ROUNDS rounds of 5 steps each
#   peer-budgets    the peer's grid at 16,24,40,80 GiB (seq 4096, 65,536
#                   tokens a step; micro-batch 1,2,4; none/layer/selective)
#   peer-soc        the same grid with save_on_cpu at 16 and 24 GiB
#   peer-compile    torch.compile for the best settings (4 x 4, none and
#                   per-layer) at 80, 40 and 24 GiB
#   peer-lengths    one sequence a step at $PEER_SEQS, device budget
#
# Everything it writes goes to $OUT/results.tar.xz (repacked after every
# phase, so a call cut short still brings back what finished: the device
# machine returns a limited number of files). The peer's Triton cache goes
# with it; put its contents in gpu-carry/peer-state/ for the next call.
#
#===------------------------------------------------------------------------===#
set -u
case "${1:-}" in
-h | --help | "")
  sed -n '2,/^#===-*===#$/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
  ;;
esac
T0=$SECONDS
DEADLINE=${DEADLINE:-580}
left() { echo $((DEADLINE - (SECONDS - T0))); }
export NCCL_NVLS_ENABLE=0
R=/tmp/memory-call
mkdir -p "$OUT" "$R" /tmp/w /tmp/peer
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv >"$R/gpu.txt" 2>&1
cat "$R/gpu.txt"
for t in gpu-carry/*.tar.xz; do
  [ -e "$t" ] && tar -xJf "$t" -C /tmp/w
done
[ -d gpu-carry/peer-state ] && cp -r gpu-carry/peer-state/. /tmp/peer/
export TRITON_CACHE_DIR=/tmp/peer/triton-cache
mkdir -p "$TRITON_CACHE_DIR"
pack() {
  cp /tmp/peer/*.jsonl /tmp/peer/*.log "$R/" 2>/dev/null
  tar -cJf "$OUT/results.tar.xz" -C "$R" . -C /tmp/peer triton-cache 2>/dev/null
}
grid() { # [GRID_TIMEOUT=s] grid OUT-NAME ARGS...
  local name=$1
  shift
  timeout $(($(left) - 10)) python3 bench/qwen_torch_peer.py grid "$@" \
    --timeout-s "${GRID_TIMEOUT:-150}" --max-wall-s $(($(left) - 30)) --resume \
    --out "/tmp/peer/$name.jsonl" 2>&1 | grep -v '^{' | tail -50
}
for phase in "$@"; do
  echo "=== phase $phase at $((SECONDS - T0)) s, $(left) s left"
  case $phase in
  ours-budgets)
    timeout $(($(left) - 5)) python3 bench/memory_bench.py run --dir /tmp/w/mem \
      --arms b16,b24,b40,b80 --steps 3 --timeout-s 120 \
      --out "$R/mem-budgets.jsonl" 2>&1 | tail -40 ;;
  ours-lengths)
    timeout $(($(left) - 5)) python3 bench/memory_bench.py run --dir /tmp/w/mem \
      --arms "${LEN_ARMS:-s4096-none,s16384-none,s32768-none,s65536-none,s65536-placed,s131072-placed}" \
      --steps 3 --timeout-s 240 --out "$R/mem-lengths.jsonl" 2>&1 | tail -60 ;;
  mla)
    timeout $(($(left) - 5)) python3 test/e2e/gpu_bitident.py run --dir /tmp/w/mla2k \
      --steps 3 --out "$R/mla" 2>&1 | tail -30 ;;
  mla-peer)
    for r in $(seq 1 "${ROUNDS:-3}"); do
      [ "$(left)" -lt 60 ] && break
      /tmp/w/mla2k/train-none --steps 5 --device cuda \
        --metrics "$R/mla-ours-r$r.jsonl" >/dev/null 2>"$R/mla-ours-r$r.err"
      echo "ours r$r rc=$?"
      timeout $(($(left) - 5)) python3 bench/qwen_torch_peer.py train \
        --model models/hybrid-mla-mlp-2k.json --seq 4096 --micro-batch-size 1 \
        --micro-batches 4 --steps 5 --warmup 2 --metrics "$R/mla-peer-r$r.jsonl" \
        >"$R/mla-peer-r$r.out" 2>"$R/mla-peer-r$r.err"
      echo "peer r$r rc=$?"
      tail -1 "$R/mla-peer-r$r.out" | tr ',' '\n' | grep -E 'tokens_per_s_median|step_time_median|device_peak_bytes'
    done ;;
  peer-budgets)
    grid budgets --budgets-gib 16,24,40,80 --seqs 4096 --global-batch-tokens 65536 \
      --mbs 1,2,4 --activations none,layer,selective --steps 3 --warmup 2 ;;
  peer-soc)
    grid budgets-soc --budgets-gib 16,24 --seqs 4096 --global-batch-tokens 65536 \
      --mbs 1,2,4 --activations none,layer,selective --save-on-cpu on --steps 3 --warmup 2 ;;
  peer-compile)
    # Compiling 24 layers takes minutes the first time: a longer limit.
    GRID_TIMEOUT=420 grid budgets-compile --compile --budgets-gib 24,40,80 --seqs 4096 \
      --global-batch-tokens 65536 --mbs 4 --activations none,layer --steps 3 --warmup 2 ;;
  peer-lengths)
    # One sequence a step, as our length arms (1 x 1); each seq its own grid.
    for q in $(echo "${PEER_SEQS:-4096,16384,32768,65536,131072}" | tr , ' '); do
      [ "$(left)" -lt 60 ] && break
      grid "len$q" --budgets-gib device --seqs "$q" --global-batch-tokens "$q" --mbs 1 \
        --activations "${PEER_ACTS:-none,selective,layer}" --steps 3 --warmup 1
    done ;;
  *) echo "memory_call.sh: unknown phase '$phase'" >&2 ;;
  esac
  pack
done
pack
echo "=== done at $((SECONDS - T0)) s"
