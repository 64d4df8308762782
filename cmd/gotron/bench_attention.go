package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gotron/gotron/internal/cpu"
)

const benchAttentionSynopsis = "bench attention [--batch 4] [--seq 1024] [--heads 12] [--kv-heads N] [--head-dim 64] " +
	"[--causal=true] [--iters 3] [--memory-seqs 512,1024,2048]"

// benchAttention times cpu.AttentionForward/Backward (fused, flash-style) and
// reports GFLOP/s with the causal-halved convention of cpu.AttentionFLOPs,
// then the memory a fwd+bwd allocates at several sequence lengths, to show it
// does not grow as T².
func benchAttention(ctx context.Context, env *cli, args []string) error {
	fs := newFlags("bench attention", benchAttentionSynopsis)
	var cfg cpu.AttentionConfig
	fs.IntVar(&cfg.B, "batch", 4, "batch size")
	fs.IntVar(&cfg.T, "seq", 1024, "sequence length")
	fs.IntVar(&cfg.HQ, "heads", 12, "query heads")
	fs.IntVar(&cfg.HKV, "kv-heads", 0, "key/value heads (GQA; 0: same as --heads)")
	fs.IntVar(&cfg.D, "head-dim", 64, "head size (kv_channels)")
	fs.BoolVar(&cfg.Causal, "causal", true, "causal mask")
	iters := fs.Int("iters", 3, "timed iterations (the median is reported)")
	memSeqs := fs.String("memory-seqs", "512,1024,2048", "sequence lengths of the memory table (empty: skip)")
	fs.String("config", "", "YAML file with flag values")
	if err := parseFlags(fs, args, env.stdout, benchAttentionSynopsis); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if cfg.HKV == 0 {
		cfg.HKV = cfg.HQ
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"batch", cfg.B}, {"seq", cfg.T}, {"heads", cfg.HQ}, {"kv-heads", cfg.HKV}, {"head-dim", cfg.D}, {"iters", *iters}} {
		if f.v < 1 {
			return fmt.Errorf("--%s %d: want a positive number", f.name, f.v)
		}
	}
	if cfg.HQ%cfg.HKV != 0 {
		return fmt.Errorf("--heads %d is not a multiple of --kv-heads %d", cfg.HQ, cfg.HKV)
	}
	seqs, err := parseSeqList(*memSeqs)
	if err != nil {
		return err
	}

	w := env.stdout
	mode := "causal"
	if !cfg.Causal {
		mode = "full"
	}
	fmt.Fprintf(w, "attention fwd+bwd: batch %d, seq %d, heads %d (kv %d), head-dim %d, %s, threads %d, isa %v\n",
		cfg.B, cfg.T, cfg.HQ, cfg.HKV, cfg.D, mode, cpu.Threads(), cpu.ActiveISA())
	bufs := newAttnBufs(cfg)
	bufs.run(cfg) // warm-up: fills the workspace pool
	var fwdT, bwdT []time.Duration
	var fwdCPU, bwdCPU time.Duration // process CPU time, robust to a busy machine
	for range *iters {
		if err := ctx.Err(); err != nil {
			return err
		}
		c0, t0 := cpuTime(), time.Now()
		cpu.AttentionForward(bufs.out, bufs.lse, bufs.q, bufs.k, bufs.v, cfg)
		c1, t1 := cpuTime(), time.Now()
		cpu.AttentionBackward(bufs.dq, bufs.dk, bufs.dv, bufs.dout, bufs.q, bufs.k, bufs.v, bufs.out, bufs.lse, cfg)
		c2 := cpuTime()
		fwdT, bwdT = append(fwdT, t1.Sub(t0)), append(bwdT, time.Since(t1))
		fwdCPU, bwdCPU = fwdCPU+c1-c0, bwdCPU+c2-c1
	}
	fwd, bwd := cpu.AttentionFLOPs(cfg)
	fm, bm := median(fwdT), median(bwdT)
	n := float64(*iters)
	perCore := func(flops float64, c time.Duration) float64 { return flops * n / c.Seconds() / 1e9 }
	fmt.Fprintf(w, "  %-9s %10s  %9s  %s\n", "", "wall", "GFLOP/s", "GFLOP per CPU-second (per busy core)")
	fmt.Fprintf(w, "  forward   %7.2f ms  %9.2f  %7.2f\n", ms(fm), fwd/fm.Seconds()/1e9, perCore(fwd, fwdCPU))
	fmt.Fprintf(w, "  backward  %7.2f ms  %9.2f  %7.2f\n", ms(bm), bwd/bm.Seconds()/1e9, perCore(bwd, bwdCPU))
	fmt.Fprintf(w, "  fwd+bwd   %7.2f ms  %9.2f  %7.2f   (median wall of %d; GFLOP/s over wall time)\n",
		ms(fm+bm), (fwd+bwd)/(fm+bm).Seconds()/1e9, perCore(fwd+bwd, fwdCPU+bwdCPU), *iters)
	fmt.Fprintf(w, "  FLOPs: forward 4·b·h·t²·d%s = %.3g, backward 2.5× forward = %.3g\n", map[bool]string{true: "/2 (causal)", false: ""}[cfg.Causal], fwd, bwd)

	if len(seqs) == 0 {
		return nil
	}
	fmt.Fprintf(w, "extra memory of fwd+bwd (heap allocated during the calls; the pooled workspace is %d KiB = %d threads × %d KiB at any T,\n  allocated again on a first call after a GC emptied the pool; the rest is Parallel's goroutine bookkeeping):\n",
		cpu.AttentionScratchBytes()/1024, cpu.Threads(), cpu.AttentionScratchBytes()/cpu.Threads()/1024)
	for _, t := range seqs {
		if err := ctx.Err(); err != nil {
			return err
		}
		c := cfg
		c.T = t
		b := newAttnBufs(c)
		cold, coldN := allocated(func() { b.run(c) })
		steady, steadyN := allocated(func() { b.run(c) })
		scores := int64(c.B) * int64(c.HQ) * int64(t) * int64(t) * 4
		fmt.Fprintf(w, "  T=%-6d first call %7d B in %3d allocs, steady state %6d B in %3d allocs   (a T×T score matrix: %s)\n",
			t, cold, coldN, steady, steadyN, humanBytes(scores))
	}
	return nil
}

