package tensor

import (
	"fmt"
	"unsafe"

	"github.com/gotron/gotron/internal/cuda"
)

// DeepSeek sparse attention's ops on the CUDA backend (dsa_ops.go's
// Hadamard, DSAIndexerTopK, SparseAttention, DSAIndexerTarget and
// AttachIndexerLoss), dsa.cu's kernels between cuBLAS products: the
// indexer's products per chunk of queries (as internal/cpu's
// IndexerScoresGEMM), the attention's and the loss target's per head on
// (T, T) scores, a chunk of heads at a time (as the materialized
// attention's). The selection stays on the device (DSASelection's
// scoresDev, idxDev); the indexer loss's value is read back, one float64 a
// row, once per layer. Built, not yet run on a GPU:
// gpt.Config.CheckDevice refuses --experimental-attention-variant dsa on
// --device cuda unless GOTRON_CUDA_UNVERIFIED names dsa. Without a GPU,
// hostcheck runs the kernels' bodies with host loops for the products
// (TestHostDSA*) and TestDSAArgsMatchPTX checks every launch's arguments.

// dsaChunkFloats bounds the products' scratch: the indexer's chunk of
// queries' products and the attention's chunk of heads' scores (2 of them
// in the backward) stay within it.
const dsaChunkFloats = 1 << 28 // 1 GiB of float32

// dsaQueries is how many queries of the indexer a chunk takes.
func dsaQueries(t, H int) int { return max(1, min(t, dsaChunkFloats/max(1, H*t))) }

// dsaHeads is how many attention heads a chunk of (T, T) scores takes, of
// n, with bufs such buffers live.
func dsaHeads(n, t, bufs int) int { return max(1, min(n, dsaChunkFloats/max(1, bufs*t*t))) }

// dsaGemm is cuBLAS's row-major product on device addresses, float32
// throughout (the CPU's DSA products are float64 dots; no reduced
// precision here).
func (be cudaBackend) dsaGemm(tA, tB bool, m, n, k int, alpha float32, a cuda.Ptr, lda int, b cuda.Ptr, ldb int, beta float32, c cuda.Ptr, ldc int) {
	be.attnmatGemm(cuda.Compute32F, tA, tB, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1)
}

// off is p advanced by n float32s.
func off(p cuda.Ptr, n int) cuda.Ptr { return p + cuda.Ptr(int64(n)*4) }

// cudaHadamard writes the rotation of x's n rows of d into out.
func cudaHadamard(out, x *Tensor, n, d int, scale float64) {
	be := cudaBackend{rt: cudaRT()}
	scratch := be.rt.newBuf(int64(n) * int64(d) * 8)
	defer scratch.free()
	be.launch1D("dsa_hadamard_f32", n, dsaHadamardArgs(be.ptr(out), be.ptr(x), uintptr(scratch.ptr), n, d, scale)...)
}

func dsaHadamardArgs(out, x, scratch uintptr, n, d int, scale float64) []any {
	return []any{out, x, scratch, int64(n), int32(d), scale}
}

// cudaDSAIndexerTopK is DSAIndexerTopK on the GPU: q (b, t, H, D), k (b,
// t, D), w (b, t, H) dense; the scores and the selection stay on the
// device.
func cudaDSAIndexerTopK(q, k, w *Tensor, b, t, H, D, K int, relu bool) *DSASelection {
	be := cudaBackend{rt: cudaRT()}
	s := &DSASelection{B: b, T: t, K: K, scoresDev: be.empty(Float32, b, t, t), idxDev: be.empty(Int32, b, t, K)}
	c := dsaQueries(t, H)
	p := be.empty(Float32, c*H*t)
	defer p.dbuf.free()
	qp, kp, pp, sp := devPtr(q), devPtr(k), devPtr(p), devPtr(s.scoresDev)
	for bi := range b {
		for i0 := 0; i0 < t; i0 += c {
			n := min(c, t-i0)
			be.dsaGemm(false, true, n*H, t, D, 1, off(qp, (bi*t+i0)*H*D), D, off(kp, bi*t*D), D, 0, pp, t)
			be.launch1D("dsa_index_combine_f32", n*t, dsaCombineArgs(uintptr(sp), uintptr(pp), be.ptr(w), n*t, bi, i0, t, H, relu)...)
		}
	}
	// top-k: each batch row's t rows of keys sorted by a bitonic network
	tp := 1
	for tp < t {
		tp *= 2
	}
	keys := be.rt.newBuf(int64(t) * int64(tp) * 8)
	defer keys.free()
	n := t * tp
	for bi := range b {
		be.launch1D("dsa_topk_keys_u64", n, dsaTopKKeysArgs(uintptr(keys.ptr), uintptr(off(sp, bi*t*t)), n, t, tp)...)
		for kk := 2; kk <= tp; kk *= 2 {
			for jj := kk / 2; jj > 0; jj /= 2 {
				be.launch1D("dsa_bitonic_u64", n, dsaBitonicArgs(uintptr(keys.ptr), n, tp, kk, jj)...)
			}
		}
		be.launch1D("dsa_topk_out_i32", t*K, dsaTopKOutArgs(be.ptr(s.idxDev)+uintptr(4*bi*t*K), uintptr(keys.ptr), t*K, tp, K)...)
	}
	return s
}

