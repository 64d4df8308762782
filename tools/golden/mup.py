#!/usr/bin/python3
"""Goldens for gotron's muP (--use-mup) from Megatron-LM's own code.

Usage (repository root; Debian's python3-torch 1.13, CPU; G is a Megatron-LM
git directory, e.g. /work/.mirror/NVIDIA+Megatron-LM/repo):

    /usr/bin/python3 tools/golden/mup.py $G [commit] > model/gpt/testdata/mup_golden.json

Megatron's modules import far too much to load out of tree, so the script
takes the exact source of the pieces muP is made of and runs it:

- the muP block of TransformerConfig.__post_init__ (from "# MuP (Maximal
  Update Parameterization) configuration" to the end of the
  output_layer_init_method block), executed with `self` a namespace holding
  the config's fields and megatron/core/utils.py's init_method_normal,
  scaled_init_method_normal and mup_scaled_init_method_normal (their own
  source): width multiplier, softmax_scale, mup_output_mult, and the std of
  every init method (read from the functools.partial they return);
- get_mup_config_overrides of megatron/core/optimizer/__init__.py, with
  ParamKey / ParamWithNamePredicate as plain records and logging stubbed:
  its predicates are applied to meta tensors named and shaped as gotron's
  parameters, marked is_embedding_parameter as
  LanguageModule.setup_embeddings_and_output_layer marks them (every
  embedding parameter, and an untied output layer), to give each parameter
  its max_lr, min_lr and eps (absent: the optimizer's defaults).

Output JSON: {"megatron_commit", "cases": [{"name", "config", "optimizer",
"width_mult", "softmax_scale", "mup_output_mult", "mup_embedding_mult",
"init_std": {"embedding", "hidden", "output_proj", "output_layer" (null
when tied)},
"params": {name: {"max_lr", "min_lr", "eps"}}}]}; floats are Python
reprs, exact. CI never runs this script.
"""
import ast
import functools
import json
import math
import subprocess
import sys
import textwrap
import types
import warnings

import torch

G = sys.argv[1]
COMMIT = sys.argv[2] if len(sys.argv) > 2 else "HEAD"


