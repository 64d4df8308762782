package tcp

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// Same-host collectives through a group region.
//
// When every member of a group is on one host, large all-reduce,
// reduce-scatter and all-gather skip the pair rings and go through one
// shared-memory region per group (the shared-memory all-reduce of CPU
// training stacks, e.g. DeepSpeed's). The buffer is cut into blocks of one
// slot, each cut into n parts; for each block an all-reduce is
//
//	copy in:  rank r copies parts j ≠ r of its block into slot r   (arrive, wait for all)
//	reduce:   rank r reduces part r of every rank, in rank order
//	          (its own straight from its buffer), into its buffer
//	          and into part r of slot r                             (arrive, wait for all)
//	copy out: rank r copies part j of slot j, j ≠ r, into its block
//
// Each rank reads its buffer once and writes it once; everything else
// happens in a region small enough to stay in the last-level cache, and a
// block costs two synchronisations. The ring instead passes over each
// segment of the buffer about four times per step (a reduce-scatter step
// reads it to send and reads and writes it to reduce, an all-gather step
// writes it and reads it to send on) in 2(n-1) hand-offs between
// processes, which is what limits it when the ranks share a host's memory
// and cores: at 4 ranks on 2 cores the region's all-reduce is 1.5-2x the
// ring's busbw (docs/distributed.md).
// Reductions combine ranks in rank order, so results are bit-identical on
// every rank and from run to run.
//
// The region holds two sets of slots used by alternate blocks, so a rank
// may fill its slot for the next block while slower ranks still copy the
// previous one out: filling set s for block b needs every rank to be done
// reading block b-2, which each rank is before it arrives at block b-1's
// first synchronisation, and every rank waits for that before block b.
// Block numbers run on across collectives, so a collective needs no
// synchronisation at its start or end.
//
// Synchronisation: each rank has a phase counter it raises when it
// arrives; a waiter spins briefly, then sleeps on a shared futex word that
// every arrival bumps, and every shmPoll looks for failures: the world
// broken, ctx done, the lagging rank's connection closed (it died), or no
// progress within the timeout. Each rank also publishes what collective it
// is in (sequence number, op, size, dtype, counts); after the first
// synchronisation every rank compares, so mismatched calls fail with
// ErrMismatch rather than mixing data.
//
// Set-up, on a group's first large collective: group rank 0 creates the
// file and sends its path to every member; each member maps it if it
// shares memory with every other member; then every member tells every
// other whether it could, and the region is used only if all could (else
// the group keeps to rings, for good). Rank 0 then unlinks the file.

// DefaultRegionBytes is the target size of a group region's data (two sets
// of n slots) for a zero Config.ShmSlotBytes: 1 MiB slots for 4 ranks, the
// best of 256 KiB to 4 MiB measured on a 2-core EPYC (2 MiB for 2 ranks).
const DefaultRegionBytes = 8 << 20

const (
	regionLine    = 128       // header bytes per rank (and for the shared words)
	regionPath    = 256       // fixed size of the set-up message carrying the path
	regionCopy    = 512 << 10 // largest single copy into a slot (see copyCached)
	regionSpin    = 400
	regionPending = 0 // Group.regionState: not tried yet
	regionOn      = 1
	regionOff     = 2
)

// region is a group's mapping of its shared region.
type region struct {
	mu    sync.Mutex // held by the collective using it; shutdown takes it to unmap
	mem   []byte     // nil once unmapped
	n, me int
	slot  int       // bytes per slot
	sets  [2][]byte // each n slots

	gen      *atomic.Uint32                  // bumped by every arrival; the futex word
	sleepers *atomic.Uint32                  // ranks asleep on gen
	phase    []*atomic.Uint64                // per rank: phases arrived at
	desc     [][2][regionDesc]*atomic.Uint64 // per rank, by collective parity

	arrived uint64 // this rank's phases so far
	blocks  uint64 // blocks done, across collectives (selects the set)
	calls   uint64 // collectives begun (selects the descriptor)
	copied  atomic.Uint64
}

// regionDesc is the number of words describing a collective. Each rank
// has two descriptors, used by alternate collectives: a rank that leaves a
// collective at its last synchronisation may describe its next one before
// slower ranks have compared the last, but cannot get further ahead.
const regionDesc = 4

func regionHeader(n int) int { return (regionLine*(n+1) + 4095) / 4096 * 4096 }

// regionSlot is the slot size for a group of n ranks: the configured size,
// or DefaultRegionBytes shared by the 2n slots; a multiple of n·64
// bytes (parts stay cache-line aligned) and at least n·4 KiB.
func regionSlot(cfg int, n int) int {
	s := cfg
	if s == 0 {
		s = DefaultRegionBytes / (2 * n)
	}
	unit := 64 * n
	return max(s/unit*unit, 64*unit)
}

