#!/usr/bin/python3
"""Write the MoE router golden fixture from Megatron-LM's own functions.

Usage (from the repository root, Debian's python3-torch 1.13, CPU):

    # Megatron is not a dependency: fetch it anywhere, e.g.
    #   git clone https://github.com/NVIDIA/Megatron-LM /tmp/meg   (we used d98e8a6)
    /usr/bin/python3 tools/golden/moe.py /tmp/meg [out.json]

out defaults to internal/cpu/testdata/moe_router.json; internal/cpu's
TestRouteGolden reads it. CI never runs this script.

Megatron's megatron.core does not import on torch 1.13 (no
torch.distributed.checkpoint, no Transformer Engine), so a small import shim
(as ../shared/spec/megatron-moe-cp.md §9.2 describes) answers every
megatron.*, transformer_engine, einops and apex import with an inert stub and
then executes megatron/core/transformer/moe/moe_utils.py itself as a module.
The functions used are Megatron's, unchanged: topk_routing_with_score_function,
compute_routing_scores_for_aux_loss, get_tokens_per_expert_and_token_count,
switch_load_balancing_loss_func, z_loss_func, MoEAuxLossAutoScaler,
apply_router_token_dropping, get_capacity, get_updated_expert_bias. What this
script writes itself is only TopKRouter's glue between them (routing(),
_apply_seq_aux_loss's reshape, _apply_global_aux_loss's running mean), copied
from router.py line by line, for one rank (every reduction group of size 1).

torch.topk's tie rule differs between devices: the GPU keeps the lowest
indices, the CPU the highest (spec §1.3). gotron implements the GPU rule, so
torch.topk is replaced here by a stable sort (value descending, index
ascending), which is the GPU's rule. Only capacity dropping by "position" and
padding to capacity meet ties in these inputs.

Token order: Megatron's logits are [S, B, E] viewed as [S·B, E] (token s·B+b);
gotron's rows are b·S+s. The fixture stores every per-token array in gotron's
order.
"""
import importlib.abc
import importlib.machinery
import json
import math
import os
import sys
import types

import torch

MEG = sys.argv[1] if len(sys.argv) > 1 else "/tmp/meg"
OUT = sys.argv[2] if len(sys.argv) > 2 else "internal/cpu/testdata/moe_router.json"


class Stub(types.ModuleType):
    """An inert module/attribute: calls pass a lone function through
    (decorators), everything else returns another Stub; bool() is False."""

    def __init__(self, name="stub"):
        super().__init__(name)
        self.__path__ = []

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Stub(self.__name__ + "." + name)

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return Stub(self.__name__ + "()")

    def __bool__(self):
        return False

    def __mro_entries__(self, bases):
        return (object,)


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    PREFIXES = ("megatron", "transformer_engine", "einops", "apex")

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.PREFIXES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return Stub(spec.name)

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, StubFinder())


def load_moe_utils():
    path = os.path.join(MEG, "megatron/core/transformer/moe/moe_utils.py")
    src = open(path).read()
    mod = types.ModuleType("megatron.core.transformer.moe.moe_utils")
    mod.__file__ = path
    exec(compile(src, path, "exec"), mod.__dict__)
    mod.HAVE_TE = False
    mod.is_batch_invariant_mode_enabled = lambda: False
    # one rank: all-reduces over a group of one are the identity
    mod.reduce_from_tensor_model_parallel_region = lambda x, group=None: x
    return mod


mu = load_moe_utils()
torch.distributed.all_reduce = lambda *a, **k: None

_topk = torch.topk


def gpu_topk(input, k, dim=-1, largest=True, sorted=True):
    """torch.topk with the GPU's tie rule (lowest index first)."""
    assert largest
    vals, idx = torch.sort(input, dim=dim, descending=True, stable=True)
    return torch.return_types.topk((vals.narrow(dim, 0, k), idx.narrow(dim, 0, k)))


torch.topk = gpu_topk
mu.torch.topk = gpu_topk


class Group:
    def size(self):
        return 1


ONE = Group()
S, B, E = 6, 2, 8
T = S * B
g = torch.Generator().manual_seed(1234)
# Megatron order [S, B, E]
logits_sbe = torch.randn(S, B, E, generator=g, dtype=torch.float32) * 1.5
dprobs_sbe = torch.randn(S, B, E, generator=g, dtype=torch.float32)


