package tensor

import "fmt"

// Each op computes its output through the Backend and, when recording,
// pushes a backward closure. Backward closures accumulate into the inputs'
// gradients (gradFor) so shared inputs sum their contributions.

func mustF32(op string, ts ...*Tensor) {
	for _, t := range ts {
		if t != nil && t.dtype != Float32 {
			panic(fmt.Sprintf("tensor: %s on %v tensor %s (want float32)", op, t.dtype, t.Name))
		}
	}
}

// MatMul returns op(a)·op(b) over the last two dims; leading dims are batch
// dims, equal for a and b, or absent on one side (a weight shared by the batch).
func (tp *Tape) MatMul(a, b *Tensor, tA, tB Transpose) *Tensor {
	mustF32("MatMul", a, b)
	a, b = tp.Contiguous(a), tp.Contiguous(b)
	m, ka := a.Dim(-2), a.Dim(-1)
	if tA == Trans {
		m, ka = ka, m
	}
	kb, n := b.Dim(-2), b.Dim(-1)
	if tB == Trans {
		kb, n = n, kb
	}
	if ka != kb {
		panic(fmt.Sprintf("tensor: MatMul inner dims differ: %v (trans %v) · %v (trans %v)", a.shape, tA, b.shape, tB))
	}
	lead := a.shape[:len(a.shape)-2]
	if len(b.shape) > len(a.shape) {
		lead = b.shape[:len(b.shape)-2]
	}
	shape := append(append([]int(nil), lead...), m, n)
	out := tp.empty(a.dev, shape...)
	be, prec := backendFor(a, b), tp.MatmulPrecision()
	gemm(be, prec, tA, tB, 1, a, b, 0, out)
	if tp.recording(a, b) {
		tp.record("matmul", func(tp *Tape) {
			g := tp.grad(out)
			if da := tp.gradFor(a); da != nil {
				// dA = dC·op(B)ᵀ, or its transpose when A was used transposed.
				if tA == NoTrans {
					tp.gemmAcc(be, prec, NoTrans, !tB, g, b, da)
				} else {
					tp.gemmAcc(be, prec, tB, Trans, b, g, da)
				}
			}
			if db := tp.gradFor(b); db != nil {
				if tB == NoTrans {
					tp.gemmAcc(be, prec, !tA, NoTrans, a, g, db)
				} else {
					tp.gemmAcc(be, prec, Trans, tA, g, a, db)
				}
			}
		}, out)
	}
	return out
}

// gemmAcc computes c += op(x)·op(y), summing over batch dims that c lacks
// (the gradient of a weight shared across a batch).
func (tp *Tape) gemmAcc(be Backend, prec MatmulPrecision, tX, tY Transpose, x, y, c *Tensor) {
	bx, by := x.Numel()/(x.Dim(-1)*x.Dim(-2)), y.Numel()/(y.Dim(-1)*y.Dim(-2))
	bc := c.Numel() / (c.Dim(-1) * c.Dim(-2))
	if bc == max(bx, by) {
		gemm(be, prec, tX, tY, 1, x, y, 1, c)
		return
	}
	// c is shared over the batch: fold the batch into the reduction dim when
	// possible (x rows stacked), else loop.
	if tX == Trans && tY == NoTrans && bx == by {
		// c (p×q) += Σ_b x_bᵀ y_b = Xᵀ Y with X, Y stacked along rows.
		xs := x.view([]int{bx * x.Dim(-2), x.Dim(-1)}, contiguousStrides([]int{bx * x.Dim(-2), x.Dim(-1)}), x.offset)
		ys := y.view([]int{by * y.Dim(-2), y.Dim(-1)}, contiguousStrides([]int{by * y.Dim(-2), y.Dim(-1)}), y.offset)
		gemm(be, prec, Trans, NoTrans, 1, xs, ys, 1, c)
		return
	}
	for i := range max(bx, by) {
		xi, yi := batchEntry(x, i, bx), batchEntry(y, i, by)
		gemm(be, prec, tX, tY, 1, xi, yi, 1, c)
	}
}

