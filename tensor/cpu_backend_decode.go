package tensor

import (
	"fmt"
	"math"
	"sync"

	"github.com/gotron/gotron/internal/cpu"
)

// The CPU backend's decoding kernels (decode_ops.go).

// pageFloats is the float32s of a 4 KiB page: AllocCommitted writes one
// per page.
const pageFloats = 1024

func (cpuBackend) AllocCommitted(dtype DType, shape []int) *Tensor {
	if dtype != Float32 {
		panic(fmt.Sprintf("tensor: AllocCommitted: %v (the CPU backend commits float32 buffers)", dtype))
	}
	t := New(Float32, shape...)
	// Writing one value per page makes the kernel back the buffer now; the
	// threads split the (many) pages of a large pool.
	s := t.f32
	cpu.Parallel(len(s), 1<<20, func(lo, hi int) {
		for i := lo; i < hi; i += pageFloats {
			s[i] = 0
		}
	})
	return t
}

func (cpuBackend) PagedKVWrite(kPool, vPool, k, v, slots *Tensor) {
	blocks, g, bt, d := kPool.Dim(0), kPool.Dim(1), kPool.Dim(2), kPool.Dim(3)
	kc, vc, kk, vv := f(kPool), f(vPool), f(k), f(v)
	for i, s := range slots.i32s() {
		if s < 0 || int(s) >= blocks*bt {
			panic(fmt.Sprintf("tensor: PagedKVWrite: row %d's slot %d outside the pool's %d", i, s, blocks*bt))
		}
		b, o := int(s)/bt, int(s)%bt
		for h := range g {
			at, src := ((b*g+h)*bt+o)*d, (i*g+h)*d
			copy(kc[at:at+d], kk[src:src+d])
			copy(vc[at:at+d], vv[src:src+d])
		}
	}
}

// pagedJob is one PagedAttention call's state, pooled with its work method
// value so that a call allocates nothing in steady state.
type pagedJob struct {
	out, q, k, v  []float32
	tables, spans []int32
	maxBlocks     int
	heads, groups int
	d, bt         int
	hsplit        int // head ranges per query row
	scale         float64
	work          func(lo, hi int) // j.attendRange, stored once
}

var pagedJobs = sync.Pool{New: func() any {
	j := &pagedJob{}
	j.work = j.attendRange
	return j
}}

func (cpuBackend) PagedAttention(out, q, kPool, vPool *Tensor, cfg PagedAttentionConfig) {
	rows := q.Dim(0)
	j := pagedJobs.Get().(*pagedJob)
	defer pagedJobs.Put(j)
	*j = pagedJob{out: f(out), q: f(q), k: f(kPool), v: f(vPool),
		tables: cfg.BlockTables.i32s(), spans: cfg.Spans.i32s(), maxBlocks: cfg.BlockTables.Dim(1),
		heads: q.Dim(1), groups: kPool.Dim(1), d: q.Dim(2), bt: kPool.Dim(2),
		scale: 1 / math.Sqrt(float64(q.Dim(2))), work: j.work}
	j.check(rows, kPool.Dim(0))
	// Work items: a query row's heads, split into a few head ranges when
	// there are too few rows to keep every kernel thread busy.
	j.hsplit = 1
	if t := cpu.Threads(); rows < 2*t {
		j.hsplit = min(j.heads, (2*t+rows-1)/rows)
	}
	cpu.Parallel(rows*j.hsplit, 1, j.work)
	j.out, j.q, j.k, j.v, j.tables, j.spans = nil, nil, nil, nil, nil, nil // do not pin the step's buffers
}

// check panics unless the spans tile the rows in order and every block a
// query reads is in the pool.
func (j *pagedJob) check(rows, blocks int) {
	next := 0
	for s := range len(j.spans) / 3 {
		row, n, pos := int(j.spans[3*s]), int(j.spans[3*s+1]), int(j.spans[3*s+2])
		if row != next || n < 0 || pos < 0 {
			panic(fmt.Sprintf("tensor: PagedAttention: sequence %d's span (row %d, %d rows, position %d) does not follow row %d", s, row, n, pos, next))
		}
		next += n
		if n == 0 {
			continue
		}
		used := (pos + n + j.bt - 1) / j.bt
		if used > j.maxBlocks {
			panic(fmt.Sprintf("tensor: PagedAttention: sequence %d reaches position %d, beyond its block table of %d blocks of %d", s, pos+n-1, j.maxBlocks, j.bt))
		}
		for _, b := range j.tables[s*j.maxBlocks : s*j.maxBlocks+used] {
			if b < 0 || int(b) >= blocks {
				panic(fmt.Sprintf("tensor: PagedAttention: sequence %d's block %d outside the pool's %d", s, b, blocks))
			}
		}
	}
	if next != rows {
		panic(fmt.Sprintf("tensor: PagedAttention: spans cover %d rows of %d", next, rows))
	}
}

