package tensor

import "fmt"

// DevicePointer returns the device address of contiguous CUDA tensor t's
// first element, for libraries that work on device memory in place (NCCL,
// through comm/nccl). The address is valid while t is reachable: keep t
// alive (runtime.KeepAlive) until the work that uses the address has been
// queued on the device's stream; memory returned to the caching allocator
// after that is reused only by work queued later on the same stream.
func DevicePointer(t *Tensor) (uintptr, error) {
	switch {
	case t == nil:
		return 0, fmt.Errorf("tensor: DevicePointer of a nil tensor")
	case t.dev != CUDA || t.dbuf == nil:
		return 0, fmt.Errorf("tensor: DevicePointer: %s is on %v, not on the CUDA device", t, t.dev)
	case !t.IsContiguous():
		return 0, fmt.Errorf("tensor: DevicePointer: %s is not contiguous", t)
	case t.dbuf.freed.Load():
		return 0, fmt.Errorf("tensor: DevicePointer: %s's device memory was freed (its tape was reset)", t)
	}
	return uintptr(devPtr(t)), nil
}
