package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

// isasToTest lists every ISA path this CPU can run.
func isasToTest() []ISA {
	var out []ISA
	for i := ISAGeneric; i <= DetectedISA(); i++ {
		out = append(out, i)
	}
	return out
}

// withISA runs f with the kernels forced to isa.
func withISA(t testing.TB, isa ISA, f func()) {
	prev := SetISA(isa)
	defer SetISA(prev)
	if got := ActiveISA(); got != isa {
		t.Fatalf("SetISA(%v): active ISA is %v", isa, got)
	}
	f()
}

// gemmCase is one Sgemm call; padA/padB/padC widen the leading dimensions.
type gemmCase struct {
	tA, tB           Transpose
	m, n, k          int
	alpha, beta      float32
	padA, padB, padC int
}

func (g gemmCase) String() string {
	t := func(x Transpose) string {
		if x {
			return "T"
		}
		return "N"
	}
	return fmt.Sprintf("%s%s_m%d_n%d_k%d_a%g_b%g_pad%d%d%d", t(g.tA), t(g.tB), g.m, g.n, g.k, g.alpha, g.beta, g.padA, g.padB, g.padC)
}

// operands builds A, B, C with NaN in every padding slot, so reading padding
// or leaving it modified shows up.
func (g gemmCase) operands(rng *rand.Rand) (a []float32, lda int, b []float32, ldb int, c []float32, ldc int) {
	ar, ac := g.m, g.k
	if g.tA {
		ar, ac = g.k, g.m
	}
	br, bc := g.k, g.n
	if g.tB {
		br, bc = g.n, g.k
	}
	fill := func(rows, cols, pad int) ([]float32, int) {
		ld := max(cols, 1) + pad
		s := make([]float32, rows*ld)
		for i := range s {
			if i%ld < cols {
				s[i] = float32(rng.NormFloat64())
			} else {
				s[i] = float32(math.NaN())
			}
		}
		return s, ld
	}
	a, lda = fill(ar, ac, g.padA)
	b, ldb = fill(br, bc, g.padB)
	c, ldc = fill(g.m, g.n, g.padC)
	if g.beta == 0 { // beta == 0 must ignore NaNs in C
		for i := range c {
			if i%ldc < g.n && i%3 == 0 {
				c[i] = float32(math.NaN())
			}
		}
	}
	return
}

