#!/usr/bin/python3
"""Megatron-LM legacy (`--ckpt-format torch`) Mixture-of-Experts checkpoints for gotron's importer
(ckpt/megatron, `gotron convert --from megatron`).

Usage (repository root, Debian's python3-torch 1.13, CPU):

    /usr/bin/python3 tools/golden/megatron_moe_ckpt.py     # writes ckpt/megatron/testdata/moe_*

Each case is what Megatron core saves for an MoE GPT (spec megatron-moe-cp.md §5.3): per
(tp, pp) rank, `iter_XXXXXXX/mp_rank_TT[_PPP]/model_optim_rng.pt` holding `args`, the model
state dict with the attention of tools/golden/megatron_ckpt.py and, in each MoE layer,
`mlp.router.weight` [E, h], the experts as TEGroupedMLP (`mlp.experts.linear_fc1.weight{l}`,
`linear_fc2.weight{l}`, `_extra_state{l}`; --moe-grouped-gemm) or SequentialMLP
(`mlp.experts.local_experts.{l}.linear_fc1.weight`), the shared expert
(`mlp.shared_experts.linear_fc1/fc2.weight`, `gate_weight` [1, h]) and, with
TransformerEngine, the MoE layer's own `pre_mlp_layernorm.weight` (its fc1 has no fused
norm). Experts are split over expert-TP = TP as the dense MLP: fc1 rows per rank [gate
shard; up shard], fc2 columns. `expected.safetensors` holds every whole parameter under
gotron's name (Megatron core's names at TP=1), which the import must reproduce exactly.
"""
import collections
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_ckpt as mc  # noqa: E402

DENSE_LAYER_STATE = mc.layer_state  # the attention entries of a layer

CASES = {
    # TP=2, TE layer spec, grouped GEMM, first layer dense, a gated shared expert
    "moe_tp2_grouped": dict(arch="llama", tp=2, pp=1, vp=1, layers=2, hidden=16, heads=4, groups=2, kv=4, ffn=32,
                            vocab=100, divisible=32, positions=64, seq=32, eps=1e-5, base=10000, dtype=torch.bfloat16,
                            te=True, iteration=50, optimizer="adam", experts=4, topk=2, moe_ffn=8, shared=12,
                            freq=[0, 1], grouped=True),
    # EP=2 × TP=2: rank files mp_rank_TT_EEE, each with its 3 local experts numbered from 0
    "moe_ep2_tp2": dict(arch="llama", tp=2, pp=1, vp=1, ep=2, layers=2, hidden=16, heads=4, groups=2, kv=4, ffn=32,
                        vocab=100, divisible=32, positions=64, seq=32, eps=1e-5, base=10000, dtype=torch.float32,
                        te=True, iteration=9, optimizer="adam", experts=6, topk=2, moe_ffn=8, shared=0, freq=1,
                        grouped=True),
    # PP=2, SequentialMLP experts, every layer MoE, top-1, no shared expert, float32
    "moe_pp2_sequential": dict(arch="llama", tp=1, pp=2, vp=1, layers=2, hidden=16, heads=4, groups=4, kv=4, ffn=32,
                               vocab=100, divisible=32, positions=64, seq=32, eps=1e-5, base=10000,
                               dtype=torch.float32, te=True, iteration=7, optimizer="adam", experts=3, topk=1,
                               moe_ffn=8, shared=0, freq=1, grouped=False),
}


def is_moe(c, i):
    return c["freq"][i] == 1 if isinstance(c["freq"], list) else i % c["freq"] == 0


def args(c):
    a = mc.megatron_args(c)
    a.num_experts = c["experts"]
    a.moe_router_topk = c["topk"]
    a.moe_ffn_hidden_size = c["moe_ffn"]
    a.moe_layer_freq = c["freq"]
    a.moe_grouped_gemm = c["grouped"]
    a.moe_shared_expert_intermediate_size = c["shared"] or None
    a.moe_shared_expert_gate = c["shared"] > 0
    a.moe_shared_expert_overlap = False
    a.moe_router_load_balancing_type = "aux_loss"
    a.moe_aux_loss_coeff = 0.01
    a.moe_z_loss_coeff = None
    a.moe_router_score_function = "softmax"
    a.moe_router_pre_softmax = False
    a.moe_router_topk_scaling_factor = None
    a.moe_router_num_groups = None
    a.moe_router_group_topk = None
    a.moe_router_enable_expert_bias = False
    a.moe_router_dtype = None
    a.moe_expert_capacity_factor = None
    a.moe_token_drop_policy = "probs"
    a.moe_pad_expert_input_to_capacity = False
    a.moe_token_dispatcher_type = "alltoall"
    a.moe_input_jitter_eps = None
    a.expert_tensor_parallel_size = c["tp"]
    return a


def moe_weights(c, W, gen):
    h, E, f, s = c["hidden"], c["experts"], c["moe_ffn"], c["shared"]
    dt = c["dtype"]

    def rnd(*shape, std):
        return (std * torch.randn(*shape, generator=gen, dtype=torch.float32)).to(dt).to(torch.float32)

    for i, L in enumerate(W["layers"]):
        if not is_moe(c, i):
            continue
        for k in ("gate", "up", "fc2"):
            del L[k]
        L["router"] = rnd(E, h, std=h ** -0.5)
        L["experts"] = [dict(gate=rnd(f, h, std=h ** -0.5), up=rnd(f, h, std=h ** -0.5), fc2=rnd(h, f, std=f ** -0.5))
                        for _ in range(E)]
        if s:
            L["shared"] = dict(gate=rnd(s, h, std=h ** -0.5), up=rnd(s, h, std=h ** -0.5), fc2=rnd(h, s, std=s ** -0.5))
            L["shared_gate"] = rnd(1, h, std=h ** -0.5)


