package cpu

import (
	"math/rand/v2"
	"testing"
)

func TestActFastVsRef(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	type pair struct {
		name   string
		fwd    func(out, inp []float32)
		bwd    func(dinp, dout, inp []float32)
		fwdRef func(out, inp []float64)
		bwdRef func(dinp, dout, inp []float64)
	}
	for _, p := range []pair{
		{"gelu-tanh", GELUTanhForward, GELUTanhBackward, geluTanhForwardRef, geluTanhBackwardRef},
		{"gelu-erf", GELUErfForward, GELUErfBackward, geluErfForwardRef, geluErfBackwardRef},
		{"silu", SiLUForward, SiLUBackward, siluForwardRef, siluBackwardRef},
		{"squared-relu", SquaredReLUForward, SquaredReLUBackward, squaredReLUForwardRef, squaredReLUBackwardRef},
	} {
		for _, n := range []int{1, 17, 40001} {
			x, g := round32(randF64(rng, n, 8)), round32(randF64(rng, n, 1))
			x[0] = -100 // saturated tail stays finite
			out, dx := make([]float64, n), filled(n, 0.5)
			p.fwdRef(out, x)
			p.bwdRef(dx, g, x)
			out32, dx32 := make([]float32, n), to32(filled(n, 0.5))
			p.fwd(out32, to32(x))
			p.bwd(dx32, to32(g), to32(x))
			assertClose(t, p.name+" out", out32, out, fastTol)
			assertClose(t, p.name+" dinp", dx32, dx, fastTol)
		}
	}
	for _, sh := range []struct{ n, f int }{{1, 1}, {5, 13}, {31, 300}} {
		x, g := round32(randF64(rng, sh.n*2*sh.f, 6)), round32(randF64(rng, sh.n*sh.f, 1))
		out, dx := make([]float64, sh.n*sh.f), filled(len(x), 0.5)
		swigluForwardRef(out, x, sh.n, sh.f)
		swigluBackwardRef(dx, g, x, sh.n, sh.f)
		out32, dx32 := make([]float32, len(out)), to32(filled(len(x), 0.5))
		SwiGLUForward(out32, to32(x), sh.n, sh.f)
		SwiGLUBackward(dx32, to32(g), to32(x), sh.n, sh.f)
		assertClose(t, "swiglu out", out32, out, fastTol)
		assertClose(t, "swiglu dinp", dx32, dx, fastTol)
	}
}

func TestActGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		fwd  func(out, inp []float32)
		bwd  func(dinp, dout, inp []float32)
	}{
		{"gelu_tanh", GELUTanhForward, GELUTanhBackward},
		{"gelu_erf", GELUErfForward, GELUErfBackward},
		{"silu", SiLUForward, SiLUBackward},
		{"squared_relu", SquaredReLUForward, SquaredReLUBackward},
	} {
		g := loadGolden(t, tc.name)
		x := g.f(t, "inp")
		out, dx := make([]float32, len(x)), make([]float32, len(x))
		tc.fwd(out, x)
		tc.bwd(dx, g.f(t, "dout"), x)
		g.check(t, "out", out)
		g.check(t, "dinp", dx)
	}
	g := loadGolden(t, "swiglu")
	n, f := g.p("n"), g.p("f")
	out, dx := make([]float32, n*f), make([]float32, n*2*f)
	SwiGLUForward(out, g.f(t, "inp"), n, f)
	SwiGLUBackward(dx, g.f(t, "dout"), g.f(t, "inp"), n, f)
	g.check(t, "out", out)
	g.check(t, "dinp", dx)
}

// BenchmarkActivations reports GB/s for forward+backward (forward reads inp and
// writes out; backward reads dout and inp and updates dinp: 6 float passes).
func BenchmarkActivations(b *testing.B) {
	n := 1 << 22
	rng := rand.New(rand.NewPCG(1, 1))
	x, g := to32(randF64(rng, n, 4)), to32(randF64(rng, n, 1))
	out, dx := make([]float32, n), make([]float32, n)
	for _, a := range []struct {
		name string
		fwd  func(out, inp []float32)
		bwd  func(dinp, dout, inp []float32)
	}{
		{"gelu-tanh", GELUTanhForward, GELUTanhBackward},
		{"gelu-erf", GELUErfForward, GELUErfBackward},
		{"silu", SiLUForward, SiLUBackward},
	} {
		b.Run(a.name, func(b *testing.B) {
			for range b.N {
				a.fwd(out, x)
				a.bwd(dx, g, x)
			}
			b.ReportMetric(float64(6*4*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}
