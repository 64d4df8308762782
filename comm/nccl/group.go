package nccl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/internal/cuda"
	"github.com/gotron/gotron/tensor"
)

// Group is one rank's view of a set of ranks with an NCCL communicator. It
// implements comm.ProcessGroup (host Buffers), comm.BatchSendRecv,
// comm.Closer and comm.DeviceCollectives (CUDA tensors in place).
type Group struct {
	w     *world
	ranks []int // world ranks, in group-rank order
	rank  int   // this process's rank in the group
	key   string
	world bool // the group Join returned

	mu        sync.Mutex // guards comm and destroyed
	comm      communicator
	destroyed bool
}

var (
	_ comm.ProcessGroup      = (*Group)(nil)
	_ comm.BatchSendRecv     = (*Group)(nil)
	_ comm.Closer            = (*Group)(nil)
	_ comm.DeviceCollectives = (*Group)(nil)
)

// Rank is this process's rank in the group.
func (g *Group) Rank() int { return g.rank }

// Size is the number of ranks in the group.
func (g *Group) Size() int { return len(g.ranks) }

// Ranks returns the group's members as world ranks, in group-rank order.
func (g *Group) Ranks() []int { return slices.Clone(g.ranks) }

// ncclType maps a comm dtype to NCCL's.
func ncclType(dt tensor.DType) (cuda.NCCLType, error) {
	switch dt {
	case tensor.Float32:
		return cuda.NCCLFloat32, nil
	case tensor.BFloat16:
		return cuda.NCCLBfloat16, nil
	case tensor.Int32:
		return cuda.NCCLInt32, nil
	case tensor.Int64:
		return cuda.NCCLInt64, nil
	}
	return 0, fmt.Errorf("dtype %v is not carried (want float32, bfloat16, int32 or int64)", dt)
}

// ncclOp maps a reduce op to NCCL's. Avg is NCCL's sum when the caller
// divides afterwards (host Buffers, exactly as the other backends), else
// ncclAvg, which needs NCCL 2.10 (version code 21000) or later.
func ncclOp(op comm.ReduceOp, divideAfter bool, version int) (cuda.ReduceOp, error) {
	switch op {
	case comm.Sum:
		return cuda.ReduceSum, nil
	case comm.Max:
		return cuda.ReduceMax, nil
	case comm.Min:
		return cuda.ReduceMin, nil
	case comm.Avg:
		if divideAfter {
			return cuda.ReduceSum, nil
		}
		if version < 21000 {
			return 0, fmt.Errorf("reduce op avg on device tensors needs NCCL 2.10 or later (ncclAvg); this is version %d", version)
		}
		return cuda.ReduceAvg, nil
	}
	return 0, fmt.Errorf("invalid reduce op %v", op)
}

// opError is an error of op on n elements of dt, naming this rank.
func (g *Group) opError(op string, n int, dt tensor.DType, err error) error {
	return fmt.Errorf("nccl: %s of %d %v elements: rank %d of %d (world rank %d): %w", op, n, dt, g.rank, len(g.ranks), g.w.rank, err)
}

// broke records a device or NCCL failure of op, which breaks the world.
func (g *Group) broke(op string, n int, dt tensor.DType, err error) error {
	return g.w.fail(g.opError(op, n, dt, err))
}

// begin checks ctx and the world and returns the group's communicator,
// made on first use.
func (g *Group) begin(ctx context.Context, op string) (communicator, error) {
	if err := g.w.failure(); err != nil {
		return nil, &comm.RankError{Rank: g.w.rank, Op: op, Err: err}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("nccl: %s: rank %d of %d (world rank %d): %w", op, g.rank, len(g.ranks), g.w.rank, err)
	}
	return g.communicator(ctx, op)
}

// communicator returns the group's NCCL communicator, making it (the id
// through the store, then ncclCommInitRank with every member) the first
// time.
func (g *Group) communicator(ctx context.Context, op string) (communicator, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.comm != nil {
		return g.comm, nil
	}
	if g.destroyed {
		return nil, &comm.RankError{Rank: g.w.rank, Op: op, Err: comm.ErrClosed}
	}
	fail := func(err error) error {
		return g.w.fail(fmt.Errorf("nccl: %s: rank %d of %d (world rank %d): make the communicator of world ranks %v: %w", op, g.rank, len(g.ranks), g.w.rank, g.ranks, err))
	}
	var id cuda.NCCLUniqueID
	var err error
	switch {
	case len(g.ranks) == 1:
		id, err = g.w.newID()
	case g.w.st == nil:
		err = errors.New("no rendezvous store")
	default:
		ctx, cancel := context.WithTimeout(ctx, g.w.cfg.Timeout)
		id, err = exchangeID(ctx, g.w.st, g.key, g.rank == 0, g.w.newID)
		cancel()
	}
	if err != nil {
		return nil, fail(err)
	}
	c, err := g.w.dev.newComm(id, g.ranks, g.rank)
	if err != nil {
		return nil, fail(err)
	}
	g.comm = c
	return c, nil
}

