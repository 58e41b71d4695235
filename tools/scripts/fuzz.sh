#!/usr/bin/env bash
#===- fuzz.sh - build and run the actplace libFuzzer targets --------------===#
#
# Configures a separate instrumented build (clang-22, ASan + UBSan, libFuzzer;
# -DACTPLACE_ENABLE_FUZZ=ON), builds only the fuzz targets, builds the seed
# corpora from the repository, replays the inputs of past findings
# (fuzz/regressions/TARGET/) and runs each target for a bounded time.
# docs/fuzzing.md explains the targets and how a crash becomes a lit test.
#
#===----------------------------------------------------------------------===#
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
all_targets=(fuzz_config fuzz_ir fuzz_profile)

usage() {
  cat <<EOF
usage: tools/scripts/fuzz.sh [options] [TARGET...]

Builds and runs the libFuzzer targets (docs/fuzzing.md). TARGET is
fuzz_config, fuzz_ir, fuzz_profile (or config, ir, profile) or all
(the default).

  -t, --time SECONDS   fuzzing time per target (default 3600)
  -j, --jobs N         libFuzzer worker processes per target (default 1);
                       more than one implies --keep-going
  -k, --keep-going     do not stop at the first crash: run libFuzzer in fork
                       mode (-fork) ignoring crashes, timeouts and OOMs, so an
                       hour-long run reports every unique crash it finds
  -b, --build DIR      the fuzz build directory (default build-fuzz); it is
                       configured with clang-22 when it has no build.ninja
  -o, --out DIR        corpora, crashes and logs (default DIR/fuzz-out of the
                       build): OUT/corpus/TARGET keeps what a run learned for
                       the next, crashes go to OUT/crashes/TARGET/
  --tools DIR          actplace-import and actplace-opt used to add generated
                       graphs to the fuzz_ir seeds (default: the first of
                       build-cpu/bin, build-test-cpu/bin that has them)
  --timeout SECONDS    one input running longer is a finding (default 30)
  --rss-limit-mb MB    one process using more is a finding (default 4096)
  --no-build           use the fuzz build as it is
  --seeds DIR          only write the seed corpora to DIR/TARGET and exit
  --replay FILE...     run TARGET (exactly one) on the given inputs, with
                       diagnostics and printed output shown, then again with
                       each input against an unreadable page (TARGET-guard),
                       and exit
  --minimize FILE      minimize a crashing input of TARGET (exactly one)
                       into FILE.min and exit
  -h, --help           this text

Before fuzzing a target, TARGET-guard replays fuzz/regressions/TARGET/*
(inputs of past findings); a crash there fails the run.

Progress: one line per target every 30 s (inputs run, inputs/s, corpus size,
crashes); libFuzzer's own log is OUT/logs/TARGET.log. The exit status is 1
when a target found a crash, a timeout or an OOM (the inputs are in
OUT/crashes/TARGET/), 2 on a usage or build error.

Examples:
  tools/scripts/fuzz.sh --time 3600 --keep-going --jobs 2 ir
  tools/scripts/fuzz.sh --time 20 all              # what CI runs
  tools/scripts/fuzz.sh --replay fuzz-out/crashes/fuzz_ir/crash-1234 ir
EOF
}

die() {
  echo "fuzz.sh: $*" >&2
  exit 2
}

time_per_target=3600
jobs=1
keep_going=0
build="$root/build-fuzz"
out=""
tools=""
timeout=30
rss_limit=4096
do_build=1
seeds_only=""
mode=run
files=()
targets=()
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    -t|--time) time_per_target=${2:?--time needs seconds}; shift ;;
    -j|--jobs) jobs=${2:?--jobs needs a number}; shift ;;
    -k|--keep-going) keep_going=1 ;;
    -b|--build) build=${2:?--build needs a directory}; shift ;;
    -o|--out) out=${2:?--out needs a directory}; shift ;;
    --tools) tools=${2:?--tools needs a directory}; shift ;;
    --timeout) timeout=${2:?--timeout needs seconds}; shift ;;
    --rss-limit-mb) rss_limit=${2:?--rss-limit-mb needs megabytes}; shift ;;
    --no-build) do_build=0 ;;
    --seeds) seeds_only=${2:?--seeds needs a directory}; shift ;;
    --replay) mode=replay ;;
    --minimize) mode=minimize; files+=("${2:?--minimize needs a file}"); shift ;;
    all) targets+=("${all_targets[@]}") ;;
    config|ir|profile) targets+=("fuzz_$1") ;;
    fuzz_config|fuzz_ir|fuzz_profile) targets+=("$1") ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *)
      if [ "$mode" = replay ]; then
        files+=("$1")
      else
        die "unknown target '$1': expected one of ${all_targets[*]} or all"
      fi ;;
  esac
  shift
done
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
for n in "$time_per_target" "$jobs" "$timeout" "$rss_limit"; do
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -gt 0 ] || die "expected a positive integer, got '$n'"
done
[ "$jobs" -gt 1 ] && keep_going=1

#--- seed corpora -----------------------------------------------------------#

# Writes the sections of split-file input $1 ("//--- name" or "#--- name")
# whose name ends in $2 into directory $3, named after the file and section.
split_sections() {
  awk -v ext="$2" -v dir="$3" -v base="$(basename "$1")" '
    /^(\/\/|#)--- / { name = $2; keep = (substr(name, length(name) - length(ext) + 1) == ext)
                      if (keep) file = dir "/" base "." name; next }
    keep { print > file }' "$1"
}

# Writes each `// -----` chunk of .mlir file $1 into directory $2.
split_chunks() {
  awk -v dir="$2" -v base="$(basename "$1")" '
    BEGIN { n = 0; file = dir "/" base "." n }
    /^\/\/ -----/ { close(file); n++; file = dir "/" base "." n; next }
    /^\/\/ RUN:/ { next }
    { print > file }' "$1"
}

find_tools() {
  if [ -n "$tools" ]; then
    echo "$tools"
    return
  fi
  local d
  for d in "$root/build-cpu/bin" "$root/build-test-cpu/bin"; do
    if [ -x "$d/actplace-import" ] && [ -x "$d/actplace-opt" ]; then
      echo "$d"
      return
    fi
  done
}

# Builds the seed corpus of target $1 in directory $2.
make_seeds() {
  local target=$1 dir=$2 f tmp
  mkdir -p "$dir"
  tmp=$(mktemp -d)
  case $target in
    fuzz_config)
      cp "$root"/models/*.json "$dir/"
      for f in "$root"/test/tools/actplace-import/*.test; do
        split_sections "$f" .json "$dir"
      done ;;
    fuzz_profile)
      find "$root/bench/profiles" -name '*.json' -exec cp {} "$tmp/" \;
      for f in $(grep -rlE '^(//|#)--- .*\.json' "$root/test"); do
        split_sections "$f" .json "$tmp"
      done
      # Keep profiles, drop the model configs that tests carry too.
      for f in "$tmp"/*; do
        grep -q '"hidden_size"' "$f" || cp "$f" "$dir/"
      done ;;
    fuzz_ir)
      for f in $(find "$root/test" -name '*.mlir'); do
        if grep -qE '^(//|#)--- ' "$f"; then
          split_sections "$f" .mlir "$dir"
        else
          split_chunks "$f" "$dir"
        fi
      done
      for f in $(grep -rlE '^(//|#)--- .*\.mlir' "$root/test" --include='*.test'); do
        split_sections "$f" .mlir "$dir"
      done
      local bin
      bin=$(find_tools)
      if [ -n "$bin" ]; then
        # Forward graphs, steps, placed steps and exec modules of the small
        # models: the inputs the passes see in real use.
        # The packed form (tiny-hybrid+packed: --document-separator) adds
        # train.doc_starts and the ops that read it.
        local m name import_flags
        for m in tiny-hybrid tiny-qwen3.5 hybrid-mla-mlp tiny-hybrid+packed; do
          name=$dir/gen.$m
          import_flags=()
          if [ "${m%+packed}" != "$m" ]; then
            import_flags=(--document-separator 10)
            m=${m%+packed}
          fi
          # (Warnings about modules a model lacks go to the log.)
          { "$bin/actplace-import" "$root/models/$m.json" --seq 64 --micro-batches 2 "${import_flags[@]}" -o "$name.forward.mlir" &&
            "$bin/actplace-opt" "$name.forward.mlir" -train-autodiff -o "$name.step.mlir" &&
            "$bin/actplace-opt" "$name.step.mlir" \
              '-train-placement-pipeline=offload-modules=gdn_core_attn,core_attn,mlp recompute-modules=gdn_norm_out hide-rule=off' \
              -o "$name.placed.mlir" &&
            "$bin/actplace-opt" "$name.placed.mlir" -convert-train-to-exec -o "$name.exec.mlir"; } 2>>"$tmp/gen.log" || {
            echo "fuzz.sh: could not generate the $m seeds with $bin (skipped):" >&2
            tail -3 "$tmp/gen.log" >&2
          }
        done
      else
        echo "fuzz.sh: no actplace-import/actplace-opt found (--tools): fuzz_ir seeds are the test inputs only" >&2
      fi
      # Inputs over the target's size bound only slow the start.
      find "$dir" -type f -size +256k -delete ;;
  esac
  find "$dir" -type f -empty -delete
  rm -rf "$tmp"
}

if [ -n "$seeds_only" ]; then
  for t in "${targets[@]}"; do
    make_seeds "$t" "$seeds_only/$t"
    echo "fuzz.sh: $t: $(ls "$seeds_only/$t" | wc -l) seeds in $seeds_only/$t"
  done
  exit 0
fi

#--- build ------------------------------------------------------------------#

build=$(mkdir -p "$build" && cd "$build" && pwd)
out=${out:-$build/fuzz-out}

if [ "$do_build" = 1 ]; then
  start=$SECONDS
  if [ ! -f "$build/build.ninja" ]; then
    command -v clang++-22 >/dev/null || die "clang++-22 not found (tools/scripts/install-deps.sh installs clang-22 and libclang-rt-22-dev)"
    echo "== fuzz.sh: configuring $build (clang-22, ASan + UBSan, libFuzzer)"
    # -O1, as is usual for fuzzing: fast enough to run, much faster to build.
    CC=clang-22 CXX=clang++-22 cmake -S "$root" -B "$build" -G Ninja \
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS_RELEASE=-O1 -DCMAKE_CXX_FLAGS_RELEASE=-O1 \
      -DACTPLACE_ENABLE_CUDA=OFF -DACTPLACE_ENABLE_FUZZ=ON >"$build.configure.log" 2>&1 || {
      cat "$build.configure.log" >&2
      die "configuring $build failed"
    }
  fi
  echo "== fuzz.sh: building ${targets[*]} in $build"
  ninja -C "$build" -j "${ACTPLACE_JOBS:-$(nproc)}" "${targets[@]}" "${targets[@]/%/-guard}" ||
    die "building the fuzz targets failed"
  echo "== fuzz.sh: build took $((SECONDS - start)) s"
fi
for t in "${targets[@]}"; do
  for b in "$t" "$t-guard"; do
    [ -x "$build/fuzz/$b" ] || die "$build/fuzz/$b is not built (drop --no-build)"
  done
done

# Runs TARGET-guard ($1) on the files $3... with its output to $2: each input
# ends at an unreadable page, so a read past its end crashes whatever the
# heap holds (fuzz/GuardReplay.cpp). The exit status is the replayer's.
guard_replay() {
  local t=$1 log=$2
  shift 2
  timeout "$timeout" "$build/fuzz/$t-guard" "$@" >"$log" 2>&1
}

# Prints the sanitizer report or invariant failure of log $1, with its stack.
print_report() {
  grep -E -A24 '^(==[0-9]+==ERROR|actplace fuzz:)|runtime error' "$1" |
    grep -E '^(==[0-9]+==ERROR|SUMMARY|actplace fuzz:)|runtime error|^ +#[0-9]+ ' | head -30 | sed 's/^/    /' >&2
}

#--- replay / minimize ------------------------------------------------------#

if [ "$mode" != run ]; then
  [ ${#targets[@]} -eq 1 ] || die "--replay and --minimize take exactly one target"
  [ ${#files[@]} -gt 0 ] || die "--replay needs input files"
  t=${targets[0]}
  if [ "$mode" = replay ]; then
    rc=0
    ACTPLACE_FUZZ_VERBOSE=1 "$build/fuzz/$t" -rss_limit_mb="$rss_limit" -timeout="$timeout" "${files[@]}" || rc=$?
    echo "== fuzz.sh: the same inputs against an unreadable page ($t-guard)"
    ACTPLACE_FUZZ_VERBOSE=1 "$build/fuzz/$t-guard" "${files[@]}" || rc=$?
    exit $rc
  else
    f=${files[0]}
    "$build/fuzz/$t" -minimize_crash=1 -max_total_time="$time_per_target" -rss_limit_mb="$rss_limit" \
      -timeout="$timeout" -exact_artifact_path="$f.min" "$f" 2>&1 | tail -5
    echo "fuzz.sh: minimized input in $f.min ($(wc -c <"$f.min") bytes, from $(wc -c <"$f"))"
  fi
  exit
fi

#--- run --------------------------------------------------------------------#

seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT
mkdir -p "$out/logs"
status=0
summary=()
for t in "${targets[@]}"; do
  regressions=("$root/fuzz/regressions/$t"/*)
  if [ -e "${regressions[0]}" ]; then
    log=$out/logs/$t.regressions.log
    if guard_replay "$t" "$log" "${regressions[@]}"; then
      echo "== fuzz.sh: $t: the ${#regressions[@]} inputs of fuzz/regressions/$t pass"
    else
      status=1
      summary+=("$t: an input of fuzz/regressions/$t crashes (log $log)")
      echo "fuzz.sh: $t crashes on an input of fuzz/regressions/$t (log $log):" >&2
      grep '^guarded replay:' "$log" | tail -1 | sed 's/^/  /' >&2
      print_report "$log"
    fi
  fi
  make_seeds "$t" "$seeds/$t"
  corpus=$out/corpus/$t
  crashes=$out/crashes/$t
  log=$out/logs/$t.log
  mkdir -p "$corpus" "$crashes"
  before=$(ls "$crashes" | wc -l)
  flags=(-max_total_time="$time_per_target" -timeout="$timeout" -rss_limit_mb="$rss_limit"
         -artifact_prefix="$crashes/" -print_final_stats=1 -dict="$root/fuzz/${t#fuzz_}.dict")
  if [ "$keep_going" = 1 ]; then
    flags+=(-fork="$jobs" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  fi
  echo "== fuzz.sh: $t for $time_per_target s ($(ls "$seeds/$t" | wc -l) seeds, corpus $corpus, log $log)"
  start=$SECONDS
  "$build/fuzz/$t" "${flags[@]}" "$corpus" "$seeds/$t" >"$log" 2>&1 &
  pid=$!
  # Progress from libFuzzer's status lines ("#N ... corp: C/.. exec/s: E" or,
  # in fork mode, "#N: cov: .. corp: C exec/s: E ..").
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 30); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    kill -0 "$pid" 2>/dev/null || break
    line=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    if [ -z "$line" ]; then
      echo "   $t: $((SECONDS - start)) s: running the seed corpus"
      continue
    fi
    echo "   $t: $((SECONDS - start)) s: $(grep -oE '^#[0-9]+' <<<"$line" | tr -d '#') inputs," \
         "$(grep -oE 'corp: [0-9]+' <<<"$line" | sed 's/corp: /corpus /')," \
         "$(grep -oE 'exec/s: [0-9]+' <<<"$line" | sed 's|exec/s: ||') inputs/s," \
         "crash/timeout/oom inputs $(( $(ls "$crashes" | wc -l) - before ))"
  done
  rc=0
  wait "$pid" || rc=$?
  elapsed=$((SECONDS - start))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  # (A crash among the seeds leaves no status line: no count, and no exit
  # here under `set -e` before the crash is reported.)
  [ -n "$runs" ] || runs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#' || true)
  new=$(( $(ls "$crashes" | wc -l) - before ))
  rate=$(( ${runs:-0} / (elapsed > 0 ? elapsed : 1) ))
  line="$t: ${runs:-0} inputs in $elapsed s ($rate/s), corpus $(ls "$corpus" | wc -l), new crash/timeout/oom inputs: $new"
  summary+=("$line")
  if [ "$new" -gt 0 ] || { [ "$rc" -ne 0 ] && [ "$keep_going" = 0 ]; }; then
    status=1
    echo "fuzz.sh: $t found a problem (exit $rc); the inputs are in $crashes:" >&2
    ls -t "$crashes" | head -"$((new > 0 ? new : 1))" | sed "s|^|  $crashes/|" >&2
    print_report "$log"
    # Replayed against an unreadable page, a read past the input's end
    # crashes whatever the heap held when libFuzzer ran it.
    for f in $(ls -t "$crashes" | head -"$new" | grep '^crash-' || true); do
      if guard_replay "$t" "$out/logs/$t.replay.log" "$crashes/$f"; then
        echo "  $f: does not crash when replayed ($t-guard)" >&2
      else
        echo "  $f: crashes again when replayed ($t-guard, log $out/logs/$t.replay.log):" >&2
        print_report "$out/logs/$t.replay.log"
      fi
    done
    # The crash folder is gone with a CI machine: a small input is printed
    # too, so the log alone reproduces the finding.
    for f in $(ls -t "$crashes" | head -"$new" || true); do
      encoded=$(gzip -9c "$crashes/$f" | base64 -w 100)
      if [ "${#encoded}" -le 65536 ]; then
        echo "  $f, gzip + base64 (save the lines between the markers to F, then: base64 -d F | gunzip > $f):" >&2
        echo "  ----- begin $f" >&2
        echo "$encoded" >&2
        echo "  ----- end $f" >&2
      else
        echo "  $f: ${#encoded} characters gzipped and base64-encoded, not printed" >&2
      fi
    done
    echo "  replay with: tools/scripts/fuzz.sh --no-build --build $build --replay FILE ${t}" >&2
  fi
done
echo "== fuzz.sh: summary"
printf '  %s\n' "${summary[@]}"
exit $status
