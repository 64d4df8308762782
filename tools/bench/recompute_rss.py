#!/usr/bin/python3
"""PyTorch side of tools/bench/recompute_rss.sh: peak RSS of GPT-2 training steps
with activation recomputation none / selective / full, as gotron's flags mean them.

  none       every activation kept for backward
  selective  the attention core (scores, mask, softmax, probs @ v) recomputed in
             backward: Megatron's --recompute-activations
  full       every transformer layer recomputed from its input: Megatron's
             --recompute-granularity full --recompute-method uniform --recompute-num-layers 1

Model as gotron's GPT-2 (and nanoGPT's): pre-LN, GELU(tanh), learned positions, tied
embedding and output layer, biases, no dropout, fp32, AdamW. torch 1.13 has no fused
attention, so the attention core is written out (it materialises the (B, H, T, T) scores).
Recomputation uses torch.utils.checkpoint (use_reentrant=False).

usage: OMP_NUM_THREADS=2 /usr/bin/python3 tools/bench/recompute_rss.py --mode selective --B 4 --T 1024
Prints one line per step and a RESULT line with VmHWM (peak RSS) from /proc/self/status.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def core_attention(q, k, v):
    """(B, H, T, D) q, k, v -> (B, H, T, D): causal softmax(q k^T / sqrt(D)) v."""
    T = q.size(-2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (B, H, T, T)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    att = F.softmax(att.masked_fill(mask, float('-inf')), dim=-1)
    return att @ v


class Layer(nn.Module):
    def __init__(self, d, heads, selective):
        super().__init__()
        self.heads, self.selective = heads, selective
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if self.selective:
            y = checkpoint(core_attention, q, k, v, use_reentrant=False)
        else:
            y = core_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate='tanh'))


class GPT(nn.Module):
    def __init__(self, layers, d, heads, vocab, ctx, mode):
        super().__init__()
        self.full = mode == 'full'
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.layers = nn.ModuleList([Layer(d, heads, mode == 'selective') for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        for n, p in self.named_parameters():
            if n.endswith('bias'):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.full else layer(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied output layer, (B, T, V)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def vm_hwm_kib():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            return int(line.split()[1])
    return -1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--mode', choices=['none', 'selective', 'full'], default='none')
    ap.add_argument('--layers', type=int, default=12)
    ap.add_argument('--d', type=int, default=768)
    ap.add_argument('--heads', type=int, default=12)
    ap.add_argument('--vocab', type=int, default=50257)
    ap.add_argument('--B', type=int, default=4)
    ap.add_argument('--T', type=int, default=1024)
    ap.add_argument('--steps', type=int, default=2)
    ap.add_argument('--threads', type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT(a.layers, a.d, a.heads, a.vocab, a.T, a.mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    params = sum(p.numel() for p in model.parameters())
    print(f"# torch {torch.__version__} mode={a.mode} L={a.layers} d={a.d} B={a.B} T={a.T} params={params} "
          f"rss after init {vm_hwm_kib() / 2**20:.2f} GiB", flush=True)
    g = torch.Generator().manual_seed(1)
    for s in range(a.steps):
        data = torch.randint(0, a.vocab, (a.B, a.T + 1), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        opt.step()
        print(f"step {s}: loss {loss.item():.4f} {time.perf_counter() - t0:.1f} s peak RSS so far "
              f"{vm_hwm_kib() / 2**20:.2f} GiB", flush=True)
    print(f"RESULT torch mode={a.mode} B={a.B} T={a.T} steps={a.steps} VmHWM_KiB={vm_hwm_kib()}", flush=True)


if __name__ == '__main__':
    main()
