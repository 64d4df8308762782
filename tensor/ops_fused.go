package tensor

import "fmt"

// Fused elementwise ops, as Megatron's bias-GELU, bias-SwiGLU and
// bias-dropout-add fusions: a linear layer leaves its bias to the op that
// follows it (Megatron's skip_bias_add), which adds it in the same pass as
// its own arithmetic. On the CPU and the simulated device each gives the
// numbers of the chain it replaces bit for bit (the same float32 operations
// in the same order); on the GPU, fused.cu's kernels write the same
// expressions, but nvcc may contract a multiply-add differently in one
// kernel than in two, so they agree within float32 rounding (checked at
// 2e-4, TestCUDAFusedOps), not asserted bit for bit. What changes is
// the passes over memory and, for bias-dropout-add, the tape's memory: the
// dropout mask is kept as bits, not float32 values.

// checkBias panics unless b is a bias (c) for y (..., c).
func checkBias(op string, y, b *Tensor) {
	mustF32(op, y, b)
	if len(b.shape) != 1 || b.shape[0] != y.Dim(-1) {
		panic(fmt.Sprintf("tensor: %s bias %v does not match input %v (want (%d))", op, b.shape, y.shape, y.Dim(-1)))
	}
}

// ownGrad returns a zeroed buffer for an op's gradient of t alone: t's
// gradient buffer itself when t has none yet, else a scratch the caller
// adds with addGrad (fresh false). Fused backwards sum the bias gradient
// from it, so it must not hold other ops' contributions.
func (tp *Tape) ownGrad(t *Tensor) (g *Tensor, fresh bool) {
	if _, has := tp.grads[t]; !has && !t.leaf && t.requiresGrad {
		return tp.gradFor(t), true
	}
	return tp.zeros(t.dev, t.shape...), false
}

// sumBiasGrad adds the rows of dy (..., c) into b's gradient, if b needs one.
func (tp *Tape) sumBiasGrad(be Backend, b, dy *Tensor) {
	if db := tp.gradFor(b); db != nil {
		c := b.Numel()
		be.SumRows(db, dy.view([]int{dy.Numel() / c, c}, []int{c, 1}, dy.offset))
	}
}

// BiasGELU returns GELU(y + b) for y (..., c) and a bias b (c): Add then
// GELU in one pass (Megatron's bias_gelu_impl). Megatron's fused kernel
// always computes the tanh approximation; this one computes kind, so
// turning the fusion off or on never changes a model's numbers. A nil b is
// GELU.
func (tp *Tape) BiasGELU(y, b *Tensor, kind GELUKind) *Tensor {
	if b == nil {
		return tp.GELU(y, kind)
	}
	checkBias("BiasGELU", y, b)
	y = tp.Contiguous(y)
	out := tp.empty(y.dev, y.shape...)
	be, tanh := backendFor(y, b), kind == GELUTanh
	be.BiasGELUForward(out, y, b, tanh)
	tp.forwardOnly(be, out, nil) // the backward reads y and b
	if tp.recording(y, b) {
		tp.record("bias_gelu", func(tp *Tape) {
			dy, fresh := tp.ownGrad(y)
			be.BiasGELUBackward(dy, tp.grad(out), y, b, tanh)
			tp.sumBiasGrad(be, b, dy)
			if !fresh {
				tp.addGrad(y, dy)
			}
		}, out)
	}
	return out
}

// BiasSwiGLU returns SwiGLU(y + b) for y (..., 2f) laid out [gate | up] and
// a bias b (2f): Add then SwiGLU in one pass (Megatron's bias_swiglu_impl).
// A nil b is SwiGLU.
func (tp *Tape) BiasSwiGLU(y, b *Tensor) *Tensor {
	if b == nil {
		return tp.SwiGLU(y)
	}
	checkBias("BiasSwiGLU", y, b)
	y = tp.Contiguous(y)
	shape := append([]int(nil), y.shape...)
	shape[len(shape)-1] /= 2
	out := tp.empty(y.dev, shape...)
	be := backendFor(y, b)
	be.BiasSwiGLUForward(out, y, b)
	tp.forwardOnly(be, out, nil)
	if tp.recording(y, b) {
		tp.record("bias_swiglu", func(tp *Tape) {
			dy, fresh := tp.ownGrad(y)
			be.BiasSwiGLUBackward(dy, tp.grad(out), y, b)
			tp.sumBiasGrad(be, b, dy)
			if !fresh {
				tp.addGrad(y, dy)
			}
		}, out)
	}
	return out
}

// BiasDropoutAdd returns residual + Dropout(y + b, p) for residual and y
// (..., c) and a bias b (c) or nil: Megatron's bias_dropout_add, the end of
// each half of a transformer layer. The mask is the one Dropout draws from
// rng (and rng advances as Dropout advances it), but it is kept as one bit
// per element (the CPU) or not at all (the CUDA kernels draw it again), so
// the op holds its output and n/32 floats where Dropout and Add hold the
// float32 mask, the dropped values and the sum. p == 0 adds without
// dropout (rng may be nil).
func (tp *Tape) BiasDropoutAdd(residual, y, b *Tensor, p float32, rng *RNG) *Tensor {
	mustF32("BiasDropoutAdd", residual, y)
	if !SameShape(residual.shape, y.shape) {
		panic(fmt.Sprintf("tensor: BiasDropoutAdd residual %v and input %v differ", residual.shape, y.shape))
	}
	if b != nil {
		checkBias("BiasDropoutAdd", y, b)
	}
	var state RNGState
	if p != 0 {
		if rng == nil {
			panic("tensor: BiasDropoutAdd with dropout needs an RNG")
		}
		state = rng.State()
		if p < 1 { // as Dropout: one block per four elements
			rng.offset += uint64((y.Numel() + 3) / 4)
		}
	}
	residual, y = tp.Contiguous(residual), tp.Contiguous(y)
	out := tp.empty(y.dev, y.shape...)
	var keep *Tensor // the mask's bits
	if p != 0 {
		keep = tp.empty(y.dev, (y.Numel()+31)/32)
	}
	be := backendFor(residual, y, b)
	be.BiasDropoutAddForward(out, keep, residual, y, b, p, state)
	if tp.recording(residual, y, b) {
		tp.record("bias_dropout_add", func(tp *Tape) {
			g := tp.grad(out)
			tp.passGrad(residual, out)
			if p == 0 {
				tp.passGrad(y, out)
				tp.sumBiasGrad(be, b, g)
				return
			}
			dy, fresh := tp.ownGrad(y)
			be.DropoutBackward(dy, g, keep, p, state)
			tp.sumBiasGrad(be, b, dy)
			if !fresh {
				tp.addGrad(y, dy)
			}
		}, out)
	}
	return out
}

