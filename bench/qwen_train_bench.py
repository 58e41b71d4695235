#!/usr/bin/env python3
"""Qwen3.5-0.8B training on the H200 under several placements (issue 8).

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
  bench/qwen_train_bench.py table DIR [--save]   (--save: results, reports,
                                               SVGs, logs and the table to
                                               bench/results/qwen-bench-DATE-COMMIT/)

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
import argparse
import bisect
import contextlib
import io
import json
import lzma
import re
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import typing
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every leaf module (docs/architecture.md section 3), for "offload everything".
ALL_LEAVES = ["attn_norm", "gdn_in_proj", "gdn_prep", "gdn_core_attn",
              "gdn_norm_out", "gdn_out_proj", "qkv_linear", "mla_up_proj",
              "core_attn", "attn_proj", "mlp_norm", "mlp_fc1", "mlp_act",
              "mlp_fc2", "embedding", "final_norm", "lm_head"]
ALIASES = {"mlp": ["mlp_fc1", "mlp_act", "mlp_fc2"],
           "layernorm": ["attn_norm", "mlp_norm", "final_norm"]}
# The most aggressive recompute set the passes accept together with
# offloading every other leaf (largest predicted activation-peak reduction
# of the combinations tried with the placement report, commit 92b55a9:
# 76.7% at +18.6% predicted step time for Qwen3.5-0.8B, seq 4096).
MAX_RECOMPUTE = ["gdn_prep", "gdn_norm_out", "mlp", "layernorm", "core_attn",
                 "qkv_linear"]


def leaves(names):
    out = []
    for n in names:
        out += ALIASES.get(n, [n])
    return out


def recompute_offload_rest(rc):
    """Placement flags: recompute the leaves (or aliases) `rc`, offload every
    other leaf (the hide rule keeps what cannot hide)."""
    return ((["--recompute-modules=" + ",".join(rc)] if rc else []) +
            ["--offload-modules=" + ",".join(
                l for l in ALL_LEAVES if l not in leaves(rc))])


# name -> (actplace-compile placement flags, what it is).
ARMS = {
    "none": ([], "no offload, no recompute"),
    "ref": (["--offload-modules=gdn_core_attn", "--fraction=1"],
            "the reference design's arm: offload gdn_core_attn, fraction 1"),
    "ref+norm": (["--offload-modules=gdn_core_attn", "--fraction=1",
                  "--recompute-modules=gdn_norm_out"],
                 "ref + recompute gdn_norm_out"),
    "all": (["--offload-modules=" + ",".join(ALL_LEAVES)],
            "offload every leaf (the hide rule keeps what cannot hide)"),
    "max": (recompute_offload_rest(MAX_RECOMPUTE),
            "recompute " + ",".join(MAX_RECOMPUTE) + " and offload the rest"),
}
# The largest predicted cut within 3 % under the profile calibrated on run 1
# (bench/notes/training.md): recompute layernorm, offload the rest, placed
# (hide rule) under a calibrated profile. Runs 2 and 3 and the run of
# b9a54af placed under run 1's (h200-calibrated-093b37d.json), run 5 under
# the op times of the step with the fast GDN conv (h200-optimes-b9a54af),
# since then under those of the faster elementwise kernels with
# copyHoldSlack 0.3 (h200-optimes-a1022cc): a placement under a profile
# slower than the card, or with tight holds, holds offloaded bytes too
# briefly, and compute stalls on the copies (training.md, runs 4 and 5).
CALIBRATED_PROFILE = os.path.join(REPO, "bench", "profiles",
                                  "h200-optimes-a1022cc.json")
ARMS["cal3"] = (recompute_offload_rest(["layernorm"]) +
                ["--profile=" + CALIBRATED_PROFILE],
                "recompute layernorm, offload the rest, placed under the "
                "calibrated H200 profile")

# Cheap recompute (norms and elementwise ops, no GEMM or attention) with
# every other leaf offloaded, placed under the same profile: first predicted
# as the route to the 60 % (elem60: 60.2 % at +9.9 % with the run-1
# calibration). Under the current kernels and profile they measure 37.7 %
# at +2.1 % and 52.4 % at +5.2 % (training.md, run 7).
ELEM46 = ["layernorm", "mlp_act", "gdn_norm_out"]
ELEM60 = ELEM46 + ["gdn_prep"]
for _name, _rc in (("elem46", ELEM46), ("elem60", ELEM60)):
    ARMS[_name] = (recompute_offload_rest(_rc) +
                   ["--profile=" + CALIBRATED_PROFILE],
                   "recompute " + ",".join(_rc) + ", offload the rest, placed "
                   "under the calibrated H200 profile")

# The cheapest set found to remove about 60 % under the profile of the step
# with the faster elementwise kernels (a1022cc; training.md, run 6): elem46
# plus the mlp_fc1 GEMM (59.0 % at +6.1 % predicted).
ELEM46_FC1 = ELEM46 + ["mlp_fc1"]
ARMS["elem46-fc1"] = (recompute_offload_rest(ELEM46_FC1) +
                      ["--profile=" + CALIBRATED_PROFILE],
                      "recompute " + ",".join(ELEM46_FC1) + ", offload the "
                      "rest, placed under the calibrated H200 profile")

# The same placements with the arena holding offloaded bytes as long as the
# H200 peak-rate defaults predict their copies take (--copy-hold=peak-rates,
# the behaviour before d22d809): more device memory, fewer chances for a
# compute stall on a copy that runs late. Not default arms: the A/B of the
# next run (`build --arms none,cal3,cal3-ph,...`).
for _name in ("cal3", "elem46", "elem60"):
    _flags, _what = ARMS[_name]
    ARMS[_name + "-ph"] = (_flags + ["--copy-hold=peak-rates"],
                           _what + "; arena holds copies as the defaults "
                           "predict")

# Recompute alone, nothing offloaded: under the run-9 profile (offloaded
# copies cost ~0.7 ms per GB beside compute) predicted cheaper than the same
# recompute with offload below ~45 % of the activation peak
# (bench/notes/training.md, run 9: elementwise leaves 21.4 % at +1.83 %,
# with mlp_fc1 42.2 % at +4.85 %). Not default arms: the next run's A/B.
for _name, _rc in (("elem46-noff", ELEM46), ("elem46-fc1-noff", ELEM46_FC1)):
    ARMS[_name] = (["--recompute-modules=" + ",".join(_rc)],
                   "recompute " + ",".join(_rc) + ", nothing offloaded")

# The recompute-only elementwise arm with its SwiGLU rebuilt by a separate
# clone kernel (--fuse-recompute=false, the behaviour before
# train-fuse-recompute): against elem46-noff, what the fused recompute saves
# at one placement, measured in the same run. Not a default arm.
ARMS["elem46-noff-clone"] = (ARMS["elem46-noff"][0] +
                             ["--fuse-recompute=false"],
                             ARMS["elem46-noff"][1] + "; SwiGLU recomputed "
                             "by a clone kernel, not in its backward")

# Placements the compiler chooses for a goal (train-plan-budget,
# actplace-compile --activation-cut / --step-budget) under the run-9
# profile, the op times of the fused-loss step with copies costing 0.68 ms
# per GB (bench/notes/training.md, run 9). Predicted there: auto3 30.5 % at
# +2.91 %, auto60 60.1 % at +6.92 %, auto90 90.1 % at +11.50 %; auto16g
# (a predicted device peak of at most 16 GiB) is not a default arm.
def add_goal_arms(names_goals, profile, under, extra=()):
    """Arms whose placement actplace-compile chooses for a goal under
    `profile` (described as "under `under`"), with `extra` flags."""
    for name, goal in names_goals:
        ARMS[name] = ([goal, "--profile=" + profile] + list(extra),
                      "placement chosen by the compiler for " + goal[2:] +
                      " under " + under)


def add_side_goal_arms(names_goals, profile_file, under):
    """add_goal_arms for placements with recompute on the side stream, under
    bench/profiles/`profile_file`."""
    add_goal_arms(names_goals, os.path.join(REPO, "bench", "profiles",
                                            profile_file),
                  under + ", recompute on the side stream",
                  ["--recompute-stream=side"])


RUN9_PROFILE = os.path.join(REPO, "bench", "profiles",
                            "h200-optimes-d2fc210.json")
add_goal_arms((("auto3", "--step-budget=0.03"),
               ("auto60", "--activation-cut=0.6"),
               ("auto90", "--activation-cut=0.9"),
               ("auto16g", "--memory-budget=16GiB")),
              RUN9_PROFILE, "the run-9 profile")

# The same goals under the profile of run 12 (op times of 8a8ab91, whose
# conv backward is 30 us faster; copy slowdown and hold slack kept from run
# 9): under the run-9 profile auto3 measured +3.67 % with that kernel, over
# its budget (bench/notes/training.md, run 12).
RUN12_PROFILE = os.path.join(REPO, "bench", "profiles",
                             "h200-optimes-8a8ab91.json")
add_goal_arms((("auto3-r12", "--step-budget=0.03"),
               ("auto60-r12", "--activation-cut=0.6")),
              RUN12_PROFILE, "the run-12 profile")

# The same goals under a profile whose copies slow the kernels beside them
# by each kernel's own rate (h2dSlowdown / d2hSlowdown: the rates measured
# by runtime_offload_bench clocks-kernels in d29, times 2, the factor that
# fits run 12's auto3-r12, auto60 and auto60-r12 best; bench/notes/
# training.md, run 12; `calibrate --copy-beside` writes it).
BESIDE_PROFILE = os.path.join(REPO, "bench", "profiles",
                              "h200-beside-8a8ab91.json")
add_goal_arms((("auto3-beside", "--step-budget=0.03"),
               ("auto60-beside", "--activation-cut=0.6")),
              BESIDE_PROFILE, "the per-kernel copy-slowdown profile")

# The same goals with recompute issued ahead on the side stream, beside the
# GDN chunk backward's idle SMs (train-recompute-stream; the side capacity
# measured by runtime_offload_bench overlap in d31, bench/notes/runtime.md
# "Side-stream recompute").
add_side_goal_arms((("auto3-side", "--step-budget=0.03"),
                    ("auto60-side", "--activation-cut=0.6"),
                    ("auto70-side", "--activation-cut=0.7")),
                   "h200-beside-8a8ab91.json",
                   "the per-kernel copy-slowdown profile")

# The same with the side capacity fitted to run 13's auto60-side and
# auto70-side (0.22 instead of the isolated bench's 0.45;
# bench/notes/training.md, run 13). A 62 % cut leaves the measured
# reduction (0.5 points under the predicted in run 13) room above 60 %.
add_side_goal_arms((("auto3-cal", "--step-budget=0.03"),
                    ("auto62-cal", "--activation-cut=0.62")),
                   "h200-side-29dbd41.json", "the run-13 side-stream profile")

# The same goals under run 16's profile: every op's scale from d44's op
# times, copies as h200-beside-8a8ab91 (d29's rates x 2), the side capacity
# fitted (0.266) to the 60 % placement built with side work after its host
# and the first-launch hold, the default since 49ef39e (bench/notes/
# training.md, run 16). Predicted there: auto3-r16 72.7 % at +8.58 ms,
# auto65-r16 67.3 % at +7.22 ms.
add_side_goal_arms((("auto3-r16", "--step-budget=0.03"),
                    ("auto65-r16", "--activation-cut=0.65")),
                   "h200-side-2a6abaf.json", "the run-16 profile")

# The 3 % goal under the profile refit after d45: copies beside the kernels
# at d29's rates x 3.6 (least squares over the three offload + side-stream
# arms of d44 / d45, which run-12's factor 2 under-predicted by 0.8-1.3 %
# of step), the rest as h200-side-2a6abaf (bench/notes/training.md, run
# 16). Predicted: auto3-r16b 65.6 % at +8.86 ms, auto25-r16b 62.8 % at
# +6.97 ms.
add_side_goal_arms((("auto3-r16b", "--step-budget=0.03"),
                    ("auto25-r16b", "--step-budget=0.025")),
                   "h200-side-7c1804e.json",
                   "the run-16 profile with the refit copy factor")

# The 2.5 % goal under the four-call fit of run 16 (copy factor 3.48 on the
# three offload + side-stream arms, side capacity 0.239 on the four calls of
# side60-gemms; `calibrate --also`), chosen by the search with several
# descents (cdeada4; bench/notes/training.md, run 17). Predicted: auto25-r17
# 62.8 % at +7.50 ms. (A 2 % budget there chooses side60-gemms' lists less
# embedding: 60.5 % at +5.94 ms.)
add_side_goal_arms((("auto25-r17", "--step-budget=0.025"),),
                   "h200-side-6fb67cb.json", "the four-call fit of run 16")

# The same goals under one profile for one-stream and side-stream
# placements (h200-side-74d0ef4: copy rates x 1.16 fitted on d48's ref and
# max, side capacity 0.239 on five calls of side60-gemms, the rates x 2.75
# more in a step with side-stream recompute, fitted on run 16's three
# offload + side-stream arms; bench/notes/training.md, run 17). Predicted:
# auto2-r17u 60.5 % at +5.80 ms, auto25-r17u 63.5 % at +7.49 ms.
add_side_goal_arms((("auto2-r17u", "--step-budget=0.02"),
                    ("auto25-r17u", "--step-budget=0.025")),
                   "h200-side-74d0ef4.json",
                   "the run-17 profile (one for both streams)")

# The same goals under the fit over every call of runs 16-17
# (h200-side-5a736c0: copy factor, side capacity 0.287 with gdn_prep's side
# recompute, sideStreamCopyScale 3.55; bench/notes/training.md, run 17),
# measured in run 18 with predictions written down before the call. The 3 %
# choice is side60-prep's lists, the 2.5 % choice recompute only (64.9 %).
add_side_goal_arms((("auto3-r18", "--step-budget=0.03"),
                    ("auto25-r18", "--step-budget=0.025")),
                   "h200-side-5a736c0.json",
                   "the fit over every call of runs 16-17")

# auto60-side's lists as fixed flags, placed by the pass as of 2026-12-02
# (after d34): only the GEMMs and what reads them on the side stream, the
# norms feeding them moved ahead on the compute stream. In d34's op times
# the GDN chunk backward ran 9 % slower beside side norms + GEMMs.
ARMS["side60-gemms"] = (["--recompute-modules=attn_norm,gdn_in_proj,"
                         "gdn_norm_out,mlp_norm,mlp_fc1,mlp_act,embedding",
                         "--recompute-stream=side"],
                        "auto60-side's recompute lists; GEMMs and their "
                        "readers on the side stream, norms on compute")

# side60-gemms with the side work enqueued where the run sits, before the
# kernel it overlaps (--side-issue=with-run; the order of run 13's binaries
# and of side60-gemms before 49ef39e): the A/B of exec-defer-side-issue.
# What the compiler's offload + side-stream choices add to the 60 %
# placement, one part at a time (run 17, d49: they measured 1-3 ms above
# prediction, side60-gemms did not): gdn_prep's recompute (on the side
# stream: its GEMM-free conv runs beside the hosts too), and the offload of
# core_attn and attn_proj that auto2-r17u makes.
ARMS["side60-prep"] = ([ARMS["side60-gemms"][0][0] + ",gdn_prep",
                        "--recompute-stream=side"],
                       "side60-gemms + gdn_prep recomputed")
ARMS["side60-off"] = (ARMS["side60-gemms"][0] +
                      ["--offload-modules=core_attn,attn_proj"],
                      "side60-gemms + core_attn and attn_proj offloaded")

ARMS["side60-withrun"] = (ARMS["side60-gemms"][0] + ["--side-issue=with-run"],
                          "side60-gemms with side work enqueued before its "
                          "host kernel (run 13's order)")

# side60-gemms with side work enqueued after the kernel it overlaps
# (exec-defer-side-issue), spelled out: actplace-compile's default since
# 49ef39e, where the program also holds side work until its host's first
# launch (run 15: +1.71 % against +2.80 % without the hold). Binaries built
# before 9a6c963 / 49ef39e enqueued it after the next compute kernel and
# did not hold it (runs 14-15, d37-d41).
ARMS["side60-after"] = (ARMS["side60-gemms"][0] + ["--side-issue=after-host"],
                        "side60-gemms with side work enqueued after its "
                        "host kernel")

# No placement, with the loss and its gradient as two ops (a second logits
# pass; train-autodiff fuse-loss-grad=false): what the fused loss of c81ab9e
# saves, measured in the same run. Not a default arm.
ARMS["none-unfused"] = (["--fuse-loss-grad=false"],
                        "no placement, loss and its gradient as two ops")

DEFAULT_ARMS = ["none", "ref", "ref+norm", "all", "max", "cal3", "elem46",
                "elem60", "elem46-fc1"]



def open_result(path):
    """A run folder's file as text, or its xz-compressed copy (PATH.xz):
    older folders in bench/results keep their reports and step records
    compressed, to leave room in the tree a device call carries."""
    if path.endswith(".xz"):
        return lzma.open(path, "rt")
    if not os.path.exists(path) and os.path.exists(path + ".xz"):
        return lzma.open(path + ".xz", "rt")
    return open(path)

def log(*a):
    print(*a, file=sys.stderr, flush=True)


#===----------------------------------------------------------------------===#
# Model FLOPs
#===----------------------------------------------------------------------===#

def text_config(cfg):
    """Flat fields, with Qwen3.5's text_config / rope_parameters merged in."""
    out = dict(cfg)
    out.update(cfg.get("text_config", {}))
    out.update(out.get("rope_parameters", {}) or {})
    return out


