package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/tensor"
)

const benchGemmSynopsis = "bench gemm [--reps 5] [--threads N] [--isa auto|avx512|avx2|generic] [--peak-gflops 0 (measured)] " +
	"[--shapes NN:1024x1024x1024,...] [--min-rep-seconds 0.5] [--precision fp32|bf16] [--device cpu|cuda] [--library cublas|cublaslt]"

// defaultGemmShapes are the square shapes and the GPT-2 (d=768, 4d=3072)
// MLP shapes: forward Y = X·W (NN), backward dX = dY·Wᵀ (NT) and
// dW = Xᵀ·dY (TN), then a 64³ attention-sized tile and an m=1 decode GEMV.
// Each entry is OPS:MxKxN with op(A) M×K and op(B) K×N.
const defaultGemmShapes = "NN:1024x1024x1024,NN:2048x2048x2048,NN:4096x768x3072," +
	"NT:1024x3072x768,TN:768x1024x3072,NT:4096x768x3072,TN:768x4096x3072," +
	"NN:64x64x64,NN:1x768x3072"

// gemmShape is one row of the benchmark table.
type gemmShape struct {
	tA, tB  cpu.Transpose
	m, k, n int
}

func (s gemmShape) ops() string {
	t := func(x cpu.Transpose) string {
		if x {
			return "T"
		}
		return "N"
	}
	return t(s.tA) + t(s.tB)
}

// parseGemmShapes parses the --shapes list.
func parseGemmShapes(list string) ([]gemmShape, error) {
	var out []gemmShape
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		ops, dims, ok := strings.Cut(f, ":")
		d := strings.Split(dims, "x")
		if !ok || len(ops) != 2 || len(d) != 3 {
			return nil, fmt.Errorf("--shapes: %q: want OPS:MxKxN with OPS one of NN, NT, TN, TT (e.g. NT:1024x3072x768)", f)
		}
		var s gemmShape
		for i, p := range []*cpu.Transpose{&s.tA, &s.tB} {
			switch ops[i] {
			case 'N':
			case 'T':
				*p = cpu.Trans
			default:
				return nil, fmt.Errorf("--shapes: %q: transpose %q is not N or T", f, ops[i])
			}
		}
		for i, p := range []*int{&s.m, &s.k, &s.n} {
			v, err := strconv.Atoi(d[i])
			if err != nil || v < 1 {
				return nil, fmt.Errorf("--shapes: %q: dimension %q is not a positive integer", f, d[i])
			}
			*p = v
		}
		out = append(out, s)
	}
	return out, nil
}