func dsaCombineArgs(scores, p, w uintptr, n, b, i0, t, H int, relu bool) []any {
	return []any{scores, p, w, int64(n), int32(b), int32(i0), int32(t), int32(H), b2i32(relu)}
}

func dsaTopKKeysArgs(keys, scores uintptr, n, t, tp int) []any {
	return []any{keys, scores, int64(n), int32(t), int32(tp)}
}

func dsaBitonicArgs(keys uintptr, n, tp, k, jj int) []any {
	return []any{keys, int64(n), int32(tp), int32(k), int32(jj)}
}

func dsaTopKOutArgs(idx, keys uintptr, n, tp, K int) []any {
	return []any{idx, keys, int64(n), int32(tp), int32(K)}
}

// dsaAttn addresses the heads of (b, t, n, d) tensors.
type dsaAttn struct {
	t, n int
}

// at is head h of batch row b of a (b, t, n, d) tensor at p: its address
// (rows of d, row stride n·d).
func (a dsaAttn) at(p cuda.Ptr, b, h, d int) cuda.Ptr { return off(p, (b*a.t*a.n+h)*d) }

// cudaSparseAttentionForward writes out (b, t, n, dv) and lse (b, t, n)
// of the attention of q, k (b, t, n, dk) over sel's keys: per batch row
// and chunk of heads, S = scale·q·kᵀ, the rows' softmax over the selected
// keys, out = P·v.
func cudaSparseAttentionForward(out, lse, q, k, v *Tensor, sel *DSASelection, n, dk, dv int, scale float32) {
	be := cudaBackend{rt: cudaRT()}
	t, K := sel.T, sel.K
	hc := dsaHeads(n, t, 1)
	S, pk := be.empty(Float32, hc, t, t), be.empty(Float32, hc, t, K)
	defer S.dbuf.free()
	defer pk.dbuf.free()
	a := dsaAttn{t: t, n: n}
	qp, kp, vp, op, sp := devPtr(q), devPtr(k), devPtr(v), devPtr(out), devPtr(S)
	for bi := range sel.B {
		for h0 := 0; h0 < n; h0 += hc {
			nh := min(hc, n-h0)
			for hh := range nh {
				be.dsaGemm(false, true, t, t, dk, scale, a.at(qp, bi, h0+hh, dk), n*dk, a.at(kp, bi, h0+hh, dk), n*dk, 0, off(sp, hh*t*t), t)
			}
			be.launch1D("dsa_sparse_fwd_f32", nh*t, dsaSparseRowArgs(uintptr(sp), be.ptr(lse), be.ptr(pk), be.ptr(sel.idxDev), nh*t, bi, h0, t, n, K)...)
			for hh := range nh {
				be.dsaGemm(false, false, t, dv, t, 1, off(sp, hh*t*t), t, a.at(vp, bi, h0+hh, dv), n*dv, 0, a.at(op, bi, h0+hh, dv), n*dv)
			}
		}
	}
}

// dsaSparseRowArgs are dsa_sparse_fwd_f32's and dsa_sparse_probs_f32's
// arguments.
func dsaSparseRowArgs(S, lse, pk, idx uintptr, rows, b, h0, t, n, K int) []any {
	return []any{S, lse, pk, idx, int64(rows), int32(b), int32(h0), int32(t), int32(n), int32(K)}
}

