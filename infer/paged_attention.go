package infer

import (
	"math"
	"sync"

	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// span is one sequence's run of new tokens in a batched step: rows
// [row, row+n) of the flattened batch, at positions [pos, pos+n), its keys
// and values found through table.
type span struct {
	row, n, pos int
	table       []int32
}

// pagedAttention implements gpt.Attender over the paged pool for one step:
// it writes each new token's keys and values into its slot (block
// table[pos/B], offset pos%B) and attends each query to its own sequence's
// positions 0..pos through the block table.
type pagedAttention struct {
	pool       *kvPool
	spans      []span
	slots      []int // per row: its slot in the pool
	heads, grp int   // query heads, query groups (KV heads)
	dim        int   // head dim
	// per call
	layer  int
	hsplit int // head ranges per query row (Attend)
	q, out []float32
	work   func(lo, hi int) // a method value stored once
}

var _ gpt.Attender = (*pagedAttention)(nil)

func newPagedAttention(pool *kvPool, heads, groups, dim int) *pagedAttention {
	a := &pagedAttention{pool: pool, heads: heads, grp: groups, dim: dim}
	a.work = a.attendRange
	return a
}

// reset prepares the step's spans and slots.
func (a *pagedAttention) reset(spans []span) {
	a.spans = spans
	a.slots = a.slots[:0]
	for _, s := range spans {
		for i := range s.n {
			a.slots = append(a.slots, a.pool.slot(s.table, s.pos+i))
		}
	}
}

// Attend stores the layer's new keys and values and computes attention.
func (a *pagedAttention) Attend(layer int, qt, kt, vt, outt *tensor.Tensor) {
	q, k, v, out := qt.Float32s(), kt.Float32s(), vt.Float32s(), outt.Float32s()
	d := a.dim
	kc, vc := a.pool.k[layer], a.pool.v[layer]
	for i, s := range a.slots {
		for h := range a.grp {
			at, src := a.pool.at(s, h), (i*a.grp+h)*d
			copy(kc[at:at+d], k[src:src+d])
			copy(vc[at:at+d], v[src:src+d])
		}
	}
	a.layer, a.q, a.out = layer, q, out
	// Work items: a query row's heads, split into a few head ranges when
	// there are too few rows to keep every kernel thread busy.
	rows := len(a.slots)
	a.hsplit = 1
	if t := cpu.Threads(); rows < 2*t {
		a.hsplit = min(a.heads, (2*t+rows-1)/rows)
	}
	cpu.Parallel(rows*a.hsplit, 1, a.work)
}

// attendRange computes work items [lo, hi): item = row·hsplit + head range.
// Each query is computed as gpt's cachedAttention computes it (float64
// scores by cpu.DotF64's arithmetic, values weighted by cpu.Axpy's: per
// head the same operations in the same order), so a lone sequence decodes
// exactly as gotron generate. A block holds each KV head's positions
// contiguously, so a block's keys are scored and its values weighted in one
// kernel call per head (cpu.DotsF64, cpu.Axpys), reading memory in order.
func (a *pagedAttention) attendRange(lo, hi int) {
	d, r := a.dim, a.heads/a.grp
	bt := a.pool.blockTokens
	kc, vc := a.pool.k[a.layer], a.pool.v[a.layer]
	scale := 1 / math.Sqrt(float64(d))
	sc, _ := attnScratches.Get().(*attnScratch)
	if sc == nil {
		sc = &attnScratch{}
	}
	defer attnScratches.Put(sc)
	si := 0 // the span of item lo's row, found by scanning
	for it := lo; it < hi; it++ {
		i, c := it/a.hsplit, it%a.hsplit
		h0, h1 := c*a.heads/a.hsplit, (c+1)*a.heads/a.hsplit
		for a.spans[si].row+a.spans[si].n <= i {
			si++
		}
		s := &a.spans[si]
		limit := s.pos + (i - s.row) + 1
		nh := h1 - h0
		scores, w := sc.get(nh * limit)
		q := a.q[i*a.heads*d:]
		for j0 := 0; j0 < limit; j0 += bt {
			nb, slot := min(bt, limit-j0), int(s.table[j0/bt])*bt
			for h := h0; h < h1; h++ {
				cpu.DotsF64(scores[(h-h0)*limit+j0:][:nb], q[h*d:(h+1)*d], kc[a.pool.at(slot, h/r):], d, scale)
			}
		}
		for h := range nh {
			cpu.SoftmaxWeights(w[h*limit:(h+1)*limit], scores[h*limit:(h+1)*limit])
		}
		out := a.out[i*a.heads*d:]
		for j0 := 0; j0 < limit; j0 += bt {
			nb, slot := min(bt, limit-j0), int(s.table[j0/bt])*bt
			for h := h0; h < h1; h++ {
				cpu.Axpys(out[h*d:(h+1)*d], vc[a.pool.at(slot, h/r):], d, w[(h-h0)*limit+j0:][:nb])
			}
		}
	}
}

// attnScratch is one goroutine's scores and weights.
type attnScratch struct {
	scores []float64
	w      []float32
}

var attnScratches sync.Pool

func (s *attnScratch) get(n int) ([]float64, []float32) {
	if cap(s.scores) < n {
		s.scores, s.w = make([]float64, n+n/2), make([]float32, n+n/2)
	}
	return s.scores[:n], s.w[:n]
}
