package cpu

import (
	"math"
	"math/rand"
	"testing"
)

// TestGroupedSgemm compares one grouped call over uneven groups (empty,
// one row, one large enough to run alone on all threads and to be split
// by Sgemm, several small ones) in every transposition with the float64
// reference, and with a loop of Sgemm (or SgemmBF16) calls, one per group,
// bit for bit on one, two and three threads: each group is computed by the
// loop's own call, and the result does not depend on the thread count.
func TestGroupedSgemm(t *testing.T) {
	prevT := SetThreads(1)
	defer SetThreads(prevT)
	rng := rand.New(rand.NewSource(7))
	rows := []int{0, 1, 600, 7, 64, 70, 20}
	const n, k = 64, 72
	for _, bf16 := range []bool{false, true} {
		for _, tr := range [][2]Transpose{{NoTrans, Trans}, {NoTrans, NoTrans}, {Trans, NoTrans}} {
			tA, tB := tr[0], tr[1]
			var groups []GemmGroup
			for _, m := range rows {
				lda, ldb := k, n
				if tA == Trans {
					lda = max(m, 1)
				}
				if tB == Trans {
					ldb = k
				}
				groups = append(groups, GemmGroup{M: m, N: n, K: k, A: groupedRand(rng, m*k), Lda: lda, B: groupedRand(rng, k*n), Ldb: ldb, C: groupedRand(rng, m*n), Ldc: n})
			}
			loop := make([][]float32, len(groups))
			for gi, g := range groups {
				c := append([]float32(nil), g.C...)
				if bf16 {
					SgemmBF16(tA, tB, g.M, g.N, g.K, 0.5, g.A, g.Lda, g.B, g.Ldb, 1, c, g.Ldc)
				} else {
					Sgemm(tA, tB, g.M, g.N, g.K, 0.5, g.A, g.Lda, g.B, g.Ldb, 1, c, g.Ldc)
				}
				loop[gi] = c
			}
			for _, th := range []int{1, 2, 3} {
				SetThreads(th)
				run := make([]GemmGroup, len(groups))
				for gi, g := range groups {
					g.C = append([]float32(nil), g.C...)
					run[gi] = g
				}
				GroupedSgemm(bf16, tA, tB, 0.5, 1, run)
				SetThreads(1)
				for gi, g := range run {
					for i, got := range g.C {
						if got != loop[gi][i] {
							t.Fatalf("bf16=%v %v%v threads=%d group %d [%d]: %g, the loop's Sgemm %g", bf16, tA, tB, th, gi, i, got, loop[gi][i])
						}
					}
					if bf16 || th > 1 {
						continue
					}
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
								s += float64(g.A[ai]) * float64(g.B[bi])
							}
							want := 0.5*s + float64(groups[gi].C[i*g.N+j])
							if got := g.C[i*g.N+j]; math.Abs(float64(got)-want) > 1e-4*math.Max(1, math.Abs(want)) {
								t.Fatalf("%v%v group %d [%d,%d]: %g, float64 %g", tA, tB, gi, i, j, got, want)
							}
						}
					}
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
