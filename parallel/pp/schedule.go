package pp

import (
	"fmt"
	"slices"
)

// Op is what one Action does.
type Op uint8

const (
	// Forward runs the forward pass of (Chunk, Microbatch). It is Op's zero
	// value.
	Forward Op = iota
	// Backward runs the backward pass of (Chunk, Microbatch).
	Backward
	// SendActivation sends the output of this rank's forward of
	// (Chunk, Microbatch) to rank Peer.
	SendActivation
	// RecvActivation receives from rank Peer the input of this rank's
	// forward of (Chunk, Microbatch).
	RecvActivation
	// SendGrad sends the input gradient produced by this rank's backward of
	// (Chunk, Microbatch) to rank Peer.
	SendGrad
	// RecvGrad receives from rank Peer the output gradient needed by this
	// rank's backward of (Chunk, Microbatch).
	RecvGrad
)

// String returns "F", "B", "send-act", "recv-act", "send-grad" or
// "recv-grad".
func (o Op) String() string {
	switch o {
	case Forward:
		return "F"
	case Backward:
		return "B"
	case SendActivation:
		return "send-act"
	case RecvActivation:
		return "recv-act"
	case SendGrad:
		return "send-grad"
	case RecvGrad:
		return "recv-grad"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// Compute reports whether o is Forward or Backward.
func (o Op) Compute() bool { return o == Forward || o == Backward }

// Action is one step of a rank's schedule. The zero value is the forward of
// chunk 0, micro-batch 0.
type Action struct {
	Op Op
	// Chunk is the model chunk on this rank (0..VPP−1); the rank's virtual
	// stage is Chunk·PP + rank. For a send it is the chunk that produced the
	// tensor, for a receive the chunk that will consume it.
	Chunk int
	// Microbatch is the micro-batch, 0..M−1.
	Microbatch int
	// Peer is the pipeline rank at the other end of a send or receive; it is
	// 0 and unused for Forward and Backward.
	Peer int
}

// String formats a as "F c0 m3" or "send-act c0 m3 to 1" / "recv-grad c1 m0 from 0".
func (a Action) String() string {
	s := fmt.Sprintf("%v c%d m%d", a.Op, a.Chunk, a.Microbatch)
	switch a.Op {
	case SendActivation, SendGrad:
		s += fmt.Sprintf(" to %d", a.Peer)
	case RecvActivation, RecvGrad:
		s += fmt.Sprintf(" from %d", a.Peer)
	}
	return s
}

// Actions returns the ordered list of actions pipeline rank rank performs in
// one iteration of cfg; see the package documentation for the contract.
func Actions(cfg Config, rank int) ([]Action, error) {
	if err := cfg.checkRank(rank); err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	b := &builder{rank: rank, pp: c.PP}
	switch c.Kind() {
	case NoPipelining:
		for mb := range c.Microbatches {
			b.compute(Forward, 0, mb)
			b.compute(Backward, 0, mb)
		}
	case OneFOneB:
		oneFOneB(b, c)
	case Interleaved:
		newInterleaved(c, rank).build(b)
	}
	return b.out, nil
}

// Schedule returns Actions for every pipeline rank, indexed by rank.
func Schedule(cfg Config) ([][]Action, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := cfg.withDefaults()
	out := make([][]Action, c.PP)
	for r := range c.PP {
		a, err := Actions(cfg, r)
		if err != nil {
			return nil, err
		}
		out[r] = a
	}
	return out, nil
}

// builder appends one rank's actions.
type builder struct {
	rank, pp int
	out      []Action
}

func (b *builder) compute(op Op, chunk, mb int) {
	b.out = append(b.out, Action{Op: op, Chunk: chunk, Microbatch: mb})
}

// next and prev are the ring neighbours: activations go to next, gradients
// to prev (the ring closes between the last and the first rank, which only
// the interleaved schedule uses).
func (b *builder) next() int { return (b.rank + 1) % b.pp }
func (b *builder) prev() int { return (b.rank - 1 + b.pp) % b.pp }

// exchange appends the send/receive operations of one Megatron p2p call
// (_communicate), nil entries skipped, in the order of Megatron's
// unbatched path: even ranks send activation, receive activation, send
// gradient, receive gradient; odd ranks receive activation, send
// activation, receive gradient, send gradient. That order keeps neighbours
// from both sending first.
func (b *builder) exchange(ops ...*Action) {
	pos := func(o Op) int {
		even := [...]int{SendActivation: 0, RecvActivation: 1, SendGrad: 2, RecvGrad: 3}
		odd := [...]int{SendActivation: 1, RecvActivation: 0, SendGrad: 3, RecvGrad: 2}
		if b.rank%2 == 0 {
			return even[o]
		}
		return odd[o]
	}
	var call []Action
	for _, o := range ops {
		if o != nil {
			call = append(call, *o)
		}
	}
	slices.SortFunc(call, func(x, y Action) int { return pos(x.Op) - pos(y.Op) })
	b.out = append(b.out, call...)
}

// oneFOneB follows forward_backward_pipelining_without_interleaving: warm-up
// forwards (recv-forward, forward, send-forward), then steady 1F1B steps
// (forward, send-forward-recv-backward, backward, send-backward-recv-forward,
// the last step only sending backward), then cool-down backwards
// (recv-backward, backward, send-backward).
func oneFOneB(b *builder, c Config) {
	ph := phases(c, b.rank)
	first, last := b.rank == 0, b.rank == c.PP-1
	recvAct := func(mb int) *Action {
		if first {
			return nil
		}
		return &Action{Op: RecvActivation, Microbatch: mb, Peer: b.prev()}
	}
	sendAct := func(mb int) *Action {
		if last {
			return nil
		}
		return &Action{Op: SendActivation, Microbatch: mb, Peer: b.next()}
	}
	recvGrad := func(mb int) *Action {
		if last {
			return nil
		}
		return &Action{Op: RecvGrad, Microbatch: mb, Peer: b.next()}
	}
	sendGrad := func(mb int) *Action {
		if first {
			return nil
		}
		return &Action{Op: SendGrad, Microbatch: mb, Peer: b.prev()}
	}
	for i := range ph.Warmup {
		b.exchange(recvAct(i))
		b.compute(Forward, 0, i)
		b.exchange(sendAct(i))
	}
	if ph.Steady > 0 {
		b.exchange(recvAct(ph.Warmup))
	}
	for i := range ph.Steady {
		f := ph.Warmup + i // forward micro-batch; backward runs micro-batch i
		b.compute(Forward, 0, f)
		b.exchange(sendAct(f), recvGrad(i))
		b.compute(Backward, 0, i)
		if i == ph.Steady-1 {
			b.exchange(sendGrad(i))
		} else {
			b.exchange(sendGrad(i), recvAct(f+1))
		}
	}
	for i := ph.Steady; i < ph.Total; i++ {
		b.exchange(recvGrad(i))
		b.compute(Backward, 0, i)
		b.exchange(sendGrad(i))
	}
}
