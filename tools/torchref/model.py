"""An independent PyTorch implementation of the model family actplace
compiles: Qwen3.5-style hybrids of Gated DeltaNet (GDN), gated full
attention, multi-head latent attention (MLA) and SwiGLU MLP layers, written
from docs/model-math.md and the train dialect's op descriptions (never
from actplace's C++).

    cfg = ModelConfig.from_json("models/tiny-hybrid.json")
    model = HybridLM(cfg, dtype=torch.float64)
    model.load_state_dict(weights)          # HF names, as the binary's
    loss_sum, count = model(tokens, labels) # one microbatch [B, T]

Parameter names are the HF checkpoint names the training binary uses
(model.layers.{i}.linear_attn.in_proj_qkv.weight, ...). The GDN recurrence
and the attention core are pluggable (`kernels=`): the defaults here are the
naive per-token recurrence and plain causal softmax attention, for the CPU;
a GPU benchmark can plug in flash-linear-attention and SDPA.

Numerics: parameters and activations are in `dtype`; where the spec computes
in fp32 (norms, gates, softmax, the recurrence state, the loss) this code
computes in at least fp32 (float64 stays float64) and stores the result back
in `dtype`.
"""
import json
import math
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100


def acc_dtype(dtype):
    """The accumulation dtype: at least fp32."""
    return torch.promote_types(dtype, torch.float32)


#===----------------------------------------------------------------------===#
# Config (the fields actplace-import reads)
#===----------------------------------------------------------------------===#

GDN, ATTENTION, MLA, NONE = "gdn", "attention", "mla", "none"


@dataclass
class LayerSpec:
    mixer: str
    has_mlp: bool


@dataclass
class ModelConfig:
    hidden_size: int
    vocab_size: int
    layers: List[LayerSpec]
    intermediate_size: int = 0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    zero_centered_norms: bool = False
    # GDN
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    # full attention (num_attention_heads is MLA's head count too)
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    attn_output_gate: bool = False
    partial_rotary_factor: float = 1.0
    rope_theta: float = 10000.0
    # MLA
    q_lora_rank: Optional[int] = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    name: str = ""

    @property
    def rotary_dim(self):
        return int(round(self.head_dim * self.partial_rotary_factor))

    @staticmethod
    def from_json(path):
        with open(path) as f:
            return ModelConfig.from_dict(json.load(f))

    @staticmethod
    def from_dict(root):
        """Flat configs or the HF Qwen3.5 layout (text fields under
        text_config, rope settings under rope_parameters)."""
        text = root.get("text_config") or {}
        rope = text.get("rope_parameters") or root.get("rope_parameters") or {}

        def get(key, default=None):
            if key in text:
                return text[key]
            return root.get(key, default)

        def get_rope(key, default=None):
            return rope[key] if key in rope else get(key, default)

        model_type = get("model_type", "") or ""
        qwen = model_type.startswith("qwen3_5") or \
            model_type.startswith("qwen3_next")
        hidden = get("hidden_size")
        layers = []
        if get("layer_types") is not None:
            kinds = {"linear_attention": GDN, "full_attention": ATTENTION,
                     "mla": MLA, "mlp": NONE}
            layers = [LayerSpec(kinds[t], True) for t in get("layer_types")]
        elif get("hybrid_layer_pattern") is not None:
            kinds = {"G": GDN, "A": ATTENTION, "L": MLA}
            for c in get("hybrid_layer_pattern"):
                layers.append(LayerSpec(kinds[c], False) if c in kinds
                              else LayerSpec(NONE, True))
        else:
            n = get("full_attention_interval")
            layers = [LayerSpec(ATTENTION if (i + 1) % n == 0 else GDN, True)
                      for i in range(get("num_hidden_layers"))]
        heads = get("num_attention_heads", 0) or 0
        head_dim = get("head_dim")
        if head_dim is None and heads:
            head_dim = hidden // heads
        return ModelConfig(
            name=get("name_or_path", get("_name_or_path", "")) or "",
            hidden_size=hidden,
            vocab_size=get("vocab_size"),
            layers=layers,
            intermediate_size=get("intermediate_size", 0) or 0,
            rms_norm_eps=get("rms_norm_eps", 1e-6),
            tie_word_embeddings=get("tie_word_embeddings", True),
            zero_centered_norms=get("zero_centered_norms", qwen),
            linear_num_key_heads=get("linear_num_key_heads", 0) or 0,
            linear_num_value_heads=get("linear_num_value_heads", 0) or 0,
            linear_key_head_dim=get("linear_key_head_dim", 0) or 0,
            linear_value_head_dim=get("linear_value_head_dim", 0) or 0,
            linear_conv_kernel_dim=get("linear_conv_kernel_dim", 0) or 0,
            num_attention_heads=heads,
            num_key_value_heads=get("num_key_value_heads", 0) or 0,
            head_dim=head_dim or 0,
            attn_output_gate=get("attn_output_gate", False),
            partial_rotary_factor=get_rope("partial_rotary_factor", 1.0),
            rope_theta=get_rope("rope_theta", 10000.0),
            q_lora_rank=get("q_lora_rank"),
            kv_lora_rank=get("kv_lora_rank", 0) or 0,
            qk_nope_head_dim=get("qk_nope_head_dim", 0) or 0,
            qk_rope_head_dim=get("qk_rope_head_dim", 0) or 0,
            v_head_dim=get("v_head_dim", 0) or 0,
        )


