#!/usr/bin/env bash
#===- gpu-check.sh - every GPU test and GPU end-to-end check, one command --===#
#
# The GPU machine has no compiler (libMLIR and the host toolchain stay
# here), so the check travels as one bundle of compiled binaries:
#
#   gpu-check.sh pack BUILD_DIR OUT.tar.xz [--no-build] [--seq N]
#                [--tests REGEX] [--xz-level N] [--mla-model M.json]
#                [--oracle-model M.json]
#       here, in a CUDA build (-DACTPLACE_ENABLE_CUDA=ON): builds what it
#       needs (unless --no-build), compiles with BUILD_DIR's actplace-compile
#       the end-to-end arms (tiny-hybrid-gpu under five placements and with
#       the staged short-conv kernels, each
#       also built from its readable C++ as arm cpp-NAME, and for 2
#       data-parallel ranks with and without offload beside one rank; the
#       MLA/MLP hybrid with core_attn + attn_proj offload and without, a bf16
#       gradient-oracle step of tiny-hybrid-gpu, whose head dims the CUDA
#       attention kernels take), collects the binaries of the ctest label
#       `gpu` (--tests narrows them, a ctest -R regex) and, in lib/, the
#       shared runtime and kernels libraries they link (one copy for all of
#       them; their RUNPATH $ORIGIN/../lib finds it), the Python checks and
#       this script, strips every binary and writes one tar.xz. Refuses a
#       bundle over 48 MiB. --seq, --tests, --xz-level, --mla-model
#       (another model for the MLA arms: hybrid-mla-mlp's 32000-token
#       vocabulary takes 6 s a step on the host backend) and --oracle-model
#       (tiny-hybrid-gpu's float64 reference takes a minute on two cores)
#       keep the host self-test short; the GPU bundle takes the defaults.
#
#   gpu-check.sh run BUNDLE_DIR [--device cuda|host] [--log FILE]
#       there, in the unpacked folder: nvidia-smi, every GPU unit test
#       (which must find the runtime and kernels in the bundle's lib/),
#       bit identity across placements for both models and for the tiny one
#       with generated kernels and on packed sequences (gpu_bitident.py),
#       checkpoint save/resume including a resume under another placement
#       (gpu_checkpoint.py), data parallelism (replicated and ZeRO-3) on 2
#       ranks (gpu_data_parallel.py: NCCL on two GPUs, MPI on staged device
#       buffers when the ranks share one), tensor and pipeline parallelism
#       on 2 and 4 ranks (gpu_tensor_parallel.py: TP 2, TP 2 + SP, placed,
#       PP 2, PP 2 placed, TP 2 x PP 2 x SP; NCCL with a GPU per rank, else
#       staged MPI; each rank's own device memory from nvidia-smi), the bf16 step
#       against the PyTorch oracle
#       (grad_oracle.py, bounds in its BF16_BOUNDS). One log (default
#       BUNDLE_DIR/gpu-check.log), one PASS/FAIL/SKIP line per part, exit 1
#       if any part failed. On cuda a GPU test that skips (exit 77) or an
#       oracle without PyTorch fails: on the GPU machine nothing may skip,
#       except the multi-rank NCCL test on a machine with one GPU (it runs
#       as two ranks where there are two GPUs).
#       --device host runs the same bundle on the host backend (a bundle
#       packed from a CPU-only build): the self-test CI runs, where GPU
#       tests report skipped.
#
#===------------------------------------------------------------------------===#
set -u -o pipefail

LIMIT_BYTES=$((48 * 1024 * 1024))
die() { echo "gpu-check: error: $*" >&2; exit 2; }

