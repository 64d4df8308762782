package nccl

import (
	"context"
	"fmt"
	"runtime"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/internal/cuda"
	"github.com/gotron/gotron/tensor"
)

// DeviceTensor reports whether t is a contiguous tensor on this process's
// GPU of a dtype NCCL carries here (float32, bfloat16, int32, int64).
func (g *Group) DeviceTensor(t *tensor.Tensor) bool {
	if t == nil || t.Device() != tensor.CUDA || !t.IsContiguous() || g.w.cudaDev == nil || tensor.CUDADevice() != g.w.cudaDev {
		return false
	}
	_, err := ncclType(t.DType())
	return err == nil
}

// tensorArgs checks tensors for op (same dtype, on the device) and returns
// the NCCL type and their device addresses.
func (g *Group) tensorArgs(op string, ts ...*tensor.Tensor) (cuda.NCCLType, []cuda.Ptr, error) {
	ptrs := make([]cuda.Ptr, len(ts))
	for i, t := range ts {
		if t == nil {
			return 0, nil, fmt.Errorf("nccl: %s: rank %d of %d (world rank %d): nil tensor", op, g.rank, len(g.ranks), g.w.rank)
		}
		if t.DType() != ts[0].DType() {
			return 0, nil, g.opError(op, ts[0].Numel(), ts[0].DType(), fmt.Errorf("tensors of dtypes %v and %v", ts[0].DType(), t.DType()))
		}
		if !g.DeviceTensor(t) {
			return 0, nil, g.opError(op, t.Numel(), t.DType(), fmt.Errorf("%v on %v is not a contiguous tensor of a carried dtype on this group's GPU", t, t.Device()))
		}
		p, err := tensor.DevicePointer(t)
		if err != nil {
			return 0, nil, g.opError(op, t.Numel(), t.DType(), err)
		}
		ptrs[i] = cuda.Ptr(p)
	}
	nt, err := ncclType(ts[0].DType())
	if err != nil {
		return 0, nil, g.opError(op, ts[0].Numel(), ts[0].DType(), err)
	}
	return nt, ptrs, nil
}

// AllReduceTensor reduces t over the group in place on the GPU. Avg is
// ncclAvg.
func (g *Group) AllReduceTensor(ctx context.Context, t *tensor.Tensor, op comm.ReduceOp) error {
	const name = comm.OpAllReduce
	nt, p, err := g.tensorArgs(name, t)
	if err != nil {
		return err
	}
	nop, err := ncclOp(op, false, g.w.version)
	if err != nil {
		return g.opError(name, t.Numel(), t.DType(), err)
	}
	c, err := g.begin(ctx, name)
	if err != nil || t.Numel() == 0 {
		return err
	}
	err = c.AllReduce(p[0], p[0], int64(t.Numel()), nt, nop)
	runtime.KeepAlive(t)
	if err != nil {
		return g.broke(name, t.Numel(), t.DType(), err)
	}
	return nil
}

// ReduceScatterTensor reduces every rank's in (Size()·out.Numel()
// elements) and leaves block Rank() in out. out may be in's block Rank()
// (in place).
func (g *Group) ReduceScatterTensor(ctx context.Context, out, in *tensor.Tensor, op comm.ReduceOp) error {
	const name = comm.OpReduceScatter
	nt, p, err := g.tensorArgs(name, out, in)
	if err != nil {
		return err
	}
	if in.Numel() != len(g.ranks)*out.Numel() {
		return g.opError(name, in.Numel(), in.DType(), fmt.Errorf("in has %d elements, want %d ranks × out's %d", in.Numel(), len(g.ranks), out.Numel()))
	}
	nop, err := ncclOp(op, false, g.w.version)
	if err != nil {
		return g.opError(name, in.Numel(), in.DType(), err)
	}
	c, err := g.begin(ctx, name)
	if err != nil || out.Numel() == 0 {
		return err
	}
	err = c.ReduceScatter(p[1], p[0], int64(out.Numel()), nt, nop)
	runtime.KeepAlive(out)
	runtime.KeepAlive(in)
	if err != nil {
		return g.broke(name, in.Numel(), in.DType(), err)
	}
	return nil
}

