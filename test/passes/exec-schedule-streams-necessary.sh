#!/bin/bash
# Minimality check for exec-schedule-streams: deleting any single wait in
# the microbatch loop body of FILE must make the independent race check
# (exec-schedule-streams-check.awk) report an unordered pair. Prints the
# number of waits checked and those that were not needed; exits 1 if any.
# Usage: exec-schedule-streams-necessary.sh FILE.mlir CHECKER.awk TMPFILE
file=$1 checker=$2 tmp=$3
lines=$(awk '/exec.microbatch_loop/{b=1; next} b && /^    }/{b=0} b && /exec\.wait /{print NR}' "$file")
n=0 bad=0
for ln in $lines; do
  n=$((n + 1))
  sed "${ln}d" "$file" > "$tmp"
  if awk -f "$checker" "$tmp" > /dev/null; then
    bad=$((bad + 1))
    echo "not needed: line $ln: $(sed -n "${ln}p" "$file")"
  fi
done
echo "waits in the body: $n, not needed: $bad"
[ "$bad" -eq 0 ]