// destroy frees the group's communicator; later calls fail with ErrClosed.
func (g *Group) destroy() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.destroyed = true
	if g.comm == nil {
		return nil
	}
	err := g.comm.Destroy()
	g.comm = nil
	return err
}

// Close frees the group's communicator. Closing the world group (the one
// Join returned) frees every group's and closes the rendezvous store. It
// cannot interrupt a collective already inside NCCL.
func (g *Group) Close() error {
	if g.isWorld() {
		return g.w.shutdown()
	}
	return g.destroy()
}

func (g *Group) isWorld() bool { return g.world }

// NewGroup returns the sub-group of the world ranks listed. It does not
// communicate: the group's communicator is made on its first collective,
// which every member must call.
func (g *Group) NewGroup(ranks []int) (comm.ProcessGroup, error) {
	pos, err := comm.ValidateRanks(ranks, g.w.size, g.w.rank)
	if err != nil {
		return nil, err
	}
	return g.w.newGroup(ranks, pos), nil
}

// checkPeer checks a root or peer rank of op.
func (g *Group) checkPeer(op, what string, r int) error {
	if r < 0 || r >= len(g.ranks) {
		return fmt.Errorf("nccl: %s: rank %d of %d (world rank %d): %s %d out of range [0, %d)", op, g.rank, len(g.ranks), g.w.rank, what, r, len(g.ranks))
	}
	return nil
}

// checkBuf checks a Buffer's dtype and length and maps the dtype.
func (g *Group) checkBuf(op string, b comm.Buffer) (cuda.NCCLType, error) {
	if err := b.Check(); err != nil {
		return 0, g.opError(op, b.Len(), b.DType, err)
	}
	t, err := ncclType(b.DType)
	if err != nil {
		return 0, g.opError(op, b.Len(), b.DType, err)
	}
	return t, nil
}

// upload copies b into a new device block of at least bytes bytes (b's
// bytes at offset off), which the caller frees.
func (g *Group) upload(b comm.Buffer, bytes, off int) (cuda.Ptr, error) {
	p, err := g.w.dev.Alloc(int64(max(bytes, 1)))
	if err != nil {
		return 0, err
	}
	if len(b.Data) > 0 {
		if err := g.w.dev.CopyHtoD(p+cuda.Ptr(off), unsafe.Pointer(&b.Data[0]), int64(len(b.Data))); err != nil {
			g.w.dev.Free(p)
			return 0, err
		}
	}
	return p, nil
}

// download copies len(b.Data) bytes at p into b, after the queued work;
// with nothing to copy it waits for the stream.
func (g *Group) download(b comm.Buffer, p cuda.Ptr) error {
	if len(b.Data) == 0 {
		return g.w.dev.Synchronize()
	}
	return g.w.dev.CopyDtoH(unsafe.Pointer(&b.Data[0]), p, int64(len(b.Data)))
}

// AllReduce reduces buf over the group (host memory, staged through the
// device).
func (g *Group) AllReduce(ctx context.Context, buf comm.Buffer, op comm.ReduceOp) error {
	const name = comm.OpAllReduce
	t, err := g.checkBuf(name, buf)
	if err != nil {
		return err
	}
	nop, err := ncclOp(op, true, 0)
	if err != nil {
		return g.opError(name, buf.Len(), buf.DType, err)
	}
	c, err := g.begin(ctx, name)
	if err != nil || buf.Len() == 0 {
		return err
	}
	p, err := g.upload(buf, len(buf.Data), 0)
	if err != nil {
		return g.opError(name, buf.Len(), buf.DType, err)
	}
	defer g.w.dev.Free(p)
	if err := c.AllReduce(p, p, int64(buf.Len()), t, nop); err != nil {
		return g.broke(name, buf.Len(), buf.DType, err)
	}
	if err := g.download(buf, p); err != nil {
		return g.broke(name, buf.Len(), buf.DType, err)
	}
	if op == comm.Avg {
		comm.DivideBy(buf, len(g.ranks))
	}
	return nil
}