// benchGemm times cpu.Sgemm (or cpu.SgemmBF16 with --precision bf16) on a
// list of shapes and prints GFLOP/s (median and max over reps), their share
// of the peak, and GFLOP per CPU-second per thread, which other processes on
// the machine disturb much less than wall-clock rates.
func benchGemm(ctx context.Context, env *cli, args []string) error {
	fs := newFlags("bench gemm", benchGemmSynopsis)
	reps := fs.Int("reps", 5, "timed repetitions per shape (median and max are reported)")
	threads := fs.Int("threads", cpu.Threads(), "goroutines the kernel uses (GOTRON_NUM_THREADS)")
	isaName := fs.String("isa", "auto", "kernel path: auto (detected), avx512, avx2 or generic")
	peak := fs.Float64("peak-gflops", 0, "peak for --threads threads, GFLOP/s (0: measured before every rep with --threads threads of register-only FMAs, cpu.FMAPeak; twice that with the AVX512_BF16 kernels)")
	precision := fs.String("precision", "fp32", "fp32 (cpu.Sgemm) or bf16 (cpu.SgemmBF16: inputs rounded to bfloat16, fp32 accumulation)")
	shapeList := fs.String("shapes", defaultGemmShapes, "comma-separated OPS:MxKxN (op(A) M×K, op(B) K×N)")
	minRep := fs.Float64("min-rep-seconds", 0.5, "each repetition repeats the GEMM until it lasts this long")
	device := fs.String("device", "cpu", "cpu (the kernels above), or cuda / cuda:N: cuBLAS through the CUDA backend (--threads, --isa and --peak-gflops do not apply; the peak is the GPU's datasheet one)")
	library := fs.String("library", "cublas", "with --device cuda, what runs the products: cublas (cublasGemmStridedBatchedEx, as training by default) or cublaslt (cublasLtMatmul, as training under GOTRON_CUDA_UNVERIFIED=cublaslt: built, not yet run on a GPU)")
	fs.String("config", "", "YAML file with flag values")
	if err := parseFlags(fs, args, env.stdout, benchGemmSynopsis); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case *reps < 1:
		return fmt.Errorf("--reps %d: want at least 1", *reps)
	case *threads < 1:
		return fmt.Errorf("--threads %d: want at least 1", *threads)
	case !(*peak >= 0):
		return fmt.Errorf("--peak-gflops %g: want a positive number (or 0 to measure it)", *peak)
	case !(*minRep >= 0):
		return fmt.Errorf("--min-rep-seconds %g: want ≥ 0", *minRep)
	}
	bf16 := false
	switch *precision {
	case "fp32":
	case "bf16":
		bf16 = true
	default:
		return fmt.Errorf("--precision %q: want fp32 or bf16", *precision)
	}
	isa, err := cpu.ParseISA(*isaName)
	if err != nil {
		return fmt.Errorf("--isa: %w", err)
	}
	shapes, err := parseGemmShapes(*shapeList)
	if err != nil {
		return err
	}
	dev, err := parseDevice(*device, 0)
	if err != nil {
		return err
	}
	lt := false
	switch *library {
	case "cublas":
	case "cublaslt":
		lt = true
		if dev != tensor.CUDA {
			return fmt.Errorf("--library cublaslt: only with --device cuda (cuBLASLt runs the GPU's products; --device is %s)", *device)
		}
	default:
		return fmt.Errorf("--library %q: want cublas or cublaslt", *library)
	}
	switch dev {
	case tensor.CUDA:
		return benchGemmCUDA(ctx, env.stdout, shapes, bf16, lt, *reps, *minRep)
	case tensor.Sim:
		return fmt.Errorf("--device sim: the simulated device runs the CPU kernels; benchmark them with --device cpu")
	}
	prevISA := cpu.SetISA(isa)
	defer cpu.SetISA(prevISA)
	if got := cpu.ActiveISA(); got != isa {
		return fmt.Errorf("--isa %v: this CPU supports at most %v", isa, cpu.DetectedISA())
	}
	prevThreads := cpu.SetThreads(*threads)
	defer cpu.SetThreads(prevThreads)
	name := "sgemm"
	// peakScale turns the measured fp32 FMA rate into this path's peak:
	// VDPBF16PS does two multiply-adds per lane at the FMA rate.
	peakScale := 1.0
	if bf16 {
		name = "sgemm bf16 (fp32 kernels on rounded inputs)"
		if cpu.HasBF16GEMM() {
			name = "sgemm bf16 (VDPBF16PS kernels)"
			peakScale = 2
		}
	}
	// A measured peak is taken right before every rep, so each rep is
	// compared with what the threads could do at that moment (the vCPUs'
	// placement and other processes change from second to second).
	peakFn := func() float64 { return *peak }
	peakDesc := fmt.Sprintf("peak %.0f GFLOP/s", *peak)
	if *peak == 0 {
		dur := time.Duration(min(0.25, max(0.01, *minRep/2)) * float64(time.Second))
		peakFn = func() float64 { return peakScale * cpu.FMAPeak(*threads, dur) }
		peakDesc = fmt.Sprintf("peak measured before each rep (%v of FMAs on %d threads", dur, *threads)
		if peakScale != 1 {
			peakDesc += fmt.Sprintf(", ×%g", peakScale)
		}
		peakDesc += ")"
	}

	w := env.stdout
	fmt.Fprintf(w, "%s: isa %v, threads %d, %s, %d reps of ≥ %.2gs each\n", name, isa, *threads, peakDesc, *reps, *minRep)
	fmt.Fprintf(w, "%-3s %6s %6s %6s %8s %8s %8s %7s %7s %10s %7s\n",
		"ops", "M", "K", "N", "median", "max", "peak", "%peak", "%peak", "GFLOP/", "%peak")
	fmt.Fprintf(w, "%-3s %6s %6s %6s %8s %8s %8s %7s %7s %10s %7s\n",
		"", "", "", "", "GFLOP/s", "GFLOP/s", "GFLOP/s", "median", "max", "cpu-s/thr", "cpu")
	for _, s := range shapes {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := timeGemm(ctx, s, bf16, *reps, *minRep, peakFn)
		if err != nil {
			return err
		}
		perThread := r.cpuGFLOPs // GFLOP per CPU-second = per busy thread
		fmt.Fprintf(w, "%-3s %6d %6d %6d %8.1f %8.1f %8.1f %6.1f%% %6.1f%% %10.1f %6.1f%%\n",
			s.ops(), s.m, s.k, s.n, r.median, r.max, r.peak, 100*r.pctMedian, 100*r.pctMax,
			perThread, 100*perThread/(r.peak/float64(*threads)))
	}
	return nil
}

