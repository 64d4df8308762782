package comm

import (
	"context"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/gotron/gotron/tensor"
)

// SimDevice gives a host ProcessGroup DeviceCollectives on the simulated
// device (tensor.Sim): its collectives run the wrapped group's on the sim
// tensors' own storage (tensor.SimStorage), with no host copy, as comm/nccl
// runs NCCL's on GPU memory. It is what `gotron train --device sim` joins
// its ranks with, so that every parallel plan takes the same in-place
// device path there that it takes over comm/nccl on CUDA, and its host
// copies (tensor.SimTransfers) count what a GPU run would make. Other
// tensors are refused by DeviceTensor, and callers stage them through the
// host as with any group.
//
// Groups made by NewGroup are SimDevices too, sharing the call count.
type SimDevice struct {
	ProcessGroup
	calls *atomic.Int64
}

var (
	_ DeviceCollectives = (*SimDevice)(nil)
	_ BatchSendRecv     = (*SimDevice)(nil)
)

// NewSimDevice wraps pg.
func NewSimDevice(pg ProcessGroup) *SimDevice {
	return &SimDevice{ProcessGroup: pg, calls: new(atomic.Int64)}
}

// Calls is the number of device collectives run so far by this group and
// every group made from it (each BatchSendRecvTensors counts once).
func (s *SimDevice) Calls() int64 { return s.calls.Load() }

// Unwrap returns the wrapped host group.
func (s *SimDevice) Unwrap() ProcessGroup { return s.ProcessGroup }

// NewGroup makes the wrapped group's sub-group, wrapped.
func (s *SimDevice) NewGroup(ranks []int) (ProcessGroup, error) {
	g, err := s.ProcessGroup.NewGroup(ranks)
	if err != nil {
		return nil, err
	}
	return &SimDevice{ProcessGroup: g, calls: s.calls}, nil
}

