package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// DeepSeek sparse attention's kernels: each backward against float64
// finite differences of its forward (the same generic code at float64).

func TestHadamardTransform(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	n, d := 3, 8
	x := randF64(rng, n*d, 1)
	out := make([]float64, n*d)
	HadamardTransform(out, x, n, d, 1/math.Sqrt(float64(d)))
	// against the Sylvester matrix: H[i][j] = (-1)^popcount(i&j)
	for r := range n {
		for j := range d {
			var want float64
			for i := range d {
				s := 1.0
				for b := i & j; b != 0; b &= b - 1 {
					s = -s
				}
				want += x[r*d+i] * s
			}
			want /= math.Sqrt(float64(d))
			if math.Abs(out[r*d+j]-want) > 1e-12 {
				t.Fatalf("row %d channel %d: %g, want %g", r, j, out[r*d+j], want)
			}
		}
	}
	// orthonormal: applying it twice gives x back
	back := make([]float64, n*d)
	HadamardTransform(back, out, n, d, 1/math.Sqrt(float64(d)))
	for i := range x {
		if math.Abs(back[i]-x[i]) > 1e-12 {
			t.Fatalf("H·H·x[%d] = %g, want %g", i, back[i], x[i])
		}
	}
}

func TestIndexerTopKCausal(t *testing.T) {
	// one sequence of 4: scores by row, −Inf above the diagonal
	inf := math.Inf(-1)
	s := []float64{
		1, inf, inf, inf,
		0.5, 2, inf, inf,
		3, 1, 3, inf, // a tie: the earlier key first
		-1, 4, 0, 2,
	}
	idx := make([]int32, 4*2)
	IndexerTopK(idx, s, 1, 4, 2)
	want := []int32{0, -1, 1, 0, 0, 2, 1, 3}
	for i := range want {
		if idx[i] != want[i] {
			t.Fatalf("top-2 = %v, want %v", idx, want)
		}
	}
}

func dsaTestIdx(rng *rand.Rand, b, tt, K int) []int32 {
	s := randF64(rng, b*tt*tt, 1)
	for r := range b * tt {
		for j := r%tt + 1; j < tt; j++ {
			s[r*tt+j] = math.Inf(-1)
		}
	}
	idx := make([]int32, b*tt*K)
	IndexerTopK(idx, s, b, tt, K)
	return idx
}

func TestSparseAttentionGradients(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	b, tt, n, dk, dv, K := 2, 6, 2, 5, 3, 3
	idx := dsaTestIdx(rng, b, tt, K)
	q, k, v := randF64(rng, b*tt*n*dk, 1), randF64(rng, b*tt*n*dk, 1), randF64(rng, b*tt*n*dv, 1)
	const scale = 0.7
	lse := make([]float64, b*tt*n)
	fwd := func() []float64 {
		o := make([]float64, b*tt*n*dv)
		SparseAttentionForward(o, lse, q, k, v, idx, b, tt, n, dk, dv, K, scale)
		return o
	}
	gradCheck(t, []gcInput{{"q", q}, {"k", k}, {"v", v}}, fwd, func(dout []float64, g [][]float64) {
		o := fwd()
		SparseAttentionBackward(g[0], g[1], g[2], dout, q, k, v, o, lse, idx, b, tt, n, dk, dv, K, scale)
	}, false)
	// with every causal key selected it is causal attention: row 1 of head 0
	full := make([]int32, b*tt*tt)
	for r := range b * tt {
		for c := range tt {
			full[r*tt+c] = -1
			if c <= r%tt {
				full[r*tt+c] = int32(c)
			}
		}
	}
	o := make([]float64, b*tt*n*dv)
	SparseAttentionForward(o, lse, q, k, v, full, b, tt, n, dk, dv, tt, scale)
	var l float64
	acc := make([]float64, dv)
	for j := 0; j <= 1; j++ {
		var dot float64
		for e := range dk {
			dot += q[(1*n)*dk+e] * k[(j*n)*dk+e]
		}
		p := math.Exp(dot * scale)
		l += p
		for e := range dv {
			acc[e] += p * v[(j*n)*dv+e]
		}
	}
	for e := range dv {
		if got, want := o[(1*n)*dv+e], acc[e]/l; math.Abs(got-want) > 1e-12 {
			t.Fatalf("causal row 1 channel %d: %g, want %g", e, got, want)
		}
	}
}

