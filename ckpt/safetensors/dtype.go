package safetensors

import "fmt"

// DType is a safetensors element type. The numeric order of the constants is
// the order of the upstream Rust enum (increasing alignment); the writer sorts
// tensors by descending DType, then by name, exactly as upstream does.
type DType uint8

// The element types of the safetensors format, in upstream enum order. F4,
// F6_E2M3 and F6_E3M2 are sub-byte types: a tensor of them must hold a whole
// number of bytes.
const (
	BOOL DType = iota
	F4
	F6_E2M3
	F6_E3M2
	U8
	I8
	F8_E5M2
	F8_E4M3
	F8_E8M0
	F8_E4M3FNUZ
	F8_E5M2FNUZ
	I16
	U16
	F16
	BF16
	I32
	U32
	F32
	C64
	F64
	I64
	U64
	numDTypes
)

var dtypeNames = [numDTypes]string{
	BOOL: "BOOL", F4: "F4", F6_E2M3: "F6_E2M3", F6_E3M2: "F6_E3M2",
	U8: "U8", I8: "I8", F8_E5M2: "F8_E5M2", F8_E4M3: "F8_E4M3",
	F8_E8M0: "F8_E8M0", F8_E4M3FNUZ: "F8_E4M3FNUZ", F8_E5M2FNUZ: "F8_E5M2FNUZ",
	I16: "I16", U16: "U16", F16: "F16", BF16: "BF16",
	I32: "I32", U32: "U32", F32: "F32", C64: "C64",
	F64: "F64", I64: "I64", U64: "U64",
}

var dtypeBits = [numDTypes]int{
	BOOL: 8, F4: 4, F6_E2M3: 6, F6_E3M2: 6, U8: 8, I8: 8,
	F8_E5M2: 8, F8_E4M3: 8, F8_E8M0: 8, F8_E4M3FNUZ: 8, F8_E5M2FNUZ: 8,
	I16: 16, U16: 16, F16: 16, BF16: 16, I32: 32, U32: 32, F32: 32,
	C64: 64, F64: 64, I64: 64, U64: 64,
}

// String returns the name used in safetensors headers ("F32", "BF16", ...).
func (d DType) String() string {
	if d < numDTypes {
		return dtypeNames[d]
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Bits returns the width of one element in bits (4 for F4, 6 for F6_*), or 0
// for an invalid DType.
func (d DType) Bits() int {
	if d < numDTypes {
		return dtypeBits[d]
	}
	return 0
}

// Valid reports whether d is one of the defined constants.
func (d DType) Valid() bool { return d < numDTypes }

// ParseDType returns the DType named s, exactly as written in a header
// (case-sensitive: "F32", not "f32").
func ParseDType(s string) (DType, error) {
	for i, n := range dtypeNames {
		if n == s {
			return DType(i), nil
		}
	}
	return 0, fmt.Errorf("unknown dtype %q", s)
}

// ByteSize returns the number of bytes a tensor of this dtype and shape
// occupies, or an error if the product overflows, a dimension is negative or
// the bit count is not a whole number of bytes.
func ByteSize(d DType, shape []int) (int, error) {
	if !d.Valid() {
		return 0, fmt.Errorf("invalid dtype %v", d)
	}
	n := uint64(1)
	const limit = uint64(1) << 62 // keeps bits = n·64 within uint64 and the result within int
	for _, s := range shape {
		if s < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", shape)
		}
		if s != 0 && n > limit/uint64(s) {
			return 0, fmt.Errorf("shape %v overflows", shape)
		}
		n *= uint64(s)
	}
	if n > limit/64 {
		return 0, fmt.Errorf("shape %v overflows", shape)
	}
	bits := n * uint64(d.Bits())
	if bits%8 != 0 {
		return 0, fmt.Errorf("%v tensor of shape %v is %d bits, not a whole number of bytes", d, shape, bits)
	}
	return int(bits / 8), nil
}
