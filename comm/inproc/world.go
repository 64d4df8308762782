// Package inproc is the in-process backend of comm: every rank is a
// goroutine of one process and collectives are shared-memory copies.
//
// Each collective publishes every rank's buffers, waits for all ranks, then
// the ranks reduce or copy disjoint chunks in parallel (all-reduce: rank r
// reduces chunk r of every rank's buffer in rank order and writes the result
// into chunk r of every rank's buffer, one pass over memory). Results are
// bit-identical from run to run and equal the serial rank-order reduction.
// Before any data moves, every rank checks that all ranks passed compatible
// arguments, so a mismatch is a *comm.RankError wrapping comm.ErrMismatch on
// every rank and the group stays usable. Up to a few hundred ranks work;
// tests use up to 64.
//
// Test hooks make failures unit tests: World.Kill(r) makes rank r die
// (every other rank's pending and later calls return a *comm.RankError
// naming r), and Config.Hook runs before each operation, so a test can delay
// or kill a rank at an exact point.
package inproc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gotron/gotron/comm"
)

// DefaultTimeout is how long a rank waits for the others when
// Config.Timeout is zero.
const DefaultTimeout = 5 * time.Minute

// Config configures a World.
type Config struct {
	// Size is the number of ranks (1 or more).
	Size int
	// Timeout bounds each wait for other ranks inside an operation; when it
	// passes, every rank gets a RankError naming a missing rank that wraps
	// comm.ErrTimeout. Zero means DefaultTimeout.
	Timeout time.Duration
	// Hook, if set, is called by every rank (world rank) at the start of
	// every operation, op being one of the comm.Op* names. Tests use it to
	// delay a rank (block in it) or kill one (call World.Kill). It runs on
	// the rank's goroutine.
	Hook func(rank int, op string)
}

// World is a set of ranks in one process. It is safe for concurrent use.
type World struct {
	cfg    Config
	groups []*Group // world group of each rank

	mu     sync.Mutex                 // protects the fields below
	comms  map[string][]*communicator // rank-list key → instances, in creation order
	counts map[string][]int           // rank-list key → per-world-rank NewGroup calls
	all    []*communicator            // every comm, for Kill and Close
	dead   []bool                     // killed ranks
	closed bool
}

// New makes a world of cfg.Size ranks.
func New(cfg Config) (*World, error) {
	if cfg.Size < 1 {
		return nil, fmt.Errorf("inproc: world size %d, want at least 1", cfg.Size)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("inproc: negative timeout %v", cfg.Timeout)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	w := &World{cfg: cfg, comms: map[string][]*communicator{}, counts: map[string][]int{}, dead: make([]bool, cfg.Size)}
	members := make([]int, cfg.Size)
	for i := range members {
		members[i] = i
	}
	c := w.newComm(members)
	for r := range cfg.Size {
		w.groups = append(w.groups, newGroup(w, c, r))
	}
	return w, nil
}

// NewWorld returns the world groups of n ranks with the default timeout;
// group r is for rank r's goroutine.
func NewWorld(n int) ([]comm.ProcessGroup, error) {
	w, err := New(Config{Size: n})
	if err != nil {
		return nil, err
	}
	pgs := make([]comm.ProcessGroup, n)
	for i := range pgs {
		pgs[i] = w.Group(i)
	}
	return pgs, nil
}

// Group returns rank's world group.
func (w *World) Group(rank int) *Group { return w.groups[rank] }

// Size is the number of ranks.
func (w *World) Size() int { return w.cfg.Size }

// Kill makes rank die: every group containing it breaks, so pending and
// later operations of every member (rank itself included) return a
// *comm.RankError naming rank and wrapping comm.ErrPeerLost.
func (w *World) Kill(rank int) {
	w.mu.Lock()
	w.dead[rank] = true
	var hit []*communicator
	for _, c := range w.all {
		if c.has(rank) {
			hit = append(hit, c)
		}
	}
	w.mu.Unlock()
	for _, c := range hit {
		c.fail(rank, fmt.Errorf("%w: rank %d was killed", comm.ErrPeerLost, rank))
	}
}

// Close breaks every group: pending and later operations return an error
// wrapping comm.ErrClosed.
func (w *World) Close() error {
	w.mu.Lock()
	w.closed = true
	all := append([]*communicator(nil), w.all...)
	w.mu.Unlock()
	for _, c := range all {
		c.fail(-1, comm.ErrClosed)
	}
	return nil
}

func (w *World) newComm(members []int) *communicator {
	n := len(members)
	c := &communicator{
		world:   w,
		members: members,
		timeout: w.cfg.Timeout,
		slots:   make([]slot, n),
		broken:  make(chan struct{}),
		gen:     newGeneration(n),
		mbox:    make([]chan *message, n*n),
	}
	for i := range c.mbox {
		c.mbox[i] = make(chan *message)
	}
	w.all = append(w.all, c)
	return c
}

// newSubGroup implements Group.NewGroup for world rank me.
func (w *World) newSubGroup(ranks []int, me int) (*Group, error) {
	pos, err := comm.ValidateRanks(ranks, w.cfg.Size, me)
	if err != nil {
		return nil, err
	}
	var sb strings.Builder
	for _, r := range ranks {
		sb.WriteString(strconv.Itoa(r))
		sb.WriteByte(',')
	}
	key := sb.String()
	w.mu.Lock()
	cnt := w.counts[key]
	if cnt == nil {
		cnt = make([]int, w.cfg.Size)
		w.counts[key] = cnt
	}
	k := cnt[me]
	cnt[me]++
	if k == len(w.comms[key]) {
		w.comms[key] = append(w.comms[key], w.newComm(append([]int(nil), ranks...)))
	}
	c := w.comms[key][k]
	var deadRank = -1
	for _, r := range ranks {
		if w.dead[r] {
			deadRank = r
		}
	}
	closed := w.closed
	w.mu.Unlock()
	switch {
	case closed:
		c.fail(-1, comm.ErrClosed)
	case deadRank >= 0:
		c.fail(deadRank, fmt.Errorf("%w: rank %d was killed", comm.ErrPeerLost, deadRank))
	}
	return newGroup(w, c, pos), nil
}

// Run makes a world of n ranks, calls fn on n goroutines (one per rank, with
// that rank's world group) and waits for all. It returns the ranks' errors
// joined, each prefixed with its rank; it closes the world when done.
func Run(ctx context.Context, n int, fn func(ctx context.Context, pg comm.ProcessGroup) error) error {
	w, err := New(Config{Size: n})
	if err != nil {
		return err
	}
	defer w.Close()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(ctx, w.Group(r)); err != nil {
				errs[r] = fmt.Errorf("inproc: rank %d: %w", r, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