// Reduce leaves the reduction in root's buf: an all-reduce on a device
// copy of which only root keeps the result.
func (g *Group) Reduce(ctx context.Context, buf comm.Buffer, op comm.ReduceOp, root int) error {
	const name = comm.OpReduce
	t, err := g.checkBuf(name, buf)
	if err != nil {
		return err
	}
	if err := g.checkPeer(name, "root", root); err != nil {
		return err
	}
	nop, err := ncclOp(op, true, 0)
	if err != nil {
		return g.opError(name, buf.Len(), buf.DType, err)
	}
	c, err := g.begin(ctx, name)
	if err != nil || buf.Len() == 0 {
		return err
	}
	p, err := g.upload(buf, len(buf.Data), 0)
	if err != nil {
		return g.opError(name, buf.Len(), buf.DType, err)
	}
	defer g.w.dev.Free(p)
	if err := c.AllReduce(p, p, int64(buf.Len()), t, nop); err != nil {
		return g.broke(name, buf.Len(), buf.DType, err)
	}
	if g.rank != root {
		if err := g.w.dev.Synchronize(); err != nil {
			return g.broke(name, buf.Len(), buf.DType, err)
		}
		return nil
	}
	if err := g.download(buf, p); err != nil {
		return g.broke(name, buf.Len(), buf.DType, err)
	}
	if op == comm.Avg {
		comm.DivideBy(buf, len(g.ranks))
	}
	return nil
}

// blockLayout checks counts for a block collective and returns them and
// the padded block size (the largest count).
func (g *Group) blockLayout(op string, total int, counts []int, dt tensor.DType) ([]int, int, error) {
	cs, err := comm.ResolveCounts(counts, total, len(g.ranks), "counts")
	if err != nil {
		return nil, 0, g.opError(op, total, dt, err)
	}
	return cs, slices.Max(cs), nil
}

// ReduceScatter reduces every rank's in and leaves block Rank() in out.
// Uneven counts pad every block to the largest.
func (g *Group) ReduceScatter(ctx context.Context, out, in comm.Buffer, op comm.ReduceOp, counts []int) error {
	const name = comm.OpReduceScatter
	t, err := g.checkBuf(name, in)
	if err != nil {
		return err
	}
	if _, err := g.checkBuf(name, out); err != nil {
		return err
	}
	if out.DType != in.DType {
		return g.opError(name, in.Len(), in.DType, fmt.Errorf("out is %v, in is %v", out.DType, in.DType))
	}
	nop, err := ncclOp(op, true, 0)
	if err != nil {
		return g.opError(name, in.Len(), in.DType, err)
	}
	cs, m, err := g.blockLayout(name, in.Len(), counts, in.DType)
	if err != nil {
		return err
	}
	if out.Len() != cs[g.rank] {
		return g.opError(name, in.Len(), in.DType, fmt.Errorf("out has %d elements, this rank's block has %d", out.Len(), cs[g.rank]))
	}
	c, err := g.begin(ctx, name)
	if err != nil || m == 0 {
		return err
	}
	n, es := len(g.ranks), in.DType.Size()
	src := in
	if slices.Min(cs) != m { // uneven: pad every block to m elements
		src = comm.MakeBuffer(in.DType, n*m)
		off := comm.Offsets(cs)
		for r := range n {
			copy(src.Data[r*m*es:], in.Data[off[r]*es:off[r+1]*es])
		}
	}
	p, err := g.upload(src, n*m*es, 0)
	if err != nil {
		return g.opError(name, in.Len(), in.DType, err)
	}
	defer g.w.dev.Free(p)
	mine := p + cuda.Ptr(g.rank*m*es) // in place, as NCCL allows
	if err := c.ReduceScatter(p, mine, int64(m), t, nop); err != nil {
		return g.broke(name, in.Len(), in.DType, err)
	}
	if err := g.download(out, mine); err != nil {
		return g.broke(name, in.Len(), in.DType, err)
	}
	if op == comm.Avg {
		comm.DivideBy(out, n)
	}
	return nil
}

