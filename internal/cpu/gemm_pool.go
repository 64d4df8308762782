package cpu

import (
	"sync"
	"sync/atomic"
)

// gemmWork is one goroutine's packing workspace. Buffers only grow, so a
// reused job allocates nothing.
type gemmWork struct {
	apack []float32 // mc×kc block of op(A), mr-row panels (64-byte aligned)
	bpack []float32 // kc×nc panel of op(B), nr-column strips (64-byte aligned)
	tile  [maxTile]float32
}

// maxTile bounds mr*nr over all kernel sets (AVX-512 14×32 = 448).
const maxTile = 1024

// splitMode says how a job divides its work between goroutines.
type splitMode int

const (
	splitBatch  splitMode = iota // whole batch items per part
	splitRows                    // each item's rows, in mr units
	splitCols                    // each item's columns, in nr units
	splitShared                  // shared B panels, A blocks taken from a counter
	splitDot                     // dot products (few rows, B stored n×k), columns in 4s
)

// gemmJob is one SgemmStrided call: its arguments, its partition and the
// workspaces of its parts. Jobs are recycled through a free list.
type gemmJob struct {
	tA, tB                    Transpose
	m, n, k                   int
	alpha, beta               float32
	a, b, c                   []float32
	lda, ldb, ldc             int
	strideA, strideB, strideC int
	batch                     int
	ks                        kernSet

	mode   splitMode
	parts  int
	chunk  int // rows or columns per ticket (row, column and dot modes)
	chunks int // tickets in all (batch items × chunks per item)
	work   []gemmWork
	cr     crew // the workers taking part in the current run

	// nextBlock hands out tickets (chunks, or A blocks in splitShared).
	nextBlock ticket
	// splitShared state: two B panel buffers, the A block height, how the
	// panels are cut for packing, and gates for packed chunks and finished
	// A blocks.
	bshared    [2][]float32
	mcShared   int
	packChunks int              // tickets (strip groups) per B panel
	packAfter  int              // blocks of step s handed out before panel s+1's chunks
	packed     [2]atomic.Uint64 // per buffer: chunks packed into it so far
	ready      gate             // woken when a chunk is packed
	done       gate             // leading finished steps
	lastDone   []atomic.Uint64  // per A block: latest finished step + 1
}

// ticket hands out consecutive numbers up to a limit.
type ticket struct{ v atomic.Uint64 }

// take returns the next number if it is below limit.
func (t *ticket) take(limit uint64) (uint64, bool) {
	for {
		v := t.v.Load()
		if v >= limit {
			return 0, false
		}
		if t.v.CompareAndSwap(v, v+1) {
			return v, true
		}
	}
}

// gate is a counter that goroutines can wait on: waitFor(v) returns once
// the counter reaches v. Waiters spin briefly (the counter usually moves
// within microseconds), then sleep on a condition variable, so a part
// descheduled by the OS does not make the others burn its CPU.
type gate struct {
	v        atomic.Uint64
	sleepers atomic.Int32
	mu       sync.Mutex // protects perStep; held to sleep and to wake
	cond     sync.Cond
	perStep  [4]int // finished blocks per unfinished step, by step mod 4
}

// reset prepares the gate for a new job; no goroutine may be waiting.
func (g *gate) reset() {
	g.v.Store(0)
	g.cond.L = &g.mu
	g.perStep = [4]int{}
}

// stepDone records that one of the blocks of step s is finished, raising
// *last (that block's latest finished step, plus one) to s+1. The
// counter is the number of leading steps whose blocks are all finished
// (blocks finish out of order across steps). At most four steps may be
// unfinished at once: in gemmShared, panel s (which step s's blocks wait
// for) is packed only after step s-2 is finished.
func (g *gate) stepDone(s uint64, blocks int, last *atomic.Uint64) {
	g.mu.Lock()
	if last.Load() < s+1 {
		last.Store(s + 1)
	}
	g.perStep[s%4]++
	v := g.v.Load()
	for g.perStep[v%4] == blocks {
		g.perStep[v%4] = 0
		v++
	}
	g.v.Store(v)
	g.cond.Broadcast()
	g.mu.Unlock()
}

// add advances the counter by d and wakes sleepers.
func (g *gate) add(d uint64) {
	g.v.Add(d)
	if g.sleepers.Load() > 0 {
		g.mu.Lock()
		g.cond.Broadcast()
		g.mu.Unlock()
	}
}

// waitFor blocks until the counter is at least v.
func (g *gate) waitFor(v uint64) {
	g.waitUntil(func() bool { return g.v.Load() >= v })
}

// waitUntil blocks until ok() holds; ok must read only state that changes
// before a call of add or stepDone.
func (g *gate) waitUntil(ok func() bool) {
	for range 4000 { // a few microseconds
		if ok() {
			return
		}
	}
	g.mu.Lock()
	g.sleepers.Add(1)
	for !ok() {
		g.cond.Wait()
	}
	g.sleepers.Add(-1)
	g.mu.Unlock()
}

// minPartFMAs is the least work (multiply-adds) worth a goroutine of its
// own: below it, waking a worker costs more than it saves.
const minPartFMAs = 1 << 20

