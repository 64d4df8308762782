package optim

import (
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// TestGradsSumSquaresDeterministic checks Σg² against a float64 loop, and
// that the result is bit-identical on 1, 2 and 5 threads (fixed blocks).
func TestGradsSumSquaresDeterministic(t *testing.T) {
	defer tensor.SetCPUThreads(tensor.SetCPUThreads(1))
	ps := testParams(6, true)
	ps = append(ps, testParams(7, true)[3:]...)
	ps[len(ps)-1].Name = "big2.weight"
	fillGrads(ps, 3)
	want, wantMax := 0.0, 0.0
	for _, p := range ps {
		for _, g := range p.Grad.Float32s() {
			want += float64(g) * float64(g)
			wantMax = math.Max(wantMax, math.Abs(float64(g)))
		}
	}
	g, err := NewGrads(ps)
	if err != nil {
		t.Fatal(err)
	}
	var first float64
	for i, th := range []int{1, 2, 5} {
		tensor.SetCPUThreads(th)
		got := g.SumSquares()
		if !near(got, want, 1e-13) {
			t.Errorf("threads %d: SumSquares = %.17g, float64 loop %.17g", th, got, want)
		}
		if i == 0 {
			first = got
		} else if got != first {
			t.Errorf("threads %d: SumSquares = %.17g, 1 thread %.17g (must be bit-identical)", th, got, first)
		}
		if m := g.MaxAbs(); m != wantMax {
			t.Errorf("threads %d: MaxAbs = %v, want %v", th, m, wantMax)
		}
	}
}

// TestClipGradNorm checks Megatron's rule coeff = max/(norm+1e-6), applied
// only when < 1, and the split local-sum / finish path.
func TestClipGradNorm(t *testing.T) {
	ps := testParams(8, false)
	fillGrads(ps, 4)
	orig := clone(ps)
	g, _ := NewGrads(ps)
	norm := L2Norm(g.SumSquares())

	// Under the threshold: untouched, norm still returned.
	if got := g.ClipGradNorm(norm * 2); got != norm {
		t.Fatalf("ClipGradNorm returned %v, want %v", got, norm)
	}
	for k := range ps {
		for i := range ps[k].Grad.Float32s() {
			if ps[k].Grad.Float32s()[i] != orig[k].Grad.Float32s()[i] {
				t.Fatalf("grads changed although norm %v < max %v", norm, norm*2)
			}
		}
	}
	// --clip-grad 0 disables clipping.
	if g.ClipByNorm(0, norm) {
		t.Error("ClipByNorm(0, ...) clipped")
	}
	// Over the threshold: every grad scaled by float32(max/(norm+1e-6)).
	const maxNorm = 0.5
	if got := g.ClipGradNorm(maxNorm); got != norm {
		t.Fatalf("ClipGradNorm returned %v, want the pre-clip norm %v", got, norm)
	}
	c := float32(maxNorm / (norm + 1e-6))
	for k := range ps {
		for i := range ps[k].Grad.Float32s() {
			if ps[k].Grad.Float32s()[i] != orig[k].Grad.Float32s()[i]*c {
				t.Fatalf("%s[%d] = %v, want %v·%v", ps[k].Name, i, ps[k].Grad.Float32s()[i], orig[k].Grad.Float32s()[i], c)
			}
		}
	}
	if after := L2Norm(g.SumSquares()); !near(after, maxNorm, 1e-6) {
		t.Errorf("norm after clipping %v, want ≈ %v", after, maxNorm)
	}
	if got := ClipCoeff(1e-6, 1e-6); got != 0.5 {
		t.Errorf("ClipCoeff(1e-6, 1e-6) = %v, want 0.5 (norm + 1e-6 in the denominator)", got)
	}
	// A NaN norm never clips (NaN < 1 is false, as in Python).
	if g.ClipByNorm(1, math.NaN()) {
		t.Error("ClipByNorm with NaN norm clipped")
	}
}

// TestFoundInf checks NaN/±Inf detection anywhere in the flat space, and
// that an infinite norm makes the clip coefficient 0 as in Megatron.
func TestFoundInf(t *testing.T) {
	ps := testParams(9, true)
	fillGrads(ps, 5)
	g, _ := NewGrads(ps)
	if g.FoundInf() {
		t.Fatal("FoundInf on finite grads")
	}
	last := ps[len(ps)-1]
	for _, bad := range []struct {
		p *Param
		i int
		v float32
	}{
		{ps[0], 0, float32(math.NaN())},
		{ps[1], 4, float32(math.Inf(1))},
		{last, len(last.Grad.Float32s()) - 1, float32(math.Inf(-1))},
		{last, tensor.NormBlock + 3, float32(math.NaN())},
	} {
		old := bad.p.Grad.Float32s()[bad.i]
		bad.p.Grad.Float32s()[bad.i] = bad.v
		if !g.FoundInf() {
			t.Errorf("FoundInf missed %v at %s[%d]", bad.v, bad.p.Name, bad.i)
		}
		if bad.v != bad.v && !math.IsNaN(g.MaxAbs()) {
			t.Errorf("MaxAbs with a NaN at %s[%d] = %v, want NaN", bad.p.Name, bad.i, g.MaxAbs())
		}
		bad.p.Grad.Float32s()[bad.i] = old
	}
	if g.FoundInf() {
		t.Error("FoundInf after restoring finite grads")
	}
	if ClipCoeff(1, math.Inf(1)) != 0 {
		t.Error("ClipCoeff with infinite norm is not 0")
	}
	if _, err := NewGrads([]*Param{{Name: "x", Data: tensor.Zeros(2), Grad: tensor.Zeros(1)}}); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("NewGrads with bad param: %v", err)
	}
}
