package cpu

import (
	"fmt"
	"math/rand"
	"syscall"
	"testing"
	"time"
)

// moeProducts is one MoE layer's expert products for tokens rows per
// expert (counts), hidden h and ffn f with SwiGLU (fc1 out 2f): forward
// fc1 and fc2, and backward's data and weight gradients, as
// tensor.GroupedLinear issues them.
func moeProducts(rng *rand.Rand, counts []int, h, f int) [][]GemmGroup {
	var fwd1, fwd2, dx1, dx2, dw1, dw2 []GemmGroup
	for _, c := range counts {
		x := groupedRand(rng, c*h)
		w1 := groupedRand(rng, 2*f*h)
		a := groupedRand(rng, c*f)
		w2 := groupedRand(rng, h*f)
		y1 := make([]float32, c*2*f)
		y2 := make([]float32, c*h)
		fwd1 = append(fwd1, GemmGroup{M: c, N: 2 * f, K: h, A: x, Lda: h, B: w1, Ldb: h, C: y1, Ldc: 2 * f})
		fwd2 = append(fwd2, GemmGroup{M: c, N: h, K: f, A: a, Lda: f, B: w2, Ldb: f, C: y2, Ldc: h})
		// dx = g·W (NoTrans, NoTrans)
		dx1 = append(dx1, GemmGroup{M: c, N: h, K: 2 * f, A: y1, Lda: 2 * f, B: w1, Ldb: h, C: make([]float32, c*h), Ldc: h})
		dx2 = append(dx2, GemmGroup{M: c, N: f, K: h, A: y2, Lda: h, B: w2, Ldb: f, C: make([]float32, c*f), Ldc: f})
		// dW = gᵀ·x (Trans, NoTrans)
		dw1 = append(dw1, GemmGroup{M: 2 * f, N: h, K: c, A: y1, Lda: 2 * f, B: x, Ldb: h, C: make([]float32, 2*f*h), Ldc: h})
		dw2 = append(dw2, GemmGroup{M: h, N: f, K: c, A: y2, Lda: h, B: a, Ldb: f, C: make([]float32, h*f), Ldc: f})
	}
	return [][]GemmGroup{fwd1, fwd2, dx1, dx2, dw1, dw2}
}

var moeTrans = [][2]Transpose{{NoTrans, Trans}, {NoTrans, Trans}, {NoTrans, NoTrans}, {NoTrans, NoTrans}, {Trans, NoTrans}, {Trans, NoTrans}}

func moeCounts(rng *rand.Rand, experts, rows int) []int {
	counts := make([]int, experts)
	for range rows {
		counts[rng.Intn(experts)]++
	}
	return counts
}

// BenchmarkGroupedMoE times one MoE layer's expert products (forward and
// backward) as one grouped call per product and as a loop of Sgemm calls,
// in wall time and in the process's CPU time (cpu-ms/op, which a shared
// machine's other load hardly changes),
// for `gotron bench moe`'s micro-batches: Mixtral-style 8 experts (512
// tokens top-2: about 128 rows each) and 64 small ones (256 tokens), with
// the FMA peak of the same threads (%peak).
func BenchmarkGroupedMoE(b *testing.B) {
	peak := FMAPeak(Threads(), 500*time.Millisecond)
	for _, s := range []struct{ experts, rows, h, f int }{{8, 1024, 512, 1408}, {64, 512, 512, 176}} {
		rng := rand.New(rand.NewSource(1))
		ps := moeProducts(rng, moeCounts(rng, s.experts, s.rows), s.h, s.f)
		var fmas int
		for _, p := range ps {
			for _, g := range p {
				fmas += g.M * g.N * g.K
			}
		}
		for _, variant := range []string{"grouped", "loop"} {
			grouped := variant != "loop"
			b.Run(fmt.Sprintf("E%d/%s", s.experts, variant), func(b *testing.B) {
				cpu0 := cpuSeconds()
				for range b.N {
					for i, p := range ps {
						tA, tB := moeTrans[i][0], moeTrans[i][1]
						if grouped {
							GroupedSgemm(false, tA, tB, 1, 1, p)
							continue
						}
						for _, g := range p {
							Sgemm(tA, tB, g.M, g.N, g.K, 1, g.A, g.Lda, g.B, g.Ldb, 1, g.C, g.Ldc)
						}
					}
				}
				b.ReportMetric(2*float64(fmas)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				b.ReportMetric(100*2*float64(fmas)*float64(b.N)/b.Elapsed().Seconds()/1e9/peak, "%peak")
				b.ReportMetric((cpuSeconds()-cpu0)*1e3/float64(b.N), "cpu-ms/op")
			})
		}
	}
}

// cpuSeconds is the process's user and system CPU time: unlike the wall
// time, it hardly depends on what else the (shared) machine runs.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
