package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// docIDs returns (b*t) document ids with documents of random length.
func docIDs(rng *rand.Rand, b, t int) []int32 {
	ids := make([]int32, b*t)
	for i := 0; i < b; i++ {
		id := int32(0)
		for j := 0; j < t; j++ {
			if j > 0 && rng.IntN(23) == 0 {
				id++
			}
			ids[i*t+j] = id
		}
	}
	return ids
}

// docsAt returns ids for one row of t tokens whose documents start at starts.
func docsAt(t int, starts ...int) []int32 {
	ids := make([]int32, t)
	for _, s := range starts {
		for i := s; i < t; i++ {
			ids[i]++
		}
	}
	return ids
}

func TestAttentionFastVsRef(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 17))
	for _, cfg := range []AttentionConfig{
		{B: 1, T: 1, HQ: 1, HKV: 1, D: 1, Causal: true},
		{B: 2, T: 7, HQ: 3, HKV: 3, D: 5, Causal: true},
		{B: 1, T: 130, HQ: 4, HKV: 2, D: 16, Causal: true},                              // GQA, partial blocks
		{B: 2, T: 65, HQ: 3, HKV: 1, D: 8, Causal: true},                                // MQA
		{B: 1, T: 67, HQ: 2, HKV: 2, D: 9, Causal: false},                               // bidirectional
		{B: 2, T: 150, HQ: 2, HKV: 1, D: 12, Causal: true, DocIDs: []int32{}},           // doc mask, filled below
		{B: 1, T: 70, HQ: 2, HKV: 2, D: 4, Scale: 0.3, DocIDs: []int32{}},               // doc mask, no causal
		{B: 1, T: 200, HQ: 2, HKV: 2, D: 8, Causal: true, DocIDs: docsAt(200, 70, 140)}, // whole tiles skipped
		{B: 1, T: 200, HQ: 2, HKV: 1, D: 8, DocIDs: docsAt(200, 64, 130)},               // skipped both sides of the diagonal
		// attention dropout: odd T (a lone last key), partial blocks, GQA, a TP rank's heads
		{B: 2, T: 7, HQ: 3, HKV: 3, D: 5, Causal: true, Dropout: 0.3, DropoutSeed: 11},
		{B: 2, T: 131, HQ: 4, HKV: 2, D: 8, Causal: true, Dropout: 0.1, DropoutSeed: 12, FirstHead: 4},
		{B: 1, T: 67, HQ: 2, HKV: 1, D: 9, Dropout: 0.5, DropoutSeed: 13},
		{B: 1, T: 150, HQ: 2, HKV: 2, D: 8, Causal: true, DocIDs: []int32{}, Dropout: 0.2, DropoutSeed: 14},
	} {
		if cfg.DocIDs != nil && len(cfg.DocIDs) == 0 {
			cfg.DocIDs = docIDs(rng, cfg.B, cfg.T)
		}
		t.Run(fmt.Sprintf("B%dT%dHQ%dHKV%dD%d-causal%v-doc%v-drop%g", cfg.B, cfg.T, cfg.HQ, cfg.HKV, cfg.D, cfg.Causal, cfg.DocIDs != nil, cfg.Dropout), func(t *testing.T) {
			nq, nkv := cfg.B*cfg.T*cfg.HQ*cfg.D, cfg.B*cfg.T*cfg.HKV*cfg.D
			q, k, v := round32(randF64(rng, nq, 1)), round32(randF64(rng, nkv, 1)), round32(randF64(rng, nkv, 1))
			g := round32(randF64(rng, nq, 1))
			out, lse := make([]float64, nq), make([]float64, cfg.B*cfg.HQ*cfg.T)
			attentionForwardRef(out, lse, q, k, v, cfg)
			dq, dk, dv := filled(nq, 0.5), filled(nkv, 0.25), filled(nkv, -1)
			attentionBackwardRef(dq, dk, dv, g, q, k, v, lse, cfg)

			out32, lse32 := make([]float32, nq), make([]float32, len(lse))
			AttentionForward(out32, lse32, to32(q), to32(k), to32(v), cfg)
			assertClose(t, "out", out32, out, fastTol)
			assertClose(t, "lse", lse32, lse, fastTol)
			for _, sched := range []struct {
				name string
				run  func(dq, dk, dv, dout, q, k, v, out, lse []float32, cfg *AttentionConfig)
			}{{"fused", attentionBackwardFused}, {"split", attentionBackwardSplit}} {
				dq32, dk32, dv32 := to32(filled(nq, 0.5)), to32(filled(nkv, 0.25)), to32(filled(nkv, -1))
				sched.run(dq32, dk32, dv32, to32(g), to32(q), to32(k), to32(v), out32, lse32, &cfg)
				assertClose(t, sched.name+" dq", dq32, dq, fastTol)
				assertClose(t, sched.name+" dk", dk32, dk, fastTol)
				assertClose(t, sched.name+" dv", dv32, dv, fastTol)
			}
			dq32, dk32, dv32 := to32(filled(nq, 0.5)), to32(filled(nkv, 0.25)), to32(filled(nkv, -1))
			AttentionBackward(dq32, dk32, dv32, to32(g), to32(q), to32(k), to32(v), out32, lse32, cfg)
			assertClose(t, "dq", dq32, dq, fastTol)
			assertClose(t, "dk", dk32, dk, fastTol)
			assertClose(t, "dv", dv32, dv, fastTol)
		})
	}
}

func TestAttentionConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  AttentionConfig
		want string
	}{
		{AttentionConfig{B: 1, T: 4, HQ: 3, HKV: 2, D: 4}, "HQ=3 is not a multiple of HKV=2"},
		{AttentionConfig{B: 1, T: 4, HQ: 2, HKV: 2, D: 0}, "D=0"},
		{AttentionConfig{B: 2, T: 4, HQ: 2, HKV: 2, D: 4, DocIDs: make([]int32, 4)}, "want B*T=8"},
		{AttentionConfig{B: 1, T: 4, HQ: 2, HKV: 2, D: 4, Dropout: 1}, "Dropout=1"},
		{AttentionConfig{B: 1, T: 4, HQ: 2, HKV: 2, D: 4, Dropout: -0.1}, "Dropout=-0.1"},
		{AttentionConfig{B: 1, T: 4, HQ: 2, HKV: 2, D: 4, Dropout: float32(math.NaN())}, "Dropout=NaN"},
		{AttentionConfig{B: 1, T: 4, HQ: 2, HKV: 2, D: 4, FirstHead: -1}, "FirstHead=-1"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want it to mention %q", tc.cfg, err, tc.want)
		}
	}
}

func TestAttentionGolden(t *testing.T) {
	for _, name := range []string{"attention_causal", "attention_gqa", "attention_docmask", "attention_long"} {
		forEachISA(t, name, func(t *testing.T) {
			g := loadGolden(t, name)
			cfg := AttentionConfig{B: g.p("b"), T: g.p("t"), HQ: g.p("hq"), HKV: g.p("hkv"), D: g.p("d"),
				Causal: g.Params["causal"].(bool), DocIDs: g.i32["doc_ids"]}
			if (name == "attention_docmask" || name == "attention_long") && cfg.DocIDs == nil {
				t.Fatalf("%s has no doc_ids", name)
			}
			q, k, v := g.f(t, "q"), g.f(t, "k"), g.f(t, "v")
			out, lse := make([]float32, len(q)), make([]float32, cfg.B*cfg.HQ*cfg.T)
			AttentionForward(out, lse, q, k, v, cfg)
			g.check(t, "out", out)
			g.check(t, "lse", lse)
			dq, dk, dv := make([]float32, len(q)), make([]float32, len(k)), make([]float32, len(v))
			AttentionBackward(dq, dk, dv, g.f(t, "dout"), q, k, v, out, lse, cfg)
			g.check(t, "dq", dq)
			g.check(t, "dk", dk)
			g.check(t, "dv", dv)
		})
	}
}