func newRegion(mem []byte, n, me, slot int) *region {
	r := &region{mem: mem, n: n, me: me, slot: slot, phase: make([]*atomic.Uint64, n), desc: make([][2][regionDesc]*atomic.Uint64, n)}
	p := unsafe.Pointer(&mem[0])
	r.gen = (*atomic.Uint32)(p)
	r.sleepers = (*atomic.Uint32)(unsafe.Add(p, 64))
	for j := range n {
		q := unsafe.Add(p, regionLine*(j+1))
		r.phase[j] = (*atomic.Uint64)(q)
		for c := range 2 {
			for k := range regionDesc {
				r.desc[j][c][k] = (*atomic.Uint64)(unsafe.Add(q, 8*(1+c*regionDesc+k)))
			}
		}
	}
	data := mem[regionHeader(n):]
	set := n * slot
	r.sets[0], r.sets[1] = data[:set:set], data[set:2*set:2*set]
	return r
}

// next returns the set for the next block.
func (r *region) next() []byte {
	s := r.sets[r.blocks%2]
	r.blocks++
	return s
}

func slotOf(set []byte, slot, j int) []byte { return set[j*slot : (j+1)*slot] }

// lagging returns the first rank that has not arrived at phase k, or -1.
func (r *region) lagging(k uint64) int {
	for j, p := range r.phase {
		if p.Load() < k {
			return j
		}
	}
	return -1
}

// copyCached copies in pieces below the size from which Go's memmove
// switches to non-temporal stores: slots are read by the other ranks right
// away, so they must stay in cache. (Copies out of the region into the
// caller's buffer use copyNT, which streams past the cache.)
func copyCached(dst, src []byte) {
	for off := 0; off < len(src); off += regionCopy {
		copy(dst[off:], src[off:min(off+regionCopy, len(src))])
	}
}

// useRegion returns the group's region for a collective already past the
// small-message cut, setting it up on first use; nil means use the rings. Every rank makes the same choice: the arguments and
// the agreed state are the same everywhere.
func (g *Group) useRegion(ctx context.Context, timer *time.Timer, op string) (*region, error) {
	if g.w.cfg.ShmSlotBytes < 0 {
		return nil, nil
	}
	if g.regionState == regionPending {
		if err := g.setupRegion(ctx, timer, op); err != nil {
			return nil, err
		}
	}
	if g.regionState != regionOn {
		return nil, nil
	}
	return g.region, nil
}

// setupRegion runs the set-up exchange (see the top of this file).
func (g *Group) setupRegion(ctx context.Context, timer *time.Timer, op string) error {
	n, me := g.Size(), g.rank
	eligible := !g.w.cfg.NoShm
	for j := range n {
		if j != me && g.conn(j).shm == nil {
			eligible = false
		}
	}
	slot := regionSlot(g.w.cfg.ShmSlotBytes, n)
	size := regionHeader(n) + 2*n*slot
	var mem []byte
	var path string
	msg := make([]byte, regionPath)
	if me == 0 && eligible {
		mem, path = createShmFile(size)
		if mem != nil && len(path) >= regionPath-2 {
			unmapShm(mem)
			os.Remove(path)
			mem, path = nil, ""
		}
		binary.LittleEndian.PutUint16(msg, uint16(len(path)))
		copy(msg[2:], path)
	}
	if path != "" {
		defer os.Remove(path) // every member has mapped it (or given up) when the exchange ends
	}
	err := g.direct(ctx, timer, op, func(int) []byte {
		if me == 0 {
			return msg
		}
		return nil
	}, func(j int) []byte {
		if j == 0 {
			return msg
		}
		return nil
	})
	if err != nil {
		if mem != nil {
			unmapShm(mem)
		}
		return err
	}
	if me != 0 {
		if l := int(binary.LittleEndian.Uint16(msg)); eligible && l > 0 && l <= regionPath-2 {
			mem = openShmFile(string(msg[2:2+l]), size)
		}
	}
	ok := make([]byte, n)
	if mem != nil {
		ok[me] = 1
	}
	err = g.direct(ctx, timer, op, func(int) []byte { return ok[me : me+1] }, func(j int) []byte { return ok[j : j+1] })
	all := err == nil
	for _, v := range ok {
		all = all && v == 1
	}
	if !all {
		if mem != nil {
			unmapShm(mem)
		}
		g.regionState = regionOff
		return err
	}
	r := newRegion(mem, n, me, slot)
	if !g.w.addRegion(r) { // the world closed meanwhile
		unmapShm(mem)
		g.regionState = regionOff
		return g.w.failure(op)
	}
	g.region, g.regionState = r, regionOn
	return nil
}