def layer_layout(c):
    """[(mixer, has_mlp)] as actplace-import reads it."""
    if "layer_types" in c:
        kinds = {"linear_attention": "gdn", "full_attention": "attn",
                 "mla": "mla", "mlp": None}
        return [(kinds[t], True) for t in c["layer_types"]]
    if "hybrid_layer_pattern" in c:
        kinds = {"G": "gdn", "A": "attn", "L": "mla", "-": None}
        return [(kinds[ch], ch == "-") for ch in c["hybrid_layer_pattern"]]
    n, k = c["num_hidden_layers"], c["full_attention_interval"]
    return [("attn" if (i + 1) % k == 0 else "gdn", True) for i in range(n)]


def forward_flops_per_token(cfg, seq):
    """Forward matmul FLOPs per token (module docstring has the formula)."""
    c = text_config(cfg)
    D, V = c["hidden_size"], c["vocab_size"]
    ctx = (seq + 1) / 2
    total = 2 * D * V
    for mixer, has_mlp in layer_layout(c):
        if mixer == "gdn":
            hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
            dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
            kc = c["linear_conv_kernel_dim"]
            total += 2 * D * (2 * hk * dk + 2 * hv * dv + 2 * hv)
            total += 2 * hv * dv * D
            total += 2 * kc * (2 * hk * dk + hv * dv)
            total += 6 * hv * dk * dv
        elif mixer == "attn":
            h, hkv, hd = (c["num_attention_heads"], c["num_key_value_heads"],
                          c["head_dim"])
            q = h * hd * (2 if c.get("attn_output_gate") else 1)
            total += 2 * D * (q + 2 * hkv * hd) + 2 * h * hd * D
            total += 4 * h * hd * ctx
        elif mixer == "mla":
            h = c["num_attention_heads"]
            dn, dr, dv = (c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                          c["v_head_dim"])
            ql, kvl = c.get("q_lora_rank"), c["kv_lora_rank"]
            total += (2 * D * ql + 2 * ql * h * (dn + dr)) if ql else \
                2 * D * h * (dn + dr)
            total += 2 * D * (kvl + dr) + 2 * kvl * h * (dn + dv)
            total += 2 * h * dv * D
            total += 2 * h * (dn + dr + dv) * ctx
        if has_mlp:
            total += 6 * D * c["intermediate_size"]
    return total


#===----------------------------------------------------------------------===#
# build
#===----------------------------------------------------------------------===#

def git(*args):
    return subprocess.run(["git", "-C", REPO, *args], capture_output=True,
                          text=True).stdout


def cmd_build(a):
    build = os.path.join(REPO, a.build_dir)
    compiler = os.path.join(build, "bin", "actplace-compile")
    if not a.no_rebuild:
        # actplace-compile links the runtime and kernel archives as they are
        # in the build: bring both up to date with the tree first.
        # calibrate and predict use actplace-import and actplace-opt.
        log("cmake --build", a.build_dir,
            "--target actplace-compile actplace-import actplace-opt")
        subprocess.run(["cmake", "--build", build, "-j2", "--target",
                        "actplace-compile", "actplace-import", "actplace-opt"],
                       check=True)
    arms = a.arms.split(",")
    for arm in arms:
        if arm not in ARMS:
            sys.exit(f"unknown arm '{arm}' (known: {', '.join(ARMS)})")
    carry = os.path.abspath(a.carry)
    os.makedirs(carry, exist_ok=True)
    model = os.path.abspath(a.model)
    cfg = json.load(open(model))
    name = os.path.splitext(os.path.basename(model))[0]
    tokens = a.micro_batch_size * a.seq * a.micro_batches
    fwd = forward_flops_per_token(cfg, a.seq)
    dirty = [l.split(None, 1)[1] for l in git(
        "status", "--porcelain", "--untracked-files=no").splitlines()
        if l.strip()]
    manifest = {
        "commit": git("rev-parse", "HEAD").strip(),
        "dirty_files": dirty,
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_dir": a.build_dir,
        "model": os.path.relpath(model, REPO),
        "seq": a.seq, "micro_batch_size": a.micro_batch_size,
        "micro_batches": a.micro_batches, "dtype": a.dtype,
        "tokens_per_step": tokens,
        "forward_flops_per_token": fwd,
        "train_flops_per_step": 3 * fwd * tokens,
        "arms": {},
    }
    if dirty:
        log("warning: the tree has uncommitted changes, the binaries include "
            "them:", " ".join(dirty))
    with tempfile.TemporaryDirectory() as tmp:
        for arm in arms:
            flags, what = ARMS[arm]
            base = os.path.join(carry, arm)
            binary = os.path.join(tmp, arm)
            cmd = [compiler, model, "--seq", str(a.seq),
                   "--micro-batch-size", str(a.micro_batch_size),
                   "--micro-batches", str(a.micro_batches), "--dtype", a.dtype,
                   *flags, "--report-json", base + ".report.json",
                   "--memory-timeline", base + ".svg",
                   "--memory-timeline-title",
                   f"{name} seq {a.seq}, {a.micro_batches} x {a.micro_batch_size}"
                   f" sequences, {a.dtype}: arm '{arm}'",
                   "-o", binary]
            log(f"[{arm}]", " ".join(cmd[1:]))
            t0 = time.time()
            p = subprocess.run(cmd, capture_output=True, text=True)
            seconds = time.time() - t0
            open(base + ".compile.txt", "w").write(
                "$ " + " ".join(cmd) + "\n" + p.stdout + p.stderr)
            if p.returncode != 0:
                sys.stderr.write(p.stdout + p.stderr)
                sys.exit(f"[{arm}] actplace-compile failed (exit {p.returncode})")
            sys.stderr.write(p.stdout)
            subprocess.run(["strip", binary], check=True)
            with open(binary, "rb") as f, lzma.open(base + ".xz", "wb",
                                                    preset=6) as out:
                shutil.copyfileobj(f, out)
            planned = None
            for line in p.stdout.splitlines():
                if line.startswith("planned peak: arena "):
                    planned = int(line.split()[3])
            manifest["arms"][arm] = {
                "flags": flags, "what": what, "binary": arm + ".xz",
                "report": arm + ".report.json", "svg": arm + ".svg",
                "compile_seconds": round(seconds, 1),
                "planned_arena_bytes": planned,
            }
            if goal_options(flags):
                manifest["arms"][arm]["chosen"] = chosen_flags(p.stdout)
    json.dump(manifest, open(os.path.join(carry, "manifest.json"), "w"),
              indent=1)
    size = sum(os.path.getsize(os.path.join(carry, f))
               for f in os.listdir(carry))
    log(f"wrote {carry} ({size / 2**20:.1f} MiB, {len(arms)} arms, commit "
        f"{manifest['commit'][:10]}{' + uncommitted changes' if dirty else ''})")


