#!/usr/bin/python3
"""PyTorch goldens for gotron's DeepSeek sparse attention (model/gpt/dsa.go).

Usage (repository root, Debian's python3-torch 1.13, CPU):

    /usr/bin/python3 tools/golden/dsa.py [outdir] [megatron-git-dir]
    # defaults: model/gpt/testdata, /work/.mirror/NVIDIA+Megatron-LM/repo

A tiny MLA GPT model with Megatron's --experimental-attention-variant dsa.
The DSA parts run Megatron's own code, loaded out of tree from the git
mirror (megatron/core/transformer/experimental_attention_variant/dsa.py,
dsa_masking.py, dsa_indexer_loss.py, dsa_layout.py) with the few megatron
imports they need stubbed: _compute_index_scores and fused_qk_topk_naive
(the indexer's scores and top-k), FusedDSAIndexerLoss (the KL loss with
Megatron's hand-written backward), _unfused_absorbed_dsa_fn (the sparse
attention of the absorbed MLA layout that Megatron's DSA spec,
AbsorbedMLASelfAttention, runs), build_dsattention_forward_mask and
DSAIndexerLossAutoScaler. The rest follows Megatron's code in plain
PyTorch: AbsorbedMLASelfAttention's query/key absorption, DSAIndexer's
forward_before_topk (linear_wq_b, linear_wk, a LayerNorm k_norm, the rope
channels first rotated by halves with YaRN's mscale, the Hadamard
rotate_activation as a Sylvester matrix, the weights' H^-1/2·D^-1/2 scale)
and DSAttention.forward's detach points, plus mla.py's MLP and loss. One
micro-batch with the indexer loss's backward scale 1. Records the logits,
the lm loss, every layer's indexer loss and top-k indices and every
parameter's gradient.
"""
import enum
import json
import math
import os
import subprocess
import sys
import types

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import loss_fn, write_safetensors  # noqa: E402
from mla import norm, yarn_emb, yarn_get_mscale  # noqa: E402

torch.set_default_dtype(torch.float64)

EAV = "megatron/core/transformer/experimental_attention_variant/"

CONFIGS = {
    "dsa_dense_loss": dict(layers=2, hidden=32, heads=4, ffn=64, vocab=64, seq=10, batch=2,
                           norm="RMSNorm", act="swiglu", eps=1e-5,
                           q_lora_rank=12, kv_lora_rank=10, qk_head_dim=6, qk_pos_emb_head_dim=4, v_head_dim=5,
                           rotary_base=10000.0, rotary_scaling_factor=4.0, original_max_position_embeddings=64,
                           beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=0.5,
                           index_heads=4, index_head_dim=8, topk=4, loss_coeff=0.7, sparse_loss=False,
                           relu=True, rotate=True, k_norm_eps=1e-6),
    "dsa_sparse_loss": dict(layers=2, hidden=32, heads=4, ffn=48, vocab=64, seq=10, batch=2,
                            norm="LayerNorm", act="gelu_tanh", eps=1e-5,
                            q_lora_rank=None, kv_lora_rank=12, qk_head_dim=2, qk_pos_emb_head_dim=4, v_head_dim=8,
                            rotary_base=10000.0, rotary_scaling_factor=1.0, original_max_position_embeddings=4096,
                            beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=0.0,
                            index_heads=3, index_head_dim=4, topk=5, loss_coeff=0.5, sparse_loss=True,
                            relu=False, rotate=False, k_norm_eps=None),
}


