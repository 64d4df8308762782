#!/usr/bin/python3
"""Hugging Face MoE goldens for gotron's HF conversion (ckpt/hf): Mixtral, Qwen2-MoE and Qwen3-MoE.

Usage (repository root, Debian's python3-torch 1.13, CPU; no `transformers`):

    /usr/bin/python3 tools/golden/hf_moe.py [outdir]     # default ckpt/hf/testdata

Each case is a tiny model built from plain PyTorch modules that carry Hugging
Face's parameter names and reproduce the math of transformers'
modeling_mixtral.py, modeling_qwen2_moe.py and modeling_qwen3_moe.py (the
attention, RoPE, RMSNorm, SwiGLU MLP, decoder layer, weight draws and file
writers are Llama's, from tools/golden/hf.py):

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
  * Qwen3MoeForCausalLM: Qwen2-MoE's routing and layer pattern without the
    shared expert and without attention biases; q_norm and k_norm, RMSNorms
    of head_dim (rms_norm_eps) over each query and key head before RoPE;
    head_dim may differ from hidden_size/num_attention_heads.

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
import hf  # noqa: E402  (tools/golden/hf.py: Llama parts, weights, the safetensors writer, TOKENS)

torch.set_default_dtype(torch.float64)

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
    # Qwen3-30B-A3B's shape in small: head_dim 16 != hidden/heads (8), norm_topk_prob true, layer 1 dense
    "qwen3_moe_untied_f32": dict(arch="qwen3_moe", vocab=100, hidden=32, layers=3, heads=4, kv_heads=2, head_dim=16,
                                 inner=40, moe_inner=16, experts=6, topk=2, norm_topk_prob=True, sparse_step=1,
                                 mlp_only=[1], positions=32, eps=1e-6, theta=1e6, tied=False),
    # norm_topk_prob false, decoder_sparse_step 2 (layer 0 dense), tied, top-3, no head_dim key (hidden/heads),
    # transformers 5's config keys: rope_parameters instead of rope_theta, dtype instead of torch_dtype
    "qwen3_moe_step2_tied_f32": dict(arch="qwen3_moe", vocab=100, hidden=32, layers=2, heads=4, kv_heads=4,
                                     inner=36, moe_inner=12, experts=5, topk=3, norm_topk_prob=False, sparse_step=2,
                                     mlp_only=[], positions=32, eps=1e-6, theta=500000.0, tied=True, v5=True),
}


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


class MixtralExpert(torch.nn.Module):  # MixtralBlockSparseTop2MLP
    def __init__(self, h, f):
        super().__init__()
        self.w1 = torch.nn.Linear(h, f, bias=False)
        self.w2 = torch.nn.Linear(f, h, bias=False)
        self.w3 = torch.nn.Linear(h, f, bias=False)

    def forward(self, x):
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class SparseMoeBlock(torch.nn.Module):
    """MixtralSparseMoeBlock (experts of MixtralExpert, always renormalised), Qwen2MoeSparseMoeBlock (with the
    gated shared expert) and Qwen3MoeSparseMoeBlock (without)."""

    def __init__(self, c):
        super().__init__()
        h, mixtral = c["hidden"], c["arch"] == "mixtral"
        self.k, self.norm = c["topk"], mixtral or c["norm_topk_prob"]
        self.gate = torch.nn.Linear(h, c["experts"], bias=False)
        self.experts = torch.nn.ModuleList([MixtralExpert(h, c["inner"]) if mixtral else hf.LlamaMLP(h, c["moe_inner"])
                                            for _ in range(c["experts"])])
        self.shared = c["arch"] == "qwen2_moe"
        if self.shared:
            self.shared_expert = hf.LlamaMLP(h, c["shared"])
            self.shared_expert_gate = torch.nn.Linear(h, 1, bias=False)

    def forward(self, x):
        B, T, h = x.shape
        x = x.reshape(-1, h)
        w, sel = route(self.gate, x, self.k, self.norm)
        out = combine(self.experts, x, w, sel)
        if self.shared:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out.reshape(B, T, h)


def sparse(c, i):
    if c["arch"] == "mixtral":
        return True
    return i not in c["mlp_only"] and (i + 1) % c["sparse_step"] == 0


class DecoderLayer(hf.LlamaDecoderLayer):
    """Llama's layer with Qwen2's q/k/v biases, Qwen3's q/k norms, and an MoE block in the sparse layers
    (Mixtral's named block_sparse_moe)."""

    def __init__(self, c, i):
        super().__init__(c, i, hf.LlamaAttention(c, bias=c["arch"] == "qwen2_moe", qk_norm=c["arch"] == "qwen3_moe"))

    def make_mlp(self, c, i):
        if c["arch"] == "mixtral":
            self.block_sparse_moe = SparseMoeBlock(c)
        elif sparse(c, i):
            self.mlp = SparseMoeBlock(c)
        else:
            self.mlp = hf.LlamaMLP(c["hidden"], c["inner"])

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        ffn = self.block_sparse_moe if hasattr(self, "block_sparse_moe") else self.mlp
        return x + ffn(self.post_attention_layernorm(x))


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
    qwen = dict(common, num_experts=c["experts"], moe_intermediate_size=c["moe_inner"],
                norm_topk_prob=c["norm_topk_prob"], decoder_sparse_step=c["sparse_step"], mlp_only_layers=c["mlp_only"],
                use_sliding_window=False, max_window_layers=c["layers"])
    if c["arch"] == "qwen2_moe":
        return dict(qwen, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe",
                    shared_expert_intermediate_size=c["shared"], sliding_window=c["positions"])
    qwen = dict(qwen, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", attention_bias=False,
                sliding_window=None, transformers_version="4.51.0")
    if "head_dim" in c:
        qwen["head_dim"] = c["head_dim"]
    if c.get("v5"):  # transformers 5 writes the RoPE settings as rope_parameters and the dtype as dtype
        del qwen["rope_theta"], qwen["torch_dtype"]
        qwen.update(rope_parameters={"rope_type": "default", "rope_theta": c["theta"]}, dtype="float32",
                    transformers_version="5.0.0")
    return qwen


def build(name, c, out):
    model = hf.LlamaForCausalLM(c, DecoderLayer)

    def router(pname, gen):  # routers: well-separated logits
        if pname.endswith(".gate.weight"):
            return torch.randn(model.get_parameter(pname).shape, generator=gen, dtype=torch.float32)
        return None

    hf.write_case(name, c, out, model, hf.init_weights(name, model, c, router), config(c))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "ckpt/hf/testdata"
    for name, c in CASES.items():
        build(name, c, out)


if __name__ == "__main__":
    main()