#===----------------------------------------------------------------------===#
# run
#===----------------------------------------------------------------------===#

def gpu_info():
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,"
             "clocks.mem,memory.used,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def open_carry(a, prefix):
    """The carry's manifest, the arms asked for (default: all built), the
    output folder (created) and a temporary folder with each arm's binary
    unpacked from the carry (remove it when done)."""
    carry = os.path.abspath(a.carry)
    manifest = json.load(open(os.path.join(carry, "manifest.json")))
    add_variants(manifest, a.variant)
    arms = a.arms.split(",") if a.arms else list(manifest["arms"])
    for arm in arms:
        if arm not in manifest["arms"]:
            sys.exit(f"--arms names '{arm}': neither a built arm of "
                     f"{carry} nor a --variant")
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    bindir = tempfile.mkdtemp(prefix=prefix)
    for arm in arms:
        info = manifest["arms"][arm]
        path = os.path.join(bindir, arm)
        with lzma.open(os.path.join(carry, info["binary"])) as f, \
                open(path, "wb") as o:
            shutil.copyfileobj(f, o)
        os.chmod(path, 0o755)
    return carry, manifest, arms, out, bindir


def add_variants(manifest, specs):
    """Adds each --variant NAME=ARM:VAR=VALUE[;VAR=VALUE] to the manifest's
    arms: ARM's entry (binary, report, predictions) plus "variant_of" and
    "env", so that run, check and table treat it as an arm of its own."""
    for spec in specs:
        name, sep, rest = spec.partition("=")
        base, sep2, env_text = rest.partition(":")
        if not sep or not sep2 or not name or not base or not env_text:
            sys.exit(f"--variant '{spec}': expected "
                     "NAME=ARM:VAR=VALUE[;VAR=VALUE]")
        if name in manifest["arms"]:
            sys.exit(f"--variant '{spec}': arm '{name}' exists already")
        if base not in manifest["arms"]:
            sys.exit(f"--variant '{spec}': '{base}' is not a built arm "
                     f"(built: {', '.join(manifest['arms'])})")
        env = {}
        for item in env_text.split(";"):
            var, eq, value = item.partition("=")
            if not eq or not var:
                sys.exit(f"--variant '{spec}': '{item}' is not VAR=VALUE")
            env[var] = value
        info = dict(manifest["arms"][base])
        info.update({"variant_of": base, "env": env})
        manifest["arms"][name] = info


def arm_env(info):
    """The environment an arm's process runs in: ours plus its variant's."""
    env = dict(os.environ)
    env.update(info.get("env", {}))
    return env