#===----------------------------------------------------------------------===#
# Pluggable cores
#===----------------------------------------------------------------------===#

def naive_gdn_core(q, k, v, g, beta, scale):
    """The gated delta rule, one token at a time (docs/model-math.md 1.3).

    q, k: [B, T, H, dk] (L2-normalised, heads already matched to v's);
    v: [B, T, H, dv]; g (log decay, <= 0), beta: [B, T, H]. Returns o
    [B, T, H, dv] in v's dtype; the state is kept in at least fp32 and starts
    at zero for every batch row (each row is a sequence).
    """
    acc = acc_dtype(v.dtype)
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    q, k, v, g, beta = (x.to(acc) for x in (q, k, v, g, beta))
    S = torch.zeros(B, H, dk, dv, dtype=acc, device=v.device)
    outs = []
    for t in range(T):
        # Broadcast products, not einsum: at these sizes batched matmuls
        # cost far more than the arithmetic.
        S = torch.exp(g[:, t])[..., None, None] * S
        kt = k[:, t]
        u = beta[:, t][..., None] * (v[:, t] - (S * kt[..., None]).sum(-2))
        S = S + kt[..., :, None] * u[..., None, :]
        outs.append(scale * (S * q[:, t][..., None]).sum(-2))
    return torch.stack(outs, dim=1).to(v.dtype)


def naive_attention_core(q, k, v, scale):
    """Causal softmax attention, softmax in at least fp32.

    q, k: [B, T, H, Dqk]; v: [B, T, H, Dv] (heads already matched). Returns
    [B, T, H, Dv] in v's dtype.
    """
    acc = acc_dtype(v.dtype)
    T = q.shape[1]
    s = torch.einsum("bthd,bshd->bhts", q.to(acc), k.to(acc)) * scale
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
    return torch.einsum("bhts,bshd->bthd", p, v.to(acc)).to(v.dtype)


@dataclass
class Kernels:
    """gdn(q, k, v, g, beta, scale) and attention(q, k, v, scale); see the
    naive versions for shapes and conventions."""
    gdn: Callable = naive_gdn_core
    attention: Callable = naive_attention_core


#===----------------------------------------------------------------------===#
# Building blocks
#===----------------------------------------------------------------------===#

class Linear(nn.Module):
    """y = x W^T, no bias; weight [out, in] (HF layout)."""

    def __init__(self, out_features, in_features, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features,
                                               dtype=dtype))

    def forward(self, x):
        return F.linear(x, self.weight)


class RMSNorm(nn.Module):
    """y = x rsqrt(mean(x^2) + eps) * w, or * (1 + w) when zero-centred;
    over the last dim, computed in at least fp32."""

    def __init__(self, dim, eps, zero_centered, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype))
        self.eps = eps
        self.zero_centered = zero_centered

    def forward(self, x):
        acc = acc_dtype(x.dtype)
        xf = x.to(acc)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        w = self.weight.to(acc)
        return (y * (1 + w if self.zero_centered else w)).to(x.dtype)


