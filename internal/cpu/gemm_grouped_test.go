package cpu

import (
	"math"
	"math/rand"
	"testing"
)

// TestGroupedSgemm compares one grouped call over uneven groups (empty,
// one row, several row blocks) in every transposition with the float64
// reference, and with itself on one thread (bit for bit).
func TestGroupedSgemm(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	rows := []int{0, 1, 130, 7, 64}
	const n, k = 24, 40
	for _, tr := range [][2]Transpose{{NoTrans, Trans}, {NoTrans, NoTrans}, {Trans, NoTrans}} {
		tA, tB := tr[0], tr[1]
		var groups, loop []GemmGroup
		var c0 [][]float32
		for _, m := range rows {
			a := groupedRand(rng, m*k)
			b := groupedRand(rng, k*n)
			c := groupedRand(rng, m*n)
			c0 = append(c0, append([]float32(nil), c...))
			lda, ldb := k, n
			if tA == Trans {
				lda = m
			}
			if tB == Trans {
				ldb = k
			}
			groups = append(groups, GemmGroup{M: m, N: n, K: k, A: a, Lda: lda, B: b, Ldb: ldb, C: append([]float32(nil), c...), Ldc: n})
			loop = append(loop, GemmGroup{M: m, N: n, K: k, A: a, Lda: lda, B: b, Ldb: ldb, C: c, Ldc: n})
		}
		GroupedSgemm(false, tA, tB, 0.5, 1, groups)
		// one thread: the same bits (blocks are fixed, not per thread)
		prev := SetThreads(1)
		GroupedSgemm(false, tA, tB, 0.5, 1, loop)
		SetThreads(prev)
		for gi, g := range loop {
			want := make([]float64, g.M*g.N)
			for i := range g.M {
				for j := range g.N {
					var s float64
					for p := range g.K {
						ai, bi := i*g.Lda+p, p*g.Ldb+j
						if tA == Trans {
							ai = p*g.Lda + i
						}
						if tB == Trans {
							bi = j*g.Ldb + p
						}
						av, bv := g.A[ai], g.B[bi]
						s += float64(av) * float64(bv)
					}
					want[i*g.N+j] = 0.5*s + float64(c0[gi][i*g.N+j])
				}
			}
			for i := range want {
				got := groups[gi].C[i]
				if got != g.C[i] {
					t.Fatalf("%v%v group %d [%d]: %g, with one thread %g", tA, tB, gi, i, got, g.C[i])
				}
				if math.Abs(float64(got)-want[i]) > 1e-4*math.Max(1, math.Abs(want[i])) {
					t.Fatalf("%v%v group %d [%d]: %g, float64 %g", tA, tB, gi, i, got, want[i])
				}
			}
		}
	}
}

func groupedRand(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.NormFloat64())
	}
	return s
}