def show(path):
    return subprocess.run(["git", "-C", G, "show", f"{COMMIT}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def function_source(src, name):
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(src, node)
    raise KeyError(name)


commit = subprocess.run(["git", "-C", G, "rev-parse", COMMIT], check=True, capture_output=True, text=True).stdout.strip()

# megatron/core/utils.py's init methods, their own source.
utils_src = show("megatron/core/utils.py")
env = {"functools": functools, "math": math, "torch": torch, "warnings": warnings}
for fn in ("init_method_normal", "scaled_init_method_normal", "mup_scaled_init_method_normal"):
    exec(function_source(utils_src, fn), env)

# The muP block of TransformerConfig.__post_init__.
tc_src = show("megatron/core/transformer/transformer_config.py")
lines = tc_src.splitlines()
start = next(i for i, l in enumerate(lines) if "# MuP (Maximal Update Parameterization) configuration" in l)
end = next(i for i in range(start, len(lines)) if "if self.num_moe_experts is not None and self.add_bias_linear" in lines[i])
MUP_BLOCK = textwrap.dedent("\n".join(lines[start:end]))


def post_init(**kw):
    self = types.SimpleNamespace(
        use_mup=True, mup_base_hidden_size=None, mup_width_mult=1.0, mup_embedding_mult=1.0, mup_output_mult=1.0,
        mup_base_head_dim=None, mup_attn_scale_power=1.0, softmax_scale=None, init_method=None,
        output_layer_init_method=None, embedding_init_method=None, embedding_init_method_std=None,
        init_method_std=0.02, is_hybrid_model=False)
    for k, v in kw.items():
        setattr(self, k, v)
    exec(MUP_BLOCK, dict(env), {"self": self})
    return self


# get_mup_config_overrides, its own source.
opt_src = show("megatron/core/optimizer/__init__.py")
ParamKey = lambda with_name_predicate: with_name_predicate  # noqa: E731
ParamWithNamePredicate = lambda name, fn: (name, fn)  # noqa: E731
opt_env = {"torch": torch, "Dict": dict, "ParamKey": ParamKey, "ParamWithNamePredicate": ParamWithNamePredicate,
           "ParamGroupOverride": dict, "OptimizerConfig": object, "logging": __import__("logging"), "logger": None,
           "log_single_rank": lambda *a, **k: None, "is_managed_by_layer_wise_optimizer": lambda p: False}
exec(function_source(opt_src, "get_mup_config_overrides"), opt_env)
get_mup_config_overrides = opt_env["get_mup_config_overrides"]


def gotron_params(c):
    """gotron's parameter names and shapes for a dense GPT (LayerNorm, biases, learned positions)."""
    h, L, ffn, v, s = c["hidden_size"], c["num_layers"], 4 * c["hidden_size"], c["vocab"], c["max_position_embeddings"]
    d = c["kv_channels"]
    qkv = c["num_attention_heads"] * d * 3
    ps = [("embedding.word_embeddings.weight", (v, h)), ("embedding.position_embeddings.weight", (s, h))]
    for i in range(L):
        p = f"decoder.layers.{i}."
        ps += [(p + "input_layernorm.weight", (h,)), (p + "input_layernorm.bias", (h,)),
               (p + "self_attention.linear_qkv.weight", (qkv, h)), (p + "self_attention.linear_qkv.bias", (qkv,)),
               (p + "self_attention.linear_proj.weight", (h, c["num_attention_heads"] * d)),
               (p + "self_attention.linear_proj.bias", (h,)),
               (p + "pre_mlp_layernorm.weight", (h,)), (p + "pre_mlp_layernorm.bias", (h,)),
               (p + "mlp.linear_fc1.weight", (ffn, h)), (p + "mlp.linear_fc1.bias", (ffn,)),
               (p + "mlp.linear_fc2.weight", (h, ffn)), (p + "mlp.linear_fc2.bias", (h,))]
    ps += [("decoder.final_layernorm.weight", (h,)), ("decoder.final_layernorm.bias", (h,))]
    if c["untie"]:
        ps.append(("output_layer.weight", (v, h)))
    out = []
    for name, shape in ps:
        t = torch.nn.Parameter(torch.empty(*shape, device="meta"))
        # LanguageModule.setup_embeddings_and_output_layer under use_mup
        if name.startswith("embedding.") or name == "output_layer.weight":
            t.is_embedding_parameter = True
        if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
            t.is_embedding_or_output_parameter = True
        out.append((name, t))
    return out


def std_of(init):
    assert isinstance(init, functools.partial) and init.func is torch.nn.init.normal_
    return init.keywords["std"]


CASES = [
    # tests/functional_tests/test_cases/gpt/gpt3_mcore_te_tp1_pp1_mup (Adam, tied, m = 2)
    ("gpt3_mcore_te_tp1_pp1_mup",
     dict(num_layers=12, hidden_size=512, num_attention_heads=8, kv_channels=64, vocab=1024, max_position_embeddings=1024,
          untie=False, mup_base_hidden_size=256),
     dict(optimizer="adam", lr=0.00015, min_lr=1.0e-5, adam_eps=1e-8, decoupled_lr=None)),
    # m = 3, untied, base head dim and a half power, output mult set
    ("untied_m3_headdim",
     dict(num_layers=2, hidden_size=96, num_attention_heads=4, kv_channels=24, vocab=64, max_position_embeddings=16,
          untie=True, mup_base_hidden_size=32, mup_base_head_dim=16.0, mup_attn_scale_power=0.5, mup_output_mult=0.25,
          mup_embedding_mult=2.5, init_method_std=0.05),
     dict(optimizer="adam", lr=3e-3, min_lr=3e-4, adam_eps=1e-6, decoupled_lr=None)),
    ("untied_m3_decoupled",
     dict(num_layers=2, hidden_size=96, num_attention_heads=4, kv_channels=24, vocab=64, max_position_embeddings=16,
          untie=True, mup_base_hidden_size=32),
     dict(optimizer="adam", lr=3e-3, min_lr=3e-4, adam_eps=1e-8, decoupled_lr=0.5)),
    ("untied_m3_sgd",
     dict(num_layers=2, hidden_size=96, num_attention_heads=4, kv_channels=24, vocab=64, max_position_embeddings=16,
          untie=True, mup_base_hidden_size=32),
     dict(optimizer="sgd", lr=3e-3, min_lr=3e-4, adam_eps=1e-8, decoupled_lr=None)),
    ("tied_m1", dict(num_layers=2, hidden_size=32, num_attention_heads=4, kv_channels=8, vocab=64,
                     max_position_embeddings=16, untie=False, mup_base_hidden_size=32),
     dict(optimizer="adam", lr=3e-3, min_lr=3e-4, adam_eps=1e-8, decoupled_lr=None)),
]

doc = {"megatron_commit": commit, "cases": []}
for name, c, o in CASES:
    tc_fields = {k: v for k, v in c.items() if k not in ("vocab", "max_position_embeddings", "untie")}
    cfg = post_init(**tc_fields)
    oc = types.SimpleNamespace(lr=o["lr"], min_lr=o["min_lr"], adam_eps=o["adam_eps"], decoupled_lr=o["decoupled_lr"])
    overrides = get_mup_config_overrides(oc, cfg.mup_width_mult, o["optimizer"])
    params = {}
    for pname, p in gotron_params(c):
        got = {}
        for (_, fn), ov in overrides.items():
            if fn(p, pname):
                got.update(ov)
        params[pname] = got
    doc["cases"].append({
        "name": name, "config": c, "optimizer": o,
        "width_mult": cfg.mup_width_mult, "softmax_scale": cfg.softmax_scale,
        "mup_output_mult": cfg.mup_output_mult, "mup_embedding_mult": cfg.mup_embedding_mult,
        "init_std": {"embedding": std_of(cfg.embedding_init_method), "hidden": std_of(cfg.init_method),
                     "output_proj": std_of(cfg.output_layer_init_method),
                     # GPTModel: an untied output layer takes embedding_init_method under muP
                     "output_layer": std_of(cfg.embedding_init_method) if c["untie"] else None},
        "params": params})
json.dump(doc, sys.stdout, indent=1)
print()
