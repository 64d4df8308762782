#!/usr/bin/python3
"""PyTorch peer for gotron serve's single-stream decode: GPT-2 (nanoGPT-style: pre-LN,
GELU-tanh, learned positions, tied embeddings, biases), fp32 (or --dtype bfloat16), greedy decoding with a KV cache
(preallocated per layer, one token per step after the prompt's prefill), torch.no_grad().

usage: OMP_NUM_THREADS=2 /usr/bin/python3 gpt2_decode_torch.py --prompt 16 --new 64 --reps 5
Prints one RESULT line: decode tokens/s = (new - 1) / time from the first to the last new token,
the same definition as `gotron bench serve`'s "decode" line (1 / mean inter-token time), median
and best over --reps. Written for Debian bookworm's torch 1.13 (no scaled_dot_product_attention).
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, cache, pos):
        # x (1, T, d); cache: (k, v) each (1, h, ctx, hd), filled up to pos.
        B, T, C = x.shape
        hd = C // self.h
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.h, hd).transpose(1, 2)
        kc, vc = cache
        kc[:, :, pos:pos + T] = k.view(B, T, self.h, hd).transpose(1, 2)
        vc[:, :, pos:pos + T] = v.view(B, T, self.h, hd).transpose(1, 2)
        k, v = kc[:, :, :pos + T], vc[:, :, :pos + T]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        if T > 1:  # causal mask within the new tokens
            mask = torch.ones(T, pos + T, dtype=torch.bool).triu(pos + 1)
            att = att.masked_fill(mask, float('-inf'))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate='tanh'))


class GPT(nn.Module):
    def __init__(self, L, d, h, vocab, ctx):
        super().__init__()
        self.L, self.d, self.h, self.ctx = L, d, h, ctx
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([Block(d, h) for _ in range(L)])
        self.ln_f = nn.LayerNorm(d)
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def new_cache(self):
        hd = self.d // self.h
        dt = self.wte.weight.dtype
        return [(torch.zeros(1, self.h, self.ctx, hd, dtype=dt), torch.zeros(1, self.h, self.ctx, hd, dtype=dt))
                for _ in range(self.L)]

    def forward(self, idx, cache, pos):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(pos, pos + T))
        for blk, c in zip(self.blocks, cache):
            x = blk(x, c, pos)
        return F.linear(self.ln_f(x[:, -1:]), self.wte.weight)  # tied output layer, last position


@torch.no_grad()
def decode(model, prompt, new):
    cache = model.new_cache()
    logits = model(prompt, cache, 0)
    pos = prompt.shape[1]
    nxt = logits.argmax(-1)
    times = [time.perf_counter()]
    out = [nxt.item()]
    for _ in range(new - 1):
        logits = model(nxt, cache, pos)
        pos += 1
        nxt = logits.argmax(-1)
        out.append(nxt.item())
        times.append(time.perf_counter())
    return out, (new - 1) / (times[-1] - times[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--layers', type=int, default=12)
    ap.add_argument('--d', type=int, default=768)
    ap.add_argument('--heads', type=int, default=12)
    ap.add_argument('--vocab', type=int, default=50304)
    ap.add_argument('--ctx', type=int, default=1024)
    ap.add_argument('--prompt', type=int, default=16)
    ap.add_argument('--new', type=int, default=64)
    ap.add_argument('--reps', type=int, default=5)
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--dtype', choices=['float32', 'bfloat16'], default='float32',
                    help='bfloat16: the whole model and cache in bf16 (torch\'s CPU bf16 kernels)')
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT(a.layers, a.d, a.heads, a.vocab, a.ctx).eval().to(getattr(torch, a.dtype))
    prompt = torch.randint(0, a.vocab, (1, a.prompt), generator=torch.Generator().manual_seed(1))
    decode(model, prompt, 4)  # warm-up
    rates = [decode(model, prompt, a.new)[1] for _ in range(a.reps)]
    params = sum(p.numel() for p in model.parameters())
    print(f"RESULT torch-gpt2-decode L={a.layers} d={a.d} V={a.vocab} params={params} threads={torch.get_num_threads()} "
          f"torch={torch.__version__} dtype={a.dtype} prompt={a.prompt} new={a.new}: decode tokens/s median={statistics.median(rates):.1f} "
          f"best={max(rates):.1f} (n={len(rates)})", flush=True)


if __name__ == '__main__':
    main()
