package cpu

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
)

// packedShapes cross the kernels' edges: m around the tile heights and mc
// blocks, n around strip widths and the nc group, k across k blocks.
var packedShapes = [][3]int{
	{1, 1, 1}, {1, 7, 3}, {3, 1, 5}, {13, 17, 19}, {14, 32, 8}, {15, 33, 9},
	{1, 97, 400}, {6, 16, 1}, {7, 67, 389}, {41, 100, 811}, {170, 40, 17},
	{2, 45, 59}, {1, 3100, 530}, {150, 1601, 70}, {5, 50, 1030},
}

// TestSgemmPackedFloat32 holds SgemmPacked (B packed in float32) against
// SgemmRef for both stored layouts of B on every ISA, and, where Sgemm
// packs B (B stored n×k and more rows than the dot-product path takes),
// bit for bit against Sgemm: the serving engine relies on that to decode a
// lone sequence exactly as gotron generate does.
func TestSgemmPackedFloat32(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	scalars := [][2]float32{{1, 0}, {1, 1}, {-0.5, 2}}
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			for _, tB := range []Transpose{NoTrans, Trans} {
				for si, s := range packedShapes {
					sc := scalars[si%len(scalars)]
					g := gemmCase{tB: tB, m: s[0], n: s[1], k: s[2], alpha: sc[0], beta: sc[1], padA: si % 3, padB: (si + 1) % 3, padC: si % 2}
					p := prepare(g, rng)
					pb := PackB(tB, g.k, g.n, p.b, p.ldb, PackedFloat32)
					got := append([]float32(nil), p.c...)
					SgemmPacked(g.m, g.alpha, p.a, p.lda, pb, g.beta, got, p.ldc)
					checkClose(t, g, got, p.want, p.bound, p.ldc)
					if tB == Trans && (isa != ISAAVX512 || g.m > maxDotRows) {
						ref := append([]float32(nil), p.c...)
						Sgemm(NoTrans, Trans, g.m, g.n, g.k, g.alpha, p.a, p.lda, p.b, p.ldb, g.beta, ref, p.ldc)
						for i := range ref {
							if math.Float32bits(ref[i]) != math.Float32bits(got[i]) {
								t.Fatalf("%v %v: C[%d] = %g, Sgemm gives %g: not bit-identical", isa, g, i, got[i], ref[i])
							}
						}
					}
				}
			}
		})
	}
}

// TestSgemmPackedBFloat16 checks the wide kernels: with B's values bf16
// already, the bf16-packed product equals the float32-packed one bit for
// bit (widening is exact), and with arbitrary B it equals the product with
// B rounded to bf16 (round to nearest even).
func TestSgemmPackedBFloat16(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			for _, tB := range []Transpose{NoTrans, Trans} {
				for si, s := range packedShapes {
					g := gemmCase{tB: tB, m: s[0], n: s[1], k: s[2], alpha: 1, beta: float32(si % 2), padA: si % 2, padB: si % 3, padC: (si + 1) % 2}
					p := prepare(g, rng)
					rounded := append([]float32(nil), p.b...)
					for i, v := range rounded {
						if !math.IsNaN(float64(v)) {
							rounded[i] = RoundBF16(v)
						}
					}
					pb := PackB(tB, g.k, g.n, p.b, p.ldb, PackedBFloat16)
					if pb.Type() != PackedBFloat16 || pb.Bytes() != int64(2*g.k*ceilDiv(g.n, kernelsFor(isa).nr)*kernelsFor(isa).nr) {
						t.Fatalf("%v: packed %v, %d bytes", g, pb.Type(), pb.Bytes())
					}
					got := append([]float32(nil), p.c...)
					SgemmPacked(g.m, g.alpha, p.a, p.lda, pb, g.beta, got, p.ldc)
					want := append([]float32(nil), p.c...)
					SgemmPacked(g.m, g.alpha, p.a, p.lda, PackB(tB, g.k, g.n, rounded, p.ldb, PackedFloat32), g.beta, want, p.ldc)
					for i := range want {
						if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
							t.Fatalf("%v %v: C[%d] = %g, with B rounded to bf16 in float32: %g", isa, g, i, got[i], want[i])
						}
					}
					// And against the reference with rounded B: the bf16
					// product is a product, not just self-consistent.
					ref := append([]float32(nil), p.c...)
					SgemmRef(NoTrans, tB, g.m, g.n, g.k, g.alpha, p.a, p.lda, rounded, p.ldb, g.beta, ref, p.ldc)
					checkClose(t, g, got, ref, p.bound, p.ldc)
				}
			}
		})
	}
}

// TestSgemmPackedThreads splits the strips over 1, 2 and 3 goroutines:
// every split gives the same bits (each element is computed by one
// goroutine in one order).
func TestSgemmPackedThreads(t *testing.T) {
	prev := SetThreads(1)
	defer SetThreads(prev)
	rng := rand.New(rand.NewPCG(9, 10))
	g := gemmCase{tB: Trans, m: 9, n: 2051, k: 700, alpha: 1, beta: 0}
	p := prepare(g, rng)
	for _, typ := range []PackedType{PackedFloat32, PackedBFloat16} {
		pb := PackB(Trans, g.k, g.n, p.b, p.ldb, typ)
		var first []float32
		for _, th := range []int{1, 2, 3} {
			SetThreads(th)
			got := append([]float32(nil), p.c...)
			SgemmPacked(g.m, 1, p.a, p.lda, pb, 0, got, p.ldc)
			if first == nil {
				first = got
				continue
			}
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(first[i]) {
					t.Fatalf("%v, %d threads: C[%d] = %g, 1 thread %g", typ, th, i, got[i], first[i])
				}
			}
		}
	}
}