// plan chooses the partition for up to threads goroutines and sizes the
// workspaces.
func (j *gemmJob) plan(threads int) {
	ks := &j.ks
	fmas := j.m * j.n * j.k
	parts := max(1, min(threads, fmas*j.batch/minPartFMAs))
	unitsM, unitsN := ceilDiv(j.m, ks.mr), ceilDiv(j.n, ks.nr)
	j.chunk, j.chunks = 1, j.batch
	switch {
	case ks.dots != nil && j.tB == Trans && j.m <= maxDotRows:
		j.mode = splitDot
		j.setChunks(parts, j.n, 4)
	case parts == 1:
		j.mode = splitBatch
	case j.batch >= 4*parts || (j.batch >= parts && j.batch%parts == 0):
		j.mode = splitBatch
	case unitsM >= 4*parts:
		// Enough rows for every part to take several A blocks.
		j.mode = splitShared
		j.mcShared = min(ks.mc, ceilDiv(ceilDiv(j.m, 8*parts), ks.mr)*ks.mr)
		blocks := ceilDiv(j.m, j.mcShared)
		if len(j.lastDone) < blocks {
			j.lastDone = make([]atomic.Uint64, blocks)
		}
		for i := range j.lastDone[:blocks] {
			j.lastDone[i].Store(0)
		}
		// Two chunks per part: panels are packed by every part in a few
		// tickets, early in the previous step (after one block per part,
		// by when the buffer's previous step is usually finished).
		j.packChunks = min(2*parts, ceilDiv(min(ks.nc, j.n), ks.nr))
		j.packAfter = min(blocks, parts)
		j.packed[0].Store(0)
		j.packed[1].Store(0)
		j.ready.reset()
		j.done.reset()
	case j.m <= j.n && unitsN >= parts, unitsM < parts && unitsN >= unitsM:
		// Splitting columns makes every chunk pack all of A; splitting
		// rows, all of B. Duplicate the smaller operand.
		j.mode = splitCols
		parts = min(parts, unitsN)
		j.setChunks(parts, j.n, ks.nr)
	default:
		j.mode = splitRows
		parts = min(parts, unitsM)
		j.setChunks(parts, j.m, ks.mr)
	}
	j.parts = parts
	j.nextBlock.v.Store(0)
	if j.mode == splitShared {
		kc := min(ks.kc, j.k)
		need := kc * ceilDiv(min(ks.nc, j.n), ks.nr) * ks.nr
		for i := range j.bshared {
			if len(j.bshared[i]) < need {
				j.bshared[i] = alignedFloats(need)
			}
		}
	}
	if len(j.work) < parts {
		j.work = append(j.work, make([]gemmWork, parts-len(j.work))...)
	}
	kc := min(ks.kc, j.k)
	needA := max(kc*min(ks.mc, j.m), j.k) // dot mode gathers a row of k
	needB := kc * ceilDiv(min(ks.nc, j.n), ks.nr) * ks.nr
	for p := range j.work[:parts] {
		w := &j.work[p]
		if len(w.apack) < needA {
			w.apack = alignedFloats(needA)
		}
		if j.mode != splitShared && len(w.bpack) < needB {
			w.bpack = alignedFloats(needB)
		}
	}
}

// setChunks cuts a dimension of size n into about 4 chunks per part, in
// multiples of unit; with the batch, there are j.chunks tickets in all.
// Parts take chunks from a counter rather than fixed shares, so a worker
// that starts late (a busy machine) leaves its chunks to the others.
func (j *gemmJob) setChunks(parts, n, unit int) {
	units := ceilDiv(n, unit)
	j.chunk = ceilDiv(units, min(units, 4*parts)) * unit
	j.chunks = ceilDiv(n, j.chunk) * j.batch
}

// runPart computes tickets of the job until none are left: batch items in
// splitBatch mode, (item, chunk) pairs in the row, column and dot modes.
func (j *gemmJob) runPart(p int) {
	w := &j.work[p]
	if j.mode == splitShared {
		j.gemmShared(p)
		return
	}
	perItem := j.chunks / j.batch
	for {
		t, ok := j.nextBlock.take(uint64(j.chunks))
		if !ok {
			return
		}
		bi, c := int(t)/perItem, int(t)%perItem
		lo := c * j.chunk
		switch j.mode {
		case splitBatch:
			j.gemmBlock(w, bi, 0, j.m, 0, j.n)
		case splitRows:
			j.gemmBlock(w, bi, lo, min(j.m, lo+j.chunk), 0, j.n)
		case splitCols:
			j.gemmBlock(w, bi, 0, j.m, lo, min(j.n, lo+j.chunk))
		case splitDot:
			j.dotRows(w, bi, lo, min(j.n, lo+j.chunk))
		}
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// jobFree is the free list of jobs. It is process state by nature (a cache
// of workspaces): entries are never dropped, so steady-state calls do not
// allocate even across garbage collections.
var jobFree struct {
	sync.Mutex
	jobs []*gemmJob
}

func getJob() *gemmJob {
	jobFree.Lock()
	defer jobFree.Unlock()
	if n := len(jobFree.jobs); n > 0 {
		j := jobFree.jobs[n-1]
		jobFree.jobs = jobFree.jobs[:n-1]
		return j
	}
	return new(gemmJob)
}

func putJob(j *gemmJob) {
	j.a, j.b, j.c = nil, nil, nil // do not pin the caller's matrices
	jobFree.Lock()
	jobFree.jobs = append(jobFree.jobs, j)
	jobFree.Unlock()
}

func (j *gemmJob) crew() *crew { return &j.cr }

// runJob runs all parts of j on the shared worker pool, part 0 on the
// calling goroutine. Every mode hands out work by tickets, so a part that
// starts late (or never, when every worker is busy) only means the others
// take more tickets (in splitShared packing B panels is ticketed too, so
// the caller alone can finish any job).
func runJob(j *gemmJob) {
	if j.parts == 1 {
		j.runPart(0)
		return
	}
	workers.run(j, j.parts)
}
