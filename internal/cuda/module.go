package cuda

import (
	"bytes"
	"fmt"
	"math"
	"runtime"
	"strings"
	"unsafe"
)

// Dim3 is a grid or block shape; zero fields count as 1.
type Dim3 struct{ X, Y, Z uint32 }

func (d Dim3) norm() Dim3 {
	return Dim3{max(d.X, 1), max(d.Y, 1), max(d.Z, 1)}
}

// Module is a loaded PTX module.
type Module struct {
	d   *Device
	mod uintptr
}

// Function is a kernel of a Module.
type Function struct {
	d         *Device
	fn        uintptr
	name      string
	maxShared uint32 // dynamic shared memory already allowed (guarded by Device.mu)
}

// Name is the kernel's name.
func (f *Function) Name() string { return f.name }

// LoadModule JIT-compiles PTX text for the device (cuModuleLoadDataEx). On
// a compile error the error carries the JIT's log.
func (d *Device) LoadModule(ptx []byte) (*Module, error) {
	if len(ptx) == 0 {
		return nil, fmt.Errorf("cuda: LoadModule: empty PTX")
	}
	image := ptx
	if image[len(image)-1] != 0 {
		image = append(bytes.Clone(ptx), 0)
	}
	const logSize = 16 << 10
	errLog := make([]byte, logSize)
	opts := []int32{jitErrorLogBuffer, jitErrorLogBufferSize}
	vals := []uintptr{uintptr(unsafe.Pointer(&errLog[0])), logSize}
	var pin runtime.Pinner
	pin.Pin(&errLog[0])
	defer pin.Unpin()

	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.leave()
	var mod uintptr
	r := d.api.cuModuleLoadDataEx(&mod, &image[0], uint32(len(opts)), &opts[0], &vals[0])
	runtime.KeepAlive(errLog)
	if err := d.api.check("cuModuleLoadDataEx", r); err != nil {
		log := errLog
		if i := bytes.IndexByte(log, 0); i >= 0 {
			log = log[:i]
		}
		msg := strings.TrimSpace(string(log))
		if msg == "" {
			return nil, fmt.Errorf("%w (PTX %s)", err, ptxTarget(ptx))
		}
		return nil, fmt.Errorf("%w (PTX %s); JIT log:\n%s", err, ptxTarget(ptx), msg)
	}
	return &Module{d: d, mod: mod}, nil
}

// ptxTarget returns the ".target" line of PTX text, to say what was loaded.
func ptxTarget(ptx []byte) string {
	for _, line := range strings.SplitN(string(ptx[:min(len(ptx), 4096)]), "\n", 64) {
		if t, ok := strings.CutPrefix(strings.TrimSpace(line), ".target"); ok {
			return "for " + strings.TrimSpace(t)
		}
	}
	return "without a .target line"
}

// Function looks up a kernel by its (extern "C") name.
func (m *Module) Function(name string) (*Function, error) {
	d := m.d
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.leave()
	var fn uintptr
	cname := cString(name)
	if err := d.api.check("cuModuleGetFunction", d.api.cuModuleGetFunction(&fn, m.mod, &cname[0])); err != nil {
		return nil, fmt.Errorf("kernel %q: %w", name, err)
	}
	return &Function{d: d, fn: fn, name: name, maxShared: defaultSharedLimit}, nil
}

// Unload unloads the module; its Functions must not be launched afterwards.
func (m *Module) Unload() error {
	d := m.d
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	return d.api.check("cuModuleUnload", d.api.cuModuleUnload(m.mod))
}

// maxLaunchArgs bounds the kernel parameters Launch accepts.
const maxLaunchArgs = 64

// launchBuffer holds the copies of a launch's arguments and the array of
// pointers to them that cuLaunchKernel reads. One per Device, in C memory
// for the Device's life and reused under Device.mu, so Launch does not
// allocate. It holds no Go pointers.
type launchBuffer struct {
	vals        [maxLaunchArgs]uint64
	ptrs        [maxLaunchArgs]uintptr // &vals[i]
	alpha, beta float32                // GEMM scalars, read by cuBLAS from host memory
}

// marshalArgs stores each argument's bytes little-endian in vals (4-byte
// kinds in the low half of the slot, which is what the kernel reads).
func marshalArgs(vals []uint64, args []any) error {
	if len(args) > len(vals) {
		return fmt.Errorf("%d kernel arguments: at most %d are supported", len(args), len(vals))
	}
	for i, a := range args {
		switch v := a.(type) {
		case Ptr:
			vals[i] = uint64(v)
		case uintptr:
			vals[i] = uint64(v)
		case int32:
			vals[i] = uint64(uint32(v))
		case uint32:
			vals[i] = uint64(v)
		case int64:
			vals[i] = uint64(v)
		case uint64:
			vals[i] = v
		case float32:
			vals[i] = uint64(math.Float32bits(v))
		case float64:
			vals[i] = math.Float64bits(v)
		default:
			return fmt.Errorf("kernel argument %d has type %T: want cuda.Ptr, uintptr, int32, uint32, int64, uint64, float32 or float64", i, a)
		}
	}
	return nil
}

// Launch queues kernel f on the stream with the given grid and block shapes,
// dynamic shared memory bytes and arguments (cuda.Ptr, uintptr, int32,
// uint32, int64, uint64, float32, float64: each must match the kernel's
// parameter type in size). It returns without waiting for the kernel;
// errors of the kernel itself show at a later Synchronize or copy.
func (d *Device) Launch(f *Function, grid, block Dim3, shmem uint32, args ...any) error {
	grid, block = grid.norm(), block.norm()
	if f.d != d {
		return fmt.Errorf("cuda: kernel %s belongs to %v, not %v", f.name, f.d, d)
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.leave()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("cuda: launching %s: %v is closed", f.name, d)
	}
	if err := marshalArgs(d.launch.vals[:], args); err != nil {
		return fmt.Errorf("cuda: launching %s: %w", f.name, err)
	}
	if shmem > f.maxShared {
		if err := d.api.check("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", d.api.cuFuncSetAttribute(f.fn, funcAttrMaxDynamicShared, int32(shmem))); err != nil {
			return fmt.Errorf("kernel %s with %d bytes of dynamic shared memory: %w", f.name, shmem, err)
		}
		f.maxShared = shmem
	}
	r := call(d.api.cuLaunchKernel, f.fn,
		uintptr(grid.X), uintptr(grid.Y), uintptr(grid.Z),
		uintptr(block.X), uintptr(block.Y), uintptr(block.Z),
		uintptr(shmem), d.stream, uintptr(unsafe.Pointer(&d.launch.ptrs[0])), 0)
	if r != 0 {
		return fmt.Errorf("kernel %s (grid %d×%d×%d, block %d×%d×%d, %d B shared): %w",
			f.name, grid.X, grid.Y, grid.Z, block.X, block.Y, block.Z, shmem, d.api.check("cuLaunchKernel", r))
	}
	return nil
}
