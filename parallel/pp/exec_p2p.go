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
// a misread buffer (the sender learns of a different element count from
// the transport; of an equal one, when its peer stops). Later messages on
// the channel carry only data (a different element count still fails in
// the transport).
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
	// t is the device tensor sent or received in place when the group has
	// comm.DeviceCollectives (data is then unset until staging needs it).
	t *tensor.Tensor
}

// exchange runs one maximal run of consecutive sends and receives: all of
// them as one batch or, unbatched or without comm.BatchSendRecv, one at a
// time in list order.
func (e *Executor) exchange(ctx context.Context, run []Action) error {
	if e.cfg.Group == nil {
		return fmt.Errorf(errPrefix+"rank %d: %v without a pipeline group", e.rank, run[0])
	}
	dc, device := e.cfg.Group.(comm.DeviceCollectives)
	device = device && e.cfg.Device != tensor.CPU
	xs := make([]transfer, len(run))
	for i, a := range run {
		x, err := e.prepare(a, device)
		if err != nil {
			return fmt.Errorf(errPrefix+"rank %d: %v: %w", e.rank, a, err)
		}
		xs[i] = x
	}
	post := e.run
	if device {
		post = func(ctx context.Context, xs []transfer) error { return e.runDevice(ctx, dc, xs) }
	}
	if err := post(ctx, xs); err != nil {
		return err
	}
	for _, x := range xs {
		e.finish(x.a)
	}
	return nil
}

