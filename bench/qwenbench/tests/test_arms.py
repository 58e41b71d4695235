"""arms.py: arms.json as data, checked, and the flags each arm builds with."""
import copy
import json
import os
import unittest

from qwenbench import arms, modules, profiles

MODULES = modules.parse_listing("""attn_norm leaf shared
gdn_prep leaf gdn
gdn_core_attn leaf gdn
gdn_norm_out leaf gdn
core_attn leaf attention
mlp_fc1 leaf mlp
mlp_act leaf mlp
final_norm leaf model
mlp alias mlp_fc1,mlp_act
layernorm alias attn_norm,final_norm
""")

BASE = {"arms": [{"name": "none", "what": "nothing", "default": True}]}


def table_with(entry):
    data = copy.deepcopy(BASE)
    data["arms"].append(entry)
    return data


def read_json(path):
    with open(path) as f:
        return json.load(f)


class ArmsFile(unittest.TestCase):
    def test_default_arms(self):
        self.assertEqual(arms.load().default,
                         ["none", "ref", "ref+norm", "all", "max", "cal3",
                          "elem46", "elem60", "elem46-fc1"])

    def test_profiles_exist(self):
        for arm in arms.load().arms.values():
            if arm.profile:
                self.assertTrue(os.path.exists(profiles.path(arm.profile)),
                                arm.name)


class Flags(unittest.TestCase):
    def setUp(self):
        self.t = arms.load()

    def test_fixed_lists(self):
        self.assertEqual(arms.flags(self.t.get("none"), MODULES), [])
        self.assertEqual(arms.flags(self.t.get("ref"), MODULES),
                         ["--offload-modules=gdn_core_attn", "--fraction=1"])

    def test_offload_rest(self):
        # Aliases in the recompute list expand before "the rest" is taken.
        arm = arms.parse(table_with(
            {"name": "x", "what": "w", "recompute": ["layernorm", "mlp_act"],
             "offload": "rest"})).get("x")
        self.assertEqual(arms.flags(arm, MODULES), [
            "--recompute-modules=layernorm,mlp_act",
            "--offload-modules=gdn_prep,gdn_core_attn,gdn_norm_out,"
            "core_attn,mlp_fc1"])

    def test_goal_and_profile(self):
        f = arms.flags(self.t.get("auto3-side"), MODULES)
        self.assertEqual(f, ["--step-budget=0.03",
                             "--profile=" + profiles.path("h200"),
                             "--recompute-stream=side"])

    def test_unknown_module_refused(self):
        arm = arms.parse(table_with({"name": "bad", "what": "w",
                                     "offload": ["gdn_core_atn"]})).get("bad")
        with self.assertRaises(modules.UnknownModule) as e:
            arms.flags(arm, MODULES)
        self.assertIn("arm 'bad': offload: unknown module 'gdn_core_atn'",
                      str(e.exception))
        with self.assertRaises(modules.UnknownModule):
            arms.check(arms.parse(table_with(
                {"name": "bad", "what": "w", "recompute": ["mlpp"],
                 "offload": "rest"})), MODULES)

    def test_unknown_arm(self):
        with self.assertRaises(KeyError) as e:
            self.t.get("nosuch")
        self.assertIn("unknown arm 'nosuch' (known: none, ref,",
                      str(e.exception))


class ParseErrors(unittest.TestCase):
    def check(self, entry, want):
        with self.assertRaises(ValueError) as e:
            arms.parse(table_with(entry), "ARMS")
        self.assertIn(want, str(e.exception))

    def test_errors(self):
        self.check({"name": "a", "what": "w", "offlaod": []},
                   "ARMS: arm 'a': unknown field 'offlaod'")
        self.check({"name": "none", "what": "w"},
                   "ARMS: arm 'none': given twice")
        self.check({"name": "a"}, "arm 'a': 'what' must say")
        self.check({"name": "a", "what": "w", "goal": "cut=0.6"},
                   "arm 'a': 'goal' must be one of activation-cut=...")
        self.check({"name": "a", "what": "w", "goal": "step-budget=0.03",
                    "recompute": ["mlp"]},
                   "arm 'a': a 'goal' arm names no modules")
        self.check({"name": "a", "what": "w",
                    "flags": ["--offload-modules=mlp"]},
                   "arm 'a': flag '--offload-modules=mlp' belongs in the "
                   "arm's own field")
        self.check({"name": "a", "what": "w", "profile": "nosuchdevice"},
                   "arm 'a': profile 'nosuchdevice': no such file")
        self.check({"name": "a", "what": "w", "offload": "all"},
                   "arm 'a': 'offload' (or \"rest\"): expected a list")
        for shape in ({"micro_batch_size": 2}, {"micro_batch_size": 0,
                                                "micro_batches": 4},
                      {"micro_batch_size": 2.0, "micro_batches": 2},
                      {"micro_batch_size": 2, "micro_batches": 2, "seq": 8},
                      [2, 2]):
            self.check({"name": "a", "what": "w", "shape": shape},
                       "arm 'a': 'shape' must be an object of positive "
                       "integers micro_batch_size and micro_batches")


class Shapes(unittest.TestCase):
    def test_own_shape_keeps_the_tokens(self):
        t = arms.parse(table_with(
            {"name": "two", "what": "w",
             "shape": {"micro_batch_size": 2, "micro_batches": 2}}))
        self.assertEqual(arms.shape_of(t.get("none"), 1, 4, 64), (1, 4))
        self.assertEqual(arms.shape_of(t.get("two"), 1, 4, 64), (2, 2))
        with self.assertRaises(ValueError) as e:
            arms.shape_of(t.get("two"), 1, 8, 64)
        self.assertIn("arm 'two': shape 2 x 2 is 256 tokens a step, the "
                      "build's 8 x 1 is 512", str(e.exception))

    def test_shape_arms_in_the_file(self):
        t = arms.load()
        for name, shape in (("none-2x2", (2, 2)), ("none-1x4", (4, 1))):
            arm = t.get(name)
            self.assertEqual(arm.shape, shape)
            self.assertEqual(arms.shape_of(arm, 1, 4, 4096), shape)

    def test_arms_json_round_trip(self):
        # The file parses as the loader reads it; names are unique.
        data = read_json(arms.ARMS_FILE)
        names = [a["name"] for a in data["arms"]]
        self.assertEqual(len(names), len(set(names)))
        self.assertEqual(list(arms.parse(data).arms), names)


if __name__ == "__main__":
    unittest.main()
