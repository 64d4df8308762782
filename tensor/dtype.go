package tensor

import (
	"fmt"

	"github.com/gotron/gotron/internal/half"
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

// The conversions are package half's (internal/half), kept under these names
// so tensor code reads naturally.

// Float32ToBFloat16 rounds f to the nearest bfloat16, ties to even; NaN
// stays NaN.
func Float32ToBFloat16(f float32) uint16 { return uint16(half.BFloat16From(f)) }

// BFloat16ToFloat32 widens a bfloat16 exactly.
func BFloat16ToFloat32(h uint16) float32 { return half.BFloat16(h).Float32() }

// Float32ToFloat16 rounds f to the nearest IEEE half, ties to even, with
// subnormals, overflow to infinity and NaN handled as hardware does.
func Float32ToFloat16(f float32) uint16 { return uint16(half.Float16From(f)) }

// Float16ToFloat32 widens an IEEE half exactly.
func Float16ToFloat32(h uint16) float32 { return half.Float16(h).Float32() }
