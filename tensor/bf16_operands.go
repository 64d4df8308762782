package tensor

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// bfloat16 GEMM operands under --bf16 (MatmulBF16). The contract of
// MatmulBF16 is: both operands rounded to bfloat16 (round to nearest even),
// products and sums in float32. The CPU rounds while packing
// (internal/cpu.SgemmBF16), and the GPU's default path has cuBLAS round
// float32 operands on every call (CUBLAS_COMPUTE_32F_FAST_16BF), which on
// the H100 ran at 31–35% of bf16 peak. A device whose products read
// bfloat16 operands instead (the CUDA backend under
// GOTRON_CUDA_UNVERIFIED=gemm-bf16, and the simulated device, which
// emulates it) gets them, as Megatron's bf16 model parameters beside its
// float32 main parameters:
//
//   - weights: a bfloat16 copy of each registered parameter
//     (NewBF16Weights), cast once after every change of the parameters
//     (BF16Weights.Invalidate: the trainer calls it when an optimizer step
//     or a load may have changed them) — at the first product that reads
//     it, so a parameter that no product reads is never copied; one whose
//     storage moved is cast again;
//   - activations and output gradients: cast once where Linear reads them
//     (one conversion, Backend.Convert: tensor's round to nearest even),
//     the cast output gradient read by both the dX and the dW products;
//   - Linear keeps the bfloat16 input for its dW product instead of the
//     float32 one, and does not hold the float32 one for its backward:
//     a norm's or an activation's output that only linear layers read
//     goes back once the model is done with it (ForwardDone, below), so
//     the tape holds 2 bytes an element of it instead of 4; other float32
//     inputs (the attention's output, which its backward reads) stay, the
//     bfloat16 one 2 bytes an element more beside them.
//
// Rounding to bfloat16 is idempotent and the products widen bfloat16
// exactly, so the numbers are MatmulBF16's bit for bit: the simulated
// device's products widen the bfloat16 operands and run the CPU's kernel
// (TestSimBF16OperandsBitIdentical, train's TestSimBF16GemmOperands*).

// simBF16Operands turns the simulated device's bfloat16 operands on (the
// default) or off (SetSimBF16GemmOperands).
var simBF16Operands atomic.Bool

func init() { simBF16Operands.Store(true) }

// SetSimBF16GemmOperands turns the simulated device's bfloat16 GEMM
// operands under MatmulBF16 on or off (on by default, as the CUDA backend
// does them under gemm-bf16) and returns the previous setting: tests
// compare the two paths' numbers and counts.
func SetSimBF16GemmOperands(on bool) bool { return simBF16Operands.Swap(on) }

// cudaBF16Operands turns the CUDA backend's bfloat16 GEMM operands on
// (GOTRON_CUDA_UNVERIFIED naming gemm-bf16 at OpenCUDA, or
// SetCUDABF16GemmOperands): built, not yet run on a GPU.
var cudaBF16Operands atomic.Bool

// SetCUDABF16GemmOperands turns on (or off) the CUDA backend's bfloat16
// GEMM operands under MatmulBF16 — weights' bfloat16 copies, activations
// cast once, cuBLAS with CUDA_R_16BF A and B, float32 C and
// CUBLAS_COMPUTE_32F — and returns the previous setting. Off (the
// default), the products are CUBLAS_COMPUTE_32F_FAST_16BF on float32
// operands. OpenCUDA turns it on when GOTRON_CUDA_UNVERIFIED is 1 or names
// gemm-bf16 (CUDAUnverified): it has not run on a GPU yet.
func SetCUDABF16GemmOperands(on bool) bool { return cudaBF16Operands.Swap(on) }

// CUDABF16GemmOperands reports whether the CUDA backend's products under
// MatmulBF16 read bfloat16 operands now (SetCUDABF16GemmOperands).
func CUDABF16GemmOperands() bool { return cudaBF16Operands.Load() }

