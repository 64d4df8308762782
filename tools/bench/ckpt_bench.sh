#!/usr/bin/env bash
# Checkpoint save and load of GPT-2 124M (12 layers, hidden 768, vocab 50257 → 50304) with its
# Adam state (fp32 params + two moments: 1.49 GB), on the local disk:
#   DP=1: one process (2 threads); DP=2: gotron launch, 2 processes × 1 thread over tcp,
#         with and without the distributed optimizer (each rank writes its own shards)
# For each: the synchronous save time and MB/s (the whole checkpoint / the time from the
# start of the save to the tracker's rename), the load time on --load at the same layout,
# and, with --async-save, the elapsed time of the iteration that pays for the save (the one
# after it: the save runs between two log lines; it copies the shards) and of the two after it
# (the background write goes on) against the median of iterations 2-4, and the same for a
# synchronous save. Rounds are interleaved; the machine's load average is printed.
#
# usage: tools/bench/ckpt_bench.sh [rounds] [dir]   (dir: where checkpoints go; default a temp dir under /var/tmp)
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-2}
base=${2:-$(mktemp -d /var/tmp/gotron-ckpt-bench.XXXXXX)}
bin=/tmp/gotron-ckpt-bench
go build -o "$bin" ./cmd/gotron
trap '[ $? -eq 0 ] && rm -rf "$base" || echo "logs kept in $base" >&2' EXIT
model=(--mock-data --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 128 --max-position-embeddings 1024
  --vocab-size 50257 --micro-batch-size 1 --global-batch-size 2 --lr 1e-4 --lr-decay-style constant --log-interval 1
  --eval-interval 0 --eval-iters 0 --no-progress --attention-dropout 0 --hidden-dropout 0)
run() { # label dp extra...
  local label=$1 dp=$2; shift 2
  local dir="$base/$label" log="$base/$label.log"
  rm -rf "$dir"
  local cmd=("$bin")
  if [ "$dp" -gt 1 ]; then
    cmd+=(launch --nproc-per-node "$dp" --master-port $((20000 + RANDOM % 20000)) --)
    export GOTRON_NUM_THREADS=1
  else
    unset GOTRON_NUM_THREADS
  fi
  "${cmd[@]}" train "${model[@]}" --train-iters 8 --save "$dir" --save-interval 4 "$@" >"$log" 2>&1
  "${cmd[@]}" train "${model[@]}" --train-iters 9 --load "$dir" --save "$dir" --use-checkpoint-opt_param-scheduler "$@" >>"$log" 2>&1
  local bytes
  bytes=$(du -sb "$dir/iter_0000004" | cut -f1)
  python3 - "$log" "$label" "$bytes" <<'PY'
import re, statistics, sys
log, label, total = open(sys.argv[1]).read(), sys.argv[2], int(sys.argv[3])
it = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"iteration +(\d+)/ +8 \|.*?elapsed time per iteration \(ms\): ([0-9.]+)", log)}
save = re.search(r"saved checkpoint at iteration +4 to \S+ in ([0-9.]+) s", log)
bg = re.search(r"saved checkpoint at iteration +4 to \S+ \(in the background: this rank's ([0-9.]+) MB copied in ([0-9.]+) s, written in ([0-9.]+) s", log)
load = re.search(r"loaded checkpoint from \S+ at iteration \d+ .* in ([0-9.]+) s", log)
normal = statistics.median(it[k] for k in (2, 3, 4))
out = "RESULT %-24s checkpoint %.0f MB" % (label, total / 1e6)
if save:
    s = float(save.group(1)); out += " | save %.2f s, %.0f MB/s" % (s, total / 1e6 / s)
if bg:
    out += " | background: this rank's %.0f MB copied in %.2f s, written in %.2f s" % (float(bg.group(1)), float(bg.group(2)), float(bg.group(3)))
out += " | steps 2-4 median %.0f ms; step with the save %.0f ms = %.2fx; the next two %.2fx, %.2fx" % (
    normal, it[5], it[5] / normal, it[6] / normal, it[7] / normal)
if load:
    l = float(load.group(1)); out += " | load %.2f s, %.0f MB/s" % (l, total / 1e6 / l)
print(out)
PY
}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$rounds"); do
  echo "round $r (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  run dp1-sync 1
  run dp1-async 1 --async-save
  run dp2-sync 2
  run dp2-async 2 --async-save
  run dp2-distopt-sync 2 --use-distributed-optimizer
  run dp2-distopt-async 2 --use-distributed-optimizer --async-save
done