def glu_rows(m, t, tp):
    per = m["gate"].shape[0] // tp
    return torch.cat([m["gate"][t * per:(t + 1) * per], m["up"][t * per:(t + 1) * per]])


def fc2_cols(m, t, tp):
    per = m["fc2"].shape[1] // tp
    return m["fc2"][:, t * per:(t + 1) * per]


def moe_layer_state(c, L, t, ep_rank=0):
    """Rank (t, ep_rank)'s entries of an MoE layer (relative to decoder.layers.N.): its local
    experts, numbered from 0."""
    tp, dt = c["tp"], c["dtype"]
    per = c["experts"] // c.get("ep", 1)
    L = dict(L, experts=L["experts"][ep_rank * per:(ep_rank + 1) * per])
    s = DENSE_LAYER_STATE(c, dict(L, gate=L["router"][:0], up=L["router"][:0], fc2=L["router"][:, :0]), t, c["te"])
    for k in [k for k in s if k.startswith("mlp.")]:
        del s[k]
    s["pre_mlp_layernorm.weight"] = L["ln2"].to(dt)
    s["mlp.router.weight"] = L["router"].to(dt)
    for e, m in enumerate(L["experts"]):
        if c["grouped"]:
            s[f"mlp.experts.linear_fc1.weight{e}"] = glu_rows(m, t, tp).to(dt).contiguous()
            s[f"mlp.experts.linear_fc2.weight{e}"] = fc2_cols(m, t, tp).to(dt).contiguous()
        else:
            s[f"mlp.experts.local_experts.{e}.linear_fc1.weight"] = glu_rows(m, t, tp).to(dt).contiguous()
            s[f"mlp.experts.local_experts.{e}.linear_fc2.weight"] = fc2_cols(m, t, tp).to(dt).contiguous()
    if c["grouped"]:  # TEGroupedMLP's per-GEMM fp8 metadata
        for e in range(len(L["experts"])):
            s[f"mlp.experts.linear_fc1._extra_state{e}"] = None
            s[f"mlp.experts.linear_fc2._extra_state{e}"] = None
    if "shared" in L:
        s["mlp.shared_experts.linear_fc1.weight"] = glu_rows(L["shared"], t, tp).to(dt).contiguous()
        s["mlp.shared_experts.linear_fc2.weight"] = fc2_cols(L["shared"], t, tp).to(dt).contiguous()
        s["mlp.shared_experts.gate_weight"] = L["shared_gate"].to(dt)
    return s


def expected(c, W):
    dense = dict(W, layers=[L if "router" not in L else dict(L, gate=L["router"][:0], up=L["router"][:0], fc2=L["router"][:, :0])
                            for L in W["layers"]])
    out = mc.whole_state(c, dense)
    for i, L in enumerate(W["layers"]):
        if "router" not in L:
            continue
        n = f"decoder.layers.{i}."
        del out[n + "mlp.linear_fc1.weight"], out[n + "mlp.linear_fc2.weight"]
        out[n + "mlp.router.weight"] = L["router"]
        for e, m in enumerate(L["experts"]):
            fc1, fc2 = (f"mlp.experts.linear_fc1.weight{e}", f"mlp.experts.linear_fc2.weight{e}") if c["grouped"] else \
                (f"mlp.experts.local_experts.{e}.linear_fc1.weight", f"mlp.experts.local_experts.{e}.linear_fc2.weight")
            out[n + fc1] = torch.cat([m["gate"], m["up"]])
            out[n + fc2] = m["fc2"]
        if "shared" in L:
            out[n + "mlp.shared_experts.linear_fc1.weight"] = torch.cat([L["shared"]["gate"], L["shared"]["up"]])
            out[n + "mlp.shared_experts.linear_fc2.weight"] = L["shared"]["fc2"]
            out[n + "mlp.shared_experts.gate_weight"] = L["shared_gate"]
    return out


def build(name, c):
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    W = mc.make_weights(c, gen)
    moe_weights(c, W, gen)
    d = os.path.join(mc.OUT, name)
    it = c["iteration"]
    a = args(c)
    ep = c.get("ep", 1)
    a.expert_model_parallel_size = ep
    for t in range(c["tp"]):
        for p in range(c["pp"]):
            for e in range(ep):
                def layer_state(cc, L, tt, te, dt=None):
                    return moe_layer_state(c, L, tt, e) if "router" in L else DENSE_LAYER_STATE(cc, L, tt, te, dt)
                mc.layer_state = layer_state
                try:
                    st = mc.chunk_state(c, W, t, p, 0)
                finally:
                    mc.layer_state = DENSE_LAYER_STATE
                sd = {"args": a, "checkpoint_version": 3.0, "iteration": it, "model": st,
                      "rng_state": mc.rng_state(full=False), "num_floating_point_operations_so_far": 1.0}
                rank = f"mp_rank_{t:02d}" if c["pp"] == 1 else f"mp_rank_{t:02d}_{p:03d}"
                if ep > 1:
                    rank += f"_{e:03d}"  # Megatron's get_checkpoint_name
                path = os.path.join(d, f"iter_{it:07d}", rank, "model_optim_rng.pt")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                torch.save(sd, path)
    with open(os.path.join(d, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(it))
    mc.write_safetensors(os.path.join(d, "expected.safetensors"), expected(c, W), {"case": name})
    print(f"{name}: {len(expected(c, W))} parameters")


def main():
    for name, c in CASES.items():
        build(name, c)


if __name__ == "__main__":
    main()
