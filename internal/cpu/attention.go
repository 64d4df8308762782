package cpu

import (
	"fmt"
	"math"
	"sync"
)

// AttentionConfig describes one fused scaled-dot-product attention call.
//
// Layouts (row-major, contiguous): q (B, T, HQ, D); k, v (B, T, HKV, D);
// out (B, T, HQ, D); lse (B, HQ, T). Query head h reads kv head
// h/(HQ/HKV) (GQA; HKV = 1 is MQA, HKV = HQ is MHA).
type AttentionConfig struct {
	// B is the batch size, T the sequence length, HQ the query heads, HKV the
	// key/value heads (HQ % HKV == 0) and D the head size.
	B, T, HQ, HKV, D int
	// Scale multiplies q·k; 0 means 1/sqrt(D).
	Scale float32
	// Causal lets query i attend to keys j <= i only.
	Causal bool
	// DocIDs, if non-nil, is (B*T): token i attends to token j only if their
	// document ids are equal (packed sequences, Megatron's
	// --reset-attention-mask). Combined with Causal it is the block-diagonal
	// causal mask.
	DocIDs []int32
}

// Validate reports a config the attention kernels cannot run.
func (c AttentionConfig) Validate() error {
	switch {
	case c.B < 0 || c.T < 0 || c.HQ < 1 || c.HKV < 1 || c.D < 1:
		return fmt.Errorf("cpu: attention shape B=%d T=%d HQ=%d HKV=%d D=%d: want B, T >= 0 and HQ, HKV, D >= 1", c.B, c.T, c.HQ, c.HKV, c.D)
	case c.HQ%c.HKV != 0:
		return fmt.Errorf("cpu: attention HQ=%d is not a multiple of HKV=%d", c.HQ, c.HKV)
	case c.DocIDs != nil && len(c.DocIDs) != c.B*c.T:
		return fmt.Errorf("cpu: attention has %d DocIDs, want B*T=%d", len(c.DocIDs), c.B*c.T)
	case math.IsNaN(float64(c.Scale)) || math.IsInf(float64(c.Scale), 0):
		return fmt.Errorf("cpu: attention Scale=%g is not finite", c.Scale)
	}
	return nil
}

func (c AttentionConfig) scale() float32 {
	if c.Scale != 0 {
		return c.Scale
	}
	return float32(1 / math.Sqrt(float64(c.D)))
}

func (c AttentionConfig) mustValidate() {
	if err := c.Validate(); err != nil {
		panic(err.Error())
	}
}

// Tile sizes. A key block of attnBlockK rows of k and v (2*64*D floats, 32 KiB
// at D=64) stays in cache while attnBlockQ query rows stream over it.
const (
	attnBlockQ = 64
	attnBlockK = 64
)

// attnScratch is one goroutine's workspace: O(block) floats, independent of T.
type attnScratch struct {
	s    []float32 // (attnBlockK) scores of one query row against a key block
	m, l []float32 // (attnBlockQ) running max and running sum of the online softmax
}

// attnPool recycles workspaces so steady-state calls do not allocate them. It
// is a cache, not state: any attnScratch is interchangeable.
var attnPool = sync.Pool{New: func() any {
	return &attnScratch{s: make([]float32, attnBlockK), m: make([]float32, attnBlockQ), l: make([]float32, attnBlockQ)}
}}

// AttentionForward is fused flash-style attention: for each (batch, query
// head, query block of 64 rows) it streams over key blocks of 64 with an
// online softmax, so the T×T score matrix is never stored; extra memory is
// O(block) per goroutine (plus lse, O(T) per head, which is an output).
//
//	out[b,i,h,:] = Σ_j softmax_j(scale*q_i·k_j over allowed j) v_j
//	lse[b,h,i]   = log Σ_j exp(scale*q_i·k_j), cached for AttentionBackward
//
// Work is split over (b, head, query block) with Parallel. Causal key blocks
// above the diagonal are skipped. A row with no allowed key (impossible when
// Causal or DocIDs, since i attends to itself) gets out 0 and lse -Inf.
func AttentionForward(out, lse, q, k, v []float32, cfg AttentionConfig) {
	cfg.mustValidate()
	nqb := (cfg.T + attnBlockQ - 1) / attnBlockQ
	Parallel(cfg.B*cfg.HQ*nqb, 1, func(lo, hi int) {
		ws := attnPool.Get().(*attnScratch)
		for idx := lo; idx < hi; idx++ {
			b, h, qb := idx/(cfg.HQ*nqb), idx/nqb%cfg.HQ, idx%nqb
			i0 := qb * attnBlockQ
			attnForwardBlock(out, lse, q, k, v, &cfg, b, h, i0, min(i0+attnBlockQ, cfg.T), ws)
		}
		attnPool.Put(ws)
	})
}

