// Package tensor holds gotron's dense tensors and eager reverse-mode autograd.
//
// A Tensor is a row-major view (shape, strides, offset) of typed storage.
// Float32 is the compute type; BFloat16/Float16 are storage types; Int32 and
// Int64 hold ids. Ops are methods of a *Tape: when the tape is non-nil and an
// input requires gradients, the op records a backward step onto it, and
// Tape.Backward replays them in reverse. A nil *Tape is the no-grad mode: the
// same calls compute without recording. Each goroutine (each rank of an
// in-process world) owns its tape, so there is no global grad mode.
//
// Every tensor lives on a Device (sim.go): CPU; Sim, a simulated device
// whose storage the host may not read, which proves the seam without a GPU;
// or CUDA, an NVIDIA GPU (cuda.go). An op runs on its inputs' device (mixing
// devices panics) and reaches the kernels through that device's Backend
// (backend.go); outside this package only internal/... and cmd/gotron's
// benchmarks import internal/cpu (TestCPUKernelImportBoundary).
package tensor

import (
	"fmt"
	"strings"
)

// Tensor is an n-dimensional row-major view of storage.
type Tensor struct {
	shape   []int
	strides []int
	offset  int
	dtype   DType
	dev     Device
	f32     []float32
	u16     []uint16
	i32     []int32
	i64     []int64
	// dbuf is the storage of a tensor on the CUDA device (the host slices
	// above are nil there).
	dbuf *devBuf

	// requiresGrad marks parameters and values computed from them on a tape.
	requiresGrad bool
	// Grad accumulates this tensor's gradient when it is a parameter (leaf
	// with requiresGrad); Backward adds into it. Nil until first needed.
	Grad *Tensor
	// Name is an optional label (parameter path) used in errors.
	Name string
	// leaf is true for tensors not produced by a recorded op.
	leaf bool
	// base is the tensor a strided view (Transpose, Narrow) looks into; its
	// gradient flows there.
	base *Tensor
	// bf16 is a parameter's bfloat16 copy for products under MatmulBF16
	// (NewBF16Weights; nil when not registered).
	bf16 *bf16Copy
}

// New returns a zeroed contiguous tensor of the given dtype and shape.
func New(dtype DType, shape ...int) *Tensor {
	n := numel(shape)
	t := &Tensor{shape: append([]int(nil), shape...), dtype: dtype, leaf: true}
	t.strides = contiguousStrides(t.shape)
	switch dtype {
	case Float32:
		t.f32 = make([]float32, n)
	case BFloat16, Float16:
		t.u16 = make([]uint16, n)
	case Int32:
		t.i32 = make([]int32, n)
	case Int64:
		t.i64 = make([]int64, n)
	default:
		panic(fmt.Sprintf("tensor: unknown dtype %v", dtype))
	}
	return t
}

// Zeros returns a zeroed float32 tensor.
func Zeros(shape ...int) *Tensor { return New(Float32, shape...) }

// FromFloat32 wraps data (not copied) as a float32 tensor of the given shape.
func FromFloat32(data []float32, shape ...int) *Tensor {
	mustNumel(len(data), shape)
	return &Tensor{shape: append([]int(nil), shape...), strides: contiguousStrides(shape), dtype: Float32, f32: data, leaf: true}
}

// FromInt32 wraps data (not copied) as an int32 tensor of the given shape.
func FromInt32(data []int32, shape ...int) *Tensor {
	mustNumel(len(data), shape)
	return &Tensor{shape: append([]int(nil), shape...), strides: contiguousStrides(shape), dtype: Int32, i32: data, leaf: true}
}

func mustNumel(n int, shape []int) {
	if numel(shape) != n {
		panic(fmt.Sprintf("tensor: %d elements do not fill shape %v", n, shape))
	}
}

func numel(shape []int) int {
	n := 1
	for _, s := range shape {
		if s < 0 {
			panic(fmt.Sprintf("tensor: negative dimension in shape %v", shape))
		}
		n *= s
	}
	return n
}

func contiguousStrides(shape []int) []int {
	st := make([]int, len(shape))
	s := 1
	for i := len(shape) - 1; i >= 0; i-- {
		st[i] = s
		s *= shape[i]
	}
	return st
}

// Shape returns the tensor's shape (do not modify).
func (t *Tensor) Shape() []int { return t.shape }

