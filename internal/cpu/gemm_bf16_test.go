package cpu

import (
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	xcpu "golang.org/x/sys/cpu"
)

// roundedCopy returns s with every element rounded to bf16 (NaN padding
// stays NaN).
func roundedCopy(s []float32) []float32 {
	o := append([]float32(nil), s...)
	roundBF16Slice(o)
	return o
}

// prepareBF16 is prepare with the reference (SgemmRef in float64) and the
// error bound computed on bf16-rounded A and B: SgemmBF16 must match it to
// fp32 accumulation accuracy.
func prepareBF16(g gemmCase, rng *rand.Rand) *prepared {
	p := &prepared{g: g}
	p.a, p.lda, p.b, p.ldb, p.c, p.ldc = g.operands(rng)
	ra, rb := roundedCopy(p.a), roundedCopy(p.b)
	p.want = append([]float32(nil), p.c...)
	SgemmRef(g.tA, g.tB, g.m, g.n, g.k, g.alpha, ra, p.lda, rb, p.ldb, g.beta, p.want, p.ldc)
	abs := func(s []float32) []float32 {
		o := make([]float32, len(s))
		for i, v := range s {
			if !math.IsNaN(float64(v)) {
				o[i] = float32(math.Abs(float64(v)))
			}
		}
		return o
	}
	p.bound = abs(p.c)
	SgemmRef(g.tA, g.tB, g.m, g.n, g.k, float32(math.Abs(float64(g.alpha))), abs(ra), p.lda, abs(rb), p.ldb,
		float32(math.Abs(float64(g.beta))), p.bound, p.ldc)
	return p
}

// checkBF16 runs SgemmBF16 on a fresh copy of C and compares with the
// bf16-input reference.
func (p *prepared) checkBF16(t *testing.T) {
	t.Helper()
	g := p.g
	got := append([]float32(nil), p.c...)
	SgemmBF16(g.tA, g.tB, g.m, g.n, g.k, g.alpha, p.a, p.lda, p.b, p.ldb, g.beta, got, p.ldc)
	checkClose(t, g, got, p.want, p.bound, p.ldc)
}

// TestRoundBF16 checks round-to-nearest-even, specials and overflow.
func TestRoundBF16(t *testing.T) {
	u := float32(1.0 / 128) // bf16 spacing in [1, 2)
	for _, tc := range []struct{ in, want float32 }{
		{1, 1}, {-2.5, -2.5}, {0, 0},
		{1 + u/2, 1},                  // tie: to even (1)
		{1 + 3*u/2, 1 + 2*u},          // tie: to even (1+2u)
		{1 + u/2 + u/64, 1 + u},       // above the tie: up
		{-(1 + u/2 + u/64), -(1 + u)}, // sign symmetric
		{math.MaxFloat32, float32(math.Inf(1))},
		{float32(math.Inf(-1)), float32(math.Inf(-1))},
		{math.Float32frombits(0x7f7f0000), math.Float32frombits(0x7f7f0000)}, // largest bf16
		{math.Float32frombits(0x7f7f8000), float32(math.Inf(1))},             // tie to even: overflows
		{math.Float32frombits(0x00018000), math.Float32frombits(0x00020000)}, // denormal tie: to even
	} {
		if got := RoundBF16(tc.in); got != tc.want {
			t.Errorf("RoundBF16(%g) = %g, want %g", tc.in, got, tc.want)
		}
	}
	for _, bits := range []uint32{0x7fc00000, 0x7f800001, 0xff80ffff, 0x7fffffff} {
		if got := RoundBF16(math.Float32frombits(bits)); !math.IsNaN(float64(got)) {
			t.Errorf("RoundBF16(NaN %#x) = %g, want NaN", bits, got)
		}
	}
	// Every rounded value is a bf16: its low 16 bits are zero.
	rng := rand.New(rand.NewPCG(11, 12))
	for range 1000 {
		x := float32(rng.NormFloat64() * 1e3)
		r := RoundBF16(x)
		if math.Float32bits(r)&0xffff != 0 || math.Abs(float64(r-x)) > math.Abs(float64(x))/256 {
			t.Fatalf("RoundBF16(%g) = %g", x, r)
		}
	}
}

