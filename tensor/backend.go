package tensor

import "github.com/gotron/gotron/internal/cpu"

// Transpose says whether a matmul operand is used transposed.
type Transpose = cpu.Transpose

// Operand transposition for MatMul.
const (
	NoTrans = cpu.NoTrans
	Trans   = cpu.Trans
)

// AttentionConfig is one fused attention call: q (B, T, HQ, D) over k, v
// (B, T, HKV, D), HQ a multiple of HKV (grouped-query attention).
type AttentionConfig struct {
	B, T, HQ, HKV, D int
	// Scale multiplies q·k; 0 means 1/sqrt(D).
	Scale float32
	// Causal lets query i attend to keys j <= i only.
	Causal bool
	// DocIDs, if non-nil, is an int32 (B, T) tensor: token i attends to
	// token j only within its document (Megatron's --reset-attention-mask).
	DocIDs *Tensor
	// Dropout drops each probability (after the softmax, before the product
	// with v) with this probability, scaling the kept ones by 1/(1-Dropout);
	// the masks are a function of (DropoutSeed, batch row, global head
	// FirstHead+h, query, key), so backward regenerates them and they do
	// not depend on threads, tiling or the tensor-parallel split.
	Dropout     float32
	DropoutSeed uint64
	// FirstHead is the global index of q's head 0.
	FirstHead int
	// QPos and KPos are the sequence positions of q's and k's row 0 (0 for
	// a whole sequence): the causal mask and the dropout keys use
	// positions, so one block of a longer sequence attends exactly as the
	// whole sequence does (context parallelism). Not with DocIDs.
	QPos, KPos int
	// Accumulate merges this call's keys into the partial result already in
	// out and lse (normalised output and log-sum-exp over other keys; lse
	// -Inf where there are none) instead of overwriting them.
	Accumulate bool
	// Precision is the arithmetic of the products of the CUDA backend's
	// materialized attention (the tape's MatmulPrecision: bf16 or fp16
	// operands, float32 accumulation), used there only while
	// SetCUDAAttentionReducedPrecision is on (GOTRON_CUDA_UNVERIFIED=1 or attn-bf16 at
	// OpenCUDA): it has not run on a GPU yet. MatmulBF16 also selects the
	// CUDA backend's tensor-core flash attention while
	// SetCUDAAttentionTensorCores is on (flash-tc; not run on a GPU yet
	// either). The CPU backend and the CUDA float32 flash kernels compute
	// attention in float32 whatever it says.
	Precision MatmulPrecision
}

// CrossEntropyConfig is one fused softmax cross-entropy call over logits
// (N, V).
type CrossEntropyConfig struct {
	N, V int
	// LabelSmoothing s in [0, 1): loss = (1-s)·nll + s·mean_j(-log p_j),
	// as torch's F.cross_entropy(label_smoothing=s).
	LabelSmoothing float32
	// IgnoreIndex, when non-zero, marks rows whose target equals it: loss
	// and gradient 0 (-1 for Megatron-style loss masks).
	IgnoreIndex int32
}

// MatmulPrecision is the arithmetic of matrix products (a Tape setting, like
// a PyTorch autocast region). Every other op computes in float32.
type MatmulPrecision int

const (
	// MatmulFP32 multiplies float32 by float32 (the zero value).
	MatmulFP32 MatmulPrecision = iota
	// MatmulBF16 rounds both operands to bfloat16 and accumulates the
	// products in float32; the result stays float32. This is the matmul of
	// Megatron's --bf16 (and of torch.autocast(dtype=torch.bfloat16)); the
	// CPU runs it on AVX512_BF16 where present (internal/cpu.SgemmBF16).
	MatmulBF16
	// MatmulFP16 rounds both operands to IEEE half precision (values beyond
	// ±65504 become ±Inf, as in fp16 hardware) and accumulates in float32:
	// Megatron's --fp16 matmul. No CPU here multiplies fp16 natively, so it
	// is emulated (rounded copies, then the float32 kernel): the numerics of
	// fp16 training, not its speed.
	MatmulFP16
)

// String returns "fp32", "bf16" or "fp16".
func (p MatmulPrecision) String() string {
	switch p {
	case MatmulBF16:
		return "bf16"
	case MatmulFP16:
		return "fp16"
	}
	return "fp32"
}

