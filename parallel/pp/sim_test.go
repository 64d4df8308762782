package pp

import (
	"fmt"
	"slices"
	"strings"
)

// This file is the test's executor model: every rank runs its list at the
// same time, a send completes only when the peer's matching receive is
// posted (rendezvous, no buffering), and each channel delivers in order.
// The run is a deterministic sequence of rounds in which each rank makes
// what progress it can; since every rank blocks on a fixed next operation
// and channels are in order, whether the lists finish or deadlock does not
// depend on how the ranks' steps interleave. It is independent of the code
// that builds the lists.

// simMode selects how the simulator runs a rank's sends and receives.
type simMode struct {
	// batched posts each maximal run of consecutive send/receive actions
	// at once and waits for all of them (torch's batch_isend_irecv, our
	// comm.BatchSendRecv); otherwise each runs alone, in list order.
	batched bool
	// oneChannel carries activations and gradients between a pair of ranks
	// on one ordered channel, as a single comm.ProcessGroup does; otherwise
	// they travel on separate channels.
	oneChannel bool
}

func (m simMode) String() string {
	return fmt.Sprintf("batched=%v one-channel=%v", m.batched, m.oneChannel)
}

var simModes = []simMode{{false, false}, {true, false}, {false, true}, {true, true}}

// simResult is what a run observed.
type simResult struct {
	maxInFlight []int // per rank: most (chunk, micro-batch) pairs with forward done and backward not
	makespan    int   // time the last rank finishes, forward 1 unit, backward 2, messages free
}

type chanKey struct {
	src, dst int
	grad     bool
}

type task struct{ chunk, mb int }

type simRank struct {
	list      []Action
	pc        int    // next action
	batchEnd  int    // end of the posted operations: the batch, or pc+1
	done      []bool // per posted operation: completed
	fwd, bwd  map[task]bool
	gotAct    map[task]bool
	gotGrad   map[task]bool
	inFlight  int
	maxFlight int
	clock     int // time units: forward 1, backward 2, communication free
	posted    int // clock when the current operations were posted
	batchDone int // latest completion time among them
}

type sim struct {
	mode     simMode
	p, v, m  int
	ranks    []*simRank
	progress bool // some rank moved in this round
}

// simulate runs lists (one per rank) under mode and checks every rule of
// the package contract. It returns the first violation, or a deadlock with
// every rank's position.
func simulate(cfg Config, lists [][]Action, mode simMode) (simResult, error) {
	c := cfg.withDefaults()
	s := &sim{mode: mode, p: c.PP, v: c.VPP, m: c.Microbatches}
	for _, l := range lists {
		s.ranks = append(s.ranks, &simRank{list: l, fwd: map[task]bool{}, bwd: map[task]bool{},
			gotAct: map[task]bool{}, gotGrad: map[task]bool{}})
	}
	for rounds := 0; ; rounds++ {
		finished := true
		s.progress = false
		for r, rk := range s.ranks {
			if rk.pc < len(rk.list) {
				finished = false
				if err := s.step(r); err != nil {
					return simResult{}, err
				}
			}
		}
		if finished {
			return s.result()
		}
		if !s.progress {
			return simResult{}, fmt.Errorf("deadlock after %d rounds:%s", rounds, s.positions())
		}
	}
}

func (s *sim) stage(r, chunk int) int { return chunk*s.p + r }

// key names the channel of a's message and whether a sends.
func (s *sim) key(r int, a Action) (chanKey, bool) {
	grad := a.Op == SendGrad || a.Op == RecvGrad
	send := a.Op == SendActivation || a.Op == SendGrad
	k := chanKey{src: r, dst: a.Peer, grad: grad && !s.mode.oneChannel}
	if !send {
		k.src, k.dst = a.Peer, r
	}
	return k, send
}

// post makes sure rank rk's next operations are posted.
func (s *sim) post(rk *simRank) {
	if rk.pc >= len(rk.list) || rk.batchEnd > rk.pc {
		return
	}
	end := rk.pc + 1
	if s.mode.batched && !rk.list[rk.pc].Op.Compute() {
		for end < len(rk.list) && !rk.list[end].Op.Compute() {
			end++
		}
	}
	rk.batchEnd = end
	rk.done = make([]bool, end-rk.pc)
	rk.posted, rk.batchDone = rk.clock, rk.clock
}

// head returns the first incomplete posted operation of rank r on channel
// k in the given direction, or -1.
func (s *sim) head(r int, k chanKey, send bool) int {
	rk := s.ranks[r]
	for i := rk.pc; i < rk.batchEnd; i++ {
		a := rk.list[i]
		if a.Op.Compute() || rk.done[i-rk.pc] {
			continue
		}
		if k2, s2 := s.key(r, a); k2 == k && s2 == send {
			return i
		}
	}
	return -1
}

// step lets rank r run a pass or complete what communication it can.
func (s *sim) step(r int) error {
	rk := s.ranks[r]
	s.post(rk)
	if a := rk.list[rk.pc]; a.Op.Compute() {
		rk.pc++
		s.progress = true
		return s.compute(r, a)
	}
	for i := rk.pc; i < rk.batchEnd; i++ {
		if !rk.done[i-rk.pc] {
			if err := s.match(r, i); err != nil {
				return err
			}
		}
	}
	for _, x := range s.ranks { // this rank's operations, or the peer's, may all be done
		if x.pc < x.batchEnd && !x.list[x.pc].Op.Compute() && !slices.Contains(x.done, false) {
			x.pc, x.clock = x.batchEnd, x.batchDone
		}
	}
	return nil
}

