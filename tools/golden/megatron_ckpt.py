#!/usr/bin/python3
"""Megatron-LM legacy (`--ckpt-format torch`) checkpoints for gotron's importer
(ckpt/torchpt, ckpt/megatron, `gotron convert --from megatron`).

Usage (repository root, Debian's python3-torch 1.13, CPU; Megatron is NOT needed):

    /usr/bin/python3 tools/golden/megatron_ckpt.py    # writes ckpt/megatron/testdata, ckpt/torchpt/testdata

Megatron is not imported: the script writes what Megatron's
`megatron/training/checkpointing.py` writes, by hand:

    DIR/latest_checkpointed_iteration.txt           "<iteration>"
    DIR/iter_0000NNN/mp_rank_TT/model_optim_rng.pt      (TP only)
    DIR/iter_0000NNN/mp_rank_TT_PPP/model_optim_rng.pt  (TP and PP)

each a torch.save of {'args': argparse.Namespace (Megatron's argument names),
'checkpoint_version': 3.0, 'iteration', 'model' (or 'model0', 'model1', ... per
virtual pipeline chunk), 'optimizer', 'opt_param_scheduler', 'rng_state',
'num_floating_point_operations_so_far', 'rerun_state_machine'}. Model state
dicts use Megatron core's parameter names with layer numbers local to each
pipeline stage (the ModuleList index), TransformerEngine's fused-norm names
(`linear_qkv.layer_norm_weight`, `linear_fc1.layer_norm_weight`) and
`_extra_state` entries (an io.BytesIO, None, an empty uint8 tensor) for the
TE case, the local spec's names (`input_layernorm`, `pre_mlp_layernorm`) for
the other. Megatron's enums live in stand-in modules registered under their
real names, so they pickle as Megatron's do.

Tensor-parallel splits follow megatron/core (tools/checkpoint/
loader_base.py): linear_qkv rows in whole query groups per rank, each group
[its query heads; k; v]; SwiGLU linear_fc1 as [gate_r; up_r] per rank;
linear_proj and linear_fc2 split along their input columns; embedding and
output layer along (padded) vocabulary rows; norms and row-parallel biases
replicated. With pipeline parallelism and tied embeddings the last stage
holds its own copy of the embedding as output_layer.weight, as Megatron's
does.

The reference is a plain float64 forward written from the unsharded weights
in their natural form (separate q/k/v heads, separate gate/up), so a wrong
merge of the shards cannot agree with it: golden.json holds the tokens, the
logits over the padded vocabulary [T][V_padded] and the per-token log-probs
log p(t_i | t_<i) (log-softmax over the padded vocabulary, as Megatron's
loss).

The optimizer state is Megatron's non-distributed optimizer's
(megatron/core/optimizer): natural per-parameter tensors of the weights'
form (Adam's exp_avg and exp_avg_sq, or SGD's momentum_buffer, and with
bf16/fp16 the fp32 main params, which round to the stored weights) are
sharded exactly as the weights, and each rank's `optimizer` entry is what
its optimizer.state_dict() holds: the rank's parameters in
named_parameters() order (chunk by chunk), split into param groups by
weight decay (biases and 1-D parameters take none), torch's state dict
indices numbering them group by group; Float16OptimizerWithFloat16Params
wraps it as {optimizer, grad_scaler (fp16), fp32_from_fp16_params (by
group)}, FP32Optimizer is the plain torch state dict. optimizer.safetensors
holds the whole tensors the import must produce, keyed as gotron's
checkpoints key them ("exp_avg/<param>", ...; "main_params/<param>"), with
the optimizer's kind, step count and loss scaler as metadata. Cases:

  llama_tp2_pp2      RMSNorm, SwiGLU, RoPE (base 500000), GQA (4 heads, 2 groups),
                     untied output, no biases, 4 layers, bf16 weights, TE names,
                     HEAD's argument names; Float16OptimizerWithFloat16Params over
                     Apex/TE FusedAdam (the step in param_groups), HEAD's group
                     order (weight decay first)
  gpt_tp2_pp2_vp2    LayerNorm, GELU, biases, learned positions, tied, 4 layers
                     over TP=2 PP=2 and 2 virtual stages, fp32 (fp16-representable
                     values, shared with gpt_tp2), local-spec names, older argument
                     names (norm_epsilon, apply_layernorm_1p); FP32Optimizer over
                     torch's AdamW (a step per parameter), older Megatron's group
                     order (first appearance: it differs between the stages), the
                     tied embeddings' copy on the last stage with its own state
  gpt_tp2            the same GPT weights at TP=2 alone (mp_rank_TT directories),
                     fp16, SGD with momentum, a dynamic loss scaler
  gpt_tp2_pp2_distopt
                     a GPT of 2 layers (one per stage), tied, bf16, TP=2 PP=2 DP=2
                     with the distributed optimizer (--use-distributed-optimizer,
                     --overlap-grad-reduce, --ddp-bucket-size 1488): see below

The distributed optimizer's case follows Megatron-LM's
megatron/core/optimizer/distrib_optimizer.py (get_parameter_state_dp_zero,
save_parameter_state) and the buffer layout of
megatron/core/distributed/param_and_grad_buffer.py and optimizer/param_layout.py
as of commit d98e8a64 (2026-08-22; the format dates from 369e698d, 2024-04-03,
"buckets_coalesced", and the 64-element parameter alignment from 5467bef3,
2024-07-01). Each rank's model_optim_rng.pt holds the optimizer section
DistributedOptimizer.state_dict() writes: {optimizer: {param_groups}}, the
param groups without their params (FusedAdam's step in each), no per-parameter
state and no main params (bf16 without a loss scale: no grad_scaler). Beside it,
distrib_optim.pt (written by data-parallel rank 0 of each (TP, PP) rank) holds
{buckets_coalesced: True, gbuf_index: {(param_dtype, grad_dtype): {param,
exp_avg, exp_avg_sq: flat fp32 tensors, numel_unpadded}}}, one gradient buffer
per model chunk and dtype. The script lays each buffer out as Megatron's DDP
does (the chunk's parameters in reverse named_parameters() order, each start
rounded up to 64 elements, a bucket closed once it holds bucket_size elements
(the first chunk of the first stage only; None elsewhere) and around the shared
embedding (tied embeddings under PP: the first stage's word embedding and the
last stage's copy), bucket ends padded to lcm(DP, 128)), fills every DP rank's
contiguous 1/DP shard of each bucket from the parameters' ranges in it,
gathers the shards on DP rank 0 and keeps the first numel_unpadded elements of
each bucket, concatenated: the steps of get_parameter_state_dp_zero. The bucket
size, 1488, closes the first stage's first bucket after the input norm's weight,
whose end is not a multiple of 64, and leaves the position embeddings in an open
bucket that the shared embedding closes: in the coalesced buffer the position
embeddings then start at 1488, not at 1536 where a single bucket would put them,
so a reader that gets the buckets wrong cannot read them right.

and, for ckpt/torchpt's reader, edge.pt (zip) and edge_legacy.pt (the
pre-1.6 format) holding every kind of value the reader must handle.
CI never runs Python.
"""
import argparse
import collections
import enum
import io
import json
import math
import os
import random
import sys
import types

