package tcp

import (
	"context"
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/gotron/gotron/comm"
)

// Group is one rank's handle on a group of a job. One goroutine at a time
// may call its operations; different groups may be used concurrently.
type Group struct {
	w       *world
	tag     uint32 // collective frames: tag<<1, point-to-point: tag<<1|1
	members []int  // world rank of each group rank
	rank    int

	// Scratch space reused by every operation (no per-message allocation).
	work, tmp []uint64
	reqs      []*req
	srcs      []comm.Buffer
	one       []int32
	errc      chan error

	region      *region // shared region of a same-host group (region.go)
	regionState int     // regionPending, regionOn or regionOff
	call        regionCall
	dsts        [2]comm.Buffer
	timer       *time.Timer // the current operation's; see beginP2P

	seq              uint32   // collectives begun on this group
	cur              uint32   // current collective's frame seq: op code<<24 | seq
	sendSeq, recvSeq []uint32 // point-to-point messages per peer
}

var (
	_ comm.ProcessGroup  = (*Group)(nil)
	_ comm.BatchSendRecv = (*Group)(nil)
	_ comm.Closer        = (*Group)(nil)
)

func newGroup(w *world, tag uint32, members []int, worldRank int) *Group {
	n := len(members)
	g := &Group{w: w, tag: tag, members: members, srcs: make([]comm.Buffer, n), one: make([]int32, 1), errc: make(chan error, 1),
		sendSeq: make([]uint32, n), recvSeq: make([]uint32, n)}
	g.rank = slices.Index(members, worldRank)
	return g
}

// Rank is this process's rank in the group.
func (g *Group) Rank() int { return g.rank }

// Size is the number of ranks in the group.
func (g *Group) Size() int { return len(g.members) }

// Ranks returns the world ranks of the members, in group-rank order.
func (g *Group) Ranks() []int { return slices.Clone(g.members) }

// NewGroup returns the sub-group of the listed world ranks; it reuses the
// world's connections under its own tag. It does not communicate.
func (g *Group) NewGroup(ranks []int) (comm.ProcessGroup, error) {
	if _, err := comm.ValidateRanks(ranks, g.w.size, g.w.rank); err != nil {
		return nil, err
	}
	tag, err := g.w.groupTag(ranks)
	if err != nil {
		return nil, err
	}
	return newGroup(g.w, tag, slices.Clone(ranks), g.w.rank), nil
}

// Close on the world group (the one Join returned) closes every connection,
// the listener and, on rank 0, the store: pending operations on every group
// return an error wrapping comm.ErrClosed. On a sub-group it does nothing.
// Peers still receiving from this rank see it as lost, so finish with a
// Barrier before closing.
func (g *Group) Close() error {
	if g.tag == 0 {
		g.w.shutdown()
	}
	return nil
}

func (g *Group) conn(p int) *peerConn { return g.w.conns[g.members[p]] }

func mod(a, n int) int { return ((a % n) + n) % n }

// scratch returns nbytes of 8-byte aligned scratch from *s, growing it.
func scratch(s *[]uint64, nbytes int) []byte {
	words := (nbytes + 7) / 8
	if cap(*s) < words {
		*s = make([]uint64, words)
	}
	*s = (*s)[:words]
	if nbytes == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&(*s)[0])), nbytes)
}

// begin starts a collective: it numbers it and starts its timer.
func (g *Group) begin(op string) (*time.Timer, error) {
	g.seq++
	g.cur = uint32(opCode(op))<<24 | g.seq&0xFFFFFF
	return g.beginP2P(op)
}

// opCode numbers the collectives for frame headers, so that ranks calling
// different collectives get ErrMismatch instead of each other's data.
func opCode(op string) int {
	return 1 + slices.Index([]string{comm.OpAllReduce, comm.OpReduceScatter, comm.OpAllGather, comm.OpBroadcast,
		comm.OpReduce, comm.OpAllToAll, comm.OpBarrier}, op)
}

