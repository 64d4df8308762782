package tensor

import (
	"fmt"
	"unsafe"
)

// SimStorage returns the bytes of contiguous simulated-device tensor t's
// elements, for a collective backend that works on device memory in place
// (comm.SimDevice, the simulated device's counterpart of comm/nccl, which
// uses DevicePointer). The slice aliases t's storage: writing it writes t.
// It is the device's own memory, as a DevicePointer is the GPU's, so it is
// not a host copy and is not counted in SimTransfers; host code must still
// read sim tensors through ToHost. Float32, BFloat16, Float16, Int32 and
// Int64 tensors have storage here.
func SimStorage(t *Tensor) ([]byte, error) {
	switch {
	case t == nil:
		return nil, fmt.Errorf("tensor: SimStorage of a nil tensor")
	case t.dev != Sim:
		return nil, fmt.Errorf("tensor: SimStorage: %s is on %v, not on the simulated device", t, t.dev)
	case !t.IsContiguous():
		return nil, fmt.Errorf("tensor: SimStorage: %s is not contiguous", t)
	}
	n := t.Numel()
	if n == 0 {
		return nil, nil
	}
	switch t.dtype {
	case Float32:
		return bytesOf(t.f32s()), nil
	case Int32:
		return bytesOf(t.i32s()), nil
	case Int64:
		return bytesOf(t.i64s()), nil
	case BFloat16, Float16:
		return bytesOf(t.u16s()), nil
	}
	return nil, fmt.Errorf("tensor: SimStorage: %s: dtype %v has no storage to share", t, t.dtype)
}

func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}
