package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// fastTol is the fast-path vs float64-reference tolerance of the tests in this
// package: |got - want| <= fastTol*max(1, |want|).
const fastTol = 2e-5

// filled returns n copies of v (gradient buffers pre-filled to check +=).
func filled(n int, v float64) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = v
	}
	return x
}

func TestNormFastVsRef(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, sh := range []struct{ n, c int }{{1, 1}, {3, 7}, {33, 129}, {70, 768}} {
		for _, bias := range []bool{true, false} {
			t.Run(fmt.Sprintf("layernorm-%dx%d-bias%v", sh.n, sh.c, bias), func(t *testing.T) {
				n, c := sh.n, sh.c
				x, w := round32(randF64(rng, n*c, 3)), round32(randF64(rng, c, 1))
				g := round32(randF64(rng, n*c, 1))
				var bb []float64
				if bias {
					bb = round32(randF64(rng, c, 1))
				}
				out, mean, rstd := make([]float64, n*c), make([]float64, n), make([]float64, n)
				layerNormForwardRef(out, mean, rstd, x, w, bb, n, c, 1e-5)
				dx, dw, db := filled(n*c, 0.5), filled(c, 0.25), filled(c, -1)
				if !bias {
					db = nil
				}
				layerNormBackwardRef(dx, dw, db, g, x, w, mean, rstd, n, c)

				out32, mean32, rstd32 := make([]float32, n*c), make([]float32, n), make([]float32, n)
				LayerNormForward(out32, mean32, rstd32, to32(x), to32(w), to32(bb), n, c, 1e-5)
				assertClose(t, "out", out32, out, fastTol)
				assertClose(t, "mean", mean32, mean, fastTol)
				assertClose(t, "rstd", rstd32, rstd, fastTol)
				dx32, dw32, db32 := to32(filled(n*c, 0.5)), to32(filled(c, 0.25)), to32(filled(c, -1))
				if !bias {
					db32 = nil
				}
				LayerNormBackward(dx32, dw32, db32, to32(g), to32(x), to32(w), mean32, rstd32, n, c)
				assertClose(t, "dinp", dx32, dx, fastTol)
				assertClose(t, "dweight", dw32, dw, fastTol)
				if bias {
					assertClose(t, "dbias", db32, db, fastTol)
				}
			})
		}
		t.Run(fmt.Sprintf("rmsnorm-%dx%d", sh.n, sh.c), func(t *testing.T) {
			n, c := sh.n, sh.c
			x, w, g := round32(randF64(rng, n*c, 3)), round32(randF64(rng, c, 1)), round32(randF64(rng, n*c, 1))
			out, rstd := make([]float64, n*c), make([]float64, n)
			rmsNormForwardRef(out, rstd, x, w, n, c, 1e-5)
			dx, dw := filled(n*c, 0.5), filled(c, 0.25)
			rmsNormBackwardRef(dx, dw, g, x, w, rstd, n, c)
			out32, rstd32 := make([]float32, n*c), make([]float32, n)
			RMSNormForward(out32, rstd32, to32(x), to32(w), n, c, 1e-5)
			assertClose(t, "out", out32, out, fastTol)
			assertClose(t, "rstd", rstd32, rstd, fastTol)
			dx32, dw32 := to32(filled(n*c, 0.5)), to32(filled(c, 0.25))
			RMSNormBackward(dx32, dw32, to32(g), to32(x), to32(w), rstd32, n, c)
			assertClose(t, "dinp", dx32, dx, fastTol)
			assertClose(t, "dweight", dw32, dw, fastTol)
		})
	}
}

// TestNormThreadInvariant checks that parameter gradients do not depend on the
// number of threads (they are reduced over columns, not rows).
func TestNormThreadInvariant(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	n, c := 100, 48
	x, w, g := to32(randF64(rng, n*c, 2)), to32(randF64(rng, c, 1)), to32(randF64(rng, n*c, 1))
	run := func(threads int) []float32 {
		defer SetThreads(SetThreads(threads))
		out, mean, rstd := make([]float32, n*c), make([]float32, n), make([]float32, n)
		LayerNormForward(out, mean, rstd, x, w, nil, n, c, 1e-5)
		dx, dw := make([]float32, n*c), make([]float32, c)
		LayerNormBackward(dx, dw, nil, g, x, w, mean, rstd, n, c)
		return append(append(out, dx...), dw...)
	}
	a, b := run(1), run(3)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("element %d: 1 thread %g, 3 threads %g", i, a[i], b[i])
		}
	}
}

