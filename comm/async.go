package comm

import (
	"context"
	"sync"
)

// NewAsync returns pg's own Async implementation if it has one, or else a
// wrapper that runs each *Async call on a background goroutine, after the
// calls issued before it on the same wrapper have finished (issue order is
// run order, as collectives require). Do not mix calls on the wrapper with
// blocking calls on pg unless every handle has been waited for.
func NewAsync(pg ProcessGroup) Async {
	if a, ok := pg.(Async); ok {
		return a
	}
	return &asyncGroup{pg: pg}
}

type asyncGroup struct {
	pg ProcessGroup

	mu   sync.Mutex    // protects last
	last chan struct{} // closed when the latest submitted op is done
}

type handle struct {
	done chan struct{}
	err  error // set before done is closed
}

func (h *handle) Wait(ctx context.Context) error {
	select {
	case <-h.done:
		return h.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (a *asyncGroup) submit(ctx context.Context, f func(context.Context) error) Handle {
	h := &handle{done: make(chan struct{})}
	a.mu.Lock()
	prev := a.last
	a.last = h.done
	a.mu.Unlock()
	go func() {
		defer close(h.done)
		if prev != nil {
			<-prev
		}
		h.err = f(ctx)
	}()
	return h
}

func (a *asyncGroup) AllReduceAsync(ctx context.Context, buf Buffer, op ReduceOp) Handle {
	return a.submit(ctx, func(ctx context.Context) error { return a.pg.AllReduce(ctx, buf, op) })
}

func (a *asyncGroup) ReduceScatterAsync(ctx context.Context, out, in Buffer, op ReduceOp, counts []int) Handle {
	return a.submit(ctx, func(ctx context.Context) error { return a.pg.ReduceScatter(ctx, out, in, op, counts) })
}

func (a *asyncGroup) AllGatherAsync(ctx context.Context, out, in Buffer, counts []int) Handle {
	return a.submit(ctx, func(ctx context.Context) error { return a.pg.AllGather(ctx, out, in, counts) })
}

func (a *asyncGroup) BroadcastAsync(ctx context.Context, buf Buffer, root int) Handle {
	return a.submit(ctx, func(ctx context.Context) error { return a.pg.Broadcast(ctx, buf, root) })
}

// ValidateRanks checks a NewGroup rank list against a world of worldSize
// ranks: non-empty, in range, no duplicates. It returns the position of me
// in ranks, or ErrNotMember (wrapped) if me is not listed.
func ValidateRanks(ranks []int, worldSize, me int) (int, error) {
	if len(ranks) == 0 {
		return -1, errorf("new_group: empty rank list")
	}
	pos := -1
	seen := make(map[int]bool, len(ranks))
	for i, r := range ranks {
		if r < 0 || r >= worldSize {
			return -1, errorf("new_group: rank %d out of range [0, %d)", r, worldSize)
		}
		if seen[r] {
			return -1, errorf("new_group: rank %d listed twice", r)
		}
		seen[r] = true
		if r == me {
			pos = i
		}
	}
	if pos < 0 {
		return -1, &RankError{Rank: me, Op: OpNewGroup, Err: ErrNotMember}
	}
	return pos, nil
}
