package tensor

import (
	"fmt"
	"runtime"
)

// The CUDA backend's LayerNorm, RMSNorm and rotary embeddings:
// internal/cuda/kernels' norm.cu and rope.cu, after internal/cpu's norm.go
// and rope.go. Row statistics are float64 sums in a tree order (the CPU's
// are sequential), so they match within rounding; the weight and bias
// gradients are reduced over rows in two passes (chunks of rows into a
// scratch, then the chunks in order), deterministic and without atomics.
// RoPE is the CPU's bit for bit.

// normRowBlocks caps the blocks of a one-block-per-row kernel (rows loop
// over them): enough to fill a GPU many times over.
const normRowBlocks = 8192

// normRowThreads is the block size for rows of c elements: about four
// elements a thread, a whole number of warps between 1 and 8.
func normRowThreads(c int) int { return min(256, max(32, ((c+3)/4+31)/32*32)) }

// launchNormRows runs a one-block-per-row kernel over n rows of c elements.
func (be cudaBackend) launchNormRows(kernel string, n, c int, args ...any) {
	if n <= 0 || c <= 0 {
		return
	}
	be.launch(kernel, [3]int{min(n, normRowBlocks), 1, 1}, [3]int{normRowThreads(c), 1, 1}, 0, args...)
}

func (be cudaBackend) LayerNormForward(out, mean, rstd, x, w, b *Tensor, eps float32) {
	n, c := rowsCols(x)
	be.launchNormRows("norm_layernorm_fwd_f32", n, c, be.ptr(out), be.ptr(mean), be.ptr(rstd), be.ptr(x),
		be.ptr(w), be.ptr(b), int64(n), int64(c), eps)
}

func (be cudaBackend) LayerNormBackward(dx, dw, db, dout, x, w, mean, rstd *Tensor) {
	n, c := rowsCols(x)
	be.launchNormRows("norm_layernorm_bwd_dx_f32", n, c, be.ptr(dx), be.ptr(dout), be.ptr(x), be.ptr(w),
		be.ptr(mean), be.ptr(rstd), int64(n), int64(c))
	be.normParamGrads(dw, db, dout, x, mean, rstd, n, c)
}

func (be cudaBackend) RMSNormForward(out, rstd, x, w *Tensor, eps float32) {
	n, c := rowsCols(x)
	be.launchNormRows("norm_rmsnorm_fwd_f32", n, c, be.ptr(out), be.ptr(rstd), be.ptr(x), be.ptr(w),
		int64(n), int64(c), eps)
}

func (be cudaBackend) RMSNormBackward(dx, dw, dout, x, w, rstd *Tensor) {
	n, c := rowsCols(x)
	be.launchNormRows("norm_rmsnorm_bwd_dx_f32", n, c, be.ptr(dx), be.ptr(dout), be.ptr(x), be.ptr(w),
		be.ptr(rstd), int64(n), int64(c))
	be.normParamGrads(dw, nil, dout, x, nil, rstd, n, c)
}

// normParamGrads adds Σ_rows dout·(x−mean)·rstd into dw and Σ_rows dout
// into db (when not nil); mean nil is RMSNorm's (x·rstd). Pass 1 sums
// chunks of rows per column into scratches (chunks, c), pass 2 adds the
// chunks in order, so the result does not depend on scheduling.
func (be cudaBackend) normParamGrads(dw, db, dout, x, mean, rstd *Tensor, n, c int) {
	if n == 0 || c == 0 {
		return
	}
	colBlocks := (c + 31) / 32
	chunks := min(max(1, 2048/colBlocks), (n+63)/64)
	rowsPerChunk := (n + chunks - 1) / chunks
	chunks = (n + rowsPerChunk - 1) / rowsPerChunk
	pw := be.empty(Float32, chunks, c)
	var pb *Tensor
	if db != nil {
		pb = be.empty(Float32, chunks, c)
	}
	be.launch("norm_paramgrad_partial_f32", [3]int{colBlocks, chunks, 1}, [3]int{32, 8, 1}, 0,
		be.ptr(pw), be.ptr(pb), be.ptr(dout), be.ptr(x), be.ptr(mean), be.ptr(rstd), int64(n), int64(c), int64(rowsPerChunk))
	be.launch1D("norm_paramgrad_final_f32", c, be.ptr(dw), be.ptr(pw), int64(chunks), int64(c))
	if db != nil {
		be.launch1D("norm_paramgrad_final_f32", c, be.ptr(db), be.ptr(pb), int64(chunks), int64(c))
	}
	runtime.KeepAlive(pw)
	runtime.KeepAlive(pb)
}

