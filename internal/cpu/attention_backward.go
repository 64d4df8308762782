package cpu

import "math"

// AttentionBackward accumulates the gradients of AttentionForward into dq, dk
// and dv (shapes of q, k, v), with the FlashAttention-2 backward: P is
// recomputed tile by tile from q, k and lse, D_i = rowsum(dout_i*out_i), and
// dS = P*(dP - D_i) with dP = dout·vᵀ. With cfg.Dropout the tile's mask Z
// is regenerated from its key: dV takes P̃ = P*Z, dP is Z*(dout·vᵀ), and
// D_i = Σ_j P̃ dP̃ = dout_i·out_i still holds. No T×T buffer is stored; the
// tile products run through Sgemm.
//
// Schedule: when B*HKV >= 2*Threads(), work is split over (b, kv head): one
// goroutine owns the dk, dv rows of a kv head and the dq rows of the query
// heads sharing it, five tile products per tile. Otherwise (few kv heads, e.g.
// MQA or GQA at batch 1 on many cores) it runs two passes with no shared
// writes: dq over (b, query head, query block), then dk, dv over (b, kv head,
// key block), recomputing P and dP (seven products per tile). Either way
// accumulation needs no atomics and, for a given schedule, results do not
// depend on Threads(); the two schedules agree to float32 rounding, so thread
// counts that pick different schedules can differ in the last bits. Against
// the float64 reference gradients agree to ~1e-6 relative (tests use 2e-5).
func AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse []float32, cfg AttentionConfig) {
	cfg.mustValidate()
	cfg.mustLen(attnBuf{"dq", 'q', dq}, attnBuf{"dk", 'k', dk}, attnBuf{"dv", 'k', dv}, attnBuf{"dout", 'q', dout},
		attnBuf{"q", 'q', q}, attnBuf{"k", 'k', k}, attnBuf{"v", 'k', v}, attnBuf{"out", 'q', out}, attnBuf{"lse", 'l', lse})
	if cfg.B*cfg.HKV >= 2*Threads() {
		attentionBackwardFused(dq, dk, dv, dout, q, k, v, out, lse, &cfg)
		return
	}
	attentionBackwardSplit(dq, dk, dv, dout, q, k, v, out, lse, &cfg)
}

// attnGrads says which gradients a backward tile updates.
type attnGrads int

const (
	gradAll attnGrads = iota // dq, dk and dv
	gradQ                    // dq only
	gradKV                   // dk and dv only
)

// attentionBackwardFused is the one-pass schedule over (b, kv head).
func attentionBackwardFused(dq, dk, dv, dout, q, k, v, out, lse []float32, cfg *AttentionConfig) {
	grp := cfg.HQ / cfg.HKV
	Parallel(cfg.B*cfg.HKV, 1, func(lo, hi int) {
		ws := attnPool.Get().(*attnScratch)
		for idx := lo; idx < hi; idx++ {
			b, g := idx/cfg.HKV, idx%cfg.HKV
			// key blocks outer: a block of k, v, dk, dv stays in cache while
			// every query block that sees it streams past
			for j0 := 0; j0 < cfg.T; j0 += attnBlockK {
				for h := g * grp; h < (g+1)*grp; h++ {
					for i0 := attnFirstQ(cfg, j0); i0 < cfg.T; i0 += attnBlockQ {
						attnBackwardTile(dq, dk, dv, dout, q, k, v, out, lse, cfg, b, h, i0, j0, gradAll, ws)
					}
				}
			}
		}
		attnPool.Put(ws)
	})
}

// attentionBackwardSplit is the two-pass schedule: dq by query block, then dk
// and dv by key block.
func attentionBackwardSplit(dq, dk, dv, dout, q, k, v, out, lse []float32, cfg *AttentionConfig) {
	grp := cfg.HQ / cfg.HKV
	nqb := (cfg.T + attnBlockQ - 1) / attnBlockQ
	Parallel(cfg.B*cfg.HQ*nqb, 1, func(lo, hi int) {
		ws := attnPool.Get().(*attnScratch)
		for idx := lo; idx < hi; idx++ {
			b, h, i0 := idx/(cfg.HQ*nqb), idx/nqb%cfg.HQ, zigzag(idx%nqb, nqb)*attnBlockQ
			jEnd := cfg.T
			if cfg.Causal {
				jEnd = min(i0+attnBlockQ+cfg.QPos-cfg.KPos, cfg.T)
			}
			for j0 := 0; j0 < jEnd; j0 += attnBlockK {
				attnBackwardTile(dq, dk, dv, dout, q, k, v, out, lse, cfg, b, h, i0, j0, gradQ, ws)
			}
		}
		attnPool.Put(ws)
	})
	nkb := (cfg.T + attnBlockK - 1) / attnBlockK
	Parallel(cfg.B*cfg.HKV*nkb, 1, func(lo, hi int) {
		ws := attnPool.Get().(*attnScratch)
		for idx := lo; idx < hi; idx++ {
			b, g, j0 := idx/(cfg.HKV*nkb), idx/nkb%cfg.HKV, zigzag(idx%nkb, nkb)*attnBlockK
			for h := g * grp; h < (g+1)*grp; h++ {
				for i0 := attnFirstQ(cfg, j0); i0 < cfg.T; i0 += attnBlockQ {
					attnBackwardTile(dq, dk, dv, dout, q, k, v, out, lse, cfg, b, h, i0, j0, gradKV, ws)
				}
			}
		}
		attnPool.Put(ws)
	})
}