// TestSgemmPackedBias holds SgemmPackedBias to SgemmPacked followed by Add
// of the bias to each row, bit for bit, on every ISA and with 1 to 3
// threads (each adds the bias to its own columns): float32 and bfloat16 B,
// one row (the pair kernels) to several tiles, n off the strip width.
func TestSgemmPackedBias(t *testing.T) {
	prev := SetThreads(1)
	defer SetThreads(prev)
	rng := rand.New(rand.NewPCG(13, 14))
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			for _, s := range [][3]int{{1, 70, 33}, {1, 3100, 530}, {9, 2051, 700}, {32, 300, 96}} {
				g := gemmCase{tB: Trans, m: s[0], n: s[1], k: s[2], alpha: 1, padC: 3}
				p := prepare(g, rng)
				bias := make([]float32, g.n)
				for i := range bias {
					bias[i] = float32(rng.NormFloat64())
				}
				for _, typ := range []PackedType{PackedFloat32, PackedBFloat16} {
					pb := PackB(Trans, g.k, g.n, p.b, p.ldb, typ)
					want := append([]float32(nil), p.c...)
					SgemmPacked(g.m, 1, p.a, p.lda, pb, 0, want, p.ldc)
					for i := range g.m {
						row := want[i*p.ldc : i*p.ldc+g.n]
						Add(row, row, bias)
					}
					for _, th := range []int{1, 2, 3} {
						SetThreads(th)
						got := append([]float32(nil), p.c...)
						SgemmPackedBias(g.m, p.a, p.lda, pb, bias, got, p.ldc)
						for i := range got {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("%v %v %v, %d threads: C[%d] = %g, SgemmPacked + Add %g", isa, typ, s, th, i, got[i], want[i])
							}
						}
					}
				}
			}
		})
	}
}

// TestSgemmPackedAllocs: steady-state calls allocate nothing.
func TestSgemmPackedAllocs(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	g := gemmCase{tB: Trans, m: 4, n: 300, k: 200, alpha: 1}
	p := prepare(g, rng)
	pb := PackB(Trans, g.k, g.n, p.b, p.ldb, PackedBFloat16)
	c := append([]float32(nil), p.c...)
	SgemmPacked(g.m, 1, p.a, p.lda, pb, 0, c, p.ldc)
	if n := testing.AllocsPerRun(20, func() { SgemmPacked(g.m, 1, p.a, p.lda, pb, 0, c, p.ldc) }); n > 0 {
		t.Errorf("SgemmPacked allocates %v times per call", n)
	}
}

// TestSgemmPackedPanics: shapes that do not fit the slices are refused
// with a message, before any kernel reads outside them.
func TestSgemmPackedPanics(t *testing.T) {
	b := make([]float32, 12)
	pb := PackB(NoTrans, 3, 4, b, 4, PackedFloat32)
	for name, f := range map[string]func(){
		"short B":  func() { PackB(NoTrans, 4, 4, b, 4, PackedFloat32) },
		"zero k":   func() { PackB(NoTrans, 0, 4, b, 4, PackedFloat32) },
		"short A":  func() { SgemmPacked(2, 1, make([]float32, 5), 3, pb, 0, make([]float32, 8), 4) },
		"short C":  func() { SgemmPacked(2, 1, make([]float32, 6), 3, pb, 0, make([]float32, 7), 4) },
		"small ld": func() { SgemmPacked(2, 1, make([]float32, 6), 2, pb, 0, make([]float32, 8), 4) },
		"short bias": func() {
			SgemmPackedBias(2, make([]float32, 6), 3, pb, make([]float32, 3), make([]float32, 8), 4)
		},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// BenchmarkSgemmPacked times decode-shaped products (m rows against a
// GPT-2-sized weight stored (out, in)) through Sgemm and through a packed
// B in float32 and bfloat16; GB/s counts the weight bytes read per call.
func BenchmarkSgemmPacked(b *testing.B) {
	for _, s := range [][3]int{{1, 3072, 768}, {1, 50304, 768}, {8, 3072, 768}, {32, 3072, 768}, {128, 3072, 768}} {
		m, n, k := s[0], s[1], s[2]
		rng := rand.New(rand.NewPCG(1, 1))
		w := make([]float32, n*k)
		for i := range w {
			w[i] = float32(rng.NormFloat64())
		}
		a, c := make([]float32, m*k), make([]float32, m*n)
		report := func(b *testing.B, bytes int64) {
			sec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(2*float64(m*n*k)/sec/1e9, "GFLOP/s")
			b.ReportMetric(float64(bytes)/sec/1e9, "GB/s")
		}
		b.Run(fmtShape("Sgemm", m, n, k), func(b *testing.B) {
			for b.Loop() {
				Sgemm(NoTrans, Trans, m, n, k, 1, a, k, w, k, 0, c, n)
			}
			report(b, int64(4*n*k))
		})
		for _, typ := range []PackedType{PackedFloat32, PackedBFloat16} {
			pb := PackB(Trans, k, n, w, k, typ)
			b.Run(fmtShape("packed-"+typ.String(), m, n, k), func(b *testing.B) {
				for b.Loop() {
					SgemmPacked(m, 1, a, k, pb, 0, c, n)
				}
				report(b, pb.Bytes())
			})
		}
	}
}

func fmtShape(name string, m, n, k int) string {
	return name + "/m" + itoa(m) + "_n" + itoa(n) + "_k" + itoa(k)
}

func itoa(v int) string { return strconv.Itoa(v) }