// beginP2P starts a point-to-point operation's timer (the group's one
// timer, reused: operations on a group do not overlap).
func (g *Group) beginP2P(op string) (*time.Timer, error) {
	if err := g.w.failure(op); err != nil {
		return nil, err
	}
	if g.timer == nil {
		g.timer = time.NewTimer(g.w.cfg.Timeout)
	} else {
		g.timer.Reset(g.w.cfg.Timeout)
	}
	return g.timer, nil
}

func (g *Group) small(nbytes int) bool { return nbytes <= g.w.cfg.SmallBytes }

func argErr(op string, format string, args ...any) error {
	return fmt.Errorf("tcp: %s: "+format, append([]any{op}, args...)...)
}

func checkBuf(op string, b comm.Buffer, what string) error {
	if err := b.Check(); err != nil {
		return argErr(op, "%s: %v", what, err)
	}
	return nil
}

// waitAll waits for every request in order, cancelling the rest after the
// first error.
func (g *Group) waitAll(ctx context.Context, reqs []*req, op string, timer *time.Timer) error {
	var err error
	for _, r := range reqs {
		if err == nil {
			err = g.w.wait(ctx, r, op, timer)
		} else {
			g.w.cancel(r)
		}
	}
	return err
}

// ringStep sends send to the next rank while receiving recv from the
// previous one, both in ChunkBytes pieces. With reduce set, each received
// piece is combined into recv by the connection's reader as it lands (from
// shared memory, straight out of the ring); otherwise it is copied there.
func (g *Group) ringStep(ctx context.Context, timer *time.Timer, op string, send []byte, recv comm.Buffer, reduce bool, red comm.ReduceOp) error {
	n, tag, es := g.Size(), g.tag<<1, recv.DType.Size()
	next, prev := g.conn(mod(g.rank+1, n)), g.conn(mod(g.rank-1, n))
	chunk := max(g.w.cfg.ChunkBytes/es*es, es)
	reqs := g.reqs[:0]
	for lo := 0; lo < len(recv.Data); lo += chunk {
		piece := comm.Buffer{DType: recv.DType, Data: recv.Data[lo:min(lo+chunk, len(recv.Data))]}
		if reduce {
			reqs = append(reqs, prev.postReduce(tag, g.cur, piece, red))
		} else {
			reqs = append(reqs, prev.post(tag, g.cur, piece.Data))
		}
	}
	g.reqs = reqs
	go func() {
		var err error
		for lo := 0; lo < len(send) && err == nil; lo += chunk {
			err = next.send(ctx, tag, g.cur, send[lo:min(lo+chunk, len(send))], op)
		}
		g.errc <- err
	}()
	err := g.waitAll(ctx, reqs, op, timer)
	if serr := <-g.errc; err == nil {
		err = serr
	}
	return err
}

// ringReduceScatter reduces work in place so rank r ends with the full
// reduction of segment r (elements off[r]..off[r+1]); Avg is left as Sum.
func (g *Group) ringReduceScatter(ctx context.Context, timer *time.Timer, op string, work comm.Buffer, off []int, red comm.ReduceOp) error {
	n := g.Size()
	for s := range n - 1 {
		sseg, rseg := mod(g.rank-s-1, n), mod(g.rank-s-2, n)
		if err := g.ringStep(ctx, timer, op, work.Slice(off[sseg], off[sseg+1]).Data, work.Slice(off[rseg], off[rseg+1]), true, red); err != nil {
			return err
		}
	}
	return nil
}

// ringAllGather fills every segment of buf from its owner (rank r owns
// segment r).
func (g *Group) ringAllGather(ctx context.Context, timer *time.Timer, op string, buf comm.Buffer, off []int) error {
	n := g.Size()
	for s := range n - 1 {
		sseg, rseg := mod(g.rank-s, n), mod(g.rank-s-1, n)
		if err := g.ringStep(ctx, timer, op, buf.Slice(off[sseg], off[sseg+1]).Data, buf.Slice(off[rseg], off[rseg+1]), false, 0); err != nil {
			return err
		}
	}
	return nil
}