// BenchmarkAttention reports forward+backward GFLOP/s (AttentionFLOPs
// convention: causal halved) and bytes allocated per call (steady state: the
// workspace pool is warm, so only Parallel's goroutine bookkeeping remains).
func BenchmarkAttention(b *testing.B) {
	for _, T := range []int{512, 1024, 2048} {
		cfg := AttentionConfig{B: 1, T: T, HQ: 12, HKV: 12, D: 64, Causal: true}
		b.Run(fmt.Sprintf("B1-T%d-H12-D64", T), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 1))
			n := cfg.B * cfg.T * cfg.HQ * cfg.D
			q, k, v, dout := to32(randF64(rng, n, 1)), to32(randF64(rng, n, 1)), to32(randF64(rng, n, 1)), to32(randF64(rng, n, 1))
			out, lse := make([]float32, n), make([]float32, cfg.B*cfg.HQ*cfg.T)
			dq, dk, dv := make([]float32, n), make([]float32, n), make([]float32, n)
			AttentionForward(out, lse, q, k, v, cfg) // warm the pool
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				AttentionForward(out, lse, q, k, v, cfg)
				AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse, cfg)
			}
			fwd, bwd := AttentionFLOPs(cfg)
			b.ReportMetric((fwd+bwd)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			b.ReportMetric(float64(AttentionScratchBytes()), "scratch-B")
		})
	}
}

func TestMaxRow(t *testing.T) {
	for _, isa := range []ISA{ISAGeneric, ISAAVX2, DetectedISA()} {
		if isa > DetectedISA() {
			continue
		}
		prev := SetISA(isa)
		for _, n := range []int{0, 1, 15, 16, 17, 32, 48, 64, 100} {
			for at := 0; at < n; at += 7 {
				x := make([]float32, n)
				for i := range x {
					x[i] = -float32(i%13) - 1
				}
				x[at] = 5
				if got := maxRowF32(float32(math.Inf(-1)), x); got != 5 {
					t.Fatalf("%v n=%d max at %d: got %g, want 5", isa, n, at, got)
				}
				if got := maxRowF32(9, x); got != 9 {
					t.Fatalf("%v n=%d init 9: got %g", isa, n, got)
				}
			}
		}
		SetISA(prev)
	}
}

// TestExpSub holds the float32 exp kernels (AVX-512 and pure Go) to math.Exp within
// 4 ulp-ish (3e-7 relative) and checks masked (-Inf) lanes become exactly 0.
func TestExpSub(t *testing.T) {
	for _, isa := range []ISA{ISAGeneric, ISAAVX2, DetectedISA()} {
		if isa > DetectedISA() {
			continue
		}
		prev := SetISA(isa)
		for _, n := range []int{1, 15, 16, 37, 64} {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(i)*2.9 - 95 // spans underflow to ~ +88
			}
			x[n/2] = float32(math.Inf(-1))
			want := make([]float64, n)
			sum := 0.0
			for i, v := range x {
				want[i] = math.Exp(float64(v) - 3)
				if v < -87.33654+3 {
					want[i] = 0
				}
				sum += want[i]
			}
			orig := slices.Clone(x)
			if s := expSumF32(x, 3); math.Abs(float64(s)-sum) > 1e-6*sum {
				t.Fatalf("%v n=%d: expSumF32 = %g, want %g", isa, n, s, sum)
			}
			if !slices.Equal(x, orig) {
				t.Fatalf("%v n=%d: expSumF32 wrote its input", isa, n)
			}
			got := expSubF32(x, 3)
			for i := range x {
				if math.Abs(float64(x[i])-want[i]) > 3e-7*want[i] {
					t.Fatalf("%v n=%d: exp[%d] = %g, want %g", isa, n, i, x[i], want[i])
				}
			}
			if math.Abs(float64(got)-sum) > 1e-6*sum {
				t.Fatalf("%v n=%d: sum %g, want %g", isa, n, got, sum)
			}
		}
		SetISA(prev)
	}
}

