package comm

import (
	"fmt"
	"unsafe"

	"github.com/gotron/gotron/tensor"
)

// elemSize is the element size in bytes of the dtypes a Buffer carries
// (tensor.Float32, BFloat16, Int32 and Int64), 0 for any other.
func elemSize(d tensor.DType) int {
	switch d {
	case tensor.Float32, tensor.BFloat16, tensor.Int32, tensor.Int64:
		return d.Size()
	}
	return 0
}

// Buffer is a view of typed elements as bytes: tensor.Float32, BFloat16,
// Int32 or Int64 (tensor.DType is the one element type of the module). The
// zero Buffer is an empty float32 buffer. Data must be aligned for DType
// (views made by Float32s, BFloat16s, Int32s, Int64s and MakeBuffer are),
// and len(Data) must be a multiple of DType.Size().
type Buffer struct {
	DType tensor.DType
	Data  []byte
}

func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

func viewAs[T any](b []byte) []T {
	if len(b) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}

// Float32s views s as a Float32 buffer (no copy).
func Float32s(s []float32) Buffer { return Buffer{tensor.Float32, bytesOf(s)} }

// BFloat16s views s (bfloat16 bit patterns) as a BFloat16 buffer (no copy).
func BFloat16s(s []uint16) Buffer { return Buffer{tensor.BFloat16, bytesOf(s)} }

// Int32s views s as an Int32 buffer (no copy).
func Int32s(s []int32) Buffer { return Buffer{tensor.Int32, bytesOf(s)} }

// Int64s views s as an Int64 buffer (no copy).
func Int64s(s []int64) Buffer { return Buffer{tensor.Int64, bytesOf(s)} }

// MakeBuffer allocates a zeroed, 8-byte aligned buffer of n elements.
func MakeBuffer(dt tensor.DType, n int) Buffer {
	words := make([]uint64, (n*dt.Size()+7)/8)
	return Buffer{dt, bytesOf(words)[:n*dt.Size()]}
}

// Len is the number of elements.
func (b Buffer) Len() int {
	if s := elemSize(b.DType); s > 0 {
		return len(b.Data) / s
	}
	return 0
}

// Slice returns elements [i, j) as a Buffer sharing b's memory.
func (b Buffer) Slice(i, j int) Buffer {
	s := b.DType.Size()
	return Buffer{b.DType, b.Data[i*s : j*s : j*s]}
}

// Float32 views a Float32 buffer as []float32 (nil for other dtypes).
func (b Buffer) Float32() []float32 {
	if b.DType != tensor.Float32 {
		return nil
	}
	return viewAs[float32](b.Data)
}

// BFloat16 views a BFloat16 buffer as []uint16 (nil for other dtypes).
func (b Buffer) BFloat16() []uint16 {
	if b.DType != tensor.BFloat16 {
		return nil
	}
	return viewAs[uint16](b.Data)
}

// Int32 views an Int32 buffer as []int32 (nil for other dtypes).
func (b Buffer) Int32() []int32 {
	if b.DType != tensor.Int32 {
		return nil
	}
	return viewAs[int32](b.Data)
}

// Int64 views an Int64 buffer as []int64 (nil for other dtypes).
func (b Buffer) Int64() []int64 {
	if b.DType != tensor.Int64 {
		return nil
	}
	return viewAs[int64](b.Data)
}

// Check returns an error if b's dtype is unknown or its byte length is not
// a whole number of elements.
func (b Buffer) Check() error {
	s := elemSize(b.DType)
	if s == 0 {
		return fmt.Errorf("unsupported dtype %v", b.DType)
	}
	if len(b.Data)%s != 0 {
		return fmt.Errorf("%s buffer of %d bytes is not a whole number of %d-byte elements", b.DType, len(b.Data), s)
	}
	return nil
}

// EvenCounts splits total elements into n equal counts, or returns an error
// naming total and n if it does not divide.
func EvenCounts(total, n int) ([]int, error) {
	if n <= 0 || total%n != 0 {
		return nil, fmt.Errorf("%d elements do not split evenly over %d ranks", total, n)
	}
	c := make([]int, n)
	for i := range c {
		c[i] = total / n
	}
	return c, nil
}

// Offsets returns the prefix sums of counts: offsets[i] = sum(counts[:i]),
// with len(counts)+1 entries.
func Offsets(counts []int) []int {
	off := make([]int, len(counts)+1)
	for i, c := range counts {
		off[i+1] = off[i] + c
	}
	return off
}

// ResolveCounts returns counts, or the even split of total over n ranks
// when counts is nil, after checking there are n non-negative counts that
// add up to total. what names the argument in errors ("counts").
func ResolveCounts(counts []int, total, n int, what string) ([]int, error) {
	if counts == nil {
		c, err := EvenCounts(total, n)
		if err != nil {
			return nil, fmt.Errorf("%s: nil (even split): %w", what, err)
		}
		return c, nil
	}
	if len(counts) != n {
		return nil, fmt.Errorf("%s: %d entries, want one per rank (%d)", what, len(counts), n)
	}
	sum := 0
	for i, c := range counts {
		if c < 0 {
			return nil, fmt.Errorf("%s[%d] = %d is negative", what, i, c)
		}
		sum += c
	}
	if sum != total {
		return nil, fmt.Errorf("%s add up to %d elements, buffer has %d", what, sum, total)
	}
	return counts, nil
}
