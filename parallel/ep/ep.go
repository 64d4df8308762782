// Package ep is expert parallelism's communication: the token exchanges of
// Megatron's MoE dispatchers (alltoall, allgather) over an expert-parallel
// process group, as autograd ops. It implements gpt.ExpertParallel; the
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

// Group is one rank's expert-parallel group (ETP 1): the ranks holding
// disjoint sets of experts of every MoE layer.
type Group struct {
	PG comm.ProcessGroup
	// UseAllToAll selects Megatron's alltoall dispatcher; false, the
	// allgather dispatcher.
	UseAllToAll bool
	comm        time.Duration
}

// Size is the expert-parallel size.
func (g *Group) Size() int { return g.PG.Size() }

// Rank is this rank's index in the group.
func (g *Group) Rank() int { return g.PG.Rank() }

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
		tp.Fail(fmt.Errorf("ep: rank %d: %s over the expert-parallel group: %w", g.Rank(), op, err))
	}
}

// GatherInts returns every rank's v (equal lengths), rank-major.
func (g *Group) GatherInts(tp *tensor.Tape, v []int32) []int32 {
	out := make([]int32, len(v)*g.Size())
	g.collective(tp, "all_gather of routing counts", func(ctx context.Context) error {
		return g.PG.AllGather(ctx, comm.Int32s(out), comm.Int32s(v), nil)
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
	out := make([]float32, n*c)
	in := host(x)
	g.collective(tp, op, func(ctx context.Context) error {
		return g.PG.AllToAll(ctx, comm.Float32s(out), comm.Float32s(in), sc, rc)
	})
	return onDevice(out, x, n, c)
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

func (g *Group) gather(tp *tensor.Tape, x *tensor.Tensor, op string) *tensor.Tensor {
	n, c := x.Dim(0), x.Dim(1)
	out := make([]float32, g.Size()*n*c)
	in := host(x)
	g.collective(tp, op, func(ctx context.Context) error {
		return g.PG.AllGather(ctx, comm.Float32s(out), comm.Float32s(in), nil)
	})
	return onDevice(out, x, g.Size()*n, c)
}

func (g *Group) reduceScatter(tp *tensor.Tape, x *tensor.Tensor, op string) *tensor.Tensor {
	rows, c := x.Dim(0), x.Dim(1)
	if rows%g.Size() != 0 {
		panic(fmt.Sprintf("ep: reduce-scatter of %d rows over %d ranks", rows, g.Size()))
	}
	n := rows / g.Size()
	out := make([]float32, n*c)
	in := host(x)
	g.collective(tp, op, func(ctx context.Context) error {
		return g.PG.ReduceScatter(ctx, comm.Float32s(out), comm.Float32s(in), comm.Sum, nil)
	})
	return onDevice(out, x, n, c)
}

// AllGatherRows concatenates every rank's x (n, c) along the rows (equal n
// on every rank); its backward reduce-scatters the gradients.
func (g *Group) AllGatherRows(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{g.gather(tp, in[0], "all_gather of tokens")}
		},
		bwd: func(tp *tensor.Tape, gr []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{g.reduceScatter(tp, gr[0], "all_gather backward reduce_scatter")}
		},
	}, x)[0]
}

// ReduceScatterRows sums every rank's x (Size()·n, c) and keeps this rank's
// n rows; its backward all-gathers the gradients.
func (g *Group) ReduceScatterRows(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	return tp.Apply(fn{
		fwd: func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{g.reduceScatter(tp, in[0], "reduce_scatter of expert outputs")}
		},
		bwd: func(tp *tensor.Tape, gr []*tensor.Tensor) []*tensor.Tensor {
			return []*tensor.Tensor{g.gather(tp, gr[0], "reduce_scatter backward all_gather")}
		},
	}, x)[0]
}