def to_gotron(x):
    """[S·B, ...] in Megatron's order -> gotron's b·S+s rows, flattened."""
    x = x.reshape(S, B, -1).transpose(0, 1).reshape(-1)
    return [float(v) for v in x.tolist()]


def f32(t):
    return [float(v) for v in t.reshape(-1).tolist()]


def route_case(name, k, **kw):
    """TopKRouter.routing's selection (+ optional dropping) with gradients:
    probs, map and d(sum(probs*dprobs))/dlogits."""
    drop = kw.pop("drop", None)
    logits = logits_sbe.reshape(T, E).clone().requires_grad_(True)
    bias = kw.get("expert_bias")
    probs, rmap = mu.topk_routing_with_score_function(logits, k, **kw)
    if drop is not None:
        probs, rmap = mu.apply_router_token_dropping(probs, rmap, router_topk=k, **drop)
    (probs * dprobs_sbe.reshape(T, E)).sum().backward()
    c = {"name": name, "topk": k,
         "score": kw.get("score_function", "softmax"),
         "pre_softmax": kw.get("use_pre_softmax", False),
         "num_groups": kw.get("num_groups") or 0, "group_topk": kw.get("group_topk") or 0,
         "scaling": kw.get("scaling_factor") or 0.0,
         "expert_bias": f32(bias) if bias is not None else None,
         "probs": to_gotron(probs.detach()), "map": to_gotron(rmap.float()),
         "dlogits": to_gotron(logits.grad)}
    if drop is not None:
        c["capacity_factor"] = drop["capacity_factor"]
        c["drop_policy"] = drop["drop_policy"]
        c["pad"] = drop["pad_to_capacity"]
        c["capacity"] = mu.get_capacity(T * k, E, drop["capacity_factor"])
    return c


bias = torch.tensor([0.0, 0.3, -0.2, 0.1, -1.0, 0.0, 0.25, -0.05])
cases = [
    route_case("softmax_post_k2", 2),
    route_case("softmax_pre_k2", 2, use_pre_softmax=True),
    route_case("softmax_post_k1", 1),
    route_case("softmax_post_k3_scaled", 3, scaling_factor=2.5),
    route_case("sigmoid_k2", 2, score_function="sigmoid"),
    route_case("sigmoid_k1", 1, score_function="sigmoid"),
    route_case("sqrtsoftplus_k2_scaled", 2, score_function="sqrtsoftplus", scaling_factor=2.5),
    route_case("sigmoid_k2_bias", 2, score_function="sigmoid", expert_bias=bias),
    route_case("softmax_pre_k4_groups", 4, use_pre_softmax=True, num_groups=4, group_topk=2),
    route_case("softmax_post_k2_groups", 2, num_groups=4, group_topk=2),
    route_case("sigmoid_k4_groups_bias", 4, score_function="sigmoid", num_groups=4, group_topk=2, expert_bias=bias),
    route_case("drop_probs", 2, drop=dict(capacity_factor=0.5, drop_policy="probs", pad_to_capacity=False)),
    route_case("drop_position", 2, drop=dict(capacity_factor=0.5, drop_policy="position", pad_to_capacity=False)),
    route_case("drop_probs_pad", 2, drop=dict(capacity_factor=1.0, drop_policy="probs", pad_to_capacity=True)),
    route_case("drop_position_pad", 2, drop=dict(capacity_factor=0.75, drop_policy="position", pad_to_capacity=True)),
    route_case("drop_none_cap_exceeds", 2, drop=dict(capacity_factor=8.0, drop_policy="probs", pad_to_capacity=False)),
]


def loss_case(name, k, score, lb, coeff, zcoeff, scale):
    """Losses as TopKRouter.routing attaches them, with the backward through
    MoEAuxLossAutoScaler at main_loss_backward_scale = scale."""
    logits = logits_sbe.reshape(T, E).clone().requires_grad_(True)
    mu.MoEAuxLossAutoScaler.main_loss_backward_scale = torch.tensor(scale)
    z = None
    lg = logits
    if zcoeff:
        z = mu.z_loss_func(lg, zcoeff / ONE.size())
        lg = mu.MoEAuxLossAutoScaler.apply(lg, z)
    probs, rmap = mu.topk_routing_with_score_function(lg, k, score_function=score)
    amap, scores = mu.compute_routing_scores_for_aux_loss(lg, k, score)
    aux = None
    if lb == "aux_loss":
        gtpe, _, tot = mu.get_tokens_per_expert_and_token_count(amap, ONE, k)
        aux = mu.switch_load_balancing_loss_func(scores, gtpe, tot, k, E, coeff)
    elif lb == "seq_aux_loss":
        sc = scores.reshape(S, -1)
        rm = amap.reshape(S, -1)
        gtpe, _, tot = mu.get_tokens_per_expert_and_token_count(rm, ONE, k * B)
        aux = mu.switch_load_balancing_loss_func(sc, gtpe, tot, k, E, coeff) / B
    if aux is not None:
        probs = mu.MoEAuxLossAutoScaler.apply(probs, aux)
    (probs * dprobs_sbe.reshape(T, E)).sum().backward()
    return {"name": name, "topk": k, "score": score, "type": lb, "coeff": coeff, "z_coeff": zcoeff,
            "scale": scale, "aux": float(aux) if aux is not None else 0.0,
            "z": float(z) if z is not None else 0.0, "dlogits": to_gotron(logits.grad)}


