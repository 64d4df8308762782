package tensor

import "fmt"

// Copy copies src's elements, in row-major order, into dst: a contiguous
// tensor of the same dtype and element count (shapes may differ), on any
// device (a copy between the host and the simulated device is counted). It
// records nothing on any tape. A decoding step uses it to keep a layer's
// output in a buffer that outlives the layer's scratch tape; loading a
// checkpoint into device parameters is a Copy from the host.
func Copy(dst, src *Tensor) {
	switch {
	case dst.dtype != src.dtype:
		panic(fmt.Sprintf("tensor: Copy of %v into %v", src.dtype, dst.dtype))
	case dst.Numel() != src.Numel():
		panic(fmt.Sprintf("tensor: Copy of %v into %v: element counts differ", src.shape, dst.shape))
	case !dst.IsContiguous():
		panic("tensor: Copy into a strided view")
	}
	countTransfer(src.dev, dst.dev, src)
	if !src.IsContiguous() {
		if dst.offset == 0 {
			copyStrided(dst, src) // writes from element 0 of dst's storage
			return
		}
		src = src.Contiguous()
	}
	n, so, do := src.Numel(), src.offset, dst.offset
	switch src.dtype {
	case Float32:
		copy(dst.f32[do:do+n], src.f32[so:so+n])
	case BFloat16, Float16:
		copy(dst.u16[do:do+n], src.u16[so:so+n])
	case Int32:
		copy(dst.i32[do:do+n], src.i32[so:so+n])
	case Int64:
		copy(dst.i64[do:do+n], src.i64[so:so+n])
	}
}

// Zero sets every element of the contiguous tensor t to zero. It records
// nothing on any tape.
func Zero(t *Tensor) {
	if !t.IsContiguous() {
		panic("tensor: Zero of a strided view")
	}
	n, o := t.Numel(), t.offset
	switch t.dtype {
	case Float32:
		clear(t.f32[o : o+n])
	case BFloat16, Float16:
		clear(t.u16[o : o+n])
	case Int32:
		clear(t.i32[o : o+n])
	case Int64:
		clear(t.i64[o : o+n])
	}
}
