#!/usr/bin/env python3
"""Writes distopt_instance_groups.json: Megatron-LM's distributed-optimizer
instance groups (--num-distributed-optimizer-instances), computed by its own code.

Usage: python3 gen_distopt_golden.py /path/to/Megatron-LM/megatron/core/parallel_state.py > distopt_instance_groups.json

Loads RankGenerator, generate_masked_orthogonal_rank_groups and
create_hierarchical_groups from Megatron's parallel_state.py with the ast
module (no torch), with create_group returning its ranks and einops.rearrange
given by a numpy stand-in for the one pattern Megatron uses
("(l s u) -> (l u) s": reshape to (l, s, u), swap the last two axes, flatten
the first two). Then, as initialize_model_parallel: the intra-instance group
is ranks_with_cp[i*size:(i+1)*size] of each dp-cp group, and the
inter-instance group is level 1 of create_hierarchical_groups over each
expert-data-parallel group with sizes [expert DP / instances, instances], and
level 0 the experts' intra-instance group.
Goldens were generated from Megatron-LM main at commit d98e8a6.
"""
import ast
import json
import sys
import types
from typing import List

import numpy as np

WANT = {"generate_masked_orthogonal_rank_groups", "RankGenerator", "create_hierarchical_groups"}


def rearrange(a, pattern, l, s, u):
    assert pattern == "(l s u) -> (l u) s", pattern
    return np.asarray(a).reshape(l, s, u).transpose(0, 2, 1).reshape(l * u, s)


def load(path):
    tree = ast.parse(open(path).read())
    body = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in WANT]
    assert {n.name for n in body} == WANT, "parallel_state.py changed"
    ns = {"List": List, "np": np, "HAVE_EINOPS": True, "einops": types.SimpleNamespace(rearrange=rearrange),
          "create_group": lambda ranks, **kw: list(ranks)}
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), ns)
    return ns


def groups(ns, world, tp=1, pp=1, cp=1, ep=1, etp=None, n=1, order="tp-cp-ep-dp-pp"):
    dp = world // (tp * pp * cp)
    etp = tp if etp is None else etp
    edp = world // (etp * ep * pp)
    RG = ns["RankGenerator"]
    dec = RG(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
    exp = RG(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order=order)
    assert (dp * cp) % n == 0 and edp % n == 0
    size = dp * cp // n
    intra, inter, intra_expert = {}, {}, {}
    for ranks_with_cp in dec.get_ranks("dp-cp"):
        for i in range(n):
            g = ranks_with_cp[i * size:(i + 1) * size]
            for r in g:
                intra[r] = g
    for ranks in exp.get_ranks("dp"):
        for r in ranks:
            hg, _ = ns["create_hierarchical_groups"](r, ranks, [edp // n, n])
            intra_expert[r], inter[r] = hg[0], hg[1]
    return {"intra": [intra[r] for r in range(world)], "inter": [inter[r] for r in range(world)],
            "intra_expert": [intra_expert[r] for r in range(world)]}


CASES = [
    dict(world=8, tp=2, n=2),                  # gpt3_mcore_te_tp2_pp1_multi_dist_optimizer_instances
    dict(world=8, n=4),
    dict(world=16, tp=2, pp=2, n=2),
    dict(world=16, tp=2, cp=2, n=2),
    dict(world=16, tp=2, cp=2, pp=2, n=2),
    dict(world=12, n=3),
    dict(world=16, pp=2, n=2, order="tp-cp-ep-pp-dp"),
    dict(world=8, ep=2, n=2),                  # MoE: expert instances
    dict(world=16, tp=2, ep=2, etp=1, n=2),
]

if __name__ == "__main__":
    ns = load(sys.argv[1])
    out = []
    for c in CASES:
        cfg = {k: v for k, v in c.items()}
        out.append({"config": cfg, "groups": groups(ns, **c)})
    print("[\n" + ",\n".join(json.dumps(o, separators=(",", ":")) for o in out) + "\n]")
