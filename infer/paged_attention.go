package infer

import (
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// span is one sequence's run of new tokens in a batched step: rows
// [row, row+n) of the flattened batch, at positions [pos, pos+n), its keys
// and values found through table.
type span struct {
	row, n, pos int
	table       []int32
	state       *gpt.GDNState // gated delta net layers' (nil: none)
}

// pagedAttention implements gpt.Attender over the paged pool for one step:
// it writes each new token's keys and values into its slot (block
// table[pos/B], offset pos%B) and attends each query to its own sequence's
// positions 0..pos through the block table (tensor.PagedKVWrite,
// tensor.PagedAttention). Each query is computed as gpt's single-sequence
// decoding computes it, so a lone sequence decodes exactly as gotron
// generate.
type pagedAttention struct {
	pool *kvPool
	// The step's block tables, spans and slots (reset), as the int32
	// tensors the ops take; the slices back them and are reused.
	tables, spans, slots []int32
	cfg                  tensor.PagedAttentionConfig
	slotsT               *tensor.Tensor
	states               []*gpt.GDNState // by span
	runs                 []gpt.GDNRun
}

var _ gpt.Attender = (*pagedAttention)(nil)

func newPagedAttention(pool *kvPool) *pagedAttention {
	return &pagedAttention{pool: pool}
}

// reset prepares the step's block tables, spans and slots.
func (a *pagedAttention) reset(spans []span) {
	bt := a.pool.blockTokens
	maxBlocks := 1
	for _, s := range spans {
		maxBlocks = max(maxBlocks, (s.pos+s.n+bt-1)/bt)
	}
	a.tables = a.tables[:0]
	a.spans = a.spans[:0]
	a.slots = a.slots[:0]
	a.states = a.states[:0]
	for _, s := range spans {
		a.states = append(a.states, s.state)
		used := (s.pos + s.n + bt - 1) / bt
		a.tables = append(a.tables, s.table[:used]...)
		for range maxBlocks - used {
			a.tables = append(a.tables, -1) // not read
		}
		a.spans = append(a.spans, int32(s.row), int32(s.n), int32(s.pos))
		for i := range s.n {
			a.slots = append(a.slots, int32(a.pool.slot(s.table, s.pos+i)))
		}
	}
	// The step's tables are its input, built by the host: copied to the
	// pool's device (on the CPU they are used in place).
	dev := a.pool.dev
	a.cfg = tensor.PagedAttentionConfig{
		BlockTables: tensor.FromInt32(a.tables, len(spans), maxBlocks).ToDevice(dev),
		Spans:       tensor.FromInt32(a.spans, len(spans), 3).ToDevice(dev),
	}
	a.slotsT = tensor.FromInt32(a.slots, len(a.slots)).ToDevice(dev)
}

// Attend stores the layer's new keys and values and computes attention.
func (a *pagedAttention) Attend(layer int, q, k, v, out *tensor.Tensor) {
	kp, vp := a.pool.k[layer], a.pool.v[layer]
	tensor.PagedKVWrite(kp, vp, k, v, a.slotsT)
	tensor.PagedAttention(out, q, kp, vp, a.cfg)
}

// GDNRuns gives a gated delta net layer each span's tokens and the
// sequence's state (the slice is reused by the next call).
func (a *pagedAttention) GDNRuns(layer int) []gpt.GDNRun {
	a.runs = a.runs[:0]
	for i, st := range a.states {
		r := gpt.GDNRun{Tokens: int(a.spans[3*i+1])}
		if st != nil {
			r = st.Run(layer, r.Tokens)
		}
		a.runs = append(a.runs, r)
	}
	return a.runs
}