// attnForwardBlock runs query rows [i0, i1) of head h in batch b.
func attnForwardBlock(out, lse, q, k, v []float32, cfg *AttentionConfig, b, h, i0, i1 int, ws *attnScratch) {
	T, D := cfg.T, cfg.D
	qs, kvs := cfg.HQ*D, cfg.HKV*D // row strides
	g := h / (cfg.HQ / cfg.HKV)
	scale := cfg.scale()
	negInf := float32(math.Inf(-1))
	m, l := ws.m[:i1-i0], ws.l[:i1-i0]
	for r := range m {
		m[r], l[r] = negInf, 0
		clear(out[(b*T+i0+r)*qs+h*D:][:D])
	}
	jEnd := T
	if cfg.Causal {
		jEnd = i1
	}
	for j0 := 0; j0 < jEnd; j0 += attnBlockK {
		nk := min(attnBlockK, jEnd-j0)
		for r := range m {
			i := i0 + r
			n := nk
			if cfg.Causal {
				n = min(nk, i-j0+1)
			}
			qi := q[(b*T+i)*qs+h*D:][:D]
			oi := out[(b*T+i)*qs+h*D:][:D]
			s := ws.s[:max(n, 0)]
			mx := m[r]
			for c := range s {
				j := j0 + c
				if cfg.DocIDs != nil && cfg.DocIDs[b*T+i] != cfg.DocIDs[b*T+j] {
					s[c] = negInf
					continue
				}
				s[c] = dotF32(qi, k[(b*T+j)*kvs+g*D:][:D]) * scale
				mx = max(mx, s[c])
			}
			if mx == negInf {
				continue // nothing allowed yet
			}
			if alpha := expF32(m[r] - mx); alpha != 1 {
				scaleF32(alpha, oi)
				l[r] *= alpha
			}
			sum := l[r]
			for c, sc := range s {
				if sc == negInf {
					continue
				}
				p := expF32(sc - mx)
				sum += p
				axpyF32(p, v[(b*T+j0+c)*kvs+g*D:][:D], oi)
			}
			l[r], m[r] = sum, mx
		}
	}
	for r := range m {
		i := i0 + r
		if l[r] == 0 {
			lse[(b*cfg.HQ+h)*T+i] = negInf
			continue
		}
		scaleF32(1/l[r], out[(b*T+i)*qs+h*D:][:D])
		lse[(b*cfg.HQ+h)*T+i] = m[r] + float32(math.Log(float64(l[r])))
	}
}

// AttentionBackward accumulates the gradients of AttentionForward into dq, dk
// and dv (shapes of q, k, v), with the FlashAttention-2 backward: P is
// recomputed from q, k and lse, D_i = rowsum(dout_i*out_i), and
// dS = P*(dP - D_i) with dP = dout·vᵀ. No T×T buffer is stored.
//
// Work is split over (b, kv head): one goroutine owns the dk, dv rows of its kv
// head and the dq rows of the query heads that share it, so accumulation needs
// no atomics and the result does not depend on Threads(). With B*HKV below
// Threads() (e.g. MQA at batch 1) some cores idle.
func AttentionBackward(dq, dk, dv, dout, q, k, v, out, lse []float32, cfg AttentionConfig) {
	cfg.mustValidate()
	Parallel(cfg.B*cfg.HKV, 1, func(lo, hi int) {
		for idx := lo; idx < hi; idx++ {
			attnBackwardHead(dq, dk, dv, dout, q, k, v, out, lse, &cfg, idx/cfg.HKV, idx%cfg.HKV)
		}
	})
}

// attnBackwardHead handles kv head g of batch b and its query heads. Key
// blocks are the outer loop so a block of k, v, dk, dv stays in cache while
// every query row that sees it streams past.
func attnBackwardHead(dq, dk, dv, dout, q, k, v, out, lse []float32, cfg *AttentionConfig, b, g int) {
	T, D := cfg.T, cfg.D
	qs, kvs := cfg.HQ*D, cfg.HKV*D
	grp := cfg.HQ / cfg.HKV
	scale := cfg.scale()
	for j0 := 0; j0 < T; j0 += attnBlockK {
		nk := min(attnBlockK, T-j0)
		for h := g * grp; h < (g+1)*grp; h++ {
			iStart := 0
			if cfg.Causal {
				iStart = j0
			}
			for i := iStart; i < T; i++ {
				li := lse[(b*cfg.HQ+h)*T+i]
				if math.IsInf(float64(li), -1) {
					continue
				}
				n := nk
				if cfg.Causal {
					n = min(nk, i-j0+1)
				}
				row := (b*T+i)*qs + h*D
				qi, doi, dqi := q[row:][:D], dout[row:][:D], dq[row:][:D]
				di := dotF32(doi, out[row:][:D])
				for c := 0; c < n; c++ {
					j := j0 + c
					if cfg.DocIDs != nil && cfg.DocIDs[b*T+i] != cfg.DocIDs[b*T+j] {
						continue
					}
					kr := (b*T+j)*kvs + g*D
					kj, vj := k[kr:][:D], v[kr:][:D]
					p := expF32(dotF32(qi, kj)*scale - li)
					axpyF32(p, doi, dv[kr:][:D])
					ds := p * (dotF32(doi, vj) - di) * scale
					axpyF32(ds, kj, dqi)
					axpyF32(ds, qi, dk[kr:][:D])
				}
			}
		}
	}
}

// AttentionFLOPs returns the forward and backward floating-point operation
// counts this package reports for cfg: 4·B·HQ·T²·D for the forward (two
// matmuls, 2 flops per multiply-add) and 2.5× that for the backward (five
// matmuls), both halved when Causal (Megatron's convention since core_v0.12,
// counting the T²/2 lower triangle; DocIDs masking is not discounted).
func AttentionFLOPs(cfg AttentionConfig) (fwd, bwd float64) {
	fwd = 4 * float64(cfg.B) * float64(cfg.HQ) * float64(cfg.T) * float64(cfg.T) * float64(cfg.D)
	if cfg.Causal {
		fwd /= 2
	}
	return fwd, 2.5 * fwd
}