// Dim returns the size of dimension i (negative counts from the end).
func (t *Tensor) Dim(i int) int {
	if i < 0 {
		i += len(t.shape)
	}
	return t.shape[i]
}

// NDim returns the number of dimensions.
func (t *Tensor) NDim() int { return len(t.shape) }

// Numel returns the number of elements.
func (t *Tensor) Numel() int { return numel(t.shape) }

// DType returns the element type.
func (t *Tensor) DType() DType { return t.dtype }

// RequiresGrad reports whether gradients flow to or through t.
func (t *Tensor) RequiresGrad() bool { return t.requiresGrad }

// SetRequiresGrad marks a leaf (a parameter) as needing a gradient.
func (t *Tensor) SetRequiresGrad(v bool) *Tensor {
	if !t.leaf {
		panic("tensor: SetRequiresGrad on a non-leaf tensor " + t.Name)
	}
	t.requiresGrad = v
	return t
}

// IsContiguous reports whether t's elements are dense in row-major order.
func (t *Tensor) IsContiguous() bool {
	s := 1
	for i := len(t.shape) - 1; i >= 0; i-- {
		if t.shape[i] != 1 && t.strides[i] != s {
			return false
		}
		s *= t.shape[i]
	}
	return true
}

// Float32s returns the float32 elements of a contiguous float32 tensor
// (aliasing its storage). It is host access: t must be on the CPU.
func (t *Tensor) Float32s() []float32 {
	t.mustHost("Float32s")
	return t.f32s()
}

// f32s is Float32s for package tensor's own code, on any device whose
// storage is host memory (the CPU's and the simulated device's).
func (t *Tensor) f32s() []float32 {
	t.hostMemory("Float32s")
	if t.dtype != Float32 {
		panic(fmt.Sprintf("tensor: Float32s on %v tensor %s", t.dtype, t.Name))
	}
	if !t.IsContiguous() {
		panic("tensor: Float32s on a non-contiguous view; call Contiguous first")
	}
	return t.f32[t.offset : t.offset+t.Numel()]
}

// Int32s returns the elements of a contiguous int32 tensor (aliasing). It
// is host access: t must be on the CPU.
func (t *Tensor) Int32s() []int32 {
	t.mustHost("Int32s")
	return t.i32s()
}

func (t *Tensor) i32s() []int32 {
	t.hostMemory("Int32s")
	if t.dtype != Int32 || !t.IsContiguous() {
		panic(fmt.Sprintf("tensor: Int32s on %v (contiguous=%v) tensor", t.dtype, t.IsContiguous()))
	}
	return t.i32[t.offset : t.offset+t.Numel()]
}

// Int64s returns the elements of a contiguous int64 tensor (aliasing). It
// is host access: t must be on the CPU.
func (t *Tensor) Int64s() []int64 {
	t.mustHost("Int64s")
	return t.i64s()
}

func (t *Tensor) i64s() []int64 {
	t.hostMemory("Int64s")
	if t.dtype != Int64 || !t.IsContiguous() {
		panic(fmt.Sprintf("tensor: Int64s on %v (contiguous=%v) tensor", t.dtype, t.IsContiguous()))
	}
	return t.i64[t.offset : t.offset+t.Numel()]
}

// Uint16s returns the raw bits of a contiguous bfloat16/float16 tensor. It
// is host access: t must be on the CPU.
func (t *Tensor) Uint16s() []uint16 {
	t.mustHost("Uint16s")
	return t.u16s()
}

func (t *Tensor) u16s() []uint16 {
	t.hostMemory("Uint16s")
	if (t.dtype != BFloat16 && t.dtype != Float16) || !t.IsContiguous() {
		panic(fmt.Sprintf("tensor: Uint16s on %v tensor", t.dtype))
	}
	return t.u16[t.offset : t.offset+t.Numel()]
}

// hostMemory panics when t's storage is not host memory: package tensor's
// own loops over storage (f32s, ...) run on the CPU and the simulated
// device only; on the GPU the work belongs to the backend.
func (t *Tensor) hostMemory(op string) {
	if t.dbuf != nil {
		panic(fmt.Sprintf("tensor: %s of %s: its storage is CUDA device memory (a host loop reached a GPU tensor; the work belongs to the backend)", op, t))
	}
}