# The five placements of tiny-hybrid-gpu (the first is the baseline; pack
# adds an arm with the generated grad norm and AdamW), one with the short
# convolution's staged kernels (its q/k/v groups of 128 and 256 channels take
# them: the same bits as the windowed ones), and the two of the MLA/MLP
# hybrid.
TINY_ARMS=(
  "none="
  "gdn_core_attn=--offload-modules=gdn_core_attn"
  "core_attn+attn_proj=--offload-modules=core_attn,attn_proj"
  "recompute=--recompute-modules=gdn_norm_out,mlp_act"
  "gdn_core_attn+recompute=--offload-modules=gdn_core_attn --recompute-modules=gdn_norm_out"
  "staged-conv=--short-conv-kernels=staged"
)
MLA_ARMS=(
  "none="
  "core_attn+attn_proj=--offload-modules=core_attn,attn_proj"
)
# tiny-hybrid-gpu with the compiler's generated kernels (--kernels=generated:
# PTX loaded through the driver API) under placements, fused recompute
# included: the same bits in every arm.
GEN_ARMS=(
  "none=--kernels=generated"
  "gdn_core_attn=--kernels=generated --offload-modules=gdn_core_attn"
  "recompute=--kernels=generated --recompute-modules=gdn_norm_out,mlp_act,mlp_norm"
)
# tiny-hybrid-gpu trained on packed sequences (--document-separator: the
# synthetic data's token 10 ends a document, about every 512 tokens), so the
# cuda GDN chunk and attention run per document: the same bits in every arm.
PACKED_ARMS=(
  "packed=--document-separator=10"
  "packed+offload=--document-separator=10 --offload-modules=gdn_core_attn,core_attn"
  "packed+recompute=--document-separator=10 --recompute-modules=gdn_norm_out,mlp_act"
)

# actplace_needed FILE...: the libactplace shared libraries the files name
# in their NEEDED entries.
actplace_needed() {
  readelf -d "$@" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(libactplace[^]]*\)\].*/\1/p' | sort -u
}

