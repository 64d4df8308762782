"""Golden pipeline layer splits from Megatron-LM's own functions
(model/gpt.TestPipelineSplitAccountedGolden).

Loads get_num_layers_to_build (megatron/core/transformer/transformer_block.py),
get_transformer_layer_offset (megatron/core/transformer/transformer_layer.py)
and is_vp_first_stage / is_vp_last_stage (megatron/core/pipeline_parallel/utils.py)
of NVIDIA/Megatron-LM (d98e8a64dd) with the ast module, unchanged (no torch
needed), and prints, for each case, every (pipeline rank, virtual stage)'s
[layer offset, layers to build] as JSON. The config is a plain object with the
TransformerConfig fields those functions read.

    G=/work/.mirror/NVIDIA+Megatron-LM/repo; M=$(mktemp -d)
    for f in transformer/transformer_block.py transformer/transformer_layer.py pipeline_parallel/utils.py; do
      mkdir -p $M/$(dirname $f); git -C $G show HEAD:megatron/core/$f > $M/$f; done
    MEGATRON_CORE=$M /usr/bin/python3 tools/golden/megatron_pipeline_split.py > model/gpt/testdata/megatron_pipeline_split.json
"""
import ast
import json
import os
import types
from typing import Optional

ROOT = os.environ["MEGATRON_CORE"]


def load(path, names, ns):
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in body} == set(names), path + " changed"
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), ns)


ns = {"Optional": Optional, "TransformerConfig": object, "LayerType": None, "parallel_state": None}
load("pipeline_parallel/utils.py", ["is_vp_first_stage", "is_vp_last_stage"], ns)
load("transformer/transformer_block.py", ["get_num_layers_to_build"], ns)
load("transformer/transformer_layer.py", ["get_transformer_layer_offset"], ns)
# get_transformer_layer_offset imports is_vp_first_stage from this module.
utils = types.ModuleType("megatron.core.pipeline_parallel.utils")
utils.is_vp_first_stage, utils.is_vp_last_stage = ns["is_vp_first_stage"], ns["is_vp_last_stage"]
import sys
for name in ("megatron", "megatron.core", "megatron.core.pipeline_parallel"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["megatron.core.pipeline_parallel.utils"] = utils

CASES = [  # num_layers, pp, vpp, account embedding, account loss
    (6, 4, 2, True, True),  # gpt3_mcore_te_tp1_pp4_vp2_account_for_embedding_loss_in_pipeline_split
    (6, 2, None, True, True),
    (7, 2, None, True, False),
    (7, 2, None, False, True),
    (14, 4, 2, True, True),
    (15, 4, 2, True, False),
    (11, 4, 3, False, True),
    (2, 2, None, True, True),
    (3, 1, None, True, True),
    (8, 1, None, True, False),
    (22, 4, 3, True, True),
]

out = []
for n, pp, vpp, emb, loss in CASES:
    cfg = types.SimpleNamespace(
        num_layers=n, pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp,
        pipeline_model_parallel_layout=None, num_layers_in_first_pipeline_stage=None,
        num_layers_in_last_pipeline_stage=None, account_for_embedding_in_pipeline_split=emb,
        account_for_loss_in_pipeline_split=loss)
    stages = []
    for r in range(pp):
        row = []
        for c in range(vpp or 1):
            vp = c if vpp else None
            row.append([ns["get_transformer_layer_offset"](cfg, vp_stage=vp, pp_rank=r),
                        ns["get_num_layers_to_build"](cfg, vp_stage=vp, pp_rank=r)])
        stages.append(row)
    out.append({"num_layers": n, "pp": pp, "vpp": vpp or 0, "account_embedding": emb, "account_loss": loss, "stages": stages})
print(json.dumps(out, indent=None).replace('}, {', '},\n{'))