// TestAttentionMemoryIndependentOfT checks that fwd+bwd allocates no buffer
// that grows with T: at T=1024 a materialised score matrix for B=1, HQ=2
// would be 8 MiB. The kernels may allocate pooled workspaces (after a GC, or
// when the race detector's sync.Pool drops them) and Parallel's bookkeeping:
// the bound allows 16 workspaces, far below T×T and the same for every T.
func TestAttentionMemoryIndependentOfT(t *testing.T) {
	rng := rand.New(rand.NewPCG(18, 19))
	limit := uint64(16*attnScratchFloats*4 + 16<<10)
	defer SetThreads(SetThreads(1))
	for _, T := range []int{64, 1024} {
		for _, hkv := range []int{1, 2} { // at 1 thread: split, fused backward schedule
			cfg := AttentionConfig{B: 1, T: T, HQ: 2, HKV: hkv, D: 16, Causal: true}
			nq, nkv := T*2*16, T*hkv*16
			q, k, v, g := to32(randF64(rng, nq, 1)), to32(randF64(rng, nkv, 1)), to32(randF64(rng, nkv, 1)), to32(randF64(rng, nq, 1))
			out, lse, dq, dk, dv := make([]float32, nq), make([]float32, 2*T), make([]float32, nq), make([]float32, nkv), make([]float32, nkv)
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			AttentionForward(out, lse, q, k, v, cfg)
			AttentionBackward(dq, dk, dv, g, q, k, v, out, lse, cfg)
			runtime.ReadMemStats(&m1)
			if got := m1.TotalAlloc - m0.TotalAlloc; got > limit {
				t.Errorf("T=%d HKV=%d: fwd+bwd allocated %d bytes, want <= %d", T, hkv, got, limit)
			}
		}
	}
}

func TestAttnTileEmpty(t *testing.T) {
	docs := &AttentionConfig{B: 1, T: 200, HQ: 1, HKV: 1, D: 1, DocIDs: docsAt(200, 70, 140)}
	causal := &AttentionConfig{B: 1, T: 200, HQ: 1, HKV: 1, D: 1, Causal: true}
	for _, tc := range []struct {
		cfg    *AttentionConfig
		i0, j0 int
		want   bool
	}{
		{causal, 0, 64, true},   // above the diagonal
		{causal, 64, 64, false}, // diagonal tile
		{causal, 128, 0, false}, // below
		{docs, 128, 0, true},    // queries in docs 1-2, keys 0..63 all doc 0
		{docs, 0, 64, false},    // keys 64..127 include doc 0 (64..69)
		{docs, 192, 128, false}, // queries doc 2, keys docs 1-2
		{docs, 192, 64, true},   // queries doc 2 only, keys docs 0-1
	} {
		nq, nk := min(64, 200-tc.i0), min(64, 200-tc.j0)
		if got := attnTileEmpty(tc.cfg, 0, tc.i0, nq, tc.j0, nk); got != tc.want {
			t.Errorf("causal=%v docs=%v tile (%d,%d): empty=%v, want %v", tc.cfg.Causal, tc.cfg.DocIDs != nil, tc.i0, tc.j0, got, tc.want)
		}
	}
}

func TestAttentionShortBufferPanics(t *testing.T) {
	cfg := AttentionConfig{B: 1, T: 4, HQ: 2, HKV: 1, D: 8}
	q, kv := make([]float32, 64), make([]float32, 32)
	defer func() {
		msg, _ := recover().(string)
		if !strings.Contains(msg, "attention lse has 7 floats, want 8") {
			t.Fatalf("panic %q, want it to name lse and its sizes", msg)
		}
	}()
	AttentionForward(make([]float32, 64), make([]float32, 7), q, kv, kv, cfg)
}