func batchEntry(t *Tensor, i, batch int) *Tensor {
	r, c := t.Dim(-2), t.Dim(-1)
	if batch == 1 {
		return t.view([]int{r, c}, []int{c, 1}, t.offset)
	}
	return t.view([]int{r, c}, []int{c, 1}, t.offset+i*r*c)
}

// Linear returns x·wᵀ + b for x (..., in), w (out, in), b (out) or nil:
// PyTorch's and Megatron's weight layout. Under MatmulBF16 on a device
// whose products read bfloat16 operands (bf16_operands.go) the products
// read w's bfloat16 copy and x and the output gradient cast once each, and
// the backward keeps the bfloat16 x instead of the float32 one.
func (tp *Tape) Linear(x, w, b *Tensor) *Tensor {
	out, _ := tp.linear(x, w, b, false)
	return out
}

// linear is Linear; with gelu (b non-nil, on a device with epilogues,
// LinearGELU) it also returns act = GELUTanh(out), computed by the same
// product's epilogue where the device can (GemmBiasGELU), else by
// GELUForward, with the GELU's backward recorded.
func (tp *Tape) linear(x, w, b *Tensor, gelu bool) (out, act *Tensor) {
	in := x.Dim(-1)
	if w.Dim(1) != in {
		panic(fmt.Sprintf("tensor: Linear input %v does not match weight %v", x.shape, w.shape))
	}
	x = tp.Contiguous(x)
	rows := x.Numel() / in
	x2 := x.view([]int{rows, in}, []int{in, 1}, x.offset)
	shape := append(append([]int(nil), x.shape[:len(x.shape)-1]...), w.Dim(0))
	out = tp.empty(x.dev, shape...)
	out2 := out.view([]int{rows, w.Dim(0)}, []int{w.Dim(0), 1}, 0)
	be, prec := backendFor(x, w, b), tp.MatmulPrecision()
	// xa, wa are the products' operands: x2 and w, or their bfloat16
	// roundings (the same numbers under MatmulBF16).
	xa, wa := x2, w
	bf16 := prec == MatmulBF16 && x.dtype == Float32 && w.dtype == Float32 && bf16OperandsOn(be)
	if bf16 {
		xa, wa = tp.castBF16Of(be, x, x2), tp.bf16Weight(be, w)
	}
	// a device with cuBLASLt's epilogues (cuda_lt.go) adds the bias in
	// the product
	epi, fused := epiloguesOn(be)
	geluDone := false
	if gelu {
		act = tp.empty(x.dev, shape...)
		act2 := act.view([]int{rows, w.Dim(0)}, []int{w.Dim(0), 1}, 0)
		geluDone = epi.GemmBiasGELU(prec, NoTrans, Trans, xa, wa, b, out2, act2)
	}
	switch {
	case geluDone:
		countProduct(prec, xa, wa)
	case b != nil && fused && epi.GemmBias(prec, NoTrans, Trans, xa, wa, b, out2):
		countProduct(prec, xa, wa)
	default:
		gemm(be, prec, NoTrans, Trans, 1, xa, wa, 0, out2)
		if b != nil {
			be.Add(out, out, b)
		}
	}
	if gelu && !geluDone {
		be.GELUForward(act, out, true)
	}
	// On bfloat16 operands the backward reads xa, not x: x's storage
	// may go once the forward is done with it (ForwardDone).
	rec := tp.wantsGrad(x, w, b)
	if rec && !bf16 {
		tp.pinOperands(x)
	}
	if gelu {
		tp.forwardOnly(be, act, nil) // the GELU's backward reads out
	}
	if rec {
		tp.record("linear", func(tp *Tape) {
			g := tp.grad(out)
			g2 := g.view([]int{rows, w.Dim(0)}, []int{w.Dim(0), 1}, g.offset)
			ga, wb := g2, wa
			if bf16 && (x.requiresGrad || w.requiresGrad) {
				// the output gradient cast once for both products; the
				// weight's copy again (the forward's unless the parameters
				// changed in between, which a step does not do)
				ga = tp.castBF16(be, g2)
				if x.requiresGrad {
					wb = tp.bf16Weight(be, w)
				}
			}
			if dx := tp.gradFor(x); dx != nil {
				gemm(be, prec, NoTrans, NoTrans, 1, ga, wb, 1, dx.view([]int{rows, in}, []int{in, 1}, dx.offset))
			}
			db := tp.gradFor(b)
			if dw := tp.gradFor(w); dw != nil {
				// the bias gradient in the dW product's epilogue
				// (cuda_lt.go: float32 products only)
				if db != nil && fused && prec == MatmulFP32 && epi.GemmBGrad(prec, Trans, NoTrans, ga, xa, dw, db, tp.empty(x.dev, w.Dim(0))) {
					countProduct(prec, ga, xa)
					db = nil
				} else {
					gemm(be, prec, Trans, NoTrans, 1, ga, xa, 1, dw)
				}
			}
			if ga != g2 {
				tp.releaseBF16(ga)
			}
			if db != nil {
				be.SumRows(db, g2)
			}
		}, out)
		if gelu {
			tp.record("gelu", func(tp *Tape) { be.GELUBackward(tp.gradFor(out), tp.grad(act), out, true) }, act)
		}
	}
	return out, act
}