// bf16OperandsOn reports whether products on be's device read bfloat16
// operands now under MatmulBF16. The CPU never does: it rounds while
// packing, and its numbers stay as they are.
func bf16OperandsOn(be Backend) bool {
	switch be.(type) {
	case simBackend:
		return simBF16Operands.Load()
	case cudaBackend:
		return cudaBF16Operands.Load()
	}
	return false
}

// BF16OperandCounts counts the conversions to bfloat16 that products under
// MatmulBF16 cause, on every device, since the process started: what
// bfloat16 operands save (Sub gives a span's).
type BF16OperandCounts struct {
	// Products under MatmulBF16 on float32 operands: each converts both
	// operands inside the product (cuBLAS's _FAST_16BF, the CPU's packing)
	// and reads 4 bytes an operand element.
	FP32OperandProducts, FP32OperandElems int64
	// Products on bfloat16 operands: 2 bytes an operand element, nothing
	// converted inside.
	BF16OperandProducts, BF16OperandElems int64
	// Conversions (one kernel each) of weights into their bfloat16 copies,
	// and of activations and output gradients, and their elements (each
	// read as 4 bytes and written as 2).
	WeightCasts, WeightCastElems int64
	ActCasts, ActCastElems       int64
	// Activations a product read as their producer wrote them in
	// bfloat16 beside float32 (a norm's kernel: no conversion kernel of
	// their own, no float32 read), and their elements.
	FusedCasts, FusedCastElems int64
}

// Sub returns c - d, field by field.
func (c BF16OperandCounts) Sub(d BF16OperandCounts) BF16OperandCounts {
	return BF16OperandCounts{
		FP32OperandProducts: c.FP32OperandProducts - d.FP32OperandProducts, FP32OperandElems: c.FP32OperandElems - d.FP32OperandElems,
		BF16OperandProducts: c.BF16OperandProducts - d.BF16OperandProducts, BF16OperandElems: c.BF16OperandElems - d.BF16OperandElems,
		WeightCasts: c.WeightCasts - d.WeightCasts, WeightCastElems: c.WeightCastElems - d.WeightCastElems,
		ActCasts: c.ActCasts - d.ActCasts, ActCastElems: c.ActCastElems - d.ActCastElems,
		FusedCasts: c.FusedCasts - d.FusedCasts, FusedCastElems: c.FusedCastElems - d.FusedCastElems,
	}
}

// Add returns c + d, field by field.
func (c BF16OperandCounts) Add(d BF16OperandCounts) BF16OperandCounts {
	return BF16OperandCounts{
		FP32OperandProducts: c.FP32OperandProducts + d.FP32OperandProducts, FP32OperandElems: c.FP32OperandElems + d.FP32OperandElems,
		BF16OperandProducts: c.BF16OperandProducts + d.BF16OperandProducts, BF16OperandElems: c.BF16OperandElems + d.BF16OperandElems,
		WeightCasts: c.WeightCasts + d.WeightCasts, WeightCastElems: c.WeightCastElems + d.WeightCastElems,
		ActCasts: c.ActCasts + d.ActCasts, ActCastElems: c.ActCastElems + d.ActCastElems,
		FusedCasts: c.FusedCasts + d.FusedCasts, FusedCastElems: c.FusedCastElems + d.FusedCastElems,
	}
}

// Conversions is the number of float32-to-bfloat16 conversion passes: two
// per product on float32 operands (inside it), one per cast.
func (c BF16OperandCounts) Conversions() int64 {
	return 2*c.FP32OperandProducts + c.WeightCasts + c.ActCasts
}

// ConvertedElems is the number of elements those passes convert: every
// operand element of a product on float32 operands, every element cast.
func (c BF16OperandCounts) ConvertedElems() int64 {
	return c.FP32OperandElems + c.WeightCastElems + c.ActCastElems
}

// ProductReadBytes is the bytes of operands the products read: 4 an
// element of a float32 operand, 2 of a bfloat16 one (once each; a GEMM's
// tiling reads them more often, in the same ratio).
func (c BF16OperandCounts) ProductReadBytes() int64 {
	return 4*c.FP32OperandElems + 2*c.BF16OperandElems
}