// BatchSendRecv runs the wrapped group's BatchSendRecv, or, when it has
// none, the ops one at a time in list order (as the pipeline executor's
// unbatched mode: a group's calls must not overlap).
func (s *SimDevice) BatchSendRecv(ctx context.Context, ops []P2POp) error {
	if b, ok := s.ProcessGroup.(BatchSendRecv); ok {
		return b.BatchSendRecv(ctx, ops)
	}
	for _, op := range ops {
		var err error
		if op.Kind == SendOp {
			err = s.Send(ctx, op.Buf, op.Peer)
		} else {
			err = s.Recv(ctx, op.Buf, op.Peer)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// DeviceTensor reports whether t is a contiguous sim tensor of a dtype a
// Buffer carries (float32, bfloat16, int32, int64). Over a group without
// BatchSendRecv it accepts none: BatchSendRecvTensors could not run its
// ops together there, so callers stage through the host.
func (s *SimDevice) DeviceTensor(t *tensor.Tensor) bool {
	if _, ok := s.ProcessGroup.(BatchSendRecv); !ok {
		return false
	}
	return t != nil && t.Device() == tensor.Sim && t.IsContiguous() && elemSize(t.DType()) > 0
}

// buffer returns t's device storage as a Buffer (no copy).
func (s *SimDevice) buffer(op string, t *tensor.Tensor) (Buffer, error) {
	if !s.DeviceTensor(t) {
		return Buffer{}, fmt.Errorf("%s: rank %d of %d: %v is not a contiguous sim tensor of a carried dtype", op, s.Rank(), s.Size(), t)
	}
	b, err := tensor.SimStorage(t)
	if err != nil {
		return Buffer{}, fmt.Errorf("%s: rank %d of %d: %w", op, s.Rank(), s.Size(), err)
	}
	return Buffer{t.DType(), b}, nil
}

// buffers is buffer of every tensor, all of one dtype.
func (s *SimDevice) buffers(op string, ts ...*tensor.Tensor) ([]Buffer, error) {
	s.calls.Add(1)
	bs := make([]Buffer, len(ts))
	for i, t := range ts {
		b, err := s.buffer(op, t)
		if err != nil {
			return nil, err
		}
		if t.DType() != ts[0].DType() {
			return nil, fmt.Errorf("%s: rank %d of %d: tensors of dtypes %v and %v", op, s.Rank(), s.Size(), ts[0].DType(), t.DType())
		}
		bs[i] = b
	}
	return bs, nil
}

// overlap reports whether two buffers share memory; an in-place block is
// then copied (on the device) before the host group, which wants disjoint
// buffers, sees it.
func overlap(a, b Buffer) bool {
	if len(a.Data) == 0 || len(b.Data) == 0 {
		return false
	}
	a0, b0 := uintptr(unsafe.Pointer(&a.Data[0])), uintptr(unsafe.Pointer(&b.Data[0]))
	return a0 < b0+uintptr(len(b.Data)) && b0 < a0+uintptr(len(a.Data))
}

func detach(b Buffer) Buffer {
	c := MakeBuffer(b.DType, b.Len())
	copy(c.Data, b.Data)
	return c
}

// AllReduceTensor all-reduces t's storage in place.
func (s *SimDevice) AllReduceTensor(ctx context.Context, t *tensor.Tensor, op ReduceOp) error {
	b, err := s.buffers(OpAllReduce, t)
	if err != nil {
		return err
	}
	return s.AllReduce(ctx, b[0], op)
}

// ReduceScatterTensor reduce-scatters in into out (evenly).
func (s *SimDevice) ReduceScatterTensor(ctx context.Context, out, in *tensor.Tensor, op ReduceOp) error {
	b, err := s.buffers(OpReduceScatter, out, in)
	if err != nil {
		return err
	}
	if in.Numel() != s.Size()*out.Numel() {
		return fmt.Errorf("%s: rank %d of %d: in has %d elements, want %d ranks × out's %d", OpReduceScatter, s.Rank(), s.Size(), in.Numel(), s.Size(), out.Numel())
	}
	if overlap(b[0], b[1]) {
		b[1] = detach(b[1])
	}
	return s.ReduceScatter(ctx, b[0], b[1], op, nil)
}

// AllGatherTensor all-gathers in into out (evenly).
func (s *SimDevice) AllGatherTensor(ctx context.Context, out, in *tensor.Tensor) error {
	b, err := s.buffers(OpAllGather, out, in)
	if err != nil {
		return err
	}
	if out.Numel() != s.Size()*in.Numel() {
		return fmt.Errorf("%s: rank %d of %d: out has %d elements, want %d ranks × in's %d", OpAllGather, s.Rank(), s.Size(), out.Numel(), s.Size(), in.Numel())
	}
	if overlap(b[0], b[1]) {
		b[1] = detach(b[1])
	}
	return s.AllGather(ctx, b[0], b[1], nil)
}

// BroadcastTensor broadcasts root's t.
func (s *SimDevice) BroadcastTensor(ctx context.Context, t *tensor.Tensor, root int) error {
	b, err := s.buffers(OpBroadcast, t)
	if err != nil {
		return err
	}
	return s.Broadcast(ctx, b[0], root)
}

// SendTensor sends t's storage to peer.
func (s *SimDevice) SendTensor(ctx context.Context, t *tensor.Tensor, peer int) error {
	b, err := s.buffers(OpSend, t)
	if err != nil {
		return err
	}
	return s.Send(ctx, b[0], peer)
}

// RecvTensor receives peer's next message into t's storage.
func (s *SimDevice) RecvTensor(ctx context.Context, t *tensor.Tensor, peer int) error {
	b, err := s.buffers(OpRecv, t)
	if err != nil {
		return err
	}
	return s.Recv(ctx, b[0], peer)
}

// BatchSendRecvTensors runs the sends and receives as one BatchSendRecv of
// the tensors' storage.
func (s *SimDevice) BatchSendRecvTensors(ctx context.Context, ops []TensorP2P) error {
	s.calls.Add(1)
	hops := make([]P2POp, len(ops))
	for i, op := range ops {
		name := OpSend
		if op.Kind == RecvOp {
			name = OpRecv
		}
		b, err := s.buffer(name, op.T)
		if err != nil {
			return err
		}
		hops[i] = P2POp{Kind: op.Kind, Peer: op.Peer, Buf: b}
	}
	return s.BatchSendRecv(ctx, hops)
}