// checkClose compares got against want within a float32 accumulation bound:
// |got-want| ≤ 8·eps·(k+4)·bound, bound = |alpha|·Σ|a||b| + |beta·c| per
// element. Padding (NaN) must be untouched.
func checkClose(t *testing.T, g gemmCase, got, want, bound []float32, ldc int) {
	t.Helper()
	eps := float64(math.Nextafter32(1, 2) - 1)
	bad := 0
	for i := 0; i < g.m; i++ {
		for j := 0; j < ldc; j++ {
			x, y := got[i*ldc+j], want[i*ldc+j]
			if j >= g.n {
				if !math.IsNaN(float64(x)) {
					t.Fatalf("%v: padding C[%d,%d] overwritten with %g", g, i, j, x)
				}
				continue
			}
			tol := 8*eps*float64(g.k+4)*float64(bound[i*ldc+j]) + 1e-30
			if d := math.Abs(float64(x) - float64(y)); !(d <= tol) {
				if bad++; bad <= 5 {
					t.Errorf("%v: C[%d,%d] = %g, want %g (tol %g)", g, i, j, x, y, tol)
				}
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%v: %d wrong elements", g, bad)
	}
}

// prepared holds one case's operands and its reference result.
type prepared struct {
	g             gemmCase
	a, b, c       []float32
	lda, ldb, ldc int
	want, bound   []float32
}

// prepare builds g's operands and computes the reference result and the
// error bound with SgemmRef.
func prepare(g gemmCase, rng *rand.Rand) *prepared {
	p := &prepared{g: g}
	p.a, p.lda, p.b, p.ldb, p.c, p.ldc = g.operands(rng)
	p.want = append([]float32(nil), p.c...)
	SgemmRef(g.tA, g.tB, g.m, g.n, g.k, g.alpha, p.a, p.lda, p.b, p.ldb, g.beta, p.want, p.ldc)
	abs := func(s []float32) []float32 {
		o := make([]float32, len(s))
		for i, v := range s {
			o[i] = float32(math.Abs(float64(v)))
			if math.IsNaN(float64(v)) {
				o[i] = 0
			}
		}
		return o
	}
	p.bound = abs(p.c)
	SgemmRef(g.tA, g.tB, g.m, g.n, g.k, float32(math.Abs(float64(g.alpha))), abs(p.a), p.lda, abs(p.b), p.ldb,
		float32(math.Abs(float64(g.beta))), p.bound, p.ldc)
	return p
}

// check runs Sgemm on a fresh copy of C and compares with the reference.
func (p *prepared) check(t *testing.T) {
	t.Helper()
	g := p.g
	got := append([]float32(nil), p.c...)
	Sgemm(g.tA, g.tB, g.m, g.n, g.k, g.alpha, p.a, p.lda, p.b, p.ldb, g.beta, got, p.ldc)
	checkClose(t, g, got, p.want, p.bound, p.ldc)
}

// runCase runs g through Sgemm and SgemmRef and compares.
func runCase(t *testing.T, g gemmCase, rng *rand.Rand) {
	t.Helper()
	prepare(g, rng).check(t)
}

var transposes = [][2]Transpose{{NoTrans, NoTrans}, {NoTrans, Trans}, {Trans, NoTrans}, {Trans, Trans}}

// TestSgemmShapes holds every ISA path against SgemmRef over all transposes,
// odd and prime shapes (edge tiles in m, n and k, several k blocks), and
// alpha/beta combinations including beta == 0 with NaNs in C.
func TestSgemmShapes(t *testing.T) {
	shapes := [][3]int{
		{1, 1, 1}, {1, 7, 3}, {3, 1, 5}, {2, 3, 0}, {0, 4, 4}, {4, 0, 4},
		{13, 17, 19}, {14, 32, 8}, {15, 33, 9}, {29, 31, 37}, {64, 64, 64},
		{1, 97, 400}, {97, 1, 31}, {6, 16, 1}, {7, 67, 389}, {41, 100, 811},
		{170, 40, 17}, {3, 3100, 5}, {2, 45, 59}, {1, 9, 50},
	}
	scalars := [][2]float32{{1, 0}, {1, 1}, {-0.5, 2}, {0, 0.5}}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			for _, tr := range transposes {
				for si, s := range shapes {
					sc := scalars[si%len(scalars)]
					for _, ab := range [][2]float32{sc, {1, 0}} {
						g := gemmCase{tA: tr[0], tB: tr[1], m: s[0], n: s[1], k: s[2], alpha: ab[0], beta: ab[1],
							padA: si % 3, padB: (si + 1) % 3, padC: si % 2}
						runCase(t, g, rng)
					}
				}
			}
		})
	}
}

// TestSgemmThreads checks every split (shared B panels, rows, columns) on
// 2 and 3 threads against the reference, with shapes big enough to split.
func TestSgemmThreads(t *testing.T) {
	prevT := SetThreads(1)
	defer SetThreads(prevT)
	rng := rand.New(rand.NewPCG(3, 4))
	// {120, 1600, 530} spans two B panels in n and two k blocks in shared mode.
	shapes := [][3]int{{300, 97, 150}, {97, 301, 150}, {1, 4099, 300}, {500, 20, 200}, {120, 1600, 530}}
	for _, tr := range transposes {
		for _, s := range shapes {
			p := prepare(gemmCase{tA: tr[0], tB: tr[1], m: s[0], n: s[1], k: s[2], alpha: 0.75, beta: -1, padA: 1, padC: 3}, rng)
			for _, isa := range isasToTest() {
				withISA(t, isa, func() {
					for _, th := range []int{2, 3} {
						SetThreads(th)
						p.check(t)
					}
				})
			}
		}
	}
}

// TestSgemmStrided compares each batch item with a separate SgemmRef call,
// both for batches split by item and items split inside.
func TestSgemmStrided(t *testing.T) {
	prevT := SetThreads(2)
	defer SetThreads(prevT)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			for _, tc := range []stridedCase{{64, 64, 64, 12}, {33, 17, 65, 5}, {200, 130, 180, 3}, {5, 5, 5, 1}} {
				for _, tr := range transposes {
					checkStrided(t, rng, isa, tr, tc, SgemmStrided, nil, 1e-4)
				}
			}
		})
	}
}

// stridedCase is a batch of m×n×k products.
type stridedCase struct{ m, n, k, batch int }