// cudaSparseAttentionBackward adds the gradients of dout into dq, dk
// (b, t, n, dk) and dv (b, t, n, dv): per batch row and chunk of heads,
// P again from S and lse, dP = dout·vᵀ, dS = P·(dP - δ)·scale, then
// dv += Pᵀ·dout, dq += dS·k, dk += dSᵀ·q.
func cudaSparseAttentionBackward(dq, dk, dv, dout, q, k, v, out, lse *Tensor, sel *DSASelection, n, dkk, dvv int, scale float32) {
	be := cudaBackend{rt: cudaRT()}
	t, K := sel.T, sel.K
	hc := dsaHeads(n, t, 2)
	S, dP, pk := be.empty(Float32, hc, t, t), be.empty(Float32, hc, t, t), be.empty(Float32, hc, t, K)
	for _, x := range []*Tensor{S, dP, pk} {
		defer x.dbuf.free()
	}
	a := dsaAttn{t: t, n: n}
	qp, kp, vp, gp, sp, dpp := devPtr(q), devPtr(k), devPtr(v), devPtr(dout), devPtr(S), devPtr(dP)
	dqp, dkp, dvp := devPtr(dq), devPtr(dk), devPtr(dv)
	for bi := range sel.B {
		for h0 := 0; h0 < n; h0 += hc {
			nh := min(hc, n-h0)
			for hh := range nh {
				h := h0 + hh
				be.dsaGemm(false, true, t, t, dkk, scale, a.at(qp, bi, h, dkk), n*dkk, a.at(kp, bi, h, dkk), n*dkk, 0, off(sp, hh*t*t), t)
				be.dsaGemm(false, true, t, t, dvv, 1, a.at(gp, bi, h, dvv), n*dvv, a.at(vp, bi, h, dvv), n*dvv, 0, off(dpp, hh*t*t), t)
			}
			be.launch1D("dsa_sparse_probs_f32", nh*t, dsaSparseRowArgs(uintptr(sp), be.ptr(lse), be.ptr(pk), be.ptr(sel.idxDev), nh*t, bi, h0, t, n, K)...)
			be.launch1D("dsa_sparse_ds_f32", nh*t, dsaSparseDSArgs(uintptr(dpp), uintptr(sp), be.ptr(dout), be.ptr(out), nh*t, bi, h0, t, n, dvv, scale)...)
			for hh := range nh {
				h := h0 + hh
				be.dsaGemm(true, false, t, dvv, t, 1, off(sp, hh*t*t), t, a.at(gp, bi, h, dvv), n*dvv, 1, a.at(dvp, bi, h, dvv), n*dvv)
				be.dsaGemm(false, false, t, dkk, t, 1, off(dpp, hh*t*t), t, a.at(kp, bi, h, dkk), n*dkk, 1, a.at(dqp, bi, h, dkk), n*dkk)
				be.dsaGemm(true, false, t, dkk, t, 1, off(dpp, hh*t*t), t, a.at(qp, bi, h, dkk), n*dkk, 1, a.at(dkp, bi, h, dkk), n*dkk)
			}
		}
	}
}

func dsaSparseDSArgs(dP, P, dout, out uintptr, rows, b, h0, t, n, dv int, scale float32) []any {
	return []any{dP, P, dout, out, int64(rows), int32(b), int32(h0), int32(t), int32(n), int32(dv), scale}
}

// cudaDSAIndexerTarget returns the loss target (b, t, t) of q, k (b, t, n,
// dk) on the GPU: per batch row and chunk of heads, S = scale·q·kᵀ and the
// rows' softmax added head by head.
func cudaDSAIndexerTarget(q, k *Tensor, sel *DSASelection, n, dk int, scale float32, sparse bool) *Tensor {
	be := cudaBackend{rt: cudaRT()}
	t := sel.T
	target := be.alloc(Float32, sel.B, t, t)
	hc := dsaHeads(n, t, 1)
	S := be.empty(Float32, hc, t, t)
	defer S.dbuf.free()
	a := dsaAttn{t: t, n: n}
	qp, kp, sp := devPtr(q), devPtr(k), devPtr(S)
	for bi := range sel.B {
		for h0 := 0; h0 < n; h0 += hc {
			nh := min(hc, n-h0)
			for hh := range nh {
				be.dsaGemm(false, true, t, t, dk, scale, a.at(qp, bi, h0+hh, dk), n*dk, a.at(kp, bi, h0+hh, dk), n*dk, 0, off(sp, hh*t*t), t)
			}
			be.launch1D("dsa_target_f32", t, dsaTargetArgs(be.ptr(target), uintptr(sp), be.ptr(sel.idxDev), t, bi, nh, sel.K, sparse)...)
		}
	}
	return target
}

