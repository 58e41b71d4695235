#!/usr/bin/env bash
#===- dense_bench_ab.sh - dense_bench of two commits, run interleaved ------===#
#
# Here (no GPU needed):
#   bench/dense_bench_ab.sh build BASE [HEAD] [--out DIR]
# builds bench/dense_bench at two commits (HEAD defaults to HEAD), each in
# a git worktree of its own with a kernels-only CUDA build
# (-DACTPLACE_BUILD_COMPILER=OFF; only the two kernel libraries), so each
# binary is its commit's kernels and its commit's benchmark. DIR (default
# build-dense-ab) then holds base/dense_bench, head/dense_bench (stripped),
# their commits in COMMITS and a copy of this script: carry DIR to the GPU
# machine.
#
# There:
#   DIR/dense_bench_ab.sh run DIR [SAMPLES] [-- DENSE_BENCH_ARGS...]
# runs the two binaries alternately, SAMPLES times each (default 5; base
# first in each pair), with DENSE_BENCH_ARGS (default --ce), every line
# prefixed by "== base i" / "== head i" headers; then the median and range
# of each kernel's ms per binary.
#
# Both commits need the dense_bench options asked for (--ce since 7fea17c).
#
#===------------------------------------------------------------------------===#
set -euo pipefail
usage() {
  sed -n '2,/^#===-*===#$/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}
cmd=${1:-}
case "$cmd" in
-h | --help | "")
  usage
  exit 0
  ;;
build)
  shift
  [ $# -ge 1 ] || {
    echo "dense_bench_ab.sh build: expected BASE [HEAD] [--out DIR]" >&2
    exit 2
  }
  root=$(cd "$(dirname "$0")/.." && pwd)
  base=$1
  shift
  head=HEAD
  out=$root/build-dense-ab
  while [ $# -gt 0 ]; do
    case "$1" in
    --out)
      [ $# -ge 2 ] || {
        echo "dense_bench_ab.sh build: --out needs a directory" >&2
        exit 2
      }
      out=$2
      shift 2
      ;;
    -*)
      echo "dense_bench_ab.sh build: unknown option '$1'" >&2
      exit 2
      ;;
    *)
      head=$1
      shift
      ;;
    esac
  done
  mkdir -p "$out"
  : >"$out/COMMITS"
  for side in base head; do
    rev=$base
    [ $side = head ] && rev=$head
    sha=$(git -C "$root" rev-parse --verify --quiet "$rev^{commit}") || {
      echo "dense_bench_ab.sh build: '$rev' is not a commit of $root" >&2
      exit 2
    }
    wt=$(mktemp -d /tmp/dense-ab-$side.XXXXXX)
    echo "== $side: $sha in $wt"
    git -C "$root" worktree add --detach "$wt" "$sha" >/dev/null
    start=$SECONDS
    cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DACTPLACE_BUILD_COMPILER=OFF -DACTPLACE_ENABLE_MPI=OFF \
      -DACTPLACE_ENABLE_TSAN=OFF >"$out/$side.configure.log" 2>&1 || {
      cat "$out/$side.configure.log" >&2
      exit 1
    }
    ninja -C "$wt/build" actplace_kernels_cuda actplace_kernels_reference \
      >"$out/$side.build.log" 2>&1 || {
      tail -40 "$out/$side.build.log" >&2
      exit 1
    }
    sh "$wt/bench/dense_bench.sh" "$wt/build" >/dev/null
    mkdir -p "$out/$side"
    cp "$wt/build/bench/dense_bench" "$out/$side/dense_bench"
    strip "$out/$side/dense_bench"
    echo "$side $sha" >>"$out/COMMITS"
    echo "== $side built in $((SECONDS - start)) s"
    git -C "$root" worktree remove --force "$wt"
  done
  cp "$0" "$out/dense_bench_ab.sh"
  echo "wrote $out: $(du -sh "$out" | cut -f1); on the GPU machine: $(basename "$out")/dense_bench_ab.sh run $(basename "$out")"
  ;;
run)
  shift
  [ $# -ge 1 ] || {
    echo "dense_bench_ab.sh run: expected DIR [SAMPLES] [-- ARGS...]" >&2
    exit 2
  }
  dir=$1
  shift
  samples=5
  if [ $# -ge 1 ] && [ "$1" != "--" ]; then
    samples=$1
    shift
  fi
  [ $# -ge 1 ] && [ "$1" = "--" ] && shift
  args=("$@")
  [ ${#args[@]} -eq 0 ] && args=(--ce)
  for side in base head; do
    [ -x "$dir/$side/dense_bench" ] || {
      echo "dense_bench_ab.sh run: $dir/$side/dense_bench missing (build it here first)" >&2
      exit 2
    }
  done
  [ -f "$dir/COMMITS" ] && cat "$dir/COMMITS"
  log=$(mktemp)
  for i in $(seq 1 "$samples"); do
    for side in base head; do
      echo "== $side $i"
      "$dir/$side/dense_bench" "${args[@]}"
    done
  done | tee "$log"
  python3 - "$log" <<'EOF'
import json, statistics, sys
side, rows = None, {}
for line in open(sys.argv[1]):
    if line.startswith("== "):
        side = line.split()[1]
    elif line.startswith("{") and '"kernel"' in line and side:
        r = json.loads(line)
        rows.setdefault(r["kernel"], {}).setdefault(side, []).append(r["ms"])
print("kernel: base median (range) -> head median (range), ms")
for k, v in rows.items():
    cells = []
    for s in ("base", "head"):
        xs = v.get(s, [])
        cells.append("%.4f (%.4f-%.4f) n=%d" % (statistics.median(xs), min(xs), max(xs), len(xs)) if xs else "-")
    print("%s: %s -> %s" % (k, cells[0], cells[1]))
EOF
  rm -f "$log"
  ;;
*)
  echo "dense_bench_ab.sh: unknown command '$cmd' (expected build or run; --help)" >&2
  exit 2
  ;;
esac
