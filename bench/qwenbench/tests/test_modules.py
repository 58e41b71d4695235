"""modules.py: the compiler's module listing, parsed and used."""
import os
import unittest

from qwenbench import arms, modules

LISTING = """attn_norm leaf shared
gdn_core_attn leaf gdn
mlp_fc1 leaf mlp
mlp_act leaf mlp
final_norm leaf model
mlp alias mlp_fc1,mlp_act
layernorm alias attn_norm,final_norm
"""


class ParseListing(unittest.TestCase):
    def test_leaves_kinds_aliases(self):
        m = modules.parse_listing(LISTING)
        self.assertEqual(m.leaves, ["attn_norm", "gdn_core_attn", "mlp_fc1",
                                    "mlp_act", "final_norm"])
        self.assertEqual(m.kinds["gdn_core_attn"], "gdn")
        self.assertEqual(m.aliases["layernorm"], ["attn_norm", "final_norm"])

    def test_expand(self):
        m = modules.parse_listing(LISTING)
        self.assertEqual(m.expand(["mlp", "gdn_core_attn"]),
                         ["mlp_fc1", "mlp_act", "gdn_core_attn"])

    def test_unknown_module_named(self):
        m = modules.parse_listing(LISTING)
        with self.assertRaises(modules.UnknownModule) as e:
            m.expand(["mlp", "core_atn"], "arm 'x': offload")
        msg = str(e.exception)
        self.assertIn("arm 'x': offload: unknown module 'core_atn'", msg)
        self.assertIn("gdn_core_attn", msg)
        self.assertIn("aliases: mlp, layernorm", msg)

    def test_bad_lines(self):
        for text, want in (
                ("attn_norm leaf\n", "line 1: expected '<name> leaf <kind>'"),
                ("a leaf x\nb alias a,c\n",
                 "line 2: alias 'b' names unlisted leaves c"),
                ("", "no leaves listed")):
            with self.assertRaises(ValueError) as e:
                modules.parse_listing(text, "SRC")
            self.assertIn("SRC: " + want, str(e.exception))

    def test_missing_tool(self):
        with self.assertRaises(FileNotFoundError) as e:
            modules.from_tool("/nonexistent/actplace-import")
        self.assertIn("/nonexistent/actplace-import: no actplace-import",
                      str(e.exception))


@unittest.skipUnless(os.environ.get("ACTPLACE_IMPORT"),
                     "ACTPLACE_IMPORT (a built actplace-import) not set")
class CompilerListing(unittest.TestCase):
    """The real listing: every arm, frontier set and the leaf-cost set of
    arms.json names only modules the compiler has."""

    def setUp(self):
        self.m = modules.from_tool(os.environ["ACTPLACE_IMPORT"])

    def test_listing(self):
        for leaf in ("gdn_core_attn", "core_attn", "attn_proj", "mlp_act",
                     "embedding", "lm_head"):
            self.assertIn(leaf, self.m.leaves)
        self.assertIn("layernorm", self.m.aliases)

    def test_arms_json_against_compiler(self):
        arms.check(arms.load(), self.m)


if __name__ == "__main__":
    unittest.main()
