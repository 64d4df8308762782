package half

import (
	"math"
	"testing"
)

// f16Value is an independent float64 reference for a float16 bit pattern.
func f16Value(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1F
	mant := float64(h & 0x3FF)
	switch exp {
	case 0x1F:
		if mant != 0 {
			return math.NaN()
		}
		return math.Inf(int(sign))
	case 0:
		return sign * math.Ldexp(mant, -24)
	}
	return sign * math.Ldexp(1+mant/1024, exp-15)
}

func TestFloat16AllPatternsWidenExactlyAndRoundTrip(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := Float16(i)
		got := h.Float32()
		want := f16Value(uint16(i))
		if math.IsNaN(want) {
			if !math.IsNaN(float64(got)) {
				t.Fatalf("Float16(%#04x).Float32() = %v, want NaN", i, got)
			}
			back := Float16From(got)
			if wantNaN := Float16(uint16(i) | f16Quiet); back != wantNaN { // payload kept, quieted
				t.Fatalf("Float16From(NaN from %#04x) = %#04x, want %#04x", i, back, wantNaN)
			}
			continue
		}
		if float64(got) != want || math.Signbit(float64(got)) != math.Signbit(want) {
			t.Fatalf("Float16(%#04x).Float32() = %v, want %v", i, got, want)
		}
		if back := Float16From(got); back != h {
			t.Fatalf("Float16From(%v) = %#04x, want %#04x", got, back, i)
		}
	}
}

func TestBFloat16AllPatternsRoundTrip(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := BFloat16(i)
		got := h.Float32()
		if math.Float32bits(got) != uint32(i)<<16 {
			t.Fatalf("BFloat16(%#04x).Float32() bits = %#08x", i, math.Float32bits(got))
		}
		back := BFloat16From(got)
		want := h
		if i&0x7FFF > 0x7F80 { // NaN: payload kept, quieted
			want = BFloat16(uint16(i) | bf16Quiet)
		}
		if back != want {
			t.Fatalf("BFloat16From(BFloat16(%#04x).Float32()) = %#04x, want %#04x", i, back, want)
		}
	}
}

// checkMidpoints checks rounding around the midpoint of every pair of
// adjacent representable values lo < hi (as float32 bits): the midpoint
// rounds to the one with an even mantissa, one float32 ulp below it rounds
// to lo and one ulp above to hi.
func checkMidpoints(t *testing.T, name string, loBits, hiBits uint16, lo, hi float32, conv func(float32) uint16) {
	t.Helper()
	mid := float32((float64(lo) + float64(hi)) / 2)
	if float64(mid) != (float64(lo)+float64(hi))/2 {
		t.Fatalf("%s: midpoint of %v and %v not exact in float32", name, lo, hi)
	}
	even := loBits
	if loBits&1 == 1 {
		even = hiBits
	}
	below := math.Nextafter32(mid, float32(math.Inf(-1)))
	above := math.Nextafter32(mid, float32(math.Inf(1)))
	if mid < 0 {
		below, above = above, below // toward lo / toward hi in magnitude
	}
	for _, c := range []struct {
		x    float32
		want uint16
	}{{mid, even}, {below, loBits}, {above, hiBits}} {
		if got := conv(c.x); got != c.want {
			t.Fatalf("%s(%v = %#08x) = %#04x, want %#04x (between %#04x and %#04x)",
				name, c.x, math.Float32bits(c.x), got, c.want, loBits, hiBits)
		}
	}
}

func TestFloat16RoundsToNearestEvenAtEveryBoundary(t *testing.T) {
	conv := func(f float32) uint16 { return uint16(Float16From(f)) }
	for _, sign := range []uint16{0, 0x8000} {
		for m := uint16(0); m < 0x7C00; m++ { // every finite magnitude, next may be +inf
			lo, hi := sign|m, sign|(m+1)
			loV, hiV := Float16(lo).Float32(), Float16(hi).Float32()
			if m+1 == 0x7C00 { // the rounding threshold to infinity is 65520
				hiV = float32(math.Copysign(65536, float64(loV)))
			}
			checkMidpoints(t, "Float16From", lo, hi, loV, hiV, conv)
		}
	}
}

