package cuda

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// Ptr is a device address (CUdeviceptr).
type Ptr uintptr

// Options configure Open.
type Options struct {
	// MemoryFraction caps the bytes the caching allocator reserves from the
	// driver at this fraction of the device's memory; 0 means 0.9.
	MemoryFraction float64
	// OnPressure, when set, is called (without allocator locks held) when an
	// allocation fails, before the cache is released and the allocation
	// retried: the tensor layer runs the garbage collector there so that
	// finalizers Free unreachable buffers.
	OnPressure func()
	// BLASWorkspace is the bytes of the cuBLAS workspace; 0 means 32 MiB
	// (what cuBLAS recommends on Hopper).
	BLASWorkspace int64
}

// Device is an opened GPU: its primary context, one non-blocking stream on
// which all work is issued in order, a caching allocator and a cuBLAS handle
// bound to the stream. Its methods are safe for concurrent use.
type Device struct {
	api     *driverAPI
	ordinal int
	dev     int32
	ctx     uintptr
	stream  uintptr
	name    string
	major   int
	minor   int
	total   int64
	driver  int

	alloc *cachingAllocator

	// mu serializes submissions to the stream and guards the launch buffer
	// and the cuBLAS handle.
	mu     sync.Mutex
	launch *launchBuffer // in page-locked host memory from cuMemAllocHost
	// staging is CopyHtoDStaged's ring, made on its first use.
	staging *stagingRing
	blas    *blasHandle
	// lt is the cuBLASLt handle (blaslt.go), made at the first LtMatmul
	// with a workspace of ltWorkspace bytes; ltErr, why it could not be.
	lt          *ltHandle
	ltErr       error
	ltWorkspace int64
	closed      bool
}