def load_megatron_dsa(git_dir):
    """Megatron's dsa.py and helpers as modules, their megatron imports stubbed."""
    def src(path):
        return subprocess.run(["git", "-C", git_dir, "show", "HEAD:" + path], check=True,
                              capture_output=True, text=True).stdout

    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    class AttnMaskType(enum.Enum):
        padding = 1
        causal = 2
        no_mask = 3

    class Stub:
        def __init__(self, *a, **k):
            pass

    for name in ["megatron", "megatron.core", "megatron.core.models", "megatron.core.models.common",
                 "megatron.core.tensor_parallel", "megatron.core.transformer"]:
        mod(name, __path__=[])
    mod("megatron.core.parallel_state")
    mod("megatron.core.packed_seq_params", PackedSeqParams=Stub)
    mod("megatron.core.utils", get_pg_size=lambda g: 1 if g is None else g.size())
    mod("megatron.core.models.common.embeddings", RotaryEmbedding=Stub, YarnRotaryEmbedding=Stub,
        apply_rotary_pos_emb=None)
    mod("megatron.core.process_groups_config", ProcessGroupCollection=Stub)
    mod("megatron.core.tensor_parallel.mappings", gather_from_sequence_parallel_region=None)
    mod("megatron.core.transformer.enums", AttnMaskType=AttnMaskType)
    mod("megatron.core.transformer.module", MegatronModule=torch.nn.Module)
    mod("megatron.core.transformer.spec_utils", ModuleSpec=Stub, build_module=None)
    mod("megatron.core.transformer.transformer_config", TransformerConfig=Stub)
    pkg = mod("megatron.core.transformer.experimental_attention_variant", __path__=[])
    pkg.dsa_kernels = mod(pkg.__name__ + ".dsa_kernels", use_fused_dsa_kernels=lambda config: False)
    out = {}
    for name in ["dsa_layout", "dsa_masking", "dsa_indexer_loss", "dsa"]:
        m = mod(pkg.__name__ + "." + name)
        exec(compile(src(EAV + name + ".py"), EAV + name + ".py", "exec"), m.__dict__)
        setattr(pkg, name, m)
        out[name] = m
    commit = subprocess.run(["git", "-C", git_dir, "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    return out, AttnMaskType, commit


def params_for(c, gen):
    h, a = c["hidden"], c["heads"]
    qd = c["qk_head_dim"] + c["qk_pos_emb_head_dim"]
    fc1 = c["ffn"] * (2 if c["act"] == "swiglu" else 1)
    P = {}

    def normal(name, *shape, std=0.2):
        P[name] = (torch.randn(*shape, generator=gen, dtype=torch.float32) * std).double()

    def near_one(name, n):
        P[name] = (1 + 0.1 * torch.randn(n, generator=gen, dtype=torch.float32)).double()

    def norm_params(name, n, layer_norm=None):
        near_one(name + ".weight", n)
        if layer_norm or (layer_norm is None and c["norm"] == "LayerNorm"):
            normal(name + ".bias", n, std=0.1)

    normal("embedding.word_embeddings.weight", c["vocab"], h)
    for i in range(c["layers"]):
        p = f"decoder.layers.{i}."
        s = p + "self_attention."
        ix = s + "core_attention.indexer."
        norm_params(p + "input_layernorm", h)
        if c["q_lora_rank"] is None:
            normal(s + "linear_q_proj.weight", a * qd, h)
        else:
            normal(s + "linear_q_down_proj.weight", c["q_lora_rank"], h)
            normal(s + "linear_q_up_proj.weight", a * qd, c["q_lora_rank"])
            norm_params(s + "q_layernorm", c["q_lora_rank"])
        normal(s + "linear_kv_down_proj.weight", c["kv_lora_rank"] + c["qk_pos_emb_head_dim"], h)
        normal(s + "linear_kv_up_proj.weight", a * (c["qk_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"])
        norm_params(s + "kv_layernorm", c["kv_lora_rank"])
        normal(ix + "linear_wq_b.weight", c["index_heads"] * c["index_head_dim"], c["q_lora_rank"] or h, std=0.5)
        normal(ix + "linear_wk.weight", c["index_head_dim"], h, std=0.5)
        norm_params(ix + "k_norm", c["index_head_dim"], layer_norm=True)
        normal(ix + "linear_weights_proj.weight", c["index_heads"], h, std=0.5)
        normal(s + "linear_proj.weight", h, a * c["v_head_dim"])
        norm_params(p + "pre_mlp_layernorm", h)
        normal(p + "mlp.linear_fc1.weight", fc1, h)
        normal(p + "mlp.linear_fc2.weight", h, c["ffn"])
    norm_params("decoder.final_layernorm", h)
    normal("output_layer.weight", c["vocab"], h)
    return P


def rope_half(t, emb, mscale):
    # _apply_rotary_pos_emb_bshd without interleaving (rotate_half), t (B, T, n, dim)
    cos = (torch.cos(emb) * mscale).double()[None, :, None, :]
    sin = (torch.sin(emb) * mscale).double()[None, :, None, :]
    h1, h2 = torch.chunk(t, 2, dim=-1)
    return t * cos + torch.cat((-h2, h1), dim=-1) * sin


def rope_mla(t, emb, mscale):
    # mla_rotary_interleaved: de-interleave, then rotate halves
    return rope_half(torch.cat((t[..., 0::2], t[..., 1::2]), dim=-1), emb, mscale)


def hadamard(x):
    # fast_hadamard_transform.hadamard_transform(x, scale=d^-0.5)
    d = x.shape[-1]
    H = torch.ones(1, 1)
    while H.shape[0] < d:
        H = torch.cat((torch.cat((H, H), 1), torch.cat((H, -H), 1)), 0)
    return x @ H * d ** -0.5


class TP1:
    class tp:
        @staticmethod
        def size():
            return 1


def dsa_attention(c, P, s, x, meg, AttnMaskType, record):
    """AbsorbedMLASelfAttention + DSAttention.forward (no TP, no CP), x (B, T, h)."""
    dsa, masking = meg["dsa"], meg["dsa_masking"]
    B, T, _ = x.shape
    n, nope, pe, vd, kvr = c["heads"], c["qk_head_dim"], c["qk_pos_emb_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    qd = nope + pe
    get = lambda k: P.get(k)
    emb, conc = yarn_emb(c, T)
    # get_query_key_value_tensors (absorbed)
    if c["q_lora_rank"] is None:
        q_compressed = x
        q = F.linear(x, P[s + "linear_q_proj.weight"])
    else:
        q_compressed = norm(c, F.linear(x, P[s + "linear_q_down_proj.weight"]),
                            P[s + "q_layernorm.weight"], get(s + "q_layernorm.bias"))
        q = F.linear(q_compressed, P[s + "linear_q_up_proj.weight"])
    kv_combined = F.linear(x, P[s + "linear_kv_down_proj.weight"])
    kv_compressed, k_pos_emb = torch.split(kv_combined, [kvr, pe], dim=-1)
    kv_compressed = norm(c, kv_compressed, P[s + "kv_layernorm.weight"], get(s + "kv_layernorm.bias"))
    q = q.view(B, T, n, qd)
    kv_up = P[s + "linear_kv_up_proj.weight"].view(n, nope + vd, kvr)
    k_up, v_up = kv_up[:, :nope, :], kv_up[:, nope:, :]
    q_no_pe, q_pos_emb = torch.split(q, [nope, pe], dim=-1)
    q_absorbed = torch.einsum("...nd,ndk->...nk", q_no_pe, k_up)
    q_pos_emb = rope_mla(q_pos_emb, emb, conc)
    k_pos_emb = rope_mla(k_pos_emb.unsqueeze(-2), emb, conc)
    query = torch.cat([q_absorbed, q_pos_emb], dim=-1)  # (B, T, n, kvr+pe)
    key = torch.cat([kv_compressed.unsqueeze(-2), k_pos_emb], dim=-1)  # (B, T, 1, kvr+pe)
    m = yarn_get_mscale(c["rotary_scaling_factor"], c["mscale_all_dim"])
    softmax_scale = m * m / math.sqrt(qd)
    # Megatron's tensors are [s, b, ...]
    query, key = query.transpose(0, 1), key.transpose(0, 1)
    xs, qr = x.transpose(0, 1).detach(), q_compressed.transpose(0, 1).detach()

    # DSAIndexer.forward_before_topk
    ix = s + "core_attention.indexer."
    H, D = c["index_heads"], c["index_head_dim"]

    def irope(t):
        t_pe, t_nope = torch.split(t, [pe, D - pe], dim=-1)
        t_pe = rope_half(t_pe.transpose(0, 1), emb, conc).transpose(0, 1)
        return torch.cat([t_pe, t_nope], dim=-1)

    qi = irope(F.linear(qr, P[ix + "linear_wq_b.weight"]).reshape(T, B, H, D))
    ki = F.layer_norm(F.linear(xs, P[ix + "linear_wk.weight"]), (D,), P[ix + "k_norm.weight"],
                      P[ix + "k_norm.bias"], c["k_norm_eps"] or c["eps"])
    ki = irope(ki.reshape(T, B, 1, D)).reshape(T, B, D)
    if c["rotate"]:
        qi, ki = hadamard(qi), hadamard(ki)
    weights = F.linear(xs, P[ix + "linear_weights_proj.weight"]) * H ** -0.5 * D ** -0.5

    # DSAttention.forward
    _, varlen, _ = masking.build_dsattention_forward_mask(
        sq=T, skv=T, b=B, device=x.device, cp_size=1, cp_rank=0, cp_comm_type="p2p", cp_group=None,
        attn_mask_type=AttnMaskType.causal, attention_mask=None, position_ids=None, packed_seq_params=None)
    starts, ends, key_positions = varlen
    key_for_loss = key.detach().expand(-1, -1, n, -1)
    # the indexer's tensors in float32, as an fp32 run's (Megatron's naive
    # backward mixes their dtype with float32 scores)
    qi, weights, ki = qi.float(), weights.float(), ki.float()
    topk_indices, indexer_loss = dsa.FusedDSAIndexerLoss.apply(
        qi, weights, ki, query.detach(), key_for_loss, softmax_scale, c["topk"], c["loss_coeff"], None,
        c["sparse_loss"], TP1, starts, ends, key_positions, None, False, c["relu"])
    # check the selection is unambiguous: no tie at any row's k-th place
    with torch.no_grad():
        sc = dsa._compute_index_scores(qi, weights, ki, use_relu=c["relu"])
        st, en, kp = masking.normalize_varlen_bounds(mask=None, varlen_starts=starts, varlen_ends=ends,
                                                     key_positions=key_positions, sk=T, device=x.device)
        sc = masking.apply_starts_ends_mask_to_scores(sc, st, en, kp)
        srt = sc.sort(dim=-1, descending=True).values
        K = min(c["topk"], T)
        for b in range(B):
            for i in range(K, T):  # rows with more causal keys than K
                gap = (srt[b, i, K - 1] - srt[b, i, K]).item()
                assert gap > 1e-3 * max(1.0, abs(srt[b, i, K - 1].item())), (s, b, i, gap)
    out = dsa._unfused_absorbed_dsa_fn(query, key, topk_indices, softmax_scale, kvr,
                                       varlen_starts=starts, varlen_ends=ends, key_positions=key_positions)
    out = torch.einsum("sbhc,hdc->sbhd", out, v_up).contiguous().view(T, B, n * vd)
    out = dsa.DSAIndexerLossAutoScaler.apply(out, indexer_loss)
    record.append((indexer_loss.detach().clone(), topk_indices.clone()))
    return F.linear(out.transpose(0, 1), P[s + "linear_proj.weight"])


def forward(c, P, tokens, meg, AttnMaskType, record):
    x = P["embedding.word_embeddings.weight"][tokens]
    get = lambda k: P.get(k)
    for i in range(c["layers"]):
        p = f"decoder.layers.{i}."
        y = norm(c, x, P[p + "input_layernorm.weight"], get(p + "input_layernorm.bias"))
        x = x + dsa_attention(c, P, p + "self_attention.", y, meg, AttnMaskType, record)
        y = norm(c, x, P[p + "pre_mlp_layernorm.weight"], get(p + "pre_mlp_layernorm.bias"))
        y = F.linear(y, P[p + "mlp.linear_fc1.weight"])
        if c["act"] == "swiglu":
            gate, up = y.chunk(2, -1)
            y = F.silu(gate) * up
        else:
            y = F.gelu(y, approximate="tanh")
        x = x + F.linear(y, P[p + "mlp.linear_fc2.weight"])
    x = norm(c, x, P["decoder.final_layernorm.weight"], get("decoder.final_layernorm.bias"))
    return x @ P["output_layer.weight"].t()


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "model/gpt/testdata"
    git_dir = sys.argv[2] if len(sys.argv) > 2 else "/work/.mirror/NVIDIA+Megatron-LM/repo"
    meg, AttnMaskType, commit = load_megatron_dsa(git_dir)
    meg["dsa"].DSAIndexerLossAutoScaler.set_loss_scale(torch.tensor(1.0))
    for name, c in CONFIGS.items():
        gen = torch.Generator().manual_seed(2468)
        P = params_for(c, gen)
        B, T = c["batch"], c["seq"]
        tokens = torch.randint(0, c["vocab"], (B, T), generator=gen)
        labels = torch.randint(0, c["vocab"], (B, T), generator=gen)
        mask = torch.ones(B, T)
        mask[1, 2] = 0
        out = {"tokens": tokens, "labels": labels, "loss_mask": mask}
        for k, v in P.items():
            out["init/" + k] = v
        params = {k: v.clone().requires_grad_(True) for k, v in P.items()}
        record = []
        logits = forward(c, params, tokens, meg, AttnMaskType, record)
        loss = loss_fn(logits, labels, mask)
        loss.backward()
        out["logits"] = logits
        out["loss"] = loss.reshape(1)
        for i, (il, topk) in enumerate(record):
            out[f"indexer_loss/{i}"] = il.reshape(1)
            out[f"topk/{i}"] = topk.to(torch.int32)
        for k, v in params.items():
            out["grad/" + k] = v.grad.clone()
        write_safetensors(os.path.join(outdir, name + ".safetensors"), out)
        with open(os.path.join(outdir, name + ".json"), "w") as f:
            json.dump({"config": c, "megatron_commit": commit}, f, indent=1, sort_keys=True)
            f.write("\n")
        print(name, "loss", loss.item(), "indexer losses", [r[0].item() for r in record])


if __name__ == "__main__":
    main()
