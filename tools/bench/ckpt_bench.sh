#!/usr/bin/env bash
# Checkpoint save and load of GPT-2 124M (12 layers, hidden 768, vocab 50257 → 50304) with its
# Adam state (fp32 params + two moments: 1.49 GB), on the local disk:
#   DP=1: one process (2 threads); DP=2: gotron launch, 2 processes × 1 thread over tcp,
#         with and without the distributed optimizer (each rank writes its own shards)
# For each layout:
#   - synchronous: 8 iterations saving at 4; the save time and MB/s (the whole checkpoint / the
#     time from the start of the save to the tracker's rename), and the elapsed time of the
#     iteration that pays for the save (iteration 5: the save runs between two log lines)
#     against the median of iterations 2-4;
#   - --async-save: 24 iterations saving in the background at 6, 12 and 18 (24, the last, is
#     synchronous); for each of those saves the elapsed time of the iteration that pays for it
#     (the one after: it copies the shards) and of the two after it (the background write goes
#     on) against the median of the three iterations before the save;
#   - the load time on --load at the same layout (a second run, one iteration further).
# The machine is shared and its step times drift, so every measured step is printed with what
# else took the CPUs meanwhile: "steal" (CPU time the hypervisor gave elsewhere, in CPUs: the
# host's side of the virtual disk's I/O shows here) and "others" (other processes' CPU time, in
# CPUs). Rounds are interleaved; the load average is printed.
#
# usage: tools/bench/ckpt_bench.sh [rounds] [dir]   (dir: where checkpoints go; default a temp dir under /var/tmp)
#        CKPT_BENCH_ONLY="dp1-async dp1-sync" limits the runs to those labels.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-2}
base=${2:-$(mktemp -d /var/tmp/gotron-ckpt-bench.XXXXXX)}
mkdir -p "$base"
bin=/tmp/gotron-ckpt-bench
go build -o "$bin" ./cmd/gotron
trap 'rc=$?; kill $(jobs -p) 2>/dev/null || true; [ $rc -eq 0 ] && rm -rf "$base" || echo "logs kept in $base" >&2' EXIT
model=(--mock-data --num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 128 --max-position-embeddings 1024
  --vocab-size 50257 --micro-batch-size 1 --global-batch-size 2 --lr 1e-4 --lr-decay-style constant --log-interval 1
  --eval-iters 0 --no-progress --attention-dropout 0 --hidden-dropout 0)

# sampler: every 0.1 s, the time, the machine's steal jiffies and the jiffies of processes other
# than $bin's, the sampler's and kernel threads.
cat >"$base/sampler.py" <<'PY'
import os, sys, time
bin, out = os.path.realpath(sys.argv[1]), open(sys.argv[2], "w")
me = os.getpid()
while True:
    steal = int(open("/proc/stat").readline().split()[8])
    others = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            f = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()
            if int(f[6]) & 0x00200000:  # kernel thread
                continue
        except OSError:
            continue
        try:
            if os.path.realpath("/proc/%s/exe" % pid) == bin:
                continue
        except OSError:
            pass
        others += int(f[11]) + int(f[12])
    out.write("%.3f %d %d\n" % (time.time(), steal, others))
    out.flush()
    time.sleep(0.1)