// AllGather concatenates every rank's in into out. Uneven counts pad every
// block to the largest.
func (g *Group) AllGather(ctx context.Context, out, in comm.Buffer, counts []int) error {
	const name = comm.OpAllGather
	t, err := g.checkBuf(name, out)
	if err != nil {
		return err
	}
	if _, err := g.checkBuf(name, in); err != nil {
		return err
	}
	if out.DType != in.DType {
		return g.opError(name, out.Len(), out.DType, fmt.Errorf("out is %v, in is %v", out.DType, in.DType))
	}
	cs, m, err := g.blockLayout(name, out.Len(), counts, out.DType)
	if err != nil {
		return err
	}
	if in.Len() != cs[g.rank] {
		return g.opError(name, out.Len(), out.DType, fmt.Errorf("in has %d elements, this rank's block has %d", in.Len(), cs[g.rank]))
	}
	c, err := g.begin(ctx, name)
	if err != nil || m == 0 {
		return err
	}
	n, es := len(g.ranks), out.DType.Size()
	p, err := g.upload(in, n*m*es, g.rank*m*es)
	if err != nil {
		return g.opError(name, out.Len(), out.DType, err)
	}
	defer g.w.dev.Free(p)
	if err := c.AllGather(p+cuda.Ptr(g.rank*m*es), p, int64(m), t); err != nil {
		return g.broke(name, out.Len(), out.DType, err)
	}
	if slices.Min(cs) == m {
		err = g.download(out, p)
	} else {
		padded := comm.MakeBuffer(out.DType, n*m)
		err = g.download(padded, p)
		off := comm.Offsets(cs)
		for r := range n {
			copy(out.Data[off[r]*es:off[r+1]*es], padded.Data[r*m*es:])
		}
	}
	if err != nil {
		return g.broke(name, out.Len(), out.DType, err)
	}
	return nil
}

// Broadcast copies root's buf to every rank.
func (g *Group) Broadcast(ctx context.Context, buf comm.Buffer, root int) error {
	const name = comm.OpBroadcast
	t, err := g.checkBuf(name, buf)
	if err != nil {
		return err
	}
	if err := g.checkPeer(name, "root", root); err != nil {
		return err
	}
	c, err := g.begin(ctx, name)
	if err != nil || buf.Len() == 0 {
		return err
	}
	src := buf
	if g.rank != root {
		src = comm.Buffer{DType: buf.DType}
	}
	p, err := g.upload(src, len(buf.Data), 0)
	if err != nil {
		return g.opError(name, buf.Len(), buf.DType, err)
	}
	defer g.w.dev.Free(p)
	if err := c.Broadcast(p, p, int64(buf.Len()), t, root); err != nil {
		return g.broke(name, buf.Len(), buf.DType, err)
	}
	dst := buf
	if g.rank == root {
		dst = comm.Buffer{DType: buf.DType} // just wait
	}
	if err := g.download(dst, p); err != nil {
		return g.broke(name, buf.Len(), buf.DType, err)
	}
	return nil
}