def rope(x, rotary_dim, theta):
    """Rotate-half RoPE on dims [0, rotary_dim) of every head, pairs
    (i, i + rotary_dim/2), frequency theta^(-2i/rotary_dim), positions
    0..T-1 per batch row. x: [B, T, H, d]."""
    acc = acc_dtype(x.dtype)
    T = x.shape[1]
    half = rotary_dim // 2
    i = torch.arange(half, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * i / rotary_dim)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos = ang.cos().to(acc)[None, :, None, :]
    sin = ang.sin().to(acc)[None, :, None, :]
    xf = x.to(acc)
    x1, x2, rest = xf[..., :half], xf[..., half:rotary_dim], xf[...,
                                                                 rotary_dim:]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)
    return out.to(x.dtype)


def repeat_heads(x, n):
    """[B, T, H, d] -> [B, T, H*n, d], head h -> heads h*n .. h*n+n-1 (GQA:
    query/value head j reads head j // n)."""
    return x if n == 1 else x.repeat_interleave(n, dim=2)


#===----------------------------------------------------------------------===#
# Mixers and MLP
#===----------------------------------------------------------------------===#

class GatedDeltaNet(nn.Module):
    """docs/model-math.md 1.2."""

    def __init__(self, cfg, dtype, kernels):
        super().__init__()
        D = cfg.hidden_size
        self.hk, self.hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.kc = cfg.linear_conv_kernel_dim
        self.eps = cfg.rms_norm_eps
        self.kernels = kernels
        conv_dim = 2 * self.hk * self.dk + self.hv * self.dv
        acc = acc_dtype(dtype)
        self.in_proj_qkv = Linear(conv_dim, D, dtype)
        self.in_proj_z = Linear(self.hv * self.dv, D, dtype)
        self.in_proj_b = Linear(self.hv, D, dtype)
        self.in_proj_a = Linear(self.hv, D, dtype)
        self.conv1d = nn.Module()
        self.conv1d.weight = nn.Parameter(torch.empty(conv_dim, self.kc,
                                                      dtype=dtype))
        self.A_log = nn.Parameter(torch.empty(self.hv, dtype=acc))
        self.dt_bias = nn.Parameter(torch.empty(self.hv, dtype=acc))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.empty(self.dv, dtype=dtype))
        self.out_proj = Linear(D, self.hv * self.dv, dtype)

    def short_conv(self, x):
        """pre[t, c] = sum_j W[c, j] x[t - (Kc-1) + j, c], zeros before the
        sequence start; then SiLU."""
        T = x.shape[1]
        w = self.conv1d.weight
        pre = torch.zeros_like(x)
        for j in range(self.kc):
            shift = self.kc - 1 - j
            if shift >= T:
                continue
            xs = F.pad(x[:, :T - shift], (0, 0, shift, 0))
            pre = pre + xs * w[:, j]
        return F.silu(pre)

    def forward(self, x):
        B, T, _ = x.shape
        hk, hv, dk, dv = self.hk, self.hv, self.dk, self.dv
        acc = acc_dtype(x.dtype)
        y = self.short_conv(self.in_proj_qkv(x))
        z = self.in_proj_z(x).reshape(B, T, hv, dv)
        b = self.in_proj_b(x)
        a = self.in_proj_a(x)
        q = y[..., :hk * dk].reshape(B, T, hk, dk)
        k = y[..., hk * dk:2 * hk * dk].reshape(B, T, hk, dk)
        v = y[..., 2 * hk * dk:].reshape(B, T, hv, dv)
        # Gates in fp32: beta = sigmoid(b), g = -exp(A_log) softplus(a + dt).
        beta = torch.sigmoid(b.to(acc)).to(x.dtype)
        g = -torch.exp(self.A_log) * F.softplus(a.to(acc) + self.dt_bias,
                                                beta=1.0, threshold=20.0)

        def l2norm(t):
            tf = t.to(acc)
            return (tf / torch.sqrt(tf.pow(2).sum(-1, keepdim=True) + 1e-6)
                    ).to(t.dtype)

        r = hv // hk
        o = self.kernels.gdn(repeat_heads(l2norm(q), r),
                             repeat_heads(l2norm(k), r), v, g, beta,
                             dk ** -0.5)
        yn = self.gated_norm(o, z, x.dtype)
        return self.out_proj(yn.reshape(B, T, hv * dv))

    def gated_norm(self, o, z, dtype):
        """The gated RMSNorm per (token, head): w * (o rstd) * silu(z) over
        the last dim of o and z [B, T, Hv, dv], in at least fp32 (at least
        `dtype`), returned in `dtype`. A method of its own so that a
        benchmark can swap in a fused kernel (bench/qwen_torch_peer.py
        --fused-norms)."""
        acc = acc_dtype(dtype)
        of = o.to(acc)
        rstd = torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.norm.weight.to(acc) * (of * rstd) *
                F.silu(z.to(acc))).to(dtype)


