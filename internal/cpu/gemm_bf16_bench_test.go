package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkSgemmBF16 reports GFLOP/s (2mnk per call) of SgemmBF16 for each
// of Sgemm's benchmark shapes on the active ISA and Threads(); "bf16" in
// the name means the VDPBF16PS kernels, "rounded" the portable path.
func BenchmarkSgemmBF16(b *testing.B) {
	path := "rounded"
	if HasBF16GEMM() {
		path = "bf16"
	}
	for _, s := range benchShapes {
		b.Run(fmt.Sprintf("%s_%v_%s", s.name, ActiveISA(), path), func(b *testing.B) {
			benchGemm(b, s, SgemmBF16)
		})
	}
}

// BenchmarkSgemmBF16Kernel measures the full-tile bf16-pair kernel alone
// on cache-resident packed panels (kc = the set's kc k steps): the ceiling
// the blocked driver can approach. Without AVX512_BF16 it measures the
// fp32 kernel the portable path uses.
func BenchmarkSgemmBF16Kernel(b *testing.B) {
	ks := bf16KernelsFor(ActiveISA())
	rng := rand.New(rand.NewPCG(2, 2))
	const strips = 8
	ap := randSlice(rng, ks.mr*ks.kc)
	bp := randSlice(rng, strips*ks.kc*ks.nr)
	if ks.bf16 == packPairs { // bf16 pairs of normal values
		for _, s := range [][]float32{ap, bp} {
			w := words(s)
			for i, v := range s {
				w[i] = pairBits(v, -v/2)
			}
		}
	}
	c := make([]float32, ks.mr*ks.nr*strips)
	b.Run(fmt.Sprintf("%dx%d_kc%d_%v", ks.mr, ks.nr, ks.kc, ActiveISA()), func(b *testing.B) {
		cpu0 := processCPUSeconds()
		for b.Loop() {
			for s := 0; s < strips; s++ {
				ks.kerns[ks.mr-1](ks.kc, &ap[0], &bp[s*ks.kc*ks.nr], ks.nr*4, &c[s*ks.nr], strips*ks.nr*4, 1, 1, 1)
			}
		}
		gflop := 2 * float64(ks.mr*ks.nr*ks.kc*strips) * float64(b.N) / 1e9
		b.ReportMetric(gflop/b.Elapsed().Seconds(), "GFLOP/s")
		b.ReportMetric(gflop/(processCPUSeconds()-cpu0), "GFLOP/cpu-s")
	})
}
