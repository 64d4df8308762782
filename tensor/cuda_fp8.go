package tensor

import (
	"fmt"
	"sync/atomic"

	"github.com/gotron/gotron/internal/cuda"
	"github.com/gotron/gotron/internal/fp8"
)

// FP8 linear products on the GPU (GOTRON_CUDA_UNVERIFIED naming fp8 at
// OpenCUDA, or SetCUDAFP8): built, not yet run on a GPU. LinearFP8 on
// CUDA tensors quantizes each operand on the device with fp8.cu's kernels
// (amax, TE's tensorwise scale, the cast; the scales never leave the
// device) and multiplies through cuBLASLt's FP8 matmul (internal/cuda's
// FP8RowMajor: the TN form, the scale inverses as A/B_SCALE_POINTER):
//
//   - fprop y = x·wᵀ: x and w straight, fast accumulation (TE's fprop);
//   - dgrad dx = g·w: g straight and w's transposed cast (made in the
//     forward, as TE's cast-transpose), split accumulator;
//   - wgrad dw = gᵀ·x: g's and x's transposed casts, split accumulator;
//
// accumulated into the gradients (β = 1), as the CPU's emulation. Under
// the tensorwise recipe each operand's scale comes from its own amax on
// the device; under the delayed recipe from its history (fp8.History,
// on the host: the scale is written on the stream by fp8_scale_set) and
// its amax goes, by the amax kernel's atomic maximum, into the linear
// layer's device amaxes (History[0] of its input, weight and gradient
// histories), which FoldFP8DeviceAmaxes moves into the histories at the
// recipe's update: one read-back per update for every layer, none per
// product. cuBLASLt's FP8 matmul needs the rows, in and out features to
// be multiples of 16, and a GPU of compute capability 8.9 or newer.

// cudaFP8 turns the CUDA backend's FP8 products on (SetCUDAFP8).
var cudaFP8 atomic.Bool

// SetCUDAFP8 turns LinearFP8 on the CUDA device on (or off) and returns
// the previous setting. OpenCUDA turns it on when GOTRON_CUDA_UNVERIFIED
// is 1 or names fp8 (CUDAUnverified): it has not run on a GPU yet.
func SetCUDAFP8(on bool) bool { return cudaFP8.Swap(on) }

// CUDAFP8 reports whether LinearFP8 runs on the CUDA device.
func CUDAFP8() bool { return cudaFP8.Load() }

// fp8DevTensor is one operand quantized on the GPU: its codes (row-major,
// rows×cols) and/or their transpose (cols×rows), and scal: amax, scale and
// scale inverse (three float32s).
type fp8DevTensor struct {
	f            fp8.Format
	codes, codeT *devBuf
	scal         *devBuf
}

func (q *fp8DevTensor) dataType() cuda.DataType {
	if q.f == fp8.E5M2 {
		return cuda.F8E5M2
	}
	return cuda.F8E4M3
}

// straight and transposed are q as FP8RowMajor's operands.
func (q *fp8DevTensor) straight() cuda.FP8Operand {
	return cuda.FP8Operand{Data: q.codes.ptr, Type: q.dataType(), ScaleInv: q.scal.ptr + 8}
}
func (q *fp8DevTensor) transposed() cuda.FP8Operand {
	return cuda.FP8Operand{Data: q.codeT.ptr, Type: q.dataType(), ScaleInv: q.scal.ptr + 8}
}

// fp8Delayed is the delayed recipe's quantization of one operand: the
// history's scale (or a recomputation's replayed one) and where its amax
// goes (0: a replay, which records none).
type fp8Delayed struct {
	scale float32
	amax  cuda.Ptr
}