class GatedAttention(nn.Module):
    """Qwen3.5 full attention: q_proj emits [q | gate] per head, q/k norms
    over head_dim before partial RoPE, out *= sigmoid(gate)."""

    def __init__(self, cfg, dtype, kernels):
        super().__init__()
        D = cfg.hidden_size
        self.hq, self.hkv, self.hd = (cfg.num_attention_heads,
                                      cfg.num_key_value_heads, cfg.head_dim)
        self.gated = cfg.attn_output_gate
        self.rotary_dim, self.theta = cfg.rotary_dim, cfg.rope_theta
        self.kernels = kernels
        qw = 2 * self.hd if self.gated else self.hd
        self.q_proj = Linear(self.hq * qw, D, dtype)
        self.k_proj = Linear(self.hkv * self.hd, D, dtype)
        self.v_proj = Linear(self.hkv * self.hd, D, dtype)
        self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps,
                              cfg.zero_centered_norms, dtype)
        self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps,
                              cfg.zero_centered_norms, dtype)
        self.o_proj = Linear(D, self.hq * self.hd, dtype)

    def forward(self, x):
        B, T, _ = x.shape
        hq, hkv, hd = self.hq, self.hkv, self.hd
        qg = self.q_proj(x).reshape(B, T, hq, -1)
        q, gate = (qg[..., :hd], qg[..., hd:]) if self.gated else (qg, None)
        k = self.k_proj(x).reshape(B, T, hkv, hd)
        v = self.v_proj(x).reshape(B, T, hkv, hd)
        q = rope(self.q_norm(q), self.rotary_dim, self.theta)
        k = rope(self.k_norm(k), self.rotary_dim, self.theta)
        r = hq // hkv
        o = self.kernels.attention(q, repeat_heads(k, r), repeat_heads(v, r),
                                   hd ** -0.5)
        if gate is not None:
            o = o * torch.sigmoid(gate)
        return self.o_proj(o.reshape(B, T, hq * hd))


class MultiHeadLatentAttention(nn.Module):
    """docs/model-math.md 2 (DeepSeek-V2/V3 MLA, no YaRN), rotate-half RoPE on the
    qk_rope dims; the rotary key is shared by all heads."""

    def __init__(self, cfg, dtype, kernels):
        super().__init__()
        D = cfg.hidden_size
        self.n = cfg.num_attention_heads
        self.dn, self.dr = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        self.dvh, self.kvl = cfg.v_head_dim, cfg.kv_lora_rank
        self.q_lora = cfg.q_lora_rank
        self.theta = cfg.rope_theta
        self.kernels = kernels
        n, dqk = self.n, self.dn + self.dr
        if self.q_lora:
            self.q_a_proj = Linear(self.q_lora, D, dtype)
            self.q_a_layernorm = RMSNorm(self.q_lora, cfg.rms_norm_eps, False,
                                         dtype)
            self.q_b_proj = Linear(n * dqk, self.q_lora, dtype)
        else:
            self.q_proj = Linear(n * dqk, D, dtype)
        self.kv_a_proj_with_mqa = Linear(self.kvl + self.dr, D, dtype)
        self.kv_a_layernorm = RMSNorm(self.kvl, cfg.rms_norm_eps, False, dtype)
        self.kv_b_proj = Linear(n * (self.dn + self.dvh), self.kvl, dtype)
        self.o_proj = Linear(D, n * self.dvh, dtype)

    def forward(self, x):
        B, T, _ = x.shape
        n, dn, dr, dvh, kvl = self.n, self.dn, self.dr, self.dvh, self.kvl
        if self.q_lora:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            q = self.q_proj(x)
        q = q.reshape(B, T, n, dn + dr)
        q = torch.cat([q[..., :dn], rope(q[..., dn:], dr, self.theta)], -1)
        kva = self.kv_a_proj_with_mqa(x)
        ckv = self.kv_a_layernorm(kva[..., :kvl])
        k_pe = rope(kva[..., kvl:].reshape(B, T, 1, dr), dr, self.theta)
        kv = self.kv_b_proj(ckv).reshape(B, T, n, dn + dvh)
        k = torch.cat([kv[..., :dn], k_pe.expand(B, T, n, dr)], -1)
        v = kv[..., dn:]
        o = self.kernels.attention(q, k, v, (dn + dr) ** -0.5)
        return self.o_proj(o.reshape(B, T, n * dvh))


