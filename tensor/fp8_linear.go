package tensor

import (
	"fmt"
	"sync"

	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/internal/fp8"
)

// FP8Linear is one linear layer's FP8 setting and scaling state: a
// Transformer Engine Linear (QKV, attention projection, fc1, fc2) under
// fp8_autocast, as Megatron's --fp8-format/--fp8-recipe run it. Its three
// GEMMs read FP8 operands, each quantized with a per-tensor scale:
//
//   - fprop  y  = x·wᵀ: x (E4M3) and w (E4M3);
//   - dgrad  dx = g·w: g, the output gradient (E5M2 under hybrid, else
//     E4M3), and w as quantized for the forward;
//   - wgrad  dw = gᵀ·x: g and x as quantized for the forward (or, with the
//     delayed recipe's NoWgradFP8, the unquantized g and x at the tape's
//     precision);
//
// the bias gradient is the sum of the unquantized g (TE's fused
// cast+dbias). The emulation multiplies the FP8 values (exact in float32),
// sums in float32 and multiplies the result by the product of the two
// scale inverses, as cuBLASLt's FP8 GEMM applies its A and B scale
// inverses: the numbers of FP8 training, not its speed (each operand takes
// a cast pass on the CPU; it runs slower than a float32 product).
//
// The tensors quantized are those Megatron's --bf16 holds: with
// BF16Activations, x and g rounded to bfloat16 first; with BF16Weight, w
// rounded to bfloat16 first (Megatron's bf16 model weight; off under
// --fp8-param-gather, whose FP8 weight is quantized from the float32 main
// parameter). The amax of the rounded tensor is the rounding of the amax
// (rounding is monotonic).
type FP8Linear struct {
	Recipe          fp8.Recipe
	BF16Activations bool
	BF16Weight      bool
	// Input, Weight and Grad are the delayed recipe's histories (nil under
	// tensorwise, whose scales come from each tensor's own amax).
	Input, Weight, Grad *fp8.History
	// CacheWeight (decoding, tensorwise: weights that never change)
	// quantizes the weight at the first product and keeps it (a float32
	// copy of the FP8 values, on the heap) for the later ones: the same
	// numbers as quantizing it each time.
	CacheWeight bool

	mu     sync.Mutex
	wq     *Tensor // the cached quantized weight
	wqInv  float32
	wqFrom *Tensor // the weight it was quantized from
	// On the GPU (decoding): the cached weight's FP8 codes and scales,
	// and where the weight's values were when it was quantized.
	wqDev *fp8DevTensor
	wqSrc storageRef
	// replay holds, in order, the delayed scales of the forwards that a
	// checkpoint's backward will recompute (activation recomputation):
	// the recomputation quantizes with them and records no amax, as TE
	// replays a recomputed module with its forward's fp8 meta.
	replay []fp8Scales
	// devAmax (on the GPU, the delayed recipe): the amaxes of the input,
	// weight and gradient quantized since the last FoldFP8DeviceAmaxes.
	devAmax *Tensor
}

// fp8Scales are the input and weight scales of one forward.
type fp8Scales struct{ input, weight float32 }

// NewFP8Linear returns the state of one linear layer under recipe r: the
// delayed recipe's three histories, fresh (scale 1, as TE starts).
func NewFP8Linear(r fp8.Recipe, bf16Activations, bf16Weight bool) *FP8Linear {
	l := &FP8Linear{Recipe: r, BF16Activations: bf16Activations, BF16Weight: bf16Weight}
	if r.Kind == fp8.Delayed {
		l.Input, l.Weight, l.Grad = fp8.NewHistory(r.AmaxHistoryLen), fp8.NewHistory(r.AmaxHistoryLen), fp8.NewHistory(r.AmaxHistoryLen)
	}
	return l
}

// quantizeFP8 returns x (contiguous, float32, on a host-memory device)
// quantized to format f — a tensor of the FP8 values as float32 — and the
// scale inverse to multiply them by; h is the delayed recipe's history
// (nil: current scaling from x's own amax).
func (tp *Tape) quantizeFP8(x *Tensor, f fp8.Format, roundBF16 bool, h *fp8.History) (*Tensor, float32) {
	return tp.quantizeFP8With(x, f, roundBF16, h, 0)
}

// quantizeFP8With is quantizeFP8 with a fixed scale when replay is not 0
// (nothing recorded in h then).
func (tp *Tape) quantizeFP8With(x *Tensor, f fp8.Format, roundBF16 bool, h *fp8.History, replay float32) (*Tensor, float32) {
	src := x.f32s()
	amax := fp8.Amax(src)
	if roundBF16 {
		amax = cpu.RoundBF16(amax)
	}
	var scale float32
	switch {
	case replay != 0:
		scale = replay
	case h == nil:
		// current_scaling.cu's compute_scale_from_amax_kernel: the
		// largest float32 when the scale overflows, whatever the input type
		scale = fp8.TensorwiseScale(amax, f)
	default:
		scale = h.Scale()
		h.Observe(amax)
	}
	out := tp.empty(x.dev, x.shape...)
	dst := out.f32s()
	if roundBF16 {
		for i, v := range src {
			dst[i] = f.Round(cpu.RoundBF16(v) * scale)
		}
	} else {
		fp8.Quantize(f, dst, src, scale)
	}
	return out, fp8.ScaleInv(scale)
}