// gemmResult holds one shape's rates.
type gemmResult struct {
	median, max       float64 // wall-clock GFLOP/s over reps
	peak              float64 // median of the peaks taken before the reps
	pctMedian, pctMax float64 // each rep's rate over its own peak: median, max
	cpuGFLOPs         float64 // GFLOP per process CPU-second, over all reps
}

// timeGemm runs one shape: a warm-up call that also calibrates how many
// calls make a repetition last minRep seconds, then reps timed repetitions,
// each preceded by peak() (the GFLOP/s it is compared with). bf16 times
// cpu.SgemmBF16 instead of cpu.Sgemm.
func timeGemm(ctx context.Context, s gemmShape, bf16 bool, reps int, minRep float64, peak func() float64) (gemmResult, error) {
	rng := rand.New(rand.NewPCG(uint64(s.m), uint64(s.n)))
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = rng.Float32()*2 - 1
		}
		return x
	}
	a, b, c := fill(s.m*s.k), fill(s.k*s.n), make([]float32, s.m*s.n)
	lda, ldb := s.k, s.n
	if s.tA {
		lda = s.m
	}
	if s.tB {
		ldb = s.k
	}
	gemm := cpu.Sgemm
	if bf16 {
		gemm = cpu.SgemmBF16
	}
	call := func() { gemm(s.tA, s.tB, s.m, s.n, s.k, 1, a, lda, b, ldb, 0, c, s.n) }
	t0 := time.Now()
	call()
	one := time.Since(t0).Seconds()
	calls := max(1, int(minRep/max(one, 1e-9)))
	flop := 2 * float64(s.m) * float64(s.n) * float64(s.k) * float64(calls)
	rates := make([]float64, 0, reps)
	peaks := make([]float64, 0, reps)
	pcts := make([]float64, 0, reps)
	var cpuSeconds float64
	for range reps {
		if err := ctx.Err(); err != nil {
			return gemmResult{}, err
		}
		p := peak()
		cpu0, err := processCPU()
		if err != nil {
			return gemmResult{}, err
		}
		t := time.Now()
		for range calls {
			call()
		}
		rate := flop / time.Since(t).Seconds() / 1e9
		cpu1, err := processCPU()
		if err != nil {
			return gemmResult{}, err
		}
		cpuSeconds += cpu1 - cpu0
		rates, peaks, pcts = append(rates, rate), append(peaks, p), append(pcts, rate/p)
	}
	r := gemmResult{median: medianOf(rates), max: slices.Max(rates), peak: medianOf(peaks),
		pctMedian: medianOf(pcts), pctMax: slices.Max(pcts)}
	if cpuSeconds > 0 {
		r.cpuGFLOPs = flop * float64(reps) / cpuSeconds / 1e9
	}
	return r, nil
}

// medianOf returns the median of xs (the mean of the middle two for an even
// count); it sorts xs.
func medianOf(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[n/2]
}

// processCPU returns the CPU time (user+system) this process has used.
func processCPU() (float64, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9, nil
}