// Norm is the normalization that follows a residual add in
// BiasDropoutAddNorm: LayerNorm with Weight and Bias (nil: none), or, with
// RMS, RMSNorm with Weight; Eps as LayerNorm's and RMSNorm's. A norm that
// scales by 1 + γ (--apply-layernorm-1p) passes that sum as Weight.
type Norm struct {
	RMS          bool
	Weight, Bias *Tensor
	Eps          float32
}

// BiasDropoutAddNorm returns sum = BiasDropoutAdd(residual, y, b, p, rng)
// and out = the norm n of sum's rows in one op: the residual add that
// feeds a pre-LN layer's next norm (the attention half's end and the MLP's
// norm), as Apex's and Transformer Engine's fused add-norms. On the CPU and
// the simulated device each row is normalized while the sum is in cache,
// with the numbers of BiasDropoutAdd then LayerNorm (or RMSNorm) bit for
// bit and the same buffers kept for backward (sum, the mask's bits, out and
// the row statistics); the backward is theirs, in their order. On the GPU
// fused.cu's kernel reads residual and y once and writes sum and out once
// (SetCUDAFusedKernels), its statistics float64 sums as norm.cu's.
func (tp *Tape) BiasDropoutAddNorm(residual, y, b *Tensor, p float32, rng *RNG, n Norm) (sum, out *Tensor) {
	mustF32("BiasDropoutAddNorm", residual, y, n.Weight)
	if !SameShape(residual.shape, y.shape) {
		panic(fmt.Sprintf("tensor: BiasDropoutAddNorm residual %v and input %v differ", residual.shape, y.shape))
	}
	if b != nil {
		checkBias("BiasDropoutAddNorm", y, b)
	}
	checkBias("BiasDropoutAddNorm norm weight", y, n.Weight)
	if n.RMS && n.Bias != nil {
		panic("tensor: BiasDropoutAddNorm: RMSNorm takes no bias")
	}
	if n.Bias != nil {
		checkBias("BiasDropoutAddNorm norm bias", y, n.Bias)
	}
	var state RNGState
	if p != 0 {
		if rng == nil {
			panic("tensor: BiasDropoutAddNorm with dropout needs an RNG")
		}
		state = rng.State()
		if p < 1 { // as Dropout: one block per four elements
			rng.offset += uint64((y.Numel() + 3) / 4)
		}
	}
	residual, y = tp.Contiguous(residual), tp.Contiguous(y)
	rows, _ := rowsCols(y)
	sum, out = tp.empty(y.dev, y.shape...), tp.empty(y.dev, y.shape...)
	var keep, mean *Tensor
	if p != 0 {
		keep = tp.empty(y.dev, (y.Numel()+31)/32)
	}
	if !n.RMS {
		mean = tp.empty(y.dev, rows)
	}
	rstd := tp.empty(y.dev, rows)
	w, nb := n.Weight, n.Bias
	be := backendFor(residual, y, b, w, nb)
	if nbf, out16 := tp.normOperand(be, y.dev, y.shape); out16 != nil {
		nbf.BiasDropoutAddNormForwardBF16(sum, out, out16, keep, mean, rstd, residual, y, b, w, nb, p, state, n.Eps)
		tp.forwardOnly(be, out, out16)
	} else {
		be.BiasDropoutAddNormForward(sum, out, keep, mean, rstd, residual, y, b, w, nb, p, state, n.Eps)
		tp.forwardOnly(be, out, nil) // the norm's backward reads sum and the statistics
	}
	if tp.recording(residual, y, b, w, nb) {
		tp.record("bias_dropout_add_norm", func(tp *Tape) {
			// the norm's backward, as the LayerNorm or RMSNorm step (which
			// runs right after sum's later consumers) would add it into
			// sum's gradient, then bias-dropout-add's
			if g := tp.grad(out); g != nil {
				if n.RMS {
					be.RMSNormBackward(tp.gradForOrScratch(sum), tp.gradForOrScratch(w), g, sum, w, rstd)
				} else {
					be.LayerNormBackward(tp.gradForOrScratch(sum), tp.gradForOrScratch(w), tp.gradFor(nb), g, sum, w, mean, rstd)
				}
			}
			g := tp.grad(sum)
			if g == nil {
				return
			}
			tp.passGrad(residual, sum)
			if p == 0 {
				tp.passGrad(y, sum)
				tp.sumBiasGrad(be, b, g)
				return
			}
			dy, fresh := tp.ownGrad(y)
			be.DropoutBackward(dy, g, keep, p, state)
			tp.sumBiasGrad(be, b, dy)
			if !fresh {
				tp.addGrad(y, dy)
			}
		}, sum, out)
	}
	return sum, out
}