losses = [
    loss_case("aux_softmax", 2, "softmax", "aux_loss", 0.01, 0.0, 0.25),
    loss_case("aux_sigmoid", 2, "sigmoid", "aux_loss", 0.1, 0.0, 1.0),
    loss_case("aux_sqrtsoftplus", 3, "sqrtsoftplus", "aux_loss", 0.1, 0.0, 0.5),
    loss_case("seq_aux_softmax", 2, "softmax", "seq_aux_loss", 0.05, 0.0, 0.5),
    loss_case("z_only", 2, "softmax", "none", 0.0, 1e-3, 0.5),
    loss_case("aux_and_z", 2, "softmax", "aux_loss", 0.01, 1e-2, 1.0),
]

# global_aux_loss over three micro-batches: the running mean of the counts
# (TopKRouter._apply_global_aux_loss, one rank).
glob = []
gtotal = torch.zeros(E)
steps = 0
for mb in range(3):
    lg = (torch.randn(S, B, E, generator=g) * 1.5).reshape(T, E).requires_grad_(True)
    amap, scores = mu.compute_routing_scores_for_aux_loss(lg, 2, "softmax")
    gtpe, _, tot = mu.get_tokens_per_expert_and_token_count(amap, ONE, 2)
    gtotal += gtpe
    steps += 1
    loss = mu.switch_load_balancing_loss_func(scores, gtotal / steps, tot, 2, E, 0.02)
    loss.backward()
    glob.append({"logits": to_gotron(lg.detach()), "loss": float(loss), "dlogits": to_gotron(lg.grad)})

# global_aux_loss over a reduce group of two ranks (TP×DP×CP = DP = 2, say),
# three micro-batches each: get_tokens_per_expert_and_token_count sums the
# ranks' counts (its all-reduce, reduce_from_tensor_model_parallel_region,
# emulated by adding the other rank's counts) and counts T·2 tokens; each
# rank's loss is its own probabilities' part of the global batch's loss, and
# its backward runs at MoEAuxLossAutoScaler scale 0.5 (loss_scale·CP/M).


class Group2:
    def size(self):
        return 2


TWO = Group2()
glob_dp = []
gtotal_dp = [torch.zeros(E), torch.zeros(E)]  # each rank's global_tokens_per_expert buffer
for mb in range(3):
    lgs = [(torch.randn(S, B, E, generator=g) * 1.5).reshape(T, E).requires_grad_(True) for _ in range(2)]
    aux = [mu.compute_routing_scores_for_aux_loss(lg, 2, "softmax") for lg in lgs]
    local = [amap.sum(dim=0) for amap, _ in aux]
    mu.reduce_from_tensor_model_parallel_region = lambda x, group=None: local[0] + local[1]
    ranks = []
    for r in range(2):
        gtpe, _, tot = mu.get_tokens_per_expert_and_token_count(aux[r][0], TWO, 2)
        gtotal_dp[r] += gtpe
        loss = mu.switch_load_balancing_loss_func(aux[r][1], gtotal_dp[r] / (mb + 1), tot, 2, E, 0.02)
        mu.MoEAuxLossAutoScaler.main_loss_backward_scale = torch.tensor(0.5)
        # attached to an activation of its own: the logits' gradient is the loss's alone
        mu.MoEAuxLossAutoScaler.apply(torch.zeros(T, E, requires_grad=True), loss).sum().backward()
        ranks.append({"logits": to_gotron(lgs[r].detach()), "loss": float(loss), "dlogits": to_gotron(lgs[r].grad)})
    glob_dp.append(ranks)
