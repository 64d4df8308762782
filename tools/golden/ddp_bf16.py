#!/usr/bin/python3
"""Golden for --grad-reduce-in-bf16 (parallel/ddp TestReduceInBF16Golden).

Usage (repository root, Debian's python3-torch 1.13, CPU):

    /usr/bin/python3 tools/golden/ddp_bf16.py   # writes parallel/ddp/testdata/bf16_reduce.json

Megatron with --bf16 --grad-reduce-in-bf16 keeps main_grad in bfloat16: each
micro-batch's gradient accumulates into it, the bucket is pre-scaled by
1/DP in bfloat16 and reduced as bfloat16. This computes the rule gotron
states (parallel/ddp Config.ReduceInBF16), with torch's bfloat16 as the
rounding reference:

  acc   = bf16(g1)                         after micro-batch 1
  acc   = bf16(float(acc) + g2)            after micro-batch 2 (added in float32)
  sent  = bf16(float(acc) * (1/DP))        the pre-scale, in bfloat16
  out   = bf16(sum over ranks, in float32, in rank order, of float(sent))

The inputs are float32 values spread over several binades, with some
exactly half-way between bfloat16 neighbours (ties round to even).
"""
import json
import torch

torch.manual_seed(7)
DP, N = 2, 96
g = (torch.randn(DP, 2, N) * torch.logspace(-3, 2, N)).float()
# half-way cases: 1 + 2^-8 and 3 + 3*2^-8 lie between bfloat16 neighbours
g[0, 0, :4] = torch.tensor([1 + 2**-8, 3 + 3 * 2**-8, -(1 + 2**-8), 2**-20 * (1 + 2**-8)])
g[1, 0, :4] = torch.tensor([2**-9, 2**-7, 1.0, 0.0])
out = torch.zeros(N, dtype=torch.float32)
sent = []
for r in range(DP):
    acc = g[r, 0].bfloat16()
    acc = (acc.float() + g[r, 1]).bfloat16()
    sent.append((acc.float() * (1.0 / DP)).bfloat16())
s = torch.zeros(N, dtype=torch.float32)
for r in range(DP):
    s = s + sent[r].float()
out = s.bfloat16().float()
json.dump({"dp": DP, "grads": g.tolist(), "reduced": out.tolist()},
          open("parallel/ddp/testdata/bf16_reduce.json", "w"))