// LinearGELU returns GELU(x·wᵀ + b) of kind for x (..., in), w (out, in)
// and a bias b (out): BiasGELU(Linear(x, w, nil), b, kind), the MLP's fc1
// and activation under the bias-GELU fusion. On a device with cuBLASLt's
// epilogues (cuda_lt.go) and the tanh GELU — the approximation cuBLASLt's
// GELU epilogue computes, Megatron's openai_gelu — the bias and the GELU
// are the product's epilogue (GELU_AUX_BIAS, keeping the GELU's input for
// the backward) where the device can, else its bias epilogue and the GELU
// kernel; either way the GELU's input x·wᵀ + b is Linear's output, whose
// backward (the bias gradient included) is Linear's. Add then GELU is the
// fused op bit for bit on the CPU, so the numbers are BiasGELU's.
func (tp *Tape) LinearGELU(x, w, b *Tensor, kind GELUKind) *Tensor {
	if b == nil || kind != GELUTanh {
		return tp.BiasGELU(tp.Linear(x, w, nil), b, kind)
	}
	if _, on := epiloguesOn(backendFor(x, w, b)); !on {
		return tp.BiasGELU(tp.Linear(x, w, nil), b, kind)
	}
	if len(b.shape) != 1 || b.shape[0] != w.Dim(0) || b.dtype != Float32 {
		panic(fmt.Sprintf("tensor: LinearGELU bias %v %v does not match weight %v (want float32 (%d))", b.dtype, b.shape, w.shape, w.Dim(0)))
	}
	_, act := tp.linear(x, w, b, true)
	return act
}

// broadcastable checks that b's shape is a suffix of a's.
func broadcastable(op string, a, b *Tensor) {
	if len(b.shape) > len(a.shape) || !SameShape(a.shape[len(a.shape)-len(b.shape):], b.shape) {
		panic(fmt.Sprintf("tensor: %s cannot broadcast %v to %v (b's shape must be a suffix of a's)", op, b.shape, a.shape))
	}
}

// Add returns a + b, where b's shape is a suffix of a's (broadcast over a's
// leading dims, e.g. a bias or position embeddings).
func (tp *Tape) Add(a, b *Tensor) *Tensor {
	mustF32("Add", a, b)
	broadcastable("Add", a, b)
	a, b = tp.Contiguous(a), tp.Contiguous(b)
	out := tp.empty(a.dev, a.shape...)
	be := backendFor(a, b)
	be.Add(out, a, b)
	if tp.recording(a, b) {
		tp.record("add", func(tp *Tape) {
			g := tp.grad(out)
			tp.passGrad(a, out)
			if b.requiresGrad {
				if b.Numel() == a.Numel() {
					tp.passGrad(b, out)
				} else {
					be.SumRows(tp.gradFor(b), g.view([]int{g.Numel() / b.Numel(), b.Numel()}, []int{b.Numel(), 1}, g.offset))
				}
			}
		}, out)
	}
	return out
}

// Sub returns a - b (b's shape a suffix of a's).
func (tp *Tape) Sub(a, b *Tensor) *Tensor { return tp.Add(a, tp.Scale(b, -1)) }