// attendRange computes work items [lo, hi): item = row·hsplit + head range.
// Per (row, head) the operations are PagedAttention's fixed ones, so
// neither the split nor the block size changes a bit: cpu.DotsF64 and
// cpu.Axpys give the bits of one DotF64 per key and one Axpy per value, in
// position order, however the positions are cut into blocks. A block holds
// each KV head's positions contiguously, so a block's keys are scored and
// its values weighted in one kernel call per head, reading memory in order.
func (j *pagedJob) attendRange(lo, hi int) {
	d, r, bt := j.d, j.heads/j.groups, j.bt
	sc, _ := attnScratches.Get().(*attnScratch)
	if sc == nil {
		sc = &attnScratch{}
	}
	defer attnScratches.Put(sc)
	// at is the offset in a pool of block b's KV head h.
	at := func(b int32, h int) int { return (int(b)*j.groups + h) * bt * d }
	si := 0 // the sequence of item lo's row, found by scanning
	for it := lo; it < hi; it++ {
		i, c := it/j.hsplit, it%j.hsplit
		h0, h1 := c*j.heads/j.hsplit, (c+1)*j.heads/j.hsplit
		for int(j.spans[3*si]+j.spans[3*si+1]) <= i {
			si++
		}
		row, pos := int(j.spans[3*si]), int(j.spans[3*si+2])
		table := j.tables[si*j.maxBlocks : (si+1)*j.maxBlocks]
		limit := pos + (i - row) + 1
		nh := h1 - h0
		scores, w := sc.get(nh * limit)
		q := j.q[i*j.heads*d:]
		for j0 := 0; j0 < limit; j0 += bt {
			nb, blk := min(bt, limit-j0), table[j0/bt]
			for h := h0; h < h1; h++ {
				cpu.DotsF64(scores[(h-h0)*limit+j0:][:nb], q[h*d:(h+1)*d], j.k[at(blk, h/r):], d, j.scale)
			}
		}
		for h := range nh {
			cpu.SoftmaxWeights(w[h*limit:(h+1)*limit], scores[h*limit:(h+1)*limit])
		}
		out := j.out[i*j.heads*d:]
		clear(out[h0*d : h1*d])
		for j0 := 0; j0 < limit; j0 += bt {
			nb, blk := min(bt, limit-j0), table[j0/bt]
			for h := h0; h < h1; h++ {
				cpu.Axpys(out[h*d:(h+1)*d], j.v[at(blk, h/r):], d, w[(h-h0)*limit+j0:][:nb])
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

func (cpuBackend) PackWeight(w *Tensor, dtype DType) *PackedWeight {
	out, in := w.Dim(0), w.Dim(1)
	typ := cpu.PackedFloat32
	if dtype == BFloat16 {
		typ = cpu.PackedBFloat16
	}
	pb := cpu.PackB(cpu.Trans, in, out, f(w), in, typ)
	return &PackedWeight{out: out, in: in, dtype: dtype, bytes: pb.Bytes(), impl: pb}
}

func (cpuBackend) PackedLinear(out, x *Tensor, w *PackedWeight, b *Tensor) {
	pb, ok := w.impl.(*cpu.PackedB)
	if !ok {
		panic(fmt.Sprintf("tensor: PackedLinear: weight packed by another backend (%T)", w.impl))
	}
	n := x.Dim(0)
	if b == nil {
		cpu.SgemmPacked(n, 1, f(x), w.in, pb, 0, f(out), w.out)
		return
	}
	// x·wᵀ + b as Linear adds b, in the product's own pass.
	cpu.SgemmPackedBias(n, f(x), w.in, pb, f(b), f(out), w.out)
}
