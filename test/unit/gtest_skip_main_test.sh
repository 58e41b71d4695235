#!/bin/sh
#===- gtest_skip_main_test.sh - exit codes of gtest_skip_main.cpp --------===#
#
# BINARY is a backend-parameterised runtime test binary of a build without
# CUDA (its */cuda variants always skip): only skipped tests -> 77 naming
# them; tests that ran and passed -> 0; a filter matching nothing -> 1.
#
#===----------------------------------------------------------------------===#
binary=$1
fail=0
expect() {
  want=$1
  shift
  out=$("$binary" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL: $binary $* exited $rc, expected $want"
    echo "$out" | tail -5
    fail=1
  fi
  LAST_OUTPUT=$out
}
expect 77 --gtest_filter='*/cuda'
case "$LAST_OUTPUT" in
*"actplace: skipped "*"/cuda: no usable GPU"*"exit code 77 (ctest: Skipped)"*) ;;
*) echo "FAIL: the all-skipped run does not name the skipped tests"; fail=1 ;;
esac
expect 0 --gtest_filter='*/host'
expect 1 --gtest_filter='NoSuchSuite.*'
case "$LAST_OUTPUT" in
*"no test ran (filter 'NoSuchSuite.*' matched none)"*) ;;
*) echo "FAIL: an empty filter is not reported"; fail=1 ;;
esac
[ "$fail" -eq 0 ] && echo "gtest_skip_main: 77 all skipped, 0 ran, 1 none matched"
exit "$fail"
