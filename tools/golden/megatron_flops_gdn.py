#!/usr/bin/python3
"""Megatron's own FLOPs of the hybrid gated delta net model, for train's
TestFLOPsMatchesMegatronReferenceValues (the gdn-config, gdn-tiny-dense and
gated-attention cases).

Usage: /usr/bin/python3 tools/golden/megatron_flops_gdn.py MEGATRON_DIR   (a Megatron-LM checkout; we used d98e8a6)

Megatron's training.py does not import on this machine's torch 1.13, so the
script takes num_floating_point_operations out of it (ast) and runs it
unchanged, with Megatron's is_gated_delta_net_variant and
is_linear_attention_variant taken the same way from
experimental_attention_variant_module_specs.py and is_hybrid_model False
(a GPT model). CI never runs this script.
"""
import ast
import os
import sys
import types

MEG = sys.argv[1] if len(sys.argv) > 1 else "/tmp/meg"
src = open(os.path.join(MEG, "megatron/training/training.py")).read()
tree = ast.parse(src)
fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "num_floating_point_operations"][0]
mod = ast.Module(body=[fn], type_ignores=[])
spec = open(os.path.join(MEG, "megatron/core/models/gpt/experimental_attention_variant_module_specs.py")).read()
stree = ast.parse(spec)
keep = [n for n in stree.body if (isinstance(n, ast.FunctionDef) and n.name in ("is_gated_delta_net_variant", "is_linear_attention_variant")) or (isinstance(n, ast.Assign) and any(getattr(t, "id", "") in ("GDN_ATTENTION_VARIANTS", "_DEPRECATED_ATTENTION_VARIANT_ALIASES") for t in n.targets))]
from typing import Optional  # noqa: E402
g = {"Optional": Optional}
exec(compile(ast.Module(body=keep, type_ignores=[]), "spec", "exec"), g)
g["is_hybrid_model"] = lambda args: False
exec(compile(mod, "training", "exec"), g)
def args(**kw):
    base = dict(group_query_attention=False, num_query_groups=None, num_experts=None, moe_layer_freq=1, mtp_num_layers=None,
                moe_ffn_hidden_size=None, moe_latent_size=None, moe_shared_expert_intermediate_size=None, moe_router_topk=2,
                swiglu=False, multi_latent_attention=False, attention_output_gate=False, experimental_attention_variant=None,
                linear_attention_freq=None, seq_length=1024)
    base.update(kw)
    return types.SimpleNamespace(**base)
# the gdn configs' model (gpt3_mcore_te_tp2_pp1_gdn): 6 layers, hidden 512, 8 heads, 2 groups, swiglu, 32 experts top-8
a = args(num_layers=6, hidden_size=512, num_attention_heads=8, group_query_attention=True, num_query_groups=2, kv_channels=64,
         ffn_hidden_size=2048, swiglu=True, num_experts=32, moe_ffn_hidden_size=64, moe_shared_expert_intermediate_size=64,
         moe_router_topk=8, attention_output_gate=True, experimental_attention_variant="gated_delta_net", linear_attention_freq=3,
         linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
         padded_vocab_size=50304, seq_length=1024)
print("gdn-config", repr(g["num_floating_point_operations"](a, 32)))
b = args(num_layers=4, hidden_size=32, num_attention_heads=4, group_query_attention=True, num_query_groups=2, kv_channels=8,
         ffn_hidden_size=48, swiglu=True, attention_output_gate=True, experimental_attention_variant="gated_delta_net",
         linear_attention_freq=2, linear_conv_kernel_dim=4, linear_key_head_dim=4, linear_value_head_dim=6,
         linear_num_key_heads=2, linear_num_value_heads=4, padded_vocab_size=64, seq_length=16)
print("gdn-tiny-dense", repr(g["num_floating_point_operations"](b, 8)))
c = args(num_layers=2, hidden_size=64, num_attention_heads=4, kv_channels=16, ffn_hidden_size=256, attention_output_gate=True,
         padded_vocab_size=128, seq_length=32)
print("gated-attention", repr(g["num_floating_point_operations"](c, 4)))
