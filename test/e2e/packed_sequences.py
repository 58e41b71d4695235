#!/usr/bin/env python3
#===- packed_sequences.py - documents packed into one sequence -----------===#
#
# actplace-compile --document-separator ID: several documents per sequence,
# each ending with the separator token; the GDN state, the short conv, RoPE
# positions and attention restart after it, and the separator's next-token
# label is not trained on. Checks, host backend, tiny hybrid (GDN, gated
# attention and MLA layers), 2 steps:
#
#   rows       one 16-token sequence holding two 8-token documents trains
#              bit for bit as two 8-token rows of the same tokens (loss,
#              gradients, parameters, optimizer state every step); also
#              with --kernels=generated (the generated RoPE restarts its
#              positions at each document)
#   separated  the same packed data through a binary without a separator
#              gives other bits (the documents did see each other there)
#   inert      on data without the separator the packed binary is bitwise
#              the one without --document-separator
#   placement  with gdn_core_attn and core_attn offloaded and gdn_prep and
#              qkv_linear recomputed the packed run is bitwise unchanged
#   ranks      (with --mpirun) 2 data-parallel ranks against one rank of 2
#              microbatches: the loss bitwise, the grad norm within 1e-5
#              (the main grads associate the microbatches' sums
#              differently, data_parallel.py says how); tensor parallel 2
#              with sequence parallelism within 1e-4 of one rank's loss;
#              pipeline parallel 2 (each stage makes the document starts
#              from its own tokens) within 1e-6 of one rank of the same 2
#              microbatches
#   errors     a separator outside the vocabulary
#
#===------------------------------------------------------------------------===#
import argparse
import os
import shutil
import subprocess
import sys

from e2echeck import check, exit_status, run_logged

