# Checks an exec-plan-memory print-plan listing: buffers whose live ranges
# intersect must not overlap in the arena; offsets and sizes are multiples
# of 256 and lie inside [persistent, persistent + activations). Exits 1 and
# names the first offending pair otherwise.
/^exec-plan-memory:/ {
  for (i = 1; i <= NF; i++) {
    if ($i == "persistent") base = $(i + 1)
    if ($i == "activations") act = $(i + 1)
  }
}
/^buffer / {
  n++; off[n] = $4; sz[n] = $6; lo[n] = $8; hi[n] = $9
  if (off[n] % 256 || sz[n] % 256) { print "unaligned buffer " $2; bad = 1 }
  if (off[n] < base || off[n] + sz[n] > base + act) {
    print "buffer " $2 " outside the activation region"; bad = 1
  }
}
END {
  if (n == 0) { print "no buffers"; exit 1 }
  for (i = 1; i <= n; i++)
    for (j = i + 1; j <= n; j++)
      if (lo[i] <= hi[j] && lo[j] <= hi[i] &&
          off[i] < off[j] + sz[j] && off[j] < off[i] + sz[i]) {
        print "buffers " i - 1 " and " j - 1 " overlap while both live"; bad = 1
      }
  exit bad
}
