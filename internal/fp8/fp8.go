// Package fp8 holds the 8-bit floating-point formats and scaling recipes
// that Megatron's --fp8-format and --fp8-recipe select in Transformer
// Engine (TE), as plain scalar arithmetic: the casts (OCP FP8 E4M3 and
// E5M2, round to nearest even, saturating to the largest finite value as
// TE's kernels do with __NV_SATFINITE), the per-tensor current scale
// (TE's compute_scale_from_amax, the Float8CurrentScaling recipe, gotron's
// --fp8-recipe tensorwise) and the delayed scale with its amax history
// (TE's DelayedScaling amax_and_scale_update kernel, --fp8-recipe
// delayed).
//
// gotron emulates FP8 products on the CPU (tensor.FP8Linear): each operand
// is quantized to FP8 values times a float32 scale inverse, the FP8 values
// are multiplied and summed in float32, and the result is multiplied by
// the two scale inverses, as cuBLASLt's FP8 GEMM does with its
// A/B scale-inverse pointers. That reproduces the numerics; it is slower
// than a float32 product on a CPU (a cast pass per operand). The speed of
// FP8 is a GPU's.
package fp8

import (
	"fmt"
	"math"
)

// Format is an 8-bit floating-point format.
type Format int

const (
	// E4M3 is OCP FP8 E4M3 ("E4M3FN"): 1 sign, 4 exponent bits (bias 7),
	// 3 mantissa bits; no infinities, S.1111.111 is NaN; largest finite
	// 448. TE's kFloat8E4M3.
	E4M3 Format = iota + 1
	// E5M2 is OCP FP8 E5M2: 1 sign, 5 exponent bits (bias 15), 2 mantissa
	// bits, IEEE-like (infinities, NaNs); largest finite 57344. TE's
	// kFloat8E5M2.
	E5M2
)

func (f Format) String() string {
	switch f {
	case E4M3:
		return "e4m3"
	case E5M2:
		return "e5m2"
	}
	return fmt.Sprintf("fp8.Format(%d)", int(f))
}

// layout returns the format's exponent bits, mantissa bits and bias.
func (f Format) layout() (expBits, mantBits, bias int) {
	switch f {
	case E4M3:
		return 4, 3, 7
	case E5M2:
		return 5, 2, 15
	}
	panic(fmt.Sprintf("fp8: unknown format %d", int(f)))
}

// Max is the largest finite value of the format (TE's fp8_dtype_max).
func (f Format) Max() float32 {
	switch f {
	case E4M3:
		return 448
	case E5M2:
		return 57344
	}
	panic(fmt.Sprintf("fp8: unknown format %d", int(f)))
}

// NaN is the code a cast of a NaN gives: 0x7F in both formats (CUDA's
// __nv_cvt_float_to_fp8 returns it, dropping the sign).
const NaN uint8 = 0x7F

// Decode returns the value of code b.
func (f Format) Decode(b uint8) float32 {
	eb, mb, bias := f.layout()
	sign := float32(1)
	if b&0x80 != 0 {
		sign = -1
	}
	e := int(b>>mb) & (1<<eb - 1)
	m := int(b) & (1<<mb - 1)
	if e == 1<<eb-1 {
		switch f {
		case E4M3:
			if m == 1<<mb-1 {
				return float32(math.NaN())
			}
		case E5M2:
			if m == 0 {
				return sign * float32(math.Inf(1))
			}
			return float32(math.NaN())
		}
	}
	if e == 0 { // subnormal: m · 2^(1-bias-mb)
		return sign * float32(math.Ldexp(float64(m), 1-bias-mb))
	}
	return sign * float32(math.Ldexp(float64(m|1<<mb), e-bias-mb))
}

// Encode casts x to the format: round to nearest, ties to even; a
// magnitude beyond the largest finite value (infinities included) gives
// the largest finite value with x's sign (TE casts with __NV_SATFINITE);
// a NaN gives NaN (0x7F); -0 keeps its sign.
func (f Format) Encode(x float32) uint8 {
	if x != x {
		return NaN
	}
	_, mb, bias := f.layout()
	var sign uint8
	if math.Signbit(float64(x)) {
		sign = 0x80
	}
	a := math.Abs(float64(x))
	maxV := float64(f.Max())
	if a >= maxV {
		return sign | f.maxCode()
	}
	if a == 0 {
		return sign
	}
	// exponent of a's leading bit, clamped to the smallest normal one:
	// below it the quantum stays 2^(1-bias-mb) (subnormals).
	_, e := math.Frexp(a) // a = fr·2^e, fr in [0.5, 1)
	e--
	if e < 1-bias {
		e = 1 - bias
	}
	q := math.Ldexp(1, e-mb)     // the quantum at a's exponent
	n := math.RoundToEven(a / q) // exact: a is a float32, q a power of 2
	v := n * q
	if v > maxV { // rounded past the largest finite value: saturate
		return sign | f.maxCode()
	}
	if v == 0 { // below half the smallest subnormal: a signed zero
		return sign
	}
	return sign | f.codeOf(v)
}