// quantizeFP8 quantizes x (contiguous float32 rows×cols on the GPU; bf16:
// rounded to bfloat16 first) to f, writing the straight codes, the
// transposed ones, or both: with its own tensorwise scale when d is nil,
// else with d's scale, its amax into d.amax.
func (b cudaBackend) quantizeFP8(x *Tensor, rows, cols int, f fp8.Format, bf16, straight, transposed bool, d *fp8Delayed) *fp8DevTensor {
	n := rows * cols
	q := &fp8DevTensor{f: f, scal: b.rt.newBuf(12)}
	amaxGrid := [3]int{min((n+255)/256, 65535*8), 1, 1}
	if d == nil {
		b.rt.timed("memset of an FP8 amax", func() {
			if err := b.rt.dev.Memset(q.scal.ptr, 4); err != nil {
				panic(fmt.Sprintf("tensor: clearing an FP8 amax on CUDA: %v", err))
			}
		})
		b.launch("fp8_amax_f32", amaxGrid, [3]int{256, 1, 1}, 0, fp8AmaxArgs(q.scal.ptr, devPtr(x), n, bf16)...)
		b.launch("fp8_scale_tensorwise", [3]int{1, 1, 1}, [3]int{32, 1, 1}, 0, fp8ScaleArgs(q.scal.ptr, f)...)
	} else {
		if d.amax != 0 {
			b.launch("fp8_amax_f32", amaxGrid, [3]int{256, 1, 1}, 0, fp8AmaxArgs(d.amax, devPtr(x), n, bf16)...)
		}
		b.launch("fp8_scale_set", [3]int{1, 1, 1}, [3]int{32, 1, 1}, 0, fp8ScaleSetArgs(q.scal.ptr, d.scale)...)
	}
	if straight {
		q.codes = b.rt.newBuf(int64(n))
		b.launch1D("fp8_cast_f32", n, fp8CastArgs(q.codes.ptr, devPtr(x), q.scal.ptr, n, f, bf16)...)
	}
	if transposed {
		if rows > fp8TransposeRows {
			panic(fmt.Sprintf("tensor: LinearFP8 on CUDA: %d rows to transpose, more than the cast's %d", rows, fp8TransposeRows))
		}
		q.codeT = b.rt.newBuf(int64(n))
		b.launch("fp8_cast_transpose_f32", [3]int{(cols + 31) / 32, (rows + 31) / 32, 1}, [3]int{32, 8, 1}, 0,
			fp8CastTransposeArgs(q.codeT.ptr, devPtr(x), q.scal.ptr, rows, cols, f, bf16)...)
	}
	return q
}

// fp8TransposeRows is the most rows the transposing cast takes (its
// grid's y dimension, 32 rows a block, at most 65535).
const fp8TransposeRows = 32 * 65535

// The launch arguments of fp8.cu's kernels, in their parameter order
// (TestFP8ArgsMatchPTX checks them against the PTX without a GPU). scal
// is the amax, scale and scale inverse, three float32s.
func fp8AmaxArgs(scal, x cuda.Ptr, n int, bf16 bool) []any {
	return []any{uintptr(scal), uintptr(x), int64(n), int32(b2i32(bf16))}
}

func fp8ScaleArgs(scal cuda.Ptr, f fp8.Format) []any {
	return []any{uintptr(scal + 4), uintptr(scal + 8), uintptr(scal), f.Max()}
}

func fp8ScaleSetArgs(scal cuda.Ptr, scale float32) []any {
	return []any{uintptr(scal + 4), uintptr(scal + 8), scale, fp8.ScaleInv(scale)}
}

func fp8CastArgs(out, x, scal cuda.Ptr, n int, f fp8.Format, bf16 bool) []any {
	return []any{uintptr(out), uintptr(x), uintptr(scal + 4), int64(n), int32(f), int32(b2i32(bf16))}
}

func fp8CastTransposeArgs(out, x, scal cuda.Ptr, rows, cols int, f fp8.Format, bf16 bool) []any {
	return []any{uintptr(out), uintptr(x), uintptr(scal + 4), int64(rows), int64(cols), int32(f), int32(b2i32(bf16))}
}

