package tensor

import "sync/atomic"

// Attention by head chunks: an attention call run as several calls on
// consecutive heads, each on dense copies of its heads' q, k, v (and out,
// lse, the gradients), the results copied back. Every head's attention is
// independent of the others', and the dropout masks are keyed by the global
// head (AttentionConfig.FirstHead), so the chunks compute what the whole
// call does. The CUDA backend uses it for head dimensions above its flash
// kernels' limit (multi-latent attention's q·k heads of 192 channels) when
// a batch row's scores exceed the materialized path's limit: chunks of
// heads whose scores fit take the materialized path
// (cuda_backend_attnmat.go), which has no head-dimension limit. Built, not
// yet run on a GPU: on only while SetCUDAAttentionHeadChunks is (OpenCUDA:
// GOTRON_CUDA_UNVERIFIED naming mla); the CPU backend's tests run the same
// code against its whole calls (TestAttentionHeadChunksMatchWholeCall).

// cudaAttnHeadChunks selects the head-chunked path (SetCUDAAttentionHeadChunks).
var cudaAttnHeadChunks atomic.Bool

// SetCUDAAttentionHeadChunks turns on (or off) the CUDA backend's attention
// by head chunks for head dimensions above its flash kernels' limit, and
// returns the previous setting. Off by default: OpenCUDA turns it on when
// GOTRON_CUDA_UNVERIFIED is 1 or names mla (CUDAUnverified), as it has not
// yet run on a GPU; off, such a call whose scores do not fit the
// materialized path panics naming the limit.
func SetCUDAAttentionHeadChunks(on bool) bool { return cudaAttnHeadChunks.Swap(on) }

// attnByHeads is the query heads per chunk when the CUDA backend runs cfg
// by head chunks, else 0: a head dimension above the flash kernels', scores
// of a batch row beyond the materialized limit, a whole-sequence call (the
// block attention of context parallelism stays on its own paths), and the
// path on (SetCUDAAttentionHeadChunks).
func attnByHeads(cfg AttentionConfig) int {
	if !cudaAttnHeadChunks.Load() || cfg.D <= attnMaxHeadDim || attnmatChunk(cfg) > 0 || cfg.QPos != 0 || cfg.KPos != 0 || cfg.Accumulate {
		return 0
	}
	return attnHeadChunk(cfg, attnMaterializedMaxBytes.Load())
}

// attnHeadChunk is how many query heads a chunk of cfg holds so that one
// batch row's float32 scores (heads·T²·4 bytes) fit in limit bytes: the
// largest multiple of the group size HQ/HKV (a chunk holds whole
// key-value heads) that fits, at most HQ; 0 when not even one group fits.
func attnHeadChunk(cfg AttentionConfig, limit int64) int {
	if cfg.HKV <= 0 || cfg.HQ <= 0 || cfg.T <= 0 || limit <= 0 {
		return 0
	}
	rep := cfg.HQ / cfg.HKV
	perHead := int64(cfg.T) * int64(cfg.T) * 4
	fit := limit / perHead // heads
	hc := int(min(fit, int64(cfg.HQ))) / rep * rep
	return hc
}

// headView is the view of heads [h0, h0+n) of t, a dense (B, T, H, D)
// tensor (q, k, v, out and their gradients: dim 2) or (B, H, T) (lse: dim
// 1).
func headView(t *Tensor, dim, h0, n int) *Tensor {
	shape := append([]int(nil), t.shape...)
	strides := make([]int, len(shape))
	s := 1
	for i := len(shape) - 1; i >= 0; i-- {
		strides[i] = s
		s *= shape[i]
	}
	offset := t.offset + h0*strides[dim]
	shape[dim] = n
	return t.view(shape, strides, offset)
}

// headCopy returns a dense copy on t's device of heads [h0, h0+n) of t.
func headCopy(be Backend, t *Tensor, dim, h0, n int) *Tensor {
	v := headView(t, dim, h0, n)
	c := emptyOn(t.dev, t.dtype, v.shape...)
	be.CopyStrided(c, v)
	return c
}