func TestIndexerLossGradients(t *testing.T) {
	for _, c := range []struct {
		name                   string
		relu, sparse, perToken bool
	}{{"relu dense", true, false, false}, {"relu sparse", true, true, false}, {"linear dense per token", false, false, true}} {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(15, 16))
			b, tt, H, D, n, dk, K := 2, 5, 3, 4, 2, 3, 3
			q, k, w := randF64(rng, b*tt*H*D, 1), randF64(rng, b*tt*D, 1), randF64(rng, b*tt*H, 1)
			mq, mk := randF64(rng, b*tt*n*dk, 1), randF64(rng, b*tt*n*dk, 1)
			scores := make([]float64, b*tt*tt)
			IndexerScores(scores, q, k, w, b, tt, H, D, c.relu)
			idx := make([]int32, b*tt*K)
			IndexerTopK(idx, scores, b, tt, K)
			heads := make([]float64, b*tt*tt)
			IndexerTargetHeads(heads, mq, mk, idx, b, tt, n, dk, K, 0.5, c.sparse)
			for r := range b * tt { // each head's probabilities sum to one
				var s float64
				for _, p := range heads[r*tt : (r+1)*tt] {
					s += p
				}
				if math.Abs(s-float64(n)) > 1e-12 {
					t.Fatalf("row %d: heads' probabilities sum to %g, want %d", r, s, n)
				}
			}
			loss := func() (float64, []float64) {
				s := make([]float64, b*tt*tt)
				IndexerScores(s, q, k, w, b, tt, H, D, c.relu)
				target := append([]float64(nil), heads...)
				d := make([]float64, b*tt*tt)
				return IndexerLoss(d, target, s, idx, b, tt, K, c.sparse, c.perToken), d
			}
			if l, _ := loss(); !(l > 0) {
				t.Fatalf("KL loss %g: want > 0", l)
			}
			gradCheck(t, []gcInput{{"q", q}, {"k", k}, {"w", w}}, func() []float64 {
				l, _ := loss()
				return []float64{l}
			}, func(dout []float64, g [][]float64) {
				_, d := loss()
				for i := range d {
					d[i] *= dout[0]
				}
				IndexerScoresBackward(g[0], g[1], g[2], d, q, k, w, b, tt, H, D, c.relu)
			}, false)
		})
	}
}

// TestIndexerScoresGEMMMatchesReference: the model's Sgemm form of the
// indexer's scores and their backward equals the float64-checked
// reference in float32 rounding, in one chunk of queries and in several.
func TestIndexerScoresGEMMMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	for _, c := range []struct{ b, t, H, D int }{{2, 7, 3, 4}, {1, 1200, 3, 8}} {
		if dsaQueryChunk(c.t, c.H) >= c.t && c.t > 100 {
			t.Fatalf("t=%d H=%d: one chunk, want several", c.t, c.H)
		}
		for _, relu := range []bool{true, false} {
			q, k, w := to32(randF64(rng, c.b*c.t*c.H*c.D, 1)), to32(randF64(rng, c.b*c.t*c.D, 1)), to32(randF64(rng, c.b*c.t*c.H, 1))
			ds := to32(randF64(rng, c.b*c.t*c.t, 1))
			want, got := make([]float32, c.b*c.t*c.t), make([]float32, c.b*c.t*c.t)
			IndexerScores(want, q, k, w, c.b, c.t, c.H, c.D, relu)
			IndexerScoresGEMM(got, q, k, w, c.b, c.t, c.H, c.D, relu)
			closeF32(t, "scores", got, want, 1e-5)
			grads := func(f func(dq, dk, dw []float32)) [3][]float32 {
				g := [3][]float32{make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(w))}
				for i := range g {
					for j := range g[i] {
						g[i][j] = 0.5 // both accumulate
					}
				}
				f(g[0], g[1], g[2])
				return g
			}
			ref := grads(func(dq, dk, dw []float32) { IndexerScoresBackward(dq, dk, dw, ds, q, k, w, c.b, c.t, c.H, c.D, relu) })
			gem := grads(func(dq, dk, dw []float32) {
				IndexerScoresBackwardGEMM(dq, dk, dw, ds, q, k, w, c.b, c.t, c.H, c.D, relu)
			})
			for i, name := range []string{"dq", "dk", "dw"} {
				closeF32(t, name, gem[i], ref[i], 1e-4)
			}
		}
	}
}

func closeF32(t *testing.T, name string, got, want []float32, tol float64) {
	t.Helper()
	var scale float64
	for _, v := range want {
		if !math.IsInf(float64(v), 0) {
			scale = max(scale, math.Abs(float64(v)))
		}
	}
	for i := range want {
		if math.IsInf(float64(want[i]), -1) != math.IsInf(float64(got[i]), -1) ||
			(!math.IsInf(float64(want[i]), 0) && math.Abs(float64(got[i]-want[i])) > tol*max(1, scale)) {
			t.Fatalf("%s[%d] = %g, want %g (scale %g)", name, i, got[i], want[i], scale)
		}
	}
}
