package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// deltaRuleInputs draws q, k, v, g (negative) and beta (0..1) for s.
func deltaRuleInputs(rng *rand.Rand, s DeltaRuleShape) (q, k, v, g, beta []float64) {
	nk, nv, ng := s.B*s.T*s.Heads*s.DK, s.B*s.T*s.Heads*s.DV, s.B*s.T*s.Heads
	q, k, v = randF64(rng, nk, 1), randF64(rng, nk, 0.7), randF64(rng, nv, 1)
	g, beta = randF64(rng, ng, 0.5), randF64(rng, ng, 0.5)
	for i := range g {
		g[i] -= 0.5
		beta[i] += 0.5
	}
	return
}

// TestGatedDeltaRuleChunkedGradients: the chunked form's backward against
// float64 finite differences of its forward — 7 steps in chunks of 3 (a
// partial last chunk) and in one chunk of 8 — and its forward, saved
// states and gradients against the recurrence's (the reference) within
// float64 rounding.
func TestGatedDeltaRuleChunkedGradients(t *testing.T) {
	for _, chunk := range []int{3, 8} {
		rng := rand.New(rand.NewPCG(9, uint64(chunk)))
		s := DeltaRuleShape{B: 2, T: 7, Heads: 2, DK: 3, DV: 4, Scale: 1 / math.Sqrt(3), Chunk: chunk}
		q, k, v, g, beta := deltaRuleInputs(rng, s)
		nv := len(v)
		saved := make([]float64, s.SavedStates())
		gradCheck(t, []gcInput{{"q", q}, {"k", k}, {"v", v}, {"g", g}, {"beta", beta}}, func() []float64 {
			out := make([]float64, nv)
			GatedDeltaRuleChunkedForward(out, saved, q, k, v, g, beta, s)
			return out
		}, func(dout []float64, gr [][]float64) {
			out := make([]float64, nv)
			GatedDeltaRuleChunkedForward(out, saved, q, k, v, g, beta, s)
			GatedDeltaRuleChunkedBackward(gr[0], gr[1], gr[2], gr[3], gr[4], dout, saved, q, k, v, g, beta, s)
		}, false)

		outC, outR := make([]float64, nv), make([]float64, nv)
		savedC, savedR := make([]float64, s.SavedStates()), make([]float64, s.SavedStates())
		GatedDeltaRuleChunkedForward(outC, savedC, q, k, v, g, beta, s)
		GatedDeltaRuleForward(outR, savedR, q, k, v, g, beta, s)
		closeF64(t, "out", outC, outR, 1e-12)
		closeF64(t, "saved states", savedC, savedR, 1e-12)
		dout := randF64(rng, nv, 1)
		var gc, gref [5][]float64
		for i, n := range []int{len(q), len(k), len(v), len(g), len(beta)} {
			gc[i], gref[i] = make([]float64, n), make([]float64, n)
		}
		GatedDeltaRuleChunkedBackward(gc[0], gc[1], gc[2], gc[3], gc[4], dout, savedC, q, k, v, g, beta, s)
		GatedDeltaRuleBackward(gref[0], gref[1], gref[2], gref[3], gref[4], dout, savedR, q, k, v, g, beta, s)
		for i, name := range []string{"dq", "dk", "dv", "dg", "dbeta"} {
			closeF64(t, name, gc[i], gref[i], 1e-12)
		}
	}
}

