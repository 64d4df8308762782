package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// specialF32 are values that stress rounding and IEEE corner cases.
var specialF32 = []uint32{
	0x00000000, 0x80000000, // ±0
	0x00000001, 0x80000001, 0x007fffff, 0x00400000, // denormals
	0x00800000, 0x7f7fffff, 0xff7fffff, // smallest normal, ±max
	0x7f800000, 0xff800000, // ±Inf
	0x7fc00000, 0xffc00000, 0x7fc12345, 0x7f800001, // NaNs (quiet, negative, payload, signalling)
	0x0d8e0000, 0x3c23d70a, 0x501502f9, // tiny, 0.01, 1e10
}

// adamwInput fills x with random values of random magnitude, a special
// value in about one slot of specialEvery.
func adamwInput(r *rand.Rand, x []float32, specialEvery int) {
	for i := range x {
		if r.IntN(specialEvery) == 0 {
			x[i] = math.Float32frombits(specialF32[r.IntN(len(specialF32))])
			continue
		}
		x[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(13)-9)))
	}
}

// adamwCoeffCases are realistic steps (first and late, with and without
// weight decay) and extreme scalars.
var adamwCoeffCases = []AdamWCoeffs{
	{Beta1: 0.9, Beta2: 0.999, OneMinusBeta1: 1 - float32(0.9), OneMinusBeta2: 1 - float32(0.999), Eps: 1e-8, BC1: 0.1, BC2: 0.001, LR: 1e-3, WD: 0.1},
	{Beta1: 0.9, Beta2: 0.95, OneMinusBeta1: 1 - float32(0.9), OneMinusBeta2: 1 - float32(0.95), Eps: 1e-8, BC1: 0.99997, BC2: 0.9, LR: 3e-4, WD: 0},
	{Beta1: 0.5, Beta2: 0.5, OneMinusBeta1: 0.5, OneMinusBeta2: 0.5, Eps: 1e-30, BC1: 1e-20, BC2: 1e-30, LR: 10, WD: 1e10},
	{Beta1: 1e-30, Beta2: 0.99999, OneMinusBeta1: 1, OneMinusBeta2: 1e-5, Eps: 1, BC1: 1, BC2: 1, LR: 1e-30, WD: 1e-30},
}

// TestAdamWUpdateBitIdentical checks every ISA path against adamwGo bit for
// bit: every length 0..70 (all tails), misaligned starts, random inputs with
// zeros, denormals, huge and tiny values, NaN and Inf in the gradient (often)
// and in p, m and v (sometimes).
func TestAdamWUpdateBitIdentical(t *testing.T) {
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			r := rand.New(rand.NewPCG(1, uint64(isa)))
			for ci := range adamwCoeffCases {
				c := &adamwCoeffCases[ci]
				for n := 0; n <= 70; n++ {
					for _, off := range []int{0, 1, 3} {
						checkAdamW(t, r, isa, ci, c, n, off)
					}
				}
			}
		})
	}
}

func checkAdamW(t *testing.T, r *rand.Rand, isa ISA, ci int, c *AdamWCoeffs, n, off int) {
	t.Helper()
	var in [4][]float32 // p, g, m, v with off leading elements
	for k := range in {
		in[k] = make([]float32, off+n)
		adamwInput(r, in[k], []int{12, 3, 12, 12}[k])
	}
	for i := range in[3] {
		if r.IntN(2) == 0 {
			in[3][i] = float32(math.Abs(float64(in[3][i]))) // v is usually ≥ 0
		}
	}
	var got, want [4][]float32
	for k := range in {
		got[k] = append([]float32(nil), in[k][off:]...)
		want[k] = append([]float32(nil), in[k][off:]...)
	}
	AdamWUpdate(got[0], got[1], got[2], got[3], c)
	adamwGo(want[0], want[1], want[2], want[3], c)
	for k, name := range []string{"p", "g", "m", "v"} {
		for i := range want[k] {
			if gb, wb := math.Float32bits(got[k][i]), math.Float32bits(want[k][i]); gb != wb {
				t.Fatalf("%v coeffs %d n=%d off=%d: %s[%d]=%#08x, want %#08x (inputs p=%#08x g=%#08x m=%#08x v=%#08x)",
					isa, ci, n, off, name, i, gb, wb, math.Float32bits(in[0][off+i]), math.Float32bits(in[1][off+i]),
					math.Float32bits(in[2][off+i]), math.Float32bits(in[3][off+i]))
			}
		}
	}
}

// TestAdamWUpdateGolden pins adamwGo (and so every path) to values worked
// out by hand in float32 for one element on the first step.
func TestAdamWUpdateGolden(t *testing.T) {
	c := &adamwCoeffCases[0] // step 1: bc1 = 0.1, bc2 = 0.001
	for _, isa := range isasToTest() {
		withISA(t, isa, func() {
			n := 19 // one vector and a tail on every path
			p, g, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
			for i := range p {
				p[i], g[i] = 1, 0.5
			}
			AdamWUpdate(p, g, m, v, c)
			// 1−β1 = 1 − 0.9f = 0.100000024 exactly, so m = 0.050000012
			// (0x3d4ccd0); v = ((1−β2)·0.5)·0.5 ≈ 2.5e-4, m̂ ≈ 0.5, v̂ ≈ 0.25,
			// √ ≈ 0.5: p = 1 − 1e-3·(0.5/(0.5+1e-8) + 0.1) ≈ 0.9989.
			wm := math.Float32frombits(0x3d4cccd0)
			wv := float32(1-float32(0.999)) * 0.5 * 0.5
			for i := range p {
				if m[i] != wm || v[i] != wv || math.Abs(float64(p[i])-0.9989) > 1e-6 {
					t.Fatalf("%v: element %d: p=%v m=%v v=%v, want p≈0.9989 m=%v v=%v", isa, i, p[i], m[i], v[i], wm, wv)
				}
			}
		})
	}
}

// TestAdamWUpdateLengthMismatch checks the documented panic.
func TestAdamWUpdateLengthMismatch(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("AdamWUpdate with len(v) != len(p) did not panic")
		}
	}()
	AdamWUpdate(make([]float32, 4), make([]float32, 4), make([]float32, 4), make([]float32, 3), &adamwCoeffCases[0])
}

// BenchmarkAdamWUpdate reports GB/s of one thread's AdamW traffic (reads
// p, g, m, v; writes p, m, v: 28 bytes per element) per ISA.
func BenchmarkAdamWUpdate(b *testing.B) {
	const n = 1 << 16 // 1.75 MiB of traffic: mostly cache-resident
	for _, isa := range isasToTest() {
		b.Run(fmt.Sprintf("isa=%v", isa), func(b *testing.B) {
			withISA(b, isa, func() {
				r := rand.New(rand.NewPCG(2, 3))
				var x [4][]float32
				for k := range x {
					x[k] = make([]float32, n)
					adamwInput(r, x[k], 1<<30)
				}
				b.SetBytes(28 * n)
				for b.Loop() {
					AdamWUpdate(x[0], x[1], x[2], x[3], &adamwCoeffCases[1])
				}
			})
		})
	}
}
