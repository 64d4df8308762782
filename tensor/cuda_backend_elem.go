package tensor

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/internal/half"
)

// The CUDA backend's elementwise ops, fills, conversions and strided
// copies: internal/cuda/kernels' elem.cu and copy.cu. Each kernel follows
// the CPU backend's loop (cpu_backend.go, cpu_backend_tape.go); element
// counts go to the kernels as int64.

func (be cudaBackend) Add(out, a, b *Tensor) {
	n, nb := a.Numel(), b.Numel()
	if nb == 0 {
		return
	}
	n -= n % nb // the CPU adds whole repeats of b only
	be.launch1D("elem_add_f32", n, be.ptr(out), be.ptr(a), be.ptr(b), int64(n), int64(nb))
}

func (be cudaBackend) Mul(out, a, b *Tensor) {
	n, nb := a.Numel(), b.Numel()
	if nb == 0 {
		return
	}
	n -= n % nb
	be.launch1D("elem_mul_f32", n, be.ptr(out), be.ptr(a), be.ptr(b), int64(n), int64(nb))
}

func (be cudaBackend) Axpy(y *Tensor, alpha float32, x *Tensor) {
	n := x.Numel()
	be.launch1D("elem_axpy_f32", n, be.ptr(y), alpha, be.ptr(x), int64(n))
}

func (be cudaBackend) Scale(out *Tensor, alpha float32, x *Tensor) {
	n := x.Numel()
	be.launch1D("elem_scale_f32", n, be.ptr(out), alpha, be.ptr(x), int64(n))
}

// Fill converts v to t's dtype here, as the CPU does (so -0, rounding and
// int conversion come out the same), and fills with the bit pattern.
func (be cudaBackend) Fill(t *Tensor, v float32) {
	n := t.Numel()
	switch t.dtype {
	case Float32:
		be.launch1D("elem_fill_u32", n, be.ptr(t), math.Float32bits(v), int64(n))
	case BFloat16:
		be.launch1D("elem_fill_u16", n, be.ptr(t), uint32(half.BFloat16From(v)), int64(n))
	case Float16:
		be.launch1D("elem_fill_u16", n, be.ptr(t), uint32(half.Float16From(v)), int64(n))
	case Int32:
		be.launch1D("elem_fill_u32", n, be.ptr(t), uint32(int32(v)), int64(n))
	case Int64:
		be.launch1D("elem_fill_u64", n, be.ptr(t), uint64(int64(v)), int64(n))
	default:
		panic(fmt.Sprintf("tensor: Fill on the cuda backend: unknown dtype %v", t.dtype))
	}
}

// Convert: the kernel takes the tensor.DType codes of both sides.
func (be cudaBackend) Convert(dst, src *Tensor) {
	n := src.Numel()
	be.launch1D("elem_convert", n, be.ptr(dst), int32(dst.dtype), be.ptr(src), int32(src.dtype), int64(n))
}

func (be cudaBackend) GELUForward(out, x *Tensor, tanh bool) {
	n := x.Numel()
	k := "elem_gelu_erf_fwd_f32"
	if tanh {
		k = "elem_gelu_tanh_fwd_f32"
	}
	be.launch1D(k, n, be.ptr(out), be.ptr(x), int64(n))
}

func (be cudaBackend) GELUBackward(dx, dout, x *Tensor, tanh bool) {
	n := x.Numel()
	k := "elem_gelu_erf_bwd_f32"
	if tanh {
		k = "elem_gelu_tanh_bwd_f32"
	}
	be.launch1D(k, n, be.ptr(dx), be.ptr(dout), be.ptr(x), int64(n))
}

func (be cudaBackend) SiLUForward(out, x *Tensor) {
	n := x.Numel()
	be.launch1D("elem_silu_fwd_f32", n, be.ptr(out), be.ptr(x), int64(n))
}

func (be cudaBackend) SiLUBackward(dx, dout, x *Tensor) {
	n := x.Numel()
	be.launch1D("elem_silu_bwd_f32", n, be.ptr(dx), be.ptr(dout), be.ptr(x), int64(n))
}

// SquaredReLUForward and SquaredReLUBackward are elem.cu's squared ReLU,
// the CPU's bit for bit (hostcheck's TestHostSquaredReLU): built, not yet
// run on a GPU, so gpt.Config.CheckDevice refuses --squared-relu with
// --device cuda unless GOTRON_CUDA_UNVERIFIED names sqrelu.
func (be cudaBackend) SquaredReLUForward(out, x *Tensor) {
	n := x.Numel()
	be.launch1D("elem_sqrelu_fwd_f32", n, sqreluArgs(be.ptr(out), 0, be.ptr(x), n)...)
}

func (be cudaBackend) SquaredReLUBackward(dx, dout, x *Tensor) {
	n := x.Numel()
	be.launch1D("elem_sqrelu_bwd_f32", n, sqreluArgs(be.ptr(dx), be.ptr(dout), be.ptr(x), n)...)
}

// sqreluArgs are elem_sqrelu_fwd_f32's arguments (dout 0) or
// elem_sqrelu_bwd_f32's, in their parameter order (TestElemGateArgsMatchPTX).
func sqreluArgs(out, dout, x uintptr, n int) []any {
	if dout == 0 {
		return []any{out, x, int64(n)}
	}
	return []any{out, dout, x, int64(n)}
}

