#!/usr/bin/env bash
# Peak RSS of GPT-2 124M training steps with activation recomputation none / selective / full,
# gotron against PyTorch (tools/bench/recompute_rss.py), one process at a time (the machine's
# memory is the limit being measured). fp32, no dropout, vocabulary 50257 unpadded, AdamW;
# gotron runs on --mock-data, PyTorch on random tokens (the data does not change the memory).
#
#   selective: --recompute-activations (the attention core)
#   full:      --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
#
# usage: tools/bench/recompute_rss.sh [B] [T] [steps]     (defaults 4 1024 2)
# Peak RSS is /usr/bin/time's "Maximum resident set size" for gotron and /proc/self/status
# VmHWM for PyTorch (the same kernel counter; the interpreter's own ~0.3 GiB is included).
# Times are printed too, but on a shared machine only the RSS is meaningful.
# needs: Debian python3-torch at /usr/bin/python3, GNU time at /usr/bin/time.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-4}
T=${2:-1024}
steps=${3:-2}
bin=$(mktemp -d)/gotron
go build -o "$bin" ./cmd/gotron
declare -A flags=(
  [none]=""
  [selective]="--recompute-activations"
  [full]="--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
)
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 2^20}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "# GPT-2 124M (12 layers, hidden 768, 12 heads, vocab 50257), B=$B T=$T, $steps training steps"
for mode in none selective full; do
  # shellcheck disable=SC2086 # the recompute flags are words
  out=$(/usr/bin/time -v "$bin" train --mock-data --num-layers 12 --hidden-size 768 --num-attention-heads 12 \
    --seq-length "$T" --max-position-embeddings "$T" --micro-batch-size "$B" --global-batch-size "$B" \
    --train-iters "$steps" --lr 1e-4 --lr-decay-style constant --openai-gelu --attention-dropout 0 --hidden-dropout 0 \
    --vocab-size 50257 --make-vocab-size-divisible-by 1 --clip-grad 0 --log-interval 1 --eval-iters 0 \
    --no-progress ${flags[$mode]} 2>&1)
  kib=$(awk -F': ' '/Maximum resident set size/ { print $2 }' <<<"$out")
  ms=$(awk -F'|' '/ iteration / { split($3, f, ":"); t = f[2] } END { print t + 0 }' <<<"$out")
  theory=$(grep -o 'activation=[0-9.]* MB' <<<"$out" | head -1)
  printf 'RESULT gotron mode=%s B=%s T=%s peak_rss_GiB=%.2f last_iteration_ms=%s theoretical_%s\n' \
    "$mode" "$B" "$T" "$(bc -l <<<"$kib / 2^20")" "$ms" "$theory"
  out=$(OMP_NUM_THREADS=2 /usr/bin/python3 tools/bench/recompute_rss.py --mode "$mode" --B "$B" --T "$T" --steps "$steps")
  kib=$(grep -o 'VmHWM_KiB=[0-9]*' <<<"$out" | cut -d= -f2)
  last=$(grep '^step' <<<"$out" | tail -1 | awk '{ print $5 * 1000 }')
  printf 'RESULT torch  mode=%s B=%s T=%s peak_rss_GiB=%.2f last_iteration_ms=%s\n' \
    "$mode" "$B" "$T" "$(bc -l <<<"$kib / 2^20")" "$last"
done