// addRegion registers r for shutdown; false if the world is closed.
func (w *world) addRegion(r *region) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	w.regions = append(w.regions, r)
	return true
}

// closeRegions unmaps every region once no collective uses it: waiters
// are woken, see the world broken and let go.
func (w *world) closeRegions() {
	w.mu.Lock()
	regs := w.regions
	w.regions = nil
	w.mu.Unlock()
	for _, r := range regs {
		futexWakeAll((*uint32)(unsafe.Pointer(r.gen)))
		r.mu.Lock()
		unmapShm(r.mem)
		r.mem = nil
		r.mu.Unlock()
	}
}

// regionCall is one collective's use of a region.
type regionCall struct {
	g      *Group
	r      *region
	ctx    context.Context
	op     string
	desc   [regionDesc]uint64
	parity uint64
	first  bool
}

// beginRegion locks the region for the collective described by nbytes,
// dtype, reduce op and counts (nil for even) and publishes the description.
func (g *Group) beginRegion(ctx context.Context, r *region, op string, nbytes int, dt tensor.DType, red comm.ReduceOp, counts []int) (*regionCall, error) {
	r.mu.Lock()
	if r.mem == nil {
		r.mu.Unlock()
		return nil, g.w.failure(op)
	}
	h := uint64(14695981039346656037) // FNV-1a over the counts
	for _, c := range counts {
		h = (h ^ uint64(c)) * 1099511628211
	}
	c := &g.call
	*c = regionCall{g: g, r: r, ctx: ctx, op: op, first: true, parity: r.calls % 2,
		desc: [regionDesc]uint64{uint64(g.cur), uint64(nbytes), uint64(dt)<<8 | uint64(red), h}}
	r.calls++
	for k, v := range c.desc {
		r.desc[r.me][c.parity][k].Store(v)
	}
	return c, nil
}

func (c *regionCall) end() { c.r.mu.Unlock() }

// sync arrives at the next phase and waits for every rank to arrive there.
// After the collective's first phase it checks that every rank is in the
// same collective.
func (c *regionCall) sync() error {
	r, g, w := c.r, c.g, c.g.w
	r.arrived++
	k := r.arrived
	r.phase[r.me].Store(k)
	r.gen.Add(1)
	if r.sleepers.Load() != 0 {
		futexWakeAll((*uint32)(unsafe.Pointer(r.gen)))
	}
	deadline := time.Now().Add(w.cfg.Timeout)
	seen := r.gen.Load()
	for spin := 0; ; spin++ {
		lag := r.lagging(k)
		if lag < 0 {
			break
		}
		if spin < regionSpin {
			if spin >= regionSpin/2 {
				osYield() // ranks may outnumber cores: let a lagging one run
			}
			continue
		}
		v := r.gen.Load()
		r.sleepers.Add(1)
		if r.lagging(k) >= 0 {
			futexSleep((*uint32)(unsafe.Pointer(r.gen)), v, shmPoll)
		}
		r.sleepers.Add(^uint32(0))
		if err := w.failure(c.op); err != nil {
			return err
		}
		if err := c.ctx.Err(); err != nil {
			w.fail(w.rank, fmt.Errorf("%w: rank %d abandoned %s: %v", comm.ErrPeerLost, w.rank, c.op, err), true)
			return &comm.RankError{Rank: w.rank, Op: c.op, Err: err}
		}
		if lag = r.lagging(k); lag < 0 {
			break
		}
		select {
		case <-g.conn(lag).readerDone:
			w.fail(g.members[lag], fmt.Errorf("%w: connection to rank %d closed", comm.ErrPeerLost, g.members[lag]), true)
			return w.failure(c.op)
		default:
		}
		now := time.Now()
		if v = r.gen.Load(); v != seen {
			seen, deadline = v, now.Add(w.cfg.Timeout) // progress: the timeout bounds silence
		} else if now.After(deadline) {
			w.fail(g.members[lag], fmt.Errorf("%w: rank %d did not arrive within %v", comm.ErrTimeout, g.members[lag], w.cfg.Timeout), true)
			return w.failure(c.op)
		}
		spin = 0
	}
	if c.first {
		c.first = false
		for j := range r.n {
			for k, v := range c.desc {
				if got := r.desc[j][c.parity][k].Load(); got != v {
					return &comm.RankError{Rank: g.members[j], Op: c.op, Err: fmt.Errorf("%w: rank %d is in another collective "+
						"or passed other sizes, dtypes, ops or counts (ranks called operations in different orders)", comm.ErrMismatch, g.members[j])}
				}
			}
		}
	}
	return nil
}