// direct sends sendBlock(j) to every peer j and receives recvBlock(j) from
// every peer j (zero-length blocks are skipped on both sides).
func (g *Group) direct(ctx context.Context, timer *time.Timer, op string, sendBlock, recvBlock func(j int) []byte) error {
	tag := g.tag << 1
	reqs := g.reqs[:0]
	for j := range g.Size() {
		if j != g.rank {
			if b := recvBlock(j); len(b) > 0 {
				reqs = append(reqs, g.conn(j).post(tag, g.cur, b))
			}
		}
	}
	g.reqs = reqs
	for k := 1; k < g.Size(); k++ { // start with the next rank to spread load
		j := mod(g.rank+k, g.Size())
		if b := sendBlock(j); len(b) > 0 {
			if err := g.conn(j).send(ctx, tag, g.cur, b, op); err != nil {
				for _, r := range reqs {
					g.w.cancel(r)
				}
				return err
			}
		}
	}
	return g.waitAll(ctx, reqs, op, timer)
}

// AllReduce: direct exchange and rank-order reduction up to SmallBytes,
// else ring reduce-scatter then ring all-gather.
func (g *Group) AllReduce(ctx context.Context, buf comm.Buffer, op comm.ReduceOp) error {
	if err := checkBuf(comm.OpAllReduce, buf, "buffer"); err != nil {
		return err
	}
	if !op.Valid() {
		return argErr(comm.OpAllReduce, "unknown reduce op %d", int(op))
	}
	timer, err := g.begin(comm.OpAllReduce)
	if err != nil || g.Size() == 1 {
		return err
	}
	defer timer.Stop()
	n, S := g.Size(), len(buf.Data)
	if g.small(S) || buf.Len() < n {
		tmp := scratch(&g.tmp, S*n)
		for j := range n {
			g.srcs[j] = comm.Buffer{DType: buf.DType, Data: tmp[j*S : (j+1)*S]}
		}
		g.srcs[g.rank] = buf
		err := g.direct(ctx, timer, comm.OpAllReduce, func(int) []byte { return buf.Data }, func(j int) []byte { return g.srcs[j].Data })
		if err != nil {
			return err
		}
		comm.ReduceN(buf, g.srcs, op)
		return nil
	}
	if r, err := g.useRegion(ctx, timer, comm.OpAllReduce); err != nil || r != nil {
		if err != nil {
			return err
		}
		return g.regionAllReduce(ctx, r, buf, op)
	}
	off := evenOffsets(buf.Len(), n)
	if err := g.ringReduceScatter(ctx, timer, comm.OpAllReduce, buf, off, op); err != nil {
		return err
	}
	if op == comm.Avg {
		comm.DivideBy(buf.Slice(off[g.rank], off[g.rank+1]), n)
	}
	return g.ringAllGather(ctx, timer, comm.OpAllReduce, buf, off)
}

func evenOffsets(total, n int) []int {
	off := make([]int, n+1)
	for i := range off {
		off[i] = i * total / n
	}
	return off
}

