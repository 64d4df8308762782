package tensor

import "sync/atomic"

// The CUDA backend's fused elementwise ops (ops_fused.go): fused.cu's
// kernels, built but not yet run on a GPU, so used only while
// SetCUDAFusedKernels is on; otherwise each method runs the chain of
// verified kernels it replaces (Add, the activation, DropoutMask and Mul)
// through a scratch buffer.

// cudaFusedKernels selects fused.cu's kernels (SetCUDAFusedKernels).
var cudaFusedKernels atomic.Bool

// SetCUDAFusedKernels turns on (or off) the CUDA backend's fused
// bias-activation, bias-dropout-add and bias-dropout-add + norm kernels, and returns the previous
// setting. Off by default: OpenCUDA turns it on when
// GOTRON_CUDA_UNVERIFIED is 1 or names fusion (CUDAUnverified), as they
// have not yet run on a GPU; off, the fused ops run the unfused kernels.
func SetCUDAFusedKernels(on bool) bool { return cudaFusedKernels.Swap(on) }

func (be cudaBackend) BiasGELUForward(out, y, b *Tensor, tanh bool) {
	if !cudaFusedKernels.Load() {
		be.Add(out, y, b)
		be.GELUForward(out, out, tanh) // elementwise: in place is safe
		return
	}
	be.launch1D(biasGELUKernel(tanh, "fwd"), y.Numel(), biasGELUArgs(be.ptr(out), 0, be.ptr(y), be.ptr(b), y.Numel(), b.Numel())...)
}

func (be cudaBackend) BiasGELUBackward(dy, dout, y, b *Tensor, tanh bool) {
	if !cudaFusedKernels.Load() {
		t := be.empty(Float32, y.shape...)
		be.Add(t, y, b)
		be.GELUBackward(dy, dout, t, tanh)
		return
	}
	be.launch1D(biasGELUKernel(tanh, "bwd"), y.Numel(), biasGELUArgs(be.ptr(dy), be.ptr(dout), be.ptr(y), be.ptr(b), y.Numel(), b.Numel())...)
}

func (be cudaBackend) BiasSwiGLUForward(out, y, b *Tensor) {
	if !cudaFusedKernels.Load() {
		t := be.empty(Float32, y.shape...)
		be.Add(t, y, b)
		be.SwiGLUForward(out, t)
		return
	}
	n, c := rowsCols(y)
	be.launch1D("fused_bias_swiglu_fwd_f32", n*(c/2), biasGELUArgs(be.ptr(out), 0, be.ptr(y), be.ptr(b), n*(c/2), c/2)...)
}

func (be cudaBackend) BiasSwiGLUBackward(dy, dout, y, b *Tensor) {
	if !cudaFusedKernels.Load() {
		t := be.empty(Float32, y.shape...)
		be.Add(t, y, b)
		be.SwiGLUBackward(dy, dout, t)
		return
	}
	n, c := rowsCols(y)
	be.launch1D("fused_bias_swiglu_bwd_f32", n*(c/2), biasGELUArgs(be.ptr(dy), be.ptr(dout), be.ptr(y), be.ptr(b), n*(c/2), c/2)...)
}

// biasGELUKernel names fused.cu's bias-GELU kernel of the formula and pass.
func biasGELUKernel(tanh bool, pass string) string {
	if tanh {
		return "fused_bias_gelu_tanh_" + pass + "_f32"
	}
	return "fused_bias_gelu_erf_" + pass + "_f32"
}

// The launch arguments of fused.cu's kernels, in their parameter order
// (TestFusedArgsMatchPTX checks them against the PTX without a GPU).
//
// biasGELUArgs serves the bias-GELU and bias-SwiGLU kernels: the output
// (forward) or dy and dout (backward: dout non-zero), y, b, the elements
// and the bias's columns (SwiGLU: f).
func biasGELUArgs(out, dout, y, b uintptr, n, c int) []any {
	if dout == 0 {
		return []any{out, y, b, int64(n), int64(c)}
	}
	return []any{out, dout, y, b, int64(n), int64(c)}
}

func biasDropoutAddArgs(out, residual, y, b uintptr, n, c int, p float32, rng RNGState) []any {
	thr, keep := dropoutParams(p)
	dropout := int32(0)
	if p != 0 {
		dropout = 1
	}
	return []any{out, residual, y, b, int64(n), int64(c), dropout, rng.Key[0], rng.Key[1], rng.Offset, thr, keep}
}

func dropoutBackwardArgs(dy, dout uintptr, n int, p float32, rng RNGState) []any {
	thr, keep := dropoutParams(p)
	return []any{dy, dout, int64(n), rng.Key[0], rng.Key[1], rng.Offset, thr, keep}
}

// dropoutParams are DropoutMask's threshold and keep scale, computed as
// RNG.DropoutMask computes them.
func dropoutParams(p float32) (thr uint32, keep float32) {
	return uint32(float64(p) * (1 << 32)), 1 / (1 - p)
}

