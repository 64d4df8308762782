// Package ep is expert parallelism's communication: the token exchanges of
// Megatron's MoE dispatchers (alltoall, allgather) over the expert-parallel
// process groups (EP, expert TP, and both), as autograd ops. It implements gpt.ExpertParallel; the
// dispatchers' token orders are model/gpt's (moe.go).
//
// As parallel/tp, the collectives run on host memory: tensors off the CPU
// are staged through explicit copies. A failed collective is recorded on
// the tape (tp.Fail), which Backward and Err return; the ops still return
// tensors of the right shapes.
package ep

import (
	"context"
	"fmt"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// Group is one rank's expert-parallel groups: PG, the ranks holding
// disjoint sets of experts of every MoE layer (Megatron's ep group), and,
// with expert tensor parallelism, TP (the ranks holding slices of the same
// experts: expert_tensor_parallel_group) and TPEP (both: the
// expert_tensor_and_model_parallel_group, ETP ranks fastest). nil TP is one
// expert-tensor rank, and then TPEP is PG.
type Group struct {
	PG       comm.ProcessGroup
	TP, TPEP comm.ProcessGroup
	// UseAllToAll selects Megatron's alltoall dispatcher; false, the
	// allgather dispatcher.
	UseAllToAll bool
	comm        time.Duration
}

// Size is the expert-parallel size.
func (g *Group) Size() int { return g.PG.Size() }

// Rank is this rank's index in the group.
func (g *Group) Rank() int { return g.PG.Rank() }

// TensorSize is the expert-tensor-parallel size (ETP).
func (g *Group) TensorSize() int {
	if g.TP == nil {
		return 1
	}
	return g.TP.Size()
}

// TensorRank is this rank's index in the expert-tensor-parallel group.
func (g *Group) TensorRank() int {
	if g.TP == nil {
		return 0
	}
	return g.TP.Rank()
}

// tpep is the expert tensor × model parallel group (PG without expert
// tensor parallelism).
func (g *Group) tpep() comm.ProcessGroup {
	if g.TPEP == nil {
		return g.PG
	}
	return g.TPEP
}

// AllToAllDispatch reports whether tokens go by all-to-all.
func (g *Group) AllToAllDispatch() bool { return g.UseAllToAll }

// CommTime is the time spent in the group's collectives.
func (g *Group) CommTime() time.Duration { return g.comm }

func (g *Group) collective(tp *tensor.Tape, op string, f func(ctx context.Context) error) {
	if tp.Err() != nil {
		return
	}
	start := time.Now()
	err := f(tp.Context())
	g.comm += time.Since(start)
	if err != nil {
		tp.Fail(fmt.Errorf("ep: rank %d: %s: %w", g.Rank(), op, err))
	}
}

// GatherInts returns every rank's v (equal lengths) of the expert tensor ×
// model parallel group, in its rank order (ep·ETP + etp).
func (g *Group) GatherInts(tp *tensor.Tape, v []int32) []int32 {
	pg := g.tpep()
	out := make([]int32, len(v)*pg.Size())
	g.collective(tp, "all_gather of routing counts over the expert tensor×model-parallel group", func(ctx context.Context) error {
		return pg.AllGather(ctx, comm.Int32s(out), comm.Int32s(v), nil)
	})
	return out
}

// host returns x's float32 values on the host (x itself on the CPU).
func host(x *tensor.Tensor) []float32 { return tensor.ToHost(x.Contiguous()).Float32s() }

// onDevice returns buf (rows, c) as a tensor on like's device.
func onDevice(buf []float32, like *tensor.Tensor, rows, c int) *tensor.Tensor {
	return tensor.FromFloat32(buf, rows, c).ToDevice(like.Device())
}

type fn struct {
	fwd func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor
	bwd func(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor
}

func (f fn) Forward(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor { return f.fwd(tp, in) }
func (f fn) Backward(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor { return f.bwd(tp, g) }

// exchange is the all-to-all of rows: send[j] rows of x to rank j, recv[j]
// rows from rank j.
func (g *Group) exchange(tp *tensor.Tape, x *tensor.Tensor, send, recv []int, op string) *tensor.Tensor {
	c := x.Dim(1)
	sc, rc := make([]int, len(send)), make([]int, len(recv))
	n := 0
	for j := range send {
		sc[j], rc[j] = send[j]*c, recv[j]*c
		n += recv[j]
	}
	if out, ok := g.exchangeDevice(tp, x, send, recv, n, op); ok {
		return out
	}
	out := make([]float32, n*c)
	in := host(x)
	g.collective(tp, op+" over the expert-parallel group", func(ctx context.Context) error {
		return g.PG.AllToAll(ctx, comm.Float32s(out), comm.Float32s(in), sc, rc)
	})
	return onDevice(out, x, n, c)
}

// exchangeDevice is exchange in place on the device, when the group has
// comm.DeviceCollectives for x (comm/nccl on CUDA, comm.SimDevice on sim):
// one batch of sends and receives of row blocks (NCCL's all-to-all is
// grouped sends and receives too), this rank's own block copied on the
// device. ok is false when the group refuses x: stage through the host.
func (g *Group) exchangeDevice(tp *tensor.Tape, x *tensor.Tensor, send, recv []int, n int, op string) (*tensor.Tensor, bool) {
	if x.Device() == tensor.CPU {
		return nil, false
	}
	xc := x.Contiguous()
	dc, ok := comm.DeviceOf(g.PG, xc)
	if !ok {
		return nil, false
	}
	var nt *tensor.Tape
	out := tensor.NewOn(x.Device(), tensor.Float32, n, x.Dim(1))
	me := g.PG.Rank()
	var ops []comm.TensorP2P
	so, ro := 0, 0
	for j := range send {
		if j == me {
			if send[j] > 0 {
				tensor.Copy(nt.Narrow(out, 0, ro, recv[j]), nt.Narrow(xc, 0, so, send[j]))
			}
		} else {
			if send[j] > 0 {
				ops = append(ops, comm.TensorP2P{Kind: comm.SendOp, Peer: j, T: nt.Narrow(xc, 0, so, send[j])})
			}
			if recv[j] > 0 {
				ops = append(ops, comm.TensorP2P{Kind: comm.RecvOp, Peer: j, T: nt.Narrow(out, 0, ro, recv[j])})
			}
		}
		so += send[j]
		ro += recv[j]
	}
	g.collective(tp, op+" over the expert-parallel group", func(ctx context.Context) error { return dc.BatchSendRecvTensors(ctx, ops) })
	return out, true
}

// AllToAll sends send[j] consecutive rows of x (n, c) to rank j and returns
// the rows received (recv[j] from rank j, in rank order); its backward
// sends the gradients back.
func (g *Group) AllToAll(tp *tensor.Tape, x *tensor.Tensor, send, recv []int) *tensor.Tensor {
	if len(x.Shape()) != 2 || len(send) != g.Size() || len(recv) != g.Size() {
		panic(fmt.Sprintf("ep: AllToAll of %v with %d/%d splits over %d ranks", x.Shape(), len(send), len(recv), g.Size()))
	}
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{g.exchange(tp, in[0], send, recv, "all_to_all of tokens")}
		},
		bwd: func(tp *tensor.Tape, gr []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{g.exchange(tp, gr[0], recv, send, "all_to_all backward")}
		},
	}, x)[0]
}

// gather all-gathers rows over pg: rows[r] rows from rank r (nil: x's
// rows from every rank).
func (g *Group) gather(tp *tensor.Tape, pg comm.ProcessGroup, x *tensor.Tensor, rows []int, op string) *tensor.Tensor {
	n, c := x.Dim(0), x.Dim(1)
	total := pg.Size() * n
	var counts []int
	if rows != nil {
		counts, total = make([]int, len(rows)), 0
		for r, k := range rows {
			counts[r] = k * c
			total += k
		}
	}
	if rows == nil && x.Device() != tensor.CPU { // even blocks: in place on the device when the group can
		xc := x.Contiguous()
		if dc, ok := comm.DeviceOf(pg, xc); ok {
			out := tensor.NewOn(x.Device(), tensor.Float32, total, c)
			g.collective(tp, op, func(ctx context.Context) error { return dc.AllGatherTensor(ctx, out, xc) })
			return out
		}
	}
	out := make([]float32, total*c)
	in := host(x)
	g.collective(tp, op, func(ctx context.Context) error {
		return pg.AllGather(ctx, comm.Float32s(out), comm.Float32s(in), counts)
	})
	return onDevice(out, x, total, c)
}

// reduceScatter sums x over pg and keeps this rank's block of rows: rows[r]
// rows for rank r (nil: equal blocks).
func (g *Group) reduceScatter(tp *tensor.Tape, pg comm.ProcessGroup, x *tensor.Tensor, rows []int, op string) *tensor.Tensor {
	total, c := x.Dim(0), x.Dim(1)
	var counts []int
	n := total / pg.Size()
	if rows != nil {
		counts, n = make([]int, len(rows)), rows[pg.Rank()]
		for r, k := range rows {
			counts[r] = k * c
		}
	} else if total%pg.Size() != 0 {
		panic(fmt.Sprintf("ep: reduce-scatter of %d rows over %d ranks", total, pg.Size()))
	}
	if rows == nil && x.Device() != tensor.CPU { // even blocks: in place on the device when the group can
		xc := x.Contiguous()
		if dc, ok := comm.DeviceOf(pg, xc); ok {
			out := tensor.NewOn(x.Device(), tensor.Float32, n, c)
			g.collective(tp, op, func(ctx context.Context) error { return dc.ReduceScatterTensor(ctx, out, xc, comm.Sum) })
			return out
		}
	}
	out := make([]float32, n*c)
	in := host(x)
	g.collective(tp, op, func(ctx context.Context) error {
		return pg.ReduceScatter(ctx, comm.Float32s(out), comm.Float32s(in), comm.Sum, counts)
	})
	return onDevice(out, x, n, c)
}

// AllGatherRows concatenates every rank's x (n, c) of the expert tensor ×
// model parallel group along the rows (equal n on every rank); its backward
// reduce-scatters the gradients.
func (g *Group) AllGatherRows(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{g.gather(tp, g.tpep(), in[0], nil, "all_gather of tokens over the expert tensor×model-parallel group")}
		},
		bwd: func(tp *tensor.Tape, gr []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{g.reduceScatter(tp, g.tpep(), gr[0], nil, "all_gather backward reduce_scatter over the expert tensor×model-parallel group")}
		},
	}, x)[0]
}