mu.reduce_from_tensor_model_parallel_region = lambda x, group=None: x

# expert-bias update
counts = torch.tensor([5.0, 1.0, 3.0, 3.0, 0.0, 7.0, 2.0, 3.0])
eb = torch.tensor([0.01, -0.02, 0.0, 0.5, 0.0, 0.0, -0.1, 0.2])
upd = mu.get_updated_expert_bias(counts.clone(), eb.clone(), 1e-3)
capacities = [[n, e, cf, mu.get_capacity(n, e, cf)] for n, e, cf in
              [(8192, 64, 1.0), (32768, 256, 1.25), (7, 3, 1.0), (24, 8, 0.5), (10, 3, 0.3)]]

out = {"megatron": "NVIDIA/Megatron-LM d98e8a6, megatron/core/transformer/moe/moe_utils.py",
       "S": S, "B": B, "E": E, "logits": to_gotron(logits_sbe.reshape(T, E)),
       "dprobs": to_gotron(dprobs_sbe.reshape(T, E)), "routes": cases, "losses": losses,
       "global_aux": {"topk": 2, "coeff": 0.02, "microbatches": glob},
       "global_aux_dp": {"topk": 2, "coeff": 0.02, "scale": 0.5, "ranks": 2, "microbatches": glob_dp},
       "expert_bias": {"counts": f32(counts), "bias": f32(eb), "rate": 1e-3, "updated": f32(upd)},
       "capacity": capacities}
with open(OUT, "w") as f:
    json.dump(out, f, indent=0)
print("wrote", OUT)

# ---------------------------------------------------------------------------
# A whole MoE MLP (MoELayer with SequentialMLP SwiGLU experts, a gated shared
# expert, dropping, aux and z losses at MoEAuxLossAutoScaler scale 1), in
# float64: Megatron's routing, permute and unpermute; the experts as
# SequentialMLP computes them (the probability multiplies the activation
# before fc2); out = routed + shared. The gradients are those of
# sum(out * dout). model/gpt's TestMoELayerGolden reads it.
LAYER_OUT = sys.argv[3] if len(sys.argv) > 3 else "model/gpt/testdata/moe_layer.json"
torch.set_default_dtype(torch.float64)
g2 = torch.Generator().manual_seed(99)
Sl, Bl, H, EL, K, F, SH = 5, 2, 8, 4, 2, 6, 4
TL = Sl * Bl
x = torch.randn(Sl, Bl, H, generator=g2, dtype=torch.float64).requires_grad_(True)
Wr = (torch.randn(EL, H, generator=g2, dtype=torch.float64) * 0.5).requires_grad_(True)
W1 = [(torch.randn(2 * F, H, generator=g2, dtype=torch.float64) * 0.3).requires_grad_(True) for _ in range(EL)]
W2 = [(torch.randn(H, F, generator=g2, dtype=torch.float64) * 0.3).requires_grad_(True) for _ in range(EL)]
S1 = (torch.randn(2 * SH, H, generator=g2, dtype=torch.float64) * 0.3).requires_grad_(True)
S2 = (torch.randn(H, SH, generator=g2, dtype=torch.float64) * 0.3).requires_grad_(True)
Gw = (torch.randn(1, H, generator=g2, dtype=torch.float64) * 0.3).requires_grad_(True)
dout = torch.randn(Sl, Bl, H, generator=g2, dtype=torch.float64)
AUX, ZC, CF = 0.1, 0.01, 1.0
mu.MoEAuxLossAutoScaler.main_loss_backward_scale = torch.tensor(1.0, dtype=torch.float64)

xs = x.reshape(TL, H)
logits = xs @ Wr.T
z = mu.z_loss_func(logits, ZC)
logits = mu.MoEAuxLossAutoScaler.apply(logits, z)
probs, rmap = mu.topk_routing_with_score_function(logits, K)
probs, rmap = mu.apply_router_token_dropping(probs, rmap, router_topk=K, capacity_factor=CF, drop_policy="probs")
amap, ascores = mu.compute_routing_scores_for_aux_loss(logits, K, "softmax")
gtpe, _, tot = mu.get_tokens_per_expert_and_token_count(amap, ONE, K)
aux = mu.switch_load_balancing_loss_func(ascores, gtpe, tot, K, EL, AUX)
probs = mu.MoEAuxLossAutoScaler.apply(probs, aux)
tokens_per_expert = rmap.sum(dim=0)
num_out = int(tokens_per_expert.sum())
pin, pprobs, sorted_idx, _, _ = mu.permute(xs, rmap, probs=probs, num_out_tokens=num_out)
outs = []
for e, chunk, pc in zip(range(EL), torch.split(pin, tokens_per_expert.tolist()), torch.split(pprobs, tokens_per_expert.tolist())):
    hdn = chunk @ W1[e].T
    gate, up = hdn[:, :F], hdn[:, F:]
    act = torch.nn.functional.silu(gate) * up * pc.unsqueeze(-1)
    outs.append(act @ W2[e].T)
