#!/usr/bin/python3
"""Write PyTorch golden fixtures for gotron's fused CPU kernels (internal/cpu).

Usage (from the repository root, Debian's python3-torch 1.13, CPU):

    /usr/bin/python3 tools/golden/ops.py [outdir]

outdir defaults to internal/cpu/testdata/golden. Every case is computed in
float64 from float32-representable inputs (seeded), then stored as float32:
inputs, outputs and the gradients of sum(out * dout) w.r.t. every input and
parameter. CI never runs this script; the Go tests read the committed files.

File format (little-endian), one file per case, NAME.bin:
    magic   8 bytes  b"GTGOLDEN"
    version uint32   1
    hlen    uint32   length of the JSON header
    header  hlen bytes of JSON: {"op": str, "params": {...},
            "tensors": [{"name": str, "dtype": "f32"|"i32", "shape": [..]}]}
    data    the tensors, in header order, packed (float32 or int32)
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

MAGIC = b"GTGOLDEN"
VERSION = 1


def write_case(outdir, name, op, params, tensors):
    header = {"op": op, "params": params, "tensors": []}
    blobs = []
    for tname, t in tensors:
        t = t.detach().contiguous()
        if t.dtype in (torch.int32, torch.int64):
            dtype, data = "i32", t.to(torch.int32).numpy().astype("<i4").tobytes()
        else:
            dtype, data = "f32", t.to(torch.float32).numpy().astype("<f4").tobytes()
        header["tensors"].append({"name": tname, "dtype": dtype, "shape": list(t.shape)})
        blobs.append(data)
    h = json.dumps(header, sort_keys=True).encode()
    with open(os.path.join(outdir, name + ".bin"), "wb") as f:
        f.write(MAGIC + struct.pack("<II", VERSION, len(h)) + h + b"".join(blobs))


def rand(gen, *shape, scale=1.0):
    """float32-representable float64 tensor in [-scale, scale), requires grad."""
    x = (torch.rand(*shape, generator=gen, dtype=torch.float32) * 2 - 1) * scale
    return x.double().requires_grad_(True)


def grads(out, inputs, gen):
    """Gradients of sum(out * dout) for a random float32-representable dout."""
    dout = rand(gen, *out.shape).detach()
    gs = torch.autograd.grad(out, inputs, dout)
    return dout, gs


def layernorm(outdir, gen):
    n, c, eps = 6, 20, 1e-5
    x, w, b = rand(gen, n, c, scale=3), rand(gen, c), rand(gen, c)
    mean = x.mean(-1)
    rstd = 1 / torch.sqrt(x.var(-1, unbiased=False) + eps)
    out = F.layer_norm(x, (c,), w, b, eps)
    dout, (dx, dw, db) = grads(out, (x, w, b), gen)
    write_case(outdir, "layernorm", "layernorm", {"n": n, "c": c, "eps": eps},
               [("inp", x), ("weight", w), ("bias", b), ("dout", dout), ("out", out),
                ("mean", mean), ("rstd", rstd), ("dinp", dx), ("dweight", dw), ("dbias", db)])


def rmsnorm(outdir, gen):
    n, c, eps = 5, 24, 1e-5
    x, w = rand(gen, n, c, scale=3), rand(gen, c)
    rstd = torch.rsqrt(x.pow(2).mean(-1) + eps)
    out = x * rstd[:, None] * w
    dout, (dx, dw) = grads(out, (x, w), gen)
    write_case(outdir, "rmsnorm", "rmsnorm", {"n": n, "c": c, "eps": eps},
               [("inp", x), ("weight", w), ("dout", dout), ("out", out), ("rstd", rstd),
                ("dinp", dx), ("dweight", dw)])


def activations(outdir, gen):
    for name, fn in [("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
                     ("gelu_erf", F.gelu), ("silu", F.silu)]:
        x = rand(gen, 64, scale=5)
        out = fn(x)
        dout, (dx,) = grads(out, (x,), gen)
        write_case(outdir, name, name, {}, [("inp", x), ("dout", dout), ("out", out), ("dinp", dx)])
    n, f = 4, 12
    x = rand(gen, n, 2 * f, scale=4)
    gate, up = torch.chunk(x, 2, dim=-1)  # Megatron fc1 layout [gate | up]
    out = F.silu(gate) * up
    dout, (dx,) = grads(out, (x,), gen)
    write_case(outdir, "swiglu", "swiglu", {"n": n, "f": f},
               [("inp", x), ("dout", dout), ("out", out), ("dinp", dx)])
    n, c = 5, 17
    x = rand(gen, n, c, scale=6)
    out = torch.softmax(x, -1)
    dout, (dx,) = grads(out, (x,), gen)
    write_case(outdir, "softmax", "softmax", {"n": n, "c": c},
               [("inp", x), ("dout", dout), ("out", out), ("dinp", dx)])


def cross_entropy(outdir, gen):
    for name, n, v, s, ignore in [("crossentropy", 8, 50, 0.0, -1),
                                  ("crossentropy_smooth", 8, 50, 0.1, -100)]:
        x = rand(gen, n, v, scale=5)
        t = torch.randint(0, v, (n,), generator=gen)
        t[1] = ignore
        t[5] = ignore
        losses = F.cross_entropy(x, t, reduction="none", ignore_index=ignore, label_smoothing=s)
        lse = torch.logsumexp(x, -1)
        dl, (dx,) = grads(losses, (x,), gen)
        write_case(outdir, name, "crossentropy",
                   {"n": n, "v": v, "label_smoothing": s, "ignore_index": ignore},
                   [("logits", x), ("targets", t), ("dlosses", dl), ("losses", losses),
                    ("lse", lse), ("dlogits", dx)])


def llama3_scaling(freqs, factor=8, low_freq_factor=1, high_freq_factor=4,
                   original_max_position_embeddings=8192):
    # Megatron RotaryEmbedding._apply_scaling / HF _compute_llama3_parameters.
    old_context_len = original_max_position_embeddings
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / freqs
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, freqs / factor, freqs)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rope_tables(rot, base, positions, interp=None, llama3=False):
    # Megatron RotaryEmbedding: float32 inv_freq and angles, cos/sin in float32.
    inv_freq = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot))
    if llama3:
        inv_freq = llama3_scaling(inv_freq)
    seq = positions.to(torch.float32)
    if interp is not None:
        seq *= 1 / interp
    freqs = torch.outer(seq, inv_freq)  # (n, rot/2)
    return torch.cos(freqs).double(), torch.sin(freqs).double()


def rope(outdir, gen):
    for name, style, b, t, h, d, rot, with_pos, base, interp, llama3 in [
            ("rope_half", "half", 2, 5, 3, 8, 8, False, 10000.0, None, False),
            ("rope_interleaved", "interleaved", 2, 4, 2, 10, 6, True, 10000.0, None, False),
            # Llama 3.1: base 500000, scaled low/medium frequencies, far positions
            ("rope_llama3", "half", 1, 6, 2, 16, 16, True, 500000.0, None, True),
            ("rope_interp", "half", 1, 5, 1, 8, 8, True, 10000.0, 4.0, False)]:
        x = rand(gen, b, t, h, d, scale=2)
        if with_pos:
            pos = torch.randint(0, 5000 if llama3 else 100, (b, t), generator=gen)
        else:
            pos = torch.arange(t).repeat(b, 1)
        cos, sin = rope_tables(rot, base, pos.reshape(-1), interp, llama3)
        cos = cos.reshape(b, t, 1, rot // 2)
        sin = sin.reshape(b, t, 1, rot // 2)
        xr, xpass = x[..., :rot], x[..., rot:]
        if style == "half":
            x1, x2 = xr[..., :rot // 2], xr[..., rot // 2:]
            yr = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
        else:
            x1, x2 = xr[..., 0::2], xr[..., 1::2]
            yr = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).reshape(xr.shape)
        out = torch.cat([yr, xpass], -1)
        dout, (dx,) = grads(out, (x,), gen)
        tensors = [("x", x), ("dout", dout), ("out", out), ("dx", dx)]
        if with_pos:
            tensors.insert(1, ("positions", pos))
        write_case(outdir, name, "rope",
                   {"b": b, "t": t, "h": h, "d": d, "dim": rot, "base": base, "style": style,
                    "interpolation_factor": interp or 0.0, "llama3": llama3},
                   tensors)


def attention(outdir, gen):
    for name, b, t, hq, hkv, d, causal, docs in [
            ("attention_causal", 2, 16, 2, 2, 8, True, False),
            ("attention_gqa", 1, 20, 4, 2, 8, True, False),
            ("attention_docmask", 2, 24, 2, 1, 4, True, True),
            # T > 64: several key and query tiles of the Go kernel
            ("attention_long", 1, 100, 2, 1, 8, True, True)]:
        q = rand(gen, b, t, hq, d)
        k = rand(gen, b, t, hkv, d)
        v = rand(gen, b, t, hkv, d)
        scale = 1 / math.sqrt(d)
        kk = k.repeat_interleave(hq // hkv, dim=2)  # query head h uses kv head h // (hq/hkv)
        vv = v.repeat_interleave(hq // hkv, dim=2)
        s = torch.einsum("bihd,bjhd->bhij", q, kk) * scale
        allowed = torch.ones(b, 1, t, t, dtype=torch.bool)
        if causal:
            allowed &= torch.tril(torch.ones(t, t, dtype=torch.bool))
        ids = None
        if docs:
            # document boundaries (Megatron --reset-attention-mask), different per row
            ids = torch.zeros(b, t, dtype=torch.int32)
            if t > 64:
                ids[0, 50:] = 1
            else:
                ids[0, 7:] = 1
                ids[0, 15:] = 2
                ids[1, 11:] = 1
            allowed &= (ids[:, None, :, None] == ids[:, None, None, :])
        s = s.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(s, -1)  # (b, hq, t)
        p = torch.softmax(s, -1)
        out = torch.einsum("bhij,bjhd->bihd", p, vv)
        dout, (dq, dk, dv) = grads(out, (q, k, v), gen)
        tensors = [("q", q), ("k", k), ("v", v), ("dout", dout), ("out", out), ("lse", lse),
                   ("dq", dq), ("dk", dk), ("dv", dv)]
        if ids is not None:
            tensors.insert(3, ("doc_ids", ids))
        write_case(outdir, name, "attention",
                   {"b": b, "t": t, "hq": hq, "hkv": hkv, "d": d, "causal": causal}, tensors)


def squared_relu(outdir, gen):
    # Megatron's squared_relu (megatron/core/activations.py), --squared-relu;
    # written last so that the earlier cases' random draws are unchanged.
    x = rand(gen, 64, scale=5)
    out = torch.pow(F.relu(x), 2)
    dout, (dx,) = grads(out, (x,), gen)
    write_case(outdir, "squared_relu", "squared_relu", {}, [("inp", x), ("dout", dout), ("out", out), ("dinp", dx)])


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else "internal/cpu/testdata/golden"
    os.makedirs(outdir, exist_ok=True)
    gen = torch.Generator().manual_seed(1234)
    for fn in (layernorm, rmsnorm, activations, cross_entropy, rope, attention, squared_relu):
        fn(outdir, gen)


if __name__ == "__main__":
    main()
