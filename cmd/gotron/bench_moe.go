package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
	"github.com/gotron/gotron/train"
)

const benchMoESynopsis = "bench moe [--rounds 3] [--iters 3] [--untimed-iters 1] [--variants grouped,loop,ep2] " +
	"[--num-layers 2] [--hidden-size 512] [--num-experts 8] [--moe-router-topk 2] [--moe-ffn-hidden-size 1408] " +
	"[--seq-length 256] [--micro-batch-size 2] [--global-batch-size 8] [--peak-seconds 1]"

// benchMoEVariants are the configurations bench moe compares, in the order
// of a round.
var benchMoEVariants = []struct {
	name, label string
}{
	{"grouped", "EP=1, grouped GEMM (--moe-grouped-gemm)"},
	{"loop", "EP=1, per-expert loop"},
	{"ep2", "EP=2 over tcp, 2 processes, grouped GEMM, alltoall"},
}

// benchMoEOpts are the parsed flags of "gotron bench moe".
type benchMoEOpts struct {
	rounds, iters, warmup                int
	layers, hidden, heads, groups, vocab int
	experts, topk, ffn                   int
	seq, mbs, gbs                        int
	peakSeconds                          float64
	variants                             []string
}

// benchMoE times training steps of a Mixtral-style MoE model (real gotron
// train runs on mock data, each in processes of its own: the step time is
// the log line's "elapsed time per iteration") in three configurations —
// EP=1 with the grouped GEMM, EP=1 with one GEMM per expert, EP=2 over tcp
// (two processes, the cores split between them as gotron launch does) —
// interleaved round by round so that a load that comes and goes hits them
// alike. It prints each one's median step time, tokens/s and MFU: Megatron's
// FLOPs with the MoE terms (train.FLOPsPerIteration: the k routed experts,
// not the router) over the step time and the FMA peak of this machine's
// cores measured in the same run, before each round (cpu.FMAPeak), and the
// per-round ratios to the grouped EP=1 step.
func benchMoE(ctx context.Context, env *cli, args []string) error {
	o, err := parseBenchMoE(env, args)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable to start the training runs: %w", err)
	}
	tmp, err := os.MkdirTemp("", "gotron-bench-moe")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	cfg := o.model()
	threads := tensor.CPUThreads()
	tokens := o.gbs * o.seq
	flops := train.FLOPsPerIteration(cfg, o.gbs, o.seq)
	fmt.Fprintf(env.stdout, "gotron bench moe: Mixtral-style MoE, %d layers, hidden %d, %d heads (%d query groups), %d experts top-%d, expert ffn %d (SwiGLU), vocab %d\n",
		o.layers, o.hidden, o.heads, o.groups, o.experts, o.topk, o.ffn, o.vocab)
	fmt.Fprintf(env.stdout, "%d tokens a step (global batch %d × seq %d, micro-batch %d); %.4g GFLOP a step (Megatron's num_floating_point_operations with the MoE terms); %d kernel threads on %d CPUs\n",
		tokens, o.gbs, o.seq, o.mbs, flops/1e9, threads, runtime.NumCPU())
	fmt.Fprintf(env.stdout, "%d rounds; each run: %d warm-up + %d timed iterations of gotron train (median of the timed)\n\n", o.rounds, o.warmup, o.iters)

	steps := map[string][]float64{} // variant → step seconds per round
	var peaks []float64
	for round := 1; round <= o.rounds; round++ {
		peak := 1e9 * cpu.FMAPeak(threads, time.Duration(o.peakSeconds*float64(time.Second))) // FLOP/s
		peaks = append(peaks, peak)
		line := fmt.Sprintf("round %d: FMA peak %.1f GFLOP/s (%d threads)", round, peak/1e9, threads)
		for _, v := range o.variants {
			s, err := o.run(ctx, env, exe, filepath.Join(tmp, fmt.Sprintf("%s-%d", v, round)), v)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round, v, err)
			}
			steps[v] = append(steps[v], s)
			line += fmt.Sprintf(" | %s %.1f ms", v, s*1e3)
		}
		fmt.Fprintln(env.stdout, line)
	}
	peak := medianOf(peaks)
	fmt.Fprintf(env.stdout, "\nmedians over the rounds; MFU = GFLOP a step / step time / FMA peak (median %.1f GFLOP/s: all %d threads, whichever variant)\n", peak/1e9, threads)
	fmt.Fprintf(env.stdout, "%-52s %10s %10s %7s %14s\n", "variant", "step (ms)", "tokens/s", "MFU", "× grouped EP=1")
	for _, v := range o.variants {
		s := medianOf(steps[v])
		ratio := "-"
		if g := steps["grouped"]; len(g) > 0 {
			r := make([]float64, len(g))
			for i := range g {
				r[i] = g[i] / steps[v][i] // per round: the speed relative to grouped EP=1
			}
			ratio = fmt.Sprintf("%.2f", medianOf(r))
		}
		fmt.Fprintf(env.stdout, "%-52s %10.2f %10.0f %6.1f%% %14s\n", benchMoELabel(v), s*1e3, float64(tokens)/s, 100*flops/s/peak, ratio)
	}
	return nil
}

