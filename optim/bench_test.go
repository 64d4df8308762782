package optim

import (
	"fmt"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// benchParams returns n float32 params spread over a few tensors like a
// small GPT layer (weights, biases, norms), grads filled.
func benchParams(n int) []*Param {
	shapes := [][]int{{n / 2}, {n/2 - 3*64 - 128}, {64}, {64}, {64}, {128}}
	shapes[0] = []int{n / 2 / 64, 64}
	shapes[1] = []int{(n/2 - 3*64 - 128) / 64, 64}
	var ps []*Param
	for i, s := range shapes {
		k := 1
		for _, d := range s {
			k *= d
		}
		name := fmt.Sprintf("p%d.weight", i)
		p := &Param{Name: name, Data: tensor.Zeros(s...), Grad: tensor.Zeros(s...)}
		p.NoWeightDecay = DefaultNoWeightDecay(name, s)
		ps = append(ps, p)
	}
	fillGrads(ps, 1)
	return ps
}

// TestAdamWStepAllocs checks the per-step allocation contract: a whole
// training step (found-inf, clipping, scheduler, AdamW) allocates nothing,
// on one thread or several (the CPU backend runs list ops on persistent workers).
func TestAdamWStepAllocs(t *testing.T) {
	defer tensor.SetCPUThreads(tensor.SetCPUThreads(1))
	ps := benchParams(1 << 16)
	opt, err := NewAdamW(DefaultGroups(ps), AdamWConfig{})
	if err != nil {
		t.Fatal(err)
	}
	sched, _ := NewScheduler(SchedulerConfig{MaxLR: 1e-3, DecaySteps: 1 << 30, StartWD: 0.1, EndWD: 0.1})
	grads, _ := NewGrads(ps)
	step := func() {
		grads.FoundInf()
		grads.ClipGradNorm(1)
		sched.Apply(opt.Groups())
		opt.Step()
		sched.Step(8)
	}
	if a := testing.AllocsPerRun(20, step); a != 0 {
		t.Errorf("one thread: %v allocs per training step, want 0", a)
	}
	tensor.SetCPUThreads(4)
	step() // warm the worker pool
	if a := testing.AllocsPerRun(20, step); a != 0 {
		t.Errorf("4 threads: %v allocs per training step, want 0", a)
	}
	big, _ := NewAdamW(DefaultGroups(benchParams(1<<20)), AdamWConfig{})
	if a := testing.AllocsPerRun(20, big.Step); a != 0 {
		t.Errorf("4 threads: %v allocs per AdamW step at 1Mi params, want 0", a)
	}
}

// BenchmarkAdamW reports GB/s of AdamW memory traffic: per parameter it
// reads p, g, m, v and writes p, m, v (7 × 4 bytes).
func BenchmarkAdamW(b *testing.B) {
	for _, n := range []int{1 << 16, 30_000_000} {
		for _, th := range []int{1, 2} {
			b.Run(fmt.Sprintf("params=%d/threads=%d", n, th), func(b *testing.B) {
				defer tensor.SetCPUThreads(tensor.SetCPUThreads(th))
				ps := benchParams(n)
				opt, _ := NewAdamW(DefaultGroups(ps), AdamWConfig{})
				for i := range opt.Groups() {
					opt.Groups()[i].LR, opt.Groups()[i].WD = 1e-4, 0.1*opt.Groups()[i].WDMult
				}
				opt.Step() // first touch of the moments (page faults) is not timed
				b.SetBytes(int64(7 * 4 * n))
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					opt.Step()
				}
			})
		}
	}
}

// BenchmarkGradNorm reports GB/s of SumSquares (reads g once).
func BenchmarkGradNorm(b *testing.B) {
	n := 1 << 22
	for _, th := range []int{1, 2} {
		b.Run(fmt.Sprintf("params=%d/threads=%d", n, th), func(b *testing.B) {
			defer tensor.SetCPUThreads(tensor.SetCPUThreads(th))
			g, _ := NewGrads(benchParams(n))
			b.SetBytes(int64(4 * n))
			b.ReportAllocs()
			for b.Loop() {
				g.SumSquares()
			}
		})
	}
}
