#!/usr/bin/python3
"""PyTorch goldens for gotron's GPT model (model/gpt).

Usage (repository root, Debian's python3-torch 1.13, CPU):

    /usr/bin/python3 tools/golden/gpt.py [outdir]      # default model/gpt/testdata

For a tiny GPT-2-style and a tiny Llama-style config it builds Megatron's GPT
model in plain PyTorch (Megatron parameter names and layouts: fused QKV rows
grouped per query group, SwiGLU fc1 rows [gate; up]), fills it with seeded
random weights, and records in float64: logits, the token-weighted loss,
every parameter's gradient, and every parameter after 3 AdamW steps with
global-norm clipping and Megatron's cosine LR schedule with warmup. Files are
safetensors (F32 / I32), written by hand; CI never runs Python.
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)

CONFIGS = {
    "gpt2": dict(layers=2, hidden=32, heads=4, groups=4, ffn=128, vocab=64, seq=8, batch=2,
                 pos="learned_absolute", norm="LayerNorm", act="gelu_tanh", bias=True, tied=True, eps=1e-5),
    "llama": dict(layers=2, hidden=32, heads=4, groups=2, ffn=48, vocab=64, seq=8, batch=2,
                  pos="rope", norm="RMSNorm", act="swiglu", bias=False, tied=False, eps=1e-5),
}
OPT = dict(lr=1e-2, min_lr=1e-3, warmup_iters=1, decay_iters=4, beta1=0.9, beta2=0.95, eps=1e-8,
           weight_decay=0.1, clip_grad=1.0, steps=3)


def params_for(c, gen):
    h, d = c["hidden"], c["hidden"] // c["heads"]
    g, r = c["groups"], c["heads"] // c["groups"]
    fc1 = c["ffn"] * (2 if c["act"] == "swiglu" else 1)
    P = {}

    def normal(name, *shape, std=0.2):
        P[name] = (torch.randn(*shape, generator=gen, dtype=torch.float32) * std).double()

    def near_one(name, n):
        P[name] = (1 + 0.1 * torch.randn(n, generator=gen, dtype=torch.float32)).double()

    normal("embedding.word_embeddings.weight", c["vocab"], h)
    if c["pos"] == "learned_absolute":
        normal("embedding.position_embeddings.weight", c["seq"], h)
    for i in range(c["layers"]):
        p = f"decoder.layers.{i}."
        near_one(p + "input_layernorm.weight", h)
        if c["norm"] == "LayerNorm":
            normal(p + "input_layernorm.bias", h, std=0.1)
        normal(p + "self_attention.linear_qkv.weight", g * (r + 2) * d, h)
        normal(p + "self_attention.linear_proj.weight", h, c["heads"] * d)
        near_one(p + "pre_mlp_layernorm.weight", h)
        if c["norm"] == "LayerNorm":
            normal(p + "pre_mlp_layernorm.bias", h, std=0.1)
        normal(p + "mlp.linear_fc1.weight", fc1, h)
        normal(p + "mlp.linear_fc2.weight", h, c["ffn"])
        if c["bias"]:
            normal(p + "self_attention.linear_qkv.bias", g * (r + 2) * d, std=0.1)
            normal(p + "self_attention.linear_proj.bias", h, std=0.1)
            normal(p + "mlp.linear_fc1.bias", fc1, std=0.1)
            normal(p + "mlp.linear_fc2.bias", h, std=0.1)
    near_one("decoder.final_layernorm.weight", h)
    if c["norm"] == "LayerNorm":
        normal("decoder.final_layernorm.bias", h, std=0.1)
    if not c["tied"]:
        normal("output_layer.weight", c["vocab"], h)
    return P


def rope(x, base=10000.0):
    # x (b, t, heads, d), rotate-half convention, positions 0..t-1
    b, t, nh, d = x.shape
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32).double() / d))
    ang = torch.outer(torch.arange(t).double(), inv)  # (t, d/2)
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def norm(c, x, w, b):
    if c["norm"] == "RMSNorm":
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["eps"]) * w
    return F.layer_norm(x, (x.shape[-1],), w, b, c["eps"])


def forward(c, P, tokens):
    B, T = tokens.shape
    h, d = c["hidden"], c["hidden"] // c["heads"]
    g, r = c["groups"], c["heads"] // c["groups"]
    x = P["embedding.word_embeddings.weight"][tokens]
    if c["pos"] == "learned_absolute":
        x = x + P["embedding.position_embeddings.weight"][torch.arange(T)][None]
    get = lambda k: P.get(k)
    for i in range(c["layers"]):
        p = f"decoder.layers.{i}."
        y = norm(c, x, P[p + "input_layernorm.weight"], get(p + "input_layernorm.bias"))
        qkv = F.linear(y, P[p + "self_attention.linear_qkv.weight"], get(p + "self_attention.linear_qkv.bias"))
        qkv = qkv.view(B, T, g, (r + 2) * d)
        q = qkv[..., : r * d].reshape(B, T, g * r, d)
        k = qkv[..., r * d: (r + 1) * d]
        v = qkv[..., (r + 1) * d:]
        if c["pos"] == "rope":
            q, k = rope(q), rope(k)
        k = k.repeat_interleave(r, dim=2)  # query head j*r+i uses kv head j
        v = v.repeat_interleave(r, dim=2)
        s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(d)
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        o = torch.einsum("bhts,bshd->bthd", s.softmax(-1), v).reshape(B, T, c["heads"] * d)
        x = x + F.linear(o, P[p + "self_attention.linear_proj.weight"], get(p + "self_attention.linear_proj.bias"))
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


def loss_fn(logits, labels, mask):
    l = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    m = mask.reshape(-1)
    return (l * m).sum() / m.sum()


def zero_key_bias_grads(c, params):
    """Key biases have an exactly zero gradient (adding a constant to every
    score of a softmax row changes nothing), so their computed gradient is pure
    rounding noise, which Adam's normalisation amplifies to lr-sized updates.
    Zero it (the Go test does the same) so the optimizer comparison is about
    the optimizer, not about float32 noise."""
    d, r = c["hidden"] // c["heads"], c["heads"] // c["groups"]
    for i in range(c["layers"]):
        b = params.get(f"decoder.layers.{i}.self_attention.linear_qkv.bias")
        if b is not None:
            for g in range(c["groups"]):
                start = g * (r + 2) * d + r * d
                b.grad[start:start + d] = 0


def megatron_lr(n, W, D, lrM, lrm):
    # OptimizerParamScheduler.get_lr, cosine style, lr_warmup_init 0; n in samples.
    if W > 0 and n <= W:
        return lrM * n / W
    if n > D:
        return lrm
    rho = (n - W) / (D - W)
    return lrm + 0.5 * (math.cos(math.pi * rho) + 1) * (lrM - lrm)


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        if t.dtype in (torch.int32, torch.int64):
            dt, data = "I32", t.to(torch.int32).numpy().astype("<i4").tobytes()
        else:
            dt, data = "F32", t.to(torch.float32).numpy().astype("<f4").tobytes()
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "model/gpt/testdata"
    for name, c in CONFIGS.items():
        gen = torch.Generator().manual_seed(1234)
        P = params_for(c, gen)
        B, T = c["batch"], c["seq"]
        tokens = torch.randint(0, c["vocab"], (B, T), generator=gen)
        labels = torch.randint(0, c["vocab"], (B, T), generator=gen)
        mask = torch.ones(B, T)
        mask[0, 2] = 0
        mask[1, 5] = 0
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
        # 3 AdamW steps: clip by global norm, Megatron's cosine schedule in samples.
        decay = [v for k, v in params.items() if v.dim() > 1]
        no_decay = [v for k, v in params.items() if v.dim() <= 1]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPT["weight_decay"]},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]), eps=OPT["eps"])
        lrs, norms, losses = [], [], []
        for it in range(OPT["steps"]):
            opt.zero_grad()
            loss = loss_fn(forward(c, params, tokens), labels, mask)
            loss.backward()
            zero_key_bias_grads(c, params)
            norms.append(float(torch.nn.utils.clip_grad_norm_(list(params.values()), OPT["clip_grad"])))
            n = it * B  # samples consumed before this step
            lr = megatron_lr(n, OPT["warmup_iters"] * B, OPT["decay_iters"] * B, OPT["lr"], OPT["min_lr"])
            for grp in opt.param_groups:
                grp["lr"] = lr
            opt.step()
            lrs.append(lr)
            losses.append(float(loss))
        for k, v in params.items():
            out["step3/" + k] = v.detach().clone()
        out["step_lr"] = torch.tensor(lrs)
        out["step_grad_norm"] = torch.tensor(norms)
        out["step_loss"] = torch.tensor(losses)
        write_safetensors(os.path.join(outdir, f"{name}.safetensors"), out)
        with open(os.path.join(outdir, f"{name}.json"), "w") as f:
            json.dump({"config": c, "optimizer": OPT}, f, indent=1, sort_keys=True)
        print(name, "loss", float(out["loss"]), "lrs", lrs, "norms", norms)


if __name__ == "__main__":
    main()