func TestBFloat16RoundsToNearestEvenAtEveryBoundary(t *testing.T) {
	conv := func(f float32) uint16 { return uint16(BFloat16From(f)) }
	for _, sign := range []uint16{0, 0x8000} {
		for m := uint16(0); m < 0x7F80; m++ {
			lo, hi := sign|m, sign|(m+1)
			loV, hiV := BFloat16(lo).Float32(), BFloat16(hi).Float32()
			if m+1 == 0x7F80 {
				// Threshold to infinity: the next step past the largest
				// finite value is 2^128, beyond float32, so the midpoint and
				// one ulp below it are built from bits.
				mid := math.Float32frombits(uint32(lo)<<16 | 0x8000)
				if got := conv(mid); got != hi {
					t.Fatalf("BFloat16From(%v) = %#04x, want inf %#04x", mid, got, hi)
				}
				below := math.Float32frombits(uint32(lo)<<16 | 0x7FFF)
				if got := conv(below); got != lo {
					t.Fatalf("BFloat16From(%v) = %#04x, want %#04x", below, got, lo)
				}
				continue
			}
			checkMidpoints(t, "BFloat16From", lo, hi, loV, hiV, conv)
		}
	}
}

// torchEdge holds float32 inputs and the bit patterns torch 1.13
// (tensor.to(torch.float16) / torch.bfloat16) produced for them, except the
// NaN rows with payload bits, where this package keeps the payload and
// torch canonicalizes (see the package doc).
var torchEdge = []struct {
	in   uint32
	f16  uint16
	bf16 uint16
}{
	{0x7FC00000, 0x7E00, 0x7FC0}, // quiet NaN
	{0xFFC00000, 0xFE00, 0xFFC0}, // negative quiet NaN
	{0x7F800001, 0x7E00, 0x7FC0}, // signalling NaN, payload in low bits only: quieted
	{0xFF800001, 0xFE00, 0xFFC0},
	{0x7FA00000, 0x7F00, 0x7FE0}, // signalling NaN with a high payload bit: kept, quieted (torch: 0x7E00)
	{0x7FFFFFFF, 0x7FFF, 0x7FFF}, // (torch: 0x7E00)
	{0xFFC12345, 0xFE09, 0xFFC1}, // (torch: 0xFE00)
	{0x00000001, 0x0000, 0x0000}, // smallest float32 subnormal
	{0x80000001, 0x8000, 0x8000}, // keeps the sign of zero
	{0x3F808000, 0x3C04, 0x3F80}, // 1.00390625: bf16 tie → even
	{0x3F818000, 0x3C0C, 0x3F82}, // bf16 tie → even, upward
	{0x477FF000, 0x7C00, 0x4780}, // 65520: f16 tie → even = infinity
	{0x477FE000, 0x7BFF, 0x4780}, // 65504: largest finite f16
	{0x33000000, 0x0000, 0x3300}, // 2⁻²⁵: f16 tie → zero
	{0x33000001, 0x0001, 0x3300}, // just above 2⁻²⁵: smallest f16 subnormal
	{0x38800000, 0x0400, 0x3880}, // 2⁻¹⁴: smallest normal f16
	{0x387FF000, 0x0400, 0x3880}, // 1023.5·2⁻²⁴ ties up from subnormal to normal
	{0x387FC000, 0x03FF, 0x3880}, // largest f16 subnormal
	{0x7F800000, 0x7C00, 0x7F80}, // +inf
	{0xFF800000, 0xFC00, 0xFF80}, // -inf
	{0x7F7FFFFF, 0x7C00, 0x7F80}, // max float32 overflows both
}

