#!/usr/bin/env bash
# Side-by-side GPT-2 training-step throughput: gotron vs PyTorch (../shared/bench/gpt2_torch.py),
# same machine, same run, interleaved, fp32, same model shape (pre-LN, GELU-tanh, tied
# embeddings, biases, no dropout, vocab 50257 unpadded). Timed region: forward + loss + backward
# + AdamW step (gotron also computes the gradient norm).
#
# usage: tools/bench/gpt2_side_by_side.sh [reps] [steps]
# BF16=1 adds a gotron --bf16 run per repetition (bf16 matmul operands, fp32 accumulation and
# master weights): not the fp32 comparison the issue asks for, reported on its own line.
# needs: Debian python3-torch; ../shared/bench next to the repository.
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
steps=${2:-6}
bench=../shared/bench
go build -o /tmp/gotron-bench ./cmd/gotron
shapes=("12 768 12 4 256" "6 384 6 8 256")
for shape in "${shapes[@]}"; do
  read -r L D H B T <<<"$shape"
  for r in $(seq "$reps"); do
    OMP_NUM_THREADS=2 "$bench/prio.sh" /usr/bin/python3 "$bench/gpt2_torch.py" --layers "$L" --d "$D" --heads "$H" \
      --B "$B" --T "$T" --steps "$steps" --warmup 2 2>/dev/null | grep RESULT
    for prec in fp32 ${BF16:+bf16}; do
      extra=()
      [ "$prec" = bf16 ] && extra=(--bf16)
      "$bench/prio.sh" /tmp/gotron-bench train --mock-data --num-layers "$L" --hidden-size "$D" --num-attention-heads "$H" \
        --seq-length "$T" --max-position-embeddings 1024 --micro-batch-size "$B" --train-iters $((steps + 2)) \
        --lr 1e-4 --lr-decay-style constant --openai-gelu --attention-dropout 0 --hidden-dropout 0 --vocab-size 50257 \
        --make-vocab-size-divisible-by 1 --clip-grad 0 --log-interval 1 --eval-iters 0 --no-progress "${extra[@]}" 2>/dev/null |
        awk -F'|' '/iteration/ { split($1, it, " "); split(it[4], p, "/"); if (p[1] + 0 > 2) { match($3, /[0-9.]+/); print substr($3, RSTART, RLENGTH) } }' |
        sort -n | awk -v L="$L" -v D="$D" -v B="$B" -v T="$T" -v P="$prec" '{ ms[++k] = $1 } END {
            med = (k % 2) ? ms[(k + 1) / 2] : (ms[k / 2] + ms[k / 2 + 1]) / 2
            name = (P == "fp32") ? "gotron-gpt2" : "gotron-gpt2-bf16"
            printf "RESULT %s L=%s d=%s B=%s T=%s: ms/step median=%.1f min=%.1f tokens/s(median)=%.1f (n=%d)\n", name, L, D, B, T, med, ms[1], B * T * 1000 / med, k
          }'
    done
  done
done
