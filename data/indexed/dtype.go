package indexed

import "fmt"

// DType is the token dtype code stored in byte 17 of an .idx file.
type DType uint8

// The dtype codes of Megatron's DType enum
// (megatron/core/datasets/indexed_dataset.py). Code 6 was float64 and
// 7 float32 since 2024; older Megatron mapped both 6 and 7 to float64.
const (
	UInt8   DType = 1
	Int8    DType = 2
	Int16   DType = 3
	Int32   DType = 4
	Int64   DType = 5
	Float64 DType = 6
	Float32 DType = 7
	UInt16  DType = 8
)

// Size returns the item size in bytes, or 0 for an unknown code.
func (d DType) Size() int {
	switch d {
	case UInt8, Int8:
		return 1
	case Int16, UInt16:
		return 2
	case Int32, Float32:
		return 4
	case Int64, Float64:
		return 8
	}
	return 0
}

// Valid reports whether d is one of the eight known codes.
func (d DType) Valid() bool { return d.Size() != 0 }

// String returns numpy's name for the dtype.
func (d DType) String() string {
	switch d {
	case UInt8:
		return "uint8"
	case Int8:
		return "int8"
	case Int16:
		return "int16"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	case Float64:
		return "float64"
	case Float32:
		return "float32"
	case UInt16:
		return "uint16"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// OptimalDType is the token dtype tools/preprocess_data.py picks for a
// vocabulary (DType.optimal_dtype): uint16 when vocabSize < 65500, else int32.
func OptimalDType(vocabSize int) DType {
	if vocabSize < 65500 {
		return UInt16
	}
	return Int32
}

// fits reports whether the token id v is representable in d.
func (d DType) fits(v int64) bool {
	switch d {
	case UInt8:
		return v >= 0 && v <= 0xff
	case Int8:
		return v >= -128 && v <= 127
	case Int16:
		return v >= -1<<15 && v < 1<<15
	case UInt16:
		return v >= 0 && v <= 0xffff
	case Int32:
		return v >= -1<<31 && v < 1<<31
	case Float32:
		return v >= -1<<24 && v <= 1<<24
	}
	return true
}
