"""Golden timers blocks from Megatron-LM's own Timers (train.TestTimersGolden).

Runs megatron/core/timers.py and megatron/training/log_handler.py of
NVIDIA/Megatron-LM (d98e8a64dd) unchanged, out of tree, with the logging set-up
of megatron/training/training.py (logging.basicConfig(handlers=[CustomHandler()],
level=logging.INFO)), and prints what Timers.log writes to stdout for fixed
per-rank times. Only what needs a GPU or a process group is replaced:
_get_elapsed_time_all_ranks returns the fixed [world, names] float tensor, and
torch.distributed's get_world_size/get_rank say world 2, rank 1 (the last rank,
which logs). megatron.core.utils (imported for is_torch_min_version) is stubbed.

    M=$(mktemp -d); G=/work/.mirror/NVIDIA+Megatron-LM/repo
    mkdir -p $M/megatron/core $M/megatron/training
    git -C $G show HEAD:megatron/core/timers.py > $M/megatron/core/timers.py
    git -C $G show HEAD:megatron/training/log_handler.py > $M/megatron/training/log_handler.py
    MEGATRON=$M /usr/bin/python3 tools/golden/megatron_timers.py > train/testdata/megatron_timers.golden

Each case is printed as "### <option> <normalizer>" and the block; the cases'
times are in train/timers_test.go (timerGoldenCases), the same numbers.
"""
import logging
import os
import sys
import types

import torch

sys.path.insert(0, os.environ["MEGATRON"])
for name in ("megatron", "megatron.core"):
    mod = types.ModuleType(name)
    mod.__path__ = [os.path.join(os.environ["MEGATRON"], *name.split("."))]
    sys.modules[name] = mod
utils = types.ModuleType("megatron.core.utils")
utils.is_torch_min_version = lambda v: True
sys.modules["megatron.core.utils"] = utils

from megatron.training.log_handler import CustomHandler  # noqa: E402

logging.basicConfig(handlers=[CustomHandler()], level=logging.INFO)

from megatron.core import timers as mtimers  # noqa: E402

torch.distributed.get_world_size = lambda group=None: 2
torch.distributed.get_rank = lambda group=None: 1

NAMES = ["forward-backward", "layernorm-grads-all-reduce", "embedding-grads-all-reduce", "all-grads-sync",
         "optimizer-inner-step", "optimizer", "a-name-longer-than-the-forty-eight-columns-of-dots"]
# seconds, [rank][name]; 0 is a timer the rank did not run
TIMES = [[1.2345678, 0.0, 0.0, 0.0123456, 0.5, 0.75, 2.0],
         [1.3, 0.0, 0.004321, 0.0125, 0.49999, 0.8125, 0.0]]
CASES = [("minmax", 1.0), ("max", 1.0), ("all", 1.0), ("minmax", 10.0), ("max", 3.0), ("all", 7.0)]

for option, normalizer in CASES:
    t = mtimers.Timers(2, option)
    t._get_elapsed_time_all_ranks = lambda names, reset, barrier: torch.tensor(TIMES, dtype=torch.float)
    print("### %s %g" % (option, normalizer), flush=True)
    t.log(NAMES, normalizer=normalizer)
    sys.stdout.flush()
# No rank timed anything: Megatron prints nothing.
t = mtimers.Timers(2, "minmax")
t._get_elapsed_time_all_ranks = lambda names, reset, barrier: torch.zeros((2, 2), dtype=torch.float)
print("### minmax-empty 1", flush=True)
t.log(["forward-backward", "optimizer"])
sys.stdout.flush()
