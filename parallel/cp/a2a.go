package cp

import (
	"context"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// a2aCall is a2a (Ulysses) context parallelism, one call: Megatron's
// AttnFuncWithCPAndQKVOA2A. An all-to-all turns q, k, v from this rank's
// two sequence chunks of every head into the whole sequence of heads
// [rank·H/C, (rank+1)·H/C) (query groups likewise), in sequence order;
// ordinary attention runs over them (its dropout keyed by global head),
// and the inverse all-to-all brings the output back to the sequence split.
// Backward mirrors it.
type a2aCall struct {
	a   *Attention
	cfg tensor.AttentionConfig
	g   geometry

	q, k, v, out, lse *tensor.Tensor // whole sequence, this rank's heads
}

// toHeads is the forward all-to-all of x (b, 2c, h, d), this rank's chunks
// of every head, into (b, 2C·c, h/C, d): the whole sequence of this rank's
// h/C heads.
func (f *a2aCall) toHeads(tp *tensor.Tape, op string, x *tensor.Tensor) *tensor.Tensor {
	size := f.a.Group.Size()
	b, c, h, d := x.Dim(0), x.Dim(1)/2, x.Dim(2), x.Dim(3)
	hs := h / size
	if out, ok := f.toHeadsDevice(tp, op, x); ok {
		return out
	}
	src := stageOut(x)
	send := make([]float32, len(src))
	row := hs * d // one token's elements of one rank's heads
	n := 0
	for p := range size {
		for bb := range b {
			for t := range 2 * c {
				off := ((bb*2*c+t)*h + p*hs) * d
				n += copy(send[n:n+row], src[off:off+row])
			}
		}
	}
	recv := make([]float32, len(src))
	if !f.a.wait(tp, op, func(ctx context.Context) error {
		return f.a.Group.AllToAll(ctx, comm.Float32s(recv), comm.Float32s(send), nil, nil)
	}) {
		return tensor.ZerosOn(x.Device(), b, 2*size*c, hs, d)
	}
	full := make([]float32, len(src))
	block := b * 2 * c * row // what each rank sent
	for p := range size {
		ids := [2]int{p, 2*size - 1 - p}
		for bb := range b {
			for t := range 2 * c {
				pos := ids[t/c]*c + t%c
				in := recv[p*block+(bb*2*c+t)*row:][:row]
				copy(full[(bb*2*size*c+pos)*row:][:row], in)
			}
		}
	}
	return tensor.FromFloat32(full, b, 2*size*c, hs, d).ToDevice(x.Device())
}

// toSequence is the inverse all-to-all: y (b, 2C·c, h/C, d), the whole
// sequence of this rank's heads, into (b, 2c, h, d), this rank's chunks of
// every head.
func (f *a2aCall) toSequence(tp *tensor.Tape, op string, y *tensor.Tensor) *tensor.Tensor {
	size := f.a.Group.Size()
	b, hs, d := y.Dim(0), y.Dim(2), y.Dim(3)
	c := y.Dim(1) / (2 * size)
	h := hs * size
	if out, ok := f.toSequenceDevice(tp, op, y); ok {
		return out
	}
	src := stageOut(y)
	row := hs * d
	send := make([]float32, len(src))
	block := b * 2 * c * row
	for p := range size {
		ids := [2]int{p, 2*size - 1 - p}
		for bb := range b {
			for t := range 2 * c {
				pos := ids[t/c]*c + t%c
				copy(send[p*block+(bb*2*c+t)*row:][:row], src[(bb*2*size*c+pos)*row:][:row])
			}
		}
	}
	recv := make([]float32, len(src))
	if !f.a.wait(tp, op, func(ctx context.Context) error {
		return f.a.Group.AllToAll(ctx, comm.Float32s(recv), comm.Float32s(send), nil, nil)
	}) {
		return tensor.ZerosOn(y.Device(), b, 2*c, h, d)
	}
	local := make([]float32, len(src))
	for p := range size {
		for bb := range b {
			for t := range 2 * c {
				copy(local[((bb*2*c+t)*h+p*hs)*d:][:row], recv[p*block+(bb*2*c+t)*row:][:row])
			}
		}
	}
	return tensor.FromFloat32(local, b, 2*c, h, d).ToDevice(y.Device())
}

func (f *a2aCall) Forward(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
	q, k, v := in[0], in[1], in[2]
	f.g = geometryOf(q, k)
	g := f.g
	size, rank := f.a.Group.Size(), f.a.Group.Rank()
	f.q = f.toHeads(tp, "a2a of queries", q)
	f.k = f.toHeads(tp, "a2a of keys", k)
	f.v = f.toHeads(tp, "a2a of values", v)
	dev := q.Device()
	s := 2 * size * g.c
	f.out = tensor.NewOn(dev, tensor.Float32, g.b, s, g.hq/size, g.d)
	f.lse = tensor.NewOn(dev, tensor.Float32, g.b, g.hq/size, s)
	cfg := f.cfg
	cfg.FirstHead += rank * g.hq / size
	f.cfg = cfg
	tensor.AttentionBlockForward(f.out, f.lse, f.q, f.k, f.v, cfg)
	return []*tensor.Tensor{f.toSequence(tp, "a2a of the attention output", f.out)}
}

func (f *a2aCall) Backward(tp *tensor.Tape, gout []*tensor.Tensor) []*tensor.Tensor {
	dout := f.toHeads(tp, "a2a of the output gradient", gout[0])
	dev := dout.Device()
	dq, dk, dv := tensor.ZerosOn(dev, f.q.Shape()...), tensor.ZerosOn(dev, f.k.Shape()...), tensor.ZerosOn(dev, f.v.Shape()...)
	if tp.Err() == nil {
		tensor.AttentionBlockBackward(dq, dk, dv, dout, f.q, f.k, f.v, f.out, f.lse, f.cfg)
	}
	return []*tensor.Tensor{
		f.toSequence(tp, "a2a of the query gradient", dq),
		f.toSequence(tp, "a2a of the key gradient", dk),
		f.toSequence(tp, "a2a of the value gradient", dv),
	}
}

// allToAllDevice exchanges send[p] for recv[p] with every other rank p in
// one batch of device sends and receives (recv[me] is send[me]).
func (f *a2aCall) allToAllDevice(tp *tensor.Tape, op string, dc comm.DeviceCollectives, send, recv []*tensor.Tensor) bool {
	me := f.a.Group.Rank()
	var ops []comm.TensorP2P
	for p := range send {
		if p != me {
			ops = append(ops, comm.TensorP2P{Kind: comm.SendOp, Peer: p, T: send[p]}, comm.TensorP2P{Kind: comm.RecvOp, Peer: p, T: recv[p]})
		}
	}
	return f.a.wait(tp, op, func(ctx context.Context) error { return dc.BatchSendRecvTensors(ctx, ops) })
}

// toHeadsDevice is toHeads in place on the device, when the group has
// DeviceCollectives for x: rank p gets this rank's heads [p·h/C, (p+1)·h/C)
// of both chunks, and the received blocks are concatenated in sequence
// order, all by device copies. ok is false when the group refuses x.
func (f *a2aCall) toHeadsDevice(tp *tensor.Tape, op string, x *tensor.Tensor) (*tensor.Tensor, bool) {
	dc, ok := f.a.device(x)
	if !ok {
		return nil, false
	}
	var nt *tensor.Tape
	size := f.a.Group.Size()
	b, c, h, d := x.Dim(0), x.Dim(1)/2, x.Dim(2), x.Dim(3)
	hs := h / size
	send, recv := make([]*tensor.Tensor, size), make([]*tensor.Tensor, size)
	for p := range size {
		send[p] = nt.Narrow(x, 2, p*hs, hs).Contiguous()
		recv[p] = send[p]
		if p != f.a.Group.Rank() {
			recv[p] = tensor.NewOn(x.Device(), tensor.Float32, b, 2*c, hs, d)
		}
	}
	if !f.allToAllDevice(tp, op, dc, send, recv) {
		return tensor.ZerosOn(x.Device(), b, 2*size*c, hs, d), true
	}
	// sequence chunk i is chunk 0 of rank i, or chunk 1 of rank 2C−1−i
	parts := make([]*tensor.Tensor, 2*size)
	for i := range parts {
		owner, half := i, 0
		if i >= size {
			owner, half = 2*size-1-i, 1
		}
		parts[i] = nt.Narrow(recv[owner], 1, half*c, c)
	}
	return nt.Concat(1, parts...), true
}

// toSequenceDevice is toSequence in place on the device: rank p gets the
// sequence chunks p and 2C−1−p of this rank's heads, and the received head
// blocks are concatenated in rank order.
func (f *a2aCall) toSequenceDevice(tp *tensor.Tape, op string, y *tensor.Tensor) (*tensor.Tensor, bool) {
	dc, ok := f.a.device(y)
	if !ok {
		return nil, false
	}
	var nt *tensor.Tape
	size := f.a.Group.Size()
	b, hs, d := y.Dim(0), y.Dim(2), y.Dim(3)
	c := y.Dim(1) / (2 * size)
	send, recv := make([]*tensor.Tensor, size), make([]*tensor.Tensor, size)
	for p := range size {
		send[p] = nt.Concat(1, nt.Narrow(y, 1, p*c, c), nt.Narrow(y, 1, (2*size-1-p)*c, c))
		recv[p] = send[p]
		if p != f.a.Group.Rank() {
			recv[p] = tensor.NewOn(y.Device(), tensor.Float32, b, 2*c, hs, d)
		}
	}
	if !f.allToAllDevice(tp, op, dc, send, recv) {
		return tensor.ZerosOn(y.Device(), b, 2*c, hs*size, d), true
	}
	return nt.Concat(2, recv...), true
}
