package pp

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// Shape headers. The first message on each channel (peer, direction,
// activation or gradient) is preceded by a header carrying the sent
// tensor's shape, so a receiver whose stage expects another shape stops at
// the first exchange with both shapes in its error instead of computing on
// a misread buffer. Later messages on the channel carry only data (a
// different element count still fails in the transport).
const (
	headerMagic = 0x70705348 // "ppSH"
	headerLen   = 8          // int64s: magic, ndim, up to 6 dims
)

func encodeHeader(shape []int) ([]int64, error) {
	if len(shape) > headerLen-2 {
		return nil, fmt.Errorf("tensor of %d dimensions: the shape header holds at most %d", len(shape), headerLen-2)
	}
	h := make([]int64, headerLen)
	h[0], h[1] = headerMagic, int64(len(shape))
	for i, d := range shape {
		h[2+i] = int64(d)
	}
	return h, nil
}

func decodeHeader(h []int64) ([]int, error) {
	if h[0] != headerMagic || h[1] < 0 || h[1] > headerLen-2 {
		return nil, fmt.Errorf("bad shape header %v (is the peer running the same schedule?)", h)
	}
	shape := make([]int, h[1])
	for i := range shape {
		shape[i] = int(h[2+i])
	}
	return shape, nil
}

// transfer is one send or receive of a run, with what to check after.
type transfer struct {
	a      Action
	data   comm.Buffer
	header []int64 // nil when the channel's header was exchanged already
	want   []int   // receives: the expected shape
}

// exchange runs one maximal run of consecutive sends and receives: all of
// them as one batch (headers first, in a batch of their own) or, unbatched
// or without comm.BatchSendRecv, one at a time in list order.
func (e *Executor) exchange(ctx context.Context, run []Action) error {
	if e.cfg.Group == nil {
		return fmt.Errorf(errPrefix+"rank %d: %v without a pipeline group", e.rank, run[0])
	}
	xs := make([]transfer, len(run))
	for i, a := range run {
		x, err := e.prepare(a)
		if err != nil {
			return fmt.Errorf(errPrefix+"rank %d: %v: %w", e.rank, a, err)
		}
		xs[i] = x
	}
	batch, ok := e.cfg.Group.(comm.BatchSendRecv)
	if e.cfg.Unbatched || !ok {
		for i := range xs {
			if err := e.one(ctx, &xs[i]); err != nil {
				return err
			}
		}
	} else if err := e.batched(ctx, batch, xs); err != nil {
		return err
	}
	for _, x := range xs {
		e.finish(x.a)
	}
	return nil
}