// DeviceCount returns the number of GPUs the driver sees (after
// CUDA_VISIBLE_DEVICES), or the error that says why there is no driver or
// no GPU.
func DeviceCount() (int, error) {
	api, err := loadDriver()
	if err != nil {
		return 0, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if code := api.cuInit(0); code != 0 {
		err := api.check("cuInit", code)
		if code == errorNoDevice {
			return 0, fmt.Errorf("cuda: the NVIDIA driver (%s) sees no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES): %w", api.path, err)
		}
		return 0, fmt.Errorf("%w (driver library %s)", err, api.path)
	}
	var count int32
	if err := api.check("cuDeviceGetCount", api.cuDeviceGetCount(&count)); err != nil {
		return 0, err
	}
	return int(count), nil
}

// Open opens GPU number ordinal (0-based, as CUDA counts them).
func Open(ordinal int, opts Options) (*Device, error) {
	if opts.MemoryFraction < 0 || opts.MemoryFraction > 1 {
		return nil, fmt.Errorf("cuda: memory fraction %g: want a value in (0, 1], or 0 for the default 0.9", opts.MemoryFraction)
	}
	api, err := loadDriver()
	if err != nil {
		return nil, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if code := api.cuInit(0); code != 0 {
		err := api.check("cuInit", code)
		if code == errorNoDevice {
			return nil, fmt.Errorf("cuda: the NVIDIA driver (%s) sees no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES): %w", api.path, err)
		}
		return nil, fmt.Errorf("%w (driver library %s)", err, api.path)
	}
	d := &Device{api: api, ordinal: ordinal}
	var v, count int32
	if err := api.check("cuDriverGetVersion", api.cuDriverGetVersion(&v)); err != nil {
		return nil, err
	}
	d.driver = int(v)
	if err := api.check("cuDeviceGetCount", api.cuDeviceGetCount(&count)); err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= int(count) {
		return nil, fmt.Errorf("cuda: no GPU number %d: the driver sees %d GPU(s), numbered from 0", ordinal, count)
	}
	if err := api.check("cuDeviceGet", api.cuDeviceGet(&d.dev, int32(ordinal))); err != nil {
		return nil, err
	}
	name := make([]byte, 256)
	if err := api.check("cuDeviceGetName", api.cuDeviceGetName(&name[0], int32(len(name)), d.dev)); err != nil {
		return nil, err
	}
	d.name = goString(&name[0])
	var major, minor int32
	if err := api.check("cuDeviceGetAttribute(compute capability major)", api.cuDeviceGetAttribute(&major, attrComputeCapabilityMajor, d.dev)); err != nil {
		return nil, err
	}
	if err := api.check("cuDeviceGetAttribute(compute capability minor)", api.cuDeviceGetAttribute(&minor, attrComputeCapabilityMinor, d.dev)); err != nil {
		return nil, err
	}
	d.major, d.minor = int(major), int(minor)
	var total uint64
	if err := api.check("cuDeviceTotalMem_v2", api.cuDeviceTotalMem(&total, d.dev)); err != nil {
		return nil, err
	}
	d.total = int64(total)
	if err := api.check("cuDevicePrimaryCtxRetain", api.cuDevicePrimaryCtxRetain(&d.ctx, d.dev)); err != nil {
		return nil, err
	}
	if err := api.check("cuCtxSetCurrent", call(api.cuCtxSetCurrent, d.ctx)); err != nil {
		api.cuDevicePrimaryCtxRelease(d.dev)
		return nil, err
	}
	if err := api.check("cuStreamCreate", api.cuStreamCreate(&d.stream, streamNonBlocking)); err != nil {
		api.cuDevicePrimaryCtxRelease(d.dev)
		return nil, err
	}
	fraction := opts.MemoryFraction
	if fraction == 0 {
		fraction = 0.9
	}
	d.alloc = newCachingAllocator(deviceMemory{d}, int64(fraction*float64(d.total)), d.total, opts.OnPressure)
	// The launch buffer lives in C memory, so that the driver may hold
	// pointers into it without any Go pinning rules (a runtime.Pinner held
	// by the Device would panic at garbage collection if the Device were
	// dropped without Close).
	var host unsafe.Pointer
	if err := api.check("cuMemAllocHost_v2", api.cuMemAllocHost(&host, uint64(unsafe.Sizeof(launchBuffer{})))); err != nil {
		api.cuStreamDestroy(d.stream)
		api.cuDevicePrimaryCtxRelease(d.dev)
		return nil, err
	}
	d.launch = (*launchBuffer)(host)
	*d.launch = launchBuffer{}
	for i := range d.launch.ptrs {
		d.launch.ptrs[i] = uintptr(unsafe.Pointer(&d.launch.vals[i]))
	}

	workspace := opts.BLASWorkspace
	if workspace == 0 {
		workspace = 32 << 20
	}
	d.ltWorkspace = workspace
	if d.blas, err = d.newBLAS(workspace); err != nil {
		d.closeLocked()
		return nil, err
	}
	return d, nil
}

// Close releases the cuBLAS handle, the cache, the stream and the context.
// Blocks still allocated are not freed (the driver frees them when the
// process ends). The Device must not be used after Close.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	return d.closeLocked()
}

func (d *Device) closeLocked() error {
	d.closed = true
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var errs []error
	call(d.api.cuCtxSetCurrent, d.ctx)
	if err := d.api.check("cuStreamSynchronize", call(d.api.cuStreamSynchronize, d.stream)); err != nil {
		errs = append(errs, err)
	}
	if d.blas != nil {
		if err := d.blas.destroy(); err != nil {
			errs = append(errs, err)
		}
		d.alloc.Free(d.blas.workspace)
	}
	if d.lt != nil {
		if err := d.lt.destroy(); err != nil {
			errs = append(errs, err)
		}
		d.alloc.Free(d.lt.workspace)
		d.lt = nil
	}
	if err := d.alloc.EmptyCache(); err != nil {
		errs = append(errs, err)
	}
	if err := d.api.check("cuStreamDestroy_v2", d.api.cuStreamDestroy(d.stream)); err != nil {
		errs = append(errs, err)
	}
	if err := d.api.check("cuMemFreeHost", d.api.cuMemFreeHost(unsafe.Pointer(d.launch))); err != nil {
		errs = append(errs, err)
	}
	d.launch = nil
	if d.staging != nil {
		if err := d.freeStaging(d.staging); err != nil {
			errs = append(errs, err)
		}
		d.staging = nil
	}
	// Last: releasing the primary context's last reference destroys it.
	if err := d.api.check("cuDevicePrimaryCtxRelease_v2", d.api.cuDevicePrimaryCtxRelease(d.dev)); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// Name is the GPU's name, e.g. "NVIDIA H100 80GB HBM3".
func (d *Device) Name() string { return d.name }

// Ordinal is the GPU number Open was given.
func (d *Device) Ordinal() int { return d.ordinal }

// ComputeCapability is the GPU's SM version, e.g. 9, 0 for Hopper.
func (d *Device) ComputeCapability() (major, minor int) { return d.major, d.minor }

// TotalMemory is the GPU's memory in bytes.
func (d *Device) TotalMemory() int64 { return d.total }

// DriverVersion is cuDriverGetVersion's number, e.g. 13000 for CUDA 13.0.
func (d *Device) DriverVersion() int { return d.driver }

// String describes the device in one line.
func (d *Device) String() string {
	return fmt.Sprintf("cuda:%d %s (sm_%d%d, %s, driver CUDA %d.%d)", d.ordinal, d.name, d.major, d.minor,
		human(d.total), d.driver/1000, d.driver%1000/10)
}

// enter locks the calling goroutine to its OS thread and makes the Device's
// context current on that thread; leave undoes the lock. Every method that
// calls the driver brackets its calls with them: a CUDA context is current
// per OS thread, and the Go scheduler moves goroutines between threads.
func (d *Device) enter() error {
	runtime.LockOSThread()
	if r := call(d.api.cuCtxSetCurrent, d.ctx); r != 0 {
		runtime.UnlockOSThread()
		return d.api.check("cuCtxSetCurrent", r)
	}
	return nil
}

func (d *Device) leave() { runtime.UnlockOSThread() }

// deviceMemory is the raw allocator under the cache: cuMemAlloc/cuMemFree.
type deviceMemory struct{ d *Device }

func (m deviceMemory) alloc(n int64) (Ptr, error) {
	d := m.d
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.leave()
	var p uintptr
	if err := d.api.check("cuMemAlloc_v2", d.api.cuMemAlloc(&p, uint64(n))); err != nil {
		return 0, err
	}
	return Ptr(p), nil
}

// free waits for the stream first: a cached block may still be read or
// written by work queued before it was freed.
func (m deviceMemory) free(p Ptr) error {
	d := m.d
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	if err := d.api.check("cuStreamSynchronize", call(d.api.cuStreamSynchronize, d.stream)); err != nil {
		return err
	}
	return d.api.check("cuMemFree_v2", d.api.cuMemFree(uintptr(p)))
}

// Alloc returns a device block of at least n bytes, 256-byte aligned, from
// the caching allocator. Its contents are undefined (use Memset to zero).
// A zero-size request returns a valid minimal block.
func (d *Device) Alloc(n int64) (Ptr, error) { return d.alloc.Alloc(n) }

// Free returns a block to the cache. It does not call the driver, so it may
// be called from any goroutine, finalizers included. Work already queued on
// the stream that uses the block stays correct: the block is only reused by
// work queued later on the same stream.
func (d *Device) Free(p Ptr) { d.alloc.Free(p) }

// EmptyCache returns the cached (freed) blocks to the driver.
func (d *Device) EmptyCache() error { return d.alloc.EmptyCache() }

// MemStats returns the allocator's counters.
func (d *Device) MemStats() MemStats { return d.alloc.Stats() }

// ResetPeak sets MemStats().Peak to the bytes now in use.
func (d *Device) ResetPeak() { d.alloc.ResetPeak() }

// MemInfo is the driver's free and total device memory (cuMemGetInfo),
// which counts this process's cache as used.
func (d *Device) MemInfo() (free, total int64, err error) {
	if err := d.enter(); err != nil {
		return 0, 0, err
	}
	defer d.leave()
	var f, t uint64
	err = d.api.check("cuMemGetInfo_v2", d.api.cuMemGetInfo(&f, &t))
	return int64(f), int64(t), err
}

// CopyHtoD copies n bytes from host memory (Go memory is fine) to the
// device. It is ordered on the stream after earlier work and returns when
// the copy is done, so src may be reused at once. (cuMemcpyHtoDAsync
// followed by a stream synchronization; from pageable memory the driver
// stages the copy itself.)
func (d *Device) CopyHtoD(dst Ptr, src unsafe.Pointer, n int64) error {
	if n == 0 {
		return nil
	}
	if n < 0 || src == nil || dst == 0 {
		return fmt.Errorf("cuda: CopyHtoD of %d bytes to %#x from %p: want a positive size and non-nil addresses", n, uintptr(dst), src)
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	d.mu.Lock()
	err := d.api.check("cuMemcpyHtoDAsync_v2", d.api.cuMemcpyHtoDAsync(uintptr(dst), src, uint64(n), d.stream))
	d.mu.Unlock()
	if err != nil {
		return err
	}
	err = d.api.check("cuStreamSynchronize", call(d.api.cuStreamSynchronize, d.stream))
	runtime.KeepAlive(src) // the driver may read src until the stream is synchronized
	return err
}

// CopyDtoH copies n bytes from the device to host memory, after all work
// queued earlier on the stream, and returns when the bytes are in dst.
func (d *Device) CopyDtoH(dst unsafe.Pointer, src Ptr, n int64) error {
	if n == 0 {
		return nil
	}
	if n < 0 || dst == nil || src == 0 {
		return fmt.Errorf("cuda: CopyDtoH of %d bytes from %#x to %p: want a positive size and non-nil addresses", n, uintptr(src), dst)
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	d.mu.Lock()
	err := d.api.check("cuMemcpyDtoHAsync_v2", d.api.cuMemcpyDtoHAsync(dst, uintptr(src), uint64(n), d.stream))
	d.mu.Unlock()
	if err != nil {
		return err
	}
	err = d.api.check("cuStreamSynchronize", call(d.api.cuStreamSynchronize, d.stream))
	runtime.KeepAlive(dst) // the driver may write dst until the stream is synchronized
	return err
}

// CopyDtoD queues a copy of n bytes between device blocks on the stream
// and returns without waiting.
func (d *Device) CopyDtoD(dst, src Ptr, n int64) error {
	if n == 0 {
		return nil
	}
	if n < 0 || dst == 0 || src == 0 {
		return fmt.Errorf("cuda: CopyDtoD of %d bytes from %#x to %#x: want a positive size and non-nil addresses", n, uintptr(src), uintptr(dst))
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	d.mu.Lock()
	r := call(d.api.cuMemcpyDtoDAsync, uintptr(dst), uintptr(src), uintptr(n), d.stream)
	d.mu.Unlock()
	return d.api.check("cuMemcpyDtoDAsync_v2", r)
}

// Memset queues the zeroing of n bytes at dst on the stream.
func (d *Device) Memset(dst Ptr, n int64) error {
	if n == 0 {
		return nil
	}
	if n < 0 || dst == 0 {
		return fmt.Errorf("cuda: Memset of %d bytes at %#x: want a positive size and a non-nil address", n, uintptr(dst))
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	d.mu.Lock()
	r := call(d.api.cuMemsetD8Async, uintptr(dst), 0, uintptr(n), d.stream)
	d.mu.Unlock()
	return d.api.check("cuMemsetD8Async", r)
}

// Synchronize waits until all work queued on the stream is done, and
// reports errors of asynchronous work (a faulting kernel, for one).
func (d *Device) Synchronize() error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	return d.api.check("cuStreamSynchronize", call(d.api.cuStreamSynchronize, d.stream))
}
