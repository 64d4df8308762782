package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/tcp"
	"github.com/gotron/gotron/infer"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/tp"
)

// Tensor-parallel decoding (gotron inference, generate and serve with
// --tensor-model-parallel-size N): N ranks, started by gotron launch (or
// torchrun, srun, mpirun; --inproc for goroutines), each load the
// checkpoint, keep their slice of it (gpt.Parallelize: the split of
// training) and decode in lockstep; rank 0 takes the requests and prints
// or serves, the others follow it (infer.Lockstep, infer.Follow).

// joinDecodeGroup returns the tensor-parallel group of a decoding command:
// nil for one process (--tensor-model-parallel-size 1), else the launched
// world, which must have exactly tpSize ranks. args are the command's
// arguments, whose hash every rank must share.
func joinDecodeGroup(ctx context.Context, env *cli, tpSize int, timeout time.Duration, args []string) (comm.ProcessGroup, func(), error) {
	if tpSize < 1 {
		return nil, nil, fmt.Errorf("--tensor-model-parallel-size=%d: want >= 1", tpSize)
	}
	if timeout <= 0 {
		timeout = defaultDistributedTimeout
	}
	world, closeWorld, err := joinWorld(ctx, env, timeout, "gloo", joinOptions{heartbeatTimeout: tcp.DefaultHeartbeatTimeout, flagsHash: flagsHash(args)})
	if err != nil {
		return nil, nil, err
	}
	size := 1
	if world != nil {
		size = world.Size()
	}
	switch {
	case size == 1 && tpSize > 1:
		closeWorld()
		return nil, nil, fmt.Errorf("--tensor-model-parallel-size %d needs %d ranks: start them with gotron launch --nproc-per-node %d (or torchrun, srun, mpirun)", tpSize, tpSize, tpSize)
	case size != tpSize:
		closeWorld()
		return nil, nil, fmt.Errorf("a world of %d ranks with --tensor-model-parallel-size %d: needs data-parallel inference replicas, not built in gotron: launch as many ranks as --tensor-model-parallel-size", size, tpSize)
	case size == 1:
		return nil, closeWorld, nil
	}
	return world, closeWorld, nil
}

// shardForDecoding returns this rank's slice of m over group (m itself
// without a group), naming the flag a model that does not split refuses.
func shardForDecoding(m *gpt.Model, group comm.ProcessGroup) (*gpt.Model, error) {
	if group == nil {
		return m, nil
	}
	if m.Config.MoE.Enabled() {
		return nil, fmt.Errorf("--tensor-model-parallel-size %d with an MoE model: needs expert-parallel inference, not built in gotron", group.Size())
	}
	sliced, err := gpt.Parallelize(m, &tp.Region{Group: group}, nil)
	if err != nil {
		return nil, fmt.Errorf("--tensor-model-parallel-size %d: %w", group.Size(), err)
	}
	return sliced, nil
}

// decodeEngine is what a decoding loop calls on its engine: an
// infer.Engine alone, or rank 0's infer.Lockstep over the group's engines.
type decodeEngine interface {
	Add(infer.Request) (infer.SeqID, error)
	Cancel(infer.SeqID) bool
	Step() ([]infer.Event, error)
	HasWork() bool
	Stats() infer.Stats
}

// leadOrFollow runs one engine's work on every rank of group: on rank 0 run
// with the Lockstep that mirrors its calls (eng itself without a group),
// elsewhere infer.Follow. It reports whether this rank led.
func leadOrFollow(ctx context.Context, group comm.ProcessGroup, eng *infer.Engine, run func(decodeEngine) error) (led bool, err error) {
	if group == nil {
		return true, run(eng)
	}
	if group.Rank() != 0 {
		return false, infer.Follow(ctx, eng, group)
	}
	ls, err := infer.NewLockstep(ctx, eng, group)
	if err != nil {
		return true, err
	}
	err = run(ls)
	// Close tells the followers the leader is done, also when the leader
	// failed on its own (a bad request): they end instead of waiting for
	// it. After a failed step it sends nothing.
	return true, errors.Join(err, ls.Close())
}

// broadcastPrompt returns rank 0's prompt on every rank of group.
func broadcastPrompt(ctx context.Context, group comm.ProcessGroup, p []int32) ([]int32, error) {
	n := []int64{int64(len(p))}
	if err := group.Broadcast(ctx, comm.Int64s(n), 0); err != nil {
		return nil, fmt.Errorf("tensor-parallel rank %d: rank 0's prompt: %w", group.Rank(), err)
	}
	if n[0] < 1 || n[0] > math.MaxInt32 {
		return nil, fmt.Errorf("tensor-parallel rank %d: rank 0's prompt of %d tokens: want 1..%d", group.Rank(), n[0], math.MaxInt32)
	}
	if group.Rank() != 0 {
		p = make([]int32, n[0])
	}
	if err := group.Broadcast(ctx, comm.Int32s(p), 0); err != nil {
		return nil, fmt.Errorf("tensor-parallel rank %d: rank 0's prompt: %w", group.Rank(), err)
	}
	return p, nil
}