class SwiGLUMLP(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        D, I = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = Linear(I, D, dtype)
        self.up_proj = Linear(I, D, dtype)
        self.down_proj = Linear(D, I, dtype)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """A token mixer with its input norm and/or an MLP with its norm (the
    MLP-only layer's norm is its input_layernorm)."""

    def __init__(self, cfg, spec, dtype, kernels):
        super().__init__()
        norm = lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps,
                               cfg.zero_centered_norms, dtype)
        self.input_layernorm = norm()
        self.mixer_kind = spec.mixer
        if spec.mixer == GDN:
            self.linear_attn = GatedDeltaNet(cfg, dtype, kernels)
        elif spec.mixer == ATTENTION:
            self.self_attn = GatedAttention(cfg, dtype, kernels)
        elif spec.mixer == MLA:
            self.self_attn = MultiHeadLatentAttention(cfg, dtype, kernels)
        self.has_mlp = spec.has_mlp
        if spec.has_mlp:
            if spec.mixer != NONE:
                self.post_attention_layernorm = norm()
            self.mlp = SwiGLUMLP(cfg, dtype)

    def forward(self, h):
        if self.mixer_kind != NONE:
            mixer = (self.linear_attn if self.mixer_kind == GDN
                     else self.self_attn)
            h = h + mixer(self.input_layernorm(h))
        if self.has_mlp:
            norm = (self.post_attention_layernorm
                    if self.mixer_kind != NONE else self.input_layernorm)
            h = h + self.mlp(norm(h))
        return h


class HybridLM(nn.Module):
    """Embedding, decoder layers, final norm, (tied) LM head +
    cross-entropy. forward(tokens, labels) of one microbatch [B, T] returns
    (sum of per-token losses over labels != -100, number of such tokens)."""

    def __init__(self, cfg: ModelConfig, dtype=torch.float32,
                 kernels: Optional[Kernels] = None):
        super().__init__()
        self.cfg = cfg
        kernels = kernels or Kernels()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Module()
        self.model.embed_tokens.weight = nn.Parameter(
            torch.empty(cfg.vocab_size, cfg.hidden_size, dtype=dtype))
        self.model.layers = nn.ModuleList(
            [DecoderLayer(cfg, s, dtype, kernels) for s in cfg.layers])
        self.model.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps,
                                  cfg.zero_centered_norms, dtype)
        if not cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.vocab_size, cfg.hidden_size, dtype)

    def head_weight(self):
        return (self.model.embed_tokens.weight if self.cfg.tie_word_embeddings
                else self.lm_head.weight)

    def forward(self, tokens, labels):
        h = self.model.embed_tokens.weight[tokens]
        for layer in self.model.layers:
            h = layer(h)
        h = self.model.norm(h)
        acc = acc_dtype(h.dtype)
        logits = F.linear(h, self.head_weight()).to(acc)
        loss_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                   labels.reshape(-1).long(),
                                   ignore_index=IGNORE_INDEX, reduction="sum")
        return loss_sum, int((labels != IGNORE_INDEX).sum())