SEP = 10  # '\n' of the byte-text data (the tiny model's vocabulary is 256)
STEPS = 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--mpirun", default="")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    path = lambda *p: os.path.join(args.work, *p)

    def compile_(name, *flags, expect_ok=True):
        cmd = [args.compile, args.model, "-o", path(name)] + list(flags)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if expect_ok and r.returncode != 0:
            print(r.stdout + r.stderr)
            print("FAIL: " + " ".join(cmd))
            sys.exit(1)
        return path(name), r

    def train(binary, data, tag, ranks=1):
        metrics = path(tag + ".jsonl")
        cmd = [binary, "--device", "host", "--steps", str(STEPS), "--data",
               "text:" + data, "--fingerprints", "--metrics", metrics]
        if ranks > 1:
            cmd = [args.mpirun, "-np", str(ranks), "--oversubscribe",
                   "--allow-run-as-root", "--bind-to", "none"] + cmd
        r = run_logged(cmd, args.work)
        check(r.returncode == 0, "%s: the run failed" % tag)
        if not os.path.exists(metrics):
            return []
        import json
        with open(metrics) as f:
            return [json.loads(l) for l in f if l.strip()]

    # The byte text is one stream; a step of T = 16 reads its window of 17
    # bytes [16 s, 16 s + 16] (the last one is the last token's label).
    # Step s holds document A (7 bytes and the separator) and document B
    # (8 bytes). The rows binary (T = 8, two rows a step) reads the same
    # bytes as the windows [16 s, 16 s + 8] and [16 s + 8, 16 s + 16]: A
    # with the separator's label (B's first byte, ignored in both) and B.
    # Two windows a step for the 2-microbatch and 2-rank binaries.
    packed_bytes, plain_bytes = bytearray(), bytearray()
    for s in range(2 * STEPS):
        a = [(37 * i + 11 * s + 3) % 256 for i in range(7)]
        b = [(53 * i + 17 * s + 5) % 256 for i in range(8)]
        a = [x if x != SEP else 11 for x in a]
        b = [x if x != SEP else 12 for x in b]
        packed_bytes += bytes(a + [SEP] + b)
        plain_bytes += bytes(a + [13] + b)
    packed_bytes.append(42)
    plain_bytes.append(42)
    for name, data in (("packed.txt", packed_bytes), ("plain.txt", plain_bytes)):
        with open(path(name), "wb") as f:
            f.write(data)

    one = ["--micro-batch-size", "1", "--micro-batches", "1"]
    sep = ["--document-separator", str(SEP)]
    packed, _ = compile_("packed", "--seq", "16", *one, *sep)
    rows, _ = compile_("rows", "--seq", "8", "--micro-batch-size", "2",
                       "--micro-batches", "1", *sep)
    plain, _ = compile_("plain", "--seq", "16", *one)
    placed, _ = compile_("placed", "--seq", "16", *one, *sep,
                         "--offload-modules=gdn_core_attn,core_attn",
                         "--recompute-modules=gdn_prep,qkv_linear",
                         "--hide-rule=off")

    def same(tag, x, y, equal=True):
        check(len(x) == STEPS and len(y) == STEPS,
              "%s: %d and %d metrics lines, expected %d" %
              (tag, len(x), len(y), STEPS))
        for a, b in zip(x, y):
            fa, fb = a.get("fingerprints"), b.get("fingerprints")
            if equal:
                check(fa == fb and a["loss"] == b["loss"],
                      "%s: step %d differs:\n  %r %s\n  %r %s" %
                      (tag, a["step"], a["loss"], fa, b["loss"], fb))
            else:
                check(fa["grads"] != fb["grads"],
                      "%s: step %d has equal gradients" % (tag, a["step"]))

    p = train(packed, path("packed.txt"), "packed")
    same("rows", p, train(rows, path("packed.txt"), "rows"))
    print("rows: two documents in one sequence train bitwise as two rows "
          "(losses %s)" % [l["loss"] for l in p], flush=True)
    # The same with the compiler's generated kernels (RoPE's reads the
    # document starts like the library's).
    gen = ["--kernels=generated"]
    packed_gen, _ = compile_("packed-gen", "--seq", "16", *one, *sep, *gen)
    rows_gen, _ = compile_("rows-gen", "--seq", "8", "--micro-batch-size",
                           "2", "--micro-batches", "1", *sep, *gen)
    same("generated rows", train(packed_gen, path("packed.txt"), "packed-gen"),
         train(rows_gen, path("packed.txt"), "rows-gen"))
    print("generated rows: the same with --kernels=generated", flush=True)
    same("separated", p, train(plain, path("packed.txt"), "plain-on-packed"),
         equal=False)
    print("separated: without the separator the same tokens train "
          "differently", flush=True)
    same("inert", train(packed, path("plain.txt"), "packed-on-plain"),
         train(plain, path("plain.txt"), "plain"))
    print("inert: without separators in the data the packed binary is the "
          "plain one bitwise", flush=True)
    on = train(placed, path("packed.txt"), "placed")
    same("placement", p, on)
    for l in on:
        copies = sum(t["d2h_count"] for t in l["transfers"].values())
        check(copies > 0 and l["pinned_pool"]["in_use"] == 0,
              "placement: step %d offloaded %d copies, pinned in use %d" %
              (l["step"], copies, l["pinned_pool"]["in_use"]))
    print("placement: offload and recompute leave the packed run bitwise "
          "unchanged", flush=True)

    if args.mpirun:
        mb2, _ = compile_("mb2", "--seq", "16", "--micro-batch-size", "1",
                          "--micro-batches", "2", *sep)
        dp2, _ = compile_("dp2", "--seq", "16", *one, *sep,
                          "--data-parallel-size=2")
        m = train(mb2, path("packed.txt"), "mb2")
        d = train(dp2, path("packed.txt"), "dp2", ranks=2)
        check(len(m) == STEPS and len(d) == STEPS,
              "ranks (data parallel): %d and %d lines" % (len(m), len(d)))
        for a, b in zip(m, d):
            gn = abs(a["grad_norm"] - b["grad_norm"]) / abs(a["grad_norm"])
            check(a["loss"] == b["loss"] and gn <= 1e-5,
                  "ranks (data parallel): step %d loss %r / %r, grad norm "
                  "%r / %r" % (a["step"], a["loss"], b["loss"],
                               a["grad_norm"], b["grad_norm"]))
        def close(tag, ref, got, loss_bound, norm_bound):
            """got's loss and grad norm within the relative bounds of ref's,
            step by step."""
            check(len(got) == STEPS, "%s: %d lines" % (tag, len(got)))
            for a, b in zip(ref, got):
                rel = abs(a["loss"] - b["loss"]) / abs(a["loss"])
                gn = abs(a["grad_norm"] - b["grad_norm"]) / abs(a["grad_norm"])
                check(rel <= loss_bound and gn <= norm_bound,
                      "%s: step %d loss %r / %r (%.2g), grad norm %r / %r "
                      "(%.2g)" % (tag, a["step"], a["loss"], b["loss"], rel,
                                  a["grad_norm"], b["grad_norm"], gn))

        tp2, _ = compile_("tp2", "--seq", "16", *one, *sep,
                          "--tensor-parallel=2", "--sequence-parallel")
        close("ranks (tensor parallel)", p,
              train(tp2, path("packed.txt"), "tp2", ranks=2), 1e-4, 1e-3)
        # Pipeline parallel 2 (each stage makes the document starts from
        # its own tokens) against one rank of the same 2 microbatches.
        pp2, _ = compile_("pp2", "--seq", "16", "--micro-batch-size", "1",
                          "--micro-batches", "2", *sep,
                          "--pipeline-parallel=2")
        q = train(pp2, path("packed.txt"), "pp2", ranks=2)
        close("ranks (pipeline parallel)", m, q, 1e-6, 1e-5)
        print("ranks: 2 data-parallel ranks as 2 microbatches (loss "
              "bitwise); tensor parallel 2 + SP within 1e-4 of one rank; "
              "pipeline parallel 2 within 1e-6 (losses %s / %s)" %
              ([l["loss"] for l in m], [l["loss"] for l in q]), flush=True)
    else:
        print("ranks: skipped (no mpirun in this build)", flush=True)
    _, r = compile_("bad-sep", "--seq", "16", "--document-separator", "256",
                    expect_ok=False)
    check(r.returncode != 0 and "--document-separator=256: expected a token "
          "id in [0, 256)" in r.stdout + r.stderr,
          "errors: separator 256: rc %d\n%s" % (r.returncode,
                                               r.stdout + r.stderr))
    print("errors: a separator outside the vocabulary is refused",
          flush=True)
    return exit_status("packed sequences")


if __name__ == "__main__":
    sys.exit(main())
