#!/usr/bin/env python3
#===- generated_kernels.py - --kernels=generated in training binaries -----===#
#
# actplace-compile --kernels=generated launches kernelgen's kernels (SwiGLU,
# residual add, RMSNorm, the sigmoid output gate, GDN's L2 norm and gates,
# RoPE, forward and backward)
# through ap_launch_generated instead of the library's. On the host backend
# the generated host code computes the reference kernels' per-element
# arithmetic with kernelgen's own reduction order (the one its GPU kernels
# use), so every case compares a generated binary with the library binary of
# the same flags within bounds, and generated binaries with each other bit
# for bit:
#
#   bounds     loss and grad norm of each generated binary within
#              LOSS_TOL / GRAD_NORM_TOL of the library binary's, step by step
#              (RMSNorm sums run in kernelgen's lane order, not the
#              reference's), for: no placement; gdn_core_attn, core_attn,
#              attn_proj offloaded; SwiGLU and norms recomputed inside their
#              backward (the generated backward kernels that rebuild y);
#              recompute on the side stream; f32 storage; 2 pipeline stages
#              (mpirun).
#   fused      each residual add whose output the next kernel normalizes
#              runs with that RMSNorm as one generated kernel (the compile
#              reports the pairs, and the JSON report the same count with
#              the bytes and time saved; --fuse-kernels=false keeps them
#              apart), each RMSNorm backward whose dx only a residual
#              add reads runs with that add, and each chain of adds forming
#              an RMSNorm backward's dy runs inside that backward (the
#              compile and the JSON report give those pairs and chains),
#              with the same bits.
#   launched   the generated binary reports generated_launches > 0 in every
#              metrics line, the library one has no such field; the compile
#              prints the kernel count; the binary holds the kernels it
#              needs (the rebuilding backward kernels in the recompute case).
#   placement  in the generated binaries, offload, recompute (fused or on
#              the side stream) and the fusions change no bit
#              (the same fingerprints as the generated binary without
#              placement), every offloaded scope is copied both ways, the
#              pinned pool is empty.
#   ptx        with a CUDA toolkit (libdevice) the binary embeds PTX for
#              sm_90a with the kernels' entries; without one the compile
#              warns and the binary has none (reported as such).
#   adamw      --kernels=auto generating only the AdamW update and the grad
#              norm gives the library binary's bits (parameters, optimizer
#              state, loss, grad norm).
#   errors     --kernels=generated with --emit=cpp or --keep-source is
#              refused naming the reason; --emit=mlir shows the calls.
#
#===------------------------------------------------------------------------===#
import json
import os
import re
import subprocess
import sys

from e2echeck import check, exit_status, placement_steps_agree
from data_parallel import replicated_runner

STEPS = 3
OFFLOAD = ["--offload-modules=gdn_core_attn,core_attn,attn_proj",
           "--hide-rule=off"]
CASES = {
    "none": [],
    "offload": OFFLOAD,
    "recompute-fused": ["--recompute-modules=mlp_act,mlp_norm,gdn_norm_out"],
    "recompute-side": ["--recompute-modules=gdn_in_proj,gdn_prep,mlp_fc1",
                       "--recompute-stream=side"] + OFFLOAD,
    "f32": ["--dtype", "f32"] + OFFLOAD,
    "unfused": ["--fuse-kernels=false"] + OFFLOAD,
}


# Generated kernels against the library ones: the same per-element
# arithmetic, but row and column sums (RMSNorm) in kernelgen's lane order
# rather than the reference's sequential one, so losses and grad norms agree
# within these relative bounds (3 steps of the tiny model, bf16 or f32;
# measured: at most 8.6e-8 on the loss).
LOSS_TOL = 1e-4
GRAD_NORM_TOL = 1e-3


def close_to_library(name, lib, gen):
    """Each step's loss and grad norm of `gen` within the bounds of `lib`'s;
    returns the largest relative differences seen."""
    worst = {"loss": 0.0, "grad_norm": 0.0}
    check(len(lib) == len(gen), "%s: %d library and %d generated metrics "
          "lines" % (name, len(lib), len(gen)))
    for x, y in zip(lib, gen):
        for key, tol in (("loss", LOSS_TOL), ("grad_norm", GRAD_NORM_TOL)):
            if key not in x:
                continue
            rel = abs(x[key] - y[key]) / max(abs(x[key]), 1e-30)
            worst[key] = max(worst[key], rel)
            check(rel <= tol, "%s step %d: %s %r against the library's %r "
                  "(relative %.2e, bound %.0e)" %
                  (name, x["step"], key, y[key], x[key], rel, tol))
    return worst


