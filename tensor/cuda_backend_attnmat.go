package tensor

import (
	"fmt"
	"sync/atomic"

	"github.com/gotron/gotron/internal/cuda"
)

// The CUDA backend's materialized attention: the scores of a call (or of a
// chunk of its batch rows) sit in a (bc, HQ, T, T) float32 buffer, cuBLAS
// computes the products (S = scale·Q·Kᵀ, O = P·V; dP = dO·Vᵀ, dV += P̃ᵀ·dO,
// dQ += dS·K, dK += dSᵀ·Q) and internal/cuda/kernels/attnmat.cu the row-wise
// masks, softmax, lse, dropout and dS. Semantics are the flash kernels' (and
// internal/cpu's), masks bit for bit; sums run in cuBLAS's order.
//
// The GEMMs loop over query heads h (KV head h / (HQ/HKV)) and batch over
// the chunk's batch rows; grouped-query heads accumulate into their KV
// head's dk and dv with beta 1, one head after the other on the stream.
// They compute in attnMaterializedCompute, full float32, unless
// SetCUDAAttentionReducedPrecision is on and AttentionConfig.Precision (the
// tape's matmul precision) asks for bf16 or fp16 operands: then
// cuda.Compute32FFast16BF or Compute32FFast16F (tensor cores, float32
// accumulation; the row kernels stay float32). Built, not yet run on a GPU:
// off by default until TestCUDAAttentionReducedPrecision passes on one.

// attnMaterializedMaxBytes bounds the float32 score buffer of one chunk of
// batch rows (the backward holds two of them); a call whose single batch row
// needs more (HQ·T·T·4 bytes) runs the flash kernels. 0 disables the
// materialized path.
var attnMaterializedMaxBytes atomic.Int64

func init() { attnMaterializedMaxBytes.Store(1 << 30) }

// attnReducedPrecision lets the materialized path honour
// AttentionConfig.Precision (see SetCUDAAttentionReducedPrecision).
var attnReducedPrecision atomic.Bool

// SetCUDAAttentionReducedPrecision turns on (or off) bf16/fp16 products in
// the CUDA backend's materialized attention for calls whose
// AttentionConfig.Precision asks for them (--bf16, --fp16), and returns the
// previous setting. It is off by default, and OpenCUDA turns it on when
// GOTRON_CUDA_UNVERIFIED is 1 or names attn-bf16 (CUDAUnverified): it is built but has not yet run on a GPU.
func SetCUDAAttentionReducedPrecision(on bool) bool { return attnReducedPrecision.Swap(on) }

// attnmatComputeFor is the cuBLAS compute type of cfg's products.
func attnmatComputeFor(cfg AttentionConfig) cuda.ComputeType {
	if attnReducedPrecision.Load() {
		switch cfg.Precision {
		case MatmulBF16:
			return cuda.Compute32FFast16BF
		case MatmulFP16:
			return cuda.Compute32FFast16F
		}
	}
	return attnMaterializedCompute
}

// SetCUDAAttentionScoresLimit sets the bound on one chunk's float32 score
// buffer under which the CUDA backend's attention materializes the scores
// and multiplies with cuBLAS (0: always the flash kernels) and returns the
// previous one. The default is 1 GiB; tests set 0 to check the flash
// kernels too.
func SetCUDAAttentionScoresLimit(bytes int64) int64 { return attnMaterializedMaxBytes.Swap(bytes) }

// attnMaterializedCompute is the cuBLAS compute type of the materialized
// path's products in float32: cuda.Compute32F (within the conformance
// tests' tolerance of the CPU; TF32 would not hold their 2e-4).
const attnMaterializedCompute = cuda.Compute32F

// attnmatChunk returns how many batch rows one chunk of the materialized
// path holds, 0 when it does not apply (use the flash kernels).
func attnmatChunk(cfg AttentionConfig) int {
	per := int64(cfg.HQ) * int64(cfg.T) * int64(cfg.T) * 4
	limit := attnMaterializedMaxBytes.Load()
	if limit <= 0 || per <= 0 || per > limit {
		return 0
	}
	return int(min(int64(cfg.B), limit/per))
}

// attnmatThreads is attnmat.cu's block size (one block per score row).
const attnmatThreads = 256

// attnmatRowBlocks is the grid of a row kernel over rows rows.
func attnmatRowBlocks(rows int) [3]int { return [3]int{min(rows, 1<<30), 1, 1} }

