package tensor

import (
	"fmt"
	"math"
)

// DType is a tensor's element type. Float32 is the compute type; BFloat16 and
// Float16 are storage types (converted with round-to-nearest-even); Int32 and
// Int64 hold token ids and indices.
type DType uint8

// The element types.
const (
	Float32 DType = iota
	BFloat16
	Float16
	Int32
	Int64
)

// Size returns the size of one element in bytes.
func (d DType) Size() int {
	switch d {
	case BFloat16, Float16:
		return 2
	case Int64:
		return 8
	default:
		return 4
	}
}

func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case BFloat16:
		return "bfloat16"
	case Float16:
		return "float16"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Float32ToBFloat16 rounds f to the nearest bfloat16, ties to even. NaNs stay
// NaN (quiet), infinities stay infinite.
func Float32ToBFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep sign, force a quiet mantissa bit
		return uint16(b>>16) | 0x40
	}
	// Add 0x7fff plus the lowest kept bit: rounds half to even.
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// BFloat16ToFloat32 widens a bfloat16 exactly.
func BFloat16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToFloat16 rounds f to the nearest IEEE half, ties to even, with
// subnormals, overflow to infinity and NaN handled as the hardware does.
func Float32ToFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	switch {
	case exp == 0xff: // Inf or NaN
		if man != 0 {
			return sign | 0x7e00 | uint16(man>>13)
		}
		return sign | 0x7c00
	case exp-127 > 15: // overflow
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e <= 0 { // subnormal half (or zero)
		if e < -10 {
			return sign
		}
		m := man | 0x800000
		shift := uint32(14 - e) // 13 + (1 - e)
		half := uint32(1) << (shift - 1)
		rest := m & (1<<shift - 1)
		out := m >> shift
		if rest > half || (rest == half && out&1 == 1) {
			out++
		}
		return sign | uint16(out)
	}
	out := uint32(e)<<10 | man>>13
	rest := man & 0x1fff
	if rest > 0x1000 || (rest == 0x1000 && out&1 == 1) {
		out++ // may carry into the exponent, up to infinity: correct
	}
	return sign | uint16(out)
}

// Float16ToFloat32 widens an IEEE half exactly.
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch exp {
	case 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		// subnormal: value = man * 2^-24
		f := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}
