package cpu

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
)

// GemmShape is one benchmark shape: C(m×n) = op(A)(m×k)·op(B)(k×n).
type benchShape struct {
	name    string
	tA, tB  Transpose
	m, n, k int
}

// benchShapes are the square shapes and GPT-2 (d=768, 4d=3072) MLP shapes:
// forward Y = X·W, backward dX = dY·Wᵀ (NT) and dW = Xᵀ·dY (TN), with 1024
// or 4096 tokens.
var benchShapes = []benchShape{
	{"NN_1024", NoTrans, NoTrans, 1024, 1024, 1024},
	{"NN_2048", NoTrans, NoTrans, 2048, 2048, 2048},
	{"NN_M4096_K768_N3072", NoTrans, NoTrans, 4096, 3072, 768},
	{"NT_M1024_K3072_N768", NoTrans, Trans, 1024, 768, 3072},
	{"TN_M768_K1024_N3072", Trans, NoTrans, 768, 3072, 1024},
	{"NT_M4096_K768_N3072", NoTrans, Trans, 4096, 3072, 768},
	{"TN_M768_K4096_N3072", Trans, NoTrans, 768, 3072, 4096},
	{"NN_64", NoTrans, NoTrans, 64, 64, 64},
	{"NN_M1_K768_N3072", NoTrans, NoTrans, 1, 3072, 768},
}

// BenchmarkSgemm reports GFLOP/s (2mnk per call) for each shape on the
// active ISA and Threads(). Use -cpu to vary GOMAXPROCS and
// GOTRON_NUM_THREADS to vary the kernel's goroutines.
func BenchmarkSgemm(b *testing.B) {
	for _, s := range benchShapes {
		b.Run(fmt.Sprintf("%s_%v", s.name, ActiveISA()), func(b *testing.B) {
			benchGemm(b, s, Sgemm)
		})
	}
}

// sgemmFunc is Sgemm's signature (Sgemm, SgemmBF16).
type sgemmFunc func(tA, tB Transpose, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int)

func benchGemm(b *testing.B, s benchShape, gemm sgemmFunc) {
	rng := rand.New(rand.NewPCG(1, 1))
	x := randSlice(rng, s.m*s.k)
	y := randSlice(rng, s.k*s.n)
	c := make([]float32, s.m*s.n)
	lda, ldb := s.k, s.n
	if s.tA {
		lda = s.m
	}
	if s.tB {
		ldb = s.k
	}
	gemm(s.tA, s.tB, s.m, s.n, s.k, 1, x, lda, y, ldb, 0, c, s.n)
	b.ReportAllocs()
	cpu0 := processCPUSeconds()
	b.ResetTimer()
	for b.Loop() {
		gemm(s.tA, s.tB, s.m, s.n, s.k, 1, x, lda, y, ldb, 0, c, s.n)
	}
	gflop := 2 * float64(s.m) * float64(s.n) * float64(s.k) * float64(b.N) / 1e9
	b.ReportMetric(gflop/b.Elapsed().Seconds(), "GFLOP/s")
	// Per CPU-second: robust to other processes taking the cores.
	b.ReportMetric(gflop/(processCPUSeconds()-cpu0), "GFLOP/cpu-s")
}

// processCPUSeconds returns the user+system CPU time of this process.
func processCPUSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// BenchmarkSgemmKernel measures the active ISA's full-tile micro-kernel
// alone on cache-resident packed panels (kc = the set's kc): the ceiling
// the blocked driver can approach.
func BenchmarkSgemmKernel(b *testing.B) {
	ks := kernelsFor(ActiveISA())
	rng := rand.New(rand.NewPCG(2, 2))
	const strips = 8 // sweep several B strips like the driver does
	ap := randSlice(rng, ks.mr*ks.kc)
	bp := randSlice(rng, strips*ks.kc*ks.nr)
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

// BenchmarkPackBPanel times packing row-major B (TN and NN GEMMs) from
// memory, as the shared schedule does it: chunks of 12 strips of a kc×nc
// panel, panels visited in the GEMM's order over a 4096×3072 B (48 MiB, more
// than the L3), with the kernel set's strip packer (asm) and without it (Go
// copies). Reports GB/s read.
func BenchmarkPackBPanel(b *testing.B) {
	ks := kernelsFor(ActiveISA())
	const k, n, chunk = 4096, 3072, 384
	rng := rand.New(rand.NewPCG(3, 3))
	src := randSlice(rng, k*n)
	dst := make([]float32, ks.kc*chunk)
	goKS := ks
	goKS.strips = nil
	for _, v := range []struct {
		name string
		ks   *kernSet
	}{{"asm", &ks}, {"go", &goKS}} {
		if v.name == "asm" && ks.strips == nil {
			continue
		}
		b.Run(v.name, func(b *testing.B) {
			bytes := 0
			for b.Loop() {
				for jc := 0; jc < n; jc += ks.nc {
					for pc := 0; pc < k; pc += ks.kc {
						for j := jc; j < jc+ks.nc; j += chunk {
							packBPanel(v.ks, dst, NoTrans, src, n, pc, j, ks.kc, chunk)
							bytes += ks.kc * chunk * 4
						}
					}
				}
			}
			b.ReportMetric(float64(bytes)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}
