#!/usr/bin/python3
"""Write golden microbatch tables by running Megatron-LM's own calculators.

Usage (from the repository root; plain python3, no torch needed):

    M=/path/to/Megatron-LM
    git -C $M show d98e8a6:megatron/core/num_microbatches_calculator.py > /tmp/nmc_head.py
    git -C $M show core_v0.17.0:megatron/core/num_microbatches_calculator.py > /tmp/nmc_017.py
    /usr/bin/python3 tools/golden/optim_microbatch.py /tmp/nmc_head.py /tmp/nmc_017.py [out.json]

out defaults to optim/testdata/megatron_microbatches.json. CI never runs this.

Each case builds a calculator (HEAD for constant and step schedules,
core_v0.17 for --rampup-batch-size), then records, for a list of consumed
sample counts, [consumed, current GBS, running GBS, num microbatches]
(update with consistency_check=False), and train_iters for a few
--train-samples values using training.update_train_iters' loops (copied
below from HEAD and core_v0.17).
"""
import json
import sys
import types


def load(path, name):
    mod = types.ModuleType(name)
    exec(compile(open(path).read(), path, "exec"), mod.__dict__)
    return mod


head = load(sys.argv[1], "nmc_head")
v017 = load(sys.argv[2], "nmc_017")
out = sys.argv[3] if len(sys.argv) > 3 else "optim/testdata/megatron_microbatches.json"


def train_iters_head(calc, train_samples, gbs, step):
    # training.update_train_iters at HEAD.
    if not step:
        return train_samples // gbs
    iterations, consumed = 0, 0
    while consumed < train_samples:
        calc.update(consumed, consistency_check=False)
        consumed += calc.get_current_global_batch_size()
        iterations += 1
    calc.update(0, consistency_check=False)
    return iterations


def train_iters_017(calc, train_samples, gbs, rampup):
    # training.update_train_iters at core_v0.17.0.
    if rampup is None:
        return train_samples // gbs
    iterations, consumed = 0, 0
    while consumed <= int(rampup[2]) and consumed <= train_samples:
        calc.update(consumed, consistency_check=False)
        consumed += calc.get_current_global_batch_size()
        iterations += 1
    calc.update(0, consistency_check=False)
    if train_samples > consumed:
        iterations += (train_samples - consumed) // gbs
    return iterations


CONSUMED = [0, 1, 31, 32, 100, 333, 334, 352, 666, 667, 999, 1000, 1001, 1056, 2047, 2048, 4096,
            10000, 61035155, 61035156, 10**12]
TRAIN = [1, 500, 1000, 3000, 12345]

cases = [
    # name, kind, kwargs
    ("constant", "head", dict(global_batch_size=128, micro_batch_size=4, data_parallel_size=2)),
    ("constant_decrease", "head", dict(global_batch_size=32, micro_batch_size=8, data_parallel_size=3,
                                       decrease_batch_size_if_needed=True)),
    ("step_samples", "head", dict(micro_batch_size=2, data_parallel_size=2,
                                  step_batch_size_schedule="0:8, 1K:16 2.5k:32 4096:64")),
    ("step_tokens", "head", dict(micro_batch_size=4, data_parallel_size=8,
                                 step_batch_size_schedule="0:768 250B:1536 500B:3072 750B:6144",
                                 seq_length=4096)),
    ("rampup_spec", "017", dict(global_batch_size=128, micro_batch_size=4, data_parallel_size=2,
                                rampup_batch_size=[32, 32, 1000])),
    ("rampup_uneven", "017", dict(global_batch_size=100, micro_batch_size=2, data_parallel_size=2,
                                  rampup_batch_size=[4, 16, 2000])),
    ("rampup_decrease", "017", dict(global_batch_size=64, micro_batch_size=4, data_parallel_size=4,
                                    rampup_batch_size=[24, 8, 500], decrease_batch_size_if_needed=True)),
]

doc = {"cases": []}
for name, kind, kw in cases:
    args = dict(decrease_batch_size_if_needed=False)
    args.update(kw)
    if kind == "head":
        calc = head._build_num_microbatches_calculator(
            0, args.get("global_batch_size"), args["micro_batch_size"], args["data_parallel_size"],
            args["decrease_batch_size_if_needed"], args.get("step_batch_size_schedule"), args.get("seq_length"))
    else:
        calc = v017._build_num_microbatches_calculator(
            0, args.get("rampup_batch_size"), args["global_batch_size"], args["micro_batch_size"],
            args["data_parallel_size"], args["decrease_batch_size_if_needed"])
    pts = []
    for c in CONSUMED:
        calc.update(c, consistency_check=False)
        pts.append([c, calc.get_current_global_batch_size(), calc.get_current_running_global_batch_size(), calc.get()])
    iters = []
    for ts in TRAIN:
        if kind == "head":
            n = train_iters_head(calc, ts, args.get("global_batch_size"), args.get("step_batch_size_schedule"))
        else:
            n = train_iters_017(calc, ts, args["global_batch_size"], args.get("rampup_batch_size"))
        iters.append([ts, n])
    doc["cases"].append({"name": name, "args": args, "points": pts, "train_iters": iters})

with open(out, "w") as f:
    json.dump(doc, f)
    f.write("\n")