// SwiGLUForward: x (n, 2f) rows [gate | up], out (n, f).
func (be cudaBackend) SwiGLUForward(out, x *Tensor) {
	n, c := rowsCols(x)
	f := c / 2
	be.launch1D("elem_swiglu_fwd_f32", n*f, be.ptr(out), be.ptr(x), int64(n*f), int64(f))
}

func (be cudaBackend) SwiGLUBackward(dx, dout, x *Tensor) {
	n, c := rowsCols(x)
	f := c / 2
	be.launch1D("elem_swiglu_bwd_f32", n*f, be.ptr(dx), be.ptr(dout), be.ptr(x), int64(n*f), int64(f))
}

func (be cudaBackend) AddRowBroadcast(dx, g *Tensor) {
	n, total := g.Numel(), dx.Numel()
	if n == 0 || total == 0 {
		return
	}
	c := total / n
	be.launch1D("elem_add_row_broadcast_f32", n*c, be.ptr(dx), be.ptr(g), int64(n*c), int64(c))
}

func (be cudaBackend) AddAtRowIndex(dx, arg, g *Tensor) {
	n, total := g.Numel(), dx.Numel()
	if n == 0 || total == 0 {
		return
	}
	be.launch1D("elem_add_at_row_index_f32", n, be.ptr(dx), be.ptr(arg), be.ptr(g), int64(n), int64(total/n))
}

// CopyStrided copies on the device: dense to dense with one device copy,
// a strided view into a dense tensor by copy.cu's gather, a dense tensor
// into a strided view by its scatter (a view whose elements share storage
// gets one of the values written to a shared element, not necessarily the
// last as on the CPU).
func (be cudaBackend) CopyStrided(dst, src *Tensor) {
	n := src.Numel()
	switch {
	case n == 0:
	case dst.IsContiguous() && src.IsContiguous():
		bytes := int64(n) * int64(src.dtype.Size())
		if err := be.rt.dev.CopyDtoD(devPtr(dst), devPtr(src), bytes); err != nil {
			panic(fmt.Sprintf("tensor: CopyStrided of %d bytes on CUDA: %v", bytes, err))
		}
	case dst.IsContiguous():
		args := append([]any{be.ptr(dst), be.ptr(src), int64(n)}, cudaViewGeom(src.shape, src.strides)...)
		be.launch1D("copy_gather_"+cudaElemKind(src.dtype), n, args...)
	case src.IsContiguous():
		args := append([]any{be.ptr(dst), be.ptr(src), int64(n)}, cudaViewGeom(dst.shape, dst.strides)...)
		be.launch1D("copy_scatter_"+cudaElemKind(src.dtype), n, args...)
	default:
		panic("tensor: CopyStrided between two strided views")
	}
}

// ScatterAddStrided adds g at the positions of view v, counted from dst's
// element 0 at v's offset from its base. Where v's elements share storage
// (a broadcast) the adds are atomic, in no fixed order.
func (be cudaBackend) ScatterAddStrided(dst, v, g *Tensor) {
	n := v.Numel()
	if n == 0 {
		return
	}
	base := 0
	if v.base != nil {
		base = v.offset - v.base.offset
	}
	overlap := int32(0)
	if !injective(v.shape, v.strides) {
		overlap = 1
	}
	args := append([]any{be.ptr(dst), be.ptr(g), int64(base), overlap, int64(n)}, cudaViewGeom(v.shape, v.strides)...)
	be.launch1D("copy_scatter_add_f32", n, args...)
}

// cudaElemKind names copy.cu's kernel variant for dtype's element size.
func cudaElemKind(dtype DType) string {
	switch dtype.Size() {
	case 2:
		return "u16"
	case 4:
		return "u32"
	case 8:
		return "u64"
	}
	panic(fmt.Sprintf("tensor: no CUDA copy kernel for %v elements", dtype))
}

// cudaMaxDims is how many dims copy.cu's kernels take.
const cudaMaxDims = 8

// cudaViewGeom returns a view's geometry as copy.cu's kernels take it: 8
// sizes then 8 strides (int64, in elements), with size-1 dims dropped,
// dims that continue each other merged (outer stride = inner stride ×
// inner size: the same element order), right-aligned behind size-1 dims.
func cudaViewGeom(shape, strides []int) []any {
	type dim struct{ n, s int }
	var dims []dim // innermost first
	for d := len(shape) - 1; d >= 0; d-- {
		n, s := shape[d], strides[d]
		if n == 1 {
			continue
		}
		if k := len(dims) - 1; k >= 0 && s == dims[k].s*dims[k].n {
			dims[k].n *= n
			continue
		}
		dims = append(dims, dim{n, s})
	}
	if len(dims) > cudaMaxDims {
		panic(fmt.Sprintf("tensor: a strided view of shape %v, strides %v has %d dims that do not merge; the CUDA copy kernels take at most %d", shape, strides, len(dims), cudaMaxDims))
	}
	args := make([]any, 2*cudaMaxDims)
	for i := range cudaMaxDims {
		args[i], args[cudaMaxDims+i] = int64(1), int64(0)
	}
	for k, d := range dims {
		args[cudaMaxDims-1-k] = int64(d.n)
		args[2*cudaMaxDims-1-k] = int64(d.s)
	}
	return args
}
