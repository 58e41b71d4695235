"""`calibrate`: a device profile fitted to a run folder."""
import json
import re
import os
import statistics
import subprocess
import sys
import tempfile
import typing

from . import profiles
from .common import REPO, log, open_result
from .reports import import_graph, write_report


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
    if a.generated_op_times:
        if not a.op_times:
            sys.exit("calibrate: --generated-op-times needs --op-times (the "
                     "library binary's, to compare with)")
        base["generatedKernelRatio"] = generated_kernel_ratios(
            json.load(open(a.op_times)), json.load(open(a.generated_op_times)))
        for name, r in base["generatedKernelRatio"].items():
            log(f"  {name}: generated / library kernel time x{r}")

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
            # the same launches back to back in the step (by 9 % on the
            # H200; bench/notes/training.md has the figures). The
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
                                 scale, none_meas, none_pred, extra,
                                 profiles.provenance(manifest, d))
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
        # the tight-hold arms measured no compute stall (an A/B of hold
        # margins in bench/notes/training.md).
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
    profiles.write(a.out, profile, profiles.provenance(manifest, d))
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
    increase. bench/notes/training.md has a fit made by hand the same
    way."""
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
                      none_meas, none_pred, extra=(), prov=None):
    """calibrate --copy-beside: copies slow the kernels beside them at the
    measured per-kernel rates times one factor, given
    (--copy-beside-scale) or fitted by least squares over the fit arms
    (their measured step increase above none against the predicted one;
    predictions are close to linear in the factor, so two reports per arm,
    at 0 and 1, fix each line). `extra` (FitRun, calibrate --also): other
    run folders whose fit arms join the fit, each against its own none.
    `prov`: the profile's provenance (default: this process, no run)."""
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
    profiles.write(a.out, profile, prov or profiles.provenance())
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


# The train ops kernelgen generates (actplace-compile --kernels, KernelAbi.h);
# train.add_rms_norm is the fused residual add + RMSNorm.
GENERATED_OPS = ("train.swiglu", "train.swiglu_grad", "train.add",
                 "train.rms_norm", "train.rms_norm_grad", "train.output_gate",
                 "train.output_gate_grad", "train.l2_norm",
                 "train.l2_norm_grad", "train.gated_rms_norm",
                 "train.gated_rms_norm_grad", "train.gdn_gates",
                 "train.gdn_gates_grad", "train.rope", "train.rope_grad",
                 "train.finalize_grads", "train.adamw")


def generated_kernel_ratios(library, generated):
    """generatedKernelRatio from the --op-times of a library binary and of
    the same model compiled with --kernels=generated (dicts as the binaries
    write them): per generated op, the mean time per launch of the
    generated kernel over the library kernel's, both over the launch labels
    the two runs share with the same count (the same calls at the same
    shapes; a "(recompute)" rebuild counts as its op). train.add_rms_norm:
    the fused kernel's mean over the library's mean residual add plus mean
    RMSNorm of the same scopes (which add fed which norm is not in the
    labels; the adds of all scopes are averaged); train.rms_norm_grad_add
    likewise against the RMSNorm backward and the mean add, plus the adds
    of the norm's scope the generated run fused into it (the chain forming
    dy), and train.rms_norm_grad_sum (or, where only _add kernels carry
    chains, the same ratio) against the backward and its chain."""
    lib, gen = library["ops"], generated["ops"]
    sums = {}
    for label, g in gen.items():
        name = op_name_of_label(label)
        if name not in GENERATED_OPS:
            continue
        lt = lib.get(label)
        if not lt or lt["count"] != g["count"] or not g["count"]:
            continue
        acc = sums.setdefault(name, [0.0, 0.0])
        acc[0] += g["seconds"]
        acc[1] += lt["seconds"]
    ratios = {name: round(gs / ls, 4) for name, (gs, ls) in sorted(sums.items())
              if gs > 0 and ls > 0}

    def mean(ops, label_ok):
        n = sum(t["count"] for k, t in ops.items() if label_ok(k))
        sec = sum(t["seconds"] for k, t in ops.items() if label_ok(k))
        return sec / n if n else 0.0
    # The fused kernels against the library's norm (forward or backward)
    # of the same scopes plus its mean residual add.
    fused = [k for k in gen if op_name_of_label(k) == "train.add_rms_norm"]
    if fused:
        scopes = {k.rsplit("/", 1)[0] for k in fused}
        f = mean(gen, lambda k: k in fused)
        norm = mean(lib, lambda k: op_name_of_label(k) == "train.rms_norm"
                    and k.rsplit("/", 1)[0] in scopes)
        add = mean(lib, lambda k: op_name_of_label(k) == "train.add")
        if f > 0 and norm + add > 0:
            ratios["train.add_rms_norm"] = round(f / (norm + add), 4)
    # The fused norm backwards against the library kernels they replace:
    # the RMSNorm backward of their scopes, for _add a mean residual add per
    # launch, and the adds of their scopes that the generated run no longer
    # launches (the chain forming dy, which carries the norm's scope). One
    # ratio of totals: with both fusions in one kernel it is the time of
    # everything the kernel replaces, which the cost model spreads over the
    # norm, its residual add and the chain's adds alike.
    add = mean(lib, lambda k: op_name_of_label(k) == "train.add")
    chained = False
    for fused_op in ("train.rms_norm_grad_add", "train.rms_norm_grad_sum"):
        fused = [k for k in gen if op_name_of_label(k) == fused_op]
        if not fused:
            continue
        scopes = {k.rsplit("/", 1)[0] for k in fused}
        f = sum(gen[k]["seconds"] for k in fused)
        launches = sum(gen[k]["count"] for k in fused)
        in_scopes = [k for k in lib if k.rsplit("/", 1)[0] in scopes]
        norm = sum(lib[k]["seconds"] for k in in_scopes
                   if op_name_of_label(k) == "train.rms_norm_grad")
        chain = [k for k in in_scopes
                 if op_name_of_label(k) == "train.add" and k not in gen]
        replaced = norm + sum(lib[k]["seconds"] for k in chain)
        if fused_op == "train.rms_norm_grad_add":
            replaced += add * launches
        if f > 0 and replaced > 0:
            ratios[fused_op] = round(f / replaced, 4)
            chained = chained or bool(chain)
    # A chain fused into the _add kernels only: the same ratio prices its
    # adds.
    if chained and "train.rms_norm_grad_sum" not in ratios and \
            "train.rms_norm_grad_add" in ratios:
        ratios["train.rms_norm_grad_sum"] = ratios["train.rms_norm_grad_add"]
    return ratios


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