// Mul returns a ⊙ b, b's shape a suffix of a's.
func (tp *Tape) Mul(a, b *Tensor) *Tensor {
	mustF32("Mul", a, b)
	broadcastable("Mul", a, b)
	a, b = tp.Contiguous(a), tp.Contiguous(b)
	out := tp.empty(a.dev, a.shape...)
	be := backendFor(a, b)
	be.Mul(out, a, b)
	if tp.recording(a, b) {
		tp.record("mul", func(tp *Tape) {
			g := tp.grad(out)
			if da := tp.gradFor(a); da != nil {
				t := tp.empty(a.dev, a.shape...)
				be.Mul(t, g, b)
				be.Axpy(da, 1, t)
			}
			if db := tp.gradFor(b); db != nil {
				t := tp.empty(a.dev, a.shape...)
				be.Mul(t, g, a) // a ⊙ g has a's shape; b = a suffix: sum rows
				be.SumRows(db, t.view([]int{t.Numel() / b.Numel(), b.Numel()}, []int{b.Numel(), 1}, 0))
			}
		}, out)
	}
	return out
}

// Scale returns alpha·x.
func (tp *Tape) Scale(x *Tensor, alpha float32) *Tensor {
	x = tp.Contiguous(x)
	out := tp.empty(x.dev, x.shape...)
	be := backendFor(x)
	be.Scale(out, alpha, x)
	if tp.recording(x) {
		tp.record("scale", func(tp *Tape) { be.Axpy(tp.gradFor(x), alpha, tp.grad(out)) }, out)
	}
	return out
}

// Sum returns the sum of all elements as a scalar (shape [1]).
func (tp *Tape) Sum(x *Tensor) *Tensor {
	x = tp.Contiguous(x)
	out := tp.empty(x.dev, 1)
	be := backendFor(x)
	be.SumAll(out, x)
	if tp.recording(x) {
		tp.record("sum", func(tp *Tape) {
			d := tp.gradFor(x)
			be.AddRowBroadcast(d.view([]int{1, d.Numel()}, []int{d.Numel(), 1}, d.offset), tp.grad(out))
		}, out)
	}
	return out
}

// Mean returns the mean of all elements as a scalar.
func (tp *Tape) Mean(x *Tensor) *Tensor { return tp.Scale(tp.Sum(x), 1/float32(x.Numel())) }

// SumLast reduces the last dim: (..., c) → (...).
func (tp *Tape) SumLast(x *Tensor) *Tensor {
	x = tp.Contiguous(x)
	out := tp.empty(x.dev, x.shape[:len(x.shape)-1]...)
	be := backendFor(x)
	be.RowSum(out, x)
	if tp.recording(x) {
		tp.record("sum_last", func(tp *Tape) { be.AddRowBroadcast(tp.gradFor(x), tp.grad(out)) }, out)
	}
	return out
}

// MaxLast returns the maximum over the last dim: (..., c) → (...). The
// gradient goes to the first maximal element of each row.
func (tp *Tape) MaxLast(x *Tensor) *Tensor {
	x = tp.Contiguous(x)
	out := tp.empty(x.dev, x.shape[:len(x.shape)-1]...)
	arg := NewOn(x.dev, Int32, out.shape...)
	be := backendFor(x)
	be.RowArgMax(out, arg, x)
	if tp.recording(x) {
		tp.record("max_last", func(tp *Tape) { be.AddAtRowIndex(tp.gradFor(x), arg, tp.grad(out)) }, out)
	}
	return out
}

// Embedding returns rows of table (vocab, c) for int32 ids (...): (..., c).
// Ids outside the table panic: validate data ids where they enter.
func (tp *Tape) Embedding(ids, table *Tensor) *Tensor {
	ids = ids.Contiguous()
	v := table.Dim(0)
	// Host storage is checked here; on a GPU, reading the ids back would
	// stall every step, so the data loader's check (ids < vocab where they
	// enter) is the guard there.
	if ids.dbuf == nil {
		for i, id := range ids.i32s() {
			if id < 0 || int(id) >= v {
				panic(fmt.Sprintf("tensor: embedding id %d at %d outside table of %d rows", id, i, v))
			}
		}
	}
	out := tp.empty(table.dev, append(append([]int(nil), ids.shape...), table.Dim(1))...)
	be := backendFor(table, ids)
	be.EmbeddingForward(out, table, ids)
	if tp.recording(table) {
		tp.record("embedding", func(tp *Tape) { be.EmbeddingBackward(tp.gradFor(table), tp.grad(out), ids) }, out)
	}
	return out
}

