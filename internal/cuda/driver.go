package cuda

import (
	"fmt"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Error is a failed CUDA driver, cuBLAS or NCCL call.
type Error struct {
	Op   string // the C function, e.g. "cuMemAlloc_v2"
	Code int    // CUresult, cublasStatus_t or ncclResult_t
	Name string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
}

func (e *Error) Error() string {
	if e.Name == "" {
		return fmt.Sprintf("cuda: %s failed with code %d", e.Op, e.Code)
	}
	return fmt.Sprintf("cuda: %s failed: %s (%d)", e.Op, e.Name, e.Code)
}

// Driver constants (cuda.h).
const (
	attrComputeCapabilityMajor = 75 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	attrComputeCapabilityMinor = 76 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
	streamNonBlocking          = 1  // CU_STREAM_NON_BLOCKING
	funcAttrMaxDynamicShared   = 8  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
	jitInfoLogBuffer           = 3  // CU_JIT_INFO_LOG_BUFFER
	jitInfoLogBufferSize       = 4  // CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES
	jitErrorLogBuffer          = 5  // CU_JIT_ERROR_LOG_BUFFER
	jitErrorLogBufferSize      = 6  // CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
	defaultSharedLimit         = 48 << 10
	errorNotInitialized        = 3   // CUDA_ERROR_NOT_INITIALIZED
	errorNoDevice              = 100 // CUDA_ERROR_NO_DEVICE
)

// driverAPI is libcuda's functions. Functions called per operation are kept
// as addresses for purego.SyscallN, which neither reflects nor allocates;
// the others are typed Go functions bound by purego.RegisterFunc.
type driverAPI struct {
	path string

	cuInit                    func(flags uint32) int32
	cuDriverGetVersion        func(v *int32) int32
	cuDeviceGetCount          func(n *int32) int32
	cuDeviceGet               func(dev *int32, ordinal int32) int32
	cuDeviceGetName           func(name *byte, n int32, dev int32) int32
	cuDeviceGetAttribute      func(v *int32, attr int32, dev int32) int32
	cuDeviceTotalMem          func(bytes *uint64, dev int32) int32
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) int32
	cuDevicePrimaryCtxRelease func(dev int32) int32
	cuStreamCreate            func(s *uintptr, flags uint32) int32
	cuStreamDestroy           func(s uintptr) int32
	cuMemAlloc                func(p *uintptr, n uint64) int32
	cuMemFree                 func(p uintptr) int32
	cuMemGetInfo              func(free, total *uint64) int32
	cuMemAllocHost            func(p *unsafe.Pointer, n uint64) int32
	cuMemFreeHost             func(p unsafe.Pointer) int32
	cuMemcpyHtoDAsync         func(dst uintptr, src unsafe.Pointer, n uint64, s uintptr) int32
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src uintptr, n uint64, s uintptr) int32
	cuModuleLoadDataEx        func(mod *uintptr, image *byte, n uint32, opts *int32, vals *uintptr) int32
	cuModuleUnload            func(mod uintptr) int32
	cuModuleGetFunction       func(fn *uintptr, mod uintptr, name *byte) int32
	cuFuncSetAttribute        func(fn uintptr, attr int32, v int32) int32
	cuEventCreate             func(e *uintptr, flags uint32) int32
	cuEventSynchronize        func(e uintptr) int32
	cuEventElapsedTime        func(ms *float32, start, end uintptr) int32
	cuEventDestroy            func(e uintptr) int32
	cuGetErrorName            func(code int32, s **byte) int32

	cuCtxSetCurrent     uintptr // (ctx)
	cuStreamSynchronize uintptr // (stream)
	cuMemcpyDtoDAsync   uintptr // (dst, src, n, stream)
	cuMemsetD8Async     uintptr // (dst, value, n, stream)
	cuLaunchKernel      uintptr // (f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra)
	cuEventRecord       uintptr // (event, stream)
}

var driverLib lazy[driverAPI]

// loadDriver dlopens libcuda once per process.
func loadDriver() (*driverAPI, error) {
	return driverLib.get(func() (*driverAPI, error) {
		lib, path, err := driverSearch().open()
		if err != nil {
			return nil, err
		}
		s := &symbols{lib: lib, path: path}
		d := &driverAPI{path: path}
		s.fn(&d.cuInit, "cuInit")
		s.fn(&d.cuDriverGetVersion, "cuDriverGetVersion")
		s.fn(&d.cuDeviceGetCount, "cuDeviceGetCount")
		s.fn(&d.cuDeviceGet, "cuDeviceGet")
		s.fn(&d.cuDeviceGetName, "cuDeviceGetName")
		s.fn(&d.cuDeviceGetAttribute, "cuDeviceGetAttribute")
		s.fn(&d.cuDeviceTotalMem, "cuDeviceTotalMem_v2")
		s.fn(&d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
		s.fn(&d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2")
		s.fn(&d.cuStreamCreate, "cuStreamCreate")
		s.fn(&d.cuStreamDestroy, "cuStreamDestroy_v2")
		s.fn(&d.cuMemAlloc, "cuMemAlloc_v2")
		s.fn(&d.cuMemFree, "cuMemFree_v2")
		s.fn(&d.cuMemGetInfo, "cuMemGetInfo_v2")
		s.fn(&d.cuMemAllocHost, "cuMemAllocHost_v2")
		s.fn(&d.cuMemFreeHost, "cuMemFreeHost")
		s.fn(&d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2")
		s.fn(&d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")
		s.fn(&d.cuModuleLoadDataEx, "cuModuleLoadDataEx")
		s.fn(&d.cuModuleUnload, "cuModuleUnload")
		s.fn(&d.cuModuleGetFunction, "cuModuleGetFunction")
		s.fn(&d.cuFuncSetAttribute, "cuFuncSetAttribute")
		s.fn(&d.cuEventCreate, "cuEventCreate")
		s.fn(&d.cuEventSynchronize, "cuEventSynchronize")
		s.fn(&d.cuEventElapsedTime, "cuEventElapsedTime")
		s.fn(&d.cuEventDestroy, "cuEventDestroy_v2")
		s.fn(&d.cuGetErrorName, "cuGetErrorName")
		d.cuCtxSetCurrent = s.addr("cuCtxSetCurrent")
		d.cuStreamSynchronize = s.addr("cuStreamSynchronize")
		d.cuMemcpyDtoDAsync = s.addr("cuMemcpyDtoDAsync_v2")
		d.cuMemsetD8Async = s.addr("cuMemsetD8Async")
		d.cuLaunchKernel = s.addr("cuLaunchKernel")
		d.cuEventRecord = s.addr("cuEventRecord")
		if err := s.err(); err != nil {
			return nil, err
		}
		return d, nil
	})
}

// call runs a driver function by address with integer arguments.
func call(fn uintptr, args ...uintptr) int32 {
	r, _, _ := purego.SyscallN(fn, args...)
	return int32(r)
}

// check turns a CUresult into an *Error (nil for CUDA_SUCCESS).
func (d *driverAPI) check(op string, code int32) error {
	if code == 0 {
		return nil
	}
	e := &Error{Op: op, Code: int(code)}
	var name *byte
	if d.cuGetErrorName(code, &name) == 0 && name != nil {
		e.Name = goString(name)
	}
	return e
}

// goString copies a NUL-terminated C string.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// cString returns s as a NUL-terminated byte slice.
func cString(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}
