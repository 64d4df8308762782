package tensor_test

import (
	"math"
	"testing"

	"github.com/gotron/gotron/internal/fp8"
	"github.com/gotron/gotron/tensor"
)

// dequant returns xs quantized to f with current scaling and dequantized
// (float64): the operand the FP8 product multiplies.
func dequant(xs []float32, f fp8.Format) []float64 {
	scale := fp8.TensorwiseScale(fp8.Amax(xs), f)
	inv := float64(fp8.ScaleInv(scale))
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(f.Round(x*scale)) * inv
	}
	return out
}

// TestLinearFP8StraightThrough: the FP8 Linear's forward and both
// gradients are those of x·wᵀ + b on the quantized operands with the
// quantization passed straight through (TE's Linear: dgrad = Q(g)·Q(w),
// wgrad = Q(g)ᵀ·Q(x), bias grad = Σ g unquantized), checked against
// float64 central differences of the linear functions
// L(x) = Σ deq(Q(dout)) ⊙ (x·deq(Q(w))ᵀ) and L(w) = Σ deq(Q(dout)) ⊙ (deq(Q(x))·wᵀ),
// under the hybrid (E5M2 gradient) and e4m3 formats.
func TestLinearFP8StraightThrough(t *testing.T) {
	const rows, in, out = 6, 9, 5
	rng := tensor.NewRNG(3)
	for _, hybrid := range []bool{true, false} {
		r := fp8.Recipe{Kind: fp8.Tensorwise, Hybrid: hybrid}
		x, w, b := tensor.Zeros(rows, in), tensor.Zeros(out, in), tensor.Zeros(out)
		dout := tensor.Zeros(rows, out)
		rng.Normal(x.Float32s(), 0, 2)
		rng.Normal(w.Float32s(), 0, 0.1)
		rng.Normal(b.Float32s(), 0, 1)
		rng.Normal(dout.Float32s(), 0, 1e-3)
		x.SetRequiresGrad(true)
		w.SetRequiresGrad(true)
		b.SetRequiresGrad(true)
		tp := tensor.NewTape()
		y := tp.LinearFP8(x, w, b, tensor.NewFP8Linear(r, false, false))
		if err := tp.Backward(tp.Sum(tp.Mul(y, dout))); err != nil {
			t.Fatal(err)
		}
		xd, wd := dequant(x.Float32s(), fp8.E4M3), dequant(w.Float32s(), fp8.E4M3)
		gd := dequant(dout.Float32s(), r.GradFormat())
		// forward: deq(Q(x))·deq(Q(w))ᵀ + b
		for i := range rows {
			for o := range out {
				var s float64
				for k := range in {
					s += xd[i*in+k] * wd[o*in+k]
				}
				s += float64(b.Float32s()[o])
				if got := float64(y.Float32s()[i*out+o]); math.Abs(got-s) > 1e-5*max(1, math.Abs(s)) {
					t.Fatalf("hybrid %v: y[%d,%d] = %v, want %v", hybrid, i, o, got, s)
				}
			}
		}
		loss := func(xs, ws []float64) float64 {
			var l float64
			for i := range rows {
				for o := range out {
					var s float64
					for k := range in {
						s += xs[i*in+k] * ws[o*in+k]
					}
					l += gd[i*out+o] * s
				}
			}
			return l
		}
		check := func(name string, got []float32, vary []float64, lossOf func([]float64) float64) {
			const h = 1e-3
			for i := range vary {
				v := vary[i]
				vary[i] = v + h
				lp := lossOf(vary)
				vary[i] = v - h
				lm := lossOf(vary)
				vary[i] = v
				fd := (lp - lm) / (2 * h)
				if math.Abs(float64(got[i])-fd) > 1e-5*max(1e-3, math.Abs(fd)) {
					t.Fatalf("hybrid %v: d%s[%d] = %v, finite difference %v", hybrid, name, i, got[i], fd)
				}
			}
		}
		xs := make([]float64, len(xd))
		for i, v := range x.Float32s() {
			xs[i] = float64(v)
		}
		ws := make([]float64, len(wd))
		for i, v := range w.Float32s() {
			ws[i] = float64(v)
		}
		check("x", x.Grad.Float32s(), xs, func(v []float64) float64 { return loss(v, wd) })
		check("w", w.Grad.Float32s(), ws, func(v []float64) float64 { return loss(xd, v) })
		for o := range out {
			var s float64
			for i := range rows {
				s += float64(dout.Float32s()[i*out+o])
			}
			if got := float64(b.Grad.Float32s()[o]); math.Abs(got-s) > 1e-6 {
				t.Fatalf("hybrid %v: db[%d] = %v, want the unquantized Σ g %v", hybrid, o, got, s)
			}
		}
	}
}