func b2i32(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// linearFP8CUDA is LinearFP8 on the GPU: x2 is x as rows×in (contiguous),
// w is out×in, out the result's shape.
func (tp *Tape) linearFP8CUDA(x, x2, w, b *Tensor, q *FP8Linear, shape []int) *Tensor {
	rows, in, outF := x2.Dim(0), x2.Dim(1), w.Dim(0)
	fail := func(format string, args ...any) {
		panic(&DeviceError{Err: fmt.Errorf("LinearFP8 on the CUDA device: "+format, args...)})
	}
	if !cudaFP8.Load() {
		fail("FP8 products on the GPU are built but have not run on a GPU; GOTRON_CUDA_UNVERIFIED=fp8 turns them on")
	}
	if q.Recipe.Kind != fp8.Tensorwise && q.Recipe.Kind != fp8.Delayed {
		fail("the %v recipe is not built on the GPU", q.Recipe.Kind)
	}
	rec := tp.recording(x, w, b)
	if in%16 != 0 || outF%16 != 0 || (rec && rows%16 != 0) {
		fail("%d rows, %d in and %d out features: cuBLASLt's FP8 products need multiples of 16 (the rows too in training: --micro-batch-size × --seq-length)", rows, in, outF)
	}
	be := cudaBackend{rt: cudaRT()}
	w = tp.Contiguous(w)
	if !rec && rows%16 != 0 {
		// decoding: rows (a step's tokens) padded with zeros to a multiple
		// of 16, which change neither the amax nor the real rows' products
		if q.Input != nil {
			fail("%d rows under the delayed recipe: its products need multiples of 16", rows)
		}
		pad := (rows + 15) / 16 * 16
		xp := tp.empty(CUDA, pad, in)
		be.Fill(xp, 0)
		be.CopyStrided(xp.view([]int{rows, in}, []int{in, 1}, 0), x2)
		yp := tp.empty(CUDA, pad, outF)
		xq := be.quantizeFP8(xp, pad, in, q.Recipe.ForwardFormat(), q.BF16Activations, true, false, nil)
		wq := q.deviceWeight(be, w, outF, in)
		be.fp8Product(cuda.FP8RowMajor(pad, outF, in, xq.straight(), wq.straight(), devPtr(yp), cuda.F32, 1, 0, true))
		out := yp.view(shape, contiguousStrides(shape), 0) // the first rows
		if b != nil {
			be.Add(out, out, b)
		}
		return out
	}
	fwd := q.Recipe.ForwardFormat()
	var delayedX, delayedW *fp8Delayed // the delayed recipe's scales (nil: tensorwise)
	if q.Input != nil {
		var replay fp8Scales
		if tp != nil && (tp.nested || tp.replayed) { // activation recomputation, as the CPU's
			replay = q.replayScales(tp.nested)
		}
		delayedX, delayedW = q.deviceDelayed(q.Input, 0, replay.input), q.deviceDelayed(q.Weight, 1, replay.weight)
	}
	// the backward's transposed casts are made now, as TE's cast-transpose
	xq := be.quantizeFP8(x2, rows, in, fwd, q.BF16Activations, true, rec, delayedX)
	var wq *fp8DevTensor
	if !rec && delayedW == nil {
		wq = q.deviceWeight(be, w, outF, in)
	} else {
		wq = be.quantizeFP8(w, outF, in, fwd, q.BF16Weight, true, rec, delayedW)
	}
	out := tp.empty(CUDA, shape...)
	be.fp8Product(cuda.FP8RowMajor(rows, outF, in, xq.straight(), wq.straight(), devPtr(out), cuda.F32, 1, 0, true))
	if b != nil {
		be.Add(out, out, b)
	}
	if rec {
		tp.record("linear_fp8", func(tp *Tape) {
			g := tp.Contiguous(tp.grad(out))
			g2 := g.view([]int{rows, outF}, []int{outF, 1}, g.offset)
			dx, dw := tp.gradFor(x), tp.gradFor(w)
			if dx != nil || dw != nil {
				var delayedG *fp8Delayed
				if q.Grad != nil {
					delayedG = q.deviceDelayed(q.Grad, 2, 0)
				}
				gq := be.quantizeFP8(g2, rows, outF, q.Recipe.GradFormat(), q.BF16Activations, dx != nil, dw != nil, delayedG)
				if dx != nil {
					be.fp8Product(cuda.FP8RowMajor(rows, in, outF, gq.straight(), wq.transposed(), devPtr(dx), cuda.F32, 1, 1, false))
				}
				if dw != nil {
					be.fp8Product(cuda.FP8RowMajor(outF, in, rows, gq.transposed(), xq.transposed(), devPtr(dw), cuda.F32, 1, 1, false))
				}
			}
			if db := tp.gradFor(b); db != nil {
				be.SumRows(db, g2)
			}
		}, out)
	}
	return out
}

// fp8Product queues one FP8 product on cuBLASLt, panicking when it fails
// (there is no other FP8 GEMM to fall back on).
func (b cudaBackend) fp8Product(p cuda.LtParams) {
	b.rt.timed("cuBLASLt FP8 matmul", func() {
		if err := b.rt.dev.LtMatmul(p); err != nil {
			panic(fmt.Sprintf("tensor: LinearFP8 on CUDA: %v", err))
		}
	})
}

// deviceDelayed is the delayed quantization of one operand under history
// h, slot (0 input, 1 weight, 2 gradient) of q's device amaxes: replay's
// scale when not 0 (nothing recorded), else h's scale, h marked observed
// (its amax comes from the device at the next FoldFP8DeviceAmaxes).
func (q *FP8Linear) deviceDelayed(h *fp8.History, slot int, replay float32) *fp8Delayed {
	if replay != 0 {
		return &fp8Delayed{scale: replay}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.devAmax == nil {
		q.devAmax = newCUDA(Float32, []int{3}, true)
	}
	s := h.Scale()
	h.Observe(0) // observed; 0 leaves History[0] as it is
	return &fp8Delayed{scale: s, amax: devPtr(q.devAmax) + cuda.Ptr(4*slot)}
}

// FoldFP8DeviceAmaxes moves the amaxes the GPU observed for ls's delayed
// histories since the last fold into the histories (History[0] becomes
// the larger of the two) and clears them on the device: the delayed
// recipe's update calls it first (gpt.FP8's EndForward and EndBackward),
// so that the amax reduction and the update see what the CPU's
// quantizations would have recorded. The device amaxes of every layer go
// through one buffer and one read-back. Layers without device amaxes
// (the CPU, the simulated device, tensorwise) are skipped: nothing to do.
func FoldFP8DeviceAmaxes(ls []*FP8Linear) {
	var on []*FP8Linear
	for _, q := range ls {
		q.mu.Lock()
		if q.devAmax != nil {
			on = append(on, q)
		}
		q.mu.Unlock()
	}
	if len(on) == 0 {
		return
	}
	be := cudaBackend{rt: cudaRT()}
	staging := be.empty(Float32, 3*len(on))
	defer staging.dbuf.free()
	for i, q := range on {
		be.launch1D("paged_copy_u32", 3, be.ptr(staging)+uintptr(12*i), be.ptr(q.devAmax), int64(3))
		be.Fill(q.devAmax, 0)
	}
	h := New(Float32, 3*len(on))
	copyFromCUDA(h, staging, "FP8 delayed recipe: device amaxes")
	v := h.f32s()
	for i, q := range on {
		for j, hist := range []*fp8.History{q.Input, q.Weight, q.Grad} {
			if a := v[3*i+j]; a > hist.Current() {
				hist.SetCurrent(a)
			}
		}
	}
}

// deviceWeight returns w (outF×in on the GPU) quantized with its own
// tensorwise scale, straight: under CacheWeight (decoding: weights that
// never change) quantized at the first product and kept, else each time.
func (q *FP8Linear) deviceWeight(be cudaBackend, w *Tensor, outF, in int) *fp8DevTensor {
	quantize := func() *fp8DevTensor {
		return be.quantizeFP8(w, outF, in, q.Recipe.ForwardFormat(), q.BF16Weight, true, false, nil)
	}
	if !q.CacheWeight {
		return quantize()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.wqDev == nil || q.wqFrom != w || q.wqSrc != storageOf(w) {
		q.wqDev, q.wqFrom, q.wqSrc = quantize(), w, storageOf(w)
	}
	return q.wqDev
}
