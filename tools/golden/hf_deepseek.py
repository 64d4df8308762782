#!/usr/bin/python3
"""Hugging Face DeepSeek-V2/V3 goldens for gotron's HF conversion (ckpt/hf).

Usage (repository root, Debian's python3-torch 1.13, CPU; no `transformers`):

    /usr/bin/python3 tools/golden/hf_deepseek.py [outdir]     # default ckpt/hf/testdata

Each case is a tiny model of plain PyTorch modules that carry Hugging Face's
parameter names and compute what transformers' modeling_deepseek_v3.py and
modeling_deepseek_v2.py compute (written after reading them; the Llama parts,
weight draws and writers are tools/golden/hf.py's):

  * Attention (DeepseekV3Attention, DeepseekV2Attention): q = q_proj(x), or
    q_b_proj(q_a_layernorm(q_a_proj(x))) with q_lora_rank; each head's query
    is [nope (qk_nope_head_dim); rope (qk_rope_head_dim)].
    kv_a_proj_with_mqa(x) = [latent (kv_lora_rank); k_rot (qk_rope_head_dim)];
    kv_b_proj(kv_a_layernorm(latent)) is each head's [k_nope; v]. The rotary
    embedding rotates the pairs (2i, 2i+1) of the rope channels by frequency
    i (V3's apply_rotary_pos_emb_interleave with rope_interleave, which
    de-interleaves then rotates halves; V2's complex multiplication), k_rot is
    shared by every head. Causal softmax attention; o_proj.
  * RoPE: rope_theta; rope_scaling null (plain) or yarn as
    modeling_rope_utils' _compute_yarn_parameters: inv_freq blended between
    theta^(-2i/d) and that divided by factor over the correction range of
    beta_fast/beta_slow at original_max_position_embeddings (floor/ceil),
    cos and sin multiplied by attention_factor =
    get_mscale(factor, mscale)/get_mscale(factor, mscale_all_dim) when both
    are set (non-zero), else get_mscale(factor). The rotary dimension is
    qk_rope_head_dim (the configs' head_dim).
  * Softmax scale: V3 qk_head_dim^-0.5 times get_mscale(factor,
    mscale_all_dim)^2 when rope_scaling has a non-zero mscale_all_dim; V2
    (transformers' port) qk_head_dim^-0.5 alone.
  * MoE layers (layer i >= first_k_dense_replace; below, a dense MLP of
    intermediate_size): experts.E.{gate,up,down}_proj of moe_intermediate_size,
    shared_experts of moe_intermediate_size * n_shared_experts added for every
    token. V3's router (DeepseekV3TopkRouter): scores = sigmoid(x gate.weight^T);
    scores_for_choice = scores + gate.e_score_correction_bias; group score =
    sum of each group's top 2; the topk_group best groups kept (the others set
    to 0.0, where Megatron's and gotron's mask is -inf: the same experts while
    the kept scores plus bias are >= 0, as the fixtures' positive biases keep
    them); top-k of those; weights = scores at the chosen experts, divided by
    their sum (+1e-20) with norm_topk_prob, times routed_scaling_factor. V2's
    (DeepseekV2Moe): softmax over the experts, top-k (greedy), times
    routed_scaling_factor.

Weights are seeded random float32 values saved as safetensors next to
config.json; the forward pass runs in float64 (the rotary tables in float32
as transformers builds them) and the logits of TOKENS go to
golden.safetensors. CI never runs Python.
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf  # noqa: E402  (tools/golden/hf.py)

torch.set_default_dtype(torch.float64)

CASES = {
    # DeepSeek-V3's shape in small: q_lora_rank, YaRN with distinct mscale and mscale_all_dim, 8 routed
    # experts in 4 groups (2 kept), top-4, a shared expert, the first layer dense, untied
    "deepseek_v3_untied_f32": dict(arch="deepseek_v3", vocab=100, hidden=32, layers=3, heads=4, inner=40,
                                   q_lora=12, kv_lora=10, nope=6, rope=8, v=5, moe_inner=8, experts=8,
                                   shared=1, topk=4, n_group=4, topk_group=2, scaling=2.5, first_dense=1,
                                   norm_topk_prob=True, positions=128, eps=1e-6, theta=100.0, tied=False,
                                   rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                                 "beta_fast": 32, "beta_slow": 1, "mscale": 0.9,
                                                 "mscale_all_dim": 0.7}),
    # DeepSeek-V2-Lite's shape in small: a plain query projection, YaRN with mscale = mscale_all_dim (V2-Lite's
    # 0.707), softmax greedy routing not renormalised, two shared experts, v wider than the q/k heads, tied
    "deepseek_v2_tied_f32": dict(arch="deepseek_v2", vocab=100, hidden=32, layers=2, heads=4, inner=36,
                                 q_lora=None, kv_lora=12, nope=4, rope=4, v=12, moe_inner=6, experts=6,
                                 shared=2, topk=2, scaling=1.5, first_dense=1, norm_topk_prob=False,
                                 positions=64, eps=1e-6, theta=10000.0, tied=True,
                                 rope_scaling={"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32,
                                               "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                                               "mscale_all_dim": 0.707}),
}


def get_mscale(scale, mscale=1.0):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_tables(c, T):
    """inv_freq and attention_factor as transformers computes them, cos/sin (T, rope) of cat(freqs, freqs)."""
    d, base, rs = c["rope"], c["theta"], c.get("rope_scaling")
    if rs is None:
        inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        factor = 1.0
    else:
        factor = rs["factor"]
        orig = rs.get("original_max_position_embeddings") or c["positions"]
        mscale, mscale_all = rs.get("mscale"), rs.get("mscale_all_dim")
        if mscale and mscale_all:
            factor_att = get_mscale(factor, mscale) / get_mscale(factor, mscale_all)
        else:
            factor_att = get_mscale(factor)
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def corr_dim(rot):
            return (d * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

        low, high = max(math.floor(corr_dim(beta_fast)), 0), min(math.ceil(corr_dim(beta_slow)), d - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        pos_freqs = base ** (torch.arange(0, d, 2).float() / d)
        extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
        extra_factor = 1 - ramp
        inv_freq = inter * (1 - extra_factor) + extra * extra_factor
    att = 1.0 if rs is None else factor_att
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * att).double(), (emb.sin() * att).double()


def rotate_pairs(x, cos, sin):
    """V3's apply_rotary_pos_emb_interleave: [evens; odds] of the channels, then rotate halves."""
    B, H, T, d = x.shape
    x = x.view(B, H, T, d // 2, 2).transpose(4, 3).reshape(B, H, T, d)
    return x * cos + hf.rotate_half(x) * sin


class Attention(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        h, self.nh = c["hidden"], c["heads"]
        self.nope, self.rope, self.v, self.kv_lora = c["nope"], c["rope"], c["v"], c["kv_lora"]
        self.qd = self.nope + self.rope
        self.c = c
        if c["q_lora"] is None:
            self.q_proj = torch.nn.Linear(h, self.nh * self.qd, bias=False)
        else:
            self.q_a_proj = torch.nn.Linear(h, c["q_lora"], bias=False)
            self.q_a_layernorm = hf.LlamaRMSNorm(c["q_lora"], 1e-6)
            self.q_b_proj = torch.nn.Linear(c["q_lora"], self.nh * self.qd, bias=False)
        self.kv_a_proj_with_mqa = torch.nn.Linear(h, self.kv_lora + self.rope, bias=False)
        self.kv_a_layernorm = hf.LlamaRMSNorm(self.kv_lora, 1e-6)
        self.kv_b_proj = torch.nn.Linear(self.kv_lora, self.nh * (self.nope + self.v), bias=False)
        self.o_proj = torch.nn.Linear(self.nh * self.v, h, bias=False)
        self.scaling = self.qd ** -0.5
        rs = c.get("rope_scaling")
        if c["arch"] == "deepseek_v3" and rs is not None and rs.get("mscale_all_dim", 0):
            m = get_mscale(rs["factor"], rs["mscale_all_dim"])
            self.scaling = self.scaling * m * m

    def forward(self, x):
        B, T, _ = x.shape
        if hasattr(self, "q_proj"):
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, T, self.nh, self.qd).transpose(1, 2)
        q_pass, q_rot = torch.split(q, [self.nope, self.rope], dim=-1)
        kv = self.kv_a_proj_with_mqa(x)
        latent, k_rot = torch.split(kv, [self.kv_lora, self.rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(B, T, self.nh, self.nope + self.v).transpose(1, 2)
        k_pass, v = torch.split(kv, [self.nope, self.v], dim=-1)
        k_rot = k_rot.view(B, 1, T, self.rope)
        cos, sin = rope_tables(self.c, T)
        q_rot, k_rot = rotate_pairs(q_rot, cos, sin), rotate_pairs(k_rot, cos, sin)
        k_rot = k_rot.expand(B, self.nh, T, self.rope)
        q = torch.cat((q_pass, q_rot), dim=-1)
        k = torch.cat((k_pass, k_rot), dim=-1)
        w = q @ k.transpose(2, 3) * self.scaling
        w = w + torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        o = torch.softmax(w, dim=-1) @ v
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.v))


class Router(torch.nn.Module):
    """V3's DeepseekV3TopkRouter (weight, e_score_correction_bias) or V2's gate (weight)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.weight = torch.nn.Parameter(torch.empty(c["experts"], c["hidden"]))
        if c["arch"] == "deepseek_v3":
            self.e_score_correction_bias = torch.nn.Parameter(torch.zeros(c["experts"]))

    def forward(self, x):  # (N, h) -> (N, k) weights, expert ids
        c, E = self.c, self.c["experts"]
        logits = x @ self.weight.T
        if c["arch"] == "deepseek_v2":
            scores = torch.softmax(logits, dim=-1)
            w, sel = torch.topk(scores, c["topk"], dim=-1)
            return w * c["scaling"], sel
        scores = logits.sigmoid()
        choice = scores + self.e_score_correction_bias[None, :]
        g = c["n_group"]
        group_scores = choice.view(-1, g, E // g).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=c["topk_group"], dim=-1)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, g, E // g).reshape(-1, E)
        choice = choice.masked_fill(~score_mask.bool(), 0.0)
        sel = torch.topk(choice, k=c["topk"], dim=-1)[1]
        w = scores.gather(1, sel)
        if c["norm_topk_prob"]:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return w * c["scaling"], sel


class MoE(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden"]
        self.gate = Router(c)
        self.experts = torch.nn.ModuleList([hf.LlamaMLP(h, c["moe_inner"]) for _ in range(c["experts"])])
        self.shared_experts = hf.LlamaMLP(h, c["moe_inner"] * c["shared"])

    def forward(self, x):
        B, T, h = x.shape
        flat = x.reshape(-1, h)
        w, sel = self.gate(flat)
        out = torch.zeros_like(flat)
        for t in range(flat.shape[0]):
            for j in range(sel.shape[1]):
                out[t] += w[t, j] * self.experts[int(sel[t, j])](flat[t:t + 1])[0]
        return out.reshape(B, T, h) + self.shared_experts(x)


class DecoderLayer(hf.LlamaDecoderLayer):
    def __init__(self, c, i):
        super().__init__(c, i, Attention(c))

    def make_mlp(self, c, i):
        self.mlp = MoE(c) if i >= c["first_dense"] else hf.LlamaMLP(c["hidden"], c["inner"])


def config(c):
    v3 = c["arch"] == "deepseek_v3"
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"], "model_type": c["arch"],
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
        "first_k_dense_replace": c["first_dense"], "hidden_act": "silu", "hidden_size": c["hidden"],
        "initializer_range": 0.02, "intermediate_size": c["inner"], "kv_lora_rank": c["kv_lora"],
        "max_position_embeddings": c["positions"], "moe_intermediate_size": c["moe_inner"],
        "n_routed_experts": c["experts"], "n_shared_experts": c["shared"], "norm_topk_prob": c["norm_topk_prob"],
        "num_attention_heads": c["heads"], "num_experts_per_tok": c["topk"], "num_hidden_layers": c["layers"],
        "num_key_value_heads": c["heads"], "q_lora_rank": c["q_lora"], "qk_nope_head_dim": c["nope"],
        "qk_rope_head_dim": c["rope"], "rms_norm_eps": c["eps"], "rope_scaling": c.get("rope_scaling"),
        "rope_theta": c["theta"], "routed_scaling_factor": c["scaling"], "tie_word_embeddings": c["tied"],
        "torch_dtype": "float32", "transformers_version": "4.57.0", "use_cache": True, "v_head_dim": c["v"],
        "vocab_size": c["vocab"],
    }
    if v3:
        cfg.update(n_group=c["n_group"], topk_group=c["topk_group"], rope_interleave=True, scoring_func="sigmoid",
                   topk_method="noaux_tc")
    else:
        cfg.update(n_group=None, topk_group=None, topk_method="greedy", scoring_func="softmax", moe_layer_freq=1)
    return cfg


def build(name, c, out):
    model = hf.LlamaForCausalLM(c, DecoderLayer)

    def special(pname, gen):
        p = model.get_parameter(pname)
        if pname.endswith(".gate.weight"):  # routers: well-separated logits
            return torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if pname.endswith("e_score_correction_bias"):
            # positive: transformers masks the dropped groups with 0.0, gotron (Megatron) with -inf; they
            # choose the same experts while the kept groups' scores plus bias are not negative
            return 0.05 * torch.randn(p.shape, generator=gen, dtype=torch.float32).abs()
        return None

    hf.write_case(name, c, out, model, hf.init_weights(name, model, c, special), config(c))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "ckpt/hf/testdata"
    for name, c in CASES.items():
        build(name, c, out)


if __name__ == "__main__":
    main()
