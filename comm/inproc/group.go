package inproc

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gotron/gotron/comm"
)

// Group is one rank's handle on a group of a World. Like every
// comm.ProcessGroup, one goroutine at a time may call its operations;
// handles of different ranks and groups are used concurrently.
type Group struct {
	w     *World
	c     *communicator
	rank  int // rank in the group
	wrank int // rank in the world

	srcs []comm.Buffer // scratch: one view per rank
	// tickets is c.tickets at the start of the next all-reduce: every rank
	// advances it alike (see AllReduce).
	tickets int64
}

var (
	_ comm.ProcessGroup  = (*Group)(nil)
	_ comm.BatchSendRecv = (*Group)(nil)
)

func newGroup(w *World, c *communicator, rank int) *Group {
	return &Group{w: w, c: c, rank: rank, wrank: c.members[rank], srcs: make([]comm.Buffer, len(c.members))}
}

// Rank is this rank's index in the group.
func (g *Group) Rank() int { return g.rank }

// Size is the number of ranks in the group.
func (g *Group) Size() int { return len(g.c.members) }

// WorldRank is this rank's index in the world.
func (g *Group) WorldRank() int { return g.wrank }

// Ranks returns the world ranks of the group's members, in group-rank order.
func (g *Group) Ranks() []int { return slices.Clone(g.c.members) }

// NewGroup returns the sub-group of the listed world ranks (see
// comm.ProcessGroup). It never blocks.
func (g *Group) NewGroup(ranks []int) (comm.ProcessGroup, error) {
	sg, err := g.w.newSubGroup(ranks, g.wrank)
	if err != nil {
		return nil, err
	}
	return sg, nil
}

// collective publishes s, waits for every member, checks the arguments
// agree, then runs body (which does its own syncs, ending with one after its
// last read of another rank's buffers).
func (g *Group) collective(ctx context.Context, s slot, body func() error) error {
	if h := g.w.cfg.Hook; h != nil {
		h(g.wrank, s.op)
	}
	c := g.c
	if err := c.brokenErr(s.op); err != nil {
		return err
	}
	c.slots[g.rank] = s
	if err := c.sync(ctx, g.rank, s.op); err != nil {
		return err
	}
	if err := g.check(s.op); err != nil {
		if err2 := c.sync(ctx, g.rank, s.op); err2 != nil {
			return err2
		}
		return err
	}
	return body()
}

// check compares every rank's published arguments; all ranks compute the
// same answer, blaming the first rank (in group order) that disagrees with
// rank 0 or passed bad arguments.
func (g *Group) check(op string) error {
	c := g.c
	s0 := &c.slots[0]
	for i := range c.slots {
		s := &c.slots[i]
		blame := func(format string, args ...any) error {
			return &comm.RankError{Rank: c.members[i], Op: op, Err: fmt.Errorf("%w: "+format, append([]any{comm.ErrMismatch}, args...)...)}
		}
		switch {
		case s.op != s0.op:
			return blame("rank called %s while rank %d called %s", s.op, c.members[0], s0.op)
		case s.bad != nil:
			return blame("%v", s.bad)
		case s.a.DType != s0.a.DType:
			return blame("dtype %s, rank %d has %s", s.a.DType, c.members[0], s0.a.DType)
		case s.red != s0.red:
			return blame("reduce op %s, rank %d has %s", s.red, c.members[0], s0.red)
		case s.root != s0.root:
			return blame("root %d, rank %d has root %d", s.root, c.members[0], s0.root)
		}
		switch op {
		case comm.OpAllReduce, comm.OpBroadcast, comm.OpReduce:
			if s.a.Len() != s0.a.Len() {
				return blame("%d elements, rank %d has %d", s.a.Len(), c.members[0], s0.a.Len())
			}
		case comm.OpReduceScatter, comm.OpAllGather:
			if !slices.Equal(s.counts, s0.counts) {
				return blame("counts %v, rank %d has %v", s.counts, c.members[0], s0.counts)
			}
		case comm.OpAllToAll:
			for j := range c.slots {
				if s.counts[j] != c.slots[j].counts2[i] {
					return blame("sends %d elements to rank %d, which expects %d", s.counts[j], c.members[j], c.slots[j].counts2[i])
				}
			}
		}
	}
	return nil
}