// FuzzAttention compares the fast kernels with the float64 reference on
// random small shapes, masks, dropout and schedules (go test -fuzz
// FuzzAttention).
func FuzzAttention(f *testing.F) {
	f.Add(uint8(1), uint8(70), uint8(2), uint8(1), uint8(5), true, uint8(0), uint64(1), uint8(0))
	f.Add(uint8(2), uint8(129), uint8(4), uint8(2), uint8(16), false, uint8(9), uint64(2), uint8(25))
	f.Fuzz(func(t *testing.T, b, T, hkv, grp, d uint8, causal bool, docEvery uint8, seed uint64, dropPct uint8) {
		cfg := AttentionConfig{B: int(b%3) + 1, T: int(T%200) + 1, HKV: int(hkv%3) + 1, D: int(d%20) + 1, Causal: causal,
			Dropout: float32(dropPct%100) / 100, DropoutSeed: seed, FirstHead: int(grp % 5)}
		cfg.HQ = cfg.HKV * (int(grp%3) + 1)
		rng := rand.New(rand.NewPCG(seed, 3))
		if docEvery%4 != 0 {
			cfg.DocIDs = docIDs(rng, cfg.B, cfg.T)
		}
		nq, nkv := cfg.B*cfg.T*cfg.HQ*cfg.D, cfg.B*cfg.T*cfg.HKV*cfg.D
		q, k, v, g := round32(randF64(rng, nq, 2)), round32(randF64(rng, nkv, 2)), round32(randF64(rng, nkv, 2)), round32(randF64(rng, nq, 1))
		out, lse := make([]float64, nq), make([]float64, cfg.B*cfg.HQ*cfg.T)
		attentionForwardRef(out, lse, q, k, v, cfg)
		dq, dk, dv := make([]float64, nq), make([]float64, nkv), make([]float64, nkv)
		attentionBackwardRef(dq, dk, dv, g, q, k, v, lse, cfg)
		out32, lse32 := make([]float32, nq), make([]float32, len(lse))
		AttentionForward(out32, lse32, to32(q), to32(k), to32(v), cfg)
		assertClose(t, "out", out32, out, 1e-4)
		assertClose(t, "lse", lse32, lse, 1e-4)
		for _, run := range []func(dq, dk, dv, dout, q, k, v, out, lse []float32, cfg *AttentionConfig){attentionBackwardFused, attentionBackwardSplit} {
			dq32, dk32, dv32 := make([]float32, nq), make([]float32, nkv), make([]float32, nkv)
			run(dq32, dk32, dv32, to32(g), to32(q), to32(k), to32(v), out32, lse32, &cfg)
			assertClose(t, "dq", dq32, dq, 1e-4)
			assertClose(t, "dk", dk32, dk, 1e-4)
			assertClose(t, "dv", dv32, dv, 1e-4)
		}
	})
}

func TestZigzagIsPermutation(t *testing.T) {
	for n := 1; n < 40; n++ {
		seen := make([]bool, n)
		for p := 0; p < n; p++ {
			b := zigzag(p, n)
			if b < 0 || b >= n || seen[b] {
				t.Fatalf("n=%d: zigzag(%d) = %d repeats or is out of range", n, p, b)
			}
			seen[b] = true
		}
	}
}

// TestAttentionThreadInvariant checks that, for each backward schedule, the
// forward and backward results are bitwise the same at 1 and 3 threads,
// with and without attention dropout.
func TestAttentionThreadInvariant(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, 21))
	for _, cfg := range []AttentionConfig{
		{B: 2, T: 150, HQ: 4, HKV: 2, D: 8, Causal: true},
		{B: 2, T: 150, HQ: 4, HKV: 2, D: 8, Causal: true, Dropout: 0.1, DropoutSeed: 5},
	} {
		checkThreadInvariant(t, rng, cfg)
	}
}

func checkThreadInvariant(t *testing.T, rng *rand.Rand, cfg AttentionConfig) {
	nq, nkv := cfg.B*cfg.T*cfg.HQ*cfg.D, cfg.B*cfg.T*cfg.HKV*cfg.D
	q, k, v, g := to32(randF64(rng, nq, 1)), to32(randF64(rng, nkv, 1)), to32(randF64(rng, nkv, 1)), to32(randF64(rng, nq, 1))
	for _, sched := range []func(dq, dk, dv, dout, q, k, v, out, lse []float32, cfg *AttentionConfig){attentionBackwardFused, attentionBackwardSplit} {
		run := func(threads int) []float32 {
			defer SetThreads(SetThreads(threads))
			out, lse := make([]float32, nq), make([]float32, cfg.B*cfg.HQ*cfg.T)
			dq, dk, dv := make([]float32, nq), make([]float32, nkv), make([]float32, nkv)
			AttentionForward(out, lse, q, k, v, cfg)
			sched(dq, dk, dv, g, q, k, v, out, lse, &cfg)
			return slices.Concat(out, lse, dq, dk, dv)
		}
		a, b := run(1), run(3)
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("dropout %g: element %d: 1 thread %g, 3 threads %g", cfg.Dropout, i, a[i], b[i])
			}
		}
	}
}
