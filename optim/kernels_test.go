package optim

import (
	"fmt"
	"math"
	"testing"

	"github.com/gotron/gotron/internal/cpu"
)

// TestAdamWSamePathsAndThreads runs 5 AdamW steps (two groups, odd tensor
// sizes, scheduled LR) on every ISA path this CPU has and at 1 and 3
// threads: params and both moments must be bit-identical to the pure-Go
// path on one thread, so neither the kernel choice nor the chunking changes
// a training run.
func TestAdamWSamePathsAndThreads(t *testing.T) {
	run := func(isa cpu.ISA, threads int) []*Param {
		defer cpu.SetISA(cpu.SetISA(isa))
		defer cpu.SetThreads(cpu.SetThreads(threads))
		if got := cpu.ActiveISA(); got != isa {
			t.Fatalf("SetISA(%v): active ISA is %v", isa, got)
		}
		ps := testParams(3, true)
		opt, err := NewAdamW(DefaultGroups(ps), AdamWConfig{Beta2: 0.95})
		if err != nil {
			t.Fatal(err)
		}
		for step := range 5 {
			fillGrads(ps, uint64(step))
			for i := range opt.Groups() {
				opt.Groups()[i].LR = 1e-3 * float64(step+1)
				opt.Groups()[i].WD = 0.1 * opt.Groups()[i].WDMult
			}
			opt.Step()
		}
		st := opt.State()
		for _, p := range ps { // append the moments as extra "params"
			ps = append(ps, &Param{Name: "exp_avg/" + p.Name, Data: st.Buffers["exp_avg/"+p.Name]},
				&Param{Name: "exp_avg_sq/" + p.Name, Data: st.Buffers["exp_avg_sq/"+p.Name]})
		}
		return ps
	}
	want := run(cpu.ISAGeneric, 1)
	for isa := cpu.ISAGeneric; isa <= cpu.DetectedISA(); isa++ {
		for _, th := range []int{1, 3} {
			got := run(isa, th)
			for k, p := range want {
				for i := range p.Data {
					if gb, wb := math.Float32bits(got[k].Data[i]), math.Float32bits(p.Data[i]); gb != wb {
						t.Fatalf("%v, %d threads: %s[%d] = %#08x, want %#08x (generic, 1 thread)", isa, th, p.Name, i, gb, wb)
					}
				}
			}
		}
	}
}

// BenchmarkAdamWPaths is BenchmarkAdamW at 30 M params per ISA path.
func BenchmarkAdamWPaths(b *testing.B) {
	const n = 30_000_000
	ps := benchParams(n)
	for isa := cpu.ISAGeneric; isa <= cpu.DetectedISA(); isa++ {
		for _, th := range []int{1, 2} {
			b.Run(fmt.Sprintf("isa=%v/threads=%d", isa, th), func(b *testing.B) {
				defer cpu.SetISA(cpu.SetISA(isa))
				defer cpu.SetThreads(cpu.SetThreads(th))
				opt, _ := NewAdamW(DefaultGroups(ps), AdamWConfig{})
				for i := range opt.Groups() {
					opt.Groups()[i].LR, opt.Groups()[i].WD = 1e-4, 0.1*opt.Groups()[i].WDMult
				}
				opt.Step() // first touch of the moments (page faults) is not timed
				b.SetBytes(int64(7 * 4 * n))
				b.ReportAllocs()
				for b.Loop() {
					opt.Step()
				}
			})
		}
	}
}