PY
# stamp: prefixes every line with the time it was read.
stamp=(python3 -u -c 'import sys, time
for l in sys.stdin: print("%.3f %s" % (time.time(), l), end="", flush=True)')

run() { # label dp iters save-interval extra...
  local label=$1 dp=$2 iters=$3 interval=$4; shift 4
  if [ -n "${CKPT_BENCH_ONLY:-}" ] && [[ " $CKPT_BENCH_ONLY " != *" $label "* ]]; then return; fi
  local dir="$base/$label" log="$base/$label.log" samples="$base/$label.samples"
  rm -rf "$dir"
  local cmd=("$bin")
  if [ "$dp" -gt 1 ]; then
    cmd+=(launch --nproc-per-node "$dp" --master-port $((20000 + RANDOM % 20000)) --)
    export GOTRON_NUM_THREADS=1
  else
    unset GOTRON_NUM_THREADS
  fi
  python3 "$base/sampler.py" "$bin" "$samples" &
  local sampler=$!
  "${cmd[@]}" train "${model[@]}" --train-iters "$iters" --save "$dir" --save-interval "$interval" "$@" 2>&1 | "${stamp[@]}" >"$log"
  "${cmd[@]}" train "${model[@]}" --train-iters $((iters + 1)) --load "$dir" --save "$dir" --use-checkpoint-opt_param-scheduler "$@" 2>&1 | "${stamp[@]}" >>"$log"
  kill "$sampler"
  local bytes
  bytes=$(du -sb "$dir/iter_$(printf %07d "$interval")" | cut -f1)
  python3 - "$log" "$samples" "$label" "$bytes" "$iters" "$interval" <<'PY'
import os, re, statistics, sys
log, samples, label, total, iters, interval = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
hz = os.sysconf("SC_CLK_TCK")
smp = [tuple(map(float, l.split())) for l in open(samples) if len(l.split()) == 3]
it = {}  # iteration -> (end time, elapsed s), first run only
for m in re.finditer(r"^([0-9.]+) .*?iteration +(\d+)/ +%d \|.*?elapsed time per iteration \(ms\): ([0-9.]+)" % iters, log, re.M):
    it.setdefault(int(m.group(2)), (float(m.group(1)), float(m.group(3)) / 1e3))
def busy(k):  # steal and others' CPU (in CPUs) during iteration k
    t1, dt = it[k]
    a = min(smp, key=lambda s: abs(s[0] - (t1 - dt))); b = min(smp, key=lambda s: abs(s[0] - t1))
    if b[0] - a[0] < 0.05:
        return "?"
    return "steal %.2f, others %.2f" % ((b[1] - a[1]) / hz / (b[0] - a[0]), max(0, b[2] - a[2]) / hz / (b[0] - a[0]))
out = "RESULT %-18s checkpoint %.0f MB" % (label, total / 1e6)
save = re.search(r"successfully saved checkpoint from iteration +%d to \S+ \[[^]]*\] \(in ([0-9.]+) s" % interval, log)
if save:
    s = float(save.group(1)); out += " | save %.2f s, %.0f MB/s" % (s, total / 1e6 / s)
load = re.search(r"successfully loaded checkpoint from \S+ \[[^]]*\] at iteration \d+ .* in ([0-9.]+) s\)", log)
if load:
    l = float(load.group(1)); out += " | load %.2f s, %.0f MB/s" % (l, total / 1e6 / l)
print(out)
print("    every step (ms): " + " ".join("%.0f" % (it[k][1] * 1e3) for k in sorted(it)))
for sv in range(interval, iters, interval):
    normal = statistics.median(it[k][1] for k in range(max(2, sv - 2), sv + 1))
    bg = re.search(r"successfully saved checkpoint from iteration +%d to \S+ \[[^]]*\] \(in the background: this rank's ([0-9.]+) MB copied in ([0-9.]+) s, written in ([0-9.]+) s.*?(\d+)%% of the copy left" % sv, log)
    line = "    save at %2d: steps before it %.0f ms; the step with the save %.2fx (%s)" % (sv, normal * 1e3, it[sv + 1][1] / normal, busy(sv + 1))
    line += "; the next two %.2fx (%s), %.2fx (%s)" % (it[sv + 2][1] / normal, busy(sv + 2), it[sv + 3][1] / normal, busy(sv + 3))
    if bg:
        line += " | this rank's %.0f MB copied in %.2f s (%s%% by the optimizer step), written in %.2f s" % (
            float(bg.group(1)), float(bg.group(2)), bg.group(4), float(bg.group(3)))
    print(line)
PY
  rm -rf "$dir" # up to 7.5 GB
}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg); commit $(git rev-parse --short HEAD 2>/dev/null || echo '? (not a git checkout)')$(git diff --quiet HEAD -- ckpt train 2>/dev/null; [ $? -ne 1 ] || echo ' (ckpt/train modified)')"
for r in $(seq "$rounds"); do
  echo "round $r ($(date -u '+%F %T') UTC, load average $(cut -d' ' -f1-3 /proc/loadavg))"
  run dp1-sync 1 8 4
  run dp1-async 1 24 6 --async-save
  run dp1-async-100MBps 1 24 6 --async-save --async-save-rate 100
  run dp2-sync 2 8 4
  run dp2-async 2 24 6 --async-save
  run dp2-distopt-sync 2 8 4 --use-distributed-optimizer
  run dp2-distopt-async 2 24 6 --use-distributed-optimizer --async-save
done
