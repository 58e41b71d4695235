#!/usr/bin/env bash
# Self-test of bench/dense_bench_ab.sh without a GPU or a build: `run` on two
# stand-in binaries (alternation order, the arguments passed, the summary's
# medians and ranges) and the errors of `build` and `run`. Seconds.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ab=$here/dense_bench_ab.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "dense_bench_ab_test: FAIL: $*" >&2
  exit 1
}
# Stand-ins: each call prints its side and the next of its times, and logs
# its arguments.
for side in base head; do
  mkdir -p "$work/ab/$side"
  cat >"$work/ab/$side/dense_bench" <<STUB
#!/bin/sh
n=\$(cat "$work/$side.n" 2>/dev/null || echo 0)
echo \$((n + 1)) > "$work/$side.n"
echo "$side \$*" >> "$work/calls"
case "$side:\$n" in
base:0) ms=3.0 ;; base:1) ms=1.0 ;; base:*) ms=2.0 ;;
head:0) ms=1.5 ;; head:1) ms=0.5 ;; head:*) ms=1.0 ;;
esac
echo "{\"impl\":\"actplace\",\"kernel\":\"ce.fwd_bwd_chunk1024\",\"ms\":\$ms}"
STUB
  chmod +x "$work/ab/$side/dense_bench"
done
printf 'base 1111111\nhead 2222222\n' >"$work/ab/COMMITS"
out=$("$ab" run "$work/ab" 3)
[ "$(cat "$work/calls")" = "$(printf 'base --ce\nhead --ce\nbase --ce\nhead --ce\nbase --ce\nhead --ce')" ] ||
  fail "calls not alternated base, head with --ce: $(cat "$work/calls")"
echo "$out" | grep -qx 'ce.fwd_bwd_chunk1024: 2.0000 (1.0000-3.0000) n=3 -> 1.0000 (0.5000-1.5000) n=3' ||
  fail "summary line missing or wrong:\n$out"
echo "$out" | grep -qx 'base 1111111' || fail "COMMITS not printed"
rm -f "$work/calls" "$work"/*.n
"$ab" run "$work/ab" 1 -- --quick >/dev/null
[ "$(cat "$work/calls")" = "$(printf 'base --quick\nhead --quick')" ] ||
  fail "arguments after -- not passed: $(cat "$work/calls")"
# Errors: exit 2 with a message naming what is wrong.
set +e
msg=$("$ab" run "$work/none" 2>&1)
rc=$?
set -e
[ $rc -eq 2 ] && echo "$msg" | grep -q "$work/none/base/dense_bench missing" ||
  fail "run of a missing folder: rc $rc, '$msg'"
set +e
msg=$("$ab" build no-such-revision --out "$work/b" 2>&1)
rc=$?
set -e
[ $rc -eq 2 ] && echo "$msg" | grep -q "'no-such-revision' is not a commit" ||
  fail "build of an unknown commit: rc $rc, '$msg'"
set +e
msg=$("$ab" frobnicate 2>&1)
rc=$?
set -e
[ $rc -eq 2 ] && echo "$msg" | grep -q "unknown command 'frobnicate'" || fail "unknown command: rc $rc"
"$ab" --help | grep -q "dense_bench_ab.sh build BASE" || fail "--help"
echo "dense_bench_ab_test: PASS"
