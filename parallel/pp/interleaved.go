package pp

// interleaved builds one rank's list for
// forward_backward_pipelining_with_interleaving, following the exchange
// points of Megatron's path without p2p overlap: after each warm-up forward
// one send-forward-recv-forward call (the last warm-up call also receives the
// first backward's gradient); after each steady forward+backward pair one
// call exchanging in both directions; after each cool-down backward one
// send-backward-recv-backward call.
type interleaved struct {
	c    Config // valid, defaults filled
	rank int
	ph   Phases
	tab  []Slot
}

func newInterleaved(c Config, rank int) *interleaved {
	return &interleaved{c: c, rank: rank, ph: phases(c, rank), tab: table(c)}
}

// fwd is the (chunk, micro-batch) of the rank's k-th forward.
func (s *interleaved) fwd(k int) Slot { return s.tab[k] }

// bwd is the (chunk, micro-batch) of the rank's k-th backward: chunks run
// backward in reverse order.
func (s *interleaved) bwd(k int) Slot {
	t := s.tab[k]
	return Slot{Chunk: s.c.VPP - 1 - t.Chunk, Microbatch: t.Microbatch}
}

func (s *interleaved) first() bool { return s.rank == 0 }
func (s *interleaved) last() bool  { return s.rank == s.c.PP-1 }

// sendAct sends forward k's output on, unless it is the model's last stage
// (last chunk of the last rank).
func (s *interleaved) sendAct(b *builder, k int) *Action {
	f := s.fwd(k)
	if f.Chunk == s.c.VPP-1 && s.last() {
		return nil
	}
	return &Action{Op: SendActivation, Chunk: f.Chunk, Microbatch: f.Microbatch, Peer: b.next()}
}

// sendGrad sends backward k's input gradient back, unless it is the model's
// first stage (chunk 0 of rank 0).
func (s *interleaved) sendGrad(b *builder, k int) *Action {
	g := s.bwd(k)
	if g.Chunk == 0 && s.first() {
		return nil
	}
	return &Action{Op: SendGrad, Chunk: g.Chunk, Microbatch: g.Microbatch, Peer: b.prev()}
}

// recvAct is the activation received in the exchange after forward k
// (Megatron's recv_tensor_from_previous_stage going forward). Ranks other
// than the first receive the input of forward k+1. The first rank is PP−1
// steps ahead of the last, so it receives what the last rank produced at
// its forward k−(PP−1), unless that was the model's last stage; the tensor
// feeds the next chunk on the first rank.
func (s *interleaved) recvAct(b *builder, k int) *Action {
	if k == s.ph.Total-1 {
		return nil
	}
	if !s.first() {
		f := s.fwd(k + 1)
		return &Action{Op: RecvActivation, Chunk: f.Chunk, Microbatch: f.Microbatch, Peer: b.prev()}
	}
	j := k - (s.c.PP - 1)
	if j < 0 || s.fwd(j).Chunk == s.c.VPP-1 {
		return nil
	}
	f := s.fwd(j)
	return &Action{Op: RecvActivation, Chunk: f.Chunk + 1, Microbatch: f.Microbatch, Peer: b.prev()}
}

// recvGrad mirrors recvAct for gradients after backward k: the last rank
// leads going backward and receives from the first rank what its backward
// k−(PP−1) produced, for the previous chunk.
func (s *interleaved) recvGrad(b *builder, k int) *Action {
	if k == s.ph.Total-1 {
		return nil
	}
	if !s.last() {
		g := s.bwd(k + 1)
		return &Action{Op: RecvGrad, Chunk: g.Chunk, Microbatch: g.Microbatch, Peer: b.next()}
	}
	j := k - (s.c.PP - 1)
	if j < 0 || s.bwd(j).Chunk == 0 {
		return nil
	}
	g := s.bwd(j)
	return &Action{Op: RecvGrad, Chunk: g.Chunk - 1, Microbatch: g.Microbatch, Peer: b.next()}
}

// firstGrad is the gradient of the rank's first backward, received before
// the steady phase (none on the last rank, whose first backward is the
// model's last stage).
func (s *interleaved) firstGrad(b *builder) *Action {
	if s.last() {
		return nil
	}
	g := s.bwd(0)
	return &Action{Op: RecvGrad, Chunk: g.Chunk, Microbatch: g.Microbatch, Peer: b.next()}
}

func (s *interleaved) build(b *builder) {
	ph := s.ph
	if !s.first() {
		f := s.fwd(0)
		b.exchange(&Action{Op: RecvActivation, Chunk: f.Chunk, Microbatch: f.Microbatch, Peer: b.prev()})
	}
	for k := range ph.Warmup {
		f := s.fwd(k)
		b.compute(Forward, f.Chunk, f.Microbatch)
		if k == ph.Warmup-1 && !ph.AllWarmup() {
			b.exchange(s.sendAct(b, k), s.recvAct(b, k), s.firstGrad(b))
		} else {
			b.exchange(s.sendAct(b, k), s.recvAct(b, k))
		}
	}
	for i := range ph.Steady {
		fk := i + ph.Warmup
		f, g := s.fwd(fk), s.bwd(i)
		b.compute(Forward, f.Chunk, f.Microbatch)
		b.compute(Backward, g.Chunk, g.Microbatch)
		b.exchange(s.sendAct(b, fk), s.recvAct(b, fk), s.sendGrad(b, i), s.recvGrad(b, i))
	}
	if ph.AllWarmup() {
		b.exchange(s.firstGrad(b))
	}
	for k := ph.Steady; k < ph.Total; k++ {
		g := s.bwd(k)
		b.compute(Backward, g.Chunk, g.Microbatch)
		b.exchange(s.sendGrad(b, k), s.recvGrad(b, k))
	}
}
