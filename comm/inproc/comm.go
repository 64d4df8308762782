package inproc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gotron/gotron/comm"
)

// communicator is the state the members of one group share.
type communicator struct {
	world   *World
	members []int // world rank of each group rank
	timeout time.Duration

	// slots[r] holds rank r's arguments for the current operation. Rank r
	// writes its slot only before the operation's first sync; others read
	// it only between the first and the last sync, so no lock is needed.
	slots []slot

	mbox []chan *message // [src*n+dst], unbuffered: point-to-point handoff

	// tickets hands out the chunks of an all-reduce to whichever ranks
	// are running (see Group.AllReduce); it only grows.
	tickets atomic.Int64

	mu       sync.Mutex // protects the fields below
	gen      *generation
	broken   chan struct{} // closed by fail
	failRank int           // world rank blamed, -1 for Close
	failErr  error
}

// generation is one round of the group's barrier.
type generation struct {
	arrived []bool
	count   int
	done    chan struct{}
}

func newGeneration(n int) *generation {
	return &generation{arrived: make([]bool, n), done: make(chan struct{})}
}

// slot is what one rank publishes for an operation.
type slot struct {
	op      string
	red     comm.ReduceOp
	a, b    comm.Buffer // main buffer(s): buf, or out and in
	root    int
	counts  []int // resolved counts (send counts for all_to_all)
	counts2 []int // recv counts for all_to_all
	bad     error // this rank's own argument error
}

// message is a point-to-point transfer in flight.
type message struct {
	buf  comm.Buffer
	done chan error // receiver's verdict, buffered 1
}

func (c *communicator) has(worldRank int) bool {
	for _, m := range c.members {
		if m == worldRank {
			return true
		}
	}
	return false
}

// fail breaks the group, blaming world rank r (-1: closed); the first cause wins.
func (c *communicator) fail(r int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failLocked(r, err)
}

// failLocked is fail with c.mu held.
func (c *communicator) failLocked(r int, err error) {
	if c.failErr != nil {
		return
	}
	c.failRank, c.failErr = r, err
	close(c.broken)
}

// brokenErr returns the group's failure as seen by an op, or nil.
func (c *communicator) brokenErr(op string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failErr == nil {
		return nil
	}
	return &comm.RankError{Rank: c.failRank, Op: op, Err: c.failErr}
}

// sync waits until every member has called it for this round, the group
// breaks, ctx ends or the timeout passes.
func (c *communicator) sync(ctx context.Context, me int, op string) error {
	c.mu.Lock()
	if c.failErr != nil {
		c.mu.Unlock()
		return c.brokenErr(op)
	}
	if err := ctx.Err(); err != nil {
		// Already over: do not complete a round the caller will not
		// take part in.
		c.failLocked(c.members[me], fmt.Errorf("%w: rank %d abandoned %s: %v", comm.ErrPeerLost, c.members[me], op, err))
		c.mu.Unlock()
		return &comm.RankError{Rank: c.members[me], Op: op, Err: err}
	}
	g := c.gen
	g.arrived[me] = true
	g.count++
	if g.count == len(c.members) {
		close(g.done)
		c.gen = newGeneration(len(c.members))
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	t := time.NewTimer(c.timeout)
	defer t.Stop()
	select {
	case <-g.done:
		return nil
	case <-c.broken:
	case <-ctx.Done():
		// The last member may have arrived at the same moment: then the
		// round is complete and the peers are already past it, reading
		// and writing this rank's buffers, so this rank must go on with
		// them. Deciding under the lock that completes rounds makes the
		// choice one-sided: either the round completed, or it is broken
		// before anyone else can complete it.
		c.mu.Lock()
		if g.count == len(c.members) {
			c.mu.Unlock()
			return nil
		}
		c.failLocked(c.members[me], fmt.Errorf("%w: rank %d abandoned %s: %v", comm.ErrPeerLost, c.members[me], op, ctx.Err()))
		c.mu.Unlock()
		return &comm.RankError{Rank: c.members[me], Op: op, Err: ctx.Err()}
	case <-t.C:
		c.mu.Lock()
		missing := -1
		for i, ok := range g.arrived {
			if !ok {
				missing = c.members[i]
				break
			}
		}
		c.mu.Unlock()
		if missing >= 0 {
			c.fail(missing, fmt.Errorf("%w: rank %d did not reach %s within %v", comm.ErrTimeout, missing, op, c.timeout))
		}
	}
	select {
	case <-g.done: // completed at the same time as the failure
		return nil
	default:
	}
	return c.brokenErr(op)
}

// finish is the sync that ends a collective's data phase. Every member has
// passed the opening sync, so peers may still be reading or writing this
// rank's buffers: leaving early on ctx would hand the caller memory that
// another goroutine is writing. So ctx's end does not stop this wait; the
// peers' work left is a bounded copy or reduction. A broken group and the
// timeout still do.
func (c *communicator) finish(ctx context.Context, me int, op string) error {
	return c.sync(context.WithoutCancel(ctx), me, op)
}

// timeoutErr is the failure of a point-to-point wait on peer (world rank).
func (c *communicator) timeoutErr(peer int, op string) error {
	c.fail(peer, fmt.Errorf("%w: rank %d did not match %s within %v", comm.ErrTimeout, peer, op, c.timeout))
	return c.brokenErr(op)
}