// prepare finds a send's data or allocates a receive's buffer, and decides
// whether the channel's header goes first.
func (e *Executor) prepare(a Action) (transfer, error) {
	x := transfer{a: a}
	l := link{peer: a.Peer, grad: a.Op == SendGrad || a.Op == RecvGrad, send: a.Op == SendActivation || a.Op == SendGrad}
	s := e.slot(a.Chunk, a.Microbatch)
	var shape []int
	switch a.Op {
	case SendActivation:
		if s.out == nil {
			return x, errors.New("no forward output to send")
		}
		out := s.out.Contiguous()
		shape, x.data = out.Shape(), comm.Float32s(out.Float32s())
	case SendGrad:
		if s.in == nil || s.tape != nil {
			return x, errors.New("no input gradient to send (backward not run)")
		}
		shape, x.data = s.in.Shape(), comm.Float32s(s.in.Grad.Float32s())
	case RecvActivation:
		if s.in != nil {
			return x, errors.New("activation received twice")
		}
		shape = slices.Clone(e.cfg.Stages[a.Chunk].InputShape(a.Microbatch))
		n := numel(shape)
		s.in = tensor.FromFloat32(e.get(n), shape...).SetRequiresGrad(true)
		s.in.Grad = tensor.FromFloat32(e.get(n), shape...)
		x.data, x.want = comm.Float32s(s.in.Float32s()), shape
	case RecvGrad:
		if s.out == nil {
			return x, errors.New("gradient for an output this rank has not computed")
		}
		if s.grad != nil {
			return x, errors.New("gradient received twice")
		}
		shape = s.out.Shape()
		s.grad = tensor.FromFloat32(e.get(s.out.Numel()), shape...)
		x.data, x.want = comm.Float32s(s.grad.Float32s()), shape
	}
	if !e.headers[l] {
		e.headers[l] = true
		if x.want != nil {
			x.header = make([]int64, headerLen)
		} else {
			h, err := encodeHeader(shape)
			if err != nil {
				return x, err
			}
			x.header = h
		}
	}
	return x, nil
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

func (x *transfer) op(buf comm.Buffer) comm.P2POp {
	if x.a.Op == SendActivation || x.a.Op == SendGrad {
		return comm.P2POp{Kind: comm.SendOp, Peer: x.a.Peer, Buf: buf}
	}
	return comm.P2POp{Kind: comm.RecvOp, Peer: x.a.Peer, Buf: buf}
}

func (e *Executor) post(ctx context.Context, op comm.P2POp) error {
	if op.Kind == comm.SendOp {
		return e.cfg.Group.Send(ctx, op.Buf, op.Peer)
	}
	return e.cfg.Group.Recv(ctx, op.Buf, op.Peer)
}

// one runs a transfer alone: its header, a check, then its data.
func (e *Executor) one(ctx context.Context, x *transfer) error {
	if x.header != nil {
		if err := e.post(ctx, x.op(comm.Int64s(x.header))); err != nil {
			return e.commErr(x.a, err)
		}
		if err := e.checkHeader(x); err != nil {
			return e.drain(ctx, []*transfer{x}, err)
		}
	}
	if err := e.post(ctx, x.op(x.data)); err != nil {
		return e.commErr(x.a, err)
	}
	return nil
}

// batched runs the run's headers as one batch, checks them, then its data
// as another batch.
func (e *Executor) batched(ctx context.Context, b comm.BatchSendRecv, xs []transfer) error {
	var hdr []comm.P2POp
	for i := range xs {
		if xs[i].header != nil {
			hdr = append(hdr, xs[i].op(comm.Int64s(xs[i].header)))
		}
	}
	if len(hdr) > 0 {
		if err := b.BatchSendRecv(ctx, hdr); err != nil {
			return e.commErr(xs[0].a, err)
		}
	}
	var bad []*transfer
	var first error
	for i := range xs {
		if err := e.checkHeader(&xs[i]); err != nil {
			bad = append(bad, &xs[i])
			if first == nil {
				first = err
			}
		}
	}
	if first != nil {
		return e.drain(ctx, bad, first, xs...)
	}
	ops := make([]comm.P2POp, len(xs))
	for i := range xs {
		ops[i] = xs[i].op(xs[i].data)
	}
	if err := b.BatchSendRecv(ctx, ops); err != nil {
		return e.commErr(xs[0].a, err)
	}
	return nil
}

// checkHeader compares a receive's header with the shape its stage
// expects.
func (e *Executor) checkHeader(x *transfer) error {
	if x.header == nil || x.want == nil {
		return nil
	}
	got, err := decodeHeader(x.header)
	if err != nil {
		return fmt.Errorf(errPrefix+"rank %d: %v: %w", e.rank, x.a, err)
	}
	if slices.Equal(got, x.want) {
		return nil
	}
	if x.a.Op == RecvActivation {
		return fmt.Errorf(errPrefix+"rank %d: %v: the activation has shape %v but chunk %d expects %v (its InputShape): "+
			"the stages disagree on micro-batch size, sequence length or hidden size", e.rank, x.a, got, x.a.Chunk, x.want)
	}
	return fmt.Errorf(errPrefix+"rank %d: %v: the gradient has shape %v but chunk %d's forward output was %v",
		e.rank, x.a, got, x.a.Chunk, x.want)
}

// drain still takes the data of mismatched receives (into scratch buffers
// of the sender's size) so the peers' sends complete, runs the run's other
// transfers, and returns err.
func (e *Executor) drain(ctx context.Context, bad []*transfer, err error, all ...transfer) error {
	for _, x := range bad {
		if got, derr := decodeHeader(x.header); derr == nil {
			x.data = comm.Float32s(make([]float32, numel(got)))
		}
	}
	if b, ok := e.cfg.Group.(comm.BatchSendRecv); ok && len(all) > 0 {
		ops := make([]comm.P2POp, len(all))
		for i := range all {
			ops[i] = all[i].op(all[i].data)
		}
		_ = b.BatchSendRecv(ctx, ops) // best effort: err is what the caller needs
		return err
	}
	for _, x := range bad {
		_ = e.post(ctx, x.op(x.data))
	}
	return err
}

func (e *Executor) commErr(a Action, err error) error {
	return fmt.Errorf(errPrefix+"rank %d: %v: %w", e.rank, a, err)
}

// finish releases what a completed transfer no longer needs: after a
// gradient is sent back, the (chunk, micro-batch) is done on this rank.
func (e *Executor) finish(a Action) {
	if a.Op != SendGrad {
		return
	}
	k := Slot{Chunk: a.Chunk, Microbatch: a.Microbatch}
	if s := e.slots[k]; s != nil {
		e.put(s.in.Float32s())
		e.put(s.in.Grad.Float32s())
		delete(e.slots, k)
	}
}
