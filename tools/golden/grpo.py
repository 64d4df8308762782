#!/usr/bin/python3
"""Golden for gotron's GRPO (rl/grpo.go, rl/countdown.go): Megatron's own functions.

Usage (repository root, Debian's python3-torch 1.13, CPU; needs the Megatron mirror):

    /usr/bin/python3 tools/golden/grpo.py [megatron git dir] [out]
        # defaults /work/.mirror/NVIDIA+Megatron-LM/repo and rl/testdata/grpo_golden.json

Megatron itself cannot be imported here (it needs CUDA, Transformer Engine,
pydantic, ...). The script reads the source of Megatron's files at the mirror's
HEAD (d98e8a6) with `git show` and executes only these functions, unchanged:

  megatron/rl/rl_utils.py       calculate_grpo_advantages, selective_log_softmax,
                                calculate_grpo_loss
  train_rl.py                   loss_func (the per-micro-batch reduction)
  examples/rl/environments/countdown/countdown.py   the whole module (compute_score)

What they call and this machine lacks is stubbed: is_batch_invariant_mode_enabled
(False), log_single_rank (no-op), get_args (calculate_per_token_loss, no NaN/spiky
checks), get_rerun_state_machine (unused with those checks off), and
Tensor.cuda (the identity: loss_func moves CPU tensors to CUDA).

The case: 2 groups of 3 rollouts (one group of equal rewards, one with a
zero-turn placeholder for the advantages), float64 logits (6, 7, 9), clamp eps
0.2/0.28, kl beta 0.05, entropy weight 0.01, inference logprobs with IS
truncation 1.5, two micro-batches of 3. The objective is Megatron's per-token
loss: the micro-batches' loss sums over the global batch's loss tokens; its
gradient with respect to the logits comes from torch.autograd. CI never runs Python.
"""
import ast
import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import torch

torch.set_default_dtype(torch.float64)

GIT = sys.argv[1] if len(sys.argv) > 1 else "/work/.mirror/NVIDIA+Megatron-LM/repo"
OUT = sys.argv[2] if len(sys.argv) > 2 else "rl/testdata/grpo_golden.json"


def source(path):
    return subprocess.run(["git", "-C", GIT, "show", "HEAD:" + path], check=True,
                          capture_output=True, text=True).stdout


def functions(path, names, env):
    """Executes the named top-level functions of path's source in env."""
    tree = ast.parse(source(path))
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = set(names) - {n.name for n in keep}
    assert not missing, f"{path}: no {missing}"
    for n in keep:
        n.decorator_list = []
    exec(compile(ast.Module(body=keep, type_ignores=[]), path, "exec"), env)


torch.Tensor.cuda = lambda self, *a, **k: self
env = {
    "np": np, "torch": torch, "logging": __import__("logging"), "logger": None,
    "Optional": __import__("typing").Optional, "partial": __import__("functools").partial,
    "is_batch_invariant_mode_enabled": lambda: False,
    "log_single_rank": lambda *a, **k: None,
    "get_args": lambda: SimpleNamespace(check_for_nan_in_loss_and_grad=False, check_for_spiky_loss=False),
    "get_rerun_state_machine": lambda: None,
}
functions("megatron/rl/rl_utils.py",
          ["calculate_grpo_advantages", "selective_log_softmax", "calculate_grpo_loss"], env)
functions("train_rl.py", ["loss_func"], env)
countdown = {}
exec(compile(source("examples/rl/environments/countdown/countdown.py"), "countdown.py", "exec"), countdown)

# --- advantages --------------------------------------------------------------
rewards = [[1.0, 0.1, 0.0], [0.1, 0.1, 0.1], [1.0, 0.0, 0.7]]
turns = [[1, 1, 1], [1, 1, 1], [1, 0, 1]]
advantages = env["calculate_grpo_advantages"](rewards, turns)

# --- loss and gradient -------------------------------------------------------
g = torch.Generator().manual_seed(7)
B, S, V = 6, 7, 9
logits = torch.randn(B, S, V, generator=g) * 1.5
tokens = torch.randint(0, V, (B, S), generator=g)
old = (torch.randn(B, S - 1, generator=g) * 0.3 - 2.0)
ref = (torch.randn(B, S - 1, generator=g) * 0.3 - 2.0)
inference = old + torch.randn(B, S - 1, generator=g) * 0.2
# Loss mask over logprob positions (Megatron's loss_mask[:, 1:]): the
# generated tokens of each row; row 4 has none.
mask = torch.zeros(B, S - 1)
for r, (lo, hi) in enumerate([(2, 6), (1, 5), (3, 6), (0, 6), (0, 0), (4, 6)]):
    mask[r, lo:hi] = 1.0
adv = torch.tensor([1.3, -0.4, 0.0, 0.9, -1.1, 0.25])
cfg = dict(clamp_eps_lower=0.2, clamp_eps_upper=0.28, kl_beta=0.05, entropy_weight=0.01,
           is_truncation_coef=1.5)

logits.requires_grad_(True)
current = env["selective_log_softmax"](logits[:, :-1, :], tokens[:, 1:])
loss_sum = torch.zeros(())
total_tokens = 0
per_token = {}
for mb in (slice(0, 3), slice(3, 6)):
    out = env["calculate_grpo_loss"](current_logprobs=current[mb], old_logprobs=old[mb], ref_logprobs=ref[mb],
                                     advantages=adv[mb], inference_logprobs=inference[mb], **cfg)
    loss, kl, ratios, entropy, above, below = out
    for k, v in zip(["loss", "kl", "ratio", "entropy"], [loss, kl, ratios, entropy]):
        per_token.setdefault(k, []).append(v.detach())
    ls, ntok, _ = env["loss_func"](mask[mb], kl, ratios, entropy, above, below, loss)
    loss_sum = loss_sum + ls
    total_tokens += int(ntok)
