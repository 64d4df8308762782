#!/usr/bin/python3
"""Hugging Face Qwen3-Next golden for gotron's HF conversion (ckpt/hf).

Usage (repository root, Debian's python3-torch 1.13, CPU; no `transformers`):

    /usr/bin/python3 tools/golden/hf_qwen3next.py [outdir]     # default ckpt/hf/testdata

A tiny model of plain PyTorch modules that carry Hugging Face's parameter
names and compute what transformers' modeling_qwen3_next.py computes on its
torch fallback path (no fla / causal_conv1d kernels), written after reading
it; the weight draws and writers are tools/golden/hf.py's:

  * Qwen3NextRMSNorm (input, post-attention, final, q_norm, k_norm):
    x * rsqrt(mean(x^2) + eps) * (1 + weight), the weight zero-centred.
  * Full-attention layers (layer_types "full_attention"): q_proj gives per
    head [query (head_dim); gate (head_dim)]; q_norm and k_norm per head;
    RoPE (rotate-half) on the first head_dim * partial_rotary_factor
    channels; causal softmax attention with GQA (repeat_kv), 1/sqrt(head_dim);
    output * sigmoid(gate) before o_proj.
  * Linear-attention layers (Qwen3NextGatedDeltaNet): in_proj_qkvz rows per
    key head j [q_j (dk); k_j (dk); v of j's r = nv/nk value heads (r*dv);
    z of them (r*dv)], in_proj_ba rows per key head j [b (r); a (r)];
    conv1d (depthwise, kernel K, no bias, causal: left padding K-1) then SiLU
    over the channels [all q; all k; all v]; q, k l2-normalised (eps 1e-6),
    repeat_interleave'd to the nv value heads; g = -exp(A_log) *
    softplus(a + dt_bias), beta = sigmoid(b); the gated delta rule
    S = S*exp(g) + k (beta (v - S^T k))^T, o = S^T q / sqrt(dk) (the
    recurrence, which torch_chunk_gated_delta_rule computes in chunks);
    Qwen3NextRMSNormGated over dv: x * rsqrt(mean(x^2) + eps) * weight
    * silu(z) (weight NOT zero-centred); out_proj.
  * MoE layers (not in mlp_only_layers, (i+1) % decoder_sparse_step == 0):
    softmax router (gate), top-k, renormalised with norm_topk_prob; experts
    (hub layout mlp.experts.E.{gate,up,down}_proj); shared_expert scaled by
    sigmoid(shared_expert_gate(x)). Other layers: a SwiGLU MLP.

The forward runs in float64 on float32-rounded weights; golden.safetensors
holds the float32 logits of hf.TOKENS and "greedy": hf.TOKENS[:4] followed by
8 greedy (argmax) tokens, each from a full forward over the sequence so far.
CI never runs Python.
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf  # noqa: E402  (tools/golden/hf.py)
import hf_moe  # noqa: E402  (tools/golden/hf_moe.py)

GREEDY_PROMPT, GREEDY_NEW = 4, 8  # golden.safetensors "greedy": the prompt then the greedy tokens

CASES = {
    # four layers: linear, full, linear, full attention; layer 1 dense (mlp_only_layers), the others MoE with a
    # gated shared expert; GQA, partial RoPE (a quarter of head_dim), two value heads per key head, untied
    "qwen3_next_untied_f32": dict(arch="qwen3_next", vocab=100, hidden=32, layers=4, heads=4, kv_heads=2, head_dim=16,
                                  partial=0.25, inner=40, moe_inner=12, shared=20, experts=6, topk=2,
                                  norm_topk_prob=True, sparse_step=1, mlp_only=[1], positions=64, eps=1e-6,
                                  theta=10000.0, tied=False, nk=2, nv=4, dk=8, dv=6, conv=4,
                                  layer_types=["linear_attention", "full_attention", "linear_attention",
                                               "full_attention"]),
}


class RMSNorm1P(torch.nn.Module):  # Qwen3NextRMSNorm
    def __init__(self, n, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight)


class GatedRMSNorm(torch.nn.Module):  # Qwen3NextRMSNormGated
    def __init__(self, n, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x, z):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)) * F.silu(z)


class Attention(torch.nn.Module):  # Qwen3NextAttention
    def __init__(self, c):
        super().__init__()
        h, self.nh, self.nkv, self.d = c["hidden"], c["heads"], c["kv_heads"], c["head_dim"]
        self.rd, self.theta = int(self.d * c["partial"]), c["theta"]
        self.q_proj = torch.nn.Linear(h, self.nh * self.d * 2, bias=False)
        self.k_proj = torch.nn.Linear(h, self.nkv * self.d, bias=False)
        self.v_proj = torch.nn.Linear(h, self.nkv * self.d, bias=False)
        self.o_proj = torch.nn.Linear(self.nh * self.d, h, bias=False)
        self.q_norm = RMSNorm1P(self.d, c["eps"])
        self.k_norm = RMSNorm1P(self.d, c["eps"])

    def rope(self, x, cos, sin):
        r, rest = x[..., :self.rd], x[..., self.rd:]
        return torch.cat((r * cos + hf.rotate_half(r) * sin, rest), dim=-1)

    def forward(self, x):
        B, T, _ = x.shape
        q, gate = torch.chunk(self.q_proj(x).view(B, T, self.nh, 2 * self.d), 2, dim=-1)
        gate = gate.reshape(B, T, self.nh * self.d)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        cos, sin = hf.rope_cos_sin(self.rd, T, self.theta)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        k, v = hf.repeat_kv(k, self.nh // self.nkv), hf.repeat_kv(v, self.nh // self.nkv)
        w = q @ k.transpose(2, 3) / self.d ** 0.5
        w = w + torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        o = (torch.softmax(w, dim=-1) @ v).transpose(1, 2).reshape(B, T, self.nh * self.d)
        return self.o_proj(o * torch.sigmoid(gate))


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class GatedDeltaNet(torch.nn.Module):  # Qwen3NextGatedDeltaNet
    def __init__(self, c):
        super().__init__()
        h = c["hidden"]
        self.nk, self.nv, self.dk, self.dv, self.K = c["nk"], c["nv"], c["dk"], c["dv"], c["conv"]
        self.key_dim, self.value_dim = self.nk * self.dk, self.nv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv1d = torch.nn.Conv1d(self.conv_dim, self.conv_dim, self.K, bias=False, groups=self.conv_dim,
                                      padding=self.K - 1)
        self.in_proj_qkvz = torch.nn.Linear(h, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = torch.nn.Linear(h, 2 * self.nv, bias=False)
        self.dt_bias = torch.nn.Parameter(torch.ones(self.nv))
        self.A_log = torch.nn.Parameter(torch.zeros(self.nv))
        self.norm = GatedRMSNorm(self.dv, c["eps"])
        self.out_proj = torch.nn.Linear(self.value_dim, h, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        r = self.nv // self.nk
        qkvz = self.in_proj_qkvz(x).view(B, T, self.nk, 2 * self.dk + 2 * r * self.dv)
        ba = self.in_proj_ba(x).view(B, T, self.nk, 2 * r)
        q, k, v, z = torch.split(qkvz, [self.dk, self.dk, r * self.dv, r * self.dv], dim=3)
        b, a = torch.split(ba, [r, r], dim=3)
        z = z.reshape(B, T, self.nv, self.dv)
        b, a = b.reshape(B, T, self.nv), a.reshape(B, T, self.nv)
        mixed = torch.cat([t.reshape(B, T, -1) for t in (q, k, v)], dim=-1).transpose(1, 2)
        mixed = F.silu(self.conv1d(mixed)[:, :, :T]).transpose(1, 2)
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = l2norm(q.reshape(B, T, self.nk, self.dk)).repeat_interleave(r, dim=2)
        k = l2norm(k.reshape(B, T, self.nk, self.dk)).repeat_interleave(r, dim=2)
        v = v.reshape(B, T, self.nv, self.dv)
        beta = torch.sigmoid(b)
        g = -self.A_log.exp() * F.softplus(a + self.dt_bias)
        q = q / self.dk ** 0.5
        S = torch.zeros(B, self.nv, self.dk, self.dv)
        out = torch.zeros(B, T, self.nv, self.dv)
        for t in range(T):
            S = S * g[:, t].exp()[..., None, None]
            kt, qt = k[:, t], q[:, t]  # (B, nv, dk)
            mem = (S * kt[..., None]).sum(-2)  # S^T k: (B, nv, dv)
            delta = (v[:, t] - mem) * beta[:, t][..., None]
            S = S + kt[..., None] * delta[..., None, :]
            out[:, t] = (S * qt[..., None]).sum(-2)
        o = self.norm(out, z).reshape(B, T, self.value_dim)
        return self.out_proj(o)


class SparseMoeBlock(torch.nn.Module):  # Qwen3NextSparseMoeBlock
    def __init__(self, c):
        super().__init__()
        h = c["hidden"]
        self.k, self.norm = c["topk"], c["norm_topk_prob"]
        self.gate = torch.nn.Linear(h, c["experts"], bias=False)
        self.experts = torch.nn.ModuleList([hf.LlamaMLP(h, c["moe_inner"]) for _ in range(c["experts"])])
        self.shared_expert = hf.LlamaMLP(h, c["shared"])
        self.shared_expert_gate = torch.nn.Linear(h, 1, bias=False)

    def forward(self, x):
        B, T, h = x.shape
        x = x.reshape(-1, h)
        w, sel = hf_moe.route(self.gate, x, self.k, self.norm)
        out = hf_moe.combine(self.experts, x, w, sel)
        out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.reshape(B, T, h)


class DecoderLayer(torch.nn.Module):  # Qwen3NextDecoderLayer
    def __init__(self, c, i):
        super().__init__()
        self.linear = c["layer_types"][i] == "linear_attention"
        if self.linear:
            self.linear_attn = GatedDeltaNet(c)
        else:
            self.self_attn = Attention(c)
        if i not in c["mlp_only"] and (i + 1) % c["sparse_step"] == 0:
            self.mlp = SparseMoeBlock(c)
        else:
            self.mlp = hf.LlamaMLP(c["hidden"], c["inner"])
        self.input_layernorm = RMSNorm1P(c["hidden"], c["eps"])
        self.post_attention_layernorm = RMSNorm1P(c["hidden"], c["eps"])

    def forward(self, x):
        mix = self.linear_attn if self.linear else self.self_attn
        x = x + mix(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(hf.LlamaForCausalLM):
    def __init__(self, c):
        super().__init__(c, DecoderLayer)
        self.model.norm = RMSNorm1P(c["hidden"], c["eps"])


def config(c):
    return {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "decoder_sparse_step": c["sparse_step"],
        "full_attention_interval": 2, "head_dim": c["head_dim"], "hidden_act": "silu", "hidden_size": c["hidden"],
        "initializer_range": 0.02, "intermediate_size": c["inner"], "layer_types": c["layer_types"],
        "linear_conv_kernel_dim": c["conv"], "linear_key_head_dim": c["dk"], "linear_num_key_heads": c["nk"],
        "linear_num_value_heads": c["nv"], "linear_value_head_dim": c["dv"],
        "max_position_embeddings": c["positions"], "mlp_only_layers": c["mlp_only"],
        "moe_intermediate_size": c["moe_inner"], "norm_topk_prob": c["norm_topk_prob"],
        "num_attention_heads": c["heads"], "num_experts": c["experts"], "num_experts_per_tok": c["topk"],
        "num_hidden_layers": c["layers"], "num_key_value_heads": c["kv_heads"], "output_router_logits": False,
        "partial_rotary_factor": c["partial"], "rms_norm_eps": c["eps"], "rope_scaling": None,
        "rope_theta": c["theta"], "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": c["shared"],
        "tie_word_embeddings": c["tied"], "torch_dtype": "float32", "transformers_version": "4.57.0",
        "use_cache": True, "vocab_size": c["vocab"],
    }


def build(name, c, out):
    model = Model(c)

    def special(pname, gen):
        p = model.get_parameter(pname)
        if pname.endswith(".gate.weight"):  # routers: well-separated logits
            return torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if pname.endswith("A_log"):  # transformers' init: log(uniform(0, 16)); kept away from 0
            return torch.log(1 + 15 * torch.rand(p.shape, generator=gen, dtype=torch.float32))
        if pname.endswith("dt_bias"):
            return 1 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if pname.endswith("linear_attn.norm.weight"):  # the gated norm's plain weight, near 1
            return 1 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if pname.endswith("norm.weight"):  # zero-centred: the scale is 1 + weight
            return 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
        return None

    hf.write_case(name, c, out, model, hf.init_weights(name, model, c, special), config(c))
    # greedy decoding from the first GREEDY_PROMPT tokens, each step a full forward over the sequence so far
    ids = list(hf.TOKENS[:GREEDY_PROMPT])
    gaps = []
    with torch.no_grad():
        for _ in range(GREEDY_NEW):
            last = model(torch.tensor([ids]))[0, -1]
            top = torch.topk(last, 2).values
            gaps.append(float(top[0] - top[1]))
            ids.append(int(last.argmax()))
        logits = model(torch.tensor([hf.TOKENS]))[0]
    d = os.path.join(out, name)
    hf.write_safetensors(os.path.join(d, "golden.safetensors"),
                         {"logits": logits.float(), "tokens": torch.tensor(hf.TOKENS, dtype=torch.int32),
                          "greedy": torch.tensor(ids, dtype=torch.int32)},
                         {"logits": "F32", "tokens": "I32", "greedy": "I32"})
    print(f"{name}: greedy {ids}, smallest top-2 logit gap {min(gaps):.3g}")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "ckpt/hf/testdata"
    for name, c in CASES.items():
        build(name, c, out)


if __name__ == "__main__":
    main()