func benchMoELabel(v string) string {
	for _, x := range benchMoEVariants {
		if x.name == v {
			return x.label
		}
	}
	return v
}

func parseBenchMoE(env *cli, args []string) (*benchMoEOpts, error) {
	fs := newFlags("bench moe", benchMoESynopsis)
	o := &benchMoEOpts{}
	fs.IntVar(&o.rounds, "rounds", 3, "rounds; each runs every variant once, in turn")
	fs.IntVar(&o.iters, "iters", 3, "timed training iterations of each run")
	fs.IntVar(&o.warmup, "untimed-iters", 1, "untimed training iterations first in each run (warm-up)")
	variants := fs.String("variants", "grouped,loop,ep2", "comma-separated: grouped (EP=1, --moe-grouped-gemm), loop (EP=1, one GEMM per expert), ep2 (EP=2 over tcp, two processes)")
	fs.IntVar(&o.layers, "num-layers", 2, "transformer layers (every one MoE)")
	fs.IntVar(&o.hidden, "hidden-size", 512, "hidden size")
	fs.IntVar(&o.heads, "num-attention-heads", 8, "attention heads")
	fs.IntVar(&o.groups, "num-query-groups", 2, "key/value heads (GQA)")
	fs.IntVar(&o.vocab, "vocab-size", 1024, "vocabulary of the mock data")
	fs.IntVar(&o.experts, "num-experts", 8, "routed experts per layer")
	fs.IntVar(&o.topk, "moe-router-topk", 2, "experts per token")
	fs.IntVar(&o.ffn, "moe-ffn-hidden-size", 1408, "each expert's hidden size")
	fs.IntVar(&o.seq, "seq-length", 256, "tokens per sequence")
	fs.IntVar(&o.mbs, "micro-batch-size", 2, "sequences per micro-batch (per rank)")
	fs.IntVar(&o.gbs, "global-batch-size", 8, "sequences per step (over all ranks)")
	fs.Float64Var(&o.peakSeconds, "peak-seconds", 1, "seconds of the FMA-peak measurement before each round")
	if err := parseFlags(fs, args, env.stdout, benchMoESynopsis); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for _, c := range []struct {
		name    string
		v       int
		lo, hi  int64
		comment string
	}{
		{"rounds", o.rounds, 1, 1000, ""}, {"iters", o.iters, 1, 1e6, ""}, {"untimed-iters", o.warmup, 0, 1e6, ""},
		{"num-layers", o.layers, 1, 1024, ""}, {"hidden-size", o.hidden, 1, 1 << 20, ""}, {"num-attention-heads", o.heads, 1, 1 << 16, ""},
		{"num-query-groups", o.groups, 1, 1 << 16, ""}, {"vocab-size", o.vocab, 1, 1 << 24, ""}, {"num-experts", o.experts, 1, 1 << 16, ""},
		{"moe-router-topk", o.topk, 1, int64(max(o.experts, 1)), "--num-experts"}, {"moe-ffn-hidden-size", o.ffn, 1, 1 << 20, ""},
		{"seq-length", o.seq, 1, 1 << 24, ""}, {"micro-batch-size", o.mbs, 1, 1 << 20, ""}, {"global-batch-size", o.gbs, 1, 1 << 24, ""},
	} {
		var err error
		if c.comment != "" {
			err = checked.RangeWhy("--"+c.name, int64(c.v), c.lo, c.hi, c.comment)
		} else {
			err = checked.Range("--"+c.name, int64(c.v), c.lo, c.hi)
		}
		if err != nil {
			return nil, err
		}
	}
	if !(o.peakSeconds > 0) || o.peakSeconds > 60 {
		return nil, fmt.Errorf("--peak-seconds %g: want more than 0 and at most 60", o.peakSeconds)
	}
	for _, v := range strings.Split(*variants, ",") {
		v = strings.TrimSpace(v)
		if !slices.ContainsFunc(benchMoEVariants, func(x struct{ name, label string }) bool { return x.name == v }) {
			return nil, fmt.Errorf("--variants: %q: want grouped, loop or ep2", v)
		}
		if slices.Contains(o.variants, v) {
			return nil, fmt.Errorf("--variants: %q twice", v)
		}
		o.variants = append(o.variants, v)
	}
	// the EP=2 run has two data-parallel ranks of --micro-batch-size each
	if slices.Contains(o.variants, "ep2") && (o.gbs%(2*o.mbs) != 0 || o.experts%2 != 0) {
		return nil, fmt.Errorf("--variants ep2: --global-batch-size=%d must be a multiple of 2 × --micro-batch-size=%d and --num-experts=%d even", o.gbs, o.mbs, o.experts)
	}
	m := o.model()
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return o, nil
}