import numpy as np
import torch

OUT = "ckpt/megatron/testdata"
TORCHPT_OUT = "ckpt/torchpt/testdata"
TOKENS = [1, 17, 42, 99, 5, 5, 64, 2, 77, 23, 50, 8]


# ---------------------------------------------------------------- stand-ins for Megatron's enums

def fake_module(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        n = ".".join(parts[:i])
        if n not in sys.modules:
            sys.modules[n] = types.ModuleType(n)
            if i > 1:
                setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[n])
    return sys.modules[name]


_enums = fake_module("megatron.core.transformer.enums")


class AttnBackend(enum.Enum):
    flash = 1
    fused = 2
    unfused = 3
    local = 4
    auto = 5


class ModelType(enum.Enum):
    encoder_or_decoder = 1


for _cls in (AttnBackend, ModelType):
    _cls.__module__ = "megatron.core.transformer.enums"
    _cls.__qualname__ = _cls.__name__
    setattr(_enums, _cls.__name__, _cls)


# ---------------------------------------------------------------- configurations

# optimizer: Megatron's --optimizer; wrapper: "fp16" is Float16OptimizerWithFloat16Params (bf16/fp16
# training: fp32 main params), "fp32" FP32Optimizer (the plain torch state dict); step: where the
# Adam step count lives ("group": Apex/TE FusedAdam's param_groups[i]['step'], "state": torch.optim's
# per-parameter state['step'] tensor); groups: the param-group order ("sorted": Megatron HEAD, the
# default (weight-decay) group first; "insertion": older Megatron core, groups in the order their
# first parameter appears on the rank).
CASES = {
    "llama_tp2_pp2": dict(arch="llama", tp=2, pp=2, vp=1, layers=4, hidden=16, heads=4, groups=2, kv=4, ffn=32,
                          vocab=100, divisible=32, positions=64, seq=32, eps=1e-5, base=500000, dtype=torch.bfloat16,
                          te=True, iteration=1200, optimizer="adam", wrapper="fp16", step="group", steps=1190,
                          param_groups="sorted"),
    "gpt_tp2_pp2_vp2": dict(arch="gpt", tp=2, pp=2, vp=2, layers=4, hidden=16, heads=4, groups=4, kv=4, ffn=32,
                            vocab=100, divisible=32, positions=32, seq=32, eps=1e-5, dtype=torch.float32,
                            round_to=torch.float16, te=False, iteration=30, seed="gpt", optimizer="adam",
                            wrapper="fp32", step="state", steps=30, param_groups="insertion"),
    "gpt_tp2": dict(arch="gpt", tp=2, pp=1, vp=1, layers=4, hidden=16, heads=4, groups=4, kv=4, ffn=32,
                    vocab=100, divisible=32, positions=32, seq=32, eps=1e-5, dtype=torch.float16,
                    te=False, iteration=30, seed="gpt", optimizer="sgd", wrapper="fp16", steps=None,
                    param_groups="insertion"),
    "gpt_tp2_pp2_distopt": dict(arch="gpt", tp=2, pp=2, vp=1, layers=2, hidden=16, heads=4, groups=4, kv=4, ffn=32,
                                vocab=100, divisible=32, positions=32, seq=32, eps=1e-5, dtype=torch.bfloat16,
                                te=False, iteration=500, optimizer="adam", wrapper="fp16", step="group", steps=497,
                                param_groups="sorted", dist=dict(dp=2, bucket_size=1488)),
}


def padded_vocab(c):
    m = c["divisible"] * c["tp"]  # Megatron's _vocab_size_with_padding
    return (c["vocab"] + m - 1) // m * m