// attnmatGemm runs the row-major product C = alpha·op(A)·op(B) + beta·C of
// batch entries (m×k by k×n), each operand given by its device address,
// its row stride (ld, elements) and its batch stride (elements), as
// cudaBackend.Gemm maps row-major onto cuBLAS's column-major: B goes first
// and the dimensions swap.
func (be cudaBackend) attnmatGemm(compute cuda.ComputeType, tA, tB bool, m, n, k int, alpha float32, a cuda.Ptr, lda int, sa int64,
	bm cuda.Ptr, ldb int, sb int64, beta float32, c cuda.Ptr, ldc int, sc int64, batch int) {
	p := cuda.GemmParams{
		TransA: tB, TransB: tA,
		M: n, N: m, K: k,
		Alpha: alpha, Beta: beta,
		A: bm, AType: cuda.F32, LDA: ldb, StrideA: sb,
		B: a, BType: cuda.F32, LDB: lda, StrideB: sa,
		C: c, CType: cuda.F32, LDC: ldc, StrideC: sc,
		Batch:   batch,
		Compute: compute,
	}
	be.rt.timed("cublas attention gemm", func() {
		if err := be.rt.dev.GemmStridedBatched(p); err != nil {
			panic(fmt.Sprintf("tensor: CUDA attention Gemm %dx%dx%d (batch %d): %v", m, n, k, batch, err))
		}
	})
}

// attnmatView addresses the (T, D) rows of head hd in batch row b of a
// (B, T, H, D) tensor: its address, row stride and batch stride (elements).
type attnmatView struct {
	base    cuda.Ptr
	T, H, D int
}

func attnmatOf(t *Tensor, cfg AttentionConfig, heads int) attnmatView {
	return attnmatView{base: devPtr(t), T: cfg.T, H: heads, D: cfg.D}
}

func (v attnmatView) at(b, hd int) cuda.Ptr {
	return v.base + cuda.Ptr(((int64(b)*int64(v.T)*int64(v.H))+int64(hd))*int64(v.D)*4)
}
func (v attnmatView) ld() int       { return v.H * v.D }
func (v attnmatView) stride() int64 { return int64(v.T) * int64(v.H) * int64(v.D) }

// attnmatForward is AttentionForward on the materialized path, bc batch
// rows per chunk.
func (be cudaBackend) attnmatForward(out, lse, q, k, v *Tensor, cfg AttentionConfig, a cudaAttn, bc int) {
	T, HQ, D := cfg.T, cfg.HQ, cfg.D
	rep := HQ / cfg.HKV
	qv, kv, vv, ov := attnmatOf(q, cfg, HQ), attnmatOf(k, cfg, cfg.HKV), attnmatOf(v, cfg, cfg.HKV), attnmatOf(out, cfg, HQ)
	s := be.empty(Float32, bc, HQ, T, T)
	defer s.dbuf.free()
	sp := devPtr(s)
	tt := int64(T) * int64(T)
	for b0 := 0; b0 < cfg.B; b0 += bc {
		n := min(bc, cfg.B-b0)
		for h := 0; h < HQ; h++ { // S[., h] = scale·Q·Kᵀ
			g := h / rep
			be.attnmatGemm(a.compute, false, true, T, T, D, a.scale, qv.at(b0, h), qv.ld(), qv.stride(),
				kv.at(b0, g), kv.ld(), kv.stride(), 0, sp+cuda.Ptr(int64(h)*tt*4), T, int64(HQ)*tt, n)
		}
		rows := n * HQ * T
		be.launch("attnmat_fwd_f32", attnmatRowBlocks(rows), [3]int{attnmatThreads, 1, 1}, 0,
			attnmatFwdArgs(uintptr(sp), be.ptr(lse), be.ptr(out), a, rows, T, HQ, D, b0)...)
		// Accumulate: the row kernel rescaled out's rows to the merged lse
		beta := float32(a.accum)
		for h := 0; h < HQ; h++ { // O[., h] = P̃·V (+ the rescaled partial result)
			g := h / rep
			be.attnmatGemm(a.compute, false, false, T, D, T, 1, sp+cuda.Ptr(int64(h)*tt*4), T, int64(HQ)*tt,
				vv.at(b0, g), vv.ld(), vv.stride(), beta, ov.at(b0, h), ov.ld(), ov.stride(), n)
		}
	}
}