// checkStrided runs strided (SgemmStrided or a variant of it) with alpha
// 1.5 and beta 0.5 on tc.batch items padded apart in every operand, and
// compares each with SgemmRef on the operands as round gives them (the
// values the variant multiplies; nil: as they are) within tol·k.
func checkStrided(t *testing.T, rng *rand.Rand, isa ISA, tr [2]Transpose, tc stridedCase,
	strided func(tA, tB Transpose, m, n, k int, alpha float32, a []float32, lda, strideA int, b []float32, ldb, strideB int, beta float32, c []float32, ldc, strideC int, batch int),
	round func([]float32) []float32, tol float64) {
	t.Helper()
	m, n, k := tc.m, tc.n, tc.k
	ar, ac, br, bc := m, k, k, n
	if tr[0] {
		ar, ac = k, m
	}
	if tr[1] {
		br, bc = n, k
	}
	sa, sb, sc := ar*ac+3, br*bc+1, m*n+2
	a := randSlice(rng, sa*tc.batch)
	b := randSlice(rng, sb*tc.batch)
	c := randSlice(rng, sc*tc.batch)
	want := append([]float32(nil), c...)
	ra, rb := a, b
	if round != nil {
		ra, rb = round(a), round(b)
	}
	for i := 0; i < tc.batch; i++ {
		SgemmRef(tr[0], tr[1], m, n, k, 1.5, ra[i*sa:], ac, rb[i*sb:], bc, 0.5, want[i*sc:], n)
	}
	strided(tr[0], tr[1], m, n, k, 1.5, a, ac, sa, b, bc, sb, 0.5, c, n, sc, tc.batch)
	for i := range c {
		if d := math.Abs(float64(c[i] - want[i])); d > tol*float64(k) {
			t.Fatalf("%v %v batch %v: c[%d] = %g, want %g", isa, tr, tc, i, c[i], want[i])
		}
	}
}

func randSlice(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.NormFloat64())
	}
	return s
}