// AllGatherTensor concatenates every rank's in into out (Size()·in.Numel()
// elements). in may be out's block Rank() (in place).
func (g *Group) AllGatherTensor(ctx context.Context, out, in *tensor.Tensor) error {
	const name = comm.OpAllGather
	nt, p, err := g.tensorArgs(name, out, in)
	if err != nil {
		return err
	}
	if out.Numel() != len(g.ranks)*in.Numel() {
		return g.opError(name, out.Numel(), out.DType(), fmt.Errorf("out has %d elements, want %d ranks × in's %d", out.Numel(), len(g.ranks), in.Numel()))
	}
	c, err := g.begin(ctx, name)
	if err != nil || in.Numel() == 0 {
		return err
	}
	err = c.AllGather(p[1], p[0], int64(in.Numel()), nt)
	runtime.KeepAlive(out)
	runtime.KeepAlive(in)
	if err != nil {
		return g.broke(name, out.Numel(), out.DType(), err)
	}
	return nil
}

// BroadcastTensor copies root's t into t on every rank.
func (g *Group) BroadcastTensor(ctx context.Context, t *tensor.Tensor, root int) error {
	const name = comm.OpBroadcast
	nt, p, err := g.tensorArgs(name, t)
	if err != nil {
		return err
	}
	if err := g.checkPeer(name, "root", root); err != nil {
		return err
	}
	c, err := g.begin(ctx, name)
	if err != nil || t.Numel() == 0 {
		return err
	}
	err = c.Broadcast(p[0], p[0], int64(t.Numel()), nt, root)
	runtime.KeepAlive(t)
	if err != nil {
		return g.broke(name, t.Numel(), t.DType(), err)
	}
	return nil
}

// SendTensor queues the sending of t to peer (ncclSend): it completes once
// peer receives, so order the sends and receives of a pair of ranks.
func (g *Group) SendTensor(ctx context.Context, t *tensor.Tensor, peer int) error {
	return g.p2pTensor(ctx, comm.OpSend, t, peer)
}

// RecvTensor queues the receiving into t of peer's next message.
func (g *Group) RecvTensor(ctx context.Context, t *tensor.Tensor, peer int) error {
	return g.p2pTensor(ctx, comm.OpRecv, t, peer)
}

func (g *Group) p2pTensor(ctx context.Context, name string, t *tensor.Tensor, peer int) error {
	nt, p, err := g.tensorArgs(name, t)
	if err != nil {
		return err
	}
	if err := g.checkPeer(name, "peer", peer); err != nil {
		return err
	}
	c, err := g.begin(ctx, name)
	if err != nil || t.Numel() == 0 {
		return err
	}
	err = grouped(g.w.dev, func() error {
		if name == comm.OpSend {
			return c.Send(p[0], int64(t.Numel()), nt, peer)
		}
		return c.Recv(p[0], int64(t.Numel()), nt, peer)
	})
	runtime.KeepAlive(t)
	if err != nil {
		return g.broke(name, t.Numel(), t.DType(), err)
	}
	return nil
}

// BatchSendRecvTensors queues ops as one NCCL group of sends and receives
// on device tensors (ncclGroupStart, ncclSend/ncclRecv, ncclGroupEnd), so a
// pair of ranks may list their sends and receives in any order.
func (g *Group) BatchSendRecvTensors(ctx context.Context, ops []comm.TensorP2P) error {
	name := "batch_isend_irecv"
	if len(ops) == 1 {
		name = comm.OpSend
		if ops[0].Kind == comm.RecvOp {
			name = comm.OpRecv
		}
	}
	types := make([]cuda.NCCLType, len(ops))
	ptrs := make([]cuda.Ptr, len(ops))
	total := 0
	for i, o := range ops {
		nt, p, err := g.tensorArgs(name, o.T)
		if err != nil {
			return err
		}
		if err := g.checkPeer(name, "peer", o.Peer); err != nil {
			return err
		}
		if o.Kind != comm.SendOp && o.Kind != comm.RecvOp {
			return g.opError(name, o.T.Numel(), o.T.DType(), fmt.Errorf("op %d has kind %d, want SendOp or RecvOp", i, o.Kind))
		}
		types[i], ptrs[i] = nt, p[0]
		total += o.T.Numel()
	}
	c, err := g.begin(ctx, name)
	if err != nil || total == 0 {
		return err
	}
	err = grouped(g.w.dev, func() error {
		for i, o := range ops {
			n := int64(o.T.Numel())
			switch {
			case n == 0:
			case o.Kind == comm.SendOp:
				if err := c.Send(ptrs[i], n, types[i], o.Peer); err != nil {
					return err
				}
			default:
				if err := c.Recv(ptrs[i], n, types[i], o.Peer); err != nil {
					return err
				}
			}
		}
		return nil
	})
	for _, o := range ops {
		runtime.KeepAlive(o.T)
	}
	if err != nil {
		dt := tensor.Float32
		if len(ops) > 0 {
			dt = ops[0].T.DType()
		}
		return g.broke(name, total, dt, err)
	}
	return nil
}