// attnBufs holds the inputs, outputs and gradients of one attention call.
type attnBufs struct {
	q, k, v, dout, out, lse, dq, dk, dv []float32
}

func newAttnBufs(cfg cpu.AttentionConfig) *attnBufs {
	rng := rand.New(rand.NewPCG(1, 2))
	nq, nkv := cfg.B*cfg.T*cfg.HQ*cfg.D, cfg.B*cfg.T*cfg.HKV*cfg.D
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = rng.Float32()*2 - 1
		}
		return x
	}
	return &attnBufs{
		q: fill(nq), k: fill(nkv), v: fill(nkv), dout: fill(nq),
		out: make([]float32, nq), lse: make([]float32, cfg.B*cfg.HQ*cfg.T),
		dq: make([]float32, nq), dk: make([]float32, nkv), dv: make([]float32, nkv),
	}
}

func (b *attnBufs) run(cfg cpu.AttentionConfig) {
	cpu.AttentionForward(b.out, b.lse, b.q, b.k, b.v, cfg)
	cpu.AttentionBackward(b.dq, b.dk, b.dv, b.dout, b.q, b.k, b.v, b.out, b.lse, cfg)
}

// allocated returns the heap bytes and objects fn allocates.
func allocated(fn func()) (bytes, objects uint64) {
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	fn()
	runtime.ReadMemStats(&m1)
	return m1.TotalAlloc - m0.TotalAlloc, m1.Mallocs - m0.Mallocs
}

// parseSeqList parses --memory-seqs, a comma-separated list of positive ints.
func parseSeqList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--memory-seqs %q: %q is not a positive integer", s, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// cpuTime returns the user+system CPU time of this process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
}
