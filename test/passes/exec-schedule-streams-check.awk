# An independent race check of an exec-schedule-streams result, on the
# printed IR: builds the happens-before graph of the microbatch loop body
# (program order within a stream; a record is a node on its stream after
# the ops and waits before it; a copy's event is the copy; a wait makes the
# stream's next node follow the recorded node) and checks that every pair
# of ops on different streams touching overlapping device or pinned bytes,
# at least one writing, is ordered by a path. Prints a summary line and
# each unordered pair; exits 1 when one exists.

function root(v) { while (v in viewOf) v = viewOf[v]; return v }

# Adds an access of node n to value v.
function access(n, v, w,    r) {
  r = root(v)
  na[n]++
  if (r in off) { sp[n, na[n]] = space[r]; lo[n, na[n]] = off[r] }
  else { sp[n, na[n]] = "value" r; lo[n, na[n]] = 0 }
  hi[n, na[n]] = lo[n, na[n]] + ((r in size) ? size[r] : 1)
  wr[n, na[n]] = w
}

function node(s, what,    p, i) {
  n++; str[n] = s; desc[n] = what
  if (s in last) { pred[n, ++np[n]] = last[s] }
  for (i = 1; i <= nw[s]; i++) pred[n, ++np[n]] = pw[s, i]
  nw[s] = 0
  last[s] = n
  # Ancestors: union over predecessors.
  for (i = 1; i <= np[n]; i++) {
    p = pred[n, i]
    anc[n, p] = 1
    for (m = 1; m < n; m++) if ((p, m) in anc) anc[n, m] = 1
  }
  return n
}

# Operand names in "ins(%a, %b : ..." style text.
function names(text, arr,    k, parts, i, cnt) {
  sub(/ :.*/, "", text)
  cnt = split(text, parts, /, */)
  k = 0
  for (i = 1; i <= cnt; i++) if (parts[i] ~ /^%/) arr[++k] = parts[i]
  return k
}

{
  line = $0
  if (match(line, /%[0-9a-z_]+ = exec\.(buffer|persistent) .*offset [0-9]+ bytes [0-9]+/)) {
    v = $1
    o = line; sub(/.* offset /, "", o); sub(/ .*/, "", o)
    b = line; sub(/.* bytes /, "", b); sub(/ .*/, "", b)
    off[v] = o + 0; size[v] = b + 0; space[v] = "device"
  }
  if (match(line, /%[0-9a-z_]+ = exec\.pool_acquire /)) {
    v = $1
    o = line; sub(/.* offset /, "", o); sub(/ .*/, "", o)
    b = line; sub(/.* bytes /, "", b); sub(/ .*/, "", b)
    off[v] = o + 0; size[v] = b + 0; space[v] = "pinned"
  }
  if (line ~ /= exec\.view /) { viewOf[$1] = $4 }
  if (line ~ /exec\.microbatch_loop/) { inBody = 1; next }
  if (inBody && line ~ /^    }/) { inBody = 0 }
  if (!inBody) next

  if (line ~ /exec\.kernel /) {
    k = node(line ~ / workspace [0-9]+ on side/ ? "side" : "compute", $0)
    if (match(line, /ins\([^)]*\)/)) {
      t = substr(line, RSTART + 4, RLENGTH - 5); c = names(t, ops)
      for (i = 1; i <= c; i++) access(k, ops[i], 0)
    }
    if (match(line, /outs\([^)]*\)/)) {
      t = substr(line, RSTART + 5, RLENGTH - 6); c = names(t, ops)
      for (i = 1; i <= c; i++) access(k, ops[i], 1)
    }
  } else if (line ~ /exec\.load_input /) {
    k = node("compute", $0); v = line; sub(/.* to /, "", v); sub(/ .*/, "", v)
    access(k, v, 1)
  } else if (line ~ /exec\.(d2h|h2d) /) {
    # exec.d2h %src to %dst on STREAM record %ev : ...
    for (i = 1; i <= NF; i++) {
      if ($i ~ /^exec\.(d2h|h2d)$/) { src = $(i + 1); dst = $(i + 3); s = $(i + 5); ev = $(i + 7) }
    }
    k = node(s, $0)
    access(k, src, 0); access(k, dst, 1)
    evNode[ev] = k
  } else if (line ~ /exec\.all_reduce /) {
    # exec.all_reduce %b over "dp" on STREAM [last_microbatch] : ...
    for (i = 1; i <= NF; i++) if ($i == "exec.all_reduce") { src = $(i + 1); s = $(i + 5) }
    k = node(s, $0)
    access(k, src, 1)
  } else if (line ~ /exec\.(all_gather|reduce_scatter) /) {
    # exec.all_gather %shard into %full over "dp" on STREAM : ... (a
    # reduce-scatter reads the first and writes the second alike)
    for (i = 1; i <= NF; i++)
      if ($i ~ /^exec\.(all_gather|reduce_scatter)$/) { src = $(i + 1); dst = $(i + 3); s = $(i + 7) }
    k = node(s, $0)
    # A reduce-scatter may reduce in place inside its full buffer: a write.
    access(k, src, line ~ /exec\.reduce_scatter /); access(k, dst, 1)
  } else if (line ~ /exec\.zero /) {
    # exec.zero %b on STREAM : ...
    for (i = 1; i <= NF; i++) if ($i == "exec.zero") { src = $(i + 1); s = $(i + 3) }
    k = node(s, $0)
    access(k, src, 1)
  } else if (line ~ /exec\.record /) {
    k = node($4, $0); evNode[$2] = k
  } else if (line ~ /exec\.wait /) {
    if ($2 in evNode) { s = $4; pw[s, ++nw[s]] = evNode[$2] }
  }
}

END {
  conflicts = 0; bad = 0
  for (a = 1; a <= n; a++) for (b = a + 1; b <= n; b++) {
    if (str[a] == str[b] || !na[a] || !na[b]) continue
    hit = 0
    for (i = 1; i <= na[a] && !hit; i++) for (j = 1; j <= na[b] && !hit; j++)
      if (sp[a, i] == sp[b, j] && (wr[a, i] || wr[b, j]) &&
          lo[a, i] < hi[b, j] && lo[b, j] < hi[a, i]) hit = 1
    if (!hit) continue
    conflicts++
    if (!((b, a) in anc)) {
      bad++
      if (bad <= 5) print "unordered:\n  " desc[a] "\n  " desc[b]
    }
  }
  printf "checked %d stream ops, %d cross-stream conflicts, %d unordered\n", n, conflicts, bad
  exit bad > 0
}