// AllToAll exchanges blocks with every rank: grouped sends and receives.
func (g *Group) AllToAll(ctx context.Context, out, in comm.Buffer, sendCounts, recvCounts []int) error {
	const name = comm.OpAllToAll
	t, err := g.checkBuf(name, in)
	if err != nil {
		return err
	}
	if _, err := g.checkBuf(name, out); err != nil {
		return err
	}
	if out.DType != in.DType {
		return g.opError(name, in.Len(), in.DType, fmt.Errorf("out is %v, in is %v", out.DType, in.DType))
	}
	n, es := len(g.ranks), in.DType.Size()
	sc, err := comm.ResolveCounts(sendCounts, in.Len(), n, "send counts")
	if err != nil {
		return g.opError(name, in.Len(), in.DType, err)
	}
	rc, err := comm.ResolveCounts(recvCounts, out.Len(), n, "receive counts")
	if err != nil {
		return g.opError(name, in.Len(), in.DType, err)
	}
	c, err := g.begin(ctx, name)
	if err != nil {
		return err
	}
	p, err := g.upload(in, len(in.Data), 0)
	if err != nil {
		return g.opError(name, in.Len(), in.DType, err)
	}
	defer g.w.dev.Free(p)
	q, err := g.w.dev.Alloc(int64(max(len(out.Data), 1)))
	if err != nil {
		return g.opError(name, in.Len(), in.DType, err)
	}
	defer g.w.dev.Free(q)
	soff, roff := comm.Offsets(sc), comm.Offsets(rc)
	err = grouped(g.w.dev, func() error {
		for j := range n {
			if sc[j] > 0 {
				if err := c.Send(p+cuda.Ptr(soff[j]*es), int64(sc[j]), t, j); err != nil {
					return err
				}
			}
			if rc[j] > 0 {
				if err := c.Recv(q+cuda.Ptr(roff[j]*es), int64(rc[j]), t, j); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return g.broke(name, in.Len(), in.DType, err)
	}
	if err := g.download(out, q); err != nil {
		return g.broke(name, in.Len(), in.DType, err)
	}
	return nil
}

// Barrier is an all-reduce of one element, waited for.
func (g *Group) Barrier(ctx context.Context) error {
	const name = comm.OpBarrier
	c, err := g.begin(ctx, name)
	if err != nil {
		return err
	}
	p, err := g.w.dev.Alloc(4)
	if err != nil {
		return g.opError(name, 1, tensor.Int32, err)
	}
	defer g.w.dev.Free(p)
	if err := g.w.dev.Memset(p, 4); err != nil {
		return g.broke(name, 1, tensor.Int32, err)
	}
	if err := c.AllReduce(p, p, 1, cuda.NCCLInt32, cuda.ReduceSum); err != nil {
		return g.broke(name, 1, tensor.Int32, err)
	}
	if err := g.w.dev.Synchronize(); err != nil {
		return g.broke(name, 1, tensor.Int32, err)
	}
	return nil
}

// Send sends buf to peer. The host bytes are copied to the device before
// Send returns; the transfer itself is queued on the stream (ncclSend), so
// a pair of ranks that both send before they receive deadlocks, as with
// NCCL: order the pair, or use BatchSendRecv.
func (g *Group) Send(ctx context.Context, buf comm.Buffer, peer int) error {
	return g.BatchSendRecv(ctx, []comm.P2POp{{Kind: comm.SendOp, Peer: peer, Buf: buf}})
}

// Recv receives the next message from peer into buf.
func (g *Group) Recv(ctx context.Context, buf comm.Buffer, peer int) error {
	return g.BatchSendRecv(ctx, []comm.P2POp{{Kind: comm.RecvOp, Peer: peer, Buf: buf}})
}

// BatchSendRecv runs ops as one NCCL group of sends and receives, then
// copies the received messages to their host buffers.
func (g *Group) BatchSendRecv(ctx context.Context, ops []comm.P2POp) error {
	name, total, dt := comm.OpSend, 0, tensor.Float32
	for _, o := range ops {
		total += o.Buf.Len()
		dt = o.Buf.DType
		if o.Kind == comm.RecvOp {
			name = comm.OpRecv
		}
	}
	if len(ops) > 1 {
		name = "batch_isend_irecv"
	}
	types := make([]cuda.NCCLType, len(ops))
	for i, o := range ops {
		t, err := g.checkBuf(name, o.Buf)
		if err != nil {
			return err
		}
		types[i] = t
		if err := g.checkPeer(name, "peer", o.Peer); err != nil {
			return err
		}
		if o.Kind != comm.SendOp && o.Kind != comm.RecvOp {
			return g.opError(name, total, dt, fmt.Errorf("op %d has kind %d, want SendOp or RecvOp", i, o.Kind))
		}
	}
	c, err := g.begin(ctx, name)
	if err != nil || total == 0 {
		return err
	}
	ptrs := make([]cuda.Ptr, len(ops))
	defer func() {
		for _, p := range ptrs {
			if p != 0 {
				g.w.dev.Free(p)
			}
		}
	}()
	for i, o := range ops {
		if o.Buf.Len() == 0 {
			continue
		}
		src := o.Buf
		if o.Kind == comm.RecvOp {
			src = comm.Buffer{DType: o.Buf.DType}
		}
		if ptrs[i], err = g.upload(src, len(o.Buf.Data), 0); err != nil {
			return g.opError(name, total, dt, err)
		}
	}
	err = grouped(g.w.dev, func() error {
		for i, o := range ops {
			switch {
			case o.Buf.Len() == 0:
			case o.Kind == comm.SendOp:
				if err := c.Send(ptrs[i], int64(o.Buf.Len()), types[i], o.Peer); err != nil {
					return err
				}
			default:
				if err := c.Recv(ptrs[i], int64(o.Buf.Len()), types[i], o.Peer); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return g.broke(name, total, dt, err)
	}
	for i, o := range ops {
		if o.Kind == comm.RecvOp && o.Buf.Len() > 0 {
			if err := g.download(o.Buf, ptrs[i]); err != nil {
				return g.broke(name, total, dt, err)
			}
		}
	}
	return nil
}