// Backend is the device-neutral kernel boundary: the ops of this package
// reach arithmetic and device memory through it (what package tensor
// still does on host storage is listed in docs/design/compute.md,
// "Devices"). Arguments are tensors (which carry their storage),
// so a device backend receives device buffers; shapes are checked by the
// ops before the call. Backward kernels accumulate (+=) into input and
// parameter gradients unless stated otherwise.
//
// The CPU backend (cpuBackend, CPUBackend) forwards to internal/cpu; the
// simulated device's (simBackend, SimBackend) runs the same kernels. A CUDA
// backend would implement the same methods over device storage (see
// docs/design/compute.md); tensor/backendtest checks an implementation.
type Backend interface {
	// Name is the backend's name ("cpu", "sim").
	Name() string
	// Device is the device whose storage the backend computes on: its
	// methods take (and AllocCommitted, PackWeight return) tensors there.
	Device() Device
	// Gemm: c = alpha*op(a)*op(b) + beta*c on the last two dims, batched
	// over the leading dims (equal for a, b and c), in the arithmetic prec
	// names. All contiguous; a and b float32, or both bfloat16 under
	// MatmulBF16 (operands already rounded: the same numbers as their
	// float32 sources; bf16_operands.go), c float32.
	Gemm(prec MatmulPrecision, tA, tB Transpose, alpha float32, a, b *Tensor, beta float32, c *Tensor)
	LayerNormForward(out, mean, rstd, x, w, b *Tensor, eps float32)
	LayerNormBackward(dx, dw, db, dout, x, w, mean, rstd *Tensor)
	RMSNormForward(out, rstd, x, w *Tensor, eps float32)
	RMSNormBackward(dx, dw, dout, x, w, rstd *Tensor)
	GELUForward(out, x *Tensor, tanh bool)
	GELUBackward(dx, dout, x *Tensor, tanh bool)
	SiLUForward(out, x *Tensor)
	SiLUBackward(dx, dout, x *Tensor)
	// SquaredReLUForward is relu(x)² (Megatron's --squared-relu);
	// SquaredReLUBackward adds dout·2·relu(x) into dx.
	SquaredReLUForward(out, x *Tensor)
	SquaredReLUBackward(dx, dout, x *Tensor)
	SwiGLUForward(out, x *Tensor)
	SwiGLUBackward(dx, dout, x *Tensor)
	SoftmaxForward(out, x *Tensor)
	SoftmaxBackward(dx, dout, out *Tensor)
	// RoPEForward rotates x (b, t, h, d) into out by the positions (int32
	// (b, t), or nil for 0..t-1); RoPEBackward adds the inverse rotation of
	// dout into dx.
	RoPEForward(r *RoPE, out, x *Tensor, positions *Tensor)
	RoPEBackward(r *RoPE, dx, dout *Tensor, positions *Tensor)
	// AttentionForward writes the attention of q over k, v into out and the
	// log-sum-exp of each query's scores into lse (b, hq, t), which
	// AttentionBackward reads.
	AttentionForward(out, lse, q, k, v *Tensor, cfg AttentionConfig)
	AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse *Tensor, cfg AttentionConfig)
	// CrossEntropyForward writes each row's loss and log-sum-exp;
	// CrossEntropyBackward overwrites dlogits (it may alias logits) with the
	// gradient for per-row loss gradients dlosses.
	CrossEntropyForward(losses, lse, logits, targets *Tensor, cfg CrossEntropyConfig)
	CrossEntropyBackward(dlogits, logits, lse, targets, dlosses *Tensor, cfg CrossEntropyConfig)
	EmbeddingForward(out, table, ids *Tensor)
	EmbeddingBackward(dtable, dout, ids *Tensor)
	// Elementwise: out = a op b with b broadcast along a's leading dims when
	// it has fewer elements (b's elements repeat every b.Numel()).
	Add(out, a, b *Tensor)
	Mul(out, a, b *Tensor)
	Axpy(y *Tensor, alpha float32, x *Tensor)
	Scale(out *Tensor, alpha float32, x *Tensor)
	// SumRows adds the rows of x (n, c) into out (c).
	SumRows(out, x *Tensor)

	// Fused elementwise ops (ops_fused.go), each the chain it replaces in
	// one pass, with the same float32 rounding. b is a bias (c) over the
	// rows of y (n, c).
	//
	// BiasGELUForward: out = GELU(y + b) (tanh: the approximation);
	// BiasGELUBackward adds dout·GELU'(y + b) into dy.
	BiasGELUForward(out, y, b *Tensor, tanh bool)
	BiasGELUBackward(dy, dout, y, b *Tensor, tanh bool)
	// BiasSwiGLUForward: out (n, f) = SwiGLU(y + b) for y (n, 2f);
	// BiasSwiGLUBackward adds its gradient for y into dy.
	BiasSwiGLUForward(out, y, b *Tensor)
	BiasSwiGLUBackward(dy, dout, y, b *Tensor)
	// BiasDropoutAddForward: out = residual + (y + b)·mask (b may be nil),
	// the mask DropoutMask's at rng (none when p is 0), kept as one bit
	// per element in keep ((n+31)/32 float32 slots; nil when p is 0) or
	// not at all: DropoutBackward adds dout·mask into dy from those bits,
	// or from the mask drawn again (the CUDA kernels: drawing is cheaper
	// there than memory).
	BiasDropoutAddForward(out, keep, residual, y, b *Tensor, p float32, rng RNGState)
	DropoutBackward(dy, dout, keep *Tensor, p float32, rng RNGState)
	// BiasDropoutAddNormForward: sum as BiasDropoutAddForward's out, and
	// out the norm of sum's rows — LayerNormForward's with weight w and
	// bias nb (nil: none) and its mean and rstd, or RMSNormForward's when
	// mean is nil. The backward is the norm's and DropoutBackward.
	BiasDropoutAddNormForward(sum, out, keep, mean, rstd, residual, y, b, w, nb *Tensor, p float32, rng RNGState, eps float32)

	// Decoding (decode_ops.go: the exported ops check shapes, then call
	// these). Inference only: nothing here records or computes gradients.
	//
	// AllocCommitted returns a zeroed tensor whose memory is committed
	// (backed) now: a long-lived pool such as the paged KV cache.
	AllocCommitted(dtype DType, shape []int) *Tensor
	// PagedKVWrite copies the rows of k and v (rows, groups, head dim) into
	// the paged pools (blocks, groups, block positions, head dim) at the
	// int32 slots (rows): block slot/B, offset slot mod B.
	PagedKVWrite(kPool, vPool, k, v, slots *Tensor)
	// PagedAttention overwrites out (rows, heads, head dim) with each query
	// row's causal attention over its sequence's positions in the paged
	// pools, in PagedAttention's fixed arithmetic (bit for bit).
	PagedAttention(out, q, kPool, vPool *Tensor, cfg PagedAttentionConfig)
	// PackWeight prepares w (out, in) for PackedLinear, stored in dtype
	// (Float32 or BFloat16).
	PackWeight(w *Tensor, dtype DType) *PackedWeight
	// PackedLinear overwrites out (rows, out) with x (rows, in)·wᵀ (+ b,
	// added to the rounded product, when b is not nil).
	PackedLinear(out, x *Tensor, w *PackedWeight, b *Tensor)
	// SampleTokens draws a token per TokenSampling from its logits row
	// (its first vocab columns) into out.IDs, with the log-probabilities
	// asked for (sampling_ops.go).
	SampleTokens(out SampledTokens, logits *Tensor, vocab int, draws []TokenSampling)
	// TokenLogprobs writes each row's log-probability of its target token
	// (log-softmax over the first vocab columns) into out.
	TokenLogprobs(out, logits, targets *Tensor, vocab int)

	// Optimizer and gradient-statistics ops on tensor lists (optim_ops.go:
	// the exported functions check that the lists match, then call these;
	// cpu_backend_optim.go is the CPU's). They update in place; SumSquares
	// and NonFinite write their result into a one-element tensor on the
	// device (a step reads several back in one copy, ReadBack), MaxAbs
	// returns it as a host scalar.
	AdamW(params, grads, expAvg, expAvgSq *TensorList, coeffs []AdamWCoeffs)
	// SGD: momentum is nil without a momentum buffer.
	SGD(params, grads, momentum *TensorList, coeffs []SGDCoeffs)
	ScaleList(l *TensorList, alpha float32)
	// SumSquares writes SumSquares(l)'s float64 bits into out, an Int64
	// (1) tensor.
	SumSquares(out *Tensor, l *TensorList)
	MaxAbs(l *TensorList) float64
	// NonFinite writes 1 into the Int32 (1) out when an element of l is
	// NaN or ±Inf, else 0.
	NonFinite(out *Tensor, l *TensorList)
	// Vocab-parallel embedding and cross-entropy, one rank's share
	// (vocab_ops.go, cpu_backend_vocab.go).
	VocabEmbeddingForward(out, table, ids *Tensor, start int)
	VocabEmbeddingBackward(dtable, dout, ids *Tensor, start int)
	RowMax(m, x *Tensor)
	VocabCrossEntropyPartials(partials, x, rowMax, targets *Tensor, start int)
	// VocabCrossEntropyLoss leaves Σ mask's float64 bits in den, an Int64
	// (1) tensor on the device, which VocabCrossEntropyBackward reads.
	VocabCrossEntropyLoss(loss, lse, den, partials, rowMax, mask *Tensor)
	VocabCrossEntropyBackward(dx, x, lse, targets, mask, dloss, den *Tensor, start int)

	// Memory, reductions and the tape's bookkeeping (cpu_backend_tape.go):
	// the copies, clears, gradient accumulation and small reductions the
	// ops, the tape and Copy/Zero run, so that no arithmetic or memory loop
	// of package tensor touches device storage other than through here.
	//
	// Fill sets every element of the contiguous t (any dtype; v converted
	// to it) to v: Zero, zeroed gradient buffers, the backward seed.
	Fill(t *Tensor, v float32)
	// CopyStrided copies src's elements, in row-major order, into dst (same
	// dtype and element count): dst contiguous and src any view, or dst a
	// view of src's shape and src contiguous. Both on the backend's device.
	CopyStrided(dst, src *Tensor)
	// ScatterAddStrided adds the dense float32 g into dst at the positions
	// the view v (of a tensor whose storage has dst's geometry, at v's
	// offset from its base) addresses: the gradient of a strided view.
	ScatterAddStrided(dst, v, g *Tensor)
	// SumAll writes the sum of x's elements (accumulated in float64, in
	// order, rounded once) into out (1).
	SumAll(out, x *Tensor)
	// RowSum writes the float32 sum of each row of x (n, c) into out (n).
	RowSum(out, x *Tensor)
	// RowArgMax writes each row's maximum of x (n, c) into out (n) and its
	// first index into the int32 arg (n).
	RowArgMax(out, arg, x *Tensor)
	// AddRowBroadcast adds g[r] to every element of row r of dx (n, c).
	AddRowBroadcast(dx, g *Tensor)
	// AddAtRowIndex adds g[r] to dx[r, arg[r]] (dx (n, c), int32 arg (n)).
	AddAtRowIndex(dx, arg, g *Tensor)
	// DropoutMask fills mask with 0 (probability p) or 1/(1-p) from the
	// Philox stream at rng, as RNG.DropoutMask does (one block per four
	// elements; the caller advances its RNG).
	DropoutMask(mask *Tensor, p float32, rng RNGState)
	// LossMaskMean writes the per-row weights w (n) (mask's, or 1 when mask
	// is nil), out (1) = Σ w·losses / Σ w (0 when Σ w <= 0), both sums
	// in float64 in row order, and Σ w's float64 bits into den, an Int64
	// (1) tensor on the device (not read back).
	LossMaskMean(out, w, den, losses, mask *Tensor)
	// LossMaskScale scales w by dout[0]/float32(den) (zeroes it when den
	// <= 0), den LossMaskMean's: the per-row loss gradients of LossMaskMean.
	LossMaskScale(w, dout, den *Tensor)
	// Convert writes src's values into dst (contiguous, same element
	// count, another dtype) as Tensor.To converts: float32 ↔ bfloat16 /
	// float16 rounding to nearest even, ints ↔ float32 by value.
	Convert(dst, src *Tensor)
}

// backendFor returns the backend owning the storage of ts (nil entries
// skipped; none means the CPU), panicking when they are on two devices.
func backendFor(ts ...*Tensor) Backend {
	switch sameDevice("op", ts...) {
	case Sim:
		return simBackend{}
	case CUDA:
		return cudaBackend{rt: cudaRT()}
	}
	return cpuBackend{}
}
