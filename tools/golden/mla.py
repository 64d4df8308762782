#!/usr/bin/python3
"""PyTorch goldens for gotron's multi-latent attention (model/gpt/mla.go).

Usage (repository root, Debian's python3-torch 1.13, CPU):

    /usr/bin/python3 tools/golden/mla.py [outdir]      # default model/gpt/testdata

A tiny GPT model whose attention is Megatron's MLASelfAttention, written
here in plain PyTorch after Megatron's code (multi_latent_attention.py's
get_query_key_value_tensors, yarn_rotary_pos_embedding.py,
rope_utils._apply_rotary_pos_emb_bshd with mla_rotary_interleaved, the
softmax scale mscale²/sqrt(q head dim)), without importing Megatron. Two
configs: with --q-lora-rank (LayerNorm, learned positions, biases, tied
embeddings, YaRN factor 40 with DeepSeek-V2's mscales, v narrower than the
q/k heads) and without (RMSNorm, no position table, no biases, untied,
YaRN factor 4, v wider than the q/k heads). Records in float64 the logits,
the token-weighted loss and every parameter's gradient; safetensors (F32 /
I32) written by tools/golden/gpt.py's writer.
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import loss_fn, write_safetensors  # noqa: E402

torch.set_default_dtype(torch.float64)

CONFIGS = {
    "mla_qlora": dict(layers=2, hidden=32, heads=4, ffn=64, vocab=64, seq=8, batch=2,
                      pos="learned_absolute", norm="LayerNorm", act="gelu_tanh", bias=True, tied=True, eps=1e-5,
                      q_lora_rank=12, kv_lora_rank=10, qk_head_dim=6, qk_pos_emb_head_dim=4, v_head_dim=5,
                      rotary_base=10000.0, rotary_scaling_factor=40.0, original_max_position_embeddings=4096,
                      beta_fast=32.0, beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707, qk_layernorm=True),
    # Megatron's MLA without --qk-layernorm: q_layernorm and kv_layernorm
    # are IdentityOp and the up-projections plain linears (gpt_layer_specs.py)
    "mla_no_qk_norm": dict(layers=2, hidden=32, heads=4, ffn=64, vocab=64, seq=8, batch=2,
                           pos="learned_absolute", norm="LayerNorm", act="gelu_tanh", bias=True, tied=True, eps=1e-5,
                           q_lora_rank=12, kv_lora_rank=10, qk_head_dim=6, qk_pos_emb_head_dim=4, v_head_dim=5,
                           rotary_base=10000.0, rotary_scaling_factor=40.0, original_max_position_embeddings=4096,
                           beta_fast=32.0, beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707, qk_layernorm=False),
    "mla_plain_q": dict(layers=2, hidden=32, heads=4, ffn=48, vocab=64, seq=8, batch=2,
                        pos="none", norm="RMSNorm", act="swiglu", bias=False, tied=False, eps=1e-5,
                        q_lora_rank=None, kv_lora_rank=12, qk_head_dim=2, qk_pos_emb_head_dim=4, v_head_dim=8,
                        rotary_base=10000.0, rotary_scaling_factor=4.0, original_max_position_embeddings=64,
                        beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=0.5, qk_layernorm=True),
}


def params_for(c, gen):
    h, a = c["hidden"], c["heads"]
    qd = c["qk_head_dim"] + c["qk_pos_emb_head_dim"]
    fc1 = c["ffn"] * (2 if c["act"] == "swiglu" else 1)
    P = {}

    def normal(name, *shape, std=0.2):
        P[name] = (torch.randn(*shape, generator=gen, dtype=torch.float32) * std).double()

    def near_one(name, n):
        P[name] = (1 + 0.1 * torch.randn(n, generator=gen, dtype=torch.float32)).double()

    def norm_params(name, n):
        near_one(name + ".weight", n)
        if c["norm"] == "LayerNorm":
            normal(name + ".bias", n, std=0.1)

    normal("embedding.word_embeddings.weight", c["vocab"], h)
    if c["pos"] == "learned_absolute":
        normal("embedding.position_embeddings.weight", c["seq"], h)
    for i in range(c["layers"]):
        p = f"decoder.layers.{i}."
        s = p + "self_attention."
        norm_params(p + "input_layernorm", h)
        if c["q_lora_rank"] is None:
            normal(s + "linear_q_proj.weight", a * qd, h)
        else:
            normal(s + "linear_q_down_proj.weight", c["q_lora_rank"], h)
            normal(s + "linear_q_up_proj.weight", a * qd, c["q_lora_rank"])
            if c["qk_layernorm"]:
                norm_params(s + "q_layernorm", c["q_lora_rank"])
        normal(s + "linear_kv_down_proj.weight", c["kv_lora_rank"] + c["qk_pos_emb_head_dim"], h)
        normal(s + "linear_kv_up_proj.weight", a * (c["qk_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"])
        if c["qk_layernorm"]:
            norm_params(s + "kv_layernorm", c["kv_lora_rank"])
        normal(s + "linear_proj.weight", h, a * c["v_head_dim"])
        norm_params(p + "pre_mlp_layernorm", h)
        normal(p + "mlp.linear_fc1.weight", fc1, h)
        normal(p + "mlp.linear_fc2.weight", h, c["ffn"])
        if c["bias"]:
            normal(s + "linear_proj.bias", h, std=0.1)
            normal(p + "mlp.linear_fc1.bias", fc1, std=0.1)
            normal(p + "mlp.linear_fc2.bias", h, std=0.1)
    norm_params("decoder.final_layernorm", h)
    if not c["tied"]:
        normal("output_layer.weight", c["vocab"], h)
    return P


# YaRN as yarn_rotary_pos_embedding.py (inv_freq and the concentration
# factor in float32 / Python floats, as Megatron forms them).
def yarn_find_correction_dim(num_rotations, dim, base, max_pos):
    return (dim * math.log(max_pos / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_get_mscale(scale=1, mscale=1):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_emb(c, T):
    dim, base, sf = c["qk_pos_emb_head_dim"], c["rotary_base"], c["rotary_scaling_factor"]
    ar = torch.arange(0, dim, 2, dtype=torch.float32) / dim
    inv_extra = 1.0 / (base ** ar)
    inv_inter = 1.0 / (sf * base ** ar)
    low = math.floor(yarn_find_correction_dim(c["beta_fast"], dim, base, c["original_max_position_embeddings"]))
    high = math.ceil(yarn_find_correction_dim(c["beta_slow"], dim, base, c["original_max_position_embeddings"]))
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    mask = 1.0 - ramp
    inv = inv_inter * (1 - mask) + inv_extra * mask
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    conc = yarn_get_mscale(sf, c["mscale"]) / yarn_get_mscale(sf, c["mscale_all_dim"])
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, dim)
    return emb, conc


def apply_mla_rope(t, emb, mscale):
    # _apply_rotary_pos_emb_bshd(mla_rotary_interleaved=True), t (B, T, n, dim)
    x1, x2 = t[..., 0::2], t[..., 1::2]
    t = torch.cat((x1, x2), dim=-1)
    cos = (torch.cos(emb) * mscale).double()[None, :, None, :]
    sin = (torch.sin(emb) * mscale).double()[None, :, None, :]
    h1, h2 = torch.chunk(t, 2, dim=-1)
    return t * cos + torch.cat((-h2, h1), dim=-1) * sin


def norm(c, x, w, b):
    if c["norm"] == "RMSNorm":
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["eps"]) * w
    return F.layer_norm(x, (x.shape[-1],), w, b, c["eps"])


def mla(c, P, s, x):
    B, T, _ = x.shape
    n, nope, pe, vd = c["heads"], c["qk_head_dim"], c["qk_pos_emb_head_dim"], c["v_head_dim"]
    qd = nope + pe
    get = lambda k: P.get(k)
    emb, conc = yarn_emb(c, T)
    if c["q_lora_rank"] is None:
        q = F.linear(x, P[s + "linear_q_proj.weight"])
    else:
        qc = F.linear(x, P[s + "linear_q_down_proj.weight"])
        if c["qk_layernorm"]:
            qc = norm(c, qc, P[s + "q_layernorm.weight"], get(s + "q_layernorm.bias"))
        q = F.linear(qc, P[s + "linear_q_up_proj.weight"])
    kv_combined = F.linear(x, P[s + "linear_kv_down_proj.weight"])
    kv_compressed, k_pos_emb = torch.split(kv_combined, [c["kv_lora_rank"], pe], dim=-1)
    if c["qk_layernorm"]:
        kv_compressed = norm(c, kv_compressed, P[s + "kv_layernorm.weight"], get(s + "kv_layernorm.bias"))
    q = q.view(B, T, n, qd)
    kv = F.linear(kv_compressed, P[s + "linear_kv_up_proj.weight"]).view(B, T, n, nope + vd)
    k_pos_emb = k_pos_emb.unsqueeze(-2)
    q_no_pe, q_pos_emb = torch.split(q, [nope, pe], dim=-1)
    k_no_pe, value = torch.split(kv, [nope, vd], dim=-1)
    q_pos_emb = apply_mla_rope(q_pos_emb, emb, conc)
    k_pos_emb = apply_mla_rope(k_pos_emb, emb, conc)
    query = torch.cat([q_no_pe, q_pos_emb], dim=-1)
    key = torch.cat([k_no_pe, k_pos_emb.expand(-1, -1, n, -1)], dim=-1)
    m = yarn_get_mscale(c["rotary_scaling_factor"], c["mscale_all_dim"])
    softmax_scale = m * m / math.sqrt(qd)
    sc = torch.einsum("bthd,bshd->bhts", query, key) * softmax_scale
    sc = sc.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    o = torch.einsum("bhts,bshd->bthd", sc.softmax(-1), value).reshape(B, T, n * vd)
    return F.linear(o, P[s + "linear_proj.weight"], get(s + "linear_proj.bias"))


def forward(c, P, tokens):
    B, T = tokens.shape
    x = P["embedding.word_embeddings.weight"][tokens]
    if c["pos"] == "learned_absolute":
        x = x + P["embedding.position_embeddings.weight"][torch.arange(T)][None]
    get = lambda k: P.get(k)
    for i in range(c["layers"]):
        p = f"decoder.layers.{i}."
        y = norm(c, x, P[p + "input_layernorm.weight"], get(p + "input_layernorm.bias"))
        x = x + mla(c, P, p + "self_attention.", y)
        y = norm(c, x, P[p + "pre_mlp_layernorm.weight"], get(p + "pre_mlp_layernorm.bias"))
        y = F.linear(y, P[p + "mlp.linear_fc1.weight"], get(p + "mlp.linear_fc1.bias"))
        if c["act"] == "swiglu":
            gate, up = y.chunk(2, -1)
            y = F.silu(gate) * up
        else:
            y = F.gelu(y, approximate="tanh")
        x = x + F.linear(y, P[p + "mlp.linear_fc2.weight"], get(p + "mlp.linear_fc2.bias"))
    x = norm(c, x, P["decoder.final_layernorm.weight"], get("decoder.final_layernorm.bias"))
    out = P["output_layer.weight"] if not c["tied"] else P["embedding.word_embeddings.weight"]
    return x @ out.t()


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "model/gpt/testdata"
    for name, c in CONFIGS.items():
        gen = torch.Generator().manual_seed(4321)
        P = params_for(c, gen)
        B, T = c["batch"], c["seq"]
        tokens = torch.randint(0, c["vocab"], (B, T), generator=gen)
        labels = torch.randint(0, c["vocab"], (B, T), generator=gen)
        mask = torch.ones(B, T)
        mask[0, 3] = 0
        out = {"tokens": tokens, "labels": labels, "loss_mask": mask}
        for k, v in P.items():
            out["init/" + k] = v
        params = {k: v.clone().requires_grad_(True) for k, v in P.items()}
        logits = forward(c, params, tokens)
        loss = loss_fn(logits, labels, mask)
        loss.backward()
        out["logits"] = logits
        out["loss"] = loss.reshape(1)
        for k, v in params.items():
            out["grad/" + k] = v.grad.clone()
        write_safetensors(os.path.join(outdir, name + ".safetensors"), out)
        with open(os.path.join(outdir, name + ".json"), "w") as f:
            json.dump({"config": c}, f, indent=1, sort_keys=True)
            f.write("\n")
        print(name, "loss", loss.item(), "params", sum(v.numel() for v in P.values()))


if __name__ == "__main__":
    main()