// TestSgemmBF16Shapes holds every ISA path (the VDPBF16PS kernels where
// the CPU has them, the rounding fp32 path elsewhere) against the float64
// reference on bf16-rounded inputs, over all transposes, edge tiles in m,
// n and k (odd k, k = 1, m = 1, several k blocks) and alpha/beta,
// including beta == 0 with NaNs in C and NaN padding around every matrix.
func TestSgemmBF16Shapes(t *testing.T) {
	shapes := [][3]int{
		{1, 1, 1}, {1, 7, 3}, {3, 1, 5}, {2, 3, 0}, {0, 4, 4},
		{13, 17, 19}, {14, 32, 8}, {15, 33, 9}, {29, 31, 37}, {64, 64, 64},
		{1, 97, 400}, {97, 1, 31}, {6, 16, 1}, {7, 67, 389}, {41, 100, 1025},
		{170, 40, 17}, {3, 3100, 5}, {2, 45, 59}, {1, 9, 50}, {28, 64, 2},
	}
	scalars := [][2]float32{{1, 0}, {1, 1}, {-0.5, 2}, {0, 0.5}}
	rng := rand.New(rand.NewPCG(21, 22))
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			wantFast := isa == ISAAVX512 && xcpu.X86.HasAVX512BF16
			if HasBF16GEMM() != wantFast {
				t.Fatalf("%v: HasBF16GEMM() = %v, want %v", isa, HasBF16GEMM(), wantFast)
			}
			for _, tr := range transposes {
				for si, s := range shapes {
					sc := scalars[si%len(scalars)]
					for _, ab := range [][2]float32{sc, {1, 0}} {
						g := gemmCase{tA: tr[0], tB: tr[1], m: s[0], n: s[1], k: s[2], alpha: ab[0], beta: ab[1],
							padA: si % 3, padB: (si + 1) % 3, padC: si % 2}
						prepareBF16(g, rng).checkBF16(t)
					}
				}
			}
		})
	}
}

// TestSgemmBF16Rounds checks that inputs really are rounded: with
// A = 1 + 2^-9 (which rounds to 1 in bf16) and B = 1, Sgemm gives
// k·(1+2^-9) and SgemmBF16 exactly k, far outside the fp32 tolerance; and
// B = 1 + 3·2^-9 rounds up to 1 + 2^-7.
func TestSgemmBF16Rounds(t *testing.T) {
	const m, n, k = 5, 40, 63
	a, b := make([]float32, m*k), make([]float32, k*n)
	for i := range a {
		a[i] = 1 + 1.0/512
	}
	for i := range b {
		b[i] = 1
	}
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			c32, c16 := make([]float32, m*n), make([]float32, m*n)
			Sgemm(NoTrans, NoTrans, m, n, k, 1, a, k, b, n, 0, c32, n)
			SgemmBF16(NoTrans, NoTrans, m, n, k, 1, a, k, b, n, 0, c16, n)
			for i := range c16 {
				if c16[i] != k || math.Abs(float64(c32[i])-k*(1+1.0/512)) > 1e-4 {
					t.Fatalf("%v: C[%d]: SgemmBF16 %g (want %d), Sgemm %g (want %g)", isa, i, c16[i], k, c32[i], k*(1+1.0/512))
				}
			}
			b3 := make([]float32, n*k)
			for i := range b3 {
				b3[i] = 1 + 3.0/512
			}
			SgemmBF16(Trans, Trans, m, n, k, 1, b3, m, b3, k, 0, c16, n)
			want := float32(k * (1 + 1.0/128) * (1 + 1.0/128))
			for i := range c16 {
				if math.Abs(float64(c16[i]-want)) > 1e-4 {
					t.Fatalf("%v: TT C[%d] = %g, want %g", isa, i, c16[i], want)
				}
			}
		})
	}
}

// TestSgemmBF16LargeK checks the accumulation error stays within the fp32
// bound Σ|a||b|·k·2^-23 (times a small constant) for long dot products,
// across several k blocks, on every ISA.
func TestSgemmBF16LargeK(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			for _, tr := range transposes {
				prepareBF16(gemmCase{tA: tr[0], tB: tr[1], m: 17, n: 35, k: 6001, alpha: 1, beta: 0}, rng).checkBF16(t)
			}
		})
	}
}

// TestSgemmBF16Threads checks the shared-panel, row and column splits on 2
// and 3 threads, and batched calls, against the reference.
func TestSgemmBF16Threads(t *testing.T) {
	prevT := SetThreads(1)
	defer SetThreads(prevT)
	rng := rand.New(rand.NewPCG(25, 26))
	// {120, 1600, 530} spans two B panels and two k blocks in shared mode
	// (only NN and TT: it is the slowest reference).
	shapes := [][3]int{{300, 97, 151}, {97, 301, 150}, {1, 4099, 300}, {120, 1600, 530}}
	for ti, tr := range transposes {
		for si, s := range shapes {
			if si == 3 && ti%3 != 0 {
				continue
			}
			p := prepareBF16(gemmCase{tA: tr[0], tB: tr[1], m: s[0], n: s[1], k: s[2], alpha: 0.75, beta: -1, padA: 1, padC: 3}, rng)
			for _, isa := range isasToTest() {
				withISA(t, isa, func() {
					for _, th := range []int{2, 3} {
						SetThreads(th)
						p.checkBF16(t)
					}
				})
			}
		}
	}
}