// model is the gpt.Config the runs train (what train builds from
// trainArgs), for the FLOPs.
func (o *benchMoEOpts) model() gpt.Config {
	return gpt.Config{NumLayers: o.layers, HiddenSize: o.hidden, NumAttentionHeads: o.heads, NumQueryGroups: o.groups,
		FFNHiddenSize: o.ffn, VocabSize: o.vocab, MaxPositionEmbeddings: o.seq, PositionEmbeddingType: gpt.RoPE,
		Normalization: gpt.RMSNorm, Activation: gpt.SwiGLU, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true,
		MoE: gpt.MoEConfig{NumExperts: o.experts, TopK: o.topk, FFNHiddenSize: o.ffn, AuxLossCoeff: 1e-2}}
}

// trainArgs are the gotron train flags of variant v, writing metrics to
// metrics.
func (o *benchMoEOpts) trainArgs(v, metrics string) []string {
	itoa := strconv.Itoa
	a := []string{"train", "--mock-data", "--vocab-size", itoa(o.vocab), "--make-vocab-size-divisible-by", "1",
		"--seq-length", itoa(o.seq), "--max-position-embeddings", itoa(o.seq),
		"--micro-batch-size", itoa(o.mbs), "--global-batch-size", itoa(o.gbs),
		"--num-layers", itoa(o.layers), "--hidden-size", itoa(o.hidden), "--num-attention-heads", itoa(o.heads),
		"--group-query-attention", "--num-query-groups", itoa(o.groups), "--ffn-hidden-size", itoa(o.ffn),
		"--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
		"--untie-embeddings-and-output-weights",
		"--num-experts", itoa(o.experts), "--moe-router-topk", itoa(o.topk), "--moe-ffn-hidden-size", itoa(o.ffn),
		"--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-2",
		"--train-iters", itoa(o.warmup + o.iters), "--lr", "1e-4", "--log-interval", "1", "--eval-iters", "0",
		"--no-progress", "--metrics-file", metrics}
	switch v {
	case "grouped":
		a = append(a, "--moe-grouped-gemm")
	case "ep2":
		a = append(a, "--moe-grouped-gemm", "--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall")
	}
	return a
}

// run trains variant v in its own process(es) and returns the median step
// time of the timed iterations, in seconds.
func (o *benchMoEOpts) run(ctx context.Context, env *cli, exe, dir, v string) (float64, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	metrics := filepath.Join(dir, "metrics.jsonl")
	args := o.trainArgs(v, metrics)
	environ := os.Environ()
	if v == "ep2" {
		port, err := freePort()
		if err != nil {
			return 0, err
		}
		// gotron launch gives each of the two workers half the CPUs
		args = append([]string{"launch", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", strconv.Itoa(port), "--"}, args...)
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = environ
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("gotron %s: %w\n%s", strings.Join(args, " "), err, tail(out.String(), 20))
	}
	return o.stepTime(metrics)
}

// stepTime reads the metrics file's elapsed_ms_per_iteration of the timed
// iterations and returns their median, in seconds.
func (o *benchMoEOpts) stepTime(path string) (float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var ms []float64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<24)
	for sc.Scan() {
		var rec struct {
			Iteration int64    `json:"iteration"`
			ElapsedMS *float64 `json:"elapsed_ms_per_iteration"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		if rec.ElapsedMS != nil && rec.Iteration > int64(o.warmup) {
			ms = append(ms, *rec.ElapsedMS)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	if len(ms) != o.iters {
		return 0, fmt.Errorf("%s: %d timed iterations logged, want %d", path, len(ms), o.iters)
	}
	return medianOf(ms) / 1e3, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a free port for the EP=2 run: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