func TestEdgeCases(t *testing.T) {
	for _, c := range torchEdge {
		f := math.Float32frombits(c.in)
		if got := Float16From(f); uint16(got) != c.f16 {
			t.Errorf("Float16From(%#08x) = %#04x, want %#04x", c.in, got, c.f16)
		}
		if got := BFloat16From(f); uint16(got) != c.bf16 {
			t.Errorf("BFloat16From(%#08x) = %#04x, want %#04x", c.in, got, c.bf16)
		}
	}
}

func TestSliceHelpers(t *testing.T) {
	src := []float32{1, -2.5, 65504, 1e-8, float32(math.Inf(1))}
	bf := make([]BFloat16, len(src))
	f16 := make([]Float16, len(src))
	BFloat16sFrom(bf, src)
	Float16sFrom(f16, src)
	back := make([]float32, len(src))
	Float16sTo(back, f16)
	want16 := []float32{1, -2.5, 65504, 0, float32(math.Inf(1))}
	for i := range back {
		if back[i] != want16[i] {
			t.Errorf("float16 round trip [%d] = %v, want %v", i, back[i], want16[i])
		}
	}
	BFloat16sTo(back, bf)
	for i := range back {
		if back[i] != BFloat16From(src[i]).Float32() {
			t.Errorf("bfloat16 round trip [%d] = %v", i, back[i])
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("BFloat16sFrom with mismatched lengths did not panic")
		}
	}()
	BFloat16sFrom(bf[:1], src)
}

func BenchmarkFloat16sFrom(b *testing.B) {
	src := make([]float32, 1<<16)
	for i := range src {
		src[i] = float32(i) * 0.37
	}
	dst := make([]Float16, len(src))
	b.SetBytes(int64(4 * len(src)))
	for b.Loop() {
		Float16sFrom(dst, src)
	}
}

func BenchmarkBFloat16sFrom(b *testing.B) {
	src := make([]float32, 1<<16)
	for i := range src {
		src[i] = float32(i) * 0.37
	}
	dst := make([]BFloat16, len(src))
	b.SetBytes(int64(4 * len(src)))
	for b.Loop() {
		BFloat16sFrom(dst, src)
	}
}

// TestNaNAndInfRules pins IEEE 754's rules for narrowing special values
// (§6.2.3, and x86's VCVTNEPS2BF16 and VCVTPS2PH): an infinity stays an
// infinity of the same sign; a NaN stays a NaN of the same sign, becomes
// quiet, and keeps the top bits of its payload, for every payload bit.
func TestNaNAndInfRules(t *testing.T) {
	for _, sign := range []uint32{0, 0x80000000} {
		inf := math.Float32frombits(sign | 0x7F800000)
		if got, want := BFloat16From(inf), BFloat16(sign>>16|0x7F80); got != want {
			t.Errorf("BFloat16From(%v) = %#04x, want %#04x", inf, got, want)
		}
		if got, want := Float16From(inf), Float16(sign>>16|0x7C00); got != want {
			t.Errorf("Float16From(%v) = %#04x, want %#04x", inf, got, want)
		}
		payloads := []uint32{0x400000, 0x7FFFFF, 0x123456, 0x3FFFFF}
		for bit := range 23 {
			payloads = append(payloads, 1<<bit)
		}
		for _, p := range payloads {
			in := sign | 0x7F800000 | p
			f := math.Float32frombits(in)
			b := BFloat16From(f)
			if b.Float32() == b.Float32() || uint32(b)&0x8000 != sign>>16 || b&bf16Quiet == 0 || uint32(b)&0x3F != p>>16&0x3F {
				t.Errorf("BFloat16From(NaN %#08x) = %#04x: want a quiet NaN with the sign and payload bits %#x", in, b, p>>16&0x3F)
			}
			h := Float16From(f)
			if h.Float32() == h.Float32() || uint32(h)&0x8000 != sign>>16 || h&f16Quiet == 0 || uint32(h)&0x1FF != p>>13&0x1FF {
				t.Errorf("Float16From(NaN %#08x) = %#04x: want a quiet NaN with the sign and payload bits %#x", in, h, p>>13&0x1FF)
			}
		}
	}
}