// ReduceScatter: direct below SmallBytes (block r of every rank reduced in
// rank order), else a ring on a copy of in.
func (g *Group) ReduceScatter(ctx context.Context, out, in comm.Buffer, op comm.ReduceOp, counts []int) error {
	const name = comm.OpReduceScatter
	if err := checkBuf(name, in, "in"); err != nil {
		return err
	}
	counts, err := comm.ResolveCounts(counts, in.Len(), g.Size(), "counts")
	switch {
	case err != nil:
		return argErr(name, "%v", err)
	case !op.Valid():
		return argErr(name, "unknown reduce op %d", int(op))
	case out.DType != in.DType || out.Len() != counts[g.rank]:
		return argErr(name, "out is %d %s elements, want %d %s", out.Len(), out.DType, counts[g.rank], in.DType)
	}
	off := comm.Offsets(counts)
	timer, err := g.begin(name)
	if err != nil {
		return err
	}
	defer timer.Stop()
	n, es, me := g.Size(), in.DType.Size(), g.rank
	if n == 1 {
		copy(out.Data, in.Data)
		return nil
	}
	if g.small(len(in.Data)) {
		S := len(out.Data)
		tmp := scratch(&g.tmp, S*n)
		for j := range n {
			g.srcs[j] = comm.Buffer{DType: in.DType, Data: tmp[j*S : (j+1)*S]}
		}
		g.srcs[me] = in.Slice(off[me], off[me+1])
		err := g.direct(ctx, timer, name, func(j int) []byte { return in.Data[off[j]*es : off[j+1]*es] }, func(j int) []byte { return g.srcs[j].Data })
		if err != nil {
			return err
		}
		comm.ReduceN(out, g.srcs, op)
		return nil
	}
	if r, err := g.useRegion(ctx, timer, name); err != nil || r != nil {
		if err != nil {
			return err
		}
		return g.regionReduceScatter(ctx, r, out, in, op, counts, off)
	}
	work := comm.Buffer{DType: in.DType, Data: scratch(&g.work, len(in.Data))}
	copy(work.Data, in.Data)
	if err := g.ringReduceScatter(ctx, timer, name, work, off, op); err != nil {
		return err
	}
	copy(out.Data, work.Slice(off[me], off[me+1]).Data)
	if op == comm.Avg {
		comm.DivideBy(out, n)
	}
	return nil
}

// AllGather: direct below SmallBytes, else a ring. in may be out's own
// block.
func (g *Group) AllGather(ctx context.Context, out, in comm.Buffer, counts []int) error {
	const name = comm.OpAllGather
	if err := checkBuf(name, out, "out"); err != nil {
		return err
	}
	counts, err := comm.ResolveCounts(counts, out.Len(), g.Size(), "counts")
	switch {
	case err != nil:
		return argErr(name, "%v", err)
	case out.DType != in.DType || in.Len() != counts[g.rank]:
		return argErr(name, "in is %d %s elements, want %d %s", in.Len(), in.DType, counts[g.rank], out.DType)
	}
	off := comm.Offsets(counts)
	timer, err := g.begin(name)
	if err != nil {
		return err
	}
	defer timer.Stop()
	copy(out.Slice(off[g.rank], off[g.rank+1]).Data, in.Data)
	if g.Size() == 1 {
		return nil
	}
	if g.small(len(out.Data)) {
		return g.direct(ctx, timer, name, func(int) []byte { return in.Data }, func(j int) []byte { return out.Slice(off[j], off[j+1]).Data })
	}
	if r, err := g.useRegion(ctx, timer, name); err != nil || r != nil {
		if err != nil {
			return err
		}
		return g.regionAllGather(ctx, r, out, in, counts, off)
	}
	return g.ringAllGather(ctx, timer, name, out, off)
}

// Broadcast: root sends to each rank below SmallBytes, else a pipelined
// chain root → root+1 → ... in ChunkBytes pieces.
func (g *Group) Broadcast(ctx context.Context, buf comm.Buffer, root int) error {
	const name = comm.OpBroadcast
	if err := checkBuf(name, buf, "buffer"); err != nil {
		return err
	}
	if root < 0 || root >= g.Size() {
		return argErr(name, "root %d out of range [0, %d)", root, g.Size())
	}
	timer, err := g.begin(name)
	if err != nil || g.Size() == 1 {
		return err
	}
	defer timer.Stop()
	n, tag := g.Size(), g.tag<<1
	if g.small(len(buf.Data)) {
		if g.rank == root {
			return g.direct(ctx, timer, name, func(int) []byte { return buf.Data }, func(int) []byte { return nil })
		}
		return g.direct(ctx, timer, name, func(int) []byte { return nil }, func(j int) []byte {
			if j == root {
				return buf.Data
			}
			return nil
		})
	}
	p := mod(g.rank-root, n)
	chunk := max(g.w.cfg.ChunkBytes/buf.DType.Size()*buf.DType.Size(), buf.DType.Size())
	reqs := g.reqs[:0]
	if p > 0 {
		prev := g.conn(mod(g.rank-1, n))
		for lo := 0; lo < len(buf.Data); lo += chunk {
			reqs = append(reqs, prev.post(tag, g.cur, buf.Data[lo:min(lo+chunk, len(buf.Data))]))
		}
	}
	g.reqs = reqs
	next := g.conn(mod(g.rank+1, n))
	for k, lo := 0, 0; lo < len(buf.Data); k, lo = k+1, lo+chunk {
		if p > 0 {
			if err := g.w.wait(ctx, reqs[k], name, timer); err != nil {
				for _, r := range reqs[k+1:] {
					g.w.cancel(r)
				}
				return err
			}
		}
		if p < n-1 {
			if err := next.send(ctx, tag, g.cur, buf.Data[lo:min(lo+chunk, len(buf.Data))], name); err != nil {
				if p > 0 {
					for _, r := range reqs[k+1:] {
						g.w.cancel(r)
					}
				}
				return err
			}
		}
	}
	return nil
}

