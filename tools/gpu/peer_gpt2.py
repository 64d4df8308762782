#!/usr/bin/env python3
"""PyTorch peer for gotron's CUDA training benchmark (tools/gpu/check.sh bench).

GPT-2 small as nanoGPT writes it (pre-LN, GELU-tanh, learned positions, tied
embeddings, biases, no dropout), trained on random tokens on one GPU; the
timed region per step is zero_grad + forward + loss + backward + AdamW, the
region gotron's iteration time covers. Prints one line per precision:
tokens/s, ms/step and peak memory.

usage: python3 peer_gpt2.py --B 8 --T 1024 --steps 10 [--precision bf16,fp32]
"""
import argparse
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
        self.c_fc, self.c_fc_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.c_fc_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate='tanh'))


class GPT(nn.Module):
    def __init__(self, L, d, h, vocab, ctx):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(L))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--layers', type=int, default=12)
    ap.add_argument('--d', type=int, default=768)
    ap.add_argument('--heads', type=int, default=12)
    ap.add_argument('--vocab', type=int, default=50304)
    ap.add_argument('--B', type=int, default=8)
    ap.add_argument('--T', type=int, default=1024)
    ap.add_argument('--steps', type=int, default=10)
    ap.add_argument('--precision', default='bf16,fp32')
    a = ap.parse_args()
    dev = 'cuda'
    for prec in a.precision.split(','):
        torch.manual_seed(0)
        m = GPT(a.layers, a.d, a.heads, a.vocab, a.T).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
        x = torch.randint(0, a.vocab, (a.B, a.T), device=dev)
        y = torch.randint(0, a.vocab, (a.B, a.T), device=dev)
        torch.cuda.reset_peak_memory_stats()
        times = []
        for i in range(a.steps + 3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast('cuda', dtype=torch.bfloat16, enabled=(prec == 'bf16')):
                loss = m(x, y)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(time.perf_counter() - t)
        times.sort()
        med = times[len(times) // 2]
        print(f'pytorch {torch.__version__} {prec}: B{a.B} T{a.T} {a.B * a.T / med:,.0f} tokens/s, '
              f'{med * 1e3:.1f} ms/step (median of {len(times)}), peak memory '
              f'{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, loss {loss.item():.3f}', flush=True)
        del m, opt


if __name__ == '__main__':
    main()