// TestGatedDeltaRuleChunkedFloat32: in float32 (the GEMM kernels) the
// chunked form matches the recurrence within float32 rounding over 150
// steps in chunks of 64, with Megatron-sized heads narrowed (dk 32, dv 48).
func TestGatedDeltaRuleChunkedFloat32(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	s := DeltaRuleShape{B: 2, T: 150, Heads: 3, DK: 32, DV: 48, Scale: 1 / math.Sqrt(32), Chunk: 64}
	q64, k64, v64, g64, b64 := deltaRuleInputs(rng, s)
	// unit keys, as the layer's L2 norm gives them
	for r := 0; r < len(k64); r += s.DK {
		var n float64
		for _, x := range k64[r : r+s.DK] {
			n += x * x
		}
		for j := range s.DK {
			k64[r+j] /= math.Sqrt(n)
		}
	}
	f32 := func(x []float64) []float32 {
		o := make([]float32, len(x))
		for i, v := range x {
			o[i] = float32(v)
		}
		return o
	}
	q, k, v, g, beta := f32(q64), f32(k64), f32(v64), f32(g64), f32(b64)
	outC, outR := make([]float32, len(v)), make([]float32, len(v))
	savedC, savedR := make([]float32, s.SavedStates()), make([]float32, s.SavedStates())
	GatedDeltaRuleChunkedForward(outC, savedC, q, k, v, g, beta, s)
	GatedDeltaRuleForward(outR, savedR, q, k, v, g, beta, s)
	close32(t, "out", outC, outR, 1e-5)
	dout := f32(randF64(rng, len(v), 1))
	var gc, gref [5][]float32
	for i, n := range []int{len(q), len(k), len(v), len(g), len(beta)} {
		gc[i], gref[i] = make([]float32, n), make([]float32, n)
	}
	GatedDeltaRuleChunkedBackward(gc[0], gc[1], gc[2], gc[3], gc[4], dout, savedC, q, k, v, g, beta, s)
	GatedDeltaRuleBackward(gref[0], gref[1], gref[2], gref[3], gref[4], dout, savedR, q, k, v, g, beta, s)
	for i, name := range []string{"dq", "dk", "dv", "dg", "dbeta"} {
		close32(t, name, gc[i], gref[i], 1e-5)
	}
}

func closeF64(t *testing.T, what string, got, want []float64, tol float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(got[i] - want[i]); !(d <= tol*math.Max(1, math.Abs(want[i]))) {
			t.Fatalf("%s[%d]: chunked %g, recurrent %g", what, i, got[i], want[i])
		}
	}
}

// close32 checks |got − want| ≤ tol·max(1, max|want|) element by element
// and logs the largest difference.
func close32(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	scale, worst := 1.0, 0.0
	for _, w := range want {
		scale = math.Max(scale, math.Abs(float64(w)))
	}
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		worst = math.Max(worst, d/scale)
		if !(d <= tol*scale) {
			t.Fatalf("%s[%d]: chunked %g, recurrent %g (scale %g)", what, i, got[i], want[i], scale)
		}
	}
	t.Logf("%s: largest difference %.3g of the largest magnitude", what, worst)
}

// BenchmarkGatedDeltaRule times the recurrence and the chunked form,
// forward and backward, at the gdn configs' shape per micro-batch and
// layer (4 × 1024 tokens, 8 value heads, 64 × 64 states, chunks of 64):
//
//	go test ./internal/cpu -run '^$' -bench GatedDeltaRule -benchtime 3x
func BenchmarkGatedDeltaRule(b *testing.B) {
	s := DeltaRuleShape{B: 4, T: 1024, Heads: 8, DK: 64, DV: 64, Scale: 1.0 / 8, Chunk: 64}
	rng := rand.New(rand.NewPCG(1, 2))
	q64, k64, v64, g64, b64 := deltaRuleInputs(rng, s)
	f32 := func(x []float64) []float32 {
		o := make([]float32, len(x))
		for i, v := range x {
			o[i] = float32(v) / 8
		}
		return o
	}
	q, k, v, g, beta := f32(q64), f32(k64), f32(v64), f32(g64), f32(b64)
	for i := range g {
		g[i], beta[i] = float32(g64[i]), float32(b64[i])
	}
	out, dout, saved := make([]float32, len(v)), f32(randF64(rng, len(v), 1)), make([]float32, s.SavedStates())
	dq, dk, dv, dg, db := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v)), make([]float32, len(g)), make([]float32, len(g))
	for _, form := range []struct {
		name string
		fwd  func(out, saved, q, k, v, g, beta []float32, s DeltaRuleShape)
		bwd  func(dq, dk, dv, dg, dbeta, dout, saved, q, k, v, g, beta []float32, s DeltaRuleShape)
	}{
		{"recurrent", GatedDeltaRuleForward[float32], GatedDeltaRuleBackward[float32]},
		{"chunked", GatedDeltaRuleChunkedForward[float32], GatedDeltaRuleChunkedBackward[float32]},
	} {
		b.Run(form.name+"/forward", func(b *testing.B) {
			for range b.N {
				form.fwd(out, saved, q, k, v, g, beta, s)
			}
		})
		b.Run(form.name+"/backward", func(b *testing.B) {
			form.fwd(out, saved, q, k, v, g, beta, s)
			b.ResetTimer()
			for range b.N {
				form.bwd(dq, dk, dv, dg, db, dout, saved, q, k, v, g, beta, s)
			}
		})
	}
}