def libdevice():
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                 "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(
                root, "nvvm", "libdevice", "libdevice.10.bc")):
            return True
    return False


def compile_both(t, name, flags):
    """The library and the generated binary of `flags`; the generated
    compile's output."""
    lib = t.compile(name + "-lib", "--micro-batches", "2", *flags)
    gen_path = t.path(name + "-gen")
    cmd = [t.args.compile, t.args.model, "-o", gen_path, "--seq", "16",
           "--micro-batches", "2", "--kernels=generated",
           "--report-json", gen_path + ".report.json"] + flags
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 0, "%s: generated compile failed: %s" %
          (name, r.stderr))
    return lib, gen_path, r


def main():
    args, t = replicated_runner(mpirun_required=False)
    have_ptx = libdevice()

    gen_lines, lib_lines = {}, {}
    for name, flags in CASES.items():
        lib, gen, out = compile_both(t, name, flags)
        m = re.search(r"generated kernels: (\d+) \((\d+) launches",
                      out.stdout)
        check(m and int(m.group(1)) > 0 and int(m.group(2)) > 0,
              "%s: the compile reports no generated kernels:\n%s" %
              (name, out.stdout[-400:]))
        _, a = t.train(lib, 1, "--steps", str(STEPS),
                       metrics=name + "-lib.jsonl")
        _, b = t.train(gen, 1, "--steps", str(STEPS),
                       metrics=name + "-gen.jsonl")
        a, b = a[0], b[0]
        check(len(a) == STEPS and len(b) == STEPS,
              "%s: %d / %d metrics lines" % (name, len(a), len(b)))
        worst = close_to_library(name, a, b)
        for x, y in zip(a, b):
            check("generated_launches" not in x,
                  "%s step %d: the library binary reports generated "
                  "launches" % (name, x["step"]))
            check(y.get("generated_launches", 0) > 0,
                  "%s step %d: no generated launches (%s)" %
                  (name, y["step"], y.get("generated_launches")))
        gen_lines[name] = b
        lib_lines[name] = a
        with open(gen, "rb") as f:
            image = f.read()
        dtype = "f32" if name == "f32" else "bf16"
        # (Every residual add of the tiny model runs inside a fused norm
        # kernel unless fusion is off.)
        needed = ["ap_kg_swiglu_fwd_" + dtype,
                  "ap_kg_sigmoid_gate_fwd_" + dtype,
                  "ap_kg_sigmoid_gate_bwd_" + dtype,
                  "ap_kg_l2norm_fwd_" + dtype, "ap_kg_l2norm_bwd_" + dtype,
                  "ap_kg_gdn_gates_fwd_" + dtype,
                  "ap_kg_gdn_gates_bwd_" + dtype,
                  "ap_kg_rope_fwd_" + dtype, "ap_kg_rope_bwd_" + dtype,
                  "ap_kg_gradnorm_sq_f32", "ap_kg_gradnorm_finish"]
        if name == "unfused":
            needed.append("ap_kg_residual_add_" + dtype)
        if name == "recompute-fused":
            needed += ["ap_kg_swiglu_bwd_y_" + dtype,
                       "ap_kg_rmsnorm_bwd_zc_dw_y_k_" + dtype]
        # The row-wise groups take 1, 2 or 4 rows a warp by their row
        # length (kernelName's _r2 / _r4); the norm backwards of the tiny
        # model's narrow rows take the register path (_k).
        rows = ["ap_kg_l2norm_fwd_", "ap_kg_l2norm_bwd_"]
        for k in needed:
            pattern = re.escape(k.encode())
            for prefix in rows:
                if k.startswith(prefix):
                    pattern = (re.escape(prefix[:-1].encode()) +
                               rb"(_r[24])?_" + re.escape(dtype.encode()))
            check(re.search(pattern + rb"\0", image) is not None,
                  "%s: the binary has no generated kernel %s" % (name, k))
        if have_ptx:
            check(b".target sm_90a" in image and
                  b".visible .entry ap_kg_swiglu_fwd_" + dtype.encode() in
                  image, "%s: no PTX for sm_90a in the binary" % name)
        else:
            check("no CUDA toolkit" in out.stderr,
                  "%s: no libdevice here and no warning: %s" %
                  (name, out.stderr))
        fused = re.search(r"kernel fusion: (\d+) residual add \+ RMSNorm",
                          out.stdout)
        fused_pairs = int(fused.group(1)) if fused else 0
        # The JSON report records the fusion the compile printed.
        with open(gen + ".report.json") as f:
            report = json.load(f)
        entry = report.get("kernel_fusion")
        check((entry or {}).get("pairs", 0) == fused_pairs and
              (fused_pairs == 0 or entry["saved_read_bytes"] > 0 and
               entry["predicted_saving_us"] > 0),
              "%s: the report's kernel_fusion %s, the compile printed %d "
              "pairs" % (name, entry, fused_pairs))
        grad_fused = re.search(r"kernel fusion: (\d+) RMSNorm backward \+ "
                               r"residual add", out.stdout)
        grad_pairs = int(grad_fused.group(1)) if grad_fused else 0
        back = report.get("kernel_fusion_backward")
        check((back or {}).get("pairs", 0) == grad_pairs and
              (grad_pairs == 0 or back["saved_write_and_read_bytes"] > 0),
              "%s: the report's kernel_fusion_backward %s, the compile "
              "printed %d pairs" % (name, back, grad_pairs))
        if name == "unfused":
            check(grad_pairs == 0 and b"_dw_add_" not in image,
                  "unfused: --fuse-kernels=false fused %d RMSNorm backward "
                  "+ add pairs" % grad_pairs)
        else:
            check(grad_pairs > 0 and
                  re.search(rb"ap_kg_rmsnorm_bwd_zc_dw_add(_sum[234])?_k_" +
                            dtype.encode(), image) is not None,
                  "%s: no RMSNorm backward + residual add fused (%d pairs)" %
                  (name, grad_pairs))
        sums = re.search(r"kernel fusion: (\d+) chains of residual adds "
                         r"\((\d+) adds\)", out.stdout)
        chains = int(sums.group(1)) if sums else 0
        chain_adds = int(sums.group(2)) if sums else 0
        dy_sum = report.get("kernel_fusion_dy_sum")
        check((dy_sum or {}).get("pairs", 0) == chains and
              (chains == 0 or dy_sum["saved_write_and_read_bytes"] > 0),
              "%s: the report's kernel_fusion_dy_sum %s, the compile printed "
              "%d chains" % (name, dy_sum, chains))
        if name == "unfused":
            check(chains == 0 and re.search(rb"ap_kg_rmsnorm_bwd\w*_sum[234]",
                                            image) is None,
                  "unfused: --fuse-kernels=false fused %d add chains" % chains)
        else:
            check(chains > 0 and chain_adds >= chains and
                  re.search(rb"ap_kg_rmsnorm_bwd_zc_dw(_add)?_sum[234]_k_" +
                            dtype.encode(), image) is not None,
                  "%s: no add chain fused into an RMSNorm backward (%d)" %
                  (name, chains))
        if name == "unfused":
            check(fused_pairs == 0 and b"ap_kg_add_rmsnorm" not in image,
                  "unfused: --fuse-kernels=false fused %d pairs" % fused_pairs)
        else:
            check(fused_pairs > 0 and
                  re.search(rb"ap_kg_add_rmsnorm_fwd_zc(_r[24])?_" +
                            dtype.encode(), image) is not None,
                  "%s: no residual add + RMSNorm fused (%d pairs)" %
                  (name, fused_pairs))
        print("%s: %s generated kernels, %d add + RMSNorm and %d RMSNorm "
              "backward + add pairs and %d add chains (%d adds) fused, "
              "within the bounds of the library binary over %d steps "
              "(loss %.1e, grad norm %.1e relative; %s launches a step)" %
              (name, m.group(1) if m else "?", fused_pairs, grad_pairs,
               chains, chain_adds, STEPS,
               worst["loss"], worst["grad_norm"],
               b[0].get("generated_launches") if b else "?"), flush=True)
    print("ptx: " + ("embedded (sm_90a)" if have_ptx else
                     "skipped: no CUDA toolkit with libdevice here"),
          flush=True)

    # Placement inside the generated binaries.
    placement_steps_agree(0, gen_lines["none"], gen_lines["offload"])
    for name in ("recompute-fused", "recompute-side", "unfused"):
        for x, y in zip(gen_lines["none"], gen_lines[name]):
            check(x["fingerprints"] == y["fingerprints"],
                  "%s step %d: %s changed the bits of the generated binary" %
                  (name, x["step"],
                   "fusion" if name == "unfused" else "recompute"))
    print("placement and fusion: generated binaries bitwise equal to the "
          "generated one without placement", flush=True)

    # The AdamW update and the grad norm alone generated (--kernels=auto with
    # only their ratios measured faster): kernelgen's AdamW performs the
    # reference's operations in order with the same scalars
    # (kernels::adamWScalars); its grad norm sums each block's squares in
    # the library's CUDA order, which here, on the host, differs from the
    # reference's sequential one only in the last bits of an f64 sum, below
    # the f32 norm's rounding (on the GPU gpu-check's arm
    # norm+adamw-generated is bitwise by construction). So the binary is the
    # library one bit for bit: parameters, optimizer state, loss, grad norm.
    prof = t.path("adamw-profile.json")
    with open(prof, "w") as f:
        json.dump({"generatedKernelRatio": {"train.adamw": 0.5,
                                            "train.finalize_grads": 0.5}}, f)
    adam = t.path("adamw-gen")
    r = subprocess.run([args.compile, args.model, "-o", adam, "--seq", "16",
                        "--micro-batches", "2", "--kernels=auto",
                        "--profile=" + prof], capture_output=True, text=True)
    check(r.returncode == 0 and
          "generated for train.finalize_grads, train.adamw;" in r.stdout,
          "adamw: the auto compile failed or chose otherwise: %s%s" %
          (r.stdout[-300:], r.stderr))
    _, c = t.train(adam, 1, "--steps", str(STEPS), metrics="adamw-gen.jsonl")
    c = c[0]
    with open(adam, "rb") as f:
        image = f.read()
    for k in ("ap_kg_adamw_gradf32_copybf16", "ap_kg_gradnorm_sq_f32",
              "ap_kg_gradnorm_finish"):
        check(k.encode() + b"\0" in image,
              "adamw: the binary has no generated kernel " + k)
    check(len(c) == STEPS, "adamw: %d metrics lines" % len(c))
    for x, y in zip(lib_lines["none"], c):
        check(x["fingerprints"] == y["fingerprints"] and
              x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"] and
              y.get("generated_launches", 0) > 0,
              "adamw step %d: the generated AdamW and grad norm binary "
              "differs from the library one (or launched none: %s)" %
              (x["step"], y.get("generated_launches")))
    print("adamw: the update and grad norm through kernelgen's kernels (%s "
          "launches a step) are the library binary bit for bit over %d steps"
          % (c[0].get("generated_launches"), STEPS), flush=True)

    # Errors and the MLIR form.
    for bad in (["--emit=cpp"], ["--keep-source"]):
        r = subprocess.run([args.compile, args.model, "-o", t.path("bad"),
                            "--kernels=generated"] + bad,
                           capture_output=True, text=True)
        check(r.returncode != 0 and "no readable C++ form" in r.stderr,
              "--kernels=generated %s: expected a refusal, got %d: %s" %
              (bad, r.returncode, r.stderr))
    r = subprocess.run([args.compile, args.model, "-o", t.path("step.mlir"),
                        "--kernels=generated", "--emit=mlir"],
                       capture_output=True, text=True)
    text = open(t.path("step.mlir")).read() if r.returncode == 0 else ""
    check("llvm.call @ap_launch_generated" in text and
          re.search(r"llvm\.func @ap_kg_rmsnorm_fwd_zc(_r[24])?_bf16_packed",
                    text) is not None,
          "--emit=mlir: no generated launches or kernels in the module")

    # Two pipeline stages: each stage's program has its own table; the
    # host kernels are defined once in the binary.
    if args.mpirun:
        lib, gen, _ = compile_both(t, "pp2", ["--micro-batches", "4",
                                              "--pipeline-parallel=2"])
        _, a = t.train(lib, 2, "--steps", "2", metrics="pp2-lib.jsonl")
        _, b = t.train(gen, 2, "--steps", "2", metrics="pp2-gen.jsonl")
        for rank in range(2):
            close_to_library("pp2 stage %d" % rank, a[rank], b[rank])
            check(len(b[rank]) == 2 and
                  all(y.get("generated_launches", 0) > 0 for y in b[rank]),
                  "pp2 stage %d: no generated launches" % rank)
        print("pp2: both stages within the bounds of the library binary",
              flush=True)
    else:
        print("pp2: skipped (no mpirun)", flush=True)

    return exit_status("generated kernels: all checks passed")


if __name__ == "__main__":
    sys.exit(main())
