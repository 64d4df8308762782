#!/usr/bin/python3
"""Golden for gotron's RL sequence packing (rl/pack.go): Megatron's own packer.

Usage (repository root, Debian's python3-torch 1.13, CPU; needs the Megatron mirror):

    /usr/bin/python3 tools/golden/rl_packing.py [megatron git dir] [out] [steps out]
        # defaults /work/.mirror/NVIDIA+Megatron-LM/repo, rl/testdata/packing_golden.json
        # and rl/testdata/packing_steps_golden.json

Megatron cannot be imported here; the script reads megatron/rl/sequence_packing_utils.py
at the mirror's HEAD with `git show` and executes, unchanged, the class SequencePacker
and the functions get_actual_sequence_lengths, create_empty_bins,
distribute_packed_bins and update_microbatch_calculator. Stubbed:
round_up_to_nearest_multiple (megatron.core.utils' one-liner), log_single_rank (no-op),
get_tokenizer (pad id 0), mpu's data-parallel rank and size (set per case), the
PackingInfo dataclass (the file's fields), and the microbatch calculator
(reconfigure_num_microbatches_calculator records the global batch it is given).

Each case is rollouts (rows of --seq-length ids, 0-padded at the end) packed into bins
of the row length with a max sequences per bin, then distributed "fifo" and
"round-robin" over 1, 2 and 3 data-parallel ranks. Recorded: the packer's bins
(sequence indices), starts, position ids and loss masks (generation masks: a
rollout's ids from its prompt length on), and each rank's bins after distribution
(empty bins included), and the attention's document boundaries: each bin's cu_seqlens
(create_packed_seq_params_for_bin) and an empty bin's (get_default_packed_seq_params, which
forward_step uses when a bin has none). The steps file holds update_microbatch_calculator's bins per
rank per iteration (the global batch it reconfigures, over the data-parallel size)
for global batches, rollouts per collection, bins per rank and data-parallel sizes,
among them a float ratio whose product rounds up (9/11 × 77 = 63.00000000000001).
CI never runs Python.
"""
import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

GIT = sys.argv[1] if len(sys.argv) > 1 else "/work/.mirror/NVIDIA+Megatron-LM/repo"
OUT = sys.argv[2] if len(sys.argv) > 2 else "rl/testdata/packing_golden.json"
STEPS_OUT = sys.argv[3] if len(sys.argv) > 3 else "rl/testdata/packing_steps_golden.json"
PATH = "megatron/rl/sequence_packing_utils.py"

src = subprocess.run(["git", "-C", GIT, "show", "HEAD:" + PATH], check=True,
                     capture_output=True, text=True).stdout
tree = ast.parse(src)
names = {"SequencePacker", "get_actual_sequence_lengths", "create_empty_bins", "distribute_packed_bins",
         "update_microbatch_calculator", "create_packed_seq_params_for_bin", "get_default_packed_seq_params"}
keep = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
assert {n.name for n in keep} == names, {n.name for n in keep}


@dataclass
class PackingInfo:
    bin_seq_indices: List[List[int]]
    seq_starts: Dict[int, List[int]]
    seq_lengths: List[int]
    seq_to_bin_idx: List[Optional[int]]
    packing_algo: str


dp = SimpleNamespace(rank=0, size=1)
calc = SimpleNamespace(gbs=None)


def reconfigure(rank, global_batch_size, micro_batch_size, data_parallel_size, decrease_batch_size_if_needed):
    calc.gbs = global_batch_size