// match completes rank r's posted operation i if it is first on its channel
// and the peer has the counterpart posted first on the same channel.
func (s *sim) match(r, i int) error {
	rk := s.ranks[r]
	a := rk.list[i]
	if a.Peer < 0 || a.Peer >= s.p || a.Peer == r {
		return fmt.Errorf("rank %d: %v: bad peer", r, a)
	}
	k, send := s.key(r, a)
	if s.head(r, k, send) != i {
		return nil // an earlier operation on the same channel goes first
	}
	peer := s.ranks[a.Peer]
	s.post(peer)
	j := s.head(a.Peer, k, !send)
	if j < 0 {
		return nil
	}
	var err error
	if send {
		err = s.deliver(r, a, a.Peer, peer.list[j])
	} else {
		err = s.deliver(a.Peer, peer.list[j], r, a)
	}
	rk.done[i-rk.pc], peer.done[j-peer.pc] = true, true
	at := max(rk.posted, peer.posted)
	rk.batchDone, peer.batchDone = max(rk.batchDone, at), max(peer.batchDone, at)
	s.progress = true
	return err
}

// compute runs a forward or backward pass after checking its inputs.
func (s *sim) compute(r int, a Action) error {
	rk := s.ranks[r]
	t := task{a.Chunk, a.Microbatch}
	if a.Chunk < 0 || a.Chunk >= s.v || a.Microbatch < 0 || a.Microbatch >= s.m {
		return fmt.Errorf("rank %d: %v out of range", r, a)
	}
	st := s.stage(r, a.Chunk)
	switch a.Op {
	case Forward:
		if rk.fwd[t] {
			return fmt.Errorf("rank %d: %v twice", r, a)
		}
		if st > 0 && !rk.gotAct[t] {
			return fmt.Errorf("rank %d: %v before its input activation arrived from stage %d", r, a, st-1)
		}
		rk.fwd[t] = true
		rk.clock++
		rk.inFlight++
		rk.maxFlight = max(rk.maxFlight, rk.inFlight)
	case Backward:
		if rk.bwd[t] {
			return fmt.Errorf("rank %d: %v twice", r, a)
		}
		if !rk.fwd[t] {
			return fmt.Errorf("rank %d: %v before its forward", r, a)
		}
		if st < s.p*s.v-1 && !rk.gotGrad[t] {
			return fmt.Errorf("rank %d: %v before its output gradient arrived from stage %d", r, a, st+1)
		}
		rk.bwd[t] = true
		rk.clock += 2
		rk.inFlight--
	}
	return nil
}

// deliver checks a matched send and receive: same kind, same micro-batch,
// neighbouring virtual stages, tensor produced, not received before.
func (s *sim) deliver(src int, sa Action, dst int, ra Action) error {
	st, rt := task{sa.Chunk, sa.Microbatch}, task{ra.Chunk, ra.Microbatch}
	var produced bool
	var got map[task]bool
	var dir int
	switch {
	case sa.Op == SendActivation && ra.Op == RecvActivation:
		produced, got, dir = s.ranks[src].fwd[st], s.ranks[dst].gotAct, +1
	case sa.Op == SendGrad && ra.Op == RecvGrad:
		produced, got, dir = s.ranks[src].bwd[st], s.ranks[dst].gotGrad, -1
	default:
		return fmt.Errorf("rank %d %v matched rank %d %v: kinds differ", src, sa, dst, ra)
	}
	if !produced {
		return fmt.Errorf("rank %d: %v before the pass that produces it", src, sa)
	}
	if s.stage(dst, ra.Chunk) != s.stage(src, sa.Chunk)+dir || sa.Microbatch != ra.Microbatch {
		return fmt.Errorf("rank %d %v matched rank %d %v: not the neighbouring stage's tensor", src, sa, dst, ra)
	}
	if got[rt] {
		return fmt.Errorf("rank %d: %v twice", dst, ra)
	}
	got[rt] = true
	return nil
}

// positions describes where every rank is stuck.
func (s *sim) positions() string {
	var b strings.Builder
	for r, rk := range s.ranks {
		if rk.pc >= len(rk.list) {
			fmt.Fprintf(&b, "\n  rank %d: done", r)
			continue
		}
		fmt.Fprintf(&b, "\n  rank %d: at %d: %v", r, rk.pc, rk.list[rk.pc:rk.batchEnd])
	}
	return b.String()
}

// result checks that every pass ran exactly once and reports the run.
func (s *sim) result() (simResult, error) {
	var res simResult
	for r, rk := range s.ranks {
		for ch := range s.v {
			for mb := range s.m {
				if t := (task{ch, mb}); !rk.fwd[t] || !rk.bwd[t] {
					return res, fmt.Errorf("rank %d: chunk %d micro-batch %d: forward %v, backward %v; want both once",
						r, ch, mb, rk.fwd[t], rk.bwd[t])
				}
			}
		}
		if n := len(rk.fwd) + len(rk.bwd); n != 2*s.v*s.m {
			return res, fmt.Errorf("rank %d: %d passes, want %d", r, n, 2*s.v*s.m)
		}
		res.maxInFlight = append(res.maxInFlight, rk.maxFlight)
		res.makespan = max(res.makespan, rk.clock)
	}
	return res, nil
}
