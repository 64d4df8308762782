// Package half converts between float32 and the two 16-bit floating-point
// formats gotron uses: bfloat16 (8 exponent bits, 7 mantissa bits: --bf16
// matrix operands, bf16 collectives, checkpoints) and IEEE 754 binary16
// "float16" (5 exponent bits, 10 mantissa bits: checkpoints). It is the one
// implementation of these roundings: tensor, internal/cpu (whose assembly
// packers are tested bit for bit against it), comm and ckpt/safetensors all
// call it.
//
// Narrowing conversions round to nearest, ties to even, exactly as IEEE 754
// prescribes, including float16 subnormals, overflow to infinity and
// underflow to signed zero. Widening conversions are exact.
//
// NaN handling follows IEEE 754's recommendation for narrowing (§6.2.3:
// preserve the payload as far as the format allows) and what x86 hardware
// does (VCVTNEPS2BF16, VCVTPS2PH): a NaN keeps its sign and the top bits of
// its payload, and becomes quiet (the quiet bit, the mantissa's top bit, is
// set, so it stays a NaN even when the kept payload bits are zero). So the
// quiet NaN 0x7FC00000 becomes bfloat16 0x7FC0 and float16 0x7E00, the
// signalling NaN 0x7F800001 becomes 0x7FC0 and 0x7E00, and 0xFFC12345
// becomes 0xFFC1 and 0xFE09. PyTorch returns the canonical 0x7E00 (with the
// sign) for every float16 NaN and is inconsistent for bfloat16 (0x7FC0 on
// its scalar path, 0xFFFF on torch 1.13's AVX2 path): only the payload bits
// of NaNs can differ from it.
package half

import (
	"fmt"
	"math"
)

// BFloat16 is the bit pattern of a bfloat16 number: the upper 16 bits of the
// float32 with the same sign and exponent.
type BFloat16 uint16

// Float16 is the bit pattern of an IEEE 754 binary16 number.
type Float16 uint16

const (
	bf16Quiet = 0x0040 // the quiet bit of a bfloat16 NaN (mantissa's top bit)
	f16Quiet  = 0x0200 // the quiet bit of a float16 NaN
	f16Inf    = 0x7C00
)

// BFloat16From rounds f to the nearest bfloat16, ties to even. Values beyond
// the largest finite bfloat16 (after rounding) become infinities; a NaN
// keeps its sign and top 6 payload bits and becomes quiet.
func BFloat16From(f float32) BFloat16 {
	b := math.Float32bits(f)
	if b&0x7FFFFFFF > 0x7F800000 { // NaN
		return BFloat16(b>>16 | bf16Quiet)
	}
	// Adding 0x7FFF plus the lowest kept bit rounds to nearest even; a carry
	// out of the mantissa correctly increments the exponent (up to infinity).
	b += 0x7FFF + (b >> 16 & 1)
	return BFloat16(b >> 16)
}

// Float32 returns h's value exactly.
func (h BFloat16) Float32() float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// Float16From rounds f to the nearest float16, ties to even, producing
// subnormals for magnitudes below 2⁻¹⁴, signed zero below half the smallest
// subnormal (2⁻²⁵, which itself ties to zero) and infinity at or above
// 65520. A NaN keeps its sign and top 9 payload bits and becomes quiet.
func Float16From(f float32) Float16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xFF
	mant := b & 0x7FFFFF
	if exp == 0xFF {
		if mant != 0 {
			return Float16(sign | f16Inf | f16Quiet | uint16(mant>>13))
		}
		return Float16(sign | f16Inf)
	}
	e := exp - 127 + 15 // float16 biased exponent
	if e >= 0x1F {
		return Float16(sign | f16Inf)
	}
	if e <= 0 {
		// Subnormal (or zero) result: the float16 mantissa is value/2⁻²⁴,
		// that is the 24-bit significand shifted right by 14-e.
		if e < -10 {
			return Float16(sign) // below 2⁻²⁵: rounds to zero
		}
		m := mant | 0x800000
		if exp == 0 {
			m = mant // float32 subnormal; e < -10 anyway, kept for clarity
		}
		shift := uint(14 - e)
		h := m >> shift
		rem := m & (1<<shift - 1)
		halfway := uint32(1) << (shift - 1)
		if rem > halfway || rem == halfway && h&1 == 1 {
			h++ // may carry into the smallest normal, 0x0400: still right
		}
		return Float16(sign | uint16(h))
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1FFF
	if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++ // a carry out of the mantissa bumps the exponent, up to infinity
	}
	return Float16(sign | uint16(h))
}

// Float32 returns h's value exactly.
func (h Float16) Float32() float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1F
	mant := uint32(h & 0x3FF)
	switch {
	case exp == 0x1F:
		if mant != 0 {
			// Keep the payload, as hardware conversions do.
			return math.Float32frombits(sign | 0x7F800000 | mant<<13)
		}
		return math.Float32frombits(sign | 0x7F800000)
	case exp == 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		// Subnormal: mant·2⁻²⁴ is exactly representable in float32.
		v := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// BFloat16sFrom rounds each src[i] into dst[i] (see BFloat16From).
// It panics if the lengths differ.
func BFloat16sFrom(dst []BFloat16, src []float32) {
	checkLen("BFloat16sFrom", len(dst), len(src))
	for i, f := range src {
		dst[i] = BFloat16From(f)
	}
}

// BFloat16sTo widens each src[i] into dst[i]. It panics if the lengths differ.
func BFloat16sTo(dst []float32, src []BFloat16) {
	checkLen("BFloat16sTo", len(dst), len(src))
	for i, h := range src {
		dst[i] = math.Float32frombits(uint32(h) << 16)
	}
}

// Float16sFrom rounds each src[i] into dst[i] (see Float16From).
// It panics if the lengths differ.
func Float16sFrom(dst []Float16, src []float32) {
	checkLen("Float16sFrom", len(dst), len(src))
	for i, f := range src {
		dst[i] = Float16From(f)
	}
}

// Float16sTo widens each src[i] into dst[i]. It panics if the lengths differ.
func Float16sTo(dst []float32, src []Float16) {
	checkLen("Float16sTo", len(dst), len(src))
	for i, h := range src {
		dst[i] = h.Float32()
	}
}

// checkLen panics on a programmer error: slices of different lengths.
func checkLen(fn string, dst, src int) {
	if dst != src {
		panic(fmt.Sprintf("half: %s: len(dst) = %d, len(src) = %d", fn, dst, src))
	}
}