func dsaTargetArgs(target, S, idx uintptr, t, b, hc, K int, sparse bool) []any {
	return []any{target, S, idx, int64(t), int32(b), int32(hc), int32(t), int32(K), b2i32(sparse)}
}

// cudaDSAIndexerLoss is internal/cpu's IndexerLoss on the GPU: it
// normalises target in place, writes the scores' gradient into dlogits
// (b, t, t) and returns the loss (the rows' KL read back and summed in row
// order, as the CPU).
func cudaDSAIndexerLoss(dlogits, target *Tensor, sel *DSASelection, sparse, perToken bool) float64 {
	be := cudaBackend{rt: cudaRT()}
	rows := sel.B * sel.T
	div := float64(rows)
	if perToken {
		div = 1
	}
	rowLoss := be.rt.newBuf(int64(rows) * 8)
	defer rowLoss.free()
	be.launch1D("dsa_loss_f32", rows, dsaLossArgs(be.ptr(dlogits), uintptr(rowLoss.ptr), be.ptr(target), be.ptr(sel.scoresDev), be.ptr(sel.idxDev),
		rows, sel.T, sel.K, sparse, div)...)
	host := make([]float64, rows)
	be.rt.copies.count("DSA indexer loss", true, int64(rows)*8)
	be.rt.timed("copy device to host (DSA indexer loss)", func() {
		if err := be.rt.dev.CopyDtoH(unsafe.Pointer(&host[0]), rowLoss.ptr, int64(rows)*8); err != nil {
			panic(&DeviceError{Err: fmt.Errorf("reading the DSA indexer loss: %w", err)})
		}
	})
	var loss float64
	for _, v := range host {
		loss += v
	}
	return loss / div
}

func dsaLossArgs(dlogits, rowLoss, target, scores, idx uintptr, rows, t, K int, sparse bool, div float64) []any {
	return []any{dlogits, rowLoss, target, scores, idx, int64(rows), int32(t), int32(K), b2i32(sparse), div}
}

// cudaDSAIndexerBackward adds into dq (b, t, H, D), dk (b, t, D) and dw
// (b, t, H) the gradients of the indexer's scores given ds (b, t, t), as
// internal/cpu's IndexerScoresBackwardGEMM: per chunk of queries the
// products again, turned into their gradient, then dq += p·k and dk +=
// pᵀ·q.
func cudaDSAIndexerBackward(dq, dk, dw, ds, q, k, w *Tensor, b, t, H, D int, relu bool) {
	be := cudaBackend{rt: cudaRT()}
	c := dsaQueries(t, H)
	p := be.empty(Float32, c*H*t)
	defer p.dbuf.free()
	qp, kp, pp, dqp, dkp := devPtr(q), devPtr(k), devPtr(p), devPtr(dq), devPtr(dk)
	for bi := range b {
		for i0 := 0; i0 < t; i0 += c {
			n := min(c, t-i0)
			qc := off(qp, (bi*t+i0)*H*D)
			be.dsaGemm(false, true, n*H, t, D, 1, qc, D, off(kp, bi*t*D), D, 0, pp, t)
			be.launch1D("dsa_index_bwd_f32", n*H, dsaIndexBwdArgs(uintptr(pp), be.ptr(dw), be.ptr(ds), be.ptr(w), n*H, bi, i0, t, H, relu)...)
			be.dsaGemm(false, false, n*H, D, t, 1, pp, t, off(kp, bi*t*D), D, 1, off(dqp, (bi*t+i0)*H*D), D)
			be.dsaGemm(true, false, t, D, n*H, 1, pp, t, qc, D, 1, off(dkp, bi*t*D), D)
		}
	}
}

func dsaIndexBwdArgs(p, dw, ds, w uintptr, n, b, i0, t, H int, relu bool) []any {
	return []any{p, dw, ds, w, int64(n), int32(b), int32(i0), int32(t), int32(H), b2i32(relu)}
}
