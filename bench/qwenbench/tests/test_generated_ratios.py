"""generatedKernelRatio from two runs' --op-times (calibrate
--generated-op-times)."""
import unittest

from qwenbench.calibrate import generated_kernel_ratios


def times(ops):
    return {"steps": 2, "mode": "stream",
            "ops": {k: {"count": c, "seconds": s} for k, (c, s) in ops.items()}}


class GeneratedRatios(unittest.TestCase):
    def test_matched_labels_per_launch(self):
        lib = times({"L0.mlp_act/swiglu": (4, 1.0), "L1.mlp_act/swiglu": (4, 1.0),
                     "L0.mlp_act/swiglu_grad": (4, 2.0),
                     "L0.gdn_in_proj/linear": (4, 9.0)})
        gen = times({"L0.mlp_act/swiglu": (4, 1.5), "L1.mlp_act/swiglu": (4, 2.5),
                     "L0.mlp_act/swiglu_grad(recompute)": (4, 1.0),
                     "L0.gdn_in_proj/linear": (4, 1.0)})
        r = generated_kernel_ratios(lib, gen)
        # (1.5 + 2.5) / (1.0 + 1.0); the linear is not a generated op; the
        # recompute label has no library twin with that label.
        self.assertEqual(r, {"train.swiglu": 2.0})

    def test_counts_must_match(self):
        lib = times({"L0.attn_norm/rms_norm": (8, 1.0)})
        gen = times({"L0.attn_norm/rms_norm": (2, 0.1)})
        self.assertEqual(generated_kernel_ratios(lib, gen), {})

    def test_fused_against_add_and_norm(self):
        lib = times({"L0.mlp_norm/rms_norm": (4, 0.4),
                     "L0.mlp_fc2/add": (4, 0.4), "L1.attn_norm/add": (4, 0.8),
                     "L1.attn_norm/rms_norm": (4, 4.0)})
        gen = times({"L0.mlp_norm/add_rms_norm": (4, 0.6)})
        # fused 0.15 per launch / (norm of its scope 0.1 + mean add 0.15)
        self.assertEqual(generated_kernel_ratios(lib, gen),
                         {"train.add_rms_norm": 0.6})

    def test_norm_grad_add_without_chain(self):
        lib = times({"L0.mlp_norm/rms_norm_grad": (4, 0.8),
                     "L0.mlp_fc2/add": (4, 0.4),
                     "L0.mlp_norm/add": (4, 0.4)})
        gen = times({"L0.mlp_norm/rms_norm_grad_add": (4, 0.6),
                     "L0.mlp_norm/add": (4, 0.5)})
        # The chain's add still runs (it is in the generated run): 0.6 /
        # (0.8 + mean add 0.1 x 4 launches).
        self.assertEqual(generated_kernel_ratios(lib, gen),
                         {"train.add": 1.25, "train.rms_norm_grad_add": 0.5})

    def test_chain_in_the_norm_grad(self):
        lib = times({"L0.attn_norm/rms_norm_grad": (4, 0.8),
                     "L0.attn_norm/add": (12, 1.2),
                     "L0.mlp_fc2/add": (4, 0.4)})
        gen = times({"L0.attn_norm/rms_norm_grad_add": (4, 1.2)})
        # 1.2 / (0.8 + the chain 1.2 + mean add 0.1 x 4 launches); the
        # chain's adds take the same ratio.
        self.assertEqual(generated_kernel_ratios(lib, gen),
                         {"train.rms_norm_grad_add": 0.5,
                          "train.rms_norm_grad_sum": 0.5})


if __name__ == "__main__":
    unittest.main()