def cmd_run(a):
    carry, manifest, arms, out, bindir = open_carry(a, "qwen-bench-")
    for arm in arms:
        info = manifest["arms"][arm]
        for key in ("report", "svg"):
            shutil.copy(os.path.join(carry, info[key]), out)
    total_steps = a.warmup + a.steps
    run = {"host": socket.gethostname(), "device": a.device,
           "gpu_before": gpu_info(), "warmup": a.warmup, "steps": a.steps,
           "rounds": a.rounds, "seed": a.seed, "data": a.data,
           # Kernel switches the binaries read at startup.
           "env": {k: v for k, v in sorted(os.environ.items())
                   if k.startswith("ACTPLACE_")},
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "processes": []}
    results = open(os.path.join(out, "results.jsonl"), "w")
    run_start = time.time()
    walls = []
    total_processes = a.rounds * len(arms)
    for r in range(a.rounds):
        # --time-limit: a round is started only if one more round as long
        # as the longest so far still ends inside the limit, so that every
        # arm has the same number of processes and the rotation stays fair.
        # The first round always runs.
        elapsed = time.time() - run_start
        if a.time_limit and r > 0:
            need = max(walls) * len(arms)
            if elapsed + need > a.time_limit:
                run["stopped"] = {"rounds_done": r, "elapsed_s":
                                  round(elapsed, 1), "time_limit_s":
                                  a.time_limit, "next_round_estimate_s":
                                  round(need, 1)}
                log(f"stopping after {r} of {a.rounds} rounds: {elapsed:.0f}"
                    f" s spent, a round takes about {need:.0f} s, the limit "
                    f"is {a.time_limit:g} s")
                break
        # Rotate the order each round: every arm runs early and late.
        order = arms[r % len(arms):] + arms[:r % len(arms)]
        for pos, arm in enumerate(order):
            metrics = os.path.join(out, f"{arm}.r{r}.jsonl")
            logf = os.path.join(out, f"{arm}.r{r}.log")
            if os.path.exists(metrics):
                # The binary appends: a folder run into again would count
                # the earlier process's steps as this one's.
                os.remove(metrics)
            cmd = [os.path.join(bindir, arm), "--steps", str(total_steps),
                   "--device", a.device, "--seed", str(a.seed),
                   "--data", a.data, "--metrics", metrics]
            done = len(walls)
            eta = (f", about {statistics.mean(walls) * (total_processes - done):.0f} s left"
                   if walls else "")
            log(f"round {r} #{pos} {arm} (process {done + 1} of "
                f"{total_processes}{eta}): {' '.join(cmd[1:])}")
            t0 = time.time()
            try:
                with open(logf, "w") as lf:
                    rc = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT,
                                        env=arm_env(manifest["arms"][arm]),
                                        timeout=a.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            wall = time.time() - t0
            walls.append(wall)
            lines = []
            if os.path.exists(metrics):
                lines = [json.loads(l) for l in open(metrics) if l.strip()]
            for m in lines:
                row = {"commit": manifest["commit"], "arm": arm, "round": r,
                       "position": pos, "warmup": m["step"] <= a.warmup}
                row.update(m)
                results.write(json.dumps(row) + "\n")
            results.flush()
            # Start time (epoch s): lines up a process with GPU clock and
            # power samples taken beside the run.
            proc = {"arm": arm, "round": r, "position": pos, "rc": rc,
                    "started_s": round(t0, 2), "wall_s": round(wall, 2),
                    "steps_written": len(lines)}
            run["processes"].append(proc)
            log(f"  rc={rc} wall={wall:.1f}s steps={len(lines)}"
                + (f" last step {lines[-1]['step_time_s']:.4f}s" if lines
                   else ""))
            if rc != 0:
                log("  log tail:", open(logf).read()[-2000:])
    results.close()
    def record_op_times(arm, path, mode):
        """One process of `arm` with --op-times into `path`; its entry for
        the manifest."""
        cmd = [os.path.join(bindir, arm), "--steps",
               str(a.op_times_steps + 1), "--device", a.device, "--seed",
               str(a.seed), "--data", a.data, "--op-times", path,
               "--op-times-mode", mode]
        timeline = None
        if a.timeline and mode == "stream":
            # The last timed step's launches on their streams (what ran
            # beside what): op-timeline-ARM.json.
            timeline = f"op-timeline-{arm}.json"
            cmd += ["--op-timeline", os.path.join(out, timeline)]
        log(f"op times of {arm}: " + " ".join(cmd[1:]))
        try:
            rc = subprocess.run(cmd, stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT,
                                env=arm_env(manifest["arms"][arm]),
                                timeout=a.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        log(f"  rc={rc}")
        entry = {"rc": rc, "steps": a.op_times_steps,
                 "file": os.path.basename(path)}
        if timeline:
            entry["timeline"] = timeline
        return entry

    if a.op_times_steps and "none" in arms:
        # The kernel times `calibrate --op-times` turns into opScale, from
        # the no-placement binary: op-times.json in the first mode named,
        # op-times-MODE.json for another.
        run["op_times"] = {}
        for i, mode in enumerate(a.op_times_modes.split(",")):
            path = os.path.join(out, "op-times.json" if i == 0
                                else f"op-times-{mode}.json")
            run["op_times"][mode] = record_op_times("none", path, mode)
    stall_arms = [n for n in a.op_times_arms.split(",") if n]
    if a.op_times_steps and stall_arms:
        # Placed arms' op times (stream mode): besides their kernels they
        # time each compute-stream wait for a reload ("<scope>/wait"), the
        # measured stall the table sets beside the predicted exposed time.
        run["op_times_arms"] = {}
        for arm in stall_arms:
            if arm not in arms:
                sys.exit(f"run: --op-times-arms names '{arm}', which is not "
                         "an arm of this run")
            run["op_times_arms"][arm] = record_op_times(
                arm, os.path.join(out, f"op-times-{arm}.json"), "stream")
    run["gpu_after"] = gpu_info()
    run["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    manifest["run"] = run
    json.dump(manifest, open(os.path.join(out, "manifest.json"), "w"), indent=1)
    shutil.rmtree(bindir, ignore_errors=True)
    log(f"wrote {out}")
    pack_folder(a, out)


def pack_folder(a, out):
    """--pack FILE: the output folder as one gzipped tar (its own name at the
    top), written as soon as the folder is complete: a device call brings
    back a few files, not the hundred a run writes."""
    if not a.pack:
        return
    with tarfile.open(a.pack, "w:gz") as t:
        t.add(out, arcname=os.path.basename(out.rstrip("/")))
    log(f"packed {out} into {a.pack} ({os.path.getsize(a.pack)} bytes)")


def check_arm_lines(arm, lines, steps):
    """The stability conditions of issue 8 on one process's metrics; returns
    a list of violations (empty: the arm is stable)."""
    bad = []
    if len(lines) != steps:
        bad.append(f"{arm}: {len(lines)} metrics lines, expected {steps}")
    for m in lines:
        for key in ("loss", "grad_norm"):
            v = m.get(key)
            if v is None or not math.isfinite(v):
                bad.append(f"{arm} step {m['step']}: {key} {v} not finite")
        if m["pinned_pool"]["in_use"] != 0:
            bad.append(f"{arm} step {m['step']}: pinned pool "
                       f"{m['pinned_pool']['in_use']} bytes in use after "
                       "the step")
    # Everything the runtime allocates is allocated in step 1: from then on
    # the pool and the device peak must not move.
    for key, get in (("pinned buffers", lambda m: m["pinned_pool"]["buffers"]),
                     ("pinned bytes", lambda m: m["pinned_pool"]["bytes"]),
                     ("device peak", lambda m: m["device_peak_bytes"])):
        seen = sorted({get(m) for m in lines})
        if len(seen) > 1:
            bad.append(f"{arm}: {key} not constant over the steps: {seen}")
    return bad


def cmd_check(a):
    """Bit identity and stability: every arm STEPS steps with
    --fingerprints in its own process; fingerprints (loss, grads, params,
    optimizer) equal to the first arm's at every step, finite losses and
    grad norms, pinned pool constant and empty after every step, device peak
    constant."""
    if a.baseline and not a.fingerprints:
        sys.exit("check: --baseline compares fingerprints; add --fingerprints")
    reference = None
    if a.baseline:
        # Read before any process runs: a late error would waste the call.
        if not os.path.exists(a.baseline):
            sys.exit(f"check: --baseline {a.baseline}: no such file")
        with open_result(a.baseline) as f:
            reference = [json.loads(l) for l in f if l.strip()]
        if len(reference) < a.steps:
            sys.exit(f"check: --baseline {a.baseline} has {len(reference)} "
                     f"steps, fewer than --steps {a.steps}")
    _, manifest, arms, out, bindir = open_carry(a, "qwen-check-")
    runs, bad = {}, []
    for arm in arms:
        path = os.path.join(bindir, arm)
        metrics = os.path.join(out, f"{arm}.check.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        cmd = [path, "--steps", str(a.steps), "--device", a.device, "--seed",
               str(a.seed), "--data", a.data, "--metrics", metrics]
        if a.fingerprints:
            cmd.append("--fingerprints")
        log(f"{arm}: {' '.join(cmd[1:])}")
        t0 = time.time()
        with open(os.path.join(out, f"{arm}.check.log"), "w") as lf:
            try:
                rc = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT,
                                    env=arm_env(manifest["arms"][arm]),
                                    timeout=a.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        lines = ([json.loads(l) for l in open(metrics) if l.strip()]
                 if os.path.exists(metrics) else [])
        log(f"  rc={rc} wall={time.time() - t0:.1f}s steps={len(lines)}")
        if rc != 0:
            bad.append(f"{arm}: exit status {rc}")
        bad += check_arm_lines(arm, lines, a.steps)
        runs[arm] = lines
    shutil.rmtree(bindir, ignore_errors=True)
    compared = 0
    if a.fingerprints:
        # The reference: an earlier check's NAME.check.jsonl (--baseline;
        # e.g. `none` of another call, so that one new arm is compared
        # with something), else the first arm of this check.
        if reference is not None:
            first, others = a.baseline, arms
        else:
            first, reference, others = arms[0], runs[arms[0]], arms[1:]
        for arm in others:
            compared += 1
            for x, y in zip(reference, runs[arm]):
                if x.get("fingerprints") is None or \
                        x.get("fingerprints") != y.get("fingerprints"):
                    bad.append(f"step {x['step']}: fingerprints of {arm} "
                               f"{y.get('fingerprints')} differ from "
                               f"{first}'s {x.get('fingerprints')}")
                    break
    print(f"| arm | steps | first / last loss | last grad norm | pinned "
          f"buffers | pinned MiB | device peak MiB | median step s |")
    print("|---|---|---|---|---|---|---|---|")
    for arm in arms:
        lines = runs[arm]
        if not lines:
            print(f"| {arm} | 0 | | | | | | |")
            continue
        last = lines[-1]
        print(f"| {arm} | {len(lines)} | {lines[0]['loss']:.5f} / "
              f"{last['loss']:.5f} | {last['grad_norm']:.4g} | "
              f"{last['pinned_pool']['buffers']} | "
              f"{fmt_mib(last['pinned_pool']['bytes'])} | "
              f"{fmt_mib(last['device_peak_bytes'])} | "
              f"{statistics.median(m['step_time_s'] for m in lines[1:] or lines):.4f} |")
    json.dump({"commit": manifest["commit"], "arms": arms, "steps": a.steps,
               "fingerprints": a.fingerprints,
               "fingerprint_baseline": first if a.fingerprints else None,
               "violations": bad, "gpu": gpu_info()},
              open(os.path.join(out, "check.json"), "w"), indent=1)
    pack_folder(a, out)
    for b in bad:
        print("FAIL: " + b)
    if bad:
        sys.exit(1)
    if not a.fingerprints:
        said = ""
    elif compared:
        said = (f", fingerprints equal at every step ({compared} arm"
                f"{'s' if compared > 1 else ''} against {first})")
    else:
        # One arm and nothing to hold it against: say so, not "equal".
        said = (", fingerprints recorded, not compared (one arm, no "
                "--baseline)")
    print(f"PASS: {len(arms)} arms, {a.steps} steps" + said
          + "; finite, pinned pool constant and empty, device peak constant")


#===----------------------------------------------------------------------===#
# calibrate, predict
#===----------------------------------------------------------------------===#

def arm_medians(d):
    """Median measured step time per arm of a run folder, and its reports."""
    manifest = json.load(open(os.path.join(d, "manifest.json")))
    rows = [json.loads(l)
            for l in open_result(os.path.join(d, "results.jsonl"))
            if l.strip()]
    out = {}
    for arm, info in manifest["arms"].items():
        times = [r["step_time_s"] for r in rows
                 if r["arm"] == arm and not r["warmup"]]
        if times:
            rep = json.load(open_result(os.path.join(d, info["report"])))
            out[arm] = (statistics.median(times), rep["totals"])
    return manifest, out


def cmd_calibrate(a):
    """Fits the cost model to a run and writes a device profile:
      opScale             copied from --op-scale (per-op measured / predicted
                          kernel time from the kernel benchmarks at the
                          model's shapes);
      computeScale        every other op: chosen so that the predicted step
                          time of the no-placement arm equals its measured
                          median (predictions are linear in it: two reports
                          fix the line);
      copySlowdownPerByte least squares, through the origin, of what the
                          offload-only arms (no recompute) measure above
                          their prediction, against the bytes they move
                          (or an earlier profile's, --copy-slowdown-from);
      copyHoldSlack       given (--copy-hold-slack), not fitted.
    Arms with recompute are left out of the fit: `predict` + `table` check
    the profile on them."""
    d = os.path.abspath(a.results)
    manifest, med = arm_medians(d)
    if "none" not in med:
        sys.exit("calibrate: the run has no measured 'none' arm")
    base = {}
    build = os.path.join(REPO, a.build_dir, "bin")
    if a.op_scale:
        base["opScale"] = json.load(open(a.op_scale))
    if a.op_times:
        base["opScale"] = dict(base.get("opScale", {}),
                               **op_scales_from_times(manifest, a.op_times,
                                                      build))

    def predicted(arm, profile):
        return predicted_step(manifest, arm, profile, build)

    none_meas = med["none"][0]
    t1 = predicted("none", dict(base, computeScale=1.0))
    t2 = predicted("none", dict(base, computeScale=2.0))
    if t2 - t1 < 1e-12:
        # Every op has its own measured scale: computeScale touches nothing.
        scale = 1.0
        # Older op-times files have no mode: they were all waited for.
        waited = a.op_times and \
            json.load(open(a.op_times)).get("mode", "wait") == "wait"
        if t1 > none_meas and waited:
            # Launches timed one by one (each waited for) take longer than
            # the same launches back to back in the step (on the H200,
            # c1bcd09: 464.5 ms of timed launches in a 426.5 ms step). The
            # excess is charged per launch, not per second: short kernels
            # carry most of it (fitted here, checked on the arms held out).
            # Stream-mode times (the default since --op-times-mode) are the
            # launches as they run in the step and need no correction.
            per_launch = (t1 - none_meas) / launches_per_step(a.op_times)
            base["opScale"] = dict(
                base["opScale"], **op_scales_from_times(
                    manifest, a.op_times, build, per_launch))
            log(f"every op has an opScale: the timed launches sum to "
                f"{t1 * 1e3:.2f} ms, more than the measured step "
                f"{none_meas * 1e3:.2f} ms; {per_launch * 1e6:.2f} us taken "
                "off every timed launch")
        else:
            log(f"every op has an opScale: predicted {t1 * 1e3:.2f} ms, "
                f"measured {none_meas * 1e3:.2f} ms; the difference is time "
                "outside the timed launches (host work, gaps), the same in "
                "every arm")
    else:
        scale = 1.0 + (none_meas - t1) / (t2 - t1)
    if scale <= 0:
        sys.exit(f"calibrate: the op scales alone predict {t1 * 1e3:.2f} ms, "
                 f"more than the measured {none_meas * 1e3:.2f} ms")
    profile = dict(base, computeScale=round(scale, 6))
    none_pred = predicted("none", profile)
    extra = [fit_run(d, build, profile) for d in a.also]
    fit_arms = [n for n in a.fit_arms.split(",") if n]
    for arm in fit_arms:
        if arm not in med and not any(arm in r.med for r in extra):
            sys.exit(f"calibrate: --fit-arms names '{arm}', which no run "
                     "folder measured")
    if a.side_copy_arms and not a.copy_beside:
        sys.exit("calibrate: --side-copy-arms needs --copy-beside (the scale "
                 "multiplies the per-kernel rates)")
    if extra and not a.copy_beside:
        sys.exit("calibrate: --also needs --copy-beside (the per-byte fit "
                 "takes one run)")
    if a.copy_beside:
        if a.copy_hold_slack is not None:
            # Part of the profile the factor is fitted under.
            profile["copyHoldSlack"] = a.copy_hold_slack
        return write_copy_beside(a, profile, med, fit_arms, predicted,
                                 scale, none_meas, none_pred, extra)
    num = den = 0.0
    used = []
    for arm, (meas, t) in med.items():
        if fit_arms:
            if arm not in fit_arms:
                continue
        elif (arm == "none" or t["recomputed_bytes"]
              or not t["offloaded_bytes"]):
            continue
        moved = float(t["d2h_bytes_per_step"] + t["h2d_bytes_per_step"])
        resid = (meas - none_meas) - (predicted(arm, profile) - none_pred)
        num += resid * moved
        den += moved * moved
        used.append(f"{arm}: {resid * 1e3:+.2f} ms for {moved / 1e9:.2f} GB")
    slowdown = max(0.0, num / den) if den else 0.0
    if a.copy_hold_slack is not None:
        # Not fitted here: the margin on each D2H's predicted end at which
        # the tight-hold arms measured no compute stall (training.md, run 5).
        profile["copyHoldSlack"] = a.copy_hold_slack
    if not used and a.copy_slowdown_from:
        # No offload-only arm in this run: the compute lost per byte copied
        # comes from an earlier run's fit on the same card.
        slowdown = json.load(open(a.copy_slowdown_from))["copySlowdownPerByte"]
        used.append("taken from " + a.copy_slowdown_from)
    elif not used:
        sys.exit("calibrate: the run has no offload-only arm to fit "
                 "copySlowdownPerByte on; pass --copy-slowdown-from PROFILE")
    profile["copySlowdownPerByte"] = float(f"{slowdown:.6e}")
    fit_side_capacity(a, profile, med, predicted, none_meas, none_pred)
    with open(a.out, "w") as f:
        json.dump(profile, f, indent=1)
        f.write("\n")
    log(f"computeScale = {scale:.4f}: the no-placement arm measured "
        f"{none_meas * 1e3:.2f} ms, predicted now {none_pred * 1e3:.2f} ms"
        + (f" ({t1 * 1e3:.2f} ms at scale 1, {t2 * 1e3:.2f} ms at 2)"
           if t2 - t1 >= 1e-12 else "")
        + (" (op scales from " + a.op_scale + ")" if a.op_scale else ""))
    log(f"copySlowdownPerByte = {slowdown:.4e} s/B "
        f"({slowdown * 1e12:.3f} ms per GB) from " + ("; ".join(used) or
                                                     "no offload-only arm"))
    log("wrote", a.out)


class FitRun(typing.NamedTuple):
    """One run folder's part in a fit: its measured medians per arm, a
    predictor of its arms under a profile, and its none arm measured and
    predicted (each arm's increase is taken against its own run's none)."""
    label: str
    med: dict
    predicted: typing.Callable
    none_meas: float
    none_pred: float


def fit_run(d, build, profile):
    """calibrate --also DIR: the run folder `d` as a FitRun, its none
    predicted under `profile`."""
    manifest, med = arm_medians(os.path.abspath(d))
    if "none" not in med:
        sys.exit(f"calibrate: --also {d} has no measured 'none' arm")

    def predicted(arm, prof):
        return predicted_step(manifest, arm, prof, build)

    return FitRun(d, med, predicted, med["none"][0],
                  predicted("none", profile))


def predicted_step(manifest, arm, profile, build):
    """The step time the cost model predicts for `arm` of a run (its
    manifest) under the profile dict `profile`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "profile.json")
        json.dump(profile, open(path, "w"))
        report = os.path.join(tmp, "report.json")
        write_report(manifest, arm, path, report, build)
        return json.load(open(report))["totals"]["step_seconds_after"]


def fit_side_capacity(a, profile, med, predicted, none_meas, none_pred,
                      extra=()):
    """calibrate --side-capacity-arms: the side capacity of one host op
    (--side-capacity-op, the GDN chunk backward by default) that best
    predicts the named arms (recompute on the side stream): least squares
    of measured minus predicted step increase, by golden-section search on
    [0, 1] (each arm's prediction only falls as the capacity grows). Sets
    profile["sideCapacity"]; prints each arm's measured and predicted
    increase. Run 13 fitted it by hand the same way (training.md)."""
    names = [n for n in a.side_capacity_arms.split(",") if n]
    if not names:
        return
    runs = [FitRun("", med, predicted, none_meas, none_pred)] + list(extra)
    # (run, arm) pairs: every named arm in every run folder that measured it.
    pairs = [(r, arm) for r in runs for arm in names if arm in r.med]
    for arm in names:
        if not any(arm == x for _, x in pairs):
            sys.exit(f"calibrate: --side-capacity-arms names '{arm}', which "
                     "no run folder measured")
    arms = [f"{r.label}:{arm}" if r.label else arm for r, arm in pairs]

    def with_capacity(c):
        return dict(profile, sideCapacity={a.side_capacity_op: round(c, 4)})

    cache = {}

    def sse(c):
        c = round(c, 4)
        if c not in cache:
            preds = {name: r.predicted(arm, with_capacity(c)) - r.none_pred
                     for name, (r, arm) in zip(arms, pairs)}
            cache[c] = (sum((r.med[arm][0] - r.none_meas - preds[name]) ** 2
                            for name, (r, arm) in zip(arms, pairs)), preds)
        return cache[c][0]

    if abs(sse(0.0) - sse(1.0)) < 1e-12 and \
            cache[0.0][1] == cache[1.0][1]:
        sys.exit("calibrate: the predictions of " + ", ".join(arms) +
                 " do not depend on the side capacity of " +
                 a.side_capacity_op + " (no side-stream work beside it)")
    lo, hi, g = 0.0, 1.0, (5 ** 0.5 - 1) / 2
    x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
    while hi - lo > 0.01:
        if sse(x1) <= sse(x2):
            hi, x2 = x2, x1
            x1 = hi - g * (hi - lo)
        else:
            lo, x1 = x1, x2
            x2 = lo + g * (hi - lo)
    best = min(cache, key=lambda c: cache[c][0])
    profile["sideCapacity"] = {a.side_capacity_op: best}
    log(f"side capacity of {a.side_capacity_op} = {best:.3f} (least squares "
        f"over {', '.join(arms)}; {len(cache)} capacities tried)")
    for name, (r, arm) in zip(arms, pairs):
        log(f"  {name}: measured {(r.med[arm][0] - r.none_meas) * 1e3:+.2f} "
            f"ms, predicted {cache[best][1][name] * 1e3:+.2f} ms")


def fit_side_copy_scale(a, profile, runs):
    """calibrate --side-copy-arms: sideStreamCopyScale (the copy slowdown
    rates' multiplier in a step with side-stream recompute) by least squares
    over the named arms of every run folder that measured them, under the
    profile's copy factor and side capacity (fitted before it). Predictions
    are linear in the scale (the charge is the rates times the bytes beside
    each kernel, times it): two reports per arm, at 0 and 1, fix each line."""
    names = [n for n in a.side_copy_arms.split(",") if n]
    if not names:
        return
    pairs = [(r, arm) for r in runs for arm in names if arm in r.med]
    for arm in names:
        if not any(arm == x for _, x in pairs):
            sys.exit(f"calibrate: --side-copy-arms names '{arm}', which no "
                     "run folder measured")
    num = den = 0.0
    for r, arm in pairs:
        p0 = r.predicted(arm, dict(profile, sideStreamCopyScale=1e-9))
        p1 = r.predicted(arm, dict(profile, sideStreamCopyScale=1.0))
        slope = p1 - p0
        num += (r.med[arm][0] - r.none_meas - (p0 - r.none_pred)) * slope
        den += slope * slope
    if den < 1e-18:
        sys.exit("calibrate: the predictions of " + ", ".join(names) +
                 " do not depend on sideStreamCopyScale (no copies beside "
                 "side-stream recompute)")
    scale = num / den
    if scale <= 0:
        sys.exit(f"calibrate: sideStreamCopyScale fits {scale:.3f}; it must "
                 "be positive (the arms measure less than their copies "
                 "cost at the base rates)")
    profile["sideStreamCopyScale"] = round(scale, 4)
    log(f"sideStreamCopyScale = {scale:.3f} (least squares over "
        + ", ".join(f"{r.label}:{arm}" if r.label else arm
                    for r, arm in pairs) + ")")
    for r, arm in pairs:
        pred = r.predicted(arm, profile) - r.none_pred
        log(f"  {r.label + ':' if r.label else ''}{arm}: measured "
            f"{(r.med[arm][0] - r.none_meas) * 1e3:+.2f} ms, predicted "
            f"{pred * 1e3:+.2f} ms")


def copy_beside_tables(rates, factor):
    """The profile's h2dSlowdown / d2hSlowdown: measured ms per GB -> s per
    byte, times `factor`."""
    out = {}
    for key in ("h2dSlowdown", "d2hSlowdown"):
        out[key] = {op: float(f"{v * factor * 1e-12:.6e}")
                    for op, v in sorted(rates.get(key, {}).items())}
    return out


def write_copy_beside(a, profile, med, fit_arms, predicted, scale,
                      none_meas, none_pred, extra=()):
    """calibrate --copy-beside: copies slow the kernels beside them at the
    measured per-kernel rates times one factor, given
    (--copy-beside-scale) or fitted by least squares over the fit arms
    (their measured step increase above none against the predicted one;
    predictions are close to linear in the factor, so two reports per arm,
    at 0 and 1, fix each line). `extra` (FitRun, calibrate --also): other
    run folders whose fit arms join the fit, each against its own none."""
    rates = json.load(open(a.copy_beside))
    if not any(rates.get(k) for k in ("h2dSlowdown", "d2hSlowdown")):
        sys.exit(f"calibrate: {a.copy_beside} has no h2dSlowdown or "
                 "d2hSlowdown rates")
    runs = [FitRun("", med, predicted, none_meas, none_pred)] + list(extra)
    factor, used = a.copy_beside_scale, []
    if factor is None:
        pairs = [(r, arm) for r in runs for arm, (_, t) in r.med.items()
                 if (arm in fit_arms if fit_arms else
                     arm != "none" and t["offloaded_bytes"])]
        if not pairs:
            sys.exit("calibrate: no arm with offload to fit the copy "
                     "slowdown on; pass --copy-beside-scale")
        num = den = 0.0
        for r, arm in pairs:
            meas = r.med[arm][0] - r.none_meas
            p0 = r.predicted(arm, dict(profile,
                                       **copy_beside_tables(rates, 0)))
            p1 = r.predicted(arm, dict(profile,
                                       **copy_beside_tables(rates, 1)))
            slope = p1 - p0
            num += (meas - (p0 - r.none_pred)) * slope
            den += slope * slope
            used.append((r, arm))
        factor = max(0.0, num / den) if den else 0.0
    profile.update(copy_beside_tables(rates, factor))
    fit_side_capacity(a, profile, med, predicted, none_meas, none_pred,
                      extra)
    fit_side_copy_scale(a, profile, runs)
    with open(a.out, "w") as f:
        json.dump(profile, f, indent=1)
        f.write("\n")
    log(f"computeScale = {scale:.4f}: the no-placement arm measured "
        f"{none_meas * 1e3:.2f} ms, predicted now {none_pred * 1e3:.2f} ms")
    names = [f"{r.label}:{arm}" if r.label else arm for r, arm in used]
    log(f"copy slowdown beside kernels: {a.copy_beside} x {factor:.3f} "
        + ("(given)" if not used else "(least squares over " +
           ", ".join(names) + ")"))
    for name, (r, arm) in zip(names, used):
        pred = r.predicted(arm, profile) - r.none_pred
        log(f"  {name}: measured {(r.med[arm][0] - r.none_meas) * 1e3:+.2f} "
            f"ms, predicted {pred * 1e3:+.2f} ms")
    log("wrote", a.out)


def import_graph(manifest, build):
    """The run's model as actplace-import gives it (MLIR text)."""
    return subprocess.run(
        [os.path.join(build, "actplace-import"),
         os.path.join(REPO, manifest["model"]), "--seq", str(manifest["seq"]),
         "--micro-batch-size", str(manifest["micro_batch_size"]),
         "--micro-batches", str(manifest["micro_batches"]), "--dtype",
         manifest["dtype"]], capture_output=True, text=True, check=True).stdout


def op_name_of_label(label):
    """The train op a launch label of the binary belongs to: labels are
    '<scope>/<op>' (plus '(recompute)'), 'finalize_grads', or a parameter's
    name for its AdamW launch."""
    if label.endswith("/wait"):
        return None  # a wait for a reload, not a kernel (measured_stall)
    if "/" in label:
        return "train." + label.split("/", 1)[1].replace("(recompute)", "")
    if label == "finalize_grads":
        return "train.finalize_grads"
    return "train.adamw" if "." in label else None


def launches_per_step(path):
    times = json.load(open(path))
    return sum(t["count"] for t in times["ops"].values()) / times["steps"]


def op_scales_from_times(manifest, path, build, per_launch=0.0):
    """opScale from the binary's own kernel times (--op-times of the
    no-placement arm): per op name, measured seconds per step over the rate
    model's (computeScale 1) prediction per step. `per_launch` seconds are
    taken off every timed launch first (what a launch waited for alone costs
    beyond the same launch back to back in the step; at most 90 % of it)."""
    times = json.load(open(path))
    measured = {}
    for label, t in times["ops"].items():
        name = op_name_of_label(label)
        if name:
            sec = max(0.1 * t["seconds"], t["seconds"] - per_launch * t["count"])
            measured[name] = measured.get(name, 0.0) + sec / times["steps"]
    imp = import_graph(manifest, build)
    out = subprocess.run(
        [os.path.join(build, "actplace-opt"), "-train-autodiff",
         "-train-print-memory-timeline=per-op=true", "-o", os.devnull],
        input=imp, capture_output=True, text=True, check=True).stdout
    body = re.search(r"body #(\d+)\.\.#(\d+), (\d+) microbatches", out)
    lo, hi, micro = (int(x) for x in body.groups())
    predicted = {}
    for m in re.finditer(r"^#(\d+) (\S+) .* dur=([0-9.]+)", out, re.M):
        index, name, us = int(m.group(1)), m.group(2), float(m.group(3))
        predicted[name] = predicted.get(name, 0.0) + \
            us * 1e-6 * (micro if lo <= index <= hi else 1)
    scales = {}
    for name, sec in sorted(measured.items()):
        if predicted.get(name, 0) > 0 and sec > 0:
            scales[name] = round(sec / predicted[name], 4)
            log(f"  {name}: measured {sec * 1e3:.3f} ms per step, predicted "
                f"{predicted[name] * 1e3:.3f} ms: x{scales[name]}")
    return scales


def write_report(manifest, arm, profile, report, build):
    """The JSON placement report of one arm under `profile`. The placement
    is decided under the profile the measured binaries were compiled with
    (the default); only the report uses the new one, so the prediction is
    for the very placement that was measured (the hide rule would otherwise
    keep other scopes under a slower compute model)."""
    # A --variant runs its base arm's binary: the same placement.
    base = manifest["arms"].get(arm, {}).get("variant_of", arm)
    # The flags the carry was built with (an arm no longer in ARMS, or one
    # whose definition changed since), else ARMS's.
    flags = manifest["arms"].get(base, {}).get("flags") or ARMS[base][0]
    chosen = manifest["arms"].get(arm, {}).get("chosen")
    if chosen is not None:
        # The lists the build's search chose (actplace-compile checks the
        # goal on the planned arena, which may change the choice).
        flags = [f for f in flags if not f.startswith(GOAL_FLAGS)] + chosen
    opts = placement_options(flags)
    # A goal arm without a recorded choice has it made again, under the
    # profile it was built with; the report then predicts that placement
    # under `profile`.
    report_opts = re.sub(r"(^| )profile=\S+", "", opts).strip()
    placement_report(import_graph(manifest, build), opts,
                     f"{report_opts} profile={profile}", report, build,
                     f"arm {arm}", autodiff_flag(flags), goal_options(flags))


def autodiff_flag(flags):
    """The train-autodiff pass as actplace-compile ran it for `flags`."""
    return ("-train-autodiff=fuse-loss-grad=false"
            if "--fuse-loss-grad=false" in flags else "-train-autodiff")


GOAL_FLAGS = ("--activation-cut", "--memory-budget", "--step-budget")


def chosen_flags(compile_output):
    """The module lists actplace-compile's placement search chose (its last
    'chose:' line; a memory or cut goal may search more than once), as
    flags."""
    chosen = None
    for line in compile_output.splitlines():
        if line.startswith("chose: "):
            chosen = line[len("chose: "):].rsplit(" (", 1)[0]
    if chosen is None:
        sys.exit("actplace-compile printed no 'chose:' line for a goal arm")
    return [] if chosen == "nothing placed" else \
        ["--" + f for f in chosen.split()]


def goal_options(flags):
    """The placement goal among actplace-compile flags, in
    train-plan-budget's option spelling ('' when the arm lists modules)."""
    return " ".join(f[2:] for f in flags if f.startswith(GOAL_FLAGS))


def placement_report(graph, place_opts, report_opts, report, build, what,
                     autodiff="-train-autodiff", goal=""):
    """Places `graph` (actplace-import text) with the placement pipeline's
    options `place_opts` (or, given a `goal`, with train-plan-budget's
    choice under them) and writes the JSON placement report made with
    `report_opts` to `report`."""
    place = (f"-train-plan-budget={place_opts} {goal} log-file=" if goal
             else "-train-placement-pipeline=" + place_opts)
    opt = subprocess.run(
        [os.path.join(build, "actplace-opt"), autodiff, place,
         f"-train-placement-report={report_opts} report-format=json "
         f"report-file={report}", "-o", os.devnull],
        input=graph, capture_output=True, text=True)
    if opt.returncode != 0:
        sys.exit(f"{what}: actplace-opt failed:\n{opt.stderr}")


def placement_options(flags):
    """actplace-compile placement flags -> placement pass options
    (--copy-hold and --side-issue are the lowering's, --fuse-loss-grad
    autodiff's: not placement's)."""
    return " ".join(f[2:] for f in flags
                    if f.startswith("--") and not f.startswith("--copy-hold")
                    and not f.startswith("--side-issue")
                    and not f.startswith("--fuse-loss-grad")
                    and not f.startswith(GOAL_FLAGS))


def cmd_predict(a):
    """The run's reports again, from the same graph and placements, under
    another device profile (actplace-import + actplace-opt, no binary), into
    a copy of the run folder that `table` reads."""
    src = os.path.abspath(a.results)
    dest = os.path.abspath(a.out)
    os.makedirs(dest, exist_ok=True)
    manifest = json.load(open(os.path.join(src, "manifest.json")))
    build = os.path.join(REPO, a.build_dir, "bin")
    with open_result(os.path.join(src, "results.jsonl")) as f, \
            open(os.path.join(dest, "results.jsonl"), "w") as o:
        shutil.copyfileobj(f, o)
    shutil.copy(os.path.join(src, "manifest.json"), dest)
    for arm, info in manifest["arms"].items():
        report = os.path.join(dest, info["report"])
        write_report(manifest, arm, os.path.abspath(a.profile), report, build)
        log(f"[{arm}] wrote {os.path.relpath(report)}")
    # The measured op times go along: the table's measured reload stalls.
    for name in os.listdir(src):
        if name.startswith("op-times") and name.endswith(".json"):
            shutil.copy(os.path.join(src, name), dest)


#===----------------------------------------------------------------------===#
# frontier
#===----------------------------------------------------------------------===#

# The recompute sets `frontier` tries unless --sets says otherwise: the
# profile-placed arms and the additions to elem46 of training.md, run 6.
FRONTIER_SETS = [[], ["layernorm"], ELEM46, ELEM46 + ["qkv_linear"],
                 ELEM46 + ["gdn_in_proj"], ELEM60, ELEM46_FC1,
                 ELEM46 + ["gdn_in_proj", "qkv_linear"],
                 ELEM46_FC1 + ["qkv_linear"]]


# Every leaf the passes recompute together (frontier --leaf-costs).
LEAF_COST_SET = ["attn_norm", "gdn_in_proj", "gdn_prep", "gdn_norm_out",
                 "gdn_out_proj", "qkv_linear", "core_attn", "attn_proj",
                 "mlp_norm", "mlp_fc1", "mlp_act", "mlp_fc2", "final_norm"]


def print_leaf_costs(a, graph, build, profile, rel):
    """What recompute costs per leaf: one placement that recomputes the
    leaves of --sets (default LEAF_COST_SET) at once, its report's
    per-scope recompute times summed over layers, per microbatch."""
    rc = ([n for n in a.sets.split(",") if n] if a.sets
          else LEAF_COST_SET)
    opts = placement_options(["--recompute-modules=" + ",".join(rc)] + (
        ["--profile=" + profile] if profile else []))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "report.json")
        placement_report(graph, opts, opts, path, build,
                         "frontier --leaf-costs")
        report = json.load(open(path))
    per_leaf = {}
    for s in report["recompute_scopes"]:
        leaf = re.sub(r"^L\d+\.|^model\.", "", s["scope"])
        b, sec = per_leaf.get(leaf, (0, 0.0))
        per_leaf[leaf] = (b + s["bytes"], sec + s["seconds_per_microbatch"])
    print(f"# {rel(a.model)}: seq {a.seq}, {a.micro_batches} x "
          f"{a.micro_batch_size} sequences, {a.dtype}; profile "
          f"{rel(a.profile) if a.profile else '(H200 defaults)'}; recompute "
          f"{','.join(rc)} at once; predicted, per microbatch, summed over "
          "layers")
    print("| leaf | bytes spared GB | recompute ms | ms per GB |")
    print("|---|---|---|---|")
    order = sorted(per_leaf.items(),
                   key=lambda kv: kv[1][1] / kv[1][0] if kv[1][0] else 1e30)
    for leaf, (b, sec) in order:
        per_gb = f"{sec * 1e3 / (b / 1e9):.2f}" if b else "-"
        print(f"| {leaf} | {b / 1e9:.3f} | {sec * 1e3:.3f} | {per_gb} |")
    t = report["totals"]
    print(f"total: {t['recomputed_bytes'] / 1e9:.3f} GB recomputed in "
          f"{t['recompute_seconds_per_microbatch'] * 1e3:.3f} ms per "
          "microbatch")


def cmd_frontier(a):
    """Predicted trade-off of recompute sets, each with every other leaf
    offloaded and the hide rule on (and, with --recompute-only, also with
    nothing offloaded: under a profile whose copies cost time, recompute of
    cheap leaves alone can beat recompute + offload), placed and reported
    under one profile: reports only (actplace-import + actplace-opt), no
    binary, no GPU."""
    build = os.path.join(REPO, a.build_dir, "bin")
    manifest = {"model": os.path.abspath(a.model), "seq": a.seq,
                "micro_batch_size": a.micro_batch_size,
                "micro_batches": a.micro_batches, "dtype": a.dtype}
    sets = ([[n for n in s.split(",") if n] for s in a.sets.split(";")]
            if a.sets else FRONTIER_SETS)
    graph = import_graph(manifest, build)
    profile = os.path.abspath(a.profile) if a.profile else ""
    rel = lambda path: os.path.relpath(os.path.abspath(path), REPO)
    if a.leaf_costs:
        return print_leaf_costs(a, graph, build, profile, rel)
    rows = []
    # (recompute set, offload the rest?) pairs.
    variants = [(rc, True) for rc in sets]
    if a.recompute_only:
        variants += [(rc, False) for rc in sets if rc]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (rc, offload) in enumerate(variants):
            flags = ((recompute_offload_rest(rc) if offload else
                      ["--recompute-modules=" + ",".join(rc)]) +
                     (["--profile=" + profile] if profile else []))
            opts = placement_options(flags)
            report = os.path.join(tmp, f"{i}.json")
            name = ",".join(rc) or "(none: offload only)"
            if not offload:
                name += " (no offload)"
            placement_report(graph, opts, opts, report, build,
                             f"frontier: recompute {name}")
            t = json.load(open(report))["totals"]
            before = t["activation_peak_bytes_before"]
            removed = 100.0 * (1 - t["activation_peak_bytes_after"] / before)
            extra = t["step_seconds_after"] - t["step_seconds_before"]
            rows.append((removed, name,
                         extra * 1e3, 100.0 * extra / t["step_seconds_before"],
                         t["offloaded_bytes"] / 1e9,
                         t["recomputed_bytes"] / 1e9))
            log(f"[{len(rows)}/{len(variants)}] {rows[-1][1]}")
    print(f"# {rel(a.model)}: seq {a.seq}, {a.micro_batches} x "
          f"{a.micro_batch_size} sequences, {a.dtype}; profile "
          f"{rel(a.profile) if a.profile else '(H200 defaults)'}; every "
          "other leaf offloaded, hide rule on"
          + (" (rows marked 'no offload': nothing offloaded)"
             if a.recompute_only else "") + "; predicted")
    print("| recompute | act. peak removed % | pred. step +ms | "
          "pred. step + % | offloaded GB per microbatch | recomputed GB per "
          "microbatch |")
    print("|---|---|---|---|---|---|")
    for removed, name, ms, pct, off, rec in sorted(rows):
        print(f"| {name} | {removed:.1f} | {ms:+.2f} | {pct:+.2f} | "
              f"{off:.2f} | {rec:.2f} |")


#===----------------------------------------------------------------------===#
# table
#===----------------------------------------------------------------------===#

MIB = 2.0 ** 20


def fmt_mib(b):
    return "-" if b is None else f"{b / MIB:,.1f}"


def overlap_rows(base, placed):
    """Per compute op kind (label less its layer): time added against the
    same launch (label and occurrence) of `base`, split by whether side
    work covered at least a fifth of the launch; microseconds of side work
    beside it; launches. `base`, `placed`: --op-timeline launch lists."""
    side = sorted((l["start_us"], l["end_us"]) for l in placed
                  if l["stream"] == "side")
    starts = [s for s, _ in side]

    def beside(s, e):
        total = 0.0
        # Side launches are serial on their stream: scan from the last one
        # that starts before `s`.
        i = max(0, bisect.bisect_right(starts, s) - 1)
        for a, b in side[i:]:
            if a >= e:
                break
            total += max(0.0, min(b, e) - max(a, s))
        return total

    def by_occurrence(launches):
        seen, out = {}, {}
        for l in launches:
            if l["stream"] != "compute":
                continue
            k = seen.get(l["label"], 0)
            seen[l["label"]] = k + 1
            out[(l["label"], k)] = l
        return out

    ref = by_occurrence(base)
    rows = {}
    for key, l in by_occurrence(placed).items():
        dur = l["end_us"] - l["start_us"]
        b = ref.get(key)
        added = dur - (b["end_us"] - b["start_us"] if b else 0.0)
        ov = beside(l["start_us"], l["end_us"])
        r = rows.setdefault(re.sub(r"^L\d+\.", "", key[0]),
                            {"beside": 0.0, "alone": 0.0, "side_us": 0.0,
                             "launches": 0})
        r["beside" if ov > 0.2 * dur else "alone"] += added
        r["side_us"] += ov
        r["launches"] += 1
    return rows, sum(b - a for a, b in side)


def cmd_overlap(a):
    d = os.path.abspath(a.results)

    def timeline(arm):
        path = os.path.join(d, f"op-timeline-{arm}.json")
        try:
            with open_result(path) as f:
                return json.load(f)["launches"]
        except FileNotFoundError:
            sys.exit(f"overlap: no {path}[.xz]: record it with run "
                     f"--timeline --op-times-arms {arm}")
    rows, side_us = overlap_rows(timeline(a.base), timeline(a.arm))
    order = sorted(rows.items(), key=lambda kv: -abs(kv[1]["beside"]) -
                   abs(kv[1]["alone"]))
    print(f"# {a.arm} against {a.base} ({os.path.basename(d)}): compute "
          "launches, time added against the same launch of the base arm, "
          "split by whether side work covered >= 1/5 of the launch; us per "
          "step")
    print("| compute op | added beside side work | added alone | side work "
          "beside it | launches |")
    print("|---|---|---|---|---|")
    for name, r in order[:a.top]:
        print(f"| {name} | {r['beside']:+.1f} | {r['alone']:+.1f} | "
              f"{r['side_us']:.1f} | {r['launches']} |")
    tb = sum(r["beside"] for r in rows.values())
    ta = sum(r["alone"] for r in rows.values())
    print(f"| all ({len(rows)} ops) | {tb:+.1f} | {ta:+.1f} | "
          f"{sum(r['side_us'] for r in rows.values()):.1f} | "
          f"{sum(r['launches'] for r in rows.values())} |")
    print(f"\nside stream busy {side_us / 1e3:.2f} ms of the step. A launch "
          "matches the base arm's launch of the same label and occurrence: "
          "an op the placement splits (linear_input_grad + linear_grad "
          "around a rebuild) shows as one op added and one shortened; read "
          "them together.")


def cmd_table(a):
    if a.save:
        # Print to the terminal and into the saved folder.
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            print_table(a)
        print(text.getvalue(), end="")
        save_results(a.results, text.getvalue())
    else:
        print_table(a)


def save_results(run_dir, table):
    """Copies a run folder's results (not the per-process duplicates of
    results.jsonl; op times included) to bench/results/qwen-bench-<run date>-<commit>/ with the
    table as table.md."""
    manifest = json.load(open(os.path.join(run_dir, "manifest.json")))
    stamp = manifest.get("run", {}).get("started", manifest["built"])
    name = "qwen-bench-%s-%s" % (stamp[:10], manifest["commit"][:10])
    dest = os.path.join(REPO, "bench", "results", name)
    os.makedirs(dest, exist_ok=True)
    for f in sorted(os.listdir(run_dir)):
        if f in ("results.jsonl", "manifest.json") or \
                f.startswith(("op-times", "op-timeline")) or \
                f.endswith((".report.json", ".svg", ".log")):
            shutil.copy(os.path.join(run_dir, f), dest)
    open(os.path.join(dest, "table.md"), "w").write(table)
    log("saved", os.path.relpath(dest, REPO))


def print_table(a):
    d = os.path.abspath(a.results)
    manifest = json.load(open(os.path.join(d, "manifest.json")))
    run = manifest.get("run", {})
    rows = [json.loads(l)
            for l in open_result(os.path.join(d, "results.jsonl"))
            if l.strip()]
    arms = [arm for arm in manifest["arms"]
            if any(r["arm"] == arm for r in rows)] or list(manifest["arms"])
    micro = manifest["micro_batches"]
    flops = manifest["train_flops_per_step"]
    peak = a.peak_tflops * 1e12

    stats = {}
    for arm in arms:
        meas = [r for r in rows if r["arm"] == arm and not r["warmup"]]
        rep = json.load(
            open_result(os.path.join(d, manifest["arms"][arm]["report"])))
        t = rep["totals"]
        s = {"n": len(meas), "report": t}
        if meas:
            times = [r["step_time_s"] for r in meas]
            s["median"] = statistics.median(times)
            s["min"], s["max"] = min(times), max(times)
            s["tokens"] = statistics.median(r["tokens_per_s"] for r in meas)
            s["planned"] = max(r["planned_peak_bytes"] for r in meas)
            s["device_peak"] = max(r["device_peak_bytes"] for r in meas)
            s["pinned"] = max(r["pinned_pool"]["bytes"] for r in meas)
            s["pinned_in_use"] = max(r["pinned_pool"]["in_use"] for r in meas)
            last = meas[-1]["transfers"]
            s["d2h"] = sum(v["d2h_bytes"] for v in last.values())
            s["h2d"] = sum(v["h2d_bytes"] for v in last.values())
            s["finite"] = all(r["loss"] is not None for r in meas)
        stats[arm] = s
    procs = run.get("processes", [])
    failed = [p for p in procs if p["rc"] != 0]

    base = stats.get("none", {})
    print(f"# {manifest['model']}: seq {manifest['seq']}, "
          f"{micro} x {manifest['micro_batch_size']} sequences, "
          f"{manifest['dtype']}; commit {manifest['commit'][:10]}"
          + (" + uncommitted changes" if manifest.get("dirty_files") else ""))
    print(f"# {run.get('device', '?')} on {run.get('host', '?')} "
          f"({run.get('gpu_before') or 'no nvidia-smi'}); "
          f"{run.get('warmup')} warm-up + {run.get('steps')} measured steps "
          f"per process, {run.get('rounds')} rounds, arms rotated each round")
    if run.get("stopped"):
        st = run["stopped"]
        print(f"# stopped by --time-limit {st['time_limit_s']:g} s after "
              f"{st['rounds_done']} of {run.get('rounds')} rounds")
    print()
    head = ["arm", "steps", "step ms median [min, max]", "tokens/s", "MFU %",
            "planned peak MiB", "measured peak MiB (vs plan)",
            "predicted peak MiB", "act. peak removed % pred / meas",
            "pinned MiB", "d2h / h2d MiB per step (pred)",
            "pred. exposed ms", "pred. step +ms", "meas. step +ms",
            "meas - pred % of step", "meas. stall ms"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    act_before = base.get("report", {}).get("activation_peak_bytes_before")
    for arm in arms:
        s = stats[arm]
        t = s["report"]
        pred_exposed = t["exposed_transfer_seconds_per_microbatch"] * micro
        pred_delta = t["step_seconds_after"] - t["step_seconds_before"]
        pred_removed = 100 * (1 - t["activation_peak_bytes_after"] /
                              t["activation_peak_bytes_before"])
        if not s["n"]:
            print(f"| {arm} | 0 | no measured steps | | | | | "
                  f"{fmt_mib(t['peak_bytes_after'])} | {pred_removed:.1f} / - "
                  f"| | | {pred_exposed * 1e3:.2f} | {pred_delta * 1e3:.2f} | | "
                  f"| {measured_stall(a.results, arm)} |")
            continue
        mfu = 100 * flops / s["median"] / peak
        vs_plan = 100 * (s["device_peak"] / s["planned"] - 1)
        meas_removed = "-"
        meas_delta = "-"
        err = "-"
        if base.get("n"):
            if act_before:
                meas_removed = (f"{100 * (base['device_peak'] - s['device_peak']) / act_before:.1f}")
            delta = s["median"] - base["median"]
            meas_delta = f"{delta * 1e3:+.2f}"
            err = f"{100 * (delta - pred_delta) / base['median']:+.2f}"
        print(f"| {arm} | {s['n']} | {s['median'] * 1e3:.2f} "
              f"[{s['min'] * 1e3:.2f}, {s['max'] * 1e3:.2f}] | "
              f"{s['tokens']:,.0f} | {mfu:.3g} | {fmt_mib(s['planned'])} | "
              f"{fmt_mib(s['device_peak'])} ({vs_plan:+.2f}%) | "
              f"{fmt_mib(t['peak_bytes_after'])} | {pred_removed:.1f} / "
              f"{meas_removed} | {fmt_mib(s['pinned'])} | "
              f"{fmt_mib(s['d2h'])} / {fmt_mib(s['h2d'])} "
              f"({fmt_mib(t['d2h_bytes_per_step'])}) | {pred_exposed * 1e3:.2f} | "
              f"{pred_delta * 1e3:+.2f} | {meas_delta} | {err} | "
              f"{measured_stall(a.results, arm)} |")
    print()
    variants = [(arm, manifest["arms"][arm]) for arm in arms
                if "variant_of" in manifest["arms"][arm]]
    if variants:
        print("Variants (the base arm's binary and report, run with these "
              "variables; the prediction is the base arm's): " + "; ".join(
                  f"{arm} = {info['variant_of']} with " + " ".join(
                      f"{k}={v}" for k, v in info["env"].items())
                  for arm, info in variants) + ".")
        print()
    print(f"Model FLOPs: {manifest['forward_flops_per_token'] / 1e9:.4g} "
          f"GFLOP forward per token x 3 (forward + backward) x "
          f"{manifest['tokens_per_step']} tokens = {flops / 1e12:.4g} TFLOP "
          f"per step; MFU against {a.peak_tflops} TFLOP/s (formula: "
          f"bench/qwen_train_bench.py docstring).")
    print("Measured peak: device_peak_bytes (cudaMemGetInfo over the step "
          "less the context; host backend: the arena); planned: "
          "planned_peak_bytes; predicted: the memory timeline's peak (cost "
          "model). Activation peak removed: predicted from the report's "
          "activation peaks; measured = (no-offload device peak - arm device "
          "peak) / predicted no-offload activation peak.")
    print("Exposed transfer: predicted = stalls of the simulated streams x "
          "microbatches; 'pred. step +ms' = the cost model's step time with "
          "minus without the placement (recompute included); measured = "
          "median step time minus the no-offload arm's median; 'meas. stall "
          "ms' = the compute stream's waits for reloads per step, from the "
          "arm's op times (run --op-times-arms; '-' without them).")
    bad = [arm for arm in arms if stats[arm]["n"] and
           (stats[arm]["pinned_in_use"] != 0 or not stats[arm]["finite"])]
    if bad:
        print("WARNING: pinned memory in use after a step or a non-finite "
              "loss in:", ", ".join(bad))
    if failed:
        print("FAILED processes:", ", ".join(
            f"{p['arm']} round {p['round']} (rc {p['rc']})" for p in failed))


def measured_stall(results, arm):
    """Milliseconds a step the compute stream waited for reloads in the
    arm's op times (op-times-ARM.json: the '<scope>/wait' labels), or '-'."""
    path = os.path.join(results, f"op-times-{arm}.json")
    if not os.path.exists(path):
        return "-"
    ot = json.load(open(path))
    waits = sum(v["seconds"] for k, v in ot["ops"].items()
                if k.endswith("/wait"))
    return f"{waits / ot['steps'] * 1e3:.2f}"


def add_shape_args(sp):
    """The model and step shape a placement is made for."""
    sp.add_argument("--model", default=os.path.join(REPO, "models",
                                                    "qwen3.5-0.8b.json"))
    sp.add_argument("--seq", type=int, default=4096)
    sp.add_argument("--micro-batch-size", type=int, default=1)
    sp.add_argument("--micro-batches", type=int, default=4)
    sp.add_argument("--dtype", default="bf16")


def add_process_args(sp, arms_help):
    """Where the built binaries are and how each process runs (run, check)."""
    sp.add_argument("--carry", default=os.path.join(REPO, "gpu-carry",
                                                    "qwen-bench"))
    sp.add_argument("--out", required=True)
    sp.add_argument("--arms", default="", help=arms_help)
    sp.add_argument("--device", default="cuda")
    sp.add_argument("--seed", type=int, default=1)
    sp.add_argument("--data", default="synthetic")
    sp.add_argument("--timeout", type=float, default=300,
                    help="seconds per process")
    sp.add_argument("--pack", metavar="FILE.tgz",
                    help="when done, also pack the output folder into one "
                    "gzipped tar (what a device call should bring back)")
    sp.add_argument("--variant", action="append", default=[],
                    metavar="NAME=ARM:VAR=VALUE[;VAR=VALUE]",
                    help="an extra arm NAME: ARM's binary run with the "
                    "environment variables given (ACTPLACE_* switches); "
                    "name it in --arms like a built arm (repeatable)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the arms into a carry folder")
    b.add_argument("--build-dir", default="build-bench")
    add_shape_args(b)
    b.add_argument("--arms", default=",".join(DEFAULT_ARMS))
    b.add_argument("--carry", default=os.path.join(REPO, "gpu-carry",
                                                   "qwen-bench"))
    b.add_argument("--no-rebuild", action="store_true",
                   help="use the build's archives as they are")
    r = sub.add_parser("run", help="run every arm (GPU machine)")
    add_process_args(r, "default: every built arm")
    r.add_argument("--warmup", type=int, default=3)
    r.add_argument("--steps", type=int, default=10)
    r.add_argument("--rounds", type=int, default=1)
    r.add_argument("--time-limit", type=float, default=0, metavar="SECONDS",
                   help="start no round that would end past SECONDS from the "
                   "start (estimated from the longest process so far; the "
                   "first round always runs); the manifest records where "
                   "it stopped (0: no limit)")
    r.add_argument("--op-times-steps", type=int, default=3,
                   help="timed steps of the no-placement binary with "
                   "--op-times after the arms (0: none); writes op-times.json")
    r.add_argument("--op-times-arms", default="",
                   help="placed arms whose op times to record too (',' "
                   "between names; stream mode, --op-times-steps steps): "
                   "their waits for reloads, the table's measured stall")
    r.add_argument("--timeline", action="store_true",
                   help="the stream-mode op-times processes also write the "
                   "last timed step's launches with their streams and spans "
                   "(--op-timeline): op-timeline-ARM.json")
    r.add_argument("--op-times-modes", default="stream",
                   help="the binary's --op-times-mode for those steps, ',' "
                   "between modes (stream: in stream order, nothing waits; "
                   "wait: each launch waited for); the first writes "
                   "op-times.json, others op-times-MODE.json")
    k = sub.add_parser("check", help="bit identity and stability of arms "
                       "(GPU machine): fingerprints, pool, peak, finiteness")
    add_process_args(k, "default: every built arm; the first is the "
                     "fingerprint baseline")
    k.add_argument("--steps", type=int, default=3)
    k.add_argument("--fingerprints", action="store_true",
                   help="SHA-256 fingerprints, compared with the first arm "
                   "(or with --baseline)")
    k.add_argument("--baseline", metavar="NAME.check.jsonl",
                   help="an earlier check's metrics (or its .xz): every arm's "
                   "fingerprints compared with its steps instead of the "
                   "first arm's")
    t = sub.add_parser("table", help="print the table of a run folder")
    t.add_argument("results")
    t.add_argument("--peak-tflops", type=float, default=989.5)
    t.add_argument("--save", action="store_true",
                   help="also copy the run's results, reports, SVGs, logs "
                   "and the table to bench/results/qwen-bench-DATE-COMMIT/")
    c = sub.add_parser("calibrate", help="fit computeScale and "
                       "copySlowdownPerByte to a run; writes a device profile")
    c.add_argument("results")
    c.add_argument("--out", required=True, help="profile JSON to write")
    c.add_argument("--op-scale", default="",
                   help="JSON object: op name -> measured / predicted time "
                   "of that kernel (bench/profiles/h200-kernel-scales.json)")
    c.add_argument("--op-times", default="",
                   help="the no-placement binary's --op-times JSON: opScale "
                   "for every op it timed (overrides --op-scale entries)")
    c.add_argument("--copy-slowdown-from", default="",
                   help="profile whose copySlowdownPerByte to keep when the "
                   "run has no offload-only arm to fit it on")
    c.add_argument("--copy-hold-slack", type=float, default=None,
                   help="copyHoldSlack to write into the profile (offloaded "
                   "bytes held (1 + F) x the predicted D2H time after its "
                   "issue)")
    c.add_argument("--copy-beside", default="",
                   help="JSON of measured per-kernel copy slowdowns, "
                   "{\"h2dSlowdown\": {op or \"*\": ms per GB}, "
                   "\"d2hSlowdown\": {...}} (bench/profiles/"
                   "h200-copy-rates-d29.json): write them, times one "
                   "factor, as the profile's h2dSlowdown / d2hSlowdown in "
                   "place of copySlowdownPerByte")
    c.add_argument("--copy-beside-scale", type=float, default=None,
                   help="that factor (default: least squares over "
                   "--fit-arms)")
    c.add_argument("--side-capacity-arms", default="",
                   help="arms with recompute on the side stream to fit the "
                   "side capacity of --side-capacity-op on (',' between "
                   "names; least squares, golden-section search)")
    c.add_argument("--side-copy-arms", default="",
                   help="arms with side-stream recompute and offload to fit "
                   "the profile's sideStreamCopyScale on (',' between names; "
                   "least squares, after the copy factor and the side "
                   "capacity; --copy-beside only)")
    c.add_argument("--side-capacity-op",
                   default="train.gated_delta_rule_grad",
                   help="the host op whose side capacity is fitted")
    c.add_argument("--fit-arms", default="",
                   help="arms to fit the copy slowdown on (',' between "
                   "names; default: the offload-only arms)")
    c.add_argument("--also", action="append", default=[],
                   metavar="RUN_DIR",
                   help="another run folder (repeatable) whose --fit-arms "
                   "and --side-capacity-arms join the fits, each arm against "
                   "its own folder's none (--copy-beside only); the op "
                   "scales and computeScale still come from RESULTS")
    c.add_argument("--build-dir", default="build-bench")
    f = sub.add_parser("frontier", help="predicted activation-peak cut "
                       "and step-time cost of recompute sets (reports only)")
    f.add_argument("--profile", default=CALIBRATED_PROFILE,
                   help="device profile to place and predict under ('' for "
                   "the H200 defaults)")
    f.add_argument("--sets", default="",
                   help="recompute sets, ';' between sets, ',' between "
                   "leaves (default: the run-6 list)")
    add_shape_args(f)
    f.add_argument("--recompute-only", action="store_true",
                   help="also each recompute set with nothing offloaded")
    f.add_argument("--leaf-costs", action="store_true",
                   help="instead: recompute the leaves of --sets (one set, "
                   "',' between leaves; default every leaf the passes "
                   "recompute together) and print each leaf's predicted "
                   "recompute time and bytes spared, summed over layers")
    f.add_argument("--build-dir", default="build-bench")
    o = sub.add_parser("overlap", help="what side-stream work costs the "
                       "compute kernels beside it, from run --timeline's "
                       "timelines")
    o.add_argument("results")
    o.add_argument("--arm", required=True, help="the placed arm")
    o.add_argument("--base", default="none", help="the arm to compare with")
    o.add_argument("--top", type=int, default=20, help="rows to print")
    pr = sub.add_parser("predict", help="the run's reports under another "
                        "profile, into a copy of the run folder")
    pr.add_argument("results")
    pr.add_argument("--profile", required=True)
    pr.add_argument("--out", required=True)
    pr.add_argument("--build-dir", default="build-bench")
    a = p.parse_args()
    {"build": cmd_build, "run": cmd_run, "table": cmd_table,
     "calibrate": cmd_calibrate, "predict": cmd_predict,
     "frontier": cmd_frontier, "check": cmd_check,
     "overlap": cmd_overlap}[a.cmd](a)


if __name__ == "__main__":
    main()