def megatron_args(c):
    """An argparse.Namespace with Megatron's argument names (a representative subset)."""
    llama = c["arch"] == "llama"
    a = dict(
        num_layers=c["layers"], hidden_size=c["hidden"], ffn_hidden_size=c["ffn"],
        num_attention_heads=c["heads"], group_query_attention=llama, num_query_groups=c["groups"] if llama else 1,
        kv_channels=c["kv"], max_position_embeddings=c["positions"], seq_length=c["seq"],
        position_embedding_type="rope" if llama else "learned_absolute", add_position_embedding=True,
        use_rotary_position_embeddings=False, rotary_base=c.get("base", 10000), rotary_percent=1.0,
        rotary_interleaved=False, rotary_seq_len_interpolation_factor=None, use_rope_scaling=False,
        rope_scaling_factor=8.0, no_rope_freq=None,
        normalization="RMSNorm" if llama else "LayerNorm",
        swiglu=llama, squared_relu=False, quick_geglu=False, openai_gelu=False, onnx_safe=None,
        add_bias_linear=not llama, add_qkv_bias=False, untie_embeddings_and_output_weights=llama,
        apply_query_key_layer_scaling=False, attention_softmax_in_fp32=False,
        apply_residual_connection_post_layernorm=False, qk_layernorm=False, softmax_scale=None,
        num_experts=None, moe_layer_freq=1, moe_router_topk=2, multi_latent_attention=False, mtp_num_layers=None,
        window_size=None, heterogeneous_layers_config_path=None, hybrid_layer_pattern=None,
        tensor_model_parallel_size=c["tp"], pipeline_model_parallel_size=c["pp"],
        virtual_pipeline_model_parallel_size=c["vp"] if c["vp"] > 1 else None,
        num_layers_per_virtual_pipeline_stage=c["layers"] // (c["pp"] * c["vp"]) if c["vp"] > 1 else None,
        decoder_first_pipeline_num_layers=None, decoder_last_pipeline_num_layers=None,
        expert_model_parallel_size=1, context_parallel_size=1, sequence_parallel=c["tp"] > 1,
        data_parallel_size=1, world_size=c["tp"] * c["pp"], rank=0,
        padded_vocab_size=padded_vocab(c), make_vocab_size_divisible_by=c["divisible"], vocab_size=None,
        tokenizer_type="HuggingFaceTokenizer" if llama else "GPT2BPETokenizer",
        tokenizer_model="/data/llama-tokenizer" if llama else None,
        vocab_file=None if llama else "/data/gpt2-vocab.json", merge_file=None if llama else "/data/gpt2-merges.txt",
        params_dtype=c["dtype"], bf16=c["dtype"] == torch.bfloat16, fp16=c["dtype"] == torch.float16,
        loss_scale=None, initial_loss_scale=4294967296, min_loss_scale=1.0, loss_scale_window=1000, hysteresis=2,
        optimizer=c["optimizer"], sgd_momentum=0.9, decoupled_lr=None, decoupled_min_lr=None,
        hidden_dropout=0.0 if llama else 0.1, attention_dropout=0.0 if llama else 0.1, init_method_std=0.02,
        iteration=c["iteration"], consumed_train_samples=c["iteration"] * 8, consumed_valid_samples=80,
        skipped_train_samples=0,
        train_iters=10000, lr=3e-4, min_lr=3e-5, lr_decay_style="cosine", lr_warmup_iters=100,
        weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8, clip_grad=1.0,
        micro_batch_size=2, global_batch_size=8, seed=1234, data_path=["/data/corpus_text_document"],
        split="949,50,1", save="/ckpt", load="/ckpt", save_interval=100, eval_interval=100, eval_iters=10,
        transformer_impl="transformer_engine" if c["te"] else "local", ckpt_format="torch",
        use_distributed_optimizer=False, use_mcore_models=True, attention_backend=AttnBackend.auto,
        model_type=ModelType.encoder_or_decoder, exit_on_missing_checkpoint=False, timing_log_level=0,
        recompute_granularity=None, recompute_method=None, recompute_num_layers=None,
    )
    if "dist" in c:  # --use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size N, DP > 1
        dp = c["dist"]["dp"]
        a.update(use_distributed_optimizer=True, data_parallel_size=dp, world_size=c["tp"] * c["pp"] * dp,
                 overlap_grad_reduce=True, overlap_param_gather=True, ddp_bucket_size=c["dist"]["bucket_size"],
                 ddp_num_buckets=None, ddp_pad_buckets_for_high_nccl_busbw=False,
                 overlap_param_gather_with_optimizer_step=False, num_distributed_optimizer_instances=1,
                 accumulate_allreduce_grads_in_fp32=True, ckpt_convert_update_legacy_dist_opt_format=False)
    if llama:  # Megatron HEAD: names of TransformerConfig fields
        a.update(layernorm_epsilon=c["eps"], layernorm_zero_centered_gamma=False)
    else:  # older Megatron: --norm-epsilon, --apply-layernorm-1p
        a.update(norm_epsilon=c["eps"], apply_layernorm_1p=False)
    return argparse.Namespace(**a)


# ---------------------------------------------------------------- natural (unsharded) weights

def make_weights(c, gen):
    h, a, g, d, f = c["hidden"], c["heads"], c["groups"], c["kv"], c["ffn"]
    Vp = padded_vocab(c)
    llama = c["arch"] == "llama"

    def rnd(*shape, std=1.0):
        return std * torch.randn(*shape, generator=gen, dtype=torch.float32)

    def norm_w():
        return 1 + 0.1 * rnd(h)

    W = {"emb": rnd(Vp, h, std=0.5)}
    if not llama:
        W["pos"] = rnd(c["positions"], h, std=0.3)
    W["layers"] = []
    for _ in range(c["layers"]):
        L = dict(
            ln1=norm_w(), ln2=norm_w(),
            q=rnd(a, d, h, std=h ** -0.5), k=rnd(g, d, h, std=h ** -0.5), v=rnd(g, d, h, std=h ** -0.5),
            proj=rnd(h, a * d, std=(a * d) ** -0.5),
            fc2=rnd(h, f, std=f ** -0.5),
        )
        if llama:
            L.update(gate=rnd(f, h, std=h ** -0.5), up=rnd(f, h, std=h ** -0.5))
        else:
            L.update(fc1=rnd(f, h, std=h ** -0.5), ln1_b=0.1 * rnd(h), ln2_b=0.1 * rnd(h),
                     q_b=0.1 * rnd(a, d), k_b=0.1 * rnd(g, d), v_b=0.1 * rnd(g, d),
                     proj_b=0.1 * rnd(h), fc1_b=0.1 * rnd(f), fc2_b=0.1 * rnd(h))
        W["layers"].append(L)
    W["final"] = norm_w()
    if not llama:
        W["final_b"] = 0.1 * rnd(h)
    if llama:
        W["out"] = rnd(Vp, h, std=0.5)
    # Round to the stored dtype (or a narrower one shared by cases that must
    # hold the same weights): the reference uses exactly the stored values.
    dt = c.get("round_to", c["dtype"])

    def rnd_to(x):
        return x.to(dt).to(torch.float32) if torch.is_tensor(x) else x

    W = {k: ([{kk: rnd_to(vv) for kk, vv in L.items()} for L in v] if k == "layers" else rnd_to(v)) for k, v in W.items()}
    return W


