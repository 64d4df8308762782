#!/usr/bin/env bash
# Data-parallel step time on one host: GPT 6 layers, hidden 384, global batch 8 × 256 tokens,
# fp32, vocab 50257, no dropout, interleaved rounds of
#   DP=1: one process, 2 threads (micro-batch 8)
#   DP=2: gotron launch, 2 processes × 1 thread over tcp (micro-batch 4 each), overlap off / on
#   DP=2 with --use-distributed-optimizer (reduce-scatter + all-gather), overlap on
# and prints, per configuration, the median ms/step of iterations 3..N and the median time per
# step spent waiting for the gradient reduction after backward (ddp.SyncWait: what overlap did
# not hide), from the --metrics-file JSONL. Optimizer-state bytes per rank are printed by the run.
#
# usage: tools/bench/dp_step.sh [rounds] [iters]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
iters=${2:-10}
bin=/tmp/gotron-dp-bench
go build -o "$bin" ./cmd/gotron
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=(--mock-data --num-layers 6 --hidden-size 384 --num-attention-heads 6 --seq-length 256 --max-position-embeddings 256
  --global-batch-size 8 --train-iters "$iters" --lr 1e-4 --lr-decay-style constant --openai-gelu --attention-dropout 0
  --hidden-dropout 0 --vocab-size 50257 --make-vocab-size-divisible-by 1 --clip-grad 1 --log-interval 1 --eval-interval 0
  --no-progress)
summarise() { # file label
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
ms = statistics.median(r["elapsed_ms_per_iteration"] for r in rows)
w = [r.get("grad_sync_wait_ms_per_iteration") for r in rows]
wait = "-" if w[0] is None else "%.1f" % statistics.median(w)
print("RESULT %-28s ms/step median=%7.1f  grad-sync wait ms/step=%s  (n=%d)" % (sys.argv[2], ms, wait, len(rows)))
PY
}
port=29611
for r in $(seq "$rounds"); do
  GOTRON_NUM_THREADS=2 "$bin" train "${model[@]}" --micro-batch-size 8 --metrics-file "$tmp/dp1.$r" >/dev/null
  summarise "$tmp/dp1.$r" "DP=1 (2 threads)"
  for mode in "overlap-off" "overlap-on" "distopt-overlap"; do
    extra=()
    case $mode in
      overlap-on) extra=(--overlap-grad-reduce --ddp-bucket-size 4000000) ;;
      distopt-overlap) extra=(--use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 4000000) ;;
    esac
    port=$((port + 1))
    GOTRON_NUM_THREADS=1 "$bin" launch --nproc-per-node 2 --master-port "$port" -- train "${model[@]}" --micro-batch-size 4 \
      --metrics-file "$tmp/dp2.$mode.$r" "${extra[@]}" 2>/dev/null | grep -o 'optimizer state per rank.*' | sed "s/^/# $mode: /" | head -1
    summarise "$tmp/dp2.$mode.$r" "DP=2 tcp $mode"
  done
done
