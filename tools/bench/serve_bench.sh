#!/usr/bin/env bash
# gotron serve benchmarks for docs/serving.md, GPT-2 124M shape (12 layers, d 768, vocab 50304,
# random init: throughput does not depend on the weights), on this machine's cores:
#  1. single-stream decode tokens/s, fp32 and bf16 weights (--bf16), interleaved with PyTorch
#     greedy decoding with a KV cache (tools/bench/gpt2_decode_torch.py, fp32 and bf16) in the
#     same run, and the memory-bandwidth bound (weight bytes read per token / measured memcpy
#     bandwidth, printed by gotron bench serve);
#  2. aggregate tokens/s at 1, 8, 32 and 128 concurrent streaming clients (gotron bench serve),
#     fp32 weights, then bf16, repeated reps times (interleaved).
#
# usage: tools/bench/serve_bench.sh [reps] [new-tokens] [concurrency...]
#        (GOTRON=path uses a built binary; concurrency defaults to 1 8 32 128)
# needs: Debian python3-torch (apt-get install python3-torch libopenblas0-pthread). Uses
# ../shared/bench/prio.sh (own scheduler group, nice -15) when it exists next to the repository.
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-5}
new=${2:-64}
shift $(( $# < 2 ? $# : 2 ))
conc=(1 8 32 128)
[ $# -eq 0 ] || conc=("$@")
prio=()
[ -x ../shared/bench/prio.sh ] && prio=(../shared/bench/prio.sh)
bin=${GOTRON:-/tmp/gotron-serve-bench}
[ -n "${GOTRON:-}" ] || go build -o "$bin" ./cmd/gotron
gotron() { "${prio[@]}" "$bin" "$@"; }
echo "# $(date -u +%FT%TZ) $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), loadavg $(cut -d' ' -f1-3 /proc/loadavg), commit $(git rev-parse --short HEAD)"
for r in $(seq "$reps"); do
  for dt in float32 bfloat16; do
    OMP_NUM_THREADS=2 "${prio[@]}" /usr/bin/python3 tools/bench/gpt2_decode_torch.py --prompt 16 --new "$new" --reps 1 --dtype $dt 2>/dev/null | grep RESULT
  done
  for bf in "" --bf16; do
    gotron bench serve --preset gpt2-small --init-method-std 0.02 --clients 1 --prompt-tokens 16 --max-tokens "$new" \
      --verify=false --bandwidth-bound $bf 2>&1 | grep -E 'bandwidth bound|compute bound|^decode' | sed "s/^/RESULT gotron${bf:+ bf16} rep $r: /"
  done
done
# The machine's speed drifts (other tenants of the host): the concurrency levels are interleaved
# and repeated, so each ratio to one client can be taken within a repetition.
for r in $(seq "$reps"); do
  for bf in "" --bf16; do
    for c in "${conc[@]}"; do
      gotron bench serve --preset gpt2-small --init-method-std 0.02 --clients "$c" --prompt-tokens 16 --max-tokens "$new" \
        --verify=false --timeout 20m $bf 2>&1 | grep -E 'throughput|first token|engine' | sed "s/^/RESULT gotron${bf:+ bf16} rep $r $c clients: /"
    done
  done
done