// At returns the element at the given index as float64 (any dtype). It is
// host access: t must be on the CPU.
func (t *Tensor) At(idx ...int) float64 {
	t.mustHost("At")
	if len(idx) != len(t.shape) {
		panic(fmt.Sprintf("tensor: At with %d indices on shape %v", len(idx), t.shape))
	}
	off := t.offset
	for i, x := range idx {
		if x < 0 || x >= t.shape[i] {
			panic(fmt.Sprintf("tensor: index %v out of range for shape %v", idx, t.shape))
		}
		off += x * t.strides[i]
	}
	switch t.dtype {
	case Float32:
		return float64(t.f32[off])
	case BFloat16:
		return float64(BFloat16ToFloat32(t.u16[off]))
	case Float16:
		return float64(Float16ToFloat32(t.u16[off]))
	case Int32:
		return float64(t.i32[off])
	default:
		return float64(t.i64[off])
	}
}

// String summarises the tensor (shape and dtype).
func (t *Tensor) String() string {
	var b strings.Builder
	if t.Name != "" {
		b.WriteString(t.Name + " ")
	}
	fmt.Fprintf(&b, "%v%v", t.dtype, t.shape)
	return b.String()
}

// SameShape reports whether a and b have equal shapes.
func SameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Contiguous returns t if it is contiguous, else a dense copy (no autograd:
// use Tape.Contiguous inside a graph).
func (t *Tensor) Contiguous() *Tensor {
	if t.IsContiguous() {
		return t
	}
	out := emptyOn(t.dev, t.dtype, t.shape...)
	backendFor(t).CopyStrided(out, t)
	return out
}

// view returns a tensor sharing t's storage with a new geometry.
func (t *Tensor) view(shape, strides []int, offset int) *Tensor {
	return &Tensor{shape: shape, strides: strides, offset: offset, dtype: t.dtype, dev: t.dev,
		f32: t.f32, u16: t.u16, i32: t.i32, i64: t.i64, dbuf: t.dbuf, leaf: true}
}

// shareStorage makes src's storage (on any device) t's, leaving t's
// geometry alone.
func (t *Tensor) shareStorage(src *Tensor) {
	t.f32, t.u16, t.i32, t.i64, t.dbuf = src.f32, src.u16, src.i32, src.i64, src.dbuf
}

// Clone returns a dense copy of t with no autograd history.
func (t *Tensor) Clone() *Tensor {
	out := emptyOn(t.dev, t.dtype, t.shape...)
	out.Name = t.Name
	backendFor(t).CopyStrided(out, t)
	return out
}

// To converts t to dtype (float32 ↔ bfloat16/float16 with round-to-nearest-
// even; ints ↔ float32 by value). No autograd.
func (t *Tensor) To(dtype DType) *Tensor {
	src := t.Contiguous()
	if dtype == t.dtype {
		return src.Clone()
	}
	out := emptyOn(t.dev, dtype, t.shape...)
	backendFor(src).Convert(out, src)
	return out
}

// Reshape returns a view of contiguous t with a new shape (one -1 is
// inferred), without autograd: for data such as ids and masks. Use
// Tape.Reshape for values in a graph.
func (t *Tensor) Reshape(shape ...int) *Tensor {
	if !t.IsContiguous() {
		panic("tensor: Reshape of a non-contiguous view; call Contiguous first")
	}
	shape = inferShape(t.Numel(), shape)
	return t.view(shape, contiguousStrides(shape), t.offset)
}

// MoveTo copies a contiguous float32 leaf tensor's values into buf (exactly
// Numel elements) and makes buf its storage, so that many parameters can live
// in one flat buffer that a collective updates at once (the distributed
// optimizer's parameter all-gather). Views taken of t before the move keep
// the old storage.
func (t *Tensor) MoveTo(buf []float32) error {
	switch {
	case t.dtype != Float32 || !t.leaf || !t.IsContiguous():
		return fmt.Errorf("tensor: MoveTo %s: want a contiguous float32 leaf tensor", t.Name)
	case t.dev != CPU:
		return fmt.Errorf("tensor: MoveTo %s: the tensor is on the %v device and buf is host memory", t.Name, t.dev)
	case len(buf) != t.Numel():
		return fmt.Errorf("tensor: MoveTo %s: buffer of %d values for %v (%d)", t.Name, len(buf), t.shape, t.Numel())
	}
	copy(buf, t.f32s())
	t.f32, t.offset = buf, 0
	return nil
}