// TestSgemmStridedBF16 compares each batch item with its own reference.
func TestSgemmStridedBF16(t *testing.T) {
	prevT := SetThreads(2)
	defer SetThreads(prevT)
	rng := rand.New(rand.NewPCG(27, 28))
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			for _, tc := range []stridedCase{{64, 64, 64, 12}, {33, 17, 65, 5}, {150, 100, 181, 3}} {
				for _, tr := range transposes {
					checkStrided(t, rng, isa, tr, tc, SgemmStridedBF16, roundedCopy, 1e-5)
				}
			}
		})
	}
}

// TestSgemmBF16Allocs checks steady-state calls allocate nothing.
func TestSgemmBF16Allocs(t *testing.T) {
	prevT := SetThreads(1)
	defer SetThreads(prevT)
	rng := rand.New(rand.NewPCG(29, 30))
	m, n, k := 256, 512, 384
	a, b, c := randSlice(rng, m*k), randSlice(rng, k*n), randSlice(rng, m*n*4)
	for _, th := range []int{1, 2} {
		SetThreads(th)
		for _, isa := range isasToTest() {
			withISA(t, isa, func() {
				for name, f := range map[string]func(){
					"packed":     func() { SgemmBF16(NoTrans, NoTrans, m, n, k, 1, a, k, b, n, 0, c, n) },
					"transposed": func() { SgemmBF16(Trans, Trans, m, m, k, 1, a, m, b, k, 1, c, m) },
					"gemv":       func() { SgemmBF16(NoTrans, Trans, 1, n, k, 1, a, k, b, k, 0, c, n) },
					"batched":    func() { SgemmStridedBF16(NoTrans, Trans, 64, 64, 64, 1, a, 64, 4096, b, 64, 4096, 0, c, 64, 4096, 8) },
				} {
					if got := testing.AllocsPerRun(5, f); got != 0 {
						t.Errorf("%v threads=%d %s: %v allocations per call, want 0", isa, th, name, got)
					}
				}
			})
		}
	}
}

// TestSgemmBF16Panics checks argument errors name the argument.
func TestSgemmBF16Panics(t *testing.T) {
	a := make([]float32, 12)
	for _, tc := range []struct {
		want string
		f    func()
	}{
		{"ldA=2, want ≥ 3", func() { SgemmBF16(NoTrans, NoTrans, 2, 2, 3, 1, a, 2, a, 2, 0, a, 2) }},
		{"len(B)=12, want ≥ 16", func() { SgemmBF16(NoTrans, Trans, 2, 4, 4, 1, a, 4, a, 4, 0, a, 4) }},
		{"strideC=0 < 1", func() { SgemmStridedBF16(NoTrans, NoTrans, 1, 1, 1, 1, a, 1, 1, a, 1, 1, 0, a, 1, 0, 2) }},
	} {
		func() {
			defer func() {
				if msg, _ := recover().(string); !strings.Contains(msg, tc.want) {
					t.Errorf("panic %q, want a message containing %q", msg, tc.want)
				}
			}()
			tc.f()
		}()
	}
}

// TestBF16PairPackers holds the pair packers (AVX-512 assembly on amd64)
// bit for bit to their Go statements on random values, ties, NaNs with
// full payloads, infinities, denormals and the largest floats, at lengths
// that exercise the 16-wide loops and the masked or Go tails.
func TestBF16PairPackers(t *testing.T) {
	if runtime.GOARCH == "amd64" && DetectedISA() < ISAAVX512 {
		t.Skip("the pair packers run only with AVX-512")
	}
	rng := rand.New(rand.NewPCG(31, 32))
	specials := []uint32{0x7fffffff, 0xffffffff, 0x7fc00000, 0x7f800001, 0x7f800000, 0xff800000, 0x7f7fffff,
		0x7f7f8000, 0x3f808000, 0x3f818000, 0x00018000, 0x80000001, 0, 0x80000000}
	src := make([]float32, 200)
	for i := range src {
		if i%3 == 0 {
			src[i] = math.Float32frombits(specials[i/3%len(specials)])
		} else {
			src[i] = math.Float32frombits(rng.Uint32())
		}
	}
	for _, n := range []int{1, 7, 14, 16, 17, 32, 45, 64, 99} {
		got, want := make([]uint32, n+1), make([]uint32, n+1)
		pairRows(src, src[100:], got[:n])
		pairRowsGo(src, src[100:], want[:n])
		for j := range want {
			if got[j] != want[j] {
				t.Fatalf("pairRows n=%d: word %d = %#x, want %#x", n, j, got[j], want[j])
			}
		}
		pairsOf(src, got[:n])
		pairsOfGo(src, want[:n])
		for j := range want {
			if got[j] != want[j] {
				t.Fatalf("pairsOf n=%d: word %d = %#x, want %#x", n, j, got[j], want[j])
			}
		}
	}
}
