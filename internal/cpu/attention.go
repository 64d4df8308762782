package cpu

import (
	"fmt"
	"math"
	"slices"
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
	// Dropout is Megatron's attention dropout: each probability of the
	// softmax (before the product with v) is zeroed with probability Dropout
	// and the kept ones are scaled by 1/(1-Dropout); 0 turns it off. The
	// masks are not drawn from a stream but computed from a key
	// (attnKeep): DropoutSeed, the batch row, the global query head
	// FirstHead+h, the query and the key position. The same call therefore
	// drops the same probabilities whatever the thread count, the tile
	// schedule or the tensor-parallel split of the heads, and the backward
	// regenerates the mask instead of storing it.
	Dropout float32
	// DropoutSeed keys the dropout masks of this call (one per layer and
	// micro-batch: tensor.Tape.Attention draws it from the dropout stream).
	DropoutSeed uint64
	// FirstHead is the global index of query head 0 (a tensor-parallel
	// rank's first head; 0 on one rank): the masks are keyed by global head.
	FirstHead int
	// QPos and KPos are the sequence positions of query row 0 and key row 0
	// (0 for a whole sequence). The causal mask compares positions (query
	// i sees key j iff j+KPos <= i+QPos) and the dropout masks are keyed by
	// them, so attention over one block of a longer sequence (context
	// parallelism's chunks) computes exactly what the whole sequence's
	// attention computes for those rows and columns, dropout included. Not
	// with DocIDs.
	QPos, KPos int
	// Accumulate merges this call's keys into a previous partial result
	// instead of overwriting it: out and lse hold the normalised output and
	// log-sum-exp of each query over other keys (lse -Inf: none yet), and
	// the online softmax continues from them, so blocks of keys attended
	// one call at a time give the attention over all of them (ring
	// attention's merge through the log-sum-exp).
	Accumulate bool
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
	case !(c.Dropout >= 0 && c.Dropout < 1):
		return fmt.Errorf("cpu: attention Dropout=%g: want 0 <= p < 1", c.Dropout)
	case c.FirstHead < 0:
		return fmt.Errorf("cpu: attention FirstHead=%d: want >= 0", c.FirstHead)
	case c.QPos < 0 || c.KPos < 0:
		return fmt.Errorf("cpu: attention QPos=%d KPos=%d: want >= 0", c.QPos, c.KPos)
	case c.DocIDs != nil && (c.QPos != 0 || c.KPos != 0):
		return fmt.Errorf("cpu: attention DocIDs with QPos=%d KPos=%d: document masks need whole sequences (offsets 0)", c.QPos, c.KPos)
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

// mustLen panics unless each buffer has at least the floats its shape needs:
// shapes come from the caller's code, so a mismatch is a programming error.
func (c AttentionConfig) mustLen(bufs ...attnBuf) {
	for _, b := range bufs {
		want := c.B * c.T * c.D
		switch b.kind {
		case 'q':
			want *= c.HQ
		case 'k':
			want *= c.HKV
		case 'l':
			want = c.B * c.HQ * c.T
		}
		if len(b.x) < want {
			panic(fmt.Sprintf("cpu: attention %s has %d floats, want %d for B=%d T=%d HQ=%d HKV=%d D=%d",
				b.name, len(b.x), want, c.B, c.T, c.HQ, c.HKV, c.D))
		}
	}
}

// attnBuf names a buffer for mustLen; kind is 'q' (B,T,HQ,D), 'k' (B,T,HKV,D)
// or 'l' (B,HQ,T).
type attnBuf struct {
	name string
	kind byte
	x    []float32
}

// Tile sizes. A key block of attnBlockK rows of k and v (2*64*D floats, 32 KiB
// at D=64) stays in cache while attnBlockQ query rows stream over it.
const (
	attnBlockQ = 64
	attnBlockK = 64
)

// attnScratch is one goroutine's workspace: O(block²) floats, independent of T.
type attnScratch struct {
	s    []float32 // (attnBlockQ, attnBlockK) scores, then probabilities P
	dp   []float32 // (attnBlockQ, attnBlockK) dP = dout·vᵀ, then dS (backward)
	m, l []float32 // (attnBlockQ) running max and sum of the online softmax; backward: D_i
	keep []float32 // (attnBlockQ, attnBlockK) dropout multipliers, 0 or 1/(1-p)
}

// attnScratchFloats is the size of one attnScratch in floats.
const attnScratchFloats = 3*attnBlockQ*attnBlockK + 2*attnBlockQ

// attnPool recycles workspaces so steady-state calls do not allocate them. It
// is a cache, not state: any attnScratch is interchangeable.
var attnPool = sync.Pool{New: func() any {
	return &attnScratch{
		s: make([]float32, attnBlockQ*attnBlockK), dp: make([]float32, attnBlockQ*attnBlockK),
		m: make([]float32, attnBlockQ), l: make([]float32, attnBlockQ), keep: make([]float32, attnBlockQ*attnBlockK),
	}
}}

// AttentionScratchBytes is the extra memory the attention kernels use beyond
// their arguments: one fixed-size workspace per goroutine (Threads()), whatever
// T is. lse, O(T) per head, is an output of the forward, not scratch.
func AttentionScratchBytes() int { return Threads() * attnScratchFloats * 4 }

// AttentionForward is fused flash-style attention: for each (batch, query
// head, query block of 64 rows) it streams over key blocks of 64 with an
// online softmax, so the T×T score matrix is never stored; extra memory is one
// 64×64 tile per goroutine (AttentionScratchBytes).
//
//	out[b,i,h,:] = Σ_j softmax_j(scale*q_i·k_j over allowed j) z_ij v_j
//	lse[b,h,i]   = log Σ_j exp(scale*q_i·k_j), cached for AttentionBackward
//
// where z_ij is 1, or with cfg.Dropout the keyed dropout multiplier (0 or
// 1/(1-p)); lse is that of the probabilities before dropout.
//
// Both products run through Sgemm on tiles (single-threaded per tile); work
// is split over (b, head, query block) with Parallel. Tiles that are wholly
// masked (above the causal diagonal, or between disjoint document-id ranges)
// are skipped. Buffers shorter than their shapes panic (programming error). A row with no allowed key (impossible when Causal
// or DocIDs, since i attends to itself) gets out 0 and lse -Inf. Against the
// float64 reference the result agrees to ~1e-6 relative (tests use 2e-5).
func AttentionForward(out, lse, q, k, v []float32, cfg AttentionConfig) {
	cfg.mustValidate()
	cfg.mustLen(attnBuf{"out", 'q', out}, attnBuf{"lse", 'l', lse}, attnBuf{"q", 'q', q}, attnBuf{"k", 'k', k}, attnBuf{"v", 'k', v})
	nqb := (cfg.T + attnBlockQ - 1) / attnBlockQ
	Parallel(cfg.B*cfg.HQ*nqb, 1, func(lo, hi int) {
		ws := attnPool.Get().(*attnScratch)
		for idx := lo; idx < hi; idx++ {
			b, h, qb := idx/(cfg.HQ*nqb), idx/nqb%cfg.HQ, zigzag(idx%nqb, nqb)
			i0 := qb * attnBlockQ
			attnForwardBlock(out, lse, q, k, v, &cfg, b, h, i0, min(i0+attnBlockQ, cfg.T), ws)
		}
		attnPool.Put(ws)
	})
}

// attnMask sets masked scores of the tile s (rows i0.., columns j0.., row
// stride attnBlockK) to -Inf. Only tiles crossing the diagonal or holding a
// document boundary have any.
func attnMask(s []float32, cfg *AttentionConfig, b, i0, nq, j0, nk int) {
	negInf := float32(math.Inf(-1))
	causalCut := cfg.Causal && j0+nk-1 > i0+cfg.QPos-cfg.KPos
	if !causalCut && cfg.DocIDs == nil {
		return
	}
	for r := 0; r < nq; r++ {
		row := s[r*attnBlockK : r*attnBlockK+nk]
		i := i0 + r
		for c := range row {
			if !attnAllowed(cfg, b, i, j0+c) {
				row[c] = negInf
			}
		}
	}
}

// attnTileEmpty reports whether every (i, j) of the tile rows [i0, i0+nq),
// columns [j0, j0+nk) is masked, so the tile can be skipped: it lies above the
// causal diagonal, or the document ids of its rows and columns span disjoint
// ranges (packed sequences give block-diagonal masks whose off-diagonal tiles
// are skipped this way).
func attnTileEmpty(cfg *AttentionConfig, b, i0, nq, j0, nk int) bool {
	if cfg.Causal && j0 > i0+nq-1+cfg.QPos-cfg.KPos {
		return true
	}
	if cfg.DocIDs == nil {
		return false
	}
	ids := cfg.DocIDs[b*cfg.T:]
	qLo, qHi := slices.Min(ids[i0:i0+nq]), slices.Max(ids[i0:i0+nq])
	kLo, kHi := slices.Min(ids[j0:j0+nk]), slices.Max(ids[j0:j0+nk])
	return qHi < kLo || kHi < qLo
}

// attnForwardBlock runs query rows [i0, i1) of head h in batch b.
func attnForwardBlock(out, lse, q, k, v []float32, cfg *AttentionConfig, b, h, i0, i1 int, ws *attnScratch) {
	T, D := cfg.T, cfg.D
	qs, kvs := cfg.HQ*D, cfg.HKV*D // row strides
	g := h / (cfg.HQ / cfg.HKV)
	nq := i1 - i0
	negInf := float32(math.Inf(-1))
	m, l := ws.m[:nq], ws.l[:nq]
	qBlk := q[(b*T+i0)*qs+h*D:]   // (nq, D), row stride qs
	oBlk := out[(b*T+i0)*qs+h*D:] // (nq, D), row stride qs
	for r := range m {
		m[r], l[r] = negInf, 0
		// Accumulate: the partial result (normalised out, lse) is the online
		// softmax's state m = lse, l = 1, O = out.
		if li := lse[(b*cfg.HQ+h)*T+i0+r]; cfg.Accumulate && li != negInf {
			m[r], l[r] = li, 1
			continue
		}
		clear(oBlk[r*qs : r*qs+D])
	}
	jEnd := T
	if cfg.Causal {
		jEnd = min(T, i1+cfg.QPos-cfg.KPos)
	}
	for j0 := 0; j0 < jEnd; j0 += attnBlockK {
		nk := min(attnBlockK, jEnd-j0)
		if attnTileEmpty(cfg, b, i0, nq, j0, nk) {
			continue
		}
		kvOff := (b*T+j0)*kvs + g*D
		// S = scale * Q Kᵀ: (nq, nk)
		Sgemm(NoTrans, Trans, nq, nk, D, cfg.scale(), qBlk, qs, k[kvOff:], kvs, 0, ws.s, attnBlockK)
		attnMask(ws.s, cfg, b, i0, nq, j0, nk)
		for r := range m {
			row := ws.s[r*attnBlockK : r*attnBlockK+nk]
			mx := maxRowF32(m[r], row)
			if mx == negInf { // nothing allowed yet: P row is 0
				clear(row)
				continue
			}
			if alpha := expF32(m[r] - mx); alpha != 1 {
				scaleF32(alpha, oBlk[r*qs:r*qs+D])
				l[r] *= alpha
			}
			l[r] += expSubF32(row, mx)
			m[r] = mx
		}
		if cfg.Dropout > 0 { // P̃ = P∘Z: l keeps the sum before dropout
			attnDropTile(ws.keep, cfg, b, h, i0, nq, j0, nk)
			for r := range m {
				mulF32(ws.s[r*attnBlockK:r*attnBlockK+nk], ws.keep[r*attnBlockK:])
			}
		}
		// O += P V: (nq, D)
		Sgemm(NoTrans, NoTrans, nq, D, nk, 1, ws.s, attnBlockK, v[kvOff:], kvs, 1, oBlk, qs)
	}
	for r := range m {
		if l[r] == 0 {
			lse[(b*cfg.HQ+h)*T+i0+r] = negInf
			continue
		}
		scaleF32(1/l[r], oBlk[r*qs:r*qs+D])
		lse[(b*cfg.HQ+h)*T+i0+r] = m[r] + float32(math.Log(float64(l[r])))
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