class PackedSeqParams:
    """megatron.core.packed_seq_params.PackedSeqParams' fields, as given."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


env = {
    "PackedSeqParams": PackedSeqParams,
    "math": __import__("math"),
    "get_num_microbatches": lambda: 0,
    "reconfigure_num_microbatches_calculator": reconfigure,
    "torch": torch, "np": np, "List": List, "Dict": Dict, "Any": Any, "Tuple": Tuple,
    "Optional": Optional, "PackingInfo": PackingInfo, "logger": None, "logging": __import__("logging"),
    "log_single_rank": lambda *a, **k: None,
    "round_up_to_nearest_multiple": lambda v, m: ((v + m - 1) // m) * m,
    "get_tokenizer": lambda: SimpleNamespace(pad=0),
    "mpu": SimpleNamespace(get_data_parallel_rank=lambda: dp.rank,
                           get_data_parallel_world_size=lambda: dp.size),
}
exec(compile(ast.Module(body=keep, type_ignores=[]), PATH, "exec"), env)
SequencePacker = env["SequencePacker"]
update_microbatch_calculator = env["update_microbatch_calculator"]
create_packed_seq_params_for_bin = env["create_packed_seq_params_for_bin"]
get_default_packed_seq_params = env["get_default_packed_seq_params"]
distribute_packed_bins = env["distribute_packed_bins"]


def case(name, seq, max_per_bin, rollouts):
    """rollouts: (prompt length, total length) pairs; ids are 1 + i*7 + t mod 50."""
    trajs = torch.zeros(len(rollouts), seq, dtype=torch.long)
    gen = torch.zeros(len(rollouts), seq)
    for i, (p, n) in enumerate(rollouts):
        for t in range(n):
            trajs[i, t] = 1 + (i * 7 + t) % 50
        gen[i, p:n] = 1
    packer = SequencePacker(bin_size=seq, pad_token=0, max_sequences_per_bin=max_per_bin)
    packed, pos, mask, info = packer.pack_sequences(trajs, gen)
    info.packing_algo = "fifo"
    out = {"name": name, "seq_length": seq, "max_per_bin": max_per_bin,
           "tokens": trajs.tolist(), "generation_masks": gen.tolist(),
           "bins": info.bin_seq_indices, "seq_lengths": info.seq_lengths,
           "seq_starts": [info.seq_starts[b] for b in range(len(info.bin_seq_indices))],
           "packed_tokens": packed.tolist(), "position_ids": pos.tolist(), "loss_mask": mask.tolist(),
           "fifo": {}}
    # The attention's document boundaries: each bin's cu_seqlens, and the
    # default one forward_step uses for an empty bin (None params).
    out["cu_seqlens"] = [create_packed_seq_params_for_bin(info, b, seq, max_per_bin, "cpu").cu_seqlens_q.tolist()
                         for b in range(len(info.bin_seq_indices))]
    out["empty_cu_seqlens"] = get_default_packed_seq_params(seq, max_per_bin, "cpu").cu_seqlens_q.tolist()
    out["round_robin"] = {}
    for algo, key in (("fifo", "fifo"), ("round-robin", "round_robin")):
        info.packing_algo = algo
        for size in (1, 2, 3):
            ranks = []
            for rank in range(size):
                dp.rank, dp.size = rank, size
                _, _, _, local = distribute_packed_bins(packed, pos, mask, info)
                ranks.append(local.bin_seq_indices)
            out[key][str(size)] = ranks
    return out


cases = [
    case("fits in one bin", 32, 50, [(3, 9), (2, 6), (4, 12)]),
    case("next fit, ties keep order", 16, 50, [(2, 7), (3, 9), (2, 7), (1, 5), (2, 4), (3, 16), (2, 7)]),
    case("max sequences per bin", 24, 2, [(1, 3), (1, 3), (1, 3), (1, 3), (1, 4)]),
]
with open(OUT, "w") as f:
    json.dump(cases, f, separators=(",", ":"))
    f.write("\n")
print(f"wrote {OUT}: {len(cases)} cases")

# update_microbatch_calculator: (global batch, rollouts per collection, bins this rank, dp).
steps = []
for gbs, per_col, bins, size in [(4, 4, 1, 1), (2, 4, 3, 1), (3, 6, 5, 2), (1, 10, 30, 1), (9, 11, 77, 1), (9, 11, 77, 2),
                                 (16, 16, 7, 8), (4, 12, 1, 2), (3, 9, 4, 3), (5, 20, 9, 1)]:
    dp.rank, dp.size = 0, size
    update_microbatch_calculator(gbs / per_col, bins, [[0]] * bins, gbs, 1, False)
    assert calc.gbs % size == 0, (gbs, per_col, bins, size, calc.gbs)
    steps.append({"global_batch": gbs, "rollouts": per_col, "bins_per_rank": bins, "dp": size,
                  "bins_per_step": calc.gbs // size})
with open(STEPS_OUT, "w") as f:
    json.dump(steps, f, separators=(",", ":"))
    f.write("\n")
print(f"wrote {STEPS_OUT}: {len(steps)} cases")