// attnFirstQ is the first query block that can see key block j0.
func attnFirstQ(cfg *AttentionConfig, j0 int) int {
	if cfg.Causal {
		return max(0, j0-cfg.QPos+cfg.KPos) / attnBlockQ * attnBlockQ
	}
	return 0
}

// attnBackwardTile processes the tile of query rows [i0, i0+64) of head h and
// key rows [j0, j0+64) of its kv head in batch b, updating the gradients
// which says.
func attnBackwardTile(dq, dk, dv, dout, q, k, v, out, lse []float32, cfg *AttentionConfig, b, h, i0, j0 int, which attnGrads, ws *attnScratch) {
	T, D := cfg.T, cfg.D
	qs, kvs := cfg.HQ*D, cfg.HKV*D
	g := h / (cfg.HQ / cfg.HKV)
	scale := cfg.scale()
	nq, nk := min(attnBlockQ, T-i0), min(attnBlockK, T-j0)
	if attnTileEmpty(cfg, b, i0, nq, j0, nk) {
		return
	}
	kvOff, qOff := (b*T+j0)*kvs+g*D, (b*T+i0)*qs+h*D
	kBlk, vBlk := k[kvOff:], v[kvOff:]                     // (nk, D), row stride kvs
	qBlk, doBlk, dqBlk := q[qOff:], dout[qOff:], dq[qOff:] // (nq, D), row stride qs

	// P = exp(scale * Q Kᵀ - lse): (nq, nk)
	Sgemm(NoTrans, Trans, nq, nk, D, scale, qBlk, qs, kBlk, kvs, 0, ws.s, attnBlockK)
	attnMask(ws.s, cfg, b, i0, nq, j0, nk)
	di := ws.m[:nq]
	for r := range di {
		row := ws.s[r*attnBlockK : r*attnBlockK+nk]
		li := lse[(b*cfg.HQ+h)*T+i0+r]
		if math.IsInf(float64(li), -1) {
			clear(row)
		} else {
			expSubF32(row, li)
		}
		di[r] = dotF32(doBlk[r*qs:r*qs+D], out[qOff+r*qs:][:D])
	}
	// dP̃ = dO Vᵀ: (nq, nk). dS = P*(Z*dP̃ - D_i)*scale in place (Z = 1
	// without dropout), then P becomes P̃ = P*Z for dV.
	Sgemm(NoTrans, Trans, nq, nk, D, 1, doBlk, qs, vBlk, kvs, 0, ws.dp, attnBlockK)
	if cfg.Dropout > 0 {
		attnDropTile(ws.keep, cfg, b, h, i0, nq, j0, nk)
		for r := range di {
			p, ds := ws.s[r*attnBlockK:r*attnBlockK+nk], ws.dp[r*attnBlockK:r*attnBlockK+nk]
			z := ws.keep[r*attnBlockK : r*attnBlockK+nk]
			for c := range ds {
				ds[c] = p[c] * (z[c]*ds[c] - di[r]) * scale
				p[c] *= z[c]
			}
		}
	} else {
		for r := range di {
			p, ds := ws.s[r*attnBlockK:r*attnBlockK+nk], ws.dp[r*attnBlockK:r*attnBlockK+nk]
			for c := range ds {
				ds[c] = p[c] * (ds[c] - di[r]) * scale
			}
		}
	}
	if which != gradQ { // dV += P̃ᵀ dO: (nk, D)
		Sgemm(Trans, NoTrans, nk, D, nq, 1, ws.s, attnBlockK, doBlk, qs, 1, dv[kvOff:], kvs)
	}
	if which != gradKV { // dQ += dS K: (nq, D)
		Sgemm(NoTrans, NoTrans, nq, D, nk, 1, ws.dp, attnBlockK, kBlk, kvs, 1, dqBlk, qs)
	}
	if which != gradQ { // dK += dSᵀ Q: (nk, D)
		Sgemm(Trans, NoTrans, nk, D, nq, 1, ws.dp, attnBlockK, qBlk, qs, 1, dk[kvOff:], kvs)
	}
}
