"""profiles.py: one current profile per device, carrying its provenance."""
import glob
import json
import os
import tempfile
import unittest

from qwenbench import profiles


def read_json(path):
    with open(path) as f:
        return json.load(f)


class CurrentProfiles(unittest.TestCase):
    def test_h200_current_with_provenance(self):
        path = profiles.path("h200")
        self.assertTrue(os.path.exists(path), path)
        p = read_json(path)
        profiles.check_provenance(p, path)
        self.assertEqual(next(iter(p)), "provenance")

    def test_every_profile_has_provenance(self):
        files = glob.glob(os.path.join(profiles.PROFILES_DIR, "*.json"))
        self.assertTrue(files)
        for f in files:
            profiles.check_provenance(read_json(f), f)


class Write(unittest.TestCase):
    def test_write_puts_provenance_first(self):
        prov = profiles.provenance(argv=["qwen_train_bench.py", "calibrate",
                                         "RUN DIR", "--out", "p.json"])
        self.assertEqual(prov["command"], "bench/qwen_train_bench.py "
                         "calibrate 'RUN DIR' --out p.json")
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "p.json")
            profiles.write(out, {"computeScale": 1.5,
                                 "provenance": {"stale": "x"}}, prov)
            p = read_json(out)
        self.assertEqual(list(p), ["provenance", "computeScale"])
        self.assertEqual(p["provenance"], prov)

    def test_provenance_of_a_run(self):
        manifest = {"commit": "a" * 40, "dirty_files": ["x.cpp"],
                    "model": "models/tiny-hybrid.json", "seq": 64,
                    "run": {"started": "2026-12-03T06:46:58Z",
                            "gpu_before": "NVIDIA H200, 580"}}
        prov = profiles.provenance(manifest, "/tmp/runs/d53/", argv=["x"])
        self.assertEqual(prov["binary"],
                         "actplace-compile of aaaaaaaaaa + uncommitted "
                         "changes, models/tiny-hybrid.json seq 64, run folder "
                         "d53 (2026-12-03T06:46:58Z)")
        self.assertEqual(prov["device"], "NVIDIA H200, 580")
        for key in profiles.PROVENANCE_KEYS:
            self.assertTrue(prov[key], key)

    def test_check_provenance_errors(self):
        for profile, want in (
                ({"computeScale": 1}, "S: no 'provenance' object"),
                ({"provenance": {"command": "c", "commit": "c",
                                 "date": "d"}}, "S: provenance has no "
                 "'binary'"),
                ({"provenance": {"command": "c", "commit": "c", "date": "d",
                                 "binary": "b", "runs": 3}},
                 "S: provenance['runs'] must be a string")):
            with self.assertRaises(ValueError) as e:
                profiles.check_provenance(profile, "S")
            self.assertIn(want, str(e.exception))


if __name__ == "__main__":
    unittest.main()
