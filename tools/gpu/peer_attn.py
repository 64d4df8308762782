#!/usr/bin/env python3
"""PyTorch peer for gotron's attention benchmark (tools/gpu/check.sh bench).

Causal scaled-dot-product attention forward plus backward in bf16 through
torch.nn.functional.scaled_dot_product_attention (PyTorch picks its flash
kernel on an H100/H200), at the shapes of tensor/backendtest's
BenchmarkCUDAAttention, with the same FLOP count (FlashAttention's: forward
4*B*H*T^2*D, backward 2.5 times that, halved for the causal mask). Prints
one line per shape: ms per forward+backward and TFLOP/s.

usage: python3 peer_attn.py [--reps 20]
"""
import argparse
import time

import torch
import torch.nn.functional as F

SHAPES = [(8, 1024, 12, 64), (2, 4096, 12, 64), (4, 1024, 16, 128), (1, 4096, 16, 128)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--reps', type=int, default=20)
    a = p.parse_args()
    dev = torch.device('cuda')
    for B, T, H, D in SHAPES:
        q, k, v = (torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dout = torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16)

        def step():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(dout)

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(a.reps):
            step()
        torch.cuda.synchronize()
        per = (time.perf_counter() - start) / a.reps
        flops = 3.5 * 4 * B * H * D * T * T / 2
        print(f'pytorch {torch.__version__} sdpa bf16 causal B{B} T{T} H{H} D{D}: '
              f'{per * 1e3:.3f} ms/fwd+bwd, {flops / per / 1e12:.1f} TFLOP/s')


if __name__ == '__main__':
    main()
