"""Qwen3.5-0.8B training under several placements: the benchmark harness.

Three steps, each its own command:

  build  (here, needs the compiler)  compiles every arm with actplace-compile
         from the CUDA build (build-bench): a stripped binary (xz), the JSON
         placement report, the memory-timeline SVG and the compile output,
         plus manifest.json (commit, shape, model FLOPs), into one carry
         folder (default gpu-carry/qwen-bench).
  run    (on the GPU machine; python3 only, no compiler)  each arm runs
         WARMUP + STEPS steps in a fresh process, arms alternated over
         ROUNDS so that drift hits all of them; raw metrics JSONL (every line
         tagged with the commit), the process log and the carry's reports,
         SVGs and manifest go to --out (e.g. $OUT/qwen-bench).
  table  (here)  one table from a run folder: step time (median, range),
         tokens/s, MFU, planned vs measured device peak, pinned pool,
         bytes moved each way, predicted vs measured exposed transfer time.
  calibrate (here)  fits the cost model to a run: opScale from kernel
         times (--op-times: the run's op-times.json, which `run` writes with
         the no-placement binary's --op-times; --op-scale: a hand table),
         computeScale for the other ops from the no-placement arm,
         copySlowdownPerByte from the offload-only arms;
         writes a device profile (actplace-compile --profile, pass option
         profile=).
  predict (here)  the run's reports again under a profile, into a copy of
         the run folder, so that `table` compares measured steps with the
         calibrated predictions (the arms with recompute are the held-out
         check).
  check  (on the GPU machine)  bit identity and stability: each arm
         STEPS steps (--fingerprints: SHA-256 of loss, grads, params and
         optimizer compared with the first arm's at every step); finite
         losses and grad norms, pinned pool constant and empty after every
         step, device peak constant; exit status 1 on a violation.
  overlap (here)  from the timelines `run --timeline` writes: each compute
         kernel of an arm against the same launch of the no-placement arm,
         split by whether side-stream work ran beside it; what the side
         stream costs the compute stream, op by op.
  frontier (here)  predicted activation-peak cut and step-time cost of
         recompute sets (every other leaf offloaded) under a profile,
         reports only: which placements to measure next; --leaf-costs:
         each leaf's predicted recompute time per GB it spares.

  bench/qwen_train_bench.py build [--model M --seq N --micro-batches K]
  bench/qwen_train_bench.py run --carry gpu-carry/qwen-bench --out DIR
  bench/qwen_train_bench.py table DIR [--save]   (--save: the run's compact
                                               summary to bench/notes/runs/
                                               qwen-bench-DATE-COMMIT.md)

Raw run folders stay local; a run commits its summary (bench/NOTES.md).
The arms are data (arms.json); the module names they use are checked
against the compiler's own listing (actplace-import --list-modules).

Measured exposed transfer time of an arm = its median step time minus the
no-offload arm's median; predicted = the cost model's step time with the
placement minus without it (report totals; includes recompute), and the
stall part alone (exposed transfer per microbatch x microbatches).

Model FLOPs (MFU): counted from the config, matmul FLOPs only (2 per
multiply-add), per token of forward, T = sequence length:
  GDN layer  2 D (2 Hk dk + 2 Hv dv + 2 Hv) + 2 Hv dv D     projections
             + 2 Kc (2 Hk dk + Hv dv)                       short conv
             + 6 Hv dk dv                                   recurrence (S^T k,
                                                            k u^T, S^T q)
  attention  2 D (H hd (2 if output gate) + 2 Hkv hd) + 2 H hd D
             + 4 H hd (T + 1) / 2                           causal QK^T, PV
  MLA        2 D q_lora + 2 q_lora H (dn + dr) (or 2 D H (dn + dr))
             + 2 D (kv_lora + dr) + 2 kv_lora H (dn + dv) + 2 H dv D
             + 2 H (dn + dr + dv) (T + 1) / 2
  MLP        6 D I
  LM head    2 D V (tied; the embedding lookup counts 0)
training = 3 x forward (backward = 2 x forward; recompute not counted);
MFU = training FLOPs per step / step time / peak, peak 989.5 TFLOP/s
(H200 SXM dense BF16, datasheet; --peak-tflops to change).
"""
