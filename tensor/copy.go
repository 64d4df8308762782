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
	switch {
	case src.dev == dst.dev:
	case dst.dev == CUDA:
		copyToCUDA(dst, src, "")
		return
	case src.dev == CUDA:
		copyFromCUDA(dst, src, "")
		return
	default:
		// A transfer between the host and the simulated device: both are
		// host memory, so the CPU's copy moves it.
		cpuBackend{}.CopyStrided(dst, src)
		return
	}
	backendFor(dst, src).CopyStrided(dst, src)
}

// Convert writes src's values into dst, a contiguous tensor of the same
// element count and device and possibly another dtype (float32 to
// bfloat16 rounds to nearest even; bfloat16 to float32 is exact), with
// the device's kernel. It records nothing on any tape.
func Convert(dst, src *Tensor) {
	switch {
	case dst.Numel() != src.Numel():
		panic(fmt.Sprintf("tensor: Convert of %v into %v: element counts differ", src.shape, dst.shape))
	case dst.dev != src.dev:
		panic(fmt.Sprintf("tensor: Convert from %v to %v: one device", src.dev, dst.dev))
	case !dst.IsContiguous() || !src.IsContiguous():
		panic("tensor: Convert of a strided view")
	}
	backendFor(dst, src).Convert(dst, src)
}

// Zero sets every element of the contiguous tensor t to zero. It records
// nothing on any tape.
func Zero(t *Tensor) {
	if !t.IsContiguous() {
		panic("tensor: Zero of a strided view")
	}
	backendFor(t).Fill(t, 0)
}