// LayerNorm normalises the last dim: (x-mean)/sqrt(var+eps)·w + b (b may be nil).
func (tp *Tape) LayerNorm(x, w, b *Tensor, eps float32) *Tensor {
	x = tp.Contiguous(x)
	n, _ := rowsCols(x)
	out, mean, rstd := tp.empty(x.dev, x.shape...), tp.empty(x.dev, n), tp.empty(x.dev, n)
	be := backendFor(x, w, b)
	// on bfloat16 operands the kernel also writes the linear layer's
	// operand (normOperand)
	nb, out16 := tp.normOperand(be, x.dev, x.shape)
	if out16 != nil {
		nb.LayerNormForwardBF16(out, out16, mean, rstd, x, w, b, eps)
	} else {
		be.LayerNormForward(out, mean, rstd, x, w, b, eps)
	}
	tp.forwardOnly(be, out, out16) // the backward reads x and the statistics
	if tp.recording(x, w, b) {
		tp.record("layernorm", func(tp *Tape) {
			be.LayerNormBackward(tp.gradForOrScratch(x), tp.gradForOrScratch(w), tp.gradFor(b), tp.grad(out), x, w, mean, rstd)
		}, out)
	}
	return out
}

// gradForOrScratch is gradFor, or a throw-away buffer for kernels that must
// write a gradient nobody needs.
func (tp *Tape) gradForOrScratch(t *Tensor) *Tensor {
	if g := tp.gradFor(t); g != nil {
		return g
	}
	return tp.zeros(t.dev, t.shape...)
}

// RMSNorm normalises the last dim: x/sqrt(mean(x²)+eps)·w.
func (tp *Tape) RMSNorm(x, w *Tensor, eps float32) *Tensor {
	x = tp.Contiguous(x)
	n, _ := rowsCols(x)
	out, rstd := tp.empty(x.dev, x.shape...), tp.empty(x.dev, n)
	be := backendFor(x, w)
	nb, out16 := tp.normOperand(be, x.dev, x.shape)
	if out16 != nil {
		nb.RMSNormForwardBF16(out, out16, rstd, x, w, eps)
	} else {
		be.RMSNormForward(out, rstd, x, w, eps)
	}
	tp.forwardOnly(be, out, out16)
	if tp.recording(x, w) {
		tp.record("rmsnorm", func(tp *Tape) {
			be.RMSNormBackward(tp.gradForOrScratch(x), tp.gradForOrScratch(w), tp.grad(out), x, w, rstd)
		}, out)
	}
	return out
}

// GELUKind selects the GELU formula.
type GELUKind int

// GELU variants: the tanh approximation (GPT-2, Megatron's default fused
// bias-gelu) and the exact erf form.
const (
	GELUTanh GELUKind = iota
	GELUErf
)

// GELU applies GELU elementwise.
func (tp *Tape) GELU(x *Tensor, kind GELUKind) *Tensor {
	x = tp.Contiguous(x)
	out := tp.empty(x.dev, x.shape...)
	be := backendFor(x)
	be.GELUForward(out, x, kind == GELUTanh)
	tp.forwardOnly(be, out, nil) // the backward reads x
	if tp.recording(x) {
		tp.record("gelu", func(tp *Tape) { be.GELUBackward(tp.gradFor(x), tp.grad(out), x, kind == GELUTanh) }, out)
	}
	return out
}

// SiLU applies x·sigmoid(x) elementwise.
func (tp *Tape) SiLU(x *Tensor) *Tensor {
	x = tp.Contiguous(x)
	out := tp.empty(x.dev, x.shape...)
	be := backendFor(x)
	be.SiLUForward(out, x)
	if tp.recording(x) {
		tp.record("silu", func(tp *Tape) { be.SiLUBackward(tp.gradFor(x), tp.grad(out), x) }, out)
	}
	return out
}