func TestNormGolden(t *testing.T) {
	g := loadGolden(t, "layernorm")
	n, c := g.p("n"), g.p("c")
	out, mean, rstd := make([]float32, n*c), make([]float32, n), make([]float32, n)
	LayerNormForward(out, mean, rstd, g.f(t, "inp"), g.f(t, "weight"), g.f(t, "bias"), n, c, 1e-5)
	g.check(t, "out", out)
	g.check(t, "mean", mean)
	g.check(t, "rstd", rstd)
	dx, dw, db := make([]float32, n*c), make([]float32, c), make([]float32, c)
	LayerNormBackward(dx, dw, db, g.f(t, "dout"), g.f(t, "inp"), g.f(t, "weight"), mean, rstd, n, c)
	g.check(t, "dinp", dx)
	g.check(t, "dweight", dw)
	g.check(t, "dbias", db)

	g = loadGolden(t, "rmsnorm")
	n, c = g.p("n"), g.p("c")
	out, rstd = make([]float32, n*c), make([]float32, n)
	RMSNormForward(out, rstd, g.f(t, "inp"), g.f(t, "weight"), n, c, 1e-5)
	g.check(t, "out", out)
	g.check(t, "rstd", rstd)
	dx, dw = make([]float32, n*c), make([]float32, c)
	RMSNormBackward(dx, dw, g.f(t, "dout"), g.f(t, "inp"), g.f(t, "weight"), rstd, n, c)
	g.check(t, "dinp", dx)
	g.check(t, "dweight", dw)
}

// BenchmarkLayerNorm reports GB/s of activations moved by forward+backward
// (forward reads inp, writes out; backward reads inp and dout, adds to dinp).
func BenchmarkLayerNorm(b *testing.B) {
	n, c := 4096, 768
	rng := rand.New(rand.NewPCG(1, 1))
	x, w, bb, g := to32(randF64(rng, n*c, 2)), to32(randF64(rng, c, 1)), to32(randF64(rng, c, 1)), to32(randF64(rng, n*c, 1))
	out, mean, rstd := make([]float32, n*c), make([]float32, n), make([]float32, n)
	dx, dw, db := make([]float32, n*c), make([]float32, c), make([]float32, c)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		LayerNormForward(out, mean, rstd, x, w, bb, n, c, 1e-5)
		LayerNormBackward(dx, dw, db, g, x, w, mean, rstd, n, c)
	}
	b.ReportMetric(float64(7*4*n*c)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

// TestLayerNormRowsBitwise: LayerNormForward's four-rows-at-once path gives
// every row the bits of the plain per-row loops (layerNormStats) (sums in float64 in column
// order, then the deviations), for row counts that mix both paths, with
// and without bias, on 1 and 2 threads.
func TestLayerNormRowsBitwise(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	prev := SetThreads(1)
	defer SetThreads(prev)
	for _, c := range []int{1, 5, 768} {
		for _, n := range []int{1, 3, 4, 7, 9, 40} {
			inp, w, b := make([]float32, n*c), make([]float32, c), make([]float32, c)
			for i := range inp {
				inp[i] = float32(3*r.NormFloat64() + 1)
			}
			for j := range w {
				w[j], b[j] = float32(r.NormFloat64()), float32(r.NormFloat64())
			}
			for _, bias := range [][]float32{nil, b} {
				want, wm, wr := make([]float32, n*c), make([]float32, n), make([]float32, n)
				for i := range n {
					m, v2 := layerNormStats(inp[i*c : i*c+c])
					layerNormApply(want, wm, wr, inp, w, bias, i, c, m, v2, 1e-5)
				}
				for _, th := range []int{1, 2} {
					SetThreads(th)
					got, gm, gr := make([]float32, n*c), make([]float32, n), make([]float32, n)
					LayerNormForward(got, gm, gr, inp, w, bias, n, c, 1e-5)
					for i := range got {
						if !sameBits(got[i], want[i]) {
							t.Fatalf("c=%d n=%d bias=%v threads=%d: out[%d] = %v, per-row loops %v", c, n, bias != nil, th, i, got[i], want[i])
						}
					}
					for i := range n {
						if !sameBits(gm[i], wm[i]) || !sameBits(gr[i], wr[i]) {
							t.Fatalf("c=%d n=%d: row %d mean/rstd %v/%v, want %v/%v", c, n, i, gm[i], gr[i], wm[i], wr[i])
						}
					}
				}
			}
		}
	}
}
