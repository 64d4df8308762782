package cp

import "github.com/gotron/gotron/tensor"

// hierCall is a2a+p2p context parallelism, one call (Transformer Engine's
// hierarchical CP): C = A·P. The all-to-all within this rank's a2a group
// (A consecutive CP ranks, holding fine chunks pA+i and 2C−1−pA−i) gives
// each of them A·c·2 tokens of H/A heads, ordered as the a2a's zigzag over
// A: fine chunks pA…pA+A−1, then 2C−1−(pA+A−1)…2C−1−pA — exactly coarse
// chunks p and 2P−1−p of the sequence cut into 2·P chunks of A·c. Ring
// attention over the ring group (the P ranks holding the same heads) then
// runs on those coarse chunks, and the inverse all-to-all restores the
// sequence split.
type hierCall struct {
	a   *Attention
	cfg tensor.AttentionConfig

	inner *a2aCall
	ring  *ringCall
}

func (f *hierCall) Forward(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
	q, k, v := in[0], in[1], in[2]
	level1 := &Attention{Group: f.a.A2AGroup}
	level2 := &Attention{Group: f.a.RingGroup}
	defer func() {
		f.a.comm += level1.comm + level2.comm
		f.a.exchanged += level2.exchanged
		f.a.exchangeWait += level2.exchangeWait
	}()
	f.inner = &a2aCall{a: level1}
	cfg := f.cfg
	cfg.FirstHead += f.a.A2AGroup.Rank() * q.Dim(2) / f.a.A2AGroup.Size()
	f.ring = &ringCall{a: level2, cfg: cfg}
	hq := f.inner.toHeads(tp, "a2a of queries (a2a+p2p)", q)
	hk := f.inner.toHeads(tp, "a2a of keys (a2a+p2p)", k)
	hv := f.inner.toHeads(tp, "a2a of values (a2a+p2p)", v)
	out := f.ring.Forward(tp, []*tensor.Tensor{hq, hk, hv})[0]
	return []*tensor.Tensor{f.inner.toSequence(tp, "a2a of the attention output (a2a+p2p)", out)}
}

func (f *hierCall) Backward(tp *tensor.Tape, gout []*tensor.Tensor) []*tensor.Tensor {
	l1, l2, x2, w2 := f.inner.a.comm, f.ring.a.comm, f.ring.a.exchanged, f.ring.a.exchangeWait
	defer func() {
		f.a.comm += f.inner.a.comm - l1 + f.ring.a.comm - l2
		f.a.exchanged += f.ring.a.exchanged - x2
		f.a.exchangeWait += f.ring.a.exchangeWait - w2
	}()
	dout := f.inner.toHeads(tp, "a2a of the output gradient (a2a+p2p)", gout[0])
	g := f.ring.Backward(tp, []*tensor.Tensor{dout})
	return []*tensor.Tensor{
		f.inner.toSequence(tp, "a2a of the query gradient (a2a+p2p)", g[0]),
		f.inner.toSequence(tp, "a2a of the key gradient (a2a+p2p)", g[1]),
		f.inner.toSequence(tp, "a2a of the value gradient (a2a+p2p)", g[2]),
	}
}