pack() {
  [ $# -ge 2 ] || die "usage: gpu-check.sh pack BUILD_DIR OUT.tar.xz [--no-build] [--seq N] [--tests REGEX] [--xz-level N] [--mla-model M.json] [--oracle-model M.json]"
  local src; src=$(cd "$(dirname "$0")/../.." && pwd)
  local build out nobuild="" seq_tiny=4096 seq_mla=1024 tests="" level=9
  local mla_model=$src/models/hybrid-mla-mlp.json
  local oracle_model=$src/models/tiny-hybrid-gpu.json
  build=$(cd "$1" 2>/dev/null && pwd) || die "no build folder '$1'"
  out=$2; shift 2
  while [ $# -gt 0 ]; do
    case $1 in
      --no-build) nobuild=1 ;;
      --seq) [ $# -ge 2 ] || die "--seq needs a value"
             seq_tiny=$2; seq_mla=$2; shift ;;
      --tests) [ $# -ge 2 ] || die "--tests needs a regex"; tests=$2; shift ;;
      --xz-level) [ $# -ge 2 ] || die "--xz-level needs 0-9"; level=$2; shift ;;
      --mla-model) [ $# -ge 2 ] && [ -f "$2" ] || die "--mla-model needs a model config file"
                   mla_model=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift ;;
      --oracle-model) [ $# -ge 2 ] && [ -f "$2" ] || die "--oracle-model needs a model config file"
                      oracle_model=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift ;;
      *) die "pack: unknown option '$1'" ;;
    esac
    shift
  done
  [ -f "$build/CMakeCache.txt" ] || die "'$build' is not a CMake build folder (no CMakeCache.txt)"
  local cuda; cuda=$(sed -n 's/^ACTPLACE_ENABLE_CUDA:[A-Z]*=//p' "$build/CMakeCache.txt")
  echo "pack: $build (ACTPLACE_ENABLE_CUDA=${cuda:-unset})"
  [ "$cuda" = ON ] || echo "pack: warning: $build is not a CUDA build; its binaries run only with --device host"

  # The GPU tests: ctest's own commands, label gpu.
  local tsv; tsv=$(mktemp)
  ctest --test-dir "$build" -N -L gpu ${tests:+-R "$tests"} \
      --show-only=json-v1 | python3 -c '
import json, os, shlex, sys
for t in json.load(sys.stdin)["tests"]:
    cmd = t["command"]
    print("\t".join([t["name"], cmd[0], shlex.join(cmd[1:])]))
' > "$tsv" || die "ctest --show-only failed in $build"
  [ -s "$tsv" ] || die "no ctest with label gpu${tests:+ matching '$tests'} in $build"
  local tool_targets=(actplace-compile actplace-import)
  if [ -z "$nobuild" ]; then
    local targets; targets=$(cut -f2 "$tsv" | xargs -n1 basename | sort -u)
    echo "pack: ninja ${tool_targets[*]} $(echo $targets)"
    ninja -C "$build" "${tool_targets[@]}" $targets || die "ninja failed in $build"
  fi
  local compile=$build/bin/actplace-compile import=$build/bin/actplace-import
  [ -x "$compile" ] && [ -x "$import" ] || die "no $compile or $import (build them, or drop --no-build)"

  local stage; stage=$(mktemp -d)
  # shellcheck disable=SC2064  # the folder is known now
  trap "rm -rf '$stage'" EXIT
  local b=$stage/gpu-check
  mkdir -p "$b/bin" "$b/test/e2e" "$b/tools/scripts" "$b/tools/torchref" "$b/arms"
  cp "$src/tools/scripts/gpu-check.sh" "$b/tools/scripts/"
  cp "$src"/test/e2e/{gpu_bitident,gpu_checkpoint,gpu_data_parallel,gpu_tensor_parallel,grad_oracle,e2echeck}.py "$b/test/e2e/"
  cp "$src"/tools/torchref/*.py "$b/tools/torchref/"

  : > "$b/tests.tsv"
  local name exe argv
  while IFS=$'\t' read -r name exe argv; do
    [ -x "$exe" ] || die "test $name: no binary $exe (build it, or drop --no-build)"
    [ -e "$b/bin/$(basename "$exe")" ] || strip -o "$b/bin/$(basename "$exe")" "$exe" ||
      die "strip $exe failed"
    printf '%s\t%s\t%s\n' "$name" "$(basename "$exe")" "$argv" >> "$b/tests.tsv"
  done < "$tsv"
  rm -f "$tsv"
  # The test binaries link the runtime and kernels as shared libraries
  # (test/unit/CMakeLists.txt: one copy in the bundle, not one per binary);
  # lib/ gets every libactplace library they need, directly or through
  # another, where their RUNPATH $ORIGIN/../lib looks.
  mkdir -p "$b/lib"
  local lib todo
  todo=$(actplace_needed "$b"/bin/*)
  while [ -n "$todo" ]; do
    for lib in $todo; do
      [ -f "$build/lib/$lib" ] || die "a test binary needs $lib, not in $build/lib (build it, or drop --no-build)"
      strip -o "$b/lib/$lib" "$build/lib/$lib" || die "strip $build/lib/$lib failed"
    done
    todo=$(for lib in $(actplace_needed "$b"/lib/*); do [ -e "$b/lib/$lib" ] || echo "$lib"; done)
  done
  echo "pack: $(wc -l < "$b/tests.tsv") GPU tests, $(ls "$b/bin" | wc -l) binaries, $(ls "$b/lib" | wc -l) shared libraries ($(du -ch "$b"/lib/* 2>/dev/null | tail -1 | cut -f1))"

  local arm armflags=()
  # Each tiny arm also built from its readable C++ (cpp-NAME): the LLVM
  # path and the C++ path give the same bits.
  for arm in "${TINY_ARMS[@]}"; do armflags+=(--arm "$arm" --cpp-arm "${arm%%=*}"); done
  # And one arm whose grad norm and AdamW update are kernelgen's
  # (--kernels=auto with only those measured faster): they keep the kernel
  # library's order and operations, so this arm too has the baseline's bits.
  echo '{"generatedKernelRatio": {"train.finalize_grads": 0.5, "train.adamw": 0.5}}' \
    > "$stage/exact-ops.json"
  armflags+=(--arm "norm+adamw-generated=--kernels=auto --profile=$stage/exact-ops.json")
  python3 "$src/test/e2e/gpu_bitident.py" build --compile "$compile" \
      --model "$src/models/tiny-hybrid-gpu.json" --dir "$b/arms/tiny" \
      --seq "$seq_tiny" --micro-batches 4 "${armflags[@]}" || die "tiny-hybrid-gpu arms failed"
  armflags=()
  for arm in "${GEN_ARMS[@]}"; do armflags+=(--arm "$arm"); done
  python3 "$src/test/e2e/gpu_bitident.py" build --compile "$compile" \
      --model "$src/models/tiny-hybrid-gpu.json" --dir "$b/arms/gen" \
      --seq "$seq_tiny" --micro-batches 4 "${armflags[@]}" || die "generated-kernel arms failed"
  armflags=()
  for arm in "${PACKED_ARMS[@]}"; do armflags+=(--arm "$arm"); done
  python3 "$src/test/e2e/gpu_bitident.py" build --compile "$compile" \
      --model "$src/models/tiny-hybrid-gpu.json" --dir "$b/arms/packed" \
      --seq "$seq_tiny" --micro-batches 4 "${armflags[@]}" || die "packed-sequence arms failed"
  armflags=()
  for arm in "${MLA_ARMS[@]}"; do armflags+=(--arm "$arm"); done
  python3 "$src/test/e2e/gpu_bitident.py" build --compile "$compile" \
      --model "$mla_model" --dir "$b/arms/mla" \
      --seq "$seq_mla" --micro-batches 2 "${armflags[@]}" || die "$(basename "$mla_model") arms failed"
  python3 "$src/test/e2e/gpu_data_parallel.py" build --compile "$compile" \
      --model "$src/models/tiny-hybrid-gpu.json" --dir "$b/arms/dp" \
      --seq "$seq_tiny" > /dev/null || die "data-parallel arms failed"
  python3 "$src/test/e2e/gpu_tensor_parallel.py" build --compile "$compile" \
      --model "$src/models/tiny-hybrid-gpu.json" --dir "$b/arms/tp" \
      --seq "$seq_tiny" > /dev/null || die "tensor-parallel arms failed"
  python3 "$src/test/e2e/grad_oracle.py" --build-only --dtype bf16 \
      --import-tool "$import" --compile "$compile" \
      --model "$oracle_model" --work "$stage/grad" || die "bf16 oracle step failed to build"
  mkdir -p "$b/grad" && strip -o "$b/grad/train-bf16" "$stage/grad/train-bf16" || die "strip train-bf16 failed"
  cp "$oracle_model" "$b/grad/model.json"

  {
    echo "source: $(git -C "$src" describe --always --dirty 2>/dev/null || echo unknown)"
    echo "build: $build (ACTPLACE_ENABLE_CUDA=${cuda:-unset})"
    echo "packed: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo "seq: tiny-hybrid-gpu $seq_tiny, $(basename "$mla_model" .json) $seq_mla; oracle $(basename "$oracle_model" .json)"
  } > "$b/MANIFEST"

  mkdir -p "$(dirname "$out")"
  tar -C "$stage" -cf - gpu-check | xz -"$level" -T2 > "$out" || die "tar/xz into $out failed"
  local size; size=$(stat -c %s "$out")
  echo "pack: $(du -sh "$b" | cut -f1) unpacked"
  rm -rf "$stage"
  if [ "$size" -gt "$LIMIT_BYTES" ]; then
    rm -f "$out"
    die "bundle $out is $size bytes, over the 48 MiB limit ($LIMIT_BYTES bytes); removed"
  fi
  echo "pack: wrote $out: $size bytes ($((size / 1024)) KiB, limit $LIMIT_BYTES)"
  echo "then: copy it to the GPU machine, tar xJf $(basename "$out"), gpu-check/tools/scripts/gpu-check.sh run gpu-check"
}

run() {
  [ $# -ge 1 ] || die "usage: gpu-check.sh run BUNDLE_DIR [--device cuda|host] [--log FILE]"
  local bundle device=cuda log=""
  bundle=$(cd "$1" 2>/dev/null && pwd) || die "no bundle folder '$1'"
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --device) [ $# -ge 2 ] || die "--device needs cuda or host"; device=$2; shift ;;
      --log) [ $# -ge 2 ] || die "--log needs a file"; log=$2; shift ;;
      *) die "run: unknown option '$1'" ;;
    esac
    shift
  done
  case $device in cuda|host) ;; *) die "--device '$device': expected cuda or host" ;; esac
  [ -f "$bundle/tests.tsv" ] && [ -f "$bundle/MANIFEST" ] ||
    die "'$bundle' is not an unpacked gpu-check bundle (no tests.tsv / MANIFEST)"
  log=${log:-$bundle/gpu-check.log}
  local work=$bundle/work
  rm -rf "$work" && mkdir -p "$work"
  # Everything from here on goes to the terminal and the log; the end of
  # run waits for tee, so the log is whole when the script exits.
  exec 3>&1 4>&2 > >(tee "$log") 2>&1
  local tee_pid=$!
  local start=$SECONDS results=() failed=0

  local t0=$SECONDS
  part() {  # part NAME STATUS DETAIL
    results+=("gpu-check: $2 $1${3:+ ($3)}, $((SECONDS - t0)) s")
    [ "$2" = FAIL ] && failed=1
    echo "== $2 $1${3:+ ($3)}, $((SECONDS - t0)) s"
    t0=$SECONDS
  }
  # A check that could not run: skipped on host, failed on the GPU machine.
  skipped() { if [ "$device" = cuda ]; then part "$1" FAIL "skipped on the GPU machine: $2"; else part "$1" SKIP "$2"; fi; }

  echo "gpu-check run: $bundle on --device $device, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname)"
  sed 's/^/  /' "$bundle/MANIFEST"
  echo "== device"
  if [ "$device" = cuda ]; then
    if nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; then
      part device PASS "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    else
      part device FAIL "nvidia-smi failed: no usable GPU"
    fi
  else
    part device PASS "host backend self-test, $(uname -m)"
  fi

  echo "== GPU unit tests"
  local name exe argv rc npass=0 nskip=0 nfail=0 missing foreign libdir
  libdir=$(cd "$bundle/lib" 2>/dev/null && pwd -P)
  while IFS=$'\t' read -r name exe argv; do
    missing=$(ldd "$bundle/bin/$exe" 2>/dev/null | awk '/not found/ {print $1}' | xargs)
    if [ -n "$missing" ]; then
      echo "FAIL: $name: libraries not found: $missing"; nfail=$((nfail + 1)); continue
    fi
    # The runtime and kernels must be the bundle's own (lib/), not a build
    # tree's that happens to sit at the path the binary was linked in.
    foreign=$(ldd "$bundle/bin/$exe" 2>/dev/null | while read -r lib _ path _; do
      case $lib in libactplace*) [ "$(realpath -- "$path")" = "$libdir/$lib" ] || echo "$lib=$path" ;; esac
    done | xargs)
    if [ -n "$foreign" ]; then
      echo "FAIL: $name: libraries from outside $libdir: $foreign"; nfail=$((nfail + 1)); continue
    fi
    mkdir -p "$work/tests/$name"
    if [[ $name == *_ranks_* ]] && [ "$device" = cuda ]; then
      # Multi-rank NCCL: one process per GPU, launched torchrun-style on two
      # GPUs; a one-GPU machine cannot run it (said, counted as skipped).
      local ngpu; ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
      if [ "$ngpu" -lt 2 ]; then
        echo "  $name: skipped (needs 2 GPUs, this machine has $ngpu)"
        nskip=$((nskip + 1)); continue
      fi
      echo "$ 2 ranks: $exe"
      local r pids=()
      for r in 0 1; do
        (cd "$work/tests/$name" && RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 \
           MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 timeout 300 "$bundle/bin/$exe") \
          > "$work/tests/$name.rank$r" 2>&1 &
        pids+=($!)
      done
      rc=0
      for r in 0 1; do wait "${pids[$r]}" || rc=$?; done
      cat "$work/tests/$name.rank0" "$work/tests/$name.rank1" > "$work/tests/$name.out"
    else
      echo "$ $exe $argv"
      # shellcheck disable=SC2086  # argv is ctest's own word list
      (cd "$work/tests/$name" && eval timeout 300 "\"$bundle/bin/$exe\"" $argv) \
          > "$work/tests/$name.out" 2>&1
      rc=$?
    fi
    tail -4 "$work/tests/$name.out" | sed 's/^/  /'
    # A binary that exits 0 with every test skipped did not run (older
    # binaries, or a main without gtest_skip_main.cpp): treated as exit 77.
    # On the GPU machine one skipped test is already a failure.
    local nskipped; nskipped=$(grep -c '^\[  SKIPPED \] .* ([0-9]* ms)$' "$work/tests/$name.out")
    if [ $rc -eq 0 ] && grep -q '^\[  PASSED  \] 0 tests' "$work/tests/$name.out"; then rc=77; fi
    if [ $rc -eq 0 ] && [ "$nskipped" -gt 0 ] && [ "$device" = cuda ]; then
      echo "FAIL: $name: $nskipped tests skipped on the GPU machine"
      grep '^\[  SKIPPED \] .* ([0-9]* ms)$' "$work/tests/$name.out" | head -5
      nfail=$((nfail + 1)); continue
    fi
    if [ $rc -eq 0 ]; then echo "  $name: passed"; npass=$((npass + 1))
    elif [ $rc -eq 77 ] && [ "$device" = host ]; then echo "  $name: skipped"; nskip=$((nskip + 1))
    else echo "FAIL: $name exited $rc$([ $rc -eq 77 ] && echo ' (skipped: no GPU seen)')"
         tail -40 "$work/tests/$name.out"; nfail=$((nfail + 1)); fi
  done < "$bundle/tests.tsv"
  local counts="$npass passed, $nskip skipped, $nfail failed"
  if [ $nfail -gt 0 ]; then part unit-tests FAIL "$counts"
  elif [ $npass -eq 0 ]; then skipped unit-tests "$counts"
  else part unit-tests PASS "$counts"; fi

  local model
  for model in tiny mla gen packed; do
    echo "== bit identity across placements: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"])' "$bundle/arms/$model/arms.json")"
    if python3 "$bundle/test/e2e/gpu_bitident.py" run --dir "$bundle/arms/$model" \
        --steps 3 --device "$device" --out "$work/bit-$model"; then
      part "bitident-$model" PASS "$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["arms"]))' "$bundle/arms/$model/arms.json") placements, 3 steps"
    else
      part "bitident-$model" FAIL
    fi
  done

  echo "== checkpoint save/resume"
  if python3 "$bundle/test/e2e/gpu_checkpoint.py" --dir "$bundle/arms/tiny" \
      --arm gdn_core_attn --other none --device "$device" --work "$work/checkpoint"; then
    part checkpoint PASS "resume bitwise, also under another placement; --lr 1e300 exit 3"
  else
    part checkpoint FAIL
  fi

  # ranks_part NAME SCRIPT ARMS GPUS LABEL WHAT: a multi-rank check of
  # prebuilt binaries (SCRIPT run over arms/ARMS). NCCL with a GPU per rank
  # (GPUS ranks); with fewer GPUs NCCL refuses two ranks on one, so the
  # collectives go through MPI on staged device buffers (bits and peaks, not
  # speed).
  ranks_part() {
    local name=$1 script=$2 arms=$3 need=$4 label=$5 what=$6
    if ! command -v mpirun > /dev/null; then
      skipped "$name" "no mpirun"
      return
    fi
    local comm=auto ngpus=0
    if [ "$device" = cuda ]; then
      ngpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
      [ "$ngpus" -lt "$need" ] && comm=mpi-staged
    fi
    if python3 "$bundle/test/e2e/$script" run --dir "$bundle/arms/$arms" \
        --work "$work/$arms" --device "$device" --comm "$comm"; then
      part "$name" PASS "$label--comm $comm: $what"
    else
      part "$name" FAIL "--comm $comm"
    fi
  }
  echo "== data parallel: 2 ranks"
  ranks_part data-parallel gpu_data_parallel.py dp 2 "2 ranks, " \
    "ranks identical, offload bitwise, one rank within the bound"
  echo "== tensor parallel: 2 and 4 ranks"
  ranks_part tensor-parallel gpu_tensor_parallel.py tp 4 "" \
    "TP 2 (+ SP) within the bf16 bound of one rank, placement bitwise per rank, TP 2 x PP 2 x SP against TP 2 x SP"

  echo "== bf16 step against the PyTorch oracle"
  local py=""
  for cand in ${ACTPLACE_TORCH_PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$cand" > /dev/null && "$cand" -c "import torch" 2> /dev/null; then py=$cand; break; fi
  done
  if [ -z "$py" ]; then
    skipped grad-oracle "no python3 imports torch (set ACTPLACE_TORCH_PYTHON)"
  else
    "$py" "$bundle/test/e2e/grad_oracle.py" --binary "$bundle/grad/train-bf16" \
        --dtype bf16 --device "$device" --model "$bundle/grad/model.json" \
        --work "$work/grad"
    rc=$?
    if [ $rc -eq 0 ]; then part grad-oracle PASS "bf16 on $device vs float64 torch, bounds in grad_oracle.py BF16_BOUNDS"
    elif [ $rc -eq 77 ]; then skipped grad-oracle "oracle skipped"
    else part grad-oracle FAIL; fi
  fi

  echo
  printf '%s\n' "${results[@]}"
  local verdict=PASS; [ $failed -eq 0 ] || verdict=FAIL
  echo "gpu-check: $verdict on $device in $((SECONDS - start)) s; log $log"
  exec 1>&3 2>&4 3>&- 4>&-
  wait "$tee_pid"
  return $failed
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) die "usage: gpu-check.sh pack BUILD_DIR OUT.tar.xz [options] | run BUNDLE_DIR [--device cuda|host] [--log FILE]" ;;
esac