// SquaredReLU applies relu(x)² elementwise (Megatron's squared_relu).
func (tp *Tape) SquaredReLU(x *Tensor) *Tensor {
	x = tp.Contiguous(x)
	out := tp.empty(x.dev, x.shape...)
	be := backendFor(x)
	be.SquaredReLUForward(out, x)
	tp.forwardOnly(be, out, nil)
	if tp.recording(x) {
		tp.record("squared_relu", func(tp *Tape) { be.SquaredReLUBackward(tp.gradFor(x), tp.grad(out), x) }, out)
	}
	return out
}

// SwiGLU maps (..., 2f) laid out [gate | up] to silu(gate)·up (..., f).
func (tp *Tape) SwiGLU(x *Tensor) *Tensor {
	x = tp.Contiguous(x)
	shape := append([]int(nil), x.shape...)
	shape[len(shape)-1] /= 2
	out := tp.empty(x.dev, shape...)
	be := backendFor(x)
	be.SwiGLUForward(out, x)
	tp.forwardOnly(be, out, nil)
	if tp.recording(x) {
		tp.record("swiglu", func(tp *Tape) { be.SwiGLUBackward(tp.gradFor(x), tp.grad(out), x) }, out)
	}
	return out
}

// Softmax over the last dim.
func (tp *Tape) Softmax(x *Tensor) *Tensor {
	x = tp.Contiguous(x)
	out := tp.empty(x.dev, x.shape...)
	be := backendFor(x)
	be.SoftmaxForward(out, x)
	if tp.recording(x) {
		tp.record("softmax", func(tp *Tape) { be.SoftmaxBackward(tp.gradFor(x), tp.grad(out), out) }, out)
	}
	return out
}

// Dropout zeroes elements with probability p and scales the rest by 1/(1-p),
// drawing the mask from rng. p == 0 returns x.
func (tp *Tape) Dropout(x *Tensor, p float32, rng *RNG) *Tensor {
	if p == 0 {
		return x
	}
	x = tp.Contiguous(x)
	mask := tp.empty(x.dev, x.shape...)
	be := backendFor(x)
	be.DropoutMask(mask, p, rng.State())
	if p < 1 { // the stream moves one block per four elements
		rng.offset += uint64((mask.Numel() + 3) / 4)
	}
	out := tp.empty(x.dev, x.shape...)
	be.Mul(out, x, mask)
	if tp.recording(x) {
		tp.record("dropout", func(tp *Tape) {
			t := tp.empty(x.dev, x.shape...)
			be.Mul(t, tp.grad(out), mask)
			be.Axpy(tp.gradFor(x), 1, t)
		}, out)
	}
	return out
}

// RoPE rotates x (b, t, h, d) by position with the given tables; positions is
// an int32 (b, t) tensor or nil for 0..t-1.
func (tp *Tape) RoPE(x *Tensor, r *RoPE, positions *Tensor) *Tensor {
	x = tp.Contiguous(x)
	out := tp.empty(x.dev, x.shape...)
	be := backendFor(x, positions)
	be.RoPEForward(r, out, x, positions)
	if tp.recording(x) {
		tp.record("rope", func(tp *Tape) { be.RoPEBackward(r, tp.gradFor(x), tp.grad(out), positions) }, out)
	}
	return out
}

// AttentionOptions are the per-call settings of fused attention.
type AttentionOptions struct {
	// Causal masks future keys.
	Causal bool
	// Scale multiplies the scores; 0 means 1/sqrt(head dim).
	Scale float32
	// DocIDs (b, t) int32, optional: a token attends only within its document
	// (packed sequences, Megatron's --reset-attention-mask).
	DocIDs *Tensor
	// Dropout is the probability of dropping each attention probability
	// (after the softmax, before the product with v: Megatron's
	// --attention-dropout); 0 turns it off. The kernel keys its masks by
	// (RNG draw, batch row, global head, query, key): see
	// AttentionConfig.Dropout.
	Dropout float32
	// RNG is the dropout stream: each call with Dropout > 0 draws one block
	// (the key of its masks), so masks replay when the stream's state is
	// restored (checkpoints, activation recomputation). Required with
	// Dropout > 0.
	RNG *RNG
	// FirstHead is the global index of q's head 0: a tensor-parallel rank
	// holding heads [FirstHead, FirstHead+hq) drops what the whole model
	// drops on those heads. 0 on one rank.
	FirstHead int
}

