package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The gated delta net kernels' backward against float64 finite
// differences of their forward (the same generic code at float64).

func TestCausalConvSiLUGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	b, tt, c, k := 2, 7, 3, 4
	x, w := randF64(rng, b*tt*c, 1), randF64(rng, c*k, 0.8)
	gradCheck(t, []gcInput{{"x", x}, {"w", w}}, func() []float64 {
		out := make([]float64, b*tt*c)
		CausalConvSiLUForward(out, x, w, b, tt, c, k)
		return out
	}, func(dout []float64, g [][]float64) {
		CausalConvSiLUBackward(g[0], g[1], dout, x, w, b, tt, c, k)
	}, false)
	// causality: step s reads steps s-3..s only
	out := make([]float64, b*tt*c)
	CausalConvSiLUForward(out, x, w, b, tt, c, k)
	pre := w[0*k+3]*x[0] + 0
	if want := pre / (1 + math.Exp(-pre)); math.Abs(out[0]-want) > 1e-15 {
		t.Fatalf("out[0][0][0] = %g, want silu(w[0][3]·x[0][0][0]) = %g", out[0], want)
	}
}

func TestL2NormGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	n, d := 5, 6
	x := randF64(rng, n*d, 1)
	gradCheck(t, []gcInput{{"x", x}}, func() []float64 {
		out := make([]float64, n*d)
		L2NormForward(out, x, n, d, 1e-6)
		return out
	}, func(dout []float64, g [][]float64) { L2NormBackward(g[0], dout, x, n, d, 1e-6) }, false)
}

func TestGDNGatesGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	n, h := 4, 3
	alpha, b := randF64(rng, n*h, 2), randF64(rng, n*h, 2)
	aLog, dt := randF64(rng, h, 1), randF64(rng, h, 1)
	alpha[0] = 25 // past softplus' threshold
	gradCheck(t, []gcInput{{"alpha", alpha}, {"b", b}, {"A_log", aLog}, {"dt_bias", dt}}, func() []float64 {
		g, beta := make([]float64, n*h), make([]float64, n*h)
		GDNGatesForward(g, beta, alpha, b, aLog, dt, n, h)
		return append(g, beta...)
	}, func(dout []float64, gr [][]float64) {
		GDNGatesBackward(gr[0], gr[1], gr[2], gr[3], dout[:n*h], dout[n*h:], alpha, b, aLog, dt, n, h)
	}, false)
}

func TestGatedDeltaRuleGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	// 7 steps in chunks of 3: the backward recomputes a partial last chunk
	s := DeltaRuleShape{B: 2, T: 7, Heads: 2, DK: 3, DV: 4, Scale: 1 / math.Sqrt(3), Chunk: 3}
	nk, nv, ng := s.B*s.T*s.Heads*s.DK, s.B*s.T*s.Heads*s.DV, s.B*s.T*s.Heads
	q, k, v := randF64(rng, nk, 1), randF64(rng, nk, 0.7), randF64(rng, nv, 1)
	g := randF64(rng, ng, 0.5)
	for i := range g {
		g[i] -= 0.5 // log-decays are negative
	}
	beta := randF64(rng, ng, 0.5)
	for i := range beta {
		beta[i] += 0.5
	}
	saved := make([]float64, s.SavedStates())
	gradCheck(t, []gcInput{{"q", q}, {"k", k}, {"v", v}, {"g", g}, {"beta", beta}}, func() []float64 {
		out := make([]float64, nv)
		GatedDeltaRuleForward(out, saved, q, k, v, g, beta, s)
		return out
	}, func(dout []float64, gr [][]float64) {
		out := make([]float64, nv)
		GatedDeltaRuleForward(out, saved, q, k, v, g, beta, s)
		GatedDeltaRuleBackward(gr[0], gr[1], gr[2], gr[3], gr[4], dout, saved, q, k, v, g, beta, s)
	}, false)
	// the chunk size changes nothing but the saved memory
	out3, out1 := make([]float64, nv), make([]float64, nv)
	GatedDeltaRuleForward(out3, saved, q, k, v, g, beta, s)
	s1 := s
	s1.Chunk = 64
	GatedDeltaRuleForward(out1, make([]float64, s1.SavedStates()), q, k, v, g, beta, s1)
	for i := range out3 {
		if out3[i] != out1[i] {
			t.Fatalf("out[%d]: chunk 3 %g, chunk 64 %g", i, out3[i], out1[i])
		}
	}
}
