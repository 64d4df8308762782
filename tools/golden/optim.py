#!/usr/bin/python3
"""Write the PyTorch golden fixture for gotron's optim package.

Usage (from the repository root, Debian's python3-torch 1.13, CPU):

    /usr/bin/python3 tools/golden/optim.py [out.json]

out defaults to optim/testdata/torch_adamw.json. CI never runs this script;
optim/golden_test.go reads the committed file.

What it runs, 3 iterations on small seeded float32 params and grads:
  * torch.nn.utils.clip_grad_norm_(params, 1.0) (grads of the first two
    iterations are large enough to be clipped, the third is not);
  * torch.optim.AdamW, betas (0.9, 0.95), eps 1e-8, two param groups:
    "decay" (weight_decay 0.1) and "no_decay" (weight_decay 0: a bias and a
    1-D norm weight, Megatron's rule);
  * torch.optim.lr_scheduler.LambdaLR whose lambda is Megatron's
    cosine-with-warmup formula in iteration units: lr_warmup_init 1e-3,
    lr 1e-2, min_lr 1e-3, warmup 1, decay 4 (so the LRs are 1e-3, 1e-2, ...);
  * separately, torch.optim.SGD (momentum 0.9, weight_decay 0.1 coupled) on
    the same initial params and unclipped grads, lr 0.05.

JSON: {"params": [{"name", "shape", "no_weight_decay", "data"}],
       "steps": [{"grads": {name: [...]}, "norm", "lr",
                  "adamw": {name: [...]}, "sgd": {name: [...]}}],
       "exp_avg": {...}, "exp_avg_sq": {...}, "momentum_buffer": {...},
       plus the hyperparameters}. Values are float32 written as exact decimals.
"""
import json
import math
import sys

import torch

INIT_LR, MAX_LR, MIN_LR, WARMUP, DECAY = 1e-3, 1e-2, 1e-3, 1, 4
BETAS, EPS, WD, CLIP = (0.9, 0.95), 1e-8, 0.1, 1.0
SGD_LR, SGD_MOMENTUM = 0.05, 0.9


def megatron_cosine(n):
    """Megatron's get_lr (cosine, linear warmup from INIT_LR) at n steps."""
    if WARMUP > 0 and n <= WARMUP:
        return INIT_LR + (MAX_LR - INIT_LR) * float(n) / float(WARMUP)
    if n > DECAY:
        return MIN_LR
    ratio = float(n - WARMUP) / float(DECAY - WARMUP)
    return MIN_LR + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (MAX_LR - MIN_LR)


def f32list(t):
    return [float(x) for x in t.detach().reshape(-1).tolist()]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "optim/testdata/torch_adamw.json"
    g = torch.Generator().manual_seed(1234)
    specs = [("decoder.linear.weight", [4, 3], False),
             ("decoder.linear.bias", [3], True),
             ("decoder.norm.weight", [5], True)]
    init = {n: torch.randn(s, generator=g, dtype=torch.float32) for n, s, _ in specs}
    scales = [3.0, 2.0, 0.05]  # first two iterations clip, the third does not
    grads = [{n: scales[k] * torch.randn(s, generator=g, dtype=torch.float32) for n, s, _ in specs}
             for k in range(3)]

    params = {n: torch.nn.Parameter(init[n].clone()) for n, _, _ in specs}
    decay = [params[n] for n, _, nwd in specs if not nwd]
    no_decay = [params[n] for n, _, nwd in specs if nwd]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=MAX_LR, betas=BETAS, eps=EPS)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda n: megatron_cosine(n) / MAX_LR)

    sgd_params = {n: torch.nn.Parameter(init[n].clone()) for n, _, _ in specs}
    sgd = torch.optim.SGD([{"params": [sgd_params[n] for n, _, nwd in specs if not nwd], "weight_decay": WD},
                           {"params": [sgd_params[n] for n, _, nwd in specs if nwd], "weight_decay": 0.0}],
                          lr=SGD_LR, momentum=SGD_MOMENTUM)

    steps = []
    for k in range(3):
        for n, _, _ in specs:
            params[n].grad = grads[k][n].clone()
            sgd_params[n].grad = grads[k][n].clone()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), CLIP)
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        sgd.step()
        steps.append({
            "grads": {n: f32list(grads[k][n]) for n, _, _ in specs},
            "norm": float(norm),
            "lr": lr,
            "adamw": {n: f32list(params[n]) for n, _, _ in specs},
            "sgd": {n: f32list(sgd_params[n]) for n, _, _ in specs},
        })

    doc = {
        "torch_version": torch.__version__,
        "betas": list(BETAS), "eps": EPS, "weight_decay": WD, "clip_grad": CLIP,
        "schedule": {"lr_warmup_init": INIT_LR, "lr": MAX_LR, "min_lr": MIN_LR,
                     "warmup_steps": WARMUP, "decay_steps": DECAY, "style": "cosine"},
        "sgd_lr": SGD_LR, "sgd_momentum": SGD_MOMENTUM,
        "params": [{"name": n, "shape": s, "no_weight_decay": nwd, "data": f32list(init[n])}
                   for n, s, nwd in specs],
        "steps": steps,
        "exp_avg": {n: f32list(opt.state[params[n]]["exp_avg"]) for n, _, _ in specs},
        "exp_avg_sq": {n: f32list(opt.state[params[n]]["exp_avg_sq"]) for n, _, _ in specs},
        "momentum_buffer": {n: f32list(sgd.state[sgd_params[n]]["momentum_buffer"]) for n, _, _ in specs},
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