// Attention is fused scaled-dot-product attention over q (b, t, hq, d) and
// k, v (b, t, hkv, d) (GQA when hkv < hq), returning (b, t, hq, d), with
// optional dropout on the probabilities. Memory beyond the output is O(t)
// per head: the dropout mask is regenerated in backward, not stored.
func (tp *Tape) Attention(q, k, v *Tensor, o AttentionOptions) *Tensor {
	q, k, v = tp.Contiguous(q), tp.Contiguous(k), tp.Contiguous(v)
	b, t, hq, d := q.Dim(0), q.Dim(1), q.Dim(2), q.Dim(3)
	cfg := AttentionConfig{B: b, T: t, HQ: hq, HKV: k.Dim(2), D: d, Scale: o.Scale, Causal: o.Causal, FirstHead: o.FirstHead,
		Precision: tp.MatmulPrecision()}
	if o.DocIDs != nil {
		cfg.DocIDs = o.DocIDs.Contiguous()
	}
	if o.Dropout != 0 {
		if o.RNG == nil {
			panic("tensor: Attention with Dropout needs an RNG")
		}
		cfg.Dropout, cfg.DropoutSeed = o.Dropout, o.RNG.Uint64()
	}
	out, lse := tp.empty(q.dev, q.shape...), tp.empty(q.dev, b, hq, t)
	be := backendFor(q, k, v, o.DocIDs)
	be.AttentionForward(out, lse, q, k, v, cfg)
	if tp.recording(q, k, v) {
		tp.record("attention", func(tp *Tape) {
			be.AttentionBackward(tp.gradForOrScratch(q), tp.gradForOrScratch(k), tp.gradForOrScratch(v), tp.grad(out), q, k, v, out, lse, cfg)
		}, out)
	}
	return out
}

// CrossEntropyOptions configure the fused softmax cross-entropy.
type CrossEntropyOptions struct {
	// LossMask (n) float32, optional: per-token weights; the loss is
	// Σ mask·loss / Σ mask (Megatron's token-weighted loss). Nil weighs all 1.
	LossMask *Tensor
	// LabelSmoothing in [0, 1).
	LabelSmoothing float32
}

// CrossEntropy returns the mean token loss (a scalar) of logits (n, v)
// against int32 targets (n), fused with log-softmax: backward writes the
// logits' gradient without another (n, v) buffer.
func (tp *Tape) CrossEntropy(logits, targets *Tensor, o CrossEntropyOptions) *Tensor {
	logits = tp.Contiguous(logits)
	n, v := rowsCols(logits)
	cfg := CrossEntropyConfig{N: n, V: v, LabelSmoothing: o.LabelSmoothing, IgnoreIndex: -1}
	targets = targets.Contiguous()
	losses, lse := tp.empty(logits.dev, n), tp.empty(logits.dev, n)
	be := backendFor(logits, targets, o.LossMask)
	be.CrossEntropyForward(losses, lse, logits, targets, cfg)
	w := tp.empty(logits.dev, n)
	out := tp.empty(logits.dev, 1)
	// den (Σ mask, float64 bits) stays on the device for the backward's
	// scale: the forward reads nothing back.
	den := emptyOn(logits.dev, Int64, 1)
	be.LossMaskMean(out, w, den, losses, o.LossMask)
	if tp.recording(logits) {
		tp.record("cross_entropy", func(tp *Tape) {
			be.LossMaskScale(w, tp.grad(out), den)
			// The kernel overwrites: give it a fresh buffer that becomes the
			// gradient (no zeroing, no second (n, v) buffer).
			tmp := tp.empty(logits.dev, logits.shape...)
			be.CrossEntropyBackward(tmp, logits, lse, targets, w, cfg)
			tp.addGrad(logits, tmp)
		}, out)
	}
	return out
}
