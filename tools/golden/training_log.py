"""Golden log lines from Megatron-LM's training_log (train.TestLogLineGolden).

The formatting statements below are copied from training_log in
megatron/training/training.py of NVIDIA/Megatron-LM at d98e8a64dd, for the
fields gotron prints; only the inputs are replaced: a fixed datetime for
datetime.now(), and each case's values for args, the loss dict and the
optimizer's results. Run from the repository root:

    python3 tools/golden/training_log.py > train/testdata/training_log_golden.json
"""
import json
from datetime import datetime
from types import SimpleNamespace

CASES = [
    # name, args, values
    dict(name="fp32", log_throughput=False, iteration=4, train_iters=6, consumed=32, elapsed_ms=3602.1,
         throughput=0.028, lr=5e-4, batch=8, loss=10.88147, loss_scale=1.0, grad_norm=0.737, params_norm=None,
         skipped=0, nan=0),
    dict(name="throughput and params norm", log_throughput=True, iteration=100, train_iters=500000, consumed=51200,
         elapsed_ms=1234.56, throughput=123.456, lr=1.5e-4, batch=512, loss=2.345678901, loss_scale=1.0,
         grad_norm=0.2, params_norm=2345.6789, skipped=0, nan=0),
    dict(name="fp16 skipped: no loss, no grad norm", log_throughput=False, iteration=1, train_iters=10, consumed=16,
         elapsed_ms=812.0, throughput=1.0, lr=0.0, batch=16, loss=None, loss_scale=2147483648.0, grad_norm=None,
         params_norm=None, skipped=1, nan=0),
    dict(name="nan average is left out", log_throughput=True, iteration=20, train_iters=20, consumed=320,
         elapsed_ms=0.05, throughput=2.25, lr=1e-300, batch=16, loss=float("nan"), loss_scale=65536.0,
         grad_norm=float("inf"), params_norm=0.0005, skipped=3, nan=2),
    dict(name="wide numbers and half-way rounding", log_throughput=True, iteration=123456789, train_iters=999999999,
         consumed=123456789012, elapsed_ms=2.25, throughput=0.25, lr=1.0000005, batch=123456, loss=1e100,
         loss_scale=0.5, grad_norm=1.0005, params_norm=1e20, skipped=1000, nan=12),
]

NOW = datetime(2026, 11, 28, 5, 40, 1, 234567)


def training_log_line(c):
    args = SimpleNamespace(train_iters=c["train_iters"], consumed_train_samples=c["consumed"],
                           skipped_train_samples=0, log_throughput=c["log_throughput"], log_energy=False,
                           num_experts=None, perform_rl_step=False)
    iteration, batch_size, learning_rate = c["iteration"], c["batch"], c["lr"]
    throughput, loss_scale, grad_norm, params_norm = c["throughput"], c["loss_scale"], c["grad_norm"], c["params_norm"]
    elapsed_time_per_iteration = c["elapsed_ms"] / 1000.0
    advanced_iters_key, skipped_iters_key, nan_iters_key = 'advanced iterations', 'skipped iterations', 'nan iterations'
    total_loss_dict = {advanced_iters_key: 0 if c["loss"] is None else 1,
                       skipped_iters_key: c["skipped"], nan_iters_key: c["nan"]}
    if c["loss"] is not None:
        total_loss_dict['lm loss'] = c["loss"]
    num_zeros_in_grad = None
    # --- from training_log ---
    log_string = f" [{NOW.strftime('%Y-%m-%d %H:%M:%S.%f')}]"
    log_string += ' iteration {:8d}/{:8d} |'.format(iteration, args.train_iters)
    log_string += ' consumed samples: {:12d} |'.format(args.consumed_train_samples)
    if args.skipped_train_samples > 0:
        log_string += ' skipped samples: {:12d} |'.format(args.skipped_train_samples)
    log_string += ' elapsed time per iteration (ms): {:.1f} |'.format(
        elapsed_time_per_iteration * 1000.0
    )
    if args.log_throughput:
        log_string += f' throughput per GPU (TFLOP/s/GPU): {throughput:.1f} |'
    if learning_rate is not None:
        log_string += f' learning rate: {learning_rate:.6E} |'
    log_string += f' global batch size: {batch_size:5d} |'
    for key in total_loss_dict:
        if key not in [advanced_iters_key, skipped_iters_key, nan_iters_key]:
            avg = total_loss_dict[key] / float(
                max(1, total_loss_dict[advanced_iters_key])
            )
            if avg >= 0.0:
                log_string += ' {}: {:.6E} |'.format(key, avg)
    log_string += f' loss scale: {loss_scale:.1f} |'
    if grad_norm is not None:
        log_string += f' grad norm: {grad_norm:.3f} |'
    if num_zeros_in_grad is not None:
        log_string += f' num zeros: {num_zeros_in_grad} |'
    if params_norm is not None:
        log_string += f' params norm: {params_norm:.3f} |'
    log_string += ' number of skipped iterations: {:3d} |'.format(
        total_loss_dict[skipped_iters_key]
    )
    log_string += ' number of nan iterations: {:3d} |'.format(total_loss_dict[nan_iters_key])
    # --- end ---
    return log_string


def jsonable(v):
    if isinstance(v, float) and v != v:
        return "nan"
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    return v


out = []
for c in CASES:
    out.append(dict({k: jsonable(v) for k, v in c.items()}, line=training_log_line(c)))
print(json.dumps({"time": NOW.isoformat(), "cases": out}, indent=1))
