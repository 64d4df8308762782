package infer

import (
	"math"

	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/model/gpt"
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
func (a *pagedAttention) Attend(layer int, q, k, v, out []float32) {
	row := a.pool.rowFloats
	kc, vc := a.pool.k[layer], a.pool.v[layer]
	for i, s := range a.slots {
		copy(kc[s*row:(s+1)*row], k[i*row:(i+1)*row])
		copy(vc[s*row:(s+1)*row], v[i*row:(i+1)*row])
	}
	a.layer, a.q, a.out = layer, q, out
	// Work items: (query row, head) pairs, spread over the kernel threads.
	cpu.Parallel(len(a.slots)*a.heads, 8, a.work)
}

// attendRange computes work items [lo, hi): item = row·heads + head. Each
// query is computed as gpt's cachedAttention computes it (float64 scores,
// the same order), so a lone sequence decodes exactly as gotron generate.
func (a *pagedAttention) attendRange(lo, hi int) {
	d, r := a.dim, a.heads/a.grp
	row := a.pool.rowFloats
	bt := a.pool.blockTokens
	kc, vc := a.pool.k[a.layer], a.pool.v[a.layer]
	scale := 1 / math.Sqrt(float64(d))
	si := 0 // the span of item lo's row, found by scanning
	var scores []float64
	for it := lo; it < hi; it++ {
		i, h := it/a.heads, it%a.heads
		for a.spans[si].row+a.spans[si].n <= i {
			si++
		}
		s := &a.spans[si]
		limit := s.pos + (i - s.row) + 1
		if cap(scores) < limit {
			scores = make([]float64, limit+64)
		}
		scores = scores[:limit]
		kvh := h / r
		qi := a.q[(i*a.heads+h)*d : (i*a.heads+h+1)*d]
		mx := math.Inf(-1)
		for j := range limit {
			off := (int(s.table[j/bt])*bt+j%bt)*row + kvh*d
			kj := kc[off : off+d]
			var sc float64
			for t := range d {
				sc += float64(qi[t]) * float64(kj[t])
			}
			scores[j] = sc * scale
			mx = math.Max(mx, scores[j])
		}
		var sum float64
		for j := range limit {
			scores[j] = math.Exp(scores[j] - mx)
			sum += scores[j]
		}
		o := a.out[(i*a.heads+h)*d : (i*a.heads+h+1)*d]
		for j := range limit {
			w := float32(scores[j] / sum)
			off := (int(s.table[j/bt])*bt+j%bt)*row + kvh*d
			vj := vc[off : off+d]
			for t := range d {
				o[t] += w * vj[t]
			}
		}
	}
}