// weight returns w quantized to f and its scale inverse: cached under
// CacheWeight, else quantized on tp.
func (q *FP8Linear) weight(tp *Tape, w *Tensor, f fp8.Format) (*Tensor, float32) {
	if !q.CacheWeight || q.Weight != nil {
		return tp.quantizeFP8(tp.Contiguous(w), f, q.BF16Weight, q.Weight)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.wq == nil || q.wqFrom != w {
		var heap *Tape
		q.wq, q.wqInv = heap.quantizeFP8(heap.Contiguous(w), f, q.BF16Weight, nil)
		q.wqFrom = w
	}
	return q.wq, q.wqInv
}

// replayScales returns the scales for a forward under activation
// recomputation: the recomputation's (recompute) are the oldest forward's
// kept; a first forward's are the histories' now (0: record the amaxes),
// kept for its recomputation.
func (q *FP8Linear) replayScales(recompute bool) fp8Scales {
	q.mu.Lock()
	defer q.mu.Unlock()
	if recompute {
		if len(q.replay) == 0 {
			panic("tensor: LinearFP8 recomputed without its forward's delayed scales")
		}
		s := q.replay[0]
		q.replay = q.replay[1:]
		return s
	}
	q.replay = append(q.replay, fp8Scales{q.Input.Scale(), q.Weight.Scale()})
	return fp8Scales{}
}

// LinearFP8 is Linear (x·wᵀ + b, w (out, in)) with its products on FP8
// operands as q says (FP8Linear): emulated on the CPU and the simulated
// device; on the CUDA device, cuBLASLt's FP8 matmul (linearFP8CUDA, under
// GOTRON_CUDA_UNVERIFIED=fp8).
func (tp *Tape) LinearFP8(x, w, b *Tensor, q *FP8Linear) *Tensor {
	mustF32("LinearFP8", x, w, b)
	in := x.Dim(-1)
	if w.NDim() != 2 || w.Dim(1) != in {
		panic(fmt.Sprintf("tensor: LinearFP8 input %v does not match weight %v", x.shape, w.shape))
	}
	dev := sameDevice("LinearFP8", x, w, b)
	x = tp.Contiguous(x)
	rows := x.Numel() / in
	x2 := x.view([]int{rows, in}, []int{in, 1}, x.offset)
	shape := append(append([]int(nil), x.shape[:len(x.shape)-1]...), w.Dim(0))
	if dev == CUDA { // quantized on the device, multiplied by cuBLASLt (cuda_fp8.go)
		return tp.linearFP8CUDA(x, x2, w, b, q, shape)
	}
	out := tp.empty(x.dev, shape...)
	out2 := out.view([]int{rows, w.Dim(0)}, []int{w.Dim(0), 1}, 0)
	be := backendFor(x, w, b)
	fwd := q.Recipe.ForwardFormat()
	var xq, wq *Tensor
	var xInv, wInv float32
	if q.Input != nil && tp != nil && (tp.nested || tp.replayed) {
		// the delayed recipe under activation recomputation
		s := q.replayScales(tp.nested)
		xq, xInv = tp.quantizeFP8With(x2, fwd, q.BF16Activations, q.Input, s.input)
		wq, wInv = tp.quantizeFP8With(tp.Contiguous(w), fwd, q.BF16Weight, q.Weight, s.weight)
	} else {
		xq, xInv = tp.quantizeFP8(x2, fwd, q.BF16Activations, q.Input)
		wq, wInv = q.weight(tp, w, fwd)
	}
	gemm(be, MatmulFP32, NoTrans, Trans, xInv*wInv, xq, wq, 0, out2)
	if b != nil {
		be.Add(out, out, b)
	}
	if tp.recording(x, w, b) {
		prec := tp.MatmulPrecision()
		tp.record("linear_fp8", func(tp *Tape) {
			g := tp.grad(out)
			g2 := g.view([]int{rows, w.Dim(0)}, []int{w.Dim(0), 1}, g.offset)
			dx, dw := tp.gradFor(x), tp.gradFor(w)
			if dx != nil || (dw != nil && !q.Recipe.NoWgradFP8) {
				gq, gInv := tp.quantizeFP8(tp.Contiguous(g2), q.Recipe.GradFormat(), q.BF16Activations, q.Grad)
				if dx != nil {
					gemm(be, MatmulFP32, NoTrans, NoTrans, gInv*wInv, gq, wq, 1, dx.view([]int{rows, in}, []int{in, 1}, dx.offset))
				}
				if dw != nil && !q.Recipe.NoWgradFP8 {
					gemm(be, MatmulFP32, Trans, NoTrans, gInv*xInv, gq, xq, 1, dw)
				}
			}
			if dw != nil && q.Recipe.NoWgradFP8 {
				gemm(be, prec, Trans, NoTrans, 1, g2, x2, 1, dw)
			}
			if db := tp.gradFor(b); db != nil {
				be.SumRows(db, g2)
			}
		}, out)
	}
	return out
}