// maxCode is the code of the largest finite value.
func (f Format) maxCode() uint8 {
	switch f {
	case E4M3:
		return 0x7E
	case E5M2:
		return 0x7B
	}
	panic(fmt.Sprintf("fp8: unknown format %d", int(f)))
}

// codeOf returns the positive code whose value is v (v representable).
func (f Format) codeOf(v float64) uint8 {
	_, mb, bias := f.layout()
	_, e := math.Frexp(v)
	e--
	if e < 1-bias { // subnormal
		return uint8(v / math.Ldexp(1, 1-bias-mb))
	}
	m := v/math.Ldexp(1, e-mb) - float64(int(1)<<mb)
	return uint8(e+bias)<<mb | uint8(m)
}

// Round returns Decode(Encode(x)): x rounded to a value of the format
// (round to nearest even, saturating; NaN stays NaN), computed on x's
// float32 bits (TestRoundMatchesEncode checks it against Encode).
func (f Format) Round(x float32) float32 {
	var drop, minNormalBits uint32
	var subScale, maxV float32
	switch f {
	case E4M3: // 3 mantissa bits; smallest normal 2^-6, subnormal step 2^-9
		drop, minNormalBits, subScale, maxV = 20, 0x3C800000, 512, 448
	case E5M2: // 2 mantissa bits; smallest normal 2^-14, subnormal step 2^-16
		drop, minNormalBits, subScale, maxV = 21, 0x38800000, 65536, 57344
	default:
		panic(fmt.Sprintf("fp8: unknown format %d", int(f)))
	}
	b := math.Float32bits(x)
	sign, mag := b&0x80000000, b&0x7FFFFFFF
	switch {
	case mag > 0x7F800000: // NaN
		return float32(math.NaN())
	case mag >= math.Float32bits(maxV): // beyond the largest finite value (infinities too): saturate
		return math.Float32frombits(sign | math.Float32bits(maxV))
	case mag < minNormalBits:
		// subnormal range: round |x|/step to an integer, ties to even,
		// with float32's own rounding (adding 2^23 leaves no fraction bits;
		// |x|/step < 2^mantissa bits, exact)
		y := math.Float32frombits(mag) * subScale
		n := (y + 8388608) - 8388608
		return math.Float32frombits(sign | math.Float32bits(n/subScale))
	}
	// normal: round the mantissa to the format's bits, ties to even
	half := uint32(1)<<(drop-1) - 1
	mag += half + (mag>>drop)&1
	mag &^= uint32(1)<<drop - 1
	if math.Float32frombits(mag) > maxV {
		mag = math.Float32bits(maxV)
	}
	return math.Float32frombits(sign | mag)
}

// Amax returns the largest magnitude in xs, skipping NaNs as TE's amax
// kernel (fmaxf) does; zero for an empty slice.
func Amax(xs []float32) float32 {
	var m float32
	for _, x := range xs {
		a := float32(math.Abs(float64(x)))
		if a > m {
			m = a
		}
	}
	return m
}

// Quantize writes to dst the FP8 values (as float32: the decoded codes) of
// src scaled by scale: dst[i] = Round(src[i]·scale). The float32 product
// src[i]·scale is rounded once to float32 before the cast, as TE's kernel
// computes it.
func Quantize(f Format, dst, src []float32, scale float32) {
	if len(dst) != len(src) {
		panic(fmt.Sprintf("fp8: Quantize: %d destinations for %d sources", len(dst), len(src)))
	}
	for i, x := range src {
		dst[i] = f.Round(x * scale)
	}
}

// ScaleInv is the scale inverse TE stores beside quantized data and hands
// the GEMM: 1/scale in float32 (TE's reciprocal of the scale).
func ScaleInv(scale float32) float32 { return 1 / scale }