// AsFP32Operands returns the counts of the same products on float32
// operands (what MatmulBF16 costs without bfloat16 operands): no casts,
// every operand element converted inside its product.
func (c BF16OperandCounts) AsFP32Operands() BF16OperandCounts {
	return BF16OperandCounts{FP32OperandProducts: c.FP32OperandProducts + c.BF16OperandProducts, FP32OperandElems: c.FP32OperandElems + c.BF16OperandElems}
}

func (c BF16OperandCounts) String() string {
	return fmt.Sprintf("%d products on float32 operands (%d elements), %d on bfloat16 operands (%d elements); casts: %d of weights (%d elements), %d of activations (%d elements), %d written in bfloat16 by their producers (%d elements); %d conversions of %d elements, %d bytes read by the products",
		c.FP32OperandProducts, c.FP32OperandElems, c.BF16OperandProducts, c.BF16OperandElems,
		c.WeightCasts, c.WeightCastElems, c.ActCasts, c.ActCastElems, c.FusedCasts, c.FusedCastElems, c.Conversions(), c.ConvertedElems(), c.ProductReadBytes())
}

var bf16Counts struct {
	fp32Products, fp32Elems atomic.Int64
	bf16Products, bf16Elems atomic.Int64
	weightCasts, weightElem atomic.Int64
	actCasts, actElems      atomic.Int64
	fusedCasts, fusedElems  atomic.Int64
}

// BF16GemmOperandCounts returns the process's counts so far.
func BF16GemmOperandCounts() BF16OperandCounts {
	return BF16OperandCounts{
		FP32OperandProducts: bf16Counts.fp32Products.Load(), FP32OperandElems: bf16Counts.fp32Elems.Load(),
		BF16OperandProducts: bf16Counts.bf16Products.Load(), BF16OperandElems: bf16Counts.bf16Elems.Load(),
		WeightCasts: bf16Counts.weightCasts.Load(), WeightCastElems: bf16Counts.weightElem.Load(),
		ActCasts: bf16Counts.actCasts.Load(), ActCastElems: bf16Counts.actElems.Load(),
		FusedCasts: bf16Counts.fusedCasts.Load(), FusedCastElems: bf16Counts.fusedElems.Load(),
	}
}

// gemm runs be.Gemm and counts it when it is a MatmulBF16 product.
func gemm(be Backend, prec MatmulPrecision, tA, tB Transpose, alpha float32, a, b *Tensor, beta float32, c *Tensor) {
	countProduct(prec, a, b)
	be.Gemm(prec, tA, tB, alpha, a, b, beta, c)
}

// BF16Weights are the bfloat16 copies of a model's parameters that
// products under MatmulBF16 read on a device with bfloat16 operands
// (Megatron's bf16 model parameters beside the float32 main parameters).
// Only registered parameters get a copy; a product reading any other
// float32 tensor casts it for that product. A copy is made from the
// parameter at the first product that reads it after NewBF16Weights or
// Invalidate, and kept while the parameter's storage stays where it was.
// Copies are never saved: a checkpoint holds the float32 parameters, and a
// load is followed by Invalidate.
type BF16Weights struct {
	params []*Tensor
}

// bf16Copy is one parameter's bfloat16 copy.
type bf16Copy struct {
	mu    sync.Mutex
	t     *Tensor // BFloat16, the parameter's shape, on its device; nil until first cast
	valid bool
	// src is where the parameter's values were when t was cast (its
	// storage and offset): storage moved (fully sharded parameters
	// gathered anew, MoveInto) means the copy is stale.
	src storageRef
}

// storageRef identifies a tensor's element 0.
type storageRef struct {
	base   unsafe.Pointer
	offset int
}

func storageOf(t *Tensor) storageRef {
	switch {
	case t.dbuf != nil:
		return storageRef{unsafe.Pointer(t.dbuf), t.offset}
	case len(t.f32) > 0:
		return storageRef{unsafe.Pointer(&t.f32[0]), t.offset}
	}
	return storageRef{}
}