// prepare finds a send's data or allocates a receive's buffer, and decides
// whether the channel's header goes first. With device collectives
// (device) it leaves the data in x.t, on the device, for runDevice.
func (e *Executor) prepare(a Action, device bool) (transfer, error) {
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
		if shape = out.Shape(); device {
			x.t = out
		} else {
			x.data = comm.Float32s(hostValues(out))
		}
	case SendGrad:
		if s.in == nil || s.tape != nil {
			return x, errors.New("no input gradient to send (backward not run)")
		}
		if shape = s.in.Shape(); device {
			x.t = s.in.Grad.Contiguous()
		} else {
			x.data = comm.Float32s(hostValues(s.in.Grad))
		}
	case RecvActivation:
		if s.in != nil {
			return x, errors.New("activation received twice")
		}
		shape = slices.Clone(e.cfg.Stages[a.Chunk].InputShape(a.Microbatch))
		x.want = shape
		if device {
			s.in = tensor.ZerosOn(e.cfg.Device, shape...)
			s.in.SetRequiresGrad(true)
			s.in.Grad = tensor.ZerosOn(e.cfg.Device, shape...)
			x.t = s.in
			break
		}
		var buf []float32
		s.in, buf = e.recvTensor(shape)
		s.in.SetRequiresGrad(true)
		if e.cfg.Device == tensor.CPU {
			s.in.Grad = tensor.FromFloat32(e.get(len(buf)), shape...)
		} else {
			s.in.Grad, s.inHost = tensor.ZerosOn(e.cfg.Device, shape...), buf
		}
		x.data = comm.Float32s(buf)
	case RecvGrad:
		if s.out == nil {
			return x, errors.New("gradient for an output this rank has not computed")
		}
		if s.grad != nil {
			return x, errors.New("gradient received twice")
		}
		shape = s.out.Shape()
		x.want = shape
		if device {
			s.grad = tensor.ZerosOn(e.cfg.Device, shape...)
			x.t = s.grad
			break
		}
		var buf []float32
		s.grad, buf = e.recvTensor(shape)
		if e.cfg.Device != tensor.CPU {
			s.gradHost = buf
		}
		x.data = comm.Float32s(buf)
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

// run posts the transfers: as one batch, or one message at a time in list
// order, each header right before its data on the same channel (so the
// two sides' messages still pair in order however the runs are batched).
// A receive whose header disagrees with the expected shape fails with
// both shapes, whether the transport noticed a different length or not.
func (e *Executor) run(ctx context.Context, xs []transfer) error {
	var ops []comm.P2POp
	var owner []int // ops[i] belongs to xs[owner[i]]
	for i := range xs {
		if xs[i].header != nil {
			ops = append(ops, xs[i].op(comm.Int64s(xs[i].header)))
			owner = append(owner, i)
		}
		ops = append(ops, xs[i].op(xs[i].data))
		owner = append(owner, i)
	}
	var err error
	failed := 0 // the first transfer that may have failed
	if b, ok := e.cfg.Group.(comm.BatchSendRecv); ok && !e.cfg.Unbatched {
		err = b.BatchSendRecv(ctx, ops)
	} else {
		for i, op := range ops {
			if op.Kind == comm.SendOp {
				err = e.cfg.Group.Send(ctx, op.Buf, op.Peer)
			} else {
				err = e.cfg.Group.Recv(ctx, op.Buf, op.Peer)
			}
			if err != nil {
				failed = owner[i]
				break
			}
		}
	}
	for i := range xs {
		if herr := e.checkHeader(&xs[i]); herr != nil {
			return herr
		}
	}
	if err != nil {
		return fmt.Errorf(errPrefix+"rank %d: %v: %w", e.rank, xs[failed].a, err)
	}
	return nil
}

// runDevice posts the transfers of a run whose data live on a device
// with the group's DeviceCollectives: in place, the shape headers as small
// int64 device tensors in the same batch (or, unbatched, one message at a
// time in list order, as run). When the group refuses a tensor, the data
// are staged through host buffers and run posts them.
func (e *Executor) runDevice(ctx context.Context, dc comm.DeviceCollectives, xs []transfer) error {
	ts := make([]*tensor.Tensor, len(xs))
	for i := range xs {
		ts[i] = xs[i].t
	}
	var ops []comm.TensorP2P
	var owner []int // ops[i] belongs to xs[owner[i]]
	headers := map[int]*tensor.Tensor{}
	accepted := false
	if _, accepted = comm.DeviceOf(e.cfg.Group, ts...); accepted {
		for i := range xs {
			x := &xs[i]
			kind := comm.SendOp
			if x.want != nil {
				kind = comm.RecvOp
			}
			if x.header != nil {
				h := tensor.New(tensor.Int64, headerLen)
				copy(h.Int64s(), x.header)
				if headers[i] = h.ToDevice(e.cfg.Device); !dc.DeviceTensor(headers[i]) {
					accepted = false
					break
				}
				ops = append(ops, comm.TensorP2P{Kind: kind, Peer: x.a.Peer, T: headers[i]})
				owner = append(owner, i)
			}
			ops = append(ops, comm.TensorP2P{Kind: kind, Peer: x.a.Peer, T: x.t})
			owner = append(owner, i)
		}
	}
	if !accepted {
		return e.runStaged(ctx, xs)
	}
	var err error
	failed := 0
	if e.cfg.Unbatched {
		for i, op := range ops {
			if op.Kind == comm.SendOp {
				err = dc.SendTensor(ctx, op.T, op.Peer)
			} else {
				err = dc.RecvTensor(ctx, op.T, op.Peer)
			}
			if err != nil {
				failed = owner[i]
				break
			}
		}
	} else {
		err = dc.BatchSendRecvTensors(ctx, ops)
	}
	if err == nil {
		for i, h := range headers {
			if xs[i].want != nil {
				copy(xs[i].header, tensor.ToHost(h).Int64s())
			}
		}
		for i := range xs {
			if herr := e.checkHeader(&xs[i]); herr != nil {
				return herr
			}
		}
	}
	if err != nil {
		return fmt.Errorf(errPrefix+"rank %d: %v: %w", e.rank, xs[failed].a, err)
	}
	return nil
}

// runStaged runs device transfers through host buffers (a group that
// refuses the tensors): sends copy out, receives copy in after run.
func (e *Executor) runStaged(ctx context.Context, xs []transfer) error {
	for i := range xs {
		x := &xs[i]
		if x.want == nil {
			x.data = comm.Float32s(tensor.ToHost(x.t).Float32s())
		} else {
			x.data = comm.Float32s(make([]float32, x.t.Numel()))
		}
	}
	if err := e.run(ctx, xs); err != nil {
		return err
	}
	for _, x := range xs {
		if x.want != nil {
			tensor.Copy(x.t, tensor.FromFloat32(x.data.Float32(), x.t.Shape()...))
		}
	}
	return nil
}

// checkHeader compares a received header with the shape the stage
// expects (nothing for sends, channels past their first message, or a
// header that never arrived).
func (e *Executor) checkHeader(x *transfer) error {
	if x.header == nil || x.want == nil || x.header[0] == 0 {
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

// finish completes a transfer: off the CPU a received activation or
// gradient is copied from its host staging buffer to the device; after a
// gradient is sent back, the (chunk, micro-batch) is done on this rank.
func (e *Executor) finish(a Action) {
	k := Slot{Chunk: a.Chunk, Microbatch: a.Microbatch}
	s := e.slots[k]
	if s == nil {
		return
	}
	switch a.Op {
	case RecvActivation:
		if s.inHost != nil {
			tensor.Copy(s.in, tensor.FromFloat32(s.inHost, len(s.inHost)))
			e.put(s.inHost)
			s.inHost = nil
		}
	case RecvGrad:
		if s.gradHost != nil {
			tensor.Copy(s.grad, tensor.FromFloat32(s.gradHost, len(s.gradHost)))
			e.put(s.gradHost)
			s.gradHost = nil
		}
	case SendGrad:
		e.release(s.in)
		e.release(s.in.Grad)
		delete(e.slots, k)
	}
}