// Reduce: direct to root below SmallBytes, else ring reduce-scatter on a
// copy then each rank sends its segment to root.
func (g *Group) Reduce(ctx context.Context, buf comm.Buffer, op comm.ReduceOp, root int) error {
	const name = comm.OpReduce
	if err := checkBuf(name, buf, "buffer"); err != nil {
		return err
	}
	if root < 0 || root >= g.Size() {
		return argErr(name, "root %d out of range [0, %d)", root, g.Size())
	}
	if !op.Valid() {
		return argErr(name, "unknown reduce op %d", int(op))
	}
	timer, err := g.begin(name)
	if err != nil || g.Size() == 1 {
		return err
	}
	defer timer.Stop()
	n, S, me := g.Size(), len(buf.Data), g.rank
	if g.small(S) || buf.Len() < n {
		if me != root {
			return g.direct(ctx, timer, name, func(j int) []byte {
				if j == root {
					return buf.Data
				}
				return nil
			}, func(int) []byte { return nil })
		}
		tmp := scratch(&g.tmp, S*n)
		for j := range n {
			g.srcs[j] = comm.Buffer{DType: buf.DType, Data: tmp[j*S : (j+1)*S]}
		}
		g.srcs[me] = buf
		if err := g.direct(ctx, timer, name, func(int) []byte { return nil }, func(j int) []byte { return g.srcs[j].Data }); err != nil {
			return err
		}
		comm.ReduceN(buf, g.srcs, op)
		return nil
	}
	off := evenOffsets(buf.Len(), n)
	work := comm.Buffer{DType: buf.DType, Data: scratch(&g.work, S)}
	copy(work.Data, buf.Data)
	if err := g.ringReduceScatter(ctx, timer, name, work, off, op); err != nil {
		return err
	}
	mine := work.Slice(off[me], off[me+1])
	if op == comm.Avg {
		comm.DivideBy(mine, n)
	}
	if me != root {
		return g.direct(ctx, timer, name, func(j int) []byte {
			if j == root {
				return mine.Data
			}
			return nil
		}, func(int) []byte { return nil })
	}
	copy(buf.Slice(off[me], off[me+1]).Data, mine.Data)
	return g.direct(ctx, timer, name, func(int) []byte { return nil }, func(j int) []byte { return buf.Slice(off[j], off[j+1]).Data })
}

