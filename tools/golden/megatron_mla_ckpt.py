#!/usr/bin/python3
"""Megatron-LM `--ckpt-format torch` checkpoints of multi-latent attention
(MLA) models for gotron's importer (ckpt/megatron).

Usage (repository root, Debian's python3-torch 1.13, CPU; Megatron is NOT needed):

    /usr/bin/python3 tools/golden/megatron_mla_ckpt.py   # writes ckpt/megatron/testdata/mla_*

The weights and the float64 reference forward are tools/golden/mla.py's
(Megatron's MLASelfAttention written out in plain PyTorch from the unsharded
weights); the rank files are written as tools/golden/megatron_ckpt.py writes
them, with MLASelfAttention's state-dict names and tensor-parallel splits as
Megatron HEAD's layer specs build them (megatron/core/models/gpt/
gpt_layer_specs.py, transformer/multi_latent_attention.py,
mla_qk_norm_config.py). Megatron builds the latents' norms (q_layernorm,
kv_layernorm) only with --qk-layernorm, so both cases set it:

  mla_tp2_pp2_te     mla.py's mla_qlora (q_lora_rank, LayerNorm, learned
                     positions, biases, tied, YaRN factor 40) at TP=2 PP=2,
                     TransformerEngine names: linear_q_down_proj and
                     linear_kv_down_proj are TELinear(parallel_mode="duplicated")
                     (every rank holds all of it), the latent norms fused into
                     the column-parallel up-projections
                     (linear_q_up_proj.layer_norm_weight/bias,
                     linear_kv_up_proj.layer_norm_weight/bias), input_layernorm a
                     TENorm, pre_mlp_layernorm fused into linear_fc1.
  mla_tp2_local      mla.py's mla_plain_q (linear_q_proj, RMSNorm, no position
                     table, SwiGLU, untied, YaRN factor 4) at TP=2, the local
                     spec: every projection but linear_proj a ColumnParallelLinear,
                     so the down-projections' rows are split over the ranks too
                     (MLA gathers them), q/kv norms standalone (kv_layernorm.weight).

The up-projections split rows by whole heads (each head's [nope; rope] query
rows, [nope; v] key-value rows), linear_proj its input columns by heads.
golden.json holds the tokens, the logits over the vocabulary (mla.py's
configs use vocab 64, a multiple of 2×32: no padding) and log-probs.
CI never runs Python.
"""
import argparse
import collections
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_ckpt as mc  # noqa: E402  (registers Megatron's enum stand-ins)
import mla  # noqa: E402

CASES = {
    "mla_tp2_pp2_te": dict(base="mla_qlora", tp=2, pp=2, te=True, iteration=40),
    "mla_tp2_local": dict(base="mla_plain_q", tp=2, pp=1, te=False, iteration=7),
}