objective = loss_sum / total_tokens
objective.backward()

# The unpacked loss without IS correction (inference_logprobs None) for the second form.
plain = env["calculate_grpo_loss"](current_logprobs=current.detach(), old_logprobs=old, ref_logprobs=ref,
                                   advantages=adv, clamp_eps_lower=0.2, clamp_eps_upper=0.28,
                                   kl_beta=0.05, entropy_weight=0.01)[0]

# --- countdown reward --------------------------------------------------------
golden = {"target": 24, "nums": [3, 8, 1, 9]}
responses = [
    "Let me think.\n<answer> (9 - 1) * 3 / 8 * 8 </answer>",
    "<answer> 3 * 8 * (9 - 8) </answer>",
    "<answer>(9 - 1) * 3 * 1</answer>",
    "<answer> 8 * 3 * (9 - 1) / 8 </answer>",
    "<answer> 8 * 3 + 9 - 9 </answer>",
    "<answer> 3 * 8 + 1 * 9 - 9 </answer>",
    "<answer> 9 * 8 / 3 * 1 </answer>",
    "<answer> 8*3*1 </answer> then <answer> (9-1)*3 </answer>",
    "<answer> (8 - 9 + 1) * 3 </answer>",
    "<answer> 8 * 3 / (9 - 9 + 1) </answer>",
    "<answer> 3 ** 8 / 9 / 1 </answer>",
    "<answer> 8 // 3 + 9 + 1 </answer>",
    "<answer> 9 + 8 + 3 + 1 </answer>",
    "<answer> 8 * 3 / (1 - 1) + 9 </answer>",
    "<answer> 8 * 3 / (9 - 9) * 1 </answer>",
    "<answer> 8 * 3 * 1 ** 9 </answer>",
    "<answer> 8 * 3 + 1 - 9 </answer>\nsecond line without tags",
    "first line <answer> 8 * 3 * 1 + 9 - 9 </answer>\n",
    "<answer> 8x3 + 1 - 9 </answer>",
    "<answer>   </answer>",
    "no answer at all",
    "<answer> (8 * 3) (1 + 9) </answer>",
    "<answer> 08 * 3 + 1 - 9 </answer>",
    "<answer> 9 - 1 * 3 * 8 </answer>",
    "<answer> 1.0 * 3 * 8 * 9 / 9 </answer>",
    "<answer> 8 * 3 + (1 - 9) </answer> <answer> 24 </answer>",
    "<answer> (1 + 9 / 3) * 8 - 8 </answer>",
    "<Answer> 8 * 3 * 1 </Answer>",
    "<answer> -8 * -3 * 1 * 9 / 9 </answer>",
    "<answer> 9 - (1 - 8) * 3 </answer>",
]
golden2 = {"target": 98, "nums": [44, 19, 35]}
responses2 = ["<answer> 44 + 19 + 35 </answer>", "<answer> 44 - 19 + 35 </answer>",
              "<answer> 35 * 19 / 44 </answer>", "<answer> 19 + 35 + 44</answer>"]
scores = [countdown["compute_score"](r, golden) for r in responses]
scores2 = [countdown["compute_score"](r, golden2) for r in responses2]

# The prompt CountdownAgent.make_prefix writes (the class itself needs pydantic).
agent_src = source("examples/rl/environments/countdown/countdown_agent.py")
tree = ast.parse(agent_src)
cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CountdownAgent")
make_prefix = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "make_prefix")
penv = {}
exec(compile(ast.Module(body=[make_prefix], type_ignores=[]), "countdown_agent.py", "exec"), penv)
prefix = penv["make_prefix"](None, target=98, nums=[44, 19, 35])


def flat(t):
    return [float(x) for x in t.detach().reshape(-1).tolist()]


fixture = {
    "megatron_commit": subprocess.run(["git", "-C", GIT, "rev-parse", "HEAD"], check=True,
                                      capture_output=True, text=True).stdout.strip(),
    "advantages": {"rewards": rewards, "num_turns": turns, "want": advantages},
    "loss": {
        "shape": [B, S, V], "micro_batches": 2, **cfg,
        "logits": flat(logits), "tokens": [int(x) for x in tokens.reshape(-1)],
        "old": flat(old), "ref": flat(ref), "inference": flat(inference), "mask": flat(mask),
        "advantages": flat(adv),
        "want_current": flat(current), "want_loss": flat(torch.cat(per_token["loss"])),
        "want_kl": flat(torch.cat(per_token["kl"])), "want_ratio": flat(torch.cat(per_token["ratio"])),
        "want_entropy": flat(torch.cat(per_token["entropy"])),
        "want_plain_loss": flat(plain),
        "want_objective": float(objective), "want_total_tokens": total_tokens,
        "want_dlogits": flat(logits.grad),
    },
    "countdown": [
        {"target": golden["target"], "nums": golden["nums"], "responses": responses, "want": scores},
        {"target": golden2["target"], "nums": golden2["nums"], "responses": responses2, "want": scores2},
    ],
    "prompt": {"target": 98, "nums": [44, 19, 35], "want": prefix},
}
os.makedirs(os.path.dirname(OUT), exist_ok=True)
with open(OUT, "w") as f:
    json.dump(fixture, f, indent=None, separators=(",", ":"))
    f.write("\n")
print(f"wrote {OUT}: objective {float(objective):.6f}, {total_tokens} tokens, scores {scores}")