// TestSgemmConcurrent runs many Sgemm calls from several goroutines at once
// (sharing workers and workspaces) and checks each against its own result
// computed alone.
func TestSgemmConcurrent(t *testing.T) {
	prevT := SetThreads(2)
	defer SetThreads(prevT)
	type job struct {
		m, n, k int
		a, b    []float32
		want    []float32
	}
	rng := rand.New(rand.NewPCG(7, 8))
	var jobs []job
	for i := 0; i < 8; i++ {
		m, n, k := 50+37*i, 300-29*i, 100+13*i
		jb := job{m: m, n: n, k: k, a: randSlice(rng, m*k), b: randSlice(rng, k*n), want: make([]float32, m*n)}
		Sgemm(NoTrans, Trans, m, n, k, 1, jb.a, k, jb.b, k, 0, jb.want, n)
		jobs = append(jobs, jb)
	}
	var wg sync.WaitGroup
	errs := make(chan string, len(jobs)*4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < 3; r++ {
				for i, jb := range jobs {
					c := make([]float32, jb.m*jb.n)
					Sgemm(NoTrans, Trans, jb.m, jb.n, jb.k, 1, jb.a, jb.k, jb.b, jb.k, 0, c, jb.n)
					for x := range c {
						if c[x] != jb.want[x] {
							errs <- fmt.Sprintf("goroutine %d job %d: c[%d] = %g, want %g", g, i, x, c[x], jb.want[x])
							return
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestSgemmAllocs checks that steady-state calls allocate nothing, on one
// and two threads, for the packed (shared on two threads), in-place-B,
// dot-product and batched paths.
func TestSgemmAllocs(t *testing.T) {
	prevT := SetThreads(1)
	defer SetThreads(prevT)
	rng := rand.New(rand.NewPCG(9, 10))
	m, n, k := 256, 512, 384
	a, b, c := randSlice(rng, m*k), randSlice(rng, k*n), randSlice(rng, m*n*4)
	for _, th := range []int{1, 2} {
		SetThreads(th)
		for _, tc := range []struct {
			name string
			f    func()
		}{
			{"packed", func() { Sgemm(NoTrans, NoTrans, m, n, k, 1, a, k, b, n, 0, c, n) }},
			{"transposed", func() { Sgemm(Trans, Trans, m, m, k, 1, a, m, b, k, 1, c, m) }},
			{"gemv", func() { Sgemm(NoTrans, NoTrans, 1, n, k, 1, a, k, b, n, 0, c, n) }},
			{"dot", func() { Sgemm(Trans, Trans, 2, n, k, 1, a, 2, b, k, 0.5, c, n) }},
			{"batched", func() { SgemmStrided(NoTrans, Trans, 64, 64, 64, 1, a, 64, 4096, b, 64, 4096, 0, c, 64, 4096, 8) }},
		} {
			if got := testing.AllocsPerRun(20, tc.f); got != 0 {
				t.Errorf("threads=%d %s: %v allocations per call, want 0", th, tc.name, got)
			}
		}
	}
}

// TestSetISAClamps checks that SetISA never selects an ISA the CPU lacks.
func TestSetISAClamps(t *testing.T) {
	prev := SetISA(ISAAVX512 + 5)
	defer SetISA(prev)
	if got, want := ActiveISA(), DetectedISA(); got != want {
		t.Fatalf("SetISA(beyond AVX-512): active %v, want detected %v", got, want)
	}
	SetISA(-3)
	if got := ActiveISA(); got != ISAGeneric {
		t.Fatalf("SetISA(-3): active %v, want generic", got)
	}
	for _, s := range []string{"generic", "avx2", "avx512"} {
		i, err := ParseISA(s)
		if err != nil || i.String() != s {
			t.Errorf("ParseISA(%q) = %v, %v", s, i, err)
		}
	}
	if _, err := ParseISA("sse"); err == nil {
		t.Error("ParseISA(sse): no error")
	}
}

// TestSgemmPanics checks that malformed arguments panic with a message
// naming the argument instead of reading out of bounds.
func TestSgemmPanics(t *testing.T) {
	a := make([]float32, 12)
	for _, tc := range []struct {
		name, want string
		f          func()
	}{
		{"negative m", "negative dimension m=-1", func() { Sgemm(NoTrans, NoTrans, -1, 2, 2, 1, a, 2, a, 2, 0, a, 2) }},
		{"short lda", "ldA=2, want ≥ 3", func() { Sgemm(NoTrans, NoTrans, 2, 2, 3, 1, a, 2, a, 2, 0, a, 2) }},
		{"short A", "len(A)=12, want ≥ 16", func() { Sgemm(NoTrans, NoTrans, 4, 2, 4, 1, a, 4, a, 2, 0, a, 2) }},
		{"short C", "len(C)=11, want ≥ 12", func() { Sgemm(Trans, NoTrans, 3, 4, 2, 1, a, 3, a, 4, 0, a[:11], 4) }},
		{"short B of last item", "len(B)=", func() { SgemmStrided(NoTrans, NoTrans, 1, 1, 1, 1, a, 1, 1, a, 1, 12, 0, a, 1, 1, 2) }},
		{"overlapping C", "strideC=0 < 1", func() { SgemmStrided(NoTrans, NoTrans, 1, 1, 1, 1, a, 1, 1, a, 1, 1, 0, a, 1, 0, 2) }},
		{"partly overlapping C", "strideC=3 < 4", func() { SgemmStrided(NoTrans, NoTrans, 2, 2, 1, 1, a, 1, 0, a, 2, 0, 0, a, 2, 3, 2) }},
		{"negative batch", "negative batch", func() { SgemmStrided(NoTrans, NoTrans, 1, 1, 1, 1, a, 1, 1, a, 1, 1, 0, a, 1, 1, -1) }},
	} {
		func() {
			defer func() {
				r := recover()
				if msg, _ := r.(string); !strings.Contains(msg, tc.want) {
					t.Errorf("%s: panic %v, want a message containing %q", tc.name, r, tc.want)
				}
			}()
			tc.f()
		}()
	}
}

// ExampleSgemm multiplies a 2×3 matrix by the transpose of a 2×3 matrix
// (a linear layer y = x·Wᵀ with W stored out×in, as PyTorch stores it).
func ExampleSgemm() {
	x := []float32{1, 2, 3, 4, 5, 6}   // 2×3: two tokens, three features
	w := []float32{1, 0, 1, 0, 1, 0}   // 2×3: two outputs, three inputs
	y := []float32{0.5, 0.5, 0.5, 0.5} // 2×2, accumulated into (beta = 1)
	Sgemm(NoTrans, Trans, 2, 2, 3, 1, x, 3, w, 3, 1, y, 2)
	fmt.Println(y)
	// Output: [4.5 2.5 10.5 5.5]
}
