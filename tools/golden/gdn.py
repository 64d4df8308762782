#!/usr/bin/python3
"""PyTorch golden for gotron's hybrid gated-delta-net model (model/gpt/gdn.go).

Usage (repository root, Debian's python3-torch 1.13, CPU):

    /usr/bin/python3 tools/golden/gdn.py [outdir]      # default model/gpt/testdata

A tiny Megatron GPT model with --experimental-attention-variant gated_delta_net
and --linear-attention-freq 2 (layers 0 and 2 are gated delta nets, 1 and 3 full
attention), --attention-output-gate on the full attention layers, GQA, RoPE over
half of each head (--rotary-percent 0.5), LayerNorm with --apply-layernorm-1p,
SwiGLU, no biases, untied output: the shape of the gpt3_mcore_te_tp2_pp1_gdn
functional tests with a dense MLP (the MoE and its gated shared expert have
their own golden, tools/golden/moe.py).

Written in plain PyTorch from Megatron's code (d98e8a6), not importing it:
megatron/core/ssm/gated_delta_net/{gdn,common}.py (GatedDeltaNet.forward in
deterministic mode: torch-native conv1d, the in_proj split, l2norm, gates,
_apply_gated_norm), megatron/core/transformer/attention.py
(get_query_key_value_tensors with output_gate, _apply_output_gate) and
experimental_attention_variant_module_specs.py (get_linear_attention_pattern).
The delta rule is the naive recurrence (HF's torch_recurrent_gated_delta_rule);
the script also runs Megatron's torch_chunk_gated_delta_rule (copied below) and
asserts the two agree, so the golden is the chunked kernel's answer too.
Everything in float64; stored as float32 safetensors with a JSON config.
CI never runs Python.
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import write_safetensors, loss_fn  # noqa: E402

torch.set_default_dtype(torch.float64)

C = dict(layers=4, hidden=32, heads=4, groups=2, kv=8, ffn=24, vocab=64, seq=10, batch=2,
         rotary_percent=0.5, eps=1e-5, linear_attention_freq=2,
         conv_kernel=4, key_head_dim=4, value_head_dim=6, num_key_heads=2, num_value_heads=4)


def pattern(c):
    # get_linear_attention_pattern: 1 = linear (GDN), 0 = full attention
    n = c["linear_attention_freq"]
    return [0 if (i + 1) % n == 0 else 1 for i in range(c["layers"])]


def params_for(c, gen):
    h, d, g, r = c["hidden"], c["kv"], c["groups"], c["heads"] // c["groups"]
    P = {}

    def normal(name, *shape, std=0.2):
        P[name] = (torch.randn(*shape, generator=gen, dtype=torch.float32) * std).double()

    def gamma(name, n):  # --apply-layernorm-1p: the stored γ, the scale is 1 + γ
        normal(name, n, std=0.1)

    normal("embedding.word_embeddings.weight", c["vocab"], h)
    qk = c["key_head_dim"] * c["num_key_heads"]
    v = c["value_head_dim"] * c["num_value_heads"]
    nv = c["num_value_heads"]
    for i, lin in enumerate(pattern(c)):
        p = f"decoder.layers.{i}."
        gamma(p + "input_layernorm.weight", h)
        normal(p + "input_layernorm.bias", h, std=0.1)
        if lin:
            a = p + "self_attention."
            # in_proj.weight and conv1d.weight by section, as Megatron's distributed checkpoint
            # stores them (_split_tensor_factory); conv1d without its group axis (channels, K)
            for sec, n in (("query", qk), ("key", qk), ("value", v), ("z", v), ("beta", nv), ("alpha", nv)):
                normal(a + "in_proj.weight." + sec, n, h)
            for sec, n in (("query", qk), ("key", qk), ("value", v)):
                normal(a + "conv1d.weight." + sec, n, c["conv_kernel"], std=0.4)
            normal(a + "dt_bias", nv, std=0.5)
            P[a + "A_log"] = torch.log(torch.rand(nv, generator=gen, dtype=torch.float32).double() * 15 + 1)
            gamma(a + "out_norm.weight", c["value_head_dim"])
            normal(a + "out_norm.bias", c["value_head_dim"], std=0.1)
            normal(a + "out_proj.weight", h, v)
        else:
            normal(p + "self_attention.linear_qkv.weight", g * (2 * r + 2) * d, h)
            normal(p + "self_attention.linear_proj.weight", h, c["heads"] * d)
        gamma(p + "pre_mlp_layernorm.weight", h)
        normal(p + "pre_mlp_layernorm.bias", h, std=0.1)
        normal(p + "mlp.linear_fc1.weight", 2 * c["ffn"], h)
        normal(p + "mlp.linear_fc2.weight", h, c["ffn"])
    gamma("decoder.final_layernorm.weight", h)
    normal("decoder.final_layernorm.bias", h, std=0.1)
    normal("output_layer.weight", c["vocab"], h)
    return P


def norm(c, x, w, b):
    return F.layer_norm(x, (x.shape[-1],), 1 + w, b, c["eps"])


def rope(c, x, base=10000.0):
    # Megatron's partial rotary: rotate-half over the first rot_dim channels
    b, t, nh, d = x.shape
    rd = int(d * c["rotary_percent"])
    inv = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float32).double() / rd))
    ang = torch.outer(torch.arange(t).double(), inv)
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
    xr, rest = x[..., :rd], x[..., rd:]
    x1, x2 = xr[..., : rd // 2], xr[..., rd // 2:]
    return torch.cat([xr * cos + torch.cat([-x2, x1], -1) * sin, rest], -1)


def gated_attention(c, P, p, y):
    B, T, _ = y.shape
    d, g, r = c["kv"], c["groups"], c["heads"] // c["groups"]
    qkv = F.linear(y, P[p + "self_attention.linear_qkv.weight"]).view(B, T, g, (2 * r + 2) * d)
    # [sq, b, ng, (2·np/ng + 2)·hn] -> query, gate, key, value
    q, gate, k, v = torch.split(qkv, [r * d, r * d, d, d], dim=3)
    q = q.reshape(B, T, g * r, d)
    gate = gate.reshape(B, T, g * r, d)
    q, k = rope(c, q), rope(c, k)
    k = k.repeat_interleave(r, dim=2)
    v = v.repeat_interleave(r, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(d)
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    o = torch.einsum("bhts,bshd->bthd", s.softmax(-1), v)
    o = o * torch.sigmoid(gate)  # _apply_output_gate
    return F.linear(o.reshape(B, T, -1), P[p + "self_attention.linear_proj.weight"])


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def recurrent_gated_delta_rule(q, k, v, g, beta):
    # q, k (b, t, h, dk), v (b, t, h, dv), g, beta (b, t, h); scale 1/sqrt(dk)
    q, k, v, g, beta = [x.transpose(1, 2) for x in (q, k, v, g, beta)]
    B, H, T, dk = k.shape
    q = q / math.sqrt(dk)
    S = torch.zeros(B, H, dk, v.shape[-1])
    out = []
    for t in range(T):
        S = S * g[:, :, t].exp()[..., None, None]
        kv_mem = (S * k[:, :, t, :, None]).sum(-2)
        delta = (v[:, :, t] - kv_mem) * beta[:, :, t, None]
        S = S + k[:, :, t, :, None] * delta[..., None, :]
        out.append((S * q[:, :, t, :, None]).sum(-2))
    return torch.stack(out, 2).transpose(1, 2)


def torch_chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64):
    # Megatron's gdn.py torch_chunk_gated_delta_rule (deterministic mode), copied
    # without the options it does not use here (no initial state, no l2norm).
    initial_dtype = query.dtype
    query, key, value, beta, g = [x.transpose(1, 2).contiguous() for x in (query, key, value, beta, g)]
    batch_size, num_heads, sequence_length, k_head_dim = key.shape
    v_head_dim = value.shape[-1]
    pad_size = (chunk_size - sequence_length % chunk_size) % chunk_size
    query = F.pad(query, (0, 0, 0, pad_size))
    key = F.pad(key, (0, 0, 0, pad_size))
    value = F.pad(value, (0, 0, 0, pad_size))
    beta = F.pad(beta, (0, pad_size))
    g = F.pad(g, (0, pad_size))
    total_sequence_length = sequence_length + pad_size
    scale = 1 / (query.shape[-1] ** 0.5)
    query = query * scale
    v_beta = value * beta.unsqueeze(-1)
    k_beta = key * beta.unsqueeze(-1)
    query, key, value, k_beta, v_beta = [
        x.reshape(x.shape[0], x.shape[1], -1, chunk_size, x.shape[-1]) for x in (query, key, value, k_beta, v_beta)]
    g = g.reshape(g.shape[0], g.shape[1], -1, chunk_size)
    mask = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool), diagonal=0)
    g = g.cumsum(dim=-1)
    decay_mask = ((g.unsqueeze(-1) - g.unsqueeze(-2)).tril().exp()).tril()
    attn = -((k_beta @ key.transpose(-1, -2)) * decay_mask).masked_fill(mask, 0)
    for i in range(1, chunk_size):
        row = attn[..., i, :i].clone()
        sub = attn[..., :i, :i].clone()
        attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
    attn = attn + torch.eye(chunk_size, dtype=attn.dtype)
    value = attn @ v_beta
    k_cumdecay = attn @ (k_beta * g.exp().unsqueeze(-1))
    last_recurrent_state = torch.zeros(batch_size, num_heads, k_head_dim, v_head_dim).to(value)
    core_attn_out = torch.zeros_like(value)
    mask = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool), diagonal=1)
    for i in range(0, total_sequence_length // chunk_size):
        q_i, k_i, v_i = query[:, :, i], key[:, :, i], value[:, :, i]
        attn = (q_i @ k_i.transpose(-1, -2) * decay_mask[:, :, i]).masked_fill_(mask, 0)
        v_prime = (k_cumdecay[:, :, i]) @ last_recurrent_state
        v_new = v_i - v_prime
        attn_inter = (q_i * g[:, :, i, :, None].exp()) @ last_recurrent_state
        core_attn_out[:, :, i] = attn_inter + attn @ v_new
        last_recurrent_state = (
            last_recurrent_state * g[:, :, i, -1, None, None].exp()
            + (k_i * (g[:, :, i, -1, None] - g[:, :, i]).exp()[..., None]).transpose(-1, -2) @ v_new)
    core_attn_out = core_attn_out.reshape(core_attn_out.shape[0], core_attn_out.shape[1], -1, core_attn_out.shape[-1])
    core_attn_out = core_attn_out[:, :, :sequence_length]
    return core_attn_out.transpose(1, 2).contiguous().to(initial_dtype)


CHECKED_CHUNKED = []


def gated_delta_net(c, P, p, y):
    B, T, _ = y.shape
    a = p + "self_attention."
    nk, nv, dk, dv = c["num_key_heads"], c["num_value_heads"], c["key_head_dim"], c["value_head_dim"]
    qk, v_dim = nk * dk, nv * dv
    w_in = torch.cat([P[a + "in_proj.weight." + s] for s in ("query", "key", "value", "z", "beta", "alpha")])
    qkvzba = F.linear(y, w_in)
    qkv, gate, beta, alpha = torch.split(qkvzba, [2 * qk + v_dim, v_dim, nv, nv], dim=-1)
    gate = gate.reshape(B, T, -1, dv)
    # deterministic path: torch-native depthwise conv1d, padding K-1, first T outputs, then act_fn (silu)
    w = torch.cat([P[a + "conv1d.weight." + s] for s in ("query", "key", "value")]).unsqueeze(1)
    conv = F.conv1d(qkv.transpose(1, 2), w, None, padding=c["conv_kernel"] - 1, groups=2 * qk + v_dim)
    qkv = F.silu(conv[..., :T]).transpose(1, 2)
    query_key, value = torch.split(qkv, [2 * qk, v_dim], dim=-1)
    query_key = l2norm(query_key.reshape(B, T, -1, dk))
    value = value.reshape(B, T, -1, dv)
    query, key = torch.split(query_key, [nk, nk], dim=2)
    rep = nv // nk
    query = query.repeat_interleave(rep, dim=2)
    key = key.repeat_interleave(rep, dim=2)
    g = -P[a + "A_log"].exp() * F.softplus(alpha + P[a + "dt_bias"])
    beta = beta.sigmoid()
    o = recurrent_gated_delta_rule(query, key, value, g, beta)
    oc = torch_chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=4)
    CHECKED_CHUNKED.append(float((o - oc).abs().max()))
    # _apply_gated_norm: out_norm over dv (the model's LayerNorm, 1 + γ), times silu(gate)
    yv = F.layer_norm(o, (dv,), 1 + P[a + "out_norm.weight"], P[a + "out_norm.bias"], c["eps"]) * F.silu(gate)
    return F.linear(yv.reshape(B, T, -1), P[a + "out_proj.weight"])


def forward(c, P, tokens):
    x = P["embedding.word_embeddings.weight"][tokens]
    for i, lin in enumerate(pattern(c)):
        p = f"decoder.layers.{i}."
        y = norm(c, x, P[p + "input_layernorm.weight"], P[p + "input_layernorm.bias"])
        x = x + (gated_delta_net(c, P, p, y) if lin else gated_attention(c, P, p, y))
        y = norm(c, x, P[p + "pre_mlp_layernorm.weight"], P[p + "pre_mlp_layernorm.bias"])
        gate, up = F.linear(y, P[p + "mlp.linear_fc1.weight"]).chunk(2, -1)
        x = x + F.linear(F.silu(gate) * up, P[p + "mlp.linear_fc2.weight"])
    x = norm(c, x, P["decoder.final_layernorm.weight"], P["decoder.final_layernorm.bias"])
    return x @ P["output_layer.weight"].t()


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "model/gpt/testdata"
    gen = torch.Generator().manual_seed(4321)
    c = C
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
    worst = max(CHECKED_CHUNKED)
    assert worst < 1e-12, f"recurrent and Megatron's chunked delta rule differ by {worst}"
    out["logits"] = logits
    out["loss"] = loss.reshape(1)
    for k, v in params.items():
        out["grad/" + k] = v.grad.clone()
    write_safetensors(os.path.join(outdir, "gdn.safetensors"), out)
    with open(os.path.join(outdir, "gdn.json"), "w") as f:
        json.dump({"config": c}, f, indent=1, sort_keys=True)
    print("loss", float(loss), "chunked vs recurrent max diff", worst)


if __name__ == "__main__":
    main()