// NewBF16Weights registers params (float32 parameters; others are
// skipped) for bfloat16 copies. A parameter registered twice keeps one
// copy. Registering costs nothing on a device whose products do not read
// bfloat16 operands (the CPU): no copy is ever made there.
func NewBF16Weights(params []*Tensor) *BF16Weights {
	w := &BF16Weights{}
	for _, p := range params {
		if p == nil || p.dtype != Float32 {
			continue
		}
		if p.bf16 == nil {
			p.bf16 = &bf16Copy{}
		}
		w.params = append(w.params, p)
	}
	return w
}

// Invalidate marks every copy stale: the parameters may have changed (an
// optimizer step, a load). Each is cast again, once, by the first product
// that reads it. A nil *BF16Weights does nothing.
func (w *BF16Weights) Invalidate() {
	if w == nil {
		return
	}
	for _, p := range w.params {
		if c := p.bf16; c != nil {
			c.mu.Lock()
			c.valid = false
			c.mu.Unlock()
		}
	}
}

// Bytes returns the device bytes the copies hold now (2 a parameter
// element once cast).
func (w *BF16Weights) Bytes() int64 {
	if w == nil {
		return 0
	}
	var n int64
	for _, p := range w.params {
		if c := p.bf16; c != nil {
			c.mu.Lock()
			if c.t != nil {
				n += int64(c.t.Numel()) * 2
			}
			c.mu.Unlock()
		}
	}
	return n
}

