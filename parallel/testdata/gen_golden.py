#!/usr/bin/env python3
"""Writes megatron_groups.json: rank groups computed by Megatron-LM's own code.

Usage: python3 gen_golden.py /path/to/Megatron-LM/megatron/core/parallel_state.py > megatron_groups.json

The script loads generate_masked_orthogonal_rank_groups, RankGenerator and the
default (position) embedding rank functions from Megatron's parallel_state.py
with the ast module (no torch needed), then builds the groups the way
initialize_model_parallel does, including its checks. Goldens were generated
from Megatron-LM main at commit d98e8a6.
"""
import ast
import json
import sys
from typing import List

WANT = {"generate_masked_orthogonal_rank_groups", "RankGenerator",
        "default_embedding_ranks", "default_position_embedding_ranks"}


def load(path):
    tree = ast.parse(open(path).read())
    body = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in WANT]
    assert {n.name for n in body} == WANT, "parallel_state.py changed"
    ns = {"List": List}
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), ns)
    return ns


def groups(ns, world, tp=1, pp=1, cp=1, ep=1, etp=None, vpp=None, order="tp-cp-ep-dp-pp"):
    """Mirrors initialize_model_parallel (gtp_remat = 1, rank_offset = 0)."""
    if world % (tp * pp * cp):
        raise RuntimeError("world not divisible by tp*pp*cp")
    dp = world // (tp * pp * cp)
    if vpp is not None and not pp > 1:
        raise RuntimeError("vpp needs pp > 1")
    RG = ns["RankGenerator"]
    dec = RG(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
    etp = tp if etp is None else etp
    if world % (etp * ep * pp):
        raise RuntimeError("world not divisible by etp*ep*pp")
    edp = world // (etp * ep * pp)
    exp = RG(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order=order)
    assert order.endswith("pp") or pp == 1 or edp == dp
    assert dec.get_ranks("pp") == exp.get_ranks("pp")
    g = {}
    for kind, tok in [("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"), ("dp-cp", "dp-cp"),
                      ("tp-pp", "tp-pp"), ("tp-dp", "tp-dp"), ("tp-dp-cp", "tp-dp-cp"), ("tp-cp", "tp-cp")]:
        g[kind] = dec.get_ranks(tok)
    for kind, tok in [("ep", "ep"), ("expert-tp", "tp"), ("expert-dp", "dp"), ("tp-ep", "tp-ep"), ("tp-ep-pp", "tp-ep-pp")]:
        g[kind] = exp.get_ranks(tok)
    g["embedding"] = [ns["default_embedding_ranks"](r) for r in g["pp"]]
    g["position-embedding"] = [ns["default_position_embedding_ranks"](r) for r in g["pp"]]
    return g


CASES = [
    dict(world=8, tp=2, pp=2),                                    # TP=2, PP=2 worked example
    dict(world=8, tp=2, pp=2, ep=2, etp=1),                       # its expert example
    dict(world=1),
    dict(world=16, tp=2, cp=2, pp=2),
    dict(world=16, tp=2, pp=2, ep=4, etp=1),
    dict(world=16, tp=4, pp=2, ep=2, etp=2),
    dict(world=16, tp=2, cp=2, pp=2, ep=2, etp=1),
    dict(world=12, tp=2, pp=3),
    dict(world=8, tp=2, pp=2, order="tp-pp-dp"),
    dict(world=16, tp=2, cp=2, pp=2, ep=2, order="tp-cp-ep-pp-dp"),
    dict(world=16, tp=2, pp=2, ep=2, etp=1, order="tp-ep-pp-dp"),
    dict(world=24, tp=2, cp=3, pp=2, ep=3, etp=2, order="dp-pp-cp-ep-tp"),
    dict(world=8, ep=8),
    dict(world=32, tp=2, pp=4, ep=2, etp=4),
    dict(world=8, pp=4, vpp=2),
    dict(world=16, tp=2, pp=2, ep=2, etp=1, order="TP-CP-EP-DP-PP"),
    dict(world=18, tp=3, cp=2, pp=3),
    dict(world=16, tp=2, cp=2, ep=2, order="dp-tp-cp-ep-pp"),
    # rejected by Megatron
    dict(world=12, tp=8),
    dict(world=16, tp=2, cp=2, pp=2, ep=2, order="tp-cp-pp-ep-dp"),
    dict(world=24, tp=2, cp=3, pp=2, order="pp-dp-cp-tp"),
    dict(world=8, ep=3),
    dict(world=16, tp=2, cp=2, order="tp-ep-dp-pp"),
    dict(world=16, tp=2, pp=2, ep=4, etp=2, order="tp-cp-ep-pp-dp"),
    dict(world=16, tp=2, cp=2, pp=2, ep=4, etp=1, order="tp-pp-cp-ep-dp"),
    dict(world=8, vpp=2),
    dict(world=8, tp=2, order="tp-xp-dp"),
]


def main():
    ns = load(sys.argv[1])
    out = []
    for c in CASES:
        rec = {"config": c}
        try:
            rec["groups"] = groups(ns, **c)
        except (RuntimeError, AssertionError, KeyError, ValueError) as e:
            rec["error"] = type(e).__name__
        out.append(rec)
    print("[")
    print(",\n".join(json.dumps(r, separators=(",", ":")) for r in out))
    print("]")


if __name__ == "__main__":
    main()
