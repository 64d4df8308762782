package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gotron/gotron/internal/cpu"
)

// optimSizes are odd tensor sizes like a small layer's, the last spanning
// several NormBlocks and thread chunks.
var optimSizes = []int{35, 5, 11, 129 * 301}

// seededList returns a list of tensors of optimSizes filled from seed:
// normal values scaled by 10^[-2, 1), with some exact zeros.
func seededList(t testing.TB, seed uint64, abs bool) *TensorList {
	r := rand.New(rand.NewPCG(seed, 11))
	ts := make([]*Tensor, len(optimSizes))
	for i, n := range optimSizes {
		x := make([]float32, n)
		for j := range x {
			v := r.NormFloat64() * math.Pow(10, r.Float64()*3-2)
			if r.IntN(17) == 0 {
				v = 0
			}
			if abs {
				v = math.Abs(v)
			}
			x[j] = float32(v)
		}
		ts[i] = FromFloat32(x, n)
		ts[i].Name = fmt.Sprintf("t%d", i)
	}
	l, err := NewTensorList(ts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// listBits returns the bits of every element of the lists, in order.
func listBits(ls ...*TensorList) []uint32 {
	var out []uint32
	for _, l := range ls {
		if l == nil {
			continue
		}
		for i := range l.Len() {
			for _, v := range l.At(i).Float32s() {
				out = append(out, math.Float32bits(v))
			}
		}
	}
	return out
}

// runListOps runs 5 steps of each list op, with per-tensor scalars that
// change every step, and returns the bits of every tensor and statistic.
func runListOps(t testing.TB) []uint32 {
	p, g, m, v := seededList(t, 1, false), seededList(t, 2, false), seededList(t, 3, false), seededList(t, 4, true)
	sp, sb := seededList(t, 5, false), seededList(t, 6, false)
	ac := make([]AdamWCoeffs, p.Len())
	sc := make([]SGDCoeffs, p.Len())
	var stats []uint32
	for step := range 5 {
		for i := range ac {
			b1, b2 := float32(0.9), float32(0.95)
			ac[i] = AdamWCoeffs{Beta1: b1, Beta2: b2, OneMinusBeta1: 1 - b1, OneMinusBeta2: 1 - b2, Eps: 1e-8,
				BC1: float32(1 - math.Pow(float64(b1), float64(step+1))), BC2: float32(1 - math.Pow(float64(b2), float64(step+1))),
				LR: 1e-3 * float32(step+1), WD: 0.1 * float32(i%2)}
			sc[i] = SGDCoeffs{LR: 1e-2, WD: 0.01 * float32(i%2), Momentum: 0.9, OneMinusDampening: 0.75,
				FirstStep: step == 0, Nesterov: i == 3}
		}
		AdamW(p, g, m, v, ac)
		SGD(sp, g, sb, sc)
		SGD(g, sp, nil, sc)
		ScaleList(g, 0.5+float32(step)/8)
		stats = append(stats, uint32(math.Float64bits(SumSquares(g))), uint32(math.Float64bits(SumSquares(g))>>32),
			uint32(math.Float64bits(MaxAbs(m))), uint32(math.Float64bits(MaxAbs(m))>>32))
	}
	return append(listBits(p, g, m, v, sp, sb), stats...)
}

// TestListOpsSamePathsAndThreads runs the list ops on every ISA path this
// CPU has and at 1 and 3 threads: every tensor and statistic must be
// bit-identical to the pure-Go path on one thread, so neither the kernel
// choice nor the chunking changes a training run.
func TestListOpsSamePathsAndThreads(t *testing.T) {
	run := func(isa cpu.ISA, threads int) []uint32 {
		defer cpu.SetISA(cpu.SetISA(isa))
		defer SetCPUThreads(SetCPUThreads(threads))
		if got := cpu.ActiveISA(); got != isa {
			t.Fatalf("SetISA(%v): active ISA is %v", isa, got)
		}
		return runListOps(t)
	}
	want := run(cpu.ISAGeneric, 1)
	for isa := cpu.ISAGeneric; isa <= cpu.DetectedISA(); isa++ {
		for _, th := range []int{1, 3} {
			got := run(isa, th)
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%v, %d threads: word %d = %#08x, want %#08x (generic, 1 thread)", isa, th, i, got[i], want[i])
				}
			}
		}
	}
}

