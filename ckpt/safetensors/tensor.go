package safetensors

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/gotron/gotron/internal/half"
)

// Tensor is a named file's tensor: element type, row-major shape and the
// little-endian bytes of its elements. A scalar has an empty Shape.
type Tensor struct {
	DType DType
	Shape []int
	Data  []byte
}

// Validate checks that Data holds exactly the bytes DType and Shape need.
func (t Tensor) Validate() error {
	n, err := ByteSize(t.DType, t.Shape)
	if err != nil {
		return err
	}
	if n != len(t.Data) {
		return fmt.Errorf("%v%v needs %d bytes, Data has %d", t.DType, t.Shape, n, len(t.Data))
	}
	return nil
}

// NumElements returns the product of Shape (1 for a scalar).
func (t Tensor) NumElements() int {
	n := 1
	for _, s := range t.Shape {
		n *= s
	}
	return n
}

// FromFloat32 encodes x, of len prod(shape), as a tensor of dtype F32, F64,
// F16 or BF16 (the last two rounded to nearest even, see package half).
func FromFloat32(dt DType, shape []int, x []float32) (Tensor, error) {
	t := Tensor{DType: dt, Shape: append([]int(nil), shape...)}
	n, err := ByteSize(dt, shape)
	if err != nil {
		return Tensor{}, fmt.Errorf("safetensors: FromFloat32: %v", err)
	}
	if want := t.NumElements(); want != len(x) {
		return Tensor{}, fmt.Errorf("safetensors: FromFloat32: shape %v has %d elements, got %d values", shape, want, len(x))
	}
	t.Data = make([]byte, n)
	switch dt {
	case F32:
		for i, v := range x {
			binary.LittleEndian.PutUint32(t.Data[4*i:], math.Float32bits(v))
		}
	case F64:
		for i, v := range x {
			binary.LittleEndian.PutUint64(t.Data[8*i:], math.Float64bits(float64(v)))
		}
	case F16:
		for i, v := range x {
			binary.LittleEndian.PutUint16(t.Data[2*i:], uint16(half.Float16From(v)))
		}
	case BF16:
		for i, v := range x {
			binary.LittleEndian.PutUint16(t.Data[2*i:], uint16(half.BFloat16From(v)))
		}
	default:
		return Tensor{}, fmt.Errorf("safetensors: FromFloat32: cannot encode float32 values as %v", dt)
	}
	return t, nil
}

// DecodeFloat32 converts the elements of an F32, F64 (rounded), F16 or BF16
// tensor into dst, whose length must be NumElements.
func (t Tensor) DecodeFloat32(dst []float32) error {
	if err := t.Validate(); err != nil {
		return fmt.Errorf("safetensors: DecodeFloat32: %v", err)
	}
	if n := t.NumElements(); n != len(dst) {
		return fmt.Errorf("safetensors: DecodeFloat32: tensor %v has %d elements, dst has %d", t.Shape, n, len(dst))
	}
	if err := decodeFloat32(dst, t.DType, t.Data); err != nil {
		return fmt.Errorf("safetensors: DecodeFloat32: %v", err)
	}
	return nil
}

// DecodeFloat32At converts len(dst) consecutive elements of t, from
// element first (in row-major order), into dst: DecodeFloat32 of a range.
// A range of rows is one such range, a range of columns one per row. Only
// those elements' bytes are read: of a tensor from Open, only the pages of
// the file mapping that hold them. It returns the number of bytes read.
func (t Tensor) DecodeFloat32At(dst []float32, first int) (int, error) {
	if err := t.Validate(); err != nil {
		return 0, fmt.Errorf("safetensors: DecodeFloat32At: %v", err)
	}
	if n := t.NumElements(); first < 0 || first > n || len(dst) > n-first {
		return 0, fmt.Errorf("safetensors: DecodeFloat32At: elements [%d, %d+%d) of tensor %v: want a range within its %d elements", first, first, len(dst), t.Shape, n)
	}
	switch t.DType {
	case F32, F64, F16, BF16:
	default:
		return 0, fmt.Errorf("safetensors: DecodeFloat32At: cannot decode %v as float32", t.DType)
	}
	size := t.DType.Bits() / 8
	b := t.Data[first*size : (first+len(dst))*size]
	if err := decodeFloat32(dst, t.DType, b); err != nil {
		return 0, fmt.Errorf("safetensors: DecodeFloat32At: %v", err)
	}
	return len(b), nil
}

// decodeFloat32 converts data, len(dst) elements of dtype dt, into dst.
func decodeFloat32(dst []float32, dt DType, data []byte) error {
	switch dt {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
	case F64:
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(data[8*i:])))
		}
	case F16:
		for i := range dst {
			dst[i] = half.Float16(binary.LittleEndian.Uint16(data[2*i:])).Float32()
		}
	case BF16:
		for i := range dst {
			dst[i] = half.BFloat16(binary.LittleEndian.Uint16(data[2*i:])).Float32()
		}
	default:
		return fmt.Errorf("cannot decode %v as float32", dt)
	}
	return nil
}

// littleEndian reports whether the host stores integers little-endian, as
// the file format does.
func littleEndian() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}

// Float32View returns the elements of an F32 tensor as a []float32 sharing
// Data (no copy), when the host is little-endian and Data is 4-byte aligned
// (always true for files written by this package or upstream, when opened
// with Open or ReadFile). ok is false otherwise; use DecodeFloat32 then. A
// view into a file from Open is read-only.
func (t Tensor) Float32View() (v []float32, ok bool) {
	if t.DType != F32 || t.Validate() != nil || !littleEndian() {
		return nil, false
	}
	if len(t.Data) == 0 {
		return []float32{}, true
	}
	p := unsafe.Pointer(unsafe.SliceData(t.Data))
	if uintptr(p)%4 != 0 {
		return nil, false
	}
	return unsafe.Slice((*float32)(p), len(t.Data)/4), true
}

// Float32Bytes returns x's memory as little-endian F32 bytes without a copy
// on little-endian hosts (a copy elsewhere), for building a Tensor to write.
func Float32Bytes(x []float32) []byte {
	if len(x) == 0 {
		return []byte{}
	}
	if littleEndian() {
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 4*len(x))
	}
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}