// headPut copies c, a dense copy of heads [h0, h0+n) of t, back into t.
func headPut(be Backend, t, c *Tensor, dim, h0, n int) {
	be.CopyStrided(headView(t, dim, h0, n), c)
}

// freeScratch releases a temporary's device memory now (CUDA), instead of
// when the collector finds it.
func freeScratch(ts ...*Tensor) {
	for _, t := range ts {
		if t.dbuf != nil {
			t.dbuf.free()
		}
	}
}

// headChunk is the part of cfg with query heads [h0, h0+n): its key-value
// heads are [h0/rep, (h0+n)/rep), its global first head FirstHead+h0.
func headChunk(cfg AttentionConfig, h0, n int) AttentionConfig {
	rep := cfg.HQ / cfg.HKV
	c := cfg
	c.HQ, c.HKV, c.FirstHead = n, n/rep, cfg.FirstHead+h0
	return c
}

// attentionForwardByHeads is be.AttentionForward of cfg run hc query heads
// at a time (hc a multiple of HQ/HKV).
func attentionForwardByHeads(be Backend, out, lse, q, k, v *Tensor, cfg AttentionConfig, hc int) {
	rep := cfg.HQ / cfg.HKV
	for h0 := 0; h0 < cfg.HQ; h0 += hc {
		n := min(hc, cfg.HQ-h0)
		c := headChunk(cfg, h0, n)
		qc, kc, vc := headCopy(be, q, 2, h0, n), headCopy(be, k, 2, h0/rep, n/rep), headCopy(be, v, 2, h0/rep, n/rep)
		var oc, lc *Tensor
		if cfg.Accumulate { // the partial result the call merges into
			oc, lc = headCopy(be, out, 2, h0, n), headCopy(be, lse, 1, h0, n)
		} else {
			oc, lc = emptyOn(out.dev, out.dtype, cfg.B, cfg.T, n, cfg.D), emptyOn(lse.dev, lse.dtype, cfg.B, n, cfg.T)
		}
		be.AttentionForward(oc, lc, qc, kc, vc, c)
		headPut(be, out, oc, 2, h0, n)
		headPut(be, lse, lc, 1, h0, n)
		freeScratch(qc, kc, vc, oc, lc)
	}
}

// attentionBackwardByHeads is be.AttentionBackward of cfg run hc query
// heads at a time: each chunk's gradients are copied out, accumulated into
// and copied back (the call adds into dq, dk, dv).
func attentionBackwardByHeads(be Backend, dq, dk, dv, dout, q, k, v, out, lse *Tensor, cfg AttentionConfig, hc int) {
	rep := cfg.HQ / cfg.HKV
	for h0 := 0; h0 < cfg.HQ; h0 += hc {
		n := min(hc, cfg.HQ-h0)
		c := headChunk(cfg, h0, n)
		g0, gn := h0/rep, n/rep
		qc, kc, vc := headCopy(be, q, 2, h0, n), headCopy(be, k, 2, g0, gn), headCopy(be, v, 2, g0, gn)
		oc, lc, doc := headCopy(be, out, 2, h0, n), headCopy(be, lse, 1, h0, n), headCopy(be, dout, 2, h0, n)
		dqc, dkc, dvc := headCopy(be, dq, 2, h0, n), headCopy(be, dk, 2, g0, gn), headCopy(be, dv, 2, g0, gn)
		be.AttentionBackward(dqc, dkc, dvc, doc, qc, kc, vc, oc, lc, c)
		headPut(be, dq, dqc, 2, h0, n)
		headPut(be, dk, dkc, 2, g0, gn)
		headPut(be, dv, dvc, 2, g0, gn)
		freeScratch(qc, kc, vc, oc, lc, doc, dqc, dkc, dvc)
	}
}
