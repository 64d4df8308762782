#!/usr/bin/python3
"""Write golden LR/WD tables by running Megatron-LM's own OptimizerParamScheduler.

Usage (from the repository root; needs python3-torch and a Megatron-LM checkout
or a copy of its megatron/core/optimizer_param_scheduler.py):

    git -C MEGATRON show d98e8a6:megatron/core/optimizer_param_scheduler.py > /tmp/ops.py
    /usr/bin/python3 tools/golden/optim_sched.py /tmp/ops.py [out.json]

out defaults to optim/testdata/megatron_scheduler.json. The module is loaded
from source with its one megatron import (log_single_rank) replaced by a
no-op, so nothing else of Megatron is needed. CI never runs this script.

For every case it builds the scheduler (which calls step(0)), then steps it
by the differences between consecutive sample counts and records the lr of
two param groups (the default, and one with max_lr/min_lr overrides as
--decoupled-lr makes) and the weight decay of a group with wd_mult 1.
JSON: {"cases": [{"name", "args": {constructor kwargs}, "points":
[[num_steps, lr, lr_decoupled, wd], ...]}]}; floats are Python reprs, exact.
"""
import json
import sys
import types

src_path = sys.argv[1]
out = sys.argv[2] if len(sys.argv) > 2 else "optim/testdata/megatron_scheduler.json"

src = open(src_path).read()
src = src.replace("from megatron.core.utils import log_single_rank",
                  "def log_single_rank(*a, **k):\n    pass")
mod = types.ModuleType("optimizer_param_scheduler")
exec(compile(src, src_path, "exec"), mod.__dict__)
Sched = mod.OptimizerParamScheduler

DECOUPLED = {"max_lr": 5e-4, "min_lr": 1e-5}


class FakeOptimizer:
    def __init__(self):
        self.param_groups = [{"wd_mult": 1.0}, dict(DECOUPLED, wd_mult=0.0)]


def base(**kw):
    a = dict(init_lr=0.0, max_lr=3e-4, min_lr=3e-5, lr_warmup_steps=100, lr_decay_steps=1000,
             lr_decay_style="linear", start_wd=0.01, end_wd=0.01, wd_incr_steps=1000,
             wd_incr_style="constant", use_checkpoint_opt_param_scheduler=False,
             override_opt_param_scheduler=False, wsd_decay_steps=None, lr_wsd_decay_style=None)
    a.update(kw)
    return a


POINTS = [0, 1, 2, 37, 38, 50, 99, 100, 101, 250, 550, 799, 800, 801, 900, 950, 999, 1000, 1001, 5000]

cases = []
for style in ["constant", "linear", "cosine", "inverse-square-root"]:
    cases.append((style + "_w100", base(lr_decay_style=style)))
    cases.append((style + "_w0", base(lr_decay_style=style, lr_warmup_steps=0)))
    # --lr-warmup-fraction 0.0375 over 1000 samples: a fractional warmup.
    cases.append((style + "_wfrac", base(lr_decay_style=style, lr_warmup_steps=0.0375 * 1000, init_lr=1e-5)))
for wsd in ["exponential", "linear", "cosine", "minus_sqrt"]:
    cases.append(("wsd_" + wsd, base(lr_decay_style="WSD", wsd_decay_steps=200, lr_wsd_decay_style=wsd)))
cases.append(("wsd_long_anneal", base(lr_decay_style="WSD", wsd_decay_steps=950, lr_wsd_decay_style="cosine")))
cases.append(("wd_linear", base(start_wd=0.0, end_wd=0.1, wd_incr_style="linear")))
cases.append(("wd_cosine", base(lr_decay_style="cosine", start_wd=0.0, end_wd=0.1, wd_incr_style="cosine")))
cases.append(("wd_cosine_from_0.02", base(start_wd=0.02, end_wd=0.1, wd_incr_style="cosine", wd_incr_steps=777)))
# Iteration-based run: train_iters 250, GBS 4, lr_warmup_iters 25, lr_decay_iters 240.
cases.append(("iters_gbs4", base(lr_decay_style="cosine", lr_warmup_steps=25 * 4, lr_decay_steps=240 * 4,
                                 wd_incr_steps=250 * 4, start_wd=0.0, end_wd=0.05, wd_incr_style="linear")))

doc = {"source": src_path, "decoupled_group": DECOUPLED, "cases": []}
for name, args in cases:
    s = Sched(FakeOptimizer(), **args)
    pts, cur = [], 0
    for n in POINTS:
        s.step(n - cur)
        cur = n
        g = s.optimizer.param_groups
        pts.append([n, g[0]["lr"], g[1]["lr"], g[0]["weight_decay"]])
    doc["cases"].append({"name": name, "args": args, "points": pts})

with open(out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