func checkBuf(b comm.Buffer, what string) error {
	if err := b.Check(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func (g *Group) checkRoot(root int) error {
	if root < 0 || root >= g.Size() {
		return fmt.Errorf("root %d out of range [0, %d)", root, g.Size())
	}
	return nil
}

// chunk returns rank r's share [lo, hi) of n elements.
func (g *Group) chunk(r, n int) (int, int) {
	p := g.Size()
	return r * n / p, (r + 1) * n / p
}

// AllReduce reduces buf over all ranks: chunk by chunk, a rank reduces the
// chunk of every rank's buffer, in rank order, and writes the result
// straight into that chunk of every rank's buffer, so each byte is read
// once and written once. Chunks go to whichever ranks are running, by
// ticket: with more ranks than cores, the ones the scheduler runs first do
// the work instead of leaving a core idle while the rest wait their turn.
// Who reduces a chunk does not change its result.
func (g *Group) AllReduce(ctx context.Context, buf comm.Buffer, op comm.ReduceOp) error {
	s := slot{op: comm.OpAllReduce, red: op, a: buf, bad: checkBuf(buf, "buffer")}
	if !op.Valid() {
		s.bad = fmt.Errorf("unknown reduce op %d", int(op))
	}
	return g.collective(ctx, s, func() error {
		c, size := g.c, g.Size()
		n, es := buf.Len(), buf.DType.Size()
		// Chunks of at least 4 MiB over all ranks (the streaming-store
		// kernel's threshold) and 1 MiB per rank, at most one per rank
		// for small buffers.
		per := max(1, min((n+size-1)/size, max(allReduceChunk/es, 4*allReduceChunk/(es*size))))
		chunks := int64((n + per - 1) / per)
		for {
			k := c.tickets.Add(1) - 1 - g.tickets
			if k >= chunks {
				break
			}
			lo, hi := int(k)*per, min(int(k+1)*per, n)
			for j := range g.srcs {
				g.srcs[j] = c.slots[j].a.Slice(lo, hi)
			}
			comm.ReduceNTo(g.srcs, g.srcs, op)
		}
		g.tickets += chunks + int64(size) // each rank also took one ticket too many
		return c.finish(ctx, g.rank, comm.OpAllReduce)
	})
}

// allReduceChunk is the all-reduce work unit in bytes per rank buffer.
const allReduceChunk = 1 << 20

// ReduceScatter reduces block r of every rank's in into out on rank r.
func (g *Group) ReduceScatter(ctx context.Context, out, in comm.Buffer, op comm.ReduceOp, counts []int) error {
	s := slot{op: comm.OpReduceScatter, red: op, a: in}
	counts, err := comm.ResolveCounts(counts, in.Len(), g.Size(), "counts")
	switch {
	case err != nil:
		s.bad = err
	case !op.Valid():
		s.bad = fmt.Errorf("unknown reduce op %d", int(op))
	case checkBuf(in, "in") != nil:
		s.bad = checkBuf(in, "in")
	case out.DType != in.DType || out.Len() != counts[g.rank]:
		s.bad = fmt.Errorf("out is %d %s elements, want %d %s", out.Len(), out.DType, counts[g.rank], in.DType)
	}
	s.counts = counts
	return g.collective(ctx, s, func() error {
		off := comm.Offsets(counts)
		lo, hi := off[g.rank], off[g.rank+1]
		for j := range g.srcs {
			g.srcs[j] = g.c.slots[j].a.Slice(lo, hi)
		}
		comm.ReduceN(out, g.srcs, op)
		return g.c.finish(ctx, g.rank, comm.OpReduceScatter)
	})
}

// AllGather copies every rank's in into its block of out. in may be out's
// own block (in-place all-gather).
func (g *Group) AllGather(ctx context.Context, out, in comm.Buffer, counts []int) error {
	s := slot{op: comm.OpAllGather, a: in}
	counts, err := comm.ResolveCounts(counts, out.Len(), g.Size(), "counts")
	switch {
	case err != nil:
		s.bad = err
	case checkBuf(out, "out") != nil:
		s.bad = checkBuf(out, "out")
	case out.DType != in.DType || in.Len() != counts[g.rank]:
		s.bad = fmt.Errorf("in is %d %s elements, want %d %s", in.Len(), in.DType, counts[g.rank], out.DType)
	}
	s.counts = counts
	return g.collective(ctx, s, func() error {
		off := comm.Offsets(counts)
		for j := range g.srcs {
			dst := out.Slice(off[j], off[j+1]).Data
			if j == g.rank && len(dst) > 0 && &dst[0] == &in.Data[0] {
				continue // in place: others are reading this block
			}
			copy(dst, g.c.slots[j].a.Data)
		}
		return g.c.finish(ctx, g.rank, comm.OpAllGather)
	})
}

// Broadcast copies root's buf to every rank.
func (g *Group) Broadcast(ctx context.Context, buf comm.Buffer, root int) error {
	s := slot{op: comm.OpBroadcast, a: buf, root: root, bad: checkBuf(buf, "buffer")}
	if err := g.checkRoot(root); err != nil {
		s.bad = err
	}
	return g.collective(ctx, s, func() error {
		if g.rank != root {
			copy(buf.Data, g.c.slots[root].a.Data)
		}
		return g.c.finish(ctx, g.rank, comm.OpBroadcast)
	})
}

// Reduce reduces buf over all ranks into root's buf: rank r reduces chunk r
// straight into root's buffer.
func (g *Group) Reduce(ctx context.Context, buf comm.Buffer, op comm.ReduceOp, root int) error {
	s := slot{op: comm.OpReduce, red: op, a: buf, root: root, bad: checkBuf(buf, "buffer")}
	if err := g.checkRoot(root); err != nil {
		s.bad = err
	} else if !op.Valid() {
		s.bad = fmt.Errorf("unknown reduce op %d", int(op))
	}
	return g.collective(ctx, s, func() error {
		c := g.c
		lo, hi := g.chunk(g.rank, buf.Len())
		for j := range g.srcs {
			g.srcs[j] = c.slots[j].a.Slice(lo, hi)
		}
		comm.ReduceN(g.srcs[root], g.srcs, op)
		return c.finish(ctx, g.rank, comm.OpReduce)
	})
}

// AllToAll exchanges blocks: out's block j is rank j's in block for us.
func (g *Group) AllToAll(ctx context.Context, out, in comm.Buffer, sendCounts, recvCounts []int) error {
	s := slot{op: comm.OpAllToAll, a: in, b: out}
	sc, err1 := comm.ResolveCounts(sendCounts, in.Len(), g.Size(), "send counts")
	rc, err2 := comm.ResolveCounts(recvCounts, out.Len(), g.Size(), "recv counts")
	switch {
	case err1 != nil:
		s.bad = err1
	case err2 != nil:
		s.bad = err2
	case checkBuf(in, "in") != nil:
		s.bad = checkBuf(in, "in")
	case out.DType != in.DType:
		s.bad = fmt.Errorf("out is %s, in is %s", out.DType, in.DType)
	}
	if s.bad != nil { // keep check's cross-rank comparison in range
		sc, rc = make([]int, g.Size()), make([]int, g.Size())
	}
	s.counts, s.counts2 = sc, rc
	return g.collective(ctx, s, func() error {
		roff := comm.Offsets(rc)
		for j := range g.srcs {
			sj := &g.c.slots[j]
			soff := 0
			for k := 0; k < g.rank; k++ {
				soff += sj.counts[k]
			}
			copy(out.Slice(roff[j], roff[j+1]).Data, sj.a.Slice(soff, soff+sj.counts[g.rank]).Data)
		}
		return g.c.finish(ctx, g.rank, comm.OpAllToAll)
	})
}

// Barrier returns when every rank has called it.
func (g *Group) Barrier(ctx context.Context) error {
	return g.collective(ctx, slot{op: comm.OpBarrier}, func() error {
		return g.c.sync(ctx, g.rank, comm.OpBarrier)
	})
}

func (g *Group) checkPeer(peer int, op string) error {
	if peer < 0 || peer >= g.Size() || peer == g.rank {
		return fmt.Errorf("inproc: %s: peer %d invalid (group of %d, own rank %d)", op, peer, g.Size(), g.rank)
	}
	return nil
}

// Send hands buf to peer's matching Recv and returns once it was copied.
func (g *Group) Send(ctx context.Context, buf comm.Buffer, peer int) error {
	if h := g.w.cfg.Hook; h != nil {
		h(g.wrank, comm.OpSend)
	}
	if err := g.checkPeer(peer, comm.OpSend); err != nil {
		return err
	}
	return g.send(ctx, &message{buf: buf, done: make(chan error, 1)}, peer)
}

func (g *Group) send(ctx context.Context, m *message, peer int) error {
	c := g.c
	if err := c.brokenErr(comm.OpSend); err != nil {
		return err
	}
	t := time.NewTimer(c.timeout)
	defer t.Stop()
	select {
	case c.mbox[g.rank*g.Size()+peer] <- m:
	case <-c.broken:
		return c.brokenErr(comm.OpSend)
	case <-ctx.Done():
		c.fail(g.wrank, fmt.Errorf("%w: rank %d abandoned send: %v", comm.ErrPeerLost, g.wrank, ctx.Err()))
		return &comm.RankError{Rank: g.wrank, Op: comm.OpSend, Err: ctx.Err()}
	case <-t.C:
		return c.timeoutErr(c.members[peer], comm.OpSend)
	}
	// The receiver owns m now and always answers on the buffered m.done.
	return <-m.done
}

// Recv copies the next message from peer into buf.
func (g *Group) Recv(ctx context.Context, buf comm.Buffer, peer int) error {
	if h := g.w.cfg.Hook; h != nil {
		h(g.wrank, comm.OpRecv)
	}
	if err := g.checkPeer(peer, comm.OpRecv); err != nil {
		return err
	}
	c := g.c
	if err := c.brokenErr(comm.OpRecv); err != nil {
		return err
	}
	t := time.NewTimer(c.timeout)
	defer t.Stop()
	var m *message
	select {
	case m = <-c.mbox[peer*g.Size()+g.rank]:
	case <-c.broken:
		return c.brokenErr(comm.OpRecv)
	case <-ctx.Done():
		c.fail(g.wrank, fmt.Errorf("%w: rank %d abandoned recv: %v", comm.ErrPeerLost, g.wrank, ctx.Err()))
		return &comm.RankError{Rank: g.wrank, Op: comm.OpRecv, Err: ctx.Err()}
	case <-t.C:
		return c.timeoutErr(c.members[peer], comm.OpRecv)
	}
	if m.buf.DType != buf.DType || len(m.buf.Data) != len(buf.Data) {
		err := fmt.Errorf("%w: send of %d %s elements, recv of %d %s", comm.ErrMismatch, m.buf.Len(), m.buf.DType, buf.Len(), buf.DType)
		m.done <- &comm.RankError{Rank: g.wrank, Op: comm.OpSend, Err: err}
		return &comm.RankError{Rank: c.members[peer], Op: comm.OpRecv, Err: err}
	}
	copy(buf.Data, m.buf.Data)
	m.done <- nil
	return nil
}

// BatchSendRecv runs ops concurrently: one goroutine per (kind, peer), each
// running its ops in list order. It returns the first error in list order.
func (g *Group) BatchSendRecv(ctx context.Context, ops []comm.P2POp) error {
	type key struct {
		kind comm.P2PKind
		peer int
	}
	var order []key
	lanes := map[key][]int{}
	for i, op := range ops {
		k := key{op.Kind, op.Peer}
		if _, ok := lanes[k]; !ok {
			order = append(order, k)
		}
		lanes[k] = append(lanes[k], i)
	}
	errs := make([]error, len(ops))
	var wg sync.WaitGroup
	for _, k := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, i := range lanes[k] {
				if ops[i].Kind == comm.SendOp {
					errs[i] = g.Send(ctx, ops[i].Buf, ops[i].Peer)
				} else {
					errs[i] = g.Recv(ctx, ops[i].Buf, ops[i].Peer)
				}
				if errs[i] != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Close closes the whole world (see World.Close).
func (g *Group) Close() error { return g.w.Close() }
