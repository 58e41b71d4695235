"""tables.py: `table --save` writes the run's compact summary from a run
folder (manifest, step records, reports), nothing else."""
import argparse
import contextlib
import io
import json
import os
import tempfile
import unittest

from qwenbench import tables

TOTALS = {"exposed_transfer_seconds_per_microbatch": 0.0,
          "step_seconds_before": 0.30, "step_seconds_after": 0.31,
          "activation_peak_bytes_before": 8 << 30,
          "activation_peak_bytes_after": 4 << 30,
          "peak_bytes_after": 16 << 30, "d2h_bytes_per_step": 1 << 30}


def step(arm, i, seconds, peak):
    return {"arm": arm, "round": 0, "warmup": i == 0,
            "step_time_s": seconds, "tokens_per_s": 1000 / seconds,
            "planned_peak_bytes": peak, "device_peak_bytes": peak,
            "pinned_pool": {"bytes": 0, "in_use": 0}, "loss": 1.0,
            "transfers": {"s": {"d2h_bytes": 0, "h2d_bytes": 0}}}


def run_folder(d):
    manifest = {
        "commit": "b" * 40, "dirty_files": [], "built": "2026-12-04T01:00:00Z",
        "model": "models/tiny-hybrid.json", "seq": 64, "micro_batch_size": 1,
        "micro_batches": 4, "dtype": "bf16", "tokens_per_step": 256,
        "forward_flops_per_token": 1e6, "train_flops_per_step": 7.68e8,
        "arms": {arm: {"flags": flags, "report": arm + ".report.json"}
                 for arm, flags in (("none", []),
                                    ("ref", ["--offload-modules=mlp_act"]))},
        "run": {"host": "h", "device": "host", "warmup": 1, "steps": 3,
                "rounds": 1, "started": "2026-12-04T01:02:03Z",
                "processes": [{"arm": "none", "round": 0, "rc": 0},
                              {"arm": "ref", "round": 0, "rc": 0}]}}
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    rows = [step("none", i, t, 100 << 20)
            for i, t in enumerate((0.5, 0.30, 0.32, 0.31))]
    rows += [step("ref", i, t, 90 << 20)
             for i, t in enumerate((0.5, 0.33, 0.31, 0.35))]
    with open(os.path.join(d, "results.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    for arm in ("none", "ref"):
        with open(os.path.join(d, arm + ".report.json"), "w") as f:
            json.dump({"totals": TOTALS}, f)


class SaveSummary(unittest.TestCase):
    def test_table_save(self):
        with tempfile.TemporaryDirectory() as tmp:
            run = os.path.join(tmp, "run")
            runs = os.path.join(tmp, "runs")
            os.makedirs(run)
            run_folder(run)
            out = io.StringIO()
            with contextlib.redirect_stdout(out), \
                    contextlib.redirect_stderr(io.StringIO()):
                tables.cmd_table(argparse.Namespace(
                    results=run, save=True, runs_dir=runs,
                    peak_tflops=989.5))
            self.assertEqual(os.listdir(runs),
                             ["qwen-bench-2026-12-04-bbbbbbbbbb.md"])
            with open(os.path.join(runs, os.listdir(runs)[0])) as f:
                text = f.read()
        self.assertIn("- commit: " + "b" * 40, text)
        self.assertIn("- command: `bench/qwen_train_bench.py build --model "
                      "models/tiny-hybrid.json --seq 64", text)
        self.assertIn("  - ref: --offload-modules=mlp_act", text)
        # Medians and ranges of the measured (not warm-up) steps, peaks.
        self.assertIn("| none | 3 | 310.00 [300.00, 320.00] |", text)
        self.assertIn("| ref | 3 | 330.00 [310.00, 350.00] |", text)
        self.assertIn(out.getvalue().strip().splitlines()[-1], text)


if __name__ == "__main__":
    unittest.main()