func (be cudaBackend) RoPEForward(r *RoPE, out, x *Tensor, positions *Tensor) {
	be.rope(r, out, x, positions, 1, false)
}

func (be cudaBackend) RoPEBackward(r *RoPE, dx, dout *Tensor, positions *Tensor) {
	be.rope(r, dx, dout, positions, -1, true)
}

// rope rotates x (b, t, h, d) by sign·angle into out, overwriting or (acc)
// adding, with the device copies of r's tables (made once per RoPE). The
// host-side checks are the CPU kernel's; a position outside the tables
// (which the CPU panics on) makes its heads NaN, as checking would read
// the positions back.
func (be cudaBackend) rope(r *RoPE, out, x, positions *Tensor, sign float32, acc bool) {
	b, t, h, d := x.Dim(0), x.Dim(1), x.Dim(2), x.Dim(3)
	cfg := r.cfg
	half := cfg.Dim / 2
	if cfg.Dim > d {
		panic(fmt.Sprintf("tensor: RoPE Dim=%d exceeds head size %d", cfg.Dim, d))
	}
	if positions == nil && t > cfg.MaxPositions {
		panic(fmt.Sprintf("tensor: RoPE sequence length %d exceeds MaxPositions=%d", t, cfg.MaxPositions))
	}
	if positions != nil && positions.Numel() < b*t {
		panic(fmt.Sprintf("tensor: RoPE has %d positions, want b*t=%d", positions.Numel(), b*t))
	}
	heads := b * t * h
	if heads == 0 || d == 0 {
		return
	}
	if positions != nil && !positions.IsContiguous() {
		positions = positions.Contiguous()
	}
	cosT := be.constant(r.cos, func() *Tensor { return r.cos })
	sinT := be.constant(r.sin, func() *Tensor { return r.sin })
	interleaved, accumulate := int32(0), int32(0)
	if cfg.Style == Interleaved {
		interleaved = 1
	}
	if acc {
		accumulate = 1
	}
	work := half + d - cfg.Dim // pairs, then copied dimensions
	threads := min(128, max(32, (work+31)/32*32))
	be.launch("rope_apply_f32", [3]int{min(heads, 65535*8), 1, 1}, [3]int{threads, 1, 1}, 0,
		be.ptr(out), be.ptr(x), be.ptr(cosT), be.ptr(sinT), be.ptr(positions), int64(heads), int32(h), int32(t),
		int32(d), int32(half), interleaved, int32(cfg.MaxPositions), sign, accumulate)
	runtime.KeepAlive(positions)
}

// LayerNormForwardBF16 is LayerNormForward that also writes out rounded to
// bfloat16 into out16 (bf16NormForward: norm.cu's
// norm_layernorm_fwd_f32_bf16, under gemm-bf16).
func (be cudaBackend) LayerNormForwardBF16(out, out16, mean, rstd, x, w, b *Tensor, eps float32) {
	n, c := rowsCols(x)
	be.launchNormRows("norm_layernorm_fwd_f32_bf16", n, c, layerNormBF16Args(be.ptr(out), be.ptr(out16), be.ptr(mean), be.ptr(rstd),
		be.ptr(x), be.ptr(w), be.ptr(b), n, c, eps)...)
}

// RMSNormForwardBF16 is RMSNormForward that also writes out16
// (norm_rmsnorm_fwd_f32_bf16).
func (be cudaBackend) RMSNormForwardBF16(out, out16, rstd, x, w *Tensor, eps float32) {
	n, c := rowsCols(x)
	be.launchNormRows("norm_rmsnorm_fwd_f32_bf16", n, c, rmsNormBF16Args(be.ptr(out), be.ptr(out16), be.ptr(rstd),
		be.ptr(x), be.ptr(w), n, c, eps)...)
}

// layerNormBF16Args are norm_layernorm_fwd_f32_bf16's arguments (b 0: none).
func layerNormBF16Args(out, out16, mean, rstd, x, w, b uintptr, n, c int, eps float32) []any {
	return []any{out, out16, mean, rstd, x, w, b, int64(n), int64(c), eps}
}

// rmsNormBF16Args are norm_rmsnorm_fwd_f32_bf16's arguments.
func rmsNormBF16Args(out, out16, rstd, x, w uintptr, n, c int, eps float32) []any {
	return []any{out, out16, rstd, x, w, int64(n), int64(c), eps}
}

var _ bf16NormForward = cudaBackend{}
