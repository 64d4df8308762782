package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestSgemmSharedSchedule checks the shared-panel schedule (packing tickets
// of every part, panels packed one step ahead, k blocks accumulating in
// order) on shapes of several steps: two panels in n, the second a partial
// strip (so some packing tickets get no strips), and three k blocks. Each
// C element is computed with the same kernel calls in the same k order
// however rows are blocked, so 2 and 3 threads, and part 0 running a
// 3-part job alone (workers that never start), must give exactly the
// one-thread result.
func TestSgemmSharedSchedule(t *testing.T) {
	prevT := SetThreads(1)
	defer SetThreads(prevT)
	rng := rand.New(rand.NewPCG(7, 8))
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			ks := kernelsFor(isa)
			m, n, k := 13*ks.mr, ks.nc+ks.nr+5, 2*ks.kc+7
			for _, tr := range transposes[:2] { // B as stored and transposed: both packings
				g := gemmCase{tA: tr[0], tB: tr[1], m: m, n: n, k: k, alpha: 0.75, beta: -1, padA: 1, padC: 3}
				a, lda, b, ldb, c, ldc := g.operands(rng)
				SetThreads(1)
				want := append([]float32(nil), c...)
				Sgemm(g.tA, g.tB, m, n, k, g.alpha, a, lda, b, ldb, g.beta, want, ldc)
				same := func(how string, got []float32) {
					t.Helper()
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%v %v: %s: C[%d,%d] = %g, one thread gives %g", isa, g, how, i/ldc, i%ldc, got[i], want[i])
						}
					}
				}
				for _, th := range []int{2, 3} {
					SetThreads(th)
					got := append([]float32(nil), c...)
					Sgemm(g.tA, g.tB, m, n, k, g.alpha, a, lda, b, ldb, g.beta, got, ldc)
					same("threads "+string(rune('0'+th)), got)
				}
				got := append([]float32(nil), c...)
				j := getJob()
				j.tA, j.tB, j.m, j.n, j.k = g.tA, g.tB, m, n, k
				j.alpha, j.beta = g.alpha, g.beta
				j.a, j.lda, j.strideA = a, lda, 0
				j.b, j.ldb, j.strideB = b, ldb, 0
				j.c, j.ldc, j.strideC = got, ldc, 0
				j.batch = 1
				j.ks = ks
				j.plan(3)
				if j.mode != splitShared || j.parts != 3 || j.packChunks < 2 {
					t.Fatalf("%v %v: plan(3): mode %v, %d parts, %d packing chunks; want splitShared, 3, ≥ 2", isa, g, j.mode, j.parts, j.packChunks)
				}
				j.runPart(0)
				putJob(j)
				same("part 0 alone", got)
			}
		})
	}
}
