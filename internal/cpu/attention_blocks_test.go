package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// blockRows copies rows [lo, lo+n) of the sequence dimension of x (B, T,
// width) into a new (B, n, width) slice.
func blockRows(x []float32, B, T, width, lo, n int) []float32 {
	out := make([]float32, 0, B*n*width)
	for b := range B {
		out = append(out, x[(b*T+lo)*width:(b*T+lo+n)*width]...)
	}
	return out
}

// TestAttentionBlocksMatchWhole: attention over a sequence cut into chunks
// of c positions — each query chunk attending to the key chunks one call at
// a time with QPos/KPos and Accumulate, in an arbitrary order, as ring
// attention does — gives the whole sequence's output and log-sum-exp, and
// the backward of each (query chunk, key chunk) pair run with the final
// output and lse sums to the whole sequence's gradients. Odd chunk sizes,
// chunks crossing the 64-row tiles, GQA, causal and not, dropout keyed by
// position (so the blocks drop exactly what the whole sequence drops).
func TestAttentionBlocksMatchWhole(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 1))
	for _, tc := range []struct {
		cfg AttentionConfig
		c   int // chunk length
	}{
		{AttentionConfig{B: 2, T: 20, HQ: 4, HKV: 2, D: 8, Causal: true}, 5},
		{AttentionConfig{B: 1, T: 268, HQ: 2, HKV: 1, D: 8, Causal: true}, 67},
		{AttentionConfig{B: 2, T: 28, HQ: 2, HKV: 2, D: 5}, 7},
		{AttentionConfig{B: 2, T: 36, HQ: 4, HKV: 2, D: 8, Causal: true, Dropout: 0.2, DropoutSeed: 77, FirstHead: 4}, 9},
		{AttentionConfig{B: 1, T: 268, HQ: 2, HKV: 2, D: 4, Causal: true, Dropout: 0.1, DropoutSeed: 5}, 67},
	} {
		cfg, c := tc.cfg, tc.c
		t.Run(fmt.Sprintf("T%d-c%d-HQ%d-HKV%d-causal%v-drop%g", cfg.T, c, cfg.HQ, cfg.HKV, cfg.Causal, cfg.Dropout), func(t *testing.T) {
			B, T, HQ, HKV, D := cfg.B, cfg.T, cfg.HQ, cfg.HKV, cfg.D
			nq, nkv := B*T*HQ*D, B*T*HKV*D
			q, k, v := round32(randF64(rng, nq, 1)), round32(randF64(rng, nkv, 1)), round32(randF64(rng, nkv, 1))
			g := round32(randF64(rng, nq, 1))
			out, lse := make([]float64, nq), make([]float64, B*HQ*T)
			attentionForwardRef(out, lse, q, k, v, cfg)
			dq, dk, dv := make([]float64, nq), make([]float64, nkv), make([]float64, nkv)
			attentionBackwardRef(dq, dk, dv, g, q, k, v, lse, cfg)

			n := T / c
			q32, k32, v32, g32 := to32(q), to32(k), to32(v), to32(g)
			blk := cfg
			blk.T = c
			qc, kc, vc, gc := make([][]float32, n), make([][]float32, n), make([][]float32, n), make([][]float32, n)
			for a := range n {
				qc[a], gc[a] = blockRows(q32, B, T, HQ*D, a*c, c), blockRows(g32, B, T, HQ*D, a*c, c)
				kc[a], vc[a] = blockRows(k32, B, T, HKV*D, a*c, c), blockRows(v32, B, T, HKV*D, a*c, c)
			}
			oc, lc := make([][]float32, n), make([][]float32, n)
			for a := range n {
				oc[a], lc[a] = make([]float32, B*c*HQ*D), make([]float32, B*HQ*c)
				for j := range n { // ring order: own chunk first, then a-1, a-2, ...
					b := (a - j + n) % n
					blk.QPos, blk.KPos, blk.Accumulate = a*c, b*c, j > 0
					AttentionForward(oc[a], lc[a], qc[a], kc[b], vc[b], blk)
				}
				wantO := make([]float64, 0, B*c*HQ*D)
				wantL := make([]float64, 0, B*HQ*c)
				for bb := range B {
					wantO = append(wantO, out[(bb*T+a*c)*HQ*D:(bb*T+a*c+c)*HQ*D]...)
					for h := range HQ {
						wantL = append(wantL, lse[(bb*HQ+h)*T+a*c:][:c]...)
					}
				}
				assertClose(t, fmt.Sprintf("out chunk %d", a), oc[a], wantO, fastTol)
				assertClose(t, fmt.Sprintf("lse chunk %d", a), lc[a], wantL, fastTol)
			}
			dqc, dkc, dvc := make([][]float32, n), make([][]float32, n), make([][]float32, n)
			for a := range n {
				dqc[a], dkc[a], dvc[a] = make([]float32, B*c*HQ*D), make([]float32, B*c*HKV*D), make([]float32, B*c*HKV*D)
			}
			for a := range n {
				for b := range n {
					blk.QPos, blk.KPos, blk.Accumulate = a*c, b*c, false
					AttentionBackward(dqc[a], dkc[b], dvc[b], gc[a], qc[a], kc[b], vc[b], oc[a], lc[a], blk)
				}
			}
			for a := range n {
				assertClose(t, fmt.Sprintf("dq chunk %d", a), dqc[a], rows64(dq, B, T, HQ*D, a*c, c), fastTol)
				assertClose(t, fmt.Sprintf("dk chunk %d", a), dkc[a], rows64(dk, B, T, HKV*D, a*c, c), fastTol)
				assertClose(t, fmt.Sprintf("dv chunk %d", a), dvc[a], rows64(dv, B, T, HKV*D, a*c, c), fastTol)
			}
		})
	}
}

// rows64 is blockRows for float64.
func rows64(x []float64, B, T, width, lo, n int) []float64 {
	out := make([]float64, 0, B*n*width)
	for b := range B {
		out = append(out, x[(b*T+lo)*width:(b*T+lo+n)*width]...)
	}
	return out
}

// TestAttentionOffsetsZeroIsUnchanged: QPos = KPos = 0 and a first call
// without Accumulate are the plain kernel, bit for bit (the goldens pin the
// plain kernel), and a call whose keys all lie after its queries leaves an
// accumulated result exactly as it was.
func TestAttentionOffsetsZeroIsUnchanged(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	cfg := AttentionConfig{B: 1, T: 70, HQ: 2, HKV: 1, D: 8, Causal: true, Dropout: 0.2, DropoutSeed: 9}
	q, k, v := to32(randF64(rng, 70*2*8, 1)), to32(randF64(rng, 70*8, 1)), to32(randF64(rng, 70*8, 1))
	out, lse := make([]float32, len(q)), make([]float32, 2*70)
	AttentionForward(out, lse, q, k, v, cfg)
	later := cfg
	later.KPos, later.Accumulate = 70, true // keys 70..139: all in the future
	o2, l2 := append([]float32(nil), out...), append([]float32(nil), lse...)
	AttentionForward(o2, l2, q, k, v, later)
	for i := range out {
		if math.Float32bits(o2[i]) != math.Float32bits(out[i]) {
			t.Fatalf("out[%d] changed by a fully masked accumulate: %g -> %g", i, out[i], o2[i])
		}
	}
	for i := range lse {
		if math.Float32bits(l2[i]) != math.Float32bits(lse[i]) {
			t.Fatalf("lse[%d] changed by a fully masked accumulate: %g -> %g", i, lse[i], l2[i])
		}
	}
}