routed = mu.unpermute(torch.cat(outs), sorted_idx, torch.Size([TL, H]))
sh = xs @ S1.T
shared = (torch.nn.functional.silu(sh[:, :SH]) * sh[:, SH:]) @ S2.T
shared = shared * torch.sigmoid(xs @ Gw.T)
out = (routed + shared).reshape(Sl, Bl, H)
(out * dout).sum().backward()


def bs(t):
    """[S, B, ...] -> gotron's [B, S, ...], flattened."""
    return [float(v) for v in t.detach().transpose(0, 1).reshape(-1).tolist()]


def flat(t):
    return [float(v) for v in t.detach().reshape(-1).tolist()]


layer = {"S": Sl, "B": Bl, "H": H, "E": EL, "K": K, "F": F, "shared": SH, "aux_coeff": AUX, "z_coeff": ZC,
         "capacity_factor": CF, "dropped": int(TL * K - num_out),
         "x": bs(x), "dout": bs(dout), "out": bs(out), "dx": bs(x.grad),
         "aux": float(aux), "z": float(z),
         "router": flat(Wr), "fc1": [flat(w) for w in W1], "fc2": [flat(w) for w in W2],
         "shared_fc1": flat(S1), "shared_fc2": flat(S2), "gate": flat(Gw),
         "d_router": flat(Wr.grad), "d_fc1": [flat(w.grad) for w in W1], "d_fc2": [flat(w.grad) for w in W2],
         "d_shared_fc1": flat(S1.grad), "d_shared_fc2": flat(S2.grad), "d_gate": flat(Gw.grad)}
with open(LAYER_OUT, "w") as f:
    json.dump(layer, f, indent=0)
print("wrote", LAYER_OUT, "dropped", layer["dropped"])

# ---------------------------------------------------------------------------
# --moe-router-dtype fp64: RouterGatingLinearFunction (the fp64 path:
# x.double() @ W.double().T, backward in float64 cast to the inputs' float32)
# and the routing on float64 logits. The inputs make fp32 gating fail: large
# activations and nearly equal router rows, so the logits are small
# differences of large numbers. tensor's TestRouteFP64Golden reads it.
FP64_OUT = sys.argv[4] if len(sys.argv) > 4 else "tensor/testdata/moe_router_fp64.json"
g3 = torch.Generator().manual_seed(2024)
T6, H6, E6, K6 = 12, 64, 8, 2
x6 = (torch.randn(T6, H6, generator=g3, dtype=torch.float64) * 300).float().requires_grad_(True)
base = torch.randn(1, H6, generator=g3, dtype=torch.float64)
W6 = (base + 1e-4 * torch.randn(E6, H6, generator=g3, dtype=torch.float64)).float().requires_grad_(True)
dp6 = torch.randn(T6, E6, generator=g3, dtype=torch.float64)
mu.MoEAuxLossAutoScaler.main_loss_backward_scale = torch.tensor(1.0, dtype=torch.float64)
lg6 = mu.RouterGatingLinearFunction.apply(x6, W6, None, torch.float64)
pr6, mp6 = mu.topk_routing_with_score_function(lg6, K6)
(pr6 * dp6).sum().backward()
with torch.no_grad():  # what fp32 gating gives, to show the case needs fp64
    pr32, _ = mu.topk_routing_with_score_function(x6.detach() @ W6.detach().T, K6)
fp64 = {"T": T6, "H": H6, "E": E6, "K": K6, "x": flat(x6), "w": flat(W6), "dprobs": flat(dp6.float()),
        "probs": flat(pr6), "map": flat(mp6.double()), "dx": flat(x6.grad), "dw": flat(W6.grad),
        "probs_fp32_gating": flat(pr32)}
with open(FP64_OUT, "w") as f:
    json.dump(fp64, f, indent=0)
print("wrote", FP64_OUT, "max |fp32 - fp64| probs", float((pr32.double() - pr6.detach()).abs().max()))