// ReduceScatterRows sums every rank's x (n·ETP·EP, c) of the expert tensor
// × model parallel group and keeps this rank's n rows; its backward
// all-gathers the gradients.
func (g *Group) ReduceScatterRows(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{g.reduceScatter(tp, g.tpep(), in[0], nil, "reduce_scatter of expert outputs over the expert tensor×model-parallel group")}
		},
		bwd: func(tp *tensor.Tape, gr []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{g.gather(tp, g.tpep(), gr[0], nil, "reduce_scatter backward all_gather over the expert tensor×model-parallel group")}
		},
	}, x)[0]
}

// GatherTensorRows concatenates the expert-tensor-parallel ranks' x along
// the rows, rows[r] from rank r (the alltoall dispatcher's all-gather over
// expert TP); its backward reduce-scatters the gradients.
func (g *Group) GatherTensorRows(tp *tensor.Tape, x *tensor.Tensor, rows []int) *tensor.Tensor {
	if g.TensorSize() == 1 {
		return x
	}
	rows = append([]int(nil), rows...)
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{g.gather(tp, g.TP, in[0], rows, "all_gather of tokens over the expert-tensor-parallel group")}
		},
		bwd: func(tp *tensor.Tape, gr []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{g.reduceScatter(tp, g.TP, gr[0], rows, "all_gather backward reduce_scatter over the expert-tensor-parallel group")}
		},
	}, x)[0]
}

// ReduceScatterTensorRows sums the expert-tensor-parallel ranks' x (the
// experts' partial outputs) and keeps this rank's rows[rank] rows of it;
// its backward all-gathers the gradients.
func (g *Group) ReduceScatterTensorRows(tp *tensor.Tape, x *tensor.Tensor, rows []int) *tensor.Tensor {
	if g.TensorSize() == 1 {
		return x
	}
	rows = append([]int(nil), rows...)
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{g.reduceScatter(tp, g.TP, in[0], rows, "reduce_scatter of expert outputs over the expert-tensor-parallel group")}
		},
		bwd: func(tp *tensor.Tape, gr []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{g.gather(tp, g.TP, gr[0], rows, "reduce_scatter backward all_gather over the expert-tensor-parallel group")}
		},
	}, x)[0]
}
