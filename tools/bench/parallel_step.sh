#!/usr/bin/env bash
# Data- and tensor-parallel step time on one host: GPT 6 layers, hidden 384, global batch
# 8 × 256 tokens, fp32, vocab 50257, no dropout, interleaved rounds of
#   DP=1: one process, 2 threads (micro-batch 8)
#   DP=2: gotron launch, 2 processes × 1 thread over tcp (micro-batch 4 each), overlap off / on
#   DP=2 with --use-distributed-optimizer (reduce-scatter + all-gather), overlap on
#   TP=2: gotron launch --inproc (2 goroutine ranks sharing the process's 2 kernel threads, 1 each),
#         and over tcp (2 processes × 1 thread); with --sequence-parallel on inproc
#   PP=2: gotron launch, 2 processes × 1 thread over tcp, 1F1B over 8 micro-batches of 1
# and prints, per configuration, the median ms/step of iterations 3..N, the median time per
# step spent waiting for the gradient reduction after backward (ddp.SyncWait: what overlap did
# not hide) and in tensor-parallel collectives, from the --metrics-file JSONL.
# Optimizer-state bytes per rank are printed by the run.
#
# usage: tools/bench/parallel_step.sh [rounds] [iters] [modes...]
#   modes: dp1 dp2-overlap-off dp2-overlap-on dp2-distopt-overlap tp2-inproc tp2-tcp tp2-sp-inproc pp2-tcp (default all)
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
iters=${2:-10}
shift $(( $# > 2 ? 2 : $# ))
modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(dp1 dp2-overlap-off dp2-overlap-on dp2-distopt-overlap tp2-inproc tp2-tcp tp2-sp-inproc pp2-tcp)
bin=/tmp/gotron-parallel-bench
go build -o "$bin" ./cmd/gotron
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=(--mock-data --num-layers 6 --hidden-size 384 --num-attention-heads 6 --seq-length 256 --max-position-embeddings 256
  --global-batch-size 8 --train-iters "$iters" --lr 1e-4 --lr-decay-style constant --openai-gelu --attention-dropout 0
  --hidden-dropout 0 --vocab-size 50257 --make-vocab-size-divisible-by 1 --clip-grad 1 --log-interval 1 --eval-iters 0
  --no-progress)
summarise() { # file label
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
ms = statistics.median(r["elapsed_ms_per_iteration"] for r in rows)
def med(key):
    v = [r.get(key) for r in rows]
    return "-" if v[0] is None else "%.1f" % statistics.median(v)
print("RESULT %-26s ms/step median=%7.1f  grad-sync wait ms/step=%s  TP comm ms/step=%s  (n=%d)" % (
    sys.argv[2], ms, med("grad_sync_wait_ms_per_iteration"), med("tp_comm_ms_per_iteration"), len(rows)))
PY
}
port=29611
for r in $(seq "$rounds"); do
  for mode in "${modes[@]}"; do
    port=$((port + 1))
    out="$tmp/$mode.$r"
    case $mode in
      dp1) GOTRON_NUM_THREADS=2 "$bin" train "${model[@]}" --micro-batch-size 8 --metrics-file "$out" >/dev/null ;;
      dp2-*)
        extra=()
        case $mode in
          dp2-overlap-on) extra=(--overlap-grad-reduce --ddp-bucket-size 4000000) ;;
          dp2-distopt-overlap) extra=(--use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 4000000) ;;
        esac
        GOTRON_NUM_THREADS=1 "$bin" launch --nproc-per-node 2 --master-port "$port" -- train "${model[@]}" --micro-batch-size 4 \
          --metrics-file "$out" "${extra[@]}" 2>/dev/null | grep -o 'optimizer state per rank.*' | sed "s/^/# $mode: /" | head -1 ;;
      tp2-inproc|tp2-sp-inproc)
        extra=()
        [ $mode = tp2-sp-inproc ] && extra=(--sequence-parallel)
        GOTRON_NUM_THREADS=2 "$bin" launch --inproc --nproc-per-node 2 -- train "${model[@]}" --micro-batch-size 8 \
          --tensor-model-parallel-size 2 --metrics-file "$out" "${extra[@]}" >/dev/null 2>&1 ;;
      pp2-tcp)
        GOTRON_NUM_THREADS=1 "$bin" launch --nproc-per-node 2 --master-port "$port" -- train "${model[@]}" --micro-batch-size 1 \
          --pipeline-model-parallel-size 2 --metrics-file "$out" >/dev/null 2>&1 ;;
      tp2-tcp)
        GOTRON_NUM_THREADS=1 "$bin" launch --nproc-per-node 2 --master-port "$port" -- train "${model[@]}" --micro-batch-size 8 \
          --tensor-model-parallel-size 2 --metrics-file "$out" >/dev/null 2>&1 ;;
    esac
    summarise "$out" "$mode"
  done
done