// attnmatBackward is AttentionBackward on the materialized path: it
// accumulates into dq, dk, dv as the flash kernels and the CPU do.
func (be cudaBackend) attnmatBackward(dq, dk, dv, dout, q, k, v, out, lse *Tensor, cfg AttentionConfig, a cudaAttn, bc int) {
	T, HQ, D := cfg.T, cfg.HQ, cfg.D
	rep := HQ / cfg.HKV
	qv, kv, vv := attnmatOf(q, cfg, HQ), attnmatOf(k, cfg, cfg.HKV), attnmatOf(v, cfg, cfg.HKV)
	dov, dqv, dkv, dvv := attnmatOf(dout, cfg, HQ), attnmatOf(dq, cfg, HQ), attnmatOf(dk, cfg, cfg.HKV), attnmatOf(dv, cfg, cfg.HKV)
	s, dp := be.empty(Float32, bc, HQ, T, T), be.empty(Float32, bc, HQ, T, T)
	defer s.dbuf.free()
	defer dp.dbuf.free()
	sp, dpp := devPtr(s), devPtr(dp)
	tt := int64(T) * int64(T)
	sb := int64(HQ) * tt // batch stride of s and dp
	for b0 := 0; b0 < cfg.B; b0 += bc {
		n := min(bc, cfg.B-b0)
		for h := 0; h < HQ; h++ {
			g := h / rep
			sh, dph := sp+cuda.Ptr(int64(h)*tt*4), dpp+cuda.Ptr(int64(h)*tt*4)
			// S = scale·Q·Kᵀ, dP̃ = dO·Vᵀ
			be.attnmatGemm(a.compute, false, true, T, T, D, a.scale, qv.at(b0, h), qv.ld(), qv.stride(),
				kv.at(b0, g), kv.ld(), kv.stride(), 0, sh, T, sb, n)
			be.attnmatGemm(a.compute, false, true, T, T, D, 1, dov.at(b0, h), dov.ld(), dov.stride(),
				vv.at(b0, g), vv.ld(), vv.stride(), 0, dph, T, sb, n)
		}
		rows := n * HQ * T
		be.launch("attnmat_bwd_f32", attnmatRowBlocks(rows), [3]int{attnmatThreads, 1, 1}, 0,
			attnmatBwdArgs(uintptr(sp), uintptr(dpp), be.ptr(lse), be.ptr(dout), be.ptr(out), a, rows, T, HQ, D, b0)...)
		for h := 0; h < HQ; h++ {
			g := h / rep
			sh, dsh := sp+cuda.Ptr(int64(h)*tt*4), dpp+cuda.Ptr(int64(h)*tt*4)
			// dV += P̃ᵀ·dO (T keys × D, over T queries)
			be.attnmatGemm(a.compute, true, false, T, D, T, 1, sh, T, sb,
				dov.at(b0, h), dov.ld(), dov.stride(), 1, dvv.at(b0, g), dvv.ld(), dvv.stride(), n)
			// dQ += dS·K
			be.attnmatGemm(a.compute, false, false, T, D, T, 1, dsh, T, sb,
				kv.at(b0, g), kv.ld(), kv.stride(), 1, dqv.at(b0, h), dqv.ld(), dqv.stride(), n)
			// dK += dSᵀ·Q
			be.attnmatGemm(a.compute, true, false, T, D, T, 1, dsh, T, sb,
				qv.at(b0, h), qv.ld(), qv.stride(), 1, dkv.at(b0, g), dkv.ld(), dkv.stride(), n)
		}
	}
}

// attnmatFwdArgs and attnmatBwdArgs are the argument lists of attnmat.cu's
// row kernels (TestAttnmatArgsMatchPTX checks them against the embedded
// PTX's parameters, which the driver does not).
func attnmatFwdArgs(s, lse, out uintptr, a cudaAttn, rows, T, HQ, D, b0 int) []any {
	return []any{s, lse, out, a.docs, int64(rows), int32(T), int32(HQ), int32(D), int32(b0), a.causal, a.dropout,
		a.thr, a.dscale, a.seed, a.firstHead, a.qpos, a.kpos, a.accum}
}

func attnmatBwdArgs(s, dp, lse, dout, out uintptr, a cudaAttn, rows, T, HQ, D, b0 int) []any {
	return []any{s, dp, lse, dout, out, a.docs, int64(rows), int32(T), int32(HQ), int32(D), int32(b0),
		a.scale, a.causal, a.dropout, a.thr, a.dscale, a.seed, a.firstHead, a.qpos, a.kpos}
}
