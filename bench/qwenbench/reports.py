"""Placement reports without a binary (actplace-import + actplace-opt):
`predict`, `frontier`, and the report of one arm under a profile."""
import json
import re
import os
import shutil
import subprocess
import sys
import tempfile

from . import arms as armtable
from . import modules as modlist
from .common import REPO, log, open_result


def import_graph(manifest, build):
    """The run's model as actplace-import gives it (MLIR text)."""
    return subprocess.run(
        [os.path.join(build, "actplace-import"),
         os.path.join(REPO, manifest["model"]), "--seq", str(manifest["seq"]),
         "--micro-batch-size", str(manifest["micro_batch_size"]),
         "--micro-batches", str(manifest["micro_batches"]), "--dtype",
         manifest["dtype"]], capture_output=True, text=True, check=True).stdout


def write_report(manifest, arm, profile, report, build):
    """The JSON placement report of one arm under `profile`. The placement
    is decided under the profile the measured binaries were compiled with
    (the default); only the report uses the new one, so the prediction is
    for the very placement that was measured (the hide rule would otherwise
    keep other scopes under a slower compute model)."""
    # A --variant runs its base arm's binary: the same placement.
    base = manifest["arms"].get(arm, {}).get("variant_of", arm)
    # The flags the carry was built with (an arm no longer in arms.json, or
    # one whose definition changed since), else the table's.
    flags = manifest["arms"].get(base, {}).get("flags") or armtable.flags(
        armtable.load().get(base), modlist.from_build(build))
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




def print_leaf_costs(a, graph, build, profile, rel):
    """What recompute costs per leaf: one placement that recomputes the
    leaves of --sets (default arms.json's leaf_cost_set) at once, its report's
    per-scope recompute times summed over layers, per microbatch."""
    rc = ([n for n in a.sets.split(",") if n] if a.sets
          else armtable.load().leaf_cost_set)
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
            if a.sets else armtable.load().frontier_sets)
    modules = modlist.from_build(build)
    try:
        for s in sets:
            modules.expand(s, "frontier --sets")
    except modlist.UnknownModule as e:
        sys.exit(str(e))
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
            flags = (armtable.recompute_offload_rest(rc, modules)
                     if offload else ["--recompute-modules=" + ",".join(rc)])
            flags += ["--profile=" + profile] if profile else []
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

