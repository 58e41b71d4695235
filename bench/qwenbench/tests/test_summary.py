"""summary.py: the compact record a run commits."""
import glob
import os
import tempfile
import unittest

from qwenbench import summary

MANIFEST = {
    "commit": "ad6cc0bafe24ec45cad6e1909d8a2f2d8f83f1c6",
    "dirty_files": ["bench/x.py"], "built": "2026-12-03T06:12:18Z",
    "model": "models/qwen3.5-0.8b.json", "seq": 4096,
    "micro_batch_size": 1, "micro_batches": 4, "dtype": "bf16",
    "arms": {
        "none": {"flags": []},
        "auto3": {"flags": ["--step-budget=0.03",
                            "--profile=/root/src/bench/profiles/h200.json"],
                  "chosen": ["--recompute-modules=mlp_act"]},
    },
    "run": {"host": "vm", "device": "cuda", "gpu_before": "NVIDIA H200",
            "warmup": 3, "steps": 10, "rounds": 3, "seed": 1,
            "data": "synthetic", "env": {},
            "started": "2026-12-03T06:46:58Z",
            "finished": "2026-12-03T06:53:19Z",
            "processes": [{"arm": "none", "round": 0, "rc": 0},
                          {"arm": "auto3", "round": 0, "rc": 1}]},
}
TABLE = "| arm | steps | step ms median [min, max] |\n|---|---|---|\n" \
        "| none | 30 | 309.44 [307.25, 313.99] |\n"


class Summary(unittest.TestCase):
    def test_run_summary(self):
        self.assertEqual(summary.run_name(MANIFEST),
                         "qwen-bench-2026-12-03-ad6cc0bafe")
        text = summary.summary(MANIFEST, TABLE)
        lines = text.splitlines()
        self.assertEqual(lines[0], "# qwen-bench-2026-12-03-ad6cc0bafe")
        self.assertIn("- date: run 2026-12-03T06:46:58Z to "
                      "2026-12-03T06:53:19Z; built 2026-12-03T06:12:18Z",
                      lines)
        self.assertIn("- commit: ad6cc0bafe24ec45cad6e1909d8a2f2d8f83f1c6 + "
                      "uncommitted changes in bench/x.py", lines)
        self.assertIn("- command: `bench/qwen_train_bench.py build --model "
                      "models/qwen3.5-0.8b.json --seq 4096 "
                      "--micro-batch-size 1 --micro-batches 4 --dtype bf16 "
                      "--arms none,auto3`", lines)
        self.assertIn("- run settings (`run`): device=cuda warmup=3 "
                      "steps=10 rounds=3 seed=1 data=synthetic", lines)
        self.assertIn("- processes: 2, failed: 1; auto3 round 0 exit 1",
                      lines)
        # The build machine's checkout path is dropped.
        self.assertIn("  - auto3: --step-budget=0.03 "
                      "--profile=bench/profiles/h200.json -> chose "
                      "--recompute-modules=mlp_act", lines)
        self.assertIn("| none | 30 | 309.44 [307.25, 313.99] |", lines)

    def test_write(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = summary.write("x\n", "qwen-bench-a-b", tmp)
            self.assertEqual(path, os.path.join(tmp, "qwen-bench-a-b.md"))
            with open(path) as f:
                self.assertEqual(f.read(), "x\n")

    def test_check_summary(self):
        ok = summary.check_summary({"commit": "c" * 40, "arms": ["none", "max"],
                                    "steps": 3, "fingerprints": True,
                                    "violations": [], "gpu": "H200"}, "chk")
        self.assertIn("- command: `bench/qwen_train_bench.py check --arms "
                      "none,max --steps 3 --fingerprints`", ok)
        self.assertIn("- result: PASS", ok)
        bad = summary.check_summary({"violations": ["step 2: NaN"]}, "chk")
        self.assertIn("- result: FAIL (1 violations)\n  - step 2: NaN", bad)


class CommittedSummaries(unittest.TestCase):
    """Every committed run summary names its commit and command."""

    def test_headers(self):
        files = glob.glob(os.path.join(summary.RUNS_DIR, "*.md"))
        self.assertTrue(files)
        for f in files:
            if os.path.basename(f) == "README.md":
                continue
            with open(f) as fh:
                text = fh.read()
            self.assertTrue(text.startswith("# "), f)
            self.assertIn("\n- commit: ", text, f)
            self.assertIn("\n- command: ", text, f)
            self.assertLess(len(text), 20000, f)


if __name__ == "__main__":
    unittest.main()
