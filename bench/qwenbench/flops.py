"""Model FLOPs per token from a model config (the formula is in the
package docstring)."""
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
    """Forward matmul FLOPs per token (the package docstring has the formula)."""
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