// TestLinearFP8ExactOperands: operands that are FP8 values already, with
// amax 448 (scale 1), give Linear's numbers bit for bit.
func TestLinearFP8ExactOperands(t *testing.T) {
	x := tensor.FromFloat32([]float32{448, 1, -0.5, 2, 3, -448}, 2, 3)
	w := tensor.FromFloat32([]float32{448, 0.25, 1, -2, 6, 0.125}, 2, 3)
	var tp *tensor.Tape
	want := tp.Linear(x, w, nil).Float32s()
	got := tp.LinearFP8(x, w, nil, tensor.NewFP8Linear(fp8.Recipe{Kind: fp8.Tensorwise, Hybrid: true}, false, false)).Float32s()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("element %d: %v, want %v", i, got[i], want[i])
		}
	}
}

// TestLinearFP8Delayed: the delayed recipe quantizes with the scale of
// the last update (1 at first: an input of amax 1000 saturates at 448)
// and records the amaxes, which Update turns into the next scale.
func TestLinearFP8Delayed(t *testing.T) {
	r := fp8.Recipe{Kind: fp8.Delayed, Hybrid: true, AmaxHistoryLen: 4, AmaxAlgo: fp8.MaxOfHistory}
	q := tensor.NewFP8Linear(r, false, false)
	x := tensor.FromFloat32([]float32{1000, 1}, 1, 2)
	w := tensor.FromFloat32([]float32{1, 0}, 1, 2)
	var tp *tensor.Tape
	if got := tp.LinearFP8(x, w, nil, q).Float32s()[0]; got != 448 {
		t.Fatalf("first forward (scale 1): %v, want the saturated 448", got)
	}
	if a := q.Input.Current(); a != 1000 {
		t.Fatalf("input amax recorded %v, want 1000", a)
	}
	q.Input.Update(fp8.E4M3, 0, fp8.MaxOfHistory)
	q.Weight.Update(fp8.E4M3, 0, fp8.MaxOfHistory)
	if s := q.Input.Scale(); s != 448.0/1000 {
		t.Fatalf("scale after update %v, want 0.448", s)
	}
	if got := tp.LinearFP8(x, w, nil, q).Float32s()[0]; math.Abs(float64(got)-1000) > 1000.0/16 {
		t.Fatalf("second forward: %v, want about 1000", got)
	}
}

// TestLinearFP8CachedWeight: a cached weight quantization (decoding) gives
// the uncached product's numbers, call after call, and is made once.
func TestLinearFP8CachedWeight(t *testing.T) {
	rng := tensor.NewRNG(9)
	x, w := tensor.Zeros(3, 8), tensor.Zeros(4, 8)
	rng.Normal(x.Float32s(), 0, 1)
	rng.Normal(w.Float32s(), 0, 1)
	r := fp8.Recipe{Kind: fp8.Tensorwise, Hybrid: true}
	var tp *tensor.Tape
	want := tp.LinearFP8(x, w, nil, tensor.NewFP8Linear(r, true, true)).Float32s()
	q := tensor.NewFP8Linear(r, true, true)
	q.CacheWeight = true
	for range 2 {
		got := tensor.NewTape().LinearFP8(x, w, nil, q).Float32s()
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("element %d: %v cached, %v uncached", i, got[i], want[i])
			}
		}
	}
	w.Float32s()[0] += 100 // a weight that changed in place keeps its first quantization: decoding's contract
	if got := tp.LinearFP8(x, w, nil, q).Float32s(); got[0] != want[0] {
		t.Fatalf("the cached quantization was redone: %v, first %v", got[0], want[0])
	}
}