// BiasDropoutAddForward keeps no bits: DropoutBackward draws the mask again.
func (be cudaBackend) BiasDropoutAddForward(out, _, residual, y, b *Tensor, p float32, rng RNGState) {
	n := y.Numel()
	if !cudaFusedKernels.Load() || p >= 1 {
		t := be.empty(Float32, y.shape...)
		if b != nil {
			be.Add(t, y, b)
		} else {
			be.CopyStrided(t, y)
		}
		if p != 0 {
			mask := be.empty(Float32, y.shape...)
			be.DropoutMask(mask, p, rng)
			be.Mul(t, t, mask)
		}
		be.Add(out, residual, t)
		return
	}
	c := 1
	if b != nil {
		c = b.Numel()
	}
	be.launch1D("fused_bias_dropout_add_f32", (n+3)/4, biasDropoutAddArgs(be.ptr(out), be.ptr(residual), be.ptr(y), be.ptr(b), n, c, p, rng)...)
}

func (be cudaBackend) DropoutBackward(dy, dout, _ *Tensor, p float32, rng RNGState) {
	n := dy.Numel()
	if !cudaFusedKernels.Load() || p >= 1 {
		mask := be.empty(Float32, dy.shape...)
		be.DropoutMask(mask, p, rng)
		t := be.empty(Float32, dy.shape...)
		be.Mul(t, dout, mask)
		be.Axpy(dy, 1, t)
		return
	}
	be.launch1D("fused_dropout_bwd_f32", (n+3)/4, dropoutBackwardArgs(be.ptr(dy), be.ptr(dout), n, p, rng)...)
}

// addNormMaxCols is the widest row fused_bias_dropout_add_norm_f32 keeps in
// shared memory without raising the kernel's limit (48 KiB, less its 32
// float64 reduction slots); wider rows run the two ops' kernels.
const addNormMaxCols = (48<<10 - 32*8) / 4

// BiasDropoutAddNormForward runs fused.cu's kernel under
// SetCUDAFusedKernels, else (or for p >= 1, or rows wider than
// addNormMaxCols) BiasDropoutAddForward then the norm's kernel.
func (be cudaBackend) BiasDropoutAddNormForward(sum, out, keep, mean, rstd, residual, y, b, w, nb *Tensor, p float32, rng RNGState, eps float32) {
	n, c := rowsCols(y)
	if addNormApart(p, c) {
		be.BiasDropoutAddForward(sum, keep, residual, y, b, p, rng)
		if mean == nil {
			be.RMSNormForward(out, rstd, sum, w, eps)
		} else {
			be.LayerNormForward(out, mean, rstd, sum, w, nb, eps)
		}
		return
	}
	if n <= 0 || c <= 0 {
		return
	}
	be.launch("fused_bias_dropout_add_norm_f32", [3]int{min(n, normRowBlocks), 1, 1}, [3]int{normRowThreads(c), 1, 1}, c*4,
		biasDropoutAddNormArgs(be.ptr(sum), be.ptr(out), be.ptr(mean), be.ptr(rstd), be.ptr(residual), be.ptr(y), be.ptr(b),
			be.ptr(w), be.ptr(nb), n, c, p, rng, eps)...)
}

// BiasDropoutAddNormForwardBF16 is BiasDropoutAddNormForward that also
// writes out rounded to bfloat16 into out16 (bf16NormForward, under
// gemm-bf16): where the add and the norm run apart, the norm's kernel
// writes it (norm.cu's _bf16 kernels); fused.cu's kernel writes none, so
// a conversion follows it (as Linear's cast would).
func (be cudaBackend) BiasDropoutAddNormForwardBF16(sum, out, out16, keep, mean, rstd, residual, y, b, w, nb *Tensor, p float32, rng RNGState, eps float32) {
	if _, c := rowsCols(y); addNormApart(p, c) {
		be.BiasDropoutAddForward(sum, keep, residual, y, b, p, rng)
		if mean == nil {
			be.RMSNormForwardBF16(out, out16, rstd, sum, w, eps)
		} else {
			be.LayerNormForwardBF16(out, out16, mean, rstd, sum, w, nb, eps)
		}
		return
	}
	be.BiasDropoutAddNormForward(sum, out, keep, mean, rstd, residual, y, b, w, nb, p, rng, eps)
	be.Convert(out16, out)
}

// addNormApart reports whether BiasDropoutAddNormForward runs the add and
// the norm's kernel apart for dropout p and rows of c: without the fused
// kernels, or where fused.cu's cannot take them.
func addNormApart(p float32, c int) bool {
	return !cudaFusedKernels.Load() || p >= 1 || c > addNormMaxCols
}

// biasDropoutAddNormArgs are fused_bias_dropout_add_norm_f32's arguments
// (mean 0: RMSNorm; b, nb 0: none).
func biasDropoutAddNormArgs(sum, out, mean, rstd, residual, y, b, w, nb uintptr, n, c int, p float32, rng RNGState, eps float32) []any {
	thr, keep := dropoutParams(p)
	dropout := int32(0)
	if p != 0 {
		dropout = 1
	}
	return []any{sum, out, mean, rstd, residual, y, b, w, nb, int64(n), int64(c), dropout, rng.Key[0], rng.Key[1], rng.Offset, thr, keep, eps}
}