// bf16Weight returns w's bfloat16 operand for a product on be: its copy
// (cast now if stale) when w is registered, else a cast into a tape buffer.
func (tp *Tape) bf16Weight(be Backend, w *Tensor) *Tensor {
	c := w.bf16
	if c == nil || !w.IsContiguous() {
		return tp.castBF16(be, w)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	src := storageOf(w)
	if c.valid && c.src == src && c.t != nil && SameShape(c.t.shape, w.shape) && c.t.dev == w.dev {
		return c.t
	}
	if c.t == nil || c.t.Numel() != w.Numel() || c.t.dev != w.dev {
		c.t = emptyOn(w.dev, BFloat16, w.shape...)
	} else if !SameShape(c.t.shape, w.shape) {
		c.t = c.t.view(append([]int(nil), w.shape...), contiguousStrides(w.shape), c.t.offset)
	}
	be.Convert(c.t, w)
	bf16Counts.weightCasts.Add(1)
	bf16Counts.weightElem.Add(int64(w.Numel()))
	c.valid, c.src = true, src
	return c.t
}

// castBF16 returns contiguous float32 x rounded to bfloat16 in a buffer of
// the tape (or the heap for a nil tape): one conversion.
func (tp *Tape) castBF16(be Backend, x *Tensor) *Tensor {
	x = tp.Contiguous(x)
	out := tp.emptyBF16(x.dev, x.shape...)
	be.Convert(out, x)
	bf16Counts.actCasts.Add(1)
	bf16Counts.actElems.Add(int64(x.Numel()))
	return out
}

// castBF16Of is castBF16 of x2 (x viewed as a matrix) unless x's producer
// wrote its bfloat16 rounding already (operandOf).
func (tp *Tape) castBF16Of(be Backend, x, x2 *Tensor) *Tensor {
	if r := tp.operandOf(x); r != nil {
		return r.view(x2.shape, x2.strides, r.offset)
	}
	return tp.castBF16(be, x2)
}

// emptyBF16 is empty for a bfloat16 tensor: on the host, a float32 arena
// buffer of half the elements (rounded up) holds it, so the tape returns
// it at Reset as any other.
func (tp *Tape) emptyBF16(dev Device, shape ...int) *Tensor {
	if dev == CUDA || tp == nil {
		t := emptyOn(dev, BFloat16, shape...)
		if dev == CUDA && tp != nil {
			owner := tp
			if tp.parent != nil {
				owner = tp.parent
			}
			owner.live = append(owner.live, liveBuf{dev: t.dbuf})
		}
		return t
	}
	n := numel(shape)
	buf := tp.arena.get((n + 1) / 2)
	owner := tp
	if tp.parent != nil {
		owner = tp.parent
	}
	owner.live = append(owner.live, liveBuf{host: buf})
	var u16 []uint16
	if n > 0 {
		u16 = unsafe.Slice((*uint16)(unsafe.Pointer(&buf[0])), n)
	}
	return &Tensor{shape: append([]int(nil), shape...), strides: contiguousStrides(shape), dtype: BFloat16, dev: dev, u16: u16, leaf: true}
}

// releaseBF16 gives t, a buffer emptyBF16 handed out for this backward
// step only (a cast output gradient), back at once instead of at Reset:
// the products that read it are queued (the GPU's stream orders a reuse
// after them) or done (the host).
func (tp *Tape) releaseBF16(t *Tensor) {
	if tp == nil {
		return
	}
	owner := tp
	if tp.parent != nil {
		owner = tp.parent
	}
	for j := len(owner.live) - 1; j >= 0; j-- {
		b := owner.live[j]
		if (t.dbuf != nil && b.dev == t.dbuf) || (b.host != nil && len(t.u16) > 0 && unsafe.Pointer(&b.host[0]) == unsafe.Pointer(&t.u16[0])) {
			b.release(owner.arena)
			owner.live[j] = liveBuf{}
			return
		}
	}
}

// widenBF16 returns the float32 values of contiguous bfloat16 host tensor
// t (exact): the simulated device's products on bfloat16 operands run the
// CPU's float32-operand kernel on them, whose rounding to bfloat16 then
// changes nothing.
func widenBF16(t *Tensor) []float32 {
	s := t.u16s()
	out := make([]float32, len(s))
	for i, h := range s {
		out[i] = BFloat16ToFloat32(h)
	}
	return out
}

// Float32 outputs that only products on bfloat16 operands read again. A
// norm's or an activation's output feeds the next linear layer; neither
// the producer's backward (it reads the producer's input and statistics)
// nor, on bfloat16 operands, Linear's backward (it keeps its own bfloat16
// input) reads it. Such an output is registered by its producer
// (forwardOnly) on a device whose products read bfloat16 operands under
// MatmulBF16; any op that records a backward step reading it pins it
// (recording), and once the forward pass reads it no more (ForwardDone,
// said by the model, the same on every device) an unpinned one goes back
// to the arena or the device's allocator at once, instead of staying to
// Reset beside the bfloat16 copy. On the CPU nothing is registered (its
// products round while packing and Linear's backward reads the float32
// input), so its memory and numbers are as before.

// fwdOperand is one registered output.
type fwdOperand struct {
	t *Tensor
	// pinned: a recorded backward step may read t's storage.
	pinned bool
	// bf16 is t rounded to bfloat16, written by t's producer beside t
	// (a norm's kernel: bf16NormForward), or nil; read is set once a
	// Linear took it as its operand (and keeps it for its backward).
	bf16 *Tensor
	read bool
}

// bf16NormForward is a backend whose norm kernels also write their output
// rounded to bfloat16, the operand of the linear layer the output feeds,
// in the same pass (the CUDA backend: norm.cu's _bf16 kernels; the
// simulated device emulates them with a conversion). out16 is a
// contiguous bfloat16 tensor of out's shape.
type bf16NormForward interface {
	LayerNormForwardBF16(out, out16, mean, rstd, x, w, b *Tensor, eps float32)
	RMSNormForwardBF16(out, out16, rstd, x, w *Tensor, eps float32)
	BiasDropoutAddNormForwardBF16(sum, out, out16, keep, mean, rstd, residual, y, b, w, nb *Tensor, p float32, rng RNGState, eps float32)
}

// normOperand returns a bfloat16 buffer for a norm's output of shape on
// be to write beside its float32 one (registered with forwardOnly then),
// or nil where be's products do not read bfloat16 operands now or its
// norm kernels cannot write one.
func (tp *Tape) normOperand(be Backend, dev Device, shape []int) (bf16NormForward, *Tensor) {
	nb, ok := be.(bf16NormForward)
	if !ok || tp == nil || tp.matmul != MatmulBF16 || !bf16OperandsOn(be) {
		return nil, nil
	}
	return nb, tp.emptyBF16(dev, shape...)
}

// operandOf returns x's bfloat16 rounding written by its producer, for a
// Linear that reads x whole, or nil.
func (tp *Tape) operandOf(x *Tensor) *Tensor {
	if tp == nil || x.offset != 0 {
		return nil
	}
	op := tp.owner().operands[operandKey(x)]
	if op == nil || op.t != x || op.bf16 == nil {
		return nil
	}
	op.read = true
	bf16Counts.fusedCasts.Add(1)
	bf16Counts.fusedElems.Add(int64(x.Numel()))
	return op.bf16
}

// owner is the tape whose live buffers tp's outputs join.
func (tp *Tape) owner() *Tape {
	if tp.parent != nil {
		return tp.parent
	}
	return tp
}

// operandKey identifies t's storage: its device buffer or its host
// buffer's first element (views share it).
func operandKey(t *Tensor) unsafe.Pointer {
	switch {
	case t.dbuf != nil:
		return unsafe.Pointer(t.dbuf)
	case len(t.f32) > 0:
		return unsafe.Pointer(&t.f32[0])
	}
	return nil
}

// forwardOnly registers out, a float32 output that tp just took from its
// buffers and that its producer's backward does not read, when products
// on be read bfloat16 operands under tp's matmul precision.
// out16, when not nil, is out rounded to bfloat16 by its producer.
func (tp *Tape) forwardOnly(be Backend, out, out16 *Tensor) {
	if tp == nil || tp.matmul != MatmulBF16 || out.offset != 0 || !bf16OperandsOn(be) {
		return
	}
	k := operandKey(out)
	if k == nil {
		return
	}
	o := tp.owner()
	if o.operands == nil {
		o.operands = map[unsafe.Pointer]*fwdOperand{}
	}
	o.operands[k] = &fwdOperand{t: out, bf16: out16}
}

// pinOperands marks the registered outputs among in (or whose storage
// they view) as read by a backward step.
func (tp *Tape) pinOperands(in ...*Tensor) {
	if tp == nil {
		return
	}
	m := tp.owner().operands
	if len(m) == 0 {
		return
	}
	for _, t := range in {
		if t == nil {
			continue
		}
		if op := m[operandKey(t)]; op != nil {
			op.pinned = true
			if op.bf16 != nil && !op.read {
				// read by another op before any linear layer (a
				// query/key norm's RoPE, a collective): the bfloat16
				// rounding is likely no product's operand; a Linear
				// after casts again
				tp.releaseBF16(op.bf16)
				op.bf16 = nil
			}
		}
	}
}

// ForwardDone tells the tape that the forward pass reads t, and every view
// of it, no more. When t is a float32 output whose storage nothing
// recorded will read again — a norm's or an activation's output read only
// by linear layers whose products take bfloat16 operands (bf16_operands.go)
// — its buffer goes back now (to the arena, or to the device's allocator,
// whose stream orders a reuse after the reads already queued), and t must
// not be read after. Otherwise, and on a nil tape, it does nothing: the
// buffer stays to Reset (or to its release in backward) as before. Models
// call it where a norm's or an activation's output goes out of use, on
// every device.
func (tp *Tape) ForwardDone(t *Tensor) {
	if tp == nil || t == nil {
		return
	}
	o := tp.owner()
	k := operandKey(t)
	op := o.operands[k]
	if op == nil || op.t != t || op.pinned {
		return
	}
	delete(o.operands, k)
	for j := len(o.live) - 1; j >= 0; j-- {
		b := o.live[j]
		if (b.dev != nil && unsafe.Pointer(b.dev) == k) || (len(b.host) > 0 && unsafe.Pointer(&b.host[0]) == k) {
			b.release(o.arena)
			o.live[j] = liveBuf{}
			t.f32, t.dbuf = nil, nil // a later read fails instead of reading a reused buffer
			return
		}
	}
}
