package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestVocabSplitCrossEntropy splits the classes into parts, runs the row
// kernels on each part as vocab-parallel ranks do (max and sums combined
// between the passes), and compares the loss and gradient with the
// single-part CrossEntropyForward/Backward and the float64 reference.
func TestVocabSplitCrossEntropy(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct{ n, v, parts int }{{1, 1, 1}, {5, 22, 2}, {7, 3001, 3}, {33, 64, 4}, {9, 17, 2}} {
		t.Run(fmt.Sprintf("%dx%d/%d", tc.n, tc.v, tc.parts), func(t *testing.T) {
			n, v := tc.n, tc.v
			cfg := CrossEntropyConfig{N: n, V: v}
			x := round32(randF64(rng, n*v, 10))
			targets := make([]int32, n)
			for i := range targets {
				targets[i] = int32(rng.IntN(v))
			}
			dl := round32(randF64(rng, n, 1))
			losses, lse, dx := make([]float64, n), make([]float64, n), make([]float64, len(x))
			crossEntropyForwardRef(losses, lse, x, targets, cfg)
			crossEntropyBackwardRef(dx, x, lse, targets, dl, cfg)

			x32, dl32 := to32(x), to32(dl)
			l1, lse1, dx1 := make([]float32, n), make([]float32, n), make([]float32, len(x))
			CrossEntropyForward(l1, lse1, x32, targets, cfg)
			CrossEntropyBackward(dx1, x32, lse1, targets, dl32, cfg)

			// Each part holds columns [lo, hi) of every row.
			bounds := make([]int, tc.parts+1)
			for p := range bounds {
				bounds[p] = p * v / tc.parts
			}
			slice := func(p int) []float32 {
				lo, hi := bounds[p], bounds[p+1]
				s := make([]float32, 0, n*(hi-lo))
				for i := range n {
					s = append(s, x32[i*v+lo:i*v+hi]...)
				}
				return s
			}
			m := make([]float32, n)
			for i := range m {
				m[i] = float32(math.Inf(-1))
			}
			for p := range tc.parts {
				pm := make([]float32, n)
				RowMax(pm, slice(p), n, bounds[p+1]-bounds[p])
				for i := range m {
					m[i] = max(m[i], pm[i])
				}
			}
			sum := make([]float32, n)
			for p := range tc.parts {
				ps := make([]float32, n)
				RowExpSum(ps, slice(p), m, n, bounds[p+1]-bounds[p])
				for i := range sum {
					sum[i] += ps[i]
				}
			}
			lse32, loss := make([]float32, n), make([]float64, n)
			for i := range n {
				l := float64(m[i]) + math.Log(float64(sum[i]))
				lse32[i] = float32(l)
				loss[i] = l - float64(x32[i*v+int(targets[i])])
			}
			assertClose(t, "lse", lse32, lse, fastTol)
			assertClose(t, "losses", to32(loss), losses, fastTol)
			got := make([]float32, len(x))
			for p := range tc.parts {
				lo, hi := bounds[p], bounds[p+1]
				d := slice(p)
				RowSoftmaxScaled(d, d, lse32, dl32, n, hi-lo) // in place
				for i := range n {
					copy(got[i*v+lo:i*v+hi], d[i*(hi-lo):(i+1)*(hi-lo)])
				}
			}
			for i, tg := range targets {
				got[i*v+int(tg)] -= dl32[i]
			}
			assertClose(t, "dlogits", got, dx, fastTol)
			if tc.parts == 1 { // the same bits as the single-part kernel
				for i := range got {
					if got[i] != dx1[i] {
						t.Fatalf("dlogits[%d] = %g, CrossEntropyBackward %g", i, got[i], dx1[i])
					}
				}
			}
		})
	}
}