# ---------------------------------------------------------------- the reference forward (float64)

def rope_cos_sin(d, T, base):
    # Megatron's RotaryEmbedding: float32 inv_freq and angles, cos/sin in float32.
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return torch.cos(emb).double(), torch.sin(emb).double()


def rotate_half(x):
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def reference(c, W, tokens):
    D = lambda t: t.double()
    h, a, g, d = c["hidden"], c["heads"], c["groups"], c["kv"]
    llama = c["arch"] == "llama"
    eps = c["eps"]
    T = len(tokens)
    ids = torch.tensor(tokens)

    def norm(x, w, b=None):
        if llama:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * D(w)
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + eps) * D(w) + D(b)

    x = D(W["emb"])[ids]
    if not llama:
        x = x + D(W["pos"])[:T]
    if llama:
        cos, sin = rope_cos_sin(d, T, c["base"])
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for L in W["layers"]:
        y = norm(x, L["ln1"], L.get("ln1_b"))
        q = torch.einsum("th,adh->atd", y, D(L["q"]))
        k = torch.einsum("th,gdh->gtd", y, D(L["k"]))
        v = torch.einsum("th,gdh->gtd", y, D(L["v"]))
        if not llama:
            q, k, v = q + D(L["q_b"])[:, None], k + D(L["k_b"])[:, None], v + D(L["v_b"])[:, None]
        if llama:
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        r = a // g
        out = []
        for i in range(a):  # query head i attends with key/value head i // r
            s = q[i] @ k[i // r].T / math.sqrt(d)
            s = torch.where(causal, s, torch.tensor(-math.inf, dtype=torch.float64))
            out.append(torch.softmax(s, dim=-1) @ v[i // r])
        o = torch.cat(out, dim=-1)  # (T, a*d), heads in order
        o = o @ D(L["proj"]).T
        if not llama:
            o = o + D(L["proj_b"])
        x = x + o
        y = norm(x, L["ln2"], L.get("ln2_b"))
        if llama:
            m = torch.nn.functional.silu(y @ D(L["gate"]).T) * (y @ D(L["up"]).T)
        else:
            m = torch.nn.functional.gelu(y @ D(L["fc1"]).T + D(L["fc1_b"]))  # exact erf GELU, Megatron's default
        m = m @ D(L["fc2"]).T
        if not llama:
            m = m + D(L["fc2_b"])
        x = x + m
    x = norm(x, W["final"], W.get("final_b"))
    logits = x @ D(W["out"] if llama else W["emb"]).T
    logp = torch.log_softmax(logits, dim=-1)
    lp = [logp[t - 1, tokens[t]].item() for t in range(1, T)]
    return logits, lp


# ---------------------------------------------------------------- Megatron's shards

def fused_qkv(c, L, t):
    """Rank t's linear_qkv weight (and bias): its query groups, each [q heads; k; v]."""
    a, g = c["heads"], c["groups"]
    r, per = a // g, g // c["tp"]
    rows, bias = [], []
    for j in range(t * per, (t + 1) * per):
        rows += [L["q"][j * r + i] for i in range(r)] + [L["k"][j], L["v"][j]]
        if "q_b" in L:
            bias += [L["q_b"][j * r + i] for i in range(r)] + [L["k_b"][j], L["v_b"][j]]
    w = torch.cat(rows, dim=0)  # (per*(r+2)*d, h)
    return w, (torch.cat(bias, dim=0) if bias else None)


def layer_state(c, L, t, te, dt=None):
    """Rank t's state dict entries of one layer (names relative to decoder.layers.N.)."""
    tp, llama = c["tp"], c["arch"] == "llama"
    dt = dt or c["dtype"]
    s = collections.OrderedDict()
    qkv_w, qkv_b = fused_qkv(c, L, t)
    a_per = c["heads"] // tp
    proj = L["proj"][:, t * a_per * c["kv"]:(t + 1) * a_per * c["kv"]]
    f_per = c["ffn"] // tp
    if llama:
        fc1 = torch.cat([L["gate"][t * f_per:(t + 1) * f_per], L["up"][t * f_per:(t + 1) * f_per]], dim=0)
    else:
        fc1 = L["fc1"][t * f_per:(t + 1) * f_per]
    fc2 = L["fc2"][:, t * f_per:(t + 1) * f_per]
    if te:
        s["self_attention.linear_proj.weight"] = proj
        s["self_attention.linear_proj._extra_state"] = None
        s["self_attention.linear_qkv.layer_norm_weight"] = L["ln1"]
        s["self_attention.linear_qkv.weight"] = qkv_w
        s["self_attention.linear_qkv._extra_state"] = io.BytesIO(b"")  # TE 1.x: a BytesIO of fp8 metadata
        s["self_attention.core_attention._extra_state"] = torch.tensor([], dtype=torch.uint8)
        s["mlp.linear_fc1.layer_norm_weight"] = L["ln2"]
        s["mlp.linear_fc1.weight"] = fc1
        s["mlp.linear_fc1._extra_state"] = io.BytesIO(b"fp8 meta")
        s["mlp.linear_fc2.weight"] = fc2
        s["mlp.linear_fc2._extra_state"] = None
    else:
        s["input_layernorm.weight"] = L["ln1"]
        s["input_layernorm.bias"] = L["ln1_b"]
        s["self_attention.linear_qkv.weight"] = qkv_w
        s["self_attention.linear_qkv.bias"] = qkv_b
        s["self_attention.linear_proj.weight"] = proj
        s["self_attention.linear_proj.bias"] = L["proj_b"]
        s["pre_mlp_layernorm.weight"] = L["ln2"]
        s["pre_mlp_layernorm.bias"] = L["ln2_b"]
        s["mlp.linear_fc1.weight"] = fc1
        s["mlp.linear_fc1.bias"] = L["fc1_b"][t * f_per:(t + 1) * f_per]
        s["mlp.linear_fc2.weight"] = fc2
        s["mlp.linear_fc2.bias"] = L["fc2_b"]
    return collections.OrderedDict((k, v.to(dt).contiguous() if torch.is_tensor(v) and v.is_floating_point() else v)
                                   for k, v in s.items())


def chunk_state(c, W, t, p, v, dt=None):
    """The model state dict of TP rank t, pipeline stage p, virtual chunk v (of the weights W, or of
    per-parameter optimizer tensors in W's form, in dtype dt)."""
    tp, pp, vp, nl = c["tp"], c["pp"], c["vp"], c["layers"]
    per_chunk = nl // (pp * vp)
    first = v * (nl // vp) + p * per_chunk  # Megatron's get_transformer_layer_offset
    pre, post = (p == 0 and v == 0), (p == pp - 1 and v == vp - 1)
    dt = dt or c["dtype"]
    Vp = padded_vocab(c)
    vrows = slice(t * Vp // tp, (t + 1) * Vp // tp)
    s = collections.OrderedDict()
    if pre:
        s["embedding.word_embeddings.weight"] = W["emb"][vrows].to(dt).contiguous()
        if "pos" in W:
            s["embedding.position_embeddings.weight"] = W["pos"].to(dt)
    for i in range(per_chunk):  # local layer numbers
        for k, val in layer_state(c, W["layers"][first + i], t, c["te"], dt).items():
            s[f"decoder.layers.{i}.{k}"] = val
    if post:
        if c["te"]:
            s["decoder.final_layernorm.weight"] = W["final"].to(dt)
        else:
            s["decoder.final_layernorm.weight"] = W["final"].to(dt)
            if "final_b" in W:
                s["decoder.final_layernorm.bias"] = W["final_b"].to(dt)
        if "out" in W:
            s["output_layer.weight"] = W["out"][vrows].to(dt).contiguous()
        elif not pre:  # tied, on a later stage: Megatron keeps a synchronised copy
            s["output_layer.weight"] = W["emb"][vrows].to(dt).contiguous()
        s["output_layer._extra_state"] = None
    # torch's state_dict() attaches _metadata (module versions); keep it realistic.
    s._metadata = collections.OrderedDict([("", {"version": 1}), ("decoder", {"version": 1})])
    return s


def rng_state(full):
    st = {"random_rng_state": random.getstate() if full else None,
          "np_rng_state": np.random.get_state() if full else None,
          "torch_rng_state": torch.get_rng_state() if full else torch.tensor([], dtype=torch.uint8),
          "cuda_rng_state": None,
          "rng_tracker_states": {"model-parallel-rng": torch.tensor([1, 2, 3], dtype=torch.uint8)}}
    return [st]


# ---------------------------------------------------------------- optimizer state

def natural_like(W, fn):
    """A tree of W's form holding fn(name, tensor) for each of its tensors."""
    out = {}
    for k, v in W.items():
        if k == "layers":
            out[k] = [{kk: fn(f"layers.{i}.{kk}", vv) for kk, vv in L.items()} for i, L in enumerate(v)]
        else:
            out[k] = fn(k, v)
    return out


def optimizer_tensors(c, W, gen):
    """Natural (unsharded) per-parameter optimizer tensors, W's form: distinctive values per tensor
    (the mean moves with a running id, so a tensor put under another parameter's name is caught),
    every element distinct. Adam: exp_avg, exp_avg_sq (positive); SGD: momentum_buffer; with the
    fp16 wrapper the fp32 main params too: the weights with low bits of their own, each rounding
    back to the stored weight (Megatron copies main -> model params after every step)."""
    ids = iter(range(1, 1000))
    T = {}
    if c["optimizer"] == "adam":
        T["exp_avg"] = natural_like(W, lambda n, w: 1e-4 * next(ids) + 1e-4 * torch.randn(w.shape, generator=gen))
        T["exp_avg_sq"] = natural_like(W, lambda n, w: 1e-8 * next(ids) * (1 + torch.rand(w.shape, generator=gen)))
    else:
        T["momentum_buffer"] = natural_like(W, lambda n, w: 1e-3 * next(ids) + 1e-3 * torch.randn(w.shape, generator=gen))
    if c["wrapper"] == "fp16":
        dt = c["dtype"]
        delta = 2.0 ** -11 if dt == torch.bfloat16 else 2.0 ** -13  # below half an ulp of the stored type

        def main(n, w):
            u = 2 * torch.rand(w.shape, generator=gen) - 1
            m = (w * (1 + delta * u)).float()
            assert torch.equal(m.to(dt).float(), w), n
            return m

        T["main"] = natural_like(W, main)
    return T


def is_param(k, v):
    return torch.is_tensor(v) and v.is_floating_point() and not k.endswith("_extra_state")


def no_weight_decay(name, t):
    # Megatron's rule (optimizer/__init__.py): biases and 1-D parameters take no weight decay.
    return name.endswith(".bias") or t.dim() == 1


def optimizer_state(c, t, p, T):
    """Rank (t, p)'s `optimizer` entry as Megatron's optimizer.state_dict() writes it: the rank's
    parameters (named_parameters() of its model chunks, in order) split into param groups, torch's
    state dict indices numbering them group by group."""
    locs = {kind: {} for kind in T}
    order = []  # (name, weight) in named_parameters() order, chunk by chunk
    for v in range(c["vp"]):
        weights = chunk_state(c, c["W"], t, p, v)
        for kind, tree in T.items():
            for k, val in chunk_state(c, tree, t, p, v, torch.float32).items():
                locs[kind][(v, k)] = val
        order += [((v, k), val) for k, val in weights.items() if is_param(k, val)]
    groups = {}  # wd_mult -> [(v, name)], in first-appearance order
    for key, w in order:
        groups.setdefault(0.0 if no_weight_decay(key[1], w) else 1.0, []).append(key)
    keys = list(groups)
    if c["param_groups"] == "sorted":  # HEAD: sorted by overrides, no override (weight decay) first
        keys = sorted(keys, reverse=True)
    lr = 2.9e-4
    param_groups, state, index, mains = [], {}, 0, []
    for wd_mult in keys:
        members = groups[wd_mult]
        idx = list(range(index, index + len(members)))
        index += len(members)
        if c["optimizer"] == "sgd":  # torch.optim.SGD
            g = {"lr": lr, "momentum": 0.9, "dampening": 0, "weight_decay": 0.1 * wd_mult, "nesterov": False,
                 "maximize": False, "foreach": None, "differentiable": False}
        elif c["step"] == "group":  # Apex / TransformerEngine FusedAdam
            g = {"lr": lr, "bias_correction": True, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1 * wd_mult,
                 "amsgrad": False, "step": c["steps"]}
        else:  # torch.optim.AdamW
            g = {"lr": lr, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1 * wd_mult, "amsgrad": False,
                 "foreach": None, "maximize": False, "capturable": False, "differentiable": False, "fused": None}
        if c["param_groups"] == "sorted":  # Megatron HEAD's group keys
            g.update({"is_expert_parallel": False, "default_config": True, "wd_mult": wd_mult, "lr_mult": 1.0,
                      "is_decoupled_lr": False, "max_lr": 3e-4, "min_lr": 3e-5})
        else:  # older Megatron core
            g.update({"wd_mult": wd_mult, "lr_mult": 1.0, "is_expert_parallel": False, "is_decoupled_lr": False})
        g["params"] = idx
        param_groups.append(g)
        for i, key in zip(idx, members):
            st = {}
            if c["optimizer"] == "adam":
                if c["step"] == "state":
                    st["step"] = torch.tensor(float(c["steps"]))
                st["exp_avg"] = locs["exp_avg"][key].clone()
                st["exp_avg_sq"] = locs["exp_avg_sq"][key].clone()
            else:
                st["momentum_buffer"] = locs["momentum_buffer"][key].clone()
            state[i] = st
        if "main" in T:
            mains.append([locs["main"][key].clone() for key in members])
    inner = {"state": state, "param_groups": param_groups}
    if c["wrapper"] == "fp32":
        return inner
    sd = {"optimizer": inner}
    if c["dtype"] == torch.float16:  # DynamicGradScaler (bf16 without --loss-scale has no scaler)
        sd["grad_scaler"] = {"scale": torch.tensor(65536.0), "growth_tracker": 17, "hysteresis_tracker": 2}
    sd["fp32_from_fp16_params"] = mains
    return sd


def dist_optimizer_section(c, t, p, T):
    """Rank (t, p)'s `optimizer` entry with the distributed optimizer: DistributedOptimizer.state_dict()
    keeps the torch optimizer's param groups without their params (and without the per-parameter
    state, which goes to distrib_optim.pt); FusedAdam's step stays in every group."""
    inner = optimizer_state(c, t, p, T)["optimizer"]
    groups = [{k: v for k, v in g.items() if k != "params"} for g in inner["param_groups"]]
    return {"optimizer": {"param_groups": groups}}


def pad_to(x, m):
    return (x + m - 1) // m * m


def buffer_layout(numels, shared, bucket_size, dp):
    """Megatron's DDP buffer layout under the distributed optimizer: parameters walked in reverse,
    each start rounded up to 64 elements; the shared embedding closes the open bucket before it (at
    its aligned start) and its own after it; a bucket closes once it holds bucket_size elements;
    bucket ends are padded to lcm(dp, 128). Returns each parameter's [start, end) and the buckets as
    (start, end, numel_unpadded)."""
    ranges, buckets = [None] * len(numels), []
    state = {"bstart": 0, "open": 0}

    def close(unpadded_end):
        end = pad_to(unpadded_end, math.lcm(dp, 128))
        buckets.append((state["bstart"], end, unpadded_end - state["bstart"]))
        state["bstart"], state["open"] = end, 0
        return end

    cur = 0
    for i in reversed(range(len(numels))):
        cur = pad_to(cur, 64)
        if shared[i] and state["open"]:
            cur = close(cur)
        ranges[i] = (cur, cur + numels[i])
        state["open"] += 1
        cur += numels[i]
        if (bucket_size is not None and cur - state["bstart"] >= bucket_size) or shared[i]:
            cur = close(cur)
    if state["open"]:
        close(cur)
    return ranges, buckets


def distrib_optim(c, t, p, T):
    """Rank (t, p)'s distrib_optim.pt, as DP rank 0 gathers and saves it (get_parameter_state_dp_zero):
    per gradient buffer (model chunk by chunk; one dtype here), each DP rank's contiguous shard of
    every bucket is filled from the parameters' ranges in it, the shards are concatenated, and each
    bucket's first numel_unpadded elements are kept, the buckets concatenated."""
    dp, tied = c["dist"]["dp"], c["arch"] != "llama"
    trees = {"param": T["main"], "exp_avg": T["exp_avg"], "exp_avg_sq": T["exp_avg_sq"]}
    state = {"buckets_coalesced": True}
    for v in range(c["vp"]):
        ci = v * c["pp"] + p
        weights = chunk_state(c, c["W"], t, p, v)
        names = [k for k, w in weights.items() if is_param(k, w)]
        local = {key: chunk_state(c, tree, t, p, v, torch.float32) for key, tree in trees.items()}
        first, last = ci == 0, ci == c["pp"] * c["vp"] - 1
        shared = [tied and c["pp"] > 1 and ((n == "embedding.word_embeddings.weight" and first and not last) or
                                            (n == "output_layer.weight" and last and not first)) for n in names]
        bucket_size = c["dist"]["bucket_size"] if (v == 0 and p == 0) else None  # bucketing: chunk 0, stage 0
        ranges, buckets = buffer_layout([weights[n].numel() for n in names], shared, bucket_size, dp)
        unpadded = sum(b[2] for b in buckets)
        world = {key: torch.zeros(unpadded, dtype=torch.float32) for key in trees}
        offset = 0
        for b, (bs, be, bu) in enumerate(buckets):
            per = (be - bs) // dp
            for key in trees:
                shards = []
                for r in range(dp):  # DP rank r owns [bs + r*per, bs + (r+1)*per)
                    lo, hi = bs + r * per, bs + (r + 1) * per
                    shard = torch.zeros(per, dtype=torch.float32)
                    for n, (ps, pe) in zip(names, ranges):
                        s0, s1 = max(ps, lo), min(pe, hi)
                        if s1 > s0:
                            shard[s0 - lo:s1 - lo] = local[key][n].reshape(-1)[s0 - ps:s1 - ps]
                    shards.append(shard)
                world[key][offset:offset + bu] = torch.cat(shards)[:bu]  # the gather on DP rank 0
            offset += bu
        entry = dict(world)
        entry["numel_unpadded"] = unpadded
        state[v] = {(c["dtype"], torch.float32): entry}  # gbuf index = chunk (one buffer each)
        print(f"  rank t{t} p{p} chunk {v}: buckets {buckets}, numel_unpadded {unpadded}")
    return state


def whole_state(c, W):
    """W (or a tree of W's form) as gotron's whole parameters, by name (Megatron core's names at TP=1)."""
    llama = c["arch"] == "llama"
    out = collections.OrderedDict()
    out["embedding.word_embeddings.weight"] = W["emb"]
    if "pos" in W:
        out["embedding.position_embeddings.weight"] = W["pos"]
    c1 = dict(c, tp=1)
    for i, L in enumerate(W["layers"]):
        n = f"decoder.layers.{i}."
        qkv_w, qkv_b = fused_qkv(c1, L, 0)
        out[n + "input_layernorm.weight"] = L["ln1"]
        if "ln1_b" in L:
            out[n + "input_layernorm.bias"] = L["ln1_b"]
        out[n + "self_attention.linear_qkv.weight"] = qkv_w
        if qkv_b is not None:
            out[n + "self_attention.linear_qkv.bias"] = qkv_b
        out[n + "self_attention.linear_proj.weight"] = L["proj"]
        if "proj_b" in L:
            out[n + "self_attention.linear_proj.bias"] = L["proj_b"]
        out[n + "pre_mlp_layernorm.weight"] = L["ln2"]
        if "ln2_b" in L:
            out[n + "pre_mlp_layernorm.bias"] = L["ln2_b"]
        out[n + "mlp.linear_fc1.weight"] = torch.cat([L["gate"], L["up"]]) if llama else L["fc1"]
        if "fc1_b" in L:
            out[n + "mlp.linear_fc1.bias"] = L["fc1_b"]
        out[n + "mlp.linear_fc2.weight"] = L["fc2"]
        if "fc2_b" in L:
            out[n + "mlp.linear_fc2.bias"] = L["fc2_b"]
    out["decoder.final_layernorm.weight"] = W["final"]
    if "final_b" in W:
        out["decoder.final_layernorm.bias"] = W["final_b"]
    if "out" in W:
        out["output_layer.weight"] = W["out"]
    return out


def write_safetensors(path, tensors, metadata):
    """A safetensors file (F32), written by hand: 8-byte header length, JSON header, data."""
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for k in sorted(tensors):
        b = tensors[k].detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        header[k] = {"dtype": "F32", "shape": list(tensors[k].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def expected_optimizer(c, T):
    """optimizer.safetensors: the whole optimizer tensors gotron's import must produce, keyed as
    gotron's checkpoints key them ("<kind>/<param>"; "main_params/<param>" for the fp32 main
    params, which become the model weights)."""
    out = {}
    for kind, tree in T.items():
        for n, v in whole_state(c, tree).items():
            out[("main_params" if kind == "main" else kind) + "/" + n] = v
    meta = {"kind": "adamw" if c["optimizer"] == "adam" else "sgd",
            "steps": str(c["steps"] if c["steps"] is not None else c["iteration"])}
    if c["dtype"] == torch.float16:
        meta.update(loss_scale="65536", growth_tracker="17", hysteresis_tracker="2")
    return out, meta


def build(name, c):
    gen = torch.Generator().manual_seed(sum(map(ord, c.get("seed", name))))
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    W = make_weights(c, gen)
    logits, lp = reference(c, W, TOKENS)
    T = optimizer_tensors(c, W, gen)
    c = dict(c, W=W)
    d = os.path.join(OUT, name)
    it = c["iteration"]
    args = megatron_args(c)
    for t in range(c["tp"]):
        for p in range(c["pp"]):
            states = [chunk_state(c, W, t, p, v) for v in range(c["vp"])]
            sd = {"args": args, "checkpoint_version": 3.0, "iteration": it}
            if c["vp"] == 1:
                sd["model"] = states[0]
            else:
                for v, st in enumerate(states):
                    sd[f"model{v}"] = st
            sd["optimizer"] = dist_optimizer_section(c, t, p, T) if "dist" in c else optimizer_state(c, t, p, T)
            sd["opt_param_scheduler"] = {"max_lr": 3e-4, "lr_warmup_steps": 800, "num_steps": it * 8,
                                         "lr_decay_style": "cosine", "lr_decay_steps": 80000, "min_lr": 3e-5,
                                         "start_wd": 0.1, "end_wd": 0.1, "wd_incr_style": "constant",
                                         "wd_incr_steps": 80000}
            sd["rng_state"] = rng_state(full=c["arch"] == "llama")
            sd["num_floating_point_operations_so_far"] = 123456789.0
            sd["rerun_state_machine"] = {"mode": 0, "rerun_requested": False}
            rank = f"mp_rank_{t:02d}" if c["pp"] == 1 else f"mp_rank_{t:02d}_{p:03d}"
            path = os.path.join(d, f"iter_{it:07d}", rank, "model_optim_rng.pt")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            torch.save(sd, path)
            if "dist" in c:
                torch.save(distrib_optim(c, t, p, T), os.path.join(os.path.dirname(path), "distrib_optim.pt"))
    with open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(it))
    golden = {"tokens": TOKENS, "padded_vocab_size": padded_vocab(c),
              "logits": [[float(x) for x in row] for row in logits.tolist()], "logprobs": lp}
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden, f)
    tensors, meta = expected_optimizer(c, T)
    write_safetensors(os.path.join(d, "optimizer.safetensors"), tensors, meta)
    print(f"{name}: logits {tuple(logits.shape)}, mean logprob {sum(lp) / len(lp):.6f}")


# ---------------------------------------------------------------- malformed distrib_optim.pt files

def build_dist_malformed():
    """Small distrib_optim.pt files that ckpt/megatron's tests put in place of a rank's: each is either
    another layout, which the import declines with a warning naming the file, or malformed, which is an
    error naming the file. Their tensors are tiny: each is refused before its layout is looked at."""
    d = os.path.join(OUT, "distrib_optim_malformed")
    os.makedirs(d, exist_ok=True)
    key = (torch.bfloat16, torch.float32)

    def entry(n=8, m=None, drop=()):
        e = {k: torch.arange(m if m is not None else n, dtype=torch.float32) for k in ("param", "exp_avg", "exp_avg_sq")
             if k not in drop}
        e["numel_unpadded"] = n
        return e

    good = {"buckets_coalesced": True, 0: {key: entry()}}
    files = {
        # another layout: a warning
        "sharding_type.pt": {"param_state_sharding_type": "fully_reshardable", "param_state": good},
        "legacy.pt": {"per_bucket_numel": [{key: [8]}], "per_bucket_numel_unpadded": [{key: [8]}],
                      0: {key: {k: [torch.zeros(8)] for k in ("param", "exp_avg", "exp_avg_sq")}}},
        "chained.pt": [good, good],
        # malformed: an error
        "no_exp_avg_sq.pt": {"buckets_coalesced": True, 0: {key: entry(drop=("exp_avg_sq",))}},
        "wrong_size.pt": {"buckets_coalesced": True, 0: {key: entry(8, 7)}},
        "no_numel_unpadded.pt": {"buckets_coalesced": True, 0: {key: {k: v for k, v in entry().items() if k != "numel_unpadded"}}},
        "no_buckets_coalesced.pt": {0: {key: entry()}},
        "dtype_key.pt": {"buckets_coalesced": True, 0: {torch.bfloat16: entry()}},
        "not_a_dict.pt": torch.zeros(3),
    }
    for name, obj in files.items():
        torch.save(obj, os.path.join(d, name))
    print("distrib_optim_malformed:", ", ".join(files))


# ---------------------------------------------------------------- ckpt/torchpt's edge cases

def edge_object():
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    lin = torch.nn.Linear(3, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
        lin.bias.copy_(torch.tensor([0.5, -0.5]))
    return {
        "f32": base,
        "transposed": base.t(),  # a strided view sharing the storage of f32
        "row": base[1],  # storage offset 4
        "bf16": torch.tensor([1.0, -2.5, 3.140625], dtype=torch.bfloat16),
        "f16": torch.tensor([0.5, 65504.0, -0.0009765625], dtype=torch.float16),
        "f64": torch.tensor([1.0 / 3.0], dtype=torch.float64),
        "i64": torch.arange(3),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "param": torch.nn.Parameter(torch.ones(2)),
        "linear": lin.state_dict(),  # an OrderedDict with _metadata
        "ns": argparse.Namespace(a=1, b="x", c=None, dt=torch.bfloat16, l=[1, 2], big=2 ** 70, neg=-5, f=1.5,
                                 t=(1, 2), backend=AttnBackend.flash),
        "bytes": b"\x00\xffabc",
        "bio": io.BytesIO(b"xyz"),
        "set": {1, 2},
        "frozen": frozenset([3]),
        "keys": {0: "zero", 1: "one", (1, 2): "pair", True: "true overrides 1"},
        "np": np.arange(4, dtype=np.int32),
        "unicode": "h\u00e9llo \u2713",
        "nested": [[{"deep": (1, [2, {"x": 3.0}])}]],
    }


def build_edge():
    os.makedirs(TORCHPT_OUT, exist_ok=True)
    obj = edge_object()
    torch.save(obj, os.path.join(TORCHPT_OUT, "edge.pt"))
    torch.save(obj, os.path.join(TORCHPT_OUT, "edge_legacy.pt"), _use_new_zipfile_serialization=False)
    print("edge.pt, edge_legacy.pt")


def main():
    for name, c in CASES.items():
        build(name, c)
    build_dist_malformed()
    build_edge()


if __name__ == "__main__":
    main()
