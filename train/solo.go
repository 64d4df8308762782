package train

import (
	"context"
	"fmt"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/parallel"
)

// solo is the process group of a run started without one: a world of one
// rank. Its collectives leave the data as it is (a reduction or broadcast
// over one rank is the identity) and cost nothing: no copy, no goroutine,
// no synchronisation. It lets a single process hold the same parallel
// groups as a launched one (parallel.Groups: every group exists, of size 1
// where the degree is 1), so the trainer never branches on their absence.
type solo struct{}

// soloGroups returns the groups of a one-process world.
func soloGroups() *parallel.Groups {
	g, err := parallel.NewGroups(solo{}, parallel.Config{})
	if err != nil { // a layout of one rank always exists
		panic(fmt.Sprintf("train: the groups of a single process: %v", err))
	}
	return g
}

func (solo) Rank() int { return 0 }
func (solo) Size() int { return 1 }

func (solo) AllReduce(_ context.Context, buf comm.Buffer, op comm.ReduceOp) error {
	if !op.Valid() {
		return fmt.Errorf("%s: %w: reduce op %d", comm.OpAllReduce, comm.ErrMismatch, op)
	}
	return buf.Check()
}

func (solo) ReduceScatter(_ context.Context, out, in comm.Buffer, op comm.ReduceOp, _ []int) error {
	return copyBuffer(comm.OpReduceScatter, out, in)
}

func (solo) AllGather(_ context.Context, out, in comm.Buffer, _ []int) error {
	return copyBuffer(comm.OpAllGather, out, in)
}

func (solo) Broadcast(_ context.Context, buf comm.Buffer, root int) error {
	return checkRoot(comm.OpBroadcast, root)
}

func (solo) Reduce(_ context.Context, buf comm.Buffer, _ comm.ReduceOp, root int) error {
	return checkRoot(comm.OpReduce, root)
}

func (solo) AllToAll(_ context.Context, out, in comm.Buffer, _, _ []int) error {
	return copyBuffer(comm.OpAllToAll, out, in)
}

func (solo) Barrier(context.Context) error { return nil }

// Send and Recv have no peer in a world of one.
func (solo) Send(_ context.Context, _ comm.Buffer, peer int) error {
	return fmt.Errorf("%s to rank %d: a single process has no peer", comm.OpSend, peer)
}

func (solo) Recv(_ context.Context, _ comm.Buffer, peer int) error {
	return fmt.Errorf("%s from rank %d: a single process has no peer", comm.OpRecv, peer)
}

// NewGroup returns the world itself: the only group of one rank.
func (s solo) NewGroup(ranks []int) (comm.ProcessGroup, error) {
	if len(ranks) != 1 || ranks[0] != 0 {
		return nil, fmt.Errorf("%s %v: %w (the world is rank 0 alone)", comm.OpNewGroup, ranks, comm.ErrNotMember)
	}
	return s, nil
}

func checkRoot(op string, root int) error {
	if root != 0 {
		return fmt.Errorf("%s: root %d: %w (the world is rank 0 alone)", op, root, comm.ErrMismatch)
	}
	return nil
}

// copyBuffer is a one-rank collective whose output is its input: out gets
// in's elements, unless they are the same memory.
func copyBuffer(op string, out, in comm.Buffer) error {
	if out.DType != in.DType || len(out.Data) != len(in.Data) {
		return fmt.Errorf("%s: %w: %d %v bytes out, %d %v bytes in", op, comm.ErrMismatch, len(out.Data), out.DType, len(in.Data), in.DType)
	}
	if len(out.Data) > 0 && &out.Data[0] != &in.Data[0] {
		copy(out.Data, in.Data)
	}
	return nil
}