// regionAllReduce, block by block: rank r copies the parts j ≠ r of its
// block into its slot, reduces part r of every rank (its own straight from
// its buffer) into its buffer and into part r of its slot, then copies the
// other ranks' results out of their slots. Each rank thus reads and writes
// its buffer once; the region is read n-1 times per byte it holds.
func (g *Group) regionAllReduce(ctx context.Context, r *region, buf comm.Buffer, op comm.ReduceOp) error {
	c, err := g.beginRegion(ctx, r, comm.OpAllReduce, len(buf.Data), buf.DType, op, nil)
	if err != nil {
		return err
	}
	defer c.end()
	n, es, me := r.n, buf.DType.Size(), r.me
	per := r.slot / es
	srcs, dsts := g.srcs, g.dsts[:]
	for lo := 0; lo < buf.Len(); lo += per {
		m := min(per, buf.Len()-lo)
		block := buf.Data[lo*es : (lo+m)*es]
		part := func(j int) (int, int) { return j * m / n * es, (j + 1) * m / n * es }
		set := r.next()
		mine := slotOf(set, r.slot, me)
		for j := range n {
			if a, b := part(j); j != me {
				copyCached(mine[a:b], block[a:b])
				r.copied.Add(uint64(b - a))
			}
		}
		if err := c.sync(); err != nil {
			return err
		}
		a, b := part(me)
		for p := a; p < b; p += regionCopy { // pieces keep ReduceNTo's stores cached
			q := min(p+regionCopy, b)
			for j := range n {
				srcs[j] = comm.Buffer{DType: buf.DType, Data: slotOf(set, r.slot, j)[p:q]}
			}
			srcs[me] = comm.Buffer{DType: buf.DType, Data: block[p:q]}
			dsts[0], dsts[1] = srcs[me], comm.Buffer{DType: buf.DType, Data: mine[p:q]}
			comm.ReduceNTo(dsts, srcs, op)
		}
		if err := c.sync(); err != nil {
			return err
		}
		for j := range n {
			if a, b := part(j); j != me {
				copyNT(block[a:b], slotOf(set, r.slot, j)[a:b])
			}
		}
	}
	return nil
}

// regionReduceScatter: block k carries piece k (slot/n bytes) of every
// rank's segment j in part j of its slot; rank j reduces part j of every
// slot straight into out.
func (g *Group) regionReduceScatter(ctx context.Context, r *region, out, in comm.Buffer, op comm.ReduceOp, counts, off []int) error {
	c, err := g.beginRegion(ctx, r, comm.OpReduceScatter, len(in.Data), in.DType, op, counts)
	if err != nil {
		return err
	}
	defer c.end()
	n, es := r.n, in.DType.Size()
	part := r.slot / n
	per := part / es
	srcs := g.srcs
	for lo := 0; lo < maxCount(counts); lo += per {
		set := r.next()
		mine := slotOf(set, r.slot, r.me)
		for j := range n {
			if m := min(per, counts[j]-lo); m > 0 {
				copyCached(mine[j*part:], in.Data[(off[j]+lo)*es:(off[j]+lo+m)*es])
				r.copied.Add(uint64(m * es))
			}
		}
		if err := c.sync(); err != nil {
			return err
		}
		if m := min(per, counts[r.me]-lo); m > 0 {
			for j := range n {
				srcs[j] = comm.Buffer{DType: in.DType, Data: slotOf(set, r.slot, j)[r.me*part : r.me*part+m*es]}
			}
			comm.ReduceN(out.Slice(lo, lo+m), srcs, op)
		}
	}
	return nil
}

// regionAllGather: block k carries piece k (a slot) of every rank's in.
func (g *Group) regionAllGather(ctx context.Context, r *region, out, in comm.Buffer, counts, off []int) error {
	c, err := g.beginRegion(ctx, r, comm.OpAllGather, len(out.Data), out.DType, 0, counts)
	if err != nil {
		return err
	}
	defer c.end()
	es := out.DType.Size()
	per := r.slot / es
	for lo := 0; lo < maxCount(counts); lo += per {
		set := r.next()
		if m := min(per, counts[r.me]-lo); m > 0 {
			copyCached(slotOf(set, r.slot, r.me), in.Data[lo*es:(lo+m)*es])
			r.copied.Add(uint64(m * es))
		}
		if err := c.sync(); err != nil {
			return err
		}
		for j := range r.n {
			if m := min(per, counts[j]-lo); m > 0 && j != r.me {
				copy(out.Data[(off[j]+lo)*es:(off[j]+lo+m)*es], slotOf(set, r.slot, j))
			}
		}
	}
	return nil
}

func maxCount(counts []int) int {
	m := 0
	for _, c := range counts {
		m = max(m, c)
	}
	return m
}
