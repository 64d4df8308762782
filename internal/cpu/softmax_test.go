package cpu

import (
	"math/rand/v2"
	"testing"
)

func TestSoftmaxFastVsRef(t *testing.T) {
	rng := rand.New(rand.NewPCG(10, 11))
	for _, sh := range []struct{ n, c int }{{1, 1}, {3, 7}, {65, 1000}} {
		x, g := round32(randF64(rng, sh.n*sh.c, 20)), round32(randF64(rng, sh.n*sh.c, 1))
		out, dx := make([]float64, len(x)), filled(len(x), 0.5)
		softmaxForwardRef(out, x, sh.n, sh.c)
		softmaxBackwardRef(dx, g, out, sh.n, sh.c)
		out32, dx32 := make([]float32, len(x)), to32(filled(len(x), 0.5))
		SoftmaxForward(out32, to32(x), sh.n, sh.c)
		SoftmaxBackward(dx32, to32(g), out32, sh.n, sh.c)
		assertClose(t, "out", out32, out, fastTol)
		assertClose(t, "dinp", dx32, dx, fastTol)
		inPlace := to32(x) // out aliases inp
		SoftmaxForward(inPlace, inPlace, sh.n, sh.c)
		assertClose(t, "out in place", inPlace, out, fastTol)
	}
}

func TestSoftmaxGolden(t *testing.T) { forEachISA(t, "softmax", softmaxGolden) }

func softmaxGolden(t *testing.T) {
	g := loadGolden(t, "softmax")
	n, c := g.p("n"), g.p("c")
	out, dx := make([]float32, n*c), make([]float32, n*c)
	SoftmaxForward(out, g.f(t, "inp"), n, c)
	SoftmaxBackward(dx, g.f(t, "dout"), out, n, c)
	g.check(t, "out", out)
	g.check(t, "dinp", dx)
}