// TestNonFiniteEveryPath checks NaN and ±Inf detection at the start, in the
// middle (past a NormBlock) and at the end of a list on every ISA path.
func TestNonFiniteEveryPath(t *testing.T) {
	for isa := cpu.ISAGeneric; isa <= cpu.DetectedISA(); isa++ {
		func() {
			defer cpu.SetISA(cpu.SetISA(isa))
			l := seededList(t, 9, false)
			if NonFinite(l) {
				t.Fatalf("%v: NonFinite on finite values", isa)
			}
			last := l.At(l.Len() - 1).Float32s()
			for _, c := range []struct {
				x []float32
				i int
				v float64
			}{{l.At(0).Float32s(), 0, math.NaN()}, {last, NormBlock + 3, math.Inf(1)}, {last, len(last) - 1, math.Inf(-1)}} {
				old := c.x[c.i]
				c.x[c.i] = float32(c.v)
				if !NonFinite(l) {
					t.Errorf("%v: NonFinite missed %v at %d", isa, c.v, c.i)
				}
				c.x[c.i] = old
			}
		}()
	}
}

// TestListOpsPanicOnMismatch: lists of different lengths or tensor sizes
// are a programming error.
func TestListOpsPanicOnMismatch(t *testing.T) {
	a := seededList(t, 1, false)
	b, err := NewTensorList(a.At(0), a.At(1))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewTensorList(a.At(1), a.At(0), a.At(2), a.At(3))
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func(){
		"length":   func() { AdamW(a, b, a, a, make([]AdamWCoeffs, a.Len())) },
		"size":     func() { SGD(a, c, nil, make([]SGDCoeffs, a.Len())) },
		"coeffs":   func() { AdamW(a, a, a, a, make([]AdamWCoeffs, 1)) },
		"momentum": func() { SGD(a, a, b, make([]SGDCoeffs, a.Len())) },
		"nil":      func() { AdamW(a, a, nil, a, make([]AdamWCoeffs, a.Len())) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s mismatch: no panic", name)
				}
			}()
			f()
		}()
	}
	if _, err := NewTensorList(a.At(0), nil); err == nil {
		t.Error("NewTensorList with a nil tensor: no error")
	}
	if _, err := NewTensorList(New(Int32, 3)); err == nil {
		t.Error("NewTensorList with an int32 tensor: no error")
	}
	if _, err := NewTensorList((*Tape)(nil).Transpose(Zeros(3, 4), 0, 1)); err == nil {
		t.Error("NewTensorList with a transposed view: no error")
	}
}

// BenchmarkAdamWPaths reports GB/s of tensor.AdamW at 30 M params per ISA
// path and thread count: per parameter it reads p, g, m, v and writes p, m,
// v (7 × 4 bytes).
func BenchmarkAdamWPaths(b *testing.B) {
	const n = 30_000_000
	mk := func() *TensorList {
		sizes := []int{n / 2, n/2 - 3*64 - 128, 64, 64, 64, 128}
		ts := make([]*Tensor, len(sizes))
		for i, s := range sizes {
			ts[i] = Zeros(s)
		}
		l, _ := NewTensorList(ts...)
		return l
	}
	p, g, m, v := mk(), mk(), mk(), mk()
	c := make([]AdamWCoeffs, p.Len())
	for i := range c {
		c[i] = AdamWCoeffs{Beta1: 0.9, Beta2: 0.999, OneMinusBeta1: 0.1, OneMinusBeta2: 0.001, Eps: 1e-8, BC1: 0.1, BC2: 0.001, LR: 1e-4, WD: 0.1}
	}
	for isa := cpu.ISAGeneric; isa <= cpu.DetectedISA(); isa++ {
		for _, th := range []int{1, 2} {
			b.Run(fmt.Sprintf("isa=%v/threads=%d", isa, th), func(b *testing.B) {
				defer cpu.SetISA(cpu.SetISA(isa))
				defer SetCPUThreads(SetCPUThreads(th))
				AdamW(p, g, m, v, c) // first touch (page faults) is not timed
				b.SetBytes(int64(7 * 4 * n))
				b.ReportAllocs()
				for b.Loop() {
					AdamW(p, g, m, v, c)
				}
			})
		}
	}
}