// AllToAll sends every block directly to its rank.
func (g *Group) AllToAll(ctx context.Context, out, in comm.Buffer, sendCounts, recvCounts []int) error {
	const name = comm.OpAllToAll
	if err := checkBuf(name, in, "in"); err != nil {
		return err
	}
	sc, err := comm.ResolveCounts(sendCounts, in.Len(), g.Size(), "send counts")
	if err != nil {
		return argErr(name, "%v", err)
	}
	rc, err := comm.ResolveCounts(recvCounts, out.Len(), g.Size(), "recv counts")
	if err != nil {
		return argErr(name, "%v", err)
	}
	if out.DType != in.DType {
		return argErr(name, "out is %s, in is %s", out.DType, in.DType)
	}
	if sc[g.rank] != rc[g.rank] {
		return argErr(name, "sends %d elements to itself but expects %d", sc[g.rank], rc[g.rank])
	}
	timer, err := g.begin(name)
	if err != nil {
		return err
	}
	defer timer.Stop()
	so, ro := comm.Offsets(sc), comm.Offsets(rc)
	copy(out.Slice(ro[g.rank], ro[g.rank+1]).Data, in.Slice(so[g.rank], so[g.rank+1]).Data)
	return g.direct(ctx, timer, name, func(j int) []byte { return in.Slice(so[j], so[j+1]).Data }, func(j int) []byte { return out.Slice(ro[j], ro[j+1]).Data })
}

// Barrier is a one-element all-reduce.
func (g *Group) Barrier(ctx context.Context) error {
	timer, err := g.begin(comm.OpBarrier)
	if err != nil || g.Size() == 1 {
		return err
	}
	defer timer.Stop()
	b := comm.Int32s(g.one)
	tmp := scratch(&g.tmp, 4*g.Size())
	return g.direct(ctx, timer, comm.OpBarrier, func(int) []byte { return b.Data }, func(j int) []byte { return tmp[4*j : 4*j+4] })
}

func (g *Group) checkPeer(peer int, op string) error {
	if peer < 0 || peer >= g.Size() || peer == g.rank {
		return argErr(op, "peer %d invalid (group of %d, own rank %d)", peer, g.Size(), g.rank)
	}
	return nil
}

// Send writes buf to peer. It returns once the data is handed to the
// kernel; the receiver need not be waiting.
func (g *Group) Send(ctx context.Context, buf comm.Buffer, peer int) error {
	if err := g.checkPeer(peer, comm.OpSend); err != nil {
		return err
	}
	g.sendSeq[peer]++
	return g.conn(peer).send(ctx, g.tag<<1|1, g.sendSeq[peer], buf.Data, comm.OpSend)
}

// Recv receives the next message from peer into buf.
func (g *Group) Recv(ctx context.Context, buf comm.Buffer, peer int) error {
	if err := g.checkPeer(peer, comm.OpRecv); err != nil {
		return err
	}
	timer, err := g.beginP2P(comm.OpRecv)
	if err != nil {
		return err
	}
	defer timer.Stop()
	g.recvSeq[peer]++
	return g.w.wait(ctx, g.conn(peer).post(g.tag<<1|1, g.recvSeq[peer], buf.Data), comm.OpRecv, timer)
}

// BatchSendRecv posts every receive, then writes every send, then waits
// for the receives: no order of the list can deadlock, because sends never
// wait for the receiver.
func (g *Group) BatchSendRecv(ctx context.Context, ops []comm.P2POp) error {
	for _, op := range ops {
		name := comm.OpSend
		if op.Kind == comm.RecvOp {
			name = comm.OpRecv
		}
		if err := g.checkPeer(op.Peer, name); err != nil {
			return err
		}
	}
	timer, err := g.beginP2P(comm.OpRecv)
	if err != nil {
		return err
	}
	defer timer.Stop()
	tag := g.tag<<1 | 1
	reqs := g.reqs[:0]
	for _, op := range ops {
		if op.Kind == comm.RecvOp {
			g.recvSeq[op.Peer]++
			reqs = append(reqs, g.conn(op.Peer).post(tag, g.recvSeq[op.Peer], op.Buf.Data))
		}
	}
	g.reqs = reqs
	for _, op := range ops {
		if op.Kind == comm.SendOp {
			g.sendSeq[op.Peer]++
			if err := g.conn(op.Peer).send(ctx, tag, g.sendSeq[op.Peer], op.Buf.Data, comm.OpSend); err != nil {
				for _, r := range reqs {
					g.w.cancel(r)
				}
				return err
			}
		}
	}
	return g.waitAll(ctx, reqs, comm.OpRecv, timer)
}