def args_for(c, m):
    a = mc.megatron_args(dict(arch="gpt", tp=c["tp"], pp=c["pp"], vp=1, layers=m["layers"], hidden=m["hidden"],
                              heads=m["heads"], groups=m["heads"], kv=m["hidden"] // m["heads"], ffn=m["ffn"],
                              vocab=m["vocab"], divisible=32, positions=m["seq"], seq=m["seq"], eps=m["eps"],
                              dtype=torch.float32, te=c["te"], iteration=c["iteration"], optimizer="adam"))
    d = vars(a)
    d.update(multi_latent_attention=True, qk_layernorm=True, q_lora_rank=m["q_lora_rank"],
             kv_lora_rank=m["kv_lora_rank"], qk_head_dim=m["qk_head_dim"], qk_pos_emb_head_dim=m["qk_pos_emb_head_dim"],
             v_head_dim=m["v_head_dim"], rope_type="yarn", rotary_scaling_factor=m["rotary_scaling_factor"],
             mscale=m["mscale"], mscale_all_dim=m["mscale_all_dim"],
             original_max_position_embeddings=m["original_max_position_embeddings"],
             beta_fast=m["beta_fast"], beta_slow=m["beta_slow"], rotary_base=m["rotary_base"],
             position_embedding_type=m["pos"], normalization=m["norm"], swiglu=m["act"] == "swiglu",
             openai_gelu=m["act"] == "gelu_tanh", add_bias_linear=m["bias"],
             untie_embeddings_and_output_weights=not m["tied"], hidden_dropout=0.0, attention_dropout=0.0,
             padded_vocab_size=m["vocab"], kv_channels=m["hidden"] // m["heads"])
    return a


def rows(x, t, tp):
    n = x.shape[0] // tp
    return x[t * n:(t + 1) * n]


def cols(x, t, tp):
    n = x.shape[1] // tp
    return x[:, t * n:(t + 1) * n]


def layer_state(c, m, P, i, t):
    tp, te = c["tp"], c["te"]
    p = f"decoder.layers.{i}."
    s = p + "self_attention."
    g = lambda k: P.get(k)
    out = collections.OrderedDict()

    def put(k, v):
        if v is not None:
            out[k] = v
    put("input_layernorm.weight", P[p + "input_layernorm.weight"])
    put("input_layernorm.bias", g(p + "input_layernorm.bias"))
    put("self_attention.linear_proj.weight", cols(P[s + "linear_proj.weight"], t, tp))
    put("self_attention.linear_proj.bias", g(s + "linear_proj.bias"))
    if te:
        out["self_attention.linear_proj._extra_state"] = None
    down = (lambda x: x) if te else (lambda x: rows(x, t, tp))  # TELinear "duplicated" / ColumnParallelLinear
    if m["q_lora_rank"] is None:
        put("self_attention.linear_q_proj.weight", rows(P[s + "linear_q_proj.weight"], t, tp))
    else:
        put("self_attention.linear_q_down_proj.weight", down(P[s + "linear_q_down_proj.weight"]))
        if te:
            put("self_attention.linear_q_up_proj.layer_norm_weight", P[s + "q_layernorm.weight"])
            put("self_attention.linear_q_up_proj.layer_norm_bias", g(s + "q_layernorm.bias"))
        put("self_attention.linear_q_up_proj.weight", rows(P[s + "linear_q_up_proj.weight"], t, tp))
    put("self_attention.linear_kv_down_proj.weight", down(P[s + "linear_kv_down_proj.weight"]))
    if te:
        put("self_attention.linear_kv_up_proj.layer_norm_weight", P[s + "kv_layernorm.weight"])
        put("self_attention.linear_kv_up_proj.layer_norm_bias", g(s + "kv_layernorm.bias"))
        out["self_attention.linear_kv_up_proj._extra_state"] = None
    put("self_attention.linear_kv_up_proj.weight", rows(P[s + "linear_kv_up_proj.weight"], t, tp))
    if not te:
        if m["q_lora_rank"] is not None:
            put("self_attention.q_layernorm.weight", P[s + "q_layernorm.weight"])
            put("self_attention.q_layernorm.bias", g(s + "q_layernorm.bias"))
        put("self_attention.kv_layernorm.weight", P[s + "kv_layernorm.weight"])
        put("self_attention.kv_layernorm.bias", g(s + "kv_layernorm.bias"))
    pre = "mlp.linear_fc1.layer_norm_" if te else "pre_mlp_layernorm."
    put(pre + "weight", P[p + "pre_mlp_layernorm.weight"])
    put(pre + "bias", g(p + "pre_mlp_layernorm.bias"))
    fc1, fc1b = P[p + "mlp.linear_fc1.weight"], g(p + "mlp.linear_fc1.bias")
    if m["act"] == "swiglu":  # rank t holds [gate_t; up_t]
        gate, up = fc1.chunk(2, 0)
        fc1 = torch.cat([rows(gate, t, tp), rows(up, t, tp)], 0)
        assert fc1b is None
    else:
        fc1 = rows(fc1, t, tp)
        fc1b = rows(fc1b, t, tp) if fc1b is not None else None
    put("mlp.linear_fc1.weight", fc1)
    put("mlp.linear_fc1.bias", fc1b)
    put("mlp.linear_fc2.weight", cols(P[p + "mlp.linear_fc2.weight"], t, tp))
    put("mlp.linear_fc2.bias", g(p + "mlp.linear_fc2.bias"))
    return out


def chunk_state(c, m, P, t, pp_rank):
    tp, pp, nl = c["tp"], c["pp"], m["layers"]
    per = nl // pp
    first, last = pp_rank == 0, pp_rank == pp - 1
    s = collections.OrderedDict()
    if first:
        s["embedding.word_embeddings.weight"] = rows(P["embedding.word_embeddings.weight"], t, tp)
        if "embedding.position_embeddings.weight" in P:
            s["embedding.position_embeddings.weight"] = P["embedding.position_embeddings.weight"]
    for i in range(per):
        for k, v in layer_state(c, m, P, pp_rank * per + i, t).items():
            s[f"decoder.layers.{i}.{k}"] = v
    if last:
        s["decoder.final_layernorm.weight"] = P["decoder.final_layernorm.weight"]
        if "decoder.final_layernorm.bias" in P:
            s["decoder.final_layernorm.bias"] = P["decoder.final_layernorm.bias"]
        if not m["tied"]:
            s["output_layer.weight"] = rows(P["output_layer.weight"], t, tp)
        elif not first:
            s["output_layer.weight"] = rows(P["embedding.word_embeddings.weight"], t, tp)
    return collections.OrderedDict((k, v.float().contiguous() if torch.is_tensor(v) else v) for k, v in s.items())


def build(name, c):
    m = mla.CONFIGS[c["base"]]
    gen = torch.Generator().manual_seed(4321)
    P = mla.params_for(m, gen)  # float64 holding float32 values: the rank files store them exactly
    tokens = [x % m["vocab"] for x in mc.TOKENS[:m["seq"]]]
    logits = mla.forward(m, P, torch.tensor([tokens]))[0]
    lp = F.log_softmax(logits, -1)
    logprobs = [lp[i - 1, tokens[i]].item() for i in range(1, len(tokens))]
    args = args_for(c, m)
    d = os.path.join(mc.OUT, name)
    it = c["iteration"]
    for t in range(c["tp"]):
        for p in range(c["pp"]):
            sd = {"args": args, "checkpoint_version": 3.0, "iteration": it, "model": chunk_state(c, m, P, t, p),
                  "rng_state": mc.rng_state(full=False), "num_floating_point_operations_so_far": 1.0}
            rank = f"mp_rank_{t:02d}" if c["pp"] == 1 else f"mp_rank_{t:02d}_{p:03d}"
            path = os.path.join(d, f"iter_{it:07d}", rank, "model_optim_rng.pt")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            torch.save(sd, path)
    with open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(it))
    golden = {"tokens": tokens, "padded_vocab_size": m["vocab"],
              "logits": [[float(x) for x in row] for row in logits.tolist()], "logprobs": logprobs}
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden, f)
    print(f"{name}: logits {tuple(logits.shape)}")


if __name__ == "__main__":
    for n, c in CASES.items():
        build(n, c)
