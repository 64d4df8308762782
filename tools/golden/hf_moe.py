#!/usr/bin/python3
"""Hugging Face MoE goldens for gotron's HF conversion (ckpt/hf): Mixtral and Qwen2-MoE.

Usage (repository root, Debian's python3-torch 1.13, CPU; no `transformers`):

    /usr/bin/python3 tools/golden/hf_moe.py [outdir]     # default ckpt/hf/testdata

Each case is a tiny model built from plain PyTorch modules that carry Hugging
Face's parameter names and reproduce the math of transformers'
modeling_mixtral.py and modeling_qwen2_moe.py (the attention, RoPE, RMSNorm
and SwiGLU MLP are Llama's, from tools/golden/hf.py):

  * MixtralForCausalLM: model.layers.N.block_sparse_moe.gate (router, no
    bias); routing_weights = softmax(router_logits); top-k; divided by their
    sum; experts.E.{w1,w2,w3}: w2(silu(w1 x) * w3 x); the token's output is
    the routing-weighted sum of its k experts'.
  * Qwen2MoeForCausalLM: q/k/v_proj with biases; mlp.gate (router);
    softmax, top-k, renormalised only with norm_topk_prob; experts.E.
    {gate,up,down}_proj; shared_expert (an MLP of
    shared_expert_intermediate_size) times sigmoid(shared_expert_gate(x));
    layer i is sparse iff i is not in mlp_only_layers and
    (i+1) % decoder_sparse_step == 0, else a dense MLP of intermediate_size.

Weights are seeded random values rounded to float32, saved as safetensors
next to config.json; the forward pass runs in float64 on them and the logits
of TOKENS go to golden.safetensors ("logits" F32 [T, vocab], "tokens" I32).
CI never runs Python.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf  # noqa: E402  (tools/golden/hf.py: Llama parts and the safetensors writer)

torch.set_default_dtype(torch.float64)

TOKENS = [3, 17, 42, 99, 5, 5, 64, 1, 77, 23]

CASES = {
    "mixtral_gqa_untied_f32": dict(arch="mixtral", vocab=100, hidden=32, layers=2, heads=4, kv_heads=2, inner=24,
                                   experts=4, topk=2, positions=32, eps=1e-5, theta=1e6, tied=False),
    # norm_topk_prob false (Qwen1.5-MoE's): the top-k of softmax over all experts, not renormalised;
    # layer 1 dense through mlp_only_layers
    "qwen2_moe_untied_f32": dict(arch="qwen2_moe", vocab=100, hidden=32, layers=3, heads=4, kv_heads=2, inner=40,
                                 moe_inner=16, shared=24, experts=6, topk=2, norm_topk_prob=False, sparse_step=1,
                                 mlp_only=[1], positions=32, eps=1e-6, theta=10000.0, tied=False),
    # norm_topk_prob true, decoder_sparse_step 2 (layer 0 dense), tied embeddings, top-3
    "qwen2_moe_step2_tied_f32": dict(arch="qwen2_moe", vocab=100, hidden=32, layers=2, heads=4, kv_heads=4, inner=36,
                                     moe_inner=12, shared=20, experts=5, topk=3, norm_topk_prob=True, sparse_step=2,
                                     mlp_only=[], positions=32, eps=1e-6, theta=1e6, tied=True),
}


class Attention(hf.LlamaAttention):
    """Llama's attention; Qwen2's q/k/v_proj carry biases."""

    def __init__(self, c, bias):
        super().__init__(c)
        h = c["hidden"]
        self.q_proj = torch.nn.Linear(h, self.nh * self.d, bias=bias)
        self.k_proj = torch.nn.Linear(h, self.nkv * self.d, bias=bias)
        self.v_proj = torch.nn.Linear(h, self.nkv * self.d, bias=bias)


class MLP(torch.nn.Module):  # Qwen2MoeMLP
    def __init__(self, h, f):
        super().__init__()
        self.gate_proj = torch.nn.Linear(h, f, bias=False)
        self.up_proj = torch.nn.Linear(h, f, bias=False)
        self.down_proj = torch.nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class MixtralExpert(torch.nn.Module):  # MixtralBlockSparseTop2MLP
    def __init__(self, h, f):
        super().__init__()
        self.w1 = torch.nn.Linear(h, f, bias=False)
        self.w2 = torch.nn.Linear(f, h, bias=False)
        self.w3 = torch.nn.Linear(h, f, bias=False)

    def forward(self, x):
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


def route(gate, x, k, normalize):
    """softmax over the experts, top-k, optionally renormalised: (T, k) weights and expert ids."""
    w = torch.softmax(gate(x), dim=-1)
    w, sel = torch.topk(w, k, dim=-1)
    if normalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w, sel


def combine(experts, x, w, sel):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(sel.shape[1]):
            out[t] += w[t, j] * experts[int(sel[t, j])](x[t:t + 1])[0]
    return out


class MixtralSparseMoeBlock(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.k = c["topk"]
        self.gate = torch.nn.Linear(c["hidden"], c["experts"], bias=False)
        self.experts = torch.nn.ModuleList([MixtralExpert(c["hidden"], c["inner"]) for _ in range(c["experts"])])

    def forward(self, x):
        B, T, h = x.shape
        x = x.reshape(-1, h)
        w, sel = route(self.gate, x, self.k, True)
        return combine(self.experts, x, w, sel).reshape(B, T, h)


class Qwen2MoeSparseMoeBlock(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden"]
        self.k, self.norm = c["topk"], c["norm_topk_prob"]
        self.gate = torch.nn.Linear(h, c["experts"], bias=False)
        self.experts = torch.nn.ModuleList([MLP(h, c["moe_inner"]) for _ in range(c["experts"])])
        self.shared_expert = MLP(h, c["shared"])
        self.shared_expert_gate = torch.nn.Linear(h, 1, bias=False)

    def forward(self, x):
        B, T, h = x.shape
        x = x.reshape(-1, h)
        w, sel = route(self.gate, x, self.k, self.norm)
        out = combine(self.experts, x, w, sel)
        out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.reshape(B, T, h)


def sparse(c, i):
    if c["arch"] == "mixtral":
        return True
    return i not in c["mlp_only"] and (i + 1) % c["sparse_step"] == 0


class DecoderLayer(torch.nn.Module):
    def __init__(self, c, i):
        super().__init__()
        self.input_layernorm = hf.LlamaRMSNorm(c["hidden"], c["eps"])
        self.self_attn = Attention(c, c["arch"] == "qwen2_moe")
        self.post_attention_layernorm = hf.LlamaRMSNorm(c["hidden"], c["eps"])
        if c["arch"] == "mixtral":
            self.block_sparse_moe = MixtralSparseMoeBlock(c)
            self.ffn = self.block_sparse_moe
        elif sparse(c, i):
            self.mlp = Qwen2MoeSparseMoeBlock(c)
            self.ffn = self.mlp
        else:
            self.mlp = MLP(c["hidden"], c["inner"])
            self.ffn = self.mlp

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.ffn(self.post_attention_layernorm(x))


class Model(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(c["vocab"], c["hidden"])
        self.layers = torch.nn.ModuleList([DecoderLayer(c, i) for i in range(c["layers"])])
        self.norm = hf.LlamaRMSNorm(c["hidden"], c["eps"])

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class ForCausalLM(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tied = c["tied"]
        self.model = Model(c)
        self.lm_head = torch.nn.Linear(c["hidden"], c["vocab"], bias=False)

    def forward(self, ids):
        w = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        return self.model(ids) @ w.T


def config(c):
    common = {
        "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "hidden_size": c["hidden"], "initializer_range": 0.02, "intermediate_size": c["inner"],
        "max_position_embeddings": c["positions"], "num_attention_heads": c["heads"],
        "num_hidden_layers": c["layers"], "num_key_value_heads": c["kv_heads"], "rms_norm_eps": c["eps"],
        "rope_theta": c["theta"], "tie_word_embeddings": c["tied"], "torch_dtype": "float32",
        "transformers_version": "4.46.0", "use_cache": True, "vocab_size": c["vocab"],
        "num_experts_per_tok": c["topk"], "output_router_logits": False, "router_aux_loss_coef": 0.001,
    }
    if c["arch"] == "mixtral":
        return dict(common, architectures=["MixtralForCausalLM"], model_type="mixtral",
                    num_local_experts=c["experts"], router_jitter_noise=0.0, sliding_window=None)
    return dict(common, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", num_experts=c["experts"],
                moe_intermediate_size=c["moe_inner"], shared_expert_intermediate_size=c["shared"],
                norm_topk_prob=c["norm_topk_prob"], decoder_sparse_step=c["sparse_step"], mlp_only_layers=c["mlp_only"],
                use_sliding_window=False, sliding_window=c["positions"], max_window_layers=c["layers"])


def build(name, c, out):
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    model = ForCausalLM(c)
    state = {}
    for pname, p in model.named_parameters():
        if (c["tied"] and pname == "lm_head.weight") or ".ffn." in pname:
            continue
        if pname.endswith("norm.weight"):
            v = 1 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
        elif pname.endswith(".gate.weight"):
            v = torch.randn(p.shape, generator=gen, dtype=torch.float32)  # routers: well-separated logits
        else:
            v = 0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
        with torch.no_grad():
            p.copy_(v.double())
        state[pname] = v
    if c["tied"]:
        with torch.no_grad():
            model.lm_head.weight.copy_(model.model.embed_tokens.weight)

    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config(c), f, indent=2, sort_keys=True)
    hf.write_safetensors(os.path.join(d, "model.safetensors"), state, {n: "F32" for n in state}, {"format": "pt"})
    with torch.no_grad():
        ids = torch.tensor([TOKENS])
        logits = model(ids)[0]
    hf.write_safetensors(os.path.join(d, "golden.safetensors"),
                         {"logits": logits.float(), "tokens": torch.tensor(TOKENS, dtype=torch.int32)},
                         {"logits": "F32", "tokens": "I32"})
    print(f"{name}: {sum(v.numel() for v in state.values())} params, logits {tuple(logits.shape)}")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "ckpt/hf/testdata"
    for name, c in CASES.items():
        build(name, c, out)


if __name__ == "__main__":
    main()
