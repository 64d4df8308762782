package cp

import (
	"context"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// ringCall is P2P ring attention, one call (a tensor.Function): Megatron's
// AttnFuncWithCPAndKVP2P. At step i of C, rank r holds the keys and values
// of rank j = r−i: its chunks j and 2C−1−j. Query chunk A attends to key
// chunk B when A ≥ B (causal; every pair otherwise): at step 0 both local
// chunks causally (the diagonal), at 1 ≤ i ≤ r both query chunks over key
// chunk j only, at i > r the second query chunk over both key chunks —
// Megatron's table, which gives every rank the same work per step. The
// kernel merges each block into the running output through the
// log-sum-exp (Accumulate).
type ringCall struct {
	a   *Attention
	cfg tensor.AttentionConfig
	localChunks
}

// localChunks is what a rank's block attention keeps between forward and
// backward: its two sequence chunks (rank and 2C-1-rank, the load-balanced
// split) of the queries, its own keys and values packed for the exchange,
// and the two chunks' outputs and log-sum-exps.
type localChunks struct {
	g        geometry
	ids      [2]int // the sequence chunk index of each local chunk
	q        [2]*tensor.Tensor
	kv       *packed // own chunks: k0, k1, v0, v1
	out, lse [2]*tensor.Tensor
}

// split fills l from this rank's q, k, v (rank of size ranks): the chunks
// are copied into the packed buffer, the outputs and statistics allocated.
func (l *localChunks) split(q, k, v *tensor.Tensor, rank, size int) {
	l.g = geometryOf(q, k)
	g := l.g
	l.ids = [2]int{rank, 2*size - 1 - rank}
	dev := q.Device()
	l.q = [2]*tensor.Tensor{chunk(q, 0, g.c), chunk(q, 1, g.c)}
	l.kv = newPacked(dev, 4, g.b, g.c, g.hkv, g.d)
	for i, x := range []*tensor.Tensor{chunk(k, 0, g.c), chunk(k, 1, g.c), chunk(v, 0, g.c), chunk(v, 1, g.c)} {
		tensor.Copy(l.kv.parts[i], x)
	}
	for i := range 2 {
		l.out[i] = tensor.NewOn(dev, tensor.Float32, g.b, g.c, g.hq, g.d)
		l.lse[i] = tensor.NewOn(dev, tensor.Float32, g.b, g.hq, g.c)
	}
}

// ring returns the group's size, this rank, and its ring neighbours.
func (a *Attention) ring() (size, rank, next, prev int) {
	size, rank = a.Group.Size(), a.Group.Rank()
	return size, rank, (rank + 1) % size, (rank - 1 + size) % size
}

// exchange sends send to the next rank and receives recv from the previous
// one (even ranks send first, odd ranks receive first, so a ring of
// blocking sends cannot deadlock).
func (a *Attention) exchange(ctx context.Context, send, recv []float32) error {
	_, rank, next, prev := a.ring()
	if rank%2 == 0 {
		if err := a.Group.Send(ctx, comm.Float32s(send), next); err != nil {
			return err
		}
		return a.Group.Recv(ctx, comm.Float32s(recv), prev)
	}
	if err := a.Group.Recv(ctx, comm.Float32s(recv), prev); err != nil {
		return err
	}
	return a.Group.Send(ctx, comm.Float32s(send), next)
}

// startExchange starts exchange of cur into next in the background (the
// transfer the current block's compute hides); the returned wait finishes
// it and copies the received values into next. The transfer's own
// duration adds to Exchanged, the time wait blocks to CommWait.
//
// With device collectives for cur and next the exchange is one batched
// send and receive in place, queued at once (on a GPU it is ordered on the
// device's stream before the next block's kernels, which is where it
// overlaps them if at all); wait then only reports it.
func (a *Attention) startExchange(tp *tensor.Tape, op string, cur, next *tensor.Tensor) (wait func() bool) {
	if dc, ok := a.device(cur, next); ok {
		_, _, to, from := a.ring()
		start := time.Now()
		ok := a.wait(tp, op, func(ctx context.Context) error {
			return dc.BatchSendRecvTensors(ctx, []comm.TensorP2P{{Kind: comm.SendOp, Peer: to, T: cur}, {Kind: comm.RecvOp, Peer: from, T: next}})
		})
		a.exchanged += time.Since(start)
		return func() bool { return ok }
	}
	send, recv := stageOut(cur), hostBuffer(next)
	type result struct {
		err error
		d   time.Duration
	}
	done := make(chan result, 1)
	ctx := tp.Context()
	go func() {
		start := time.Now()
		err := a.exchange(ctx, send, recv)
		done <- result{err, time.Since(start)}
	}()
	return func() bool {
		var r result
		start := time.Now()
		ok := a.wait(tp, op, func(context.Context) error { r = <-done; return r.err })
		a.exchanged += r.d
		a.exchangeWait += time.Since(start)
		if ok {
			stageIn(next, recv)
		}
		return ok
	}
}

// exchangeNow sends cur to the next rank and receives the previous rank's
// into next: in place with device collectives, else staged through host
// buffers.
func (a *Attention) exchangeNow(tp *tensor.Tape, op string, cur, next *tensor.Tensor) bool {
	if dc, ok := a.device(cur, next); ok {
		_, _, to, from := a.ring()
		return a.wait(tp, op, func(ctx context.Context) error {
			return dc.BatchSendRecvTensors(ctx, []comm.TensorP2P{{Kind: comm.SendOp, Peer: to, T: cur}, {Kind: comm.RecvOp, Peer: from, T: next}})
		})
	}
	send, recv := stageOut(cur), hostBuffer(next)
	if !a.wait(tp, op, func(ctx context.Context) error { return a.exchange(ctx, send, recv) }) {
		return false
	}
	stageIn(next, recv)
	return true
}

// pairs calls f for each (local query chunk, key chunk) pair the mask
// leaves visible when this rank holds the key chunks of rank j.
func (f *ringCall) pairs(j int, fn func(qa, kb int)) {
	size := f.a.Group.Size()
	kids := [2]int{j, 2*size - 1 - j}
	for qa := range 2 {
		for kb := range 2 {
			if f.cfg.Causal && f.ids[qa] < kids[kb] {
				continue // hidden by the causal mask: never computed
			}
			fn(qa, kb)
		}
	}
}

// blockConfig is the kernel config of query chunk qa over the key chunk kb
// of rank j.
func (f *ringCall) blockConfig(j, qa, kb int) tensor.AttentionConfig {
	size := f.a.Group.Size()
	kid := j
	if kb == 1 {
		kid = 2*size - 1 - j
	}
	cfg := f.cfg
	cfg.QPos, cfg.KPos = f.ids[qa]*f.g.c, kid*f.g.c
	return cfg
}

func (f *ringCall) Forward(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
	size, rank, _, _ := f.a.ring()
	f.split(in[0], in[1], in[2], rank, size)
	g, dev := f.g, in[0].Device()
	started := [2]bool{}
	cur := f.kv
	spare := newPacked(dev, 4, g.b, g.c, g.hkv, g.d) // double buffer
	for i := range size {
		j := (rank - i + size) % size
		var wait func() bool
		if i < size-1 {
			wait = f.a.startExchange(tp, "ring attention key/value exchange", cur.flat, spare.flat)
		}
		f.pairs(j, func(qa, kb int) {
			cfg := f.blockConfig(j, qa, kb)
			cfg.Accumulate = started[qa]
			tensor.AttentionBlockForward(f.out[qa], f.lse[qa], f.q[qa], cur.parts[kb], cur.parts[2+kb], cfg)
			started[qa] = true
		})
		if wait == nil {
			break
		}
		if !wait() {
			break // the failure is on tp; the output is garbage of the right shape
		}
		if cur == f.kv { // the own chunks stay for backward
			cur, spare = spare, newPacked(dev, 4, g.b, g.c, g.hkv, g.d)
		} else {
			cur, spare = spare, cur
		}
	}
	return []*tensor.Tensor{tp.Concat(1, f.out[0], f.out[1])}
}

// Backward runs the ring again: the keys and values travel as in forward,
// each block's backward (with the final output and log-sum-exp) adds into
// the local query gradient and into the travelling key/value gradient of
// the block's owner, which after C steps arrives back at its owner.
func (f *ringCall) Backward(tp *tensor.Tape, gout []*tensor.Tensor) []*tensor.Tensor {
	g := f.g
	size, rank, _, _ := f.a.ring()
	dev := gout[0].Device()
	dout := [2]*tensor.Tensor{chunk(gout[0], 0, g.c), chunk(gout[0], 1, g.c)}
	dq := [2]*tensor.Tensor{tensor.ZerosOn(dev, g.b, g.c, g.hq, g.d), tensor.ZerosOn(dev, g.b, g.c, g.hq, g.d)}
	cur := f.kv
	spare := newPacked(dev, 4, g.b, g.c, g.hkv, g.d)
	dkv := newPacked(dev, 4, g.b, g.c, g.hkv, g.d)
	dspare := newPacked(dev, 4, g.b, g.c, g.hkv, g.d)
	for i := range size {
		j := (rank - i + size) % size
		var wait func() bool
		if i < size-1 {
			wait = f.a.startExchange(tp, "ring attention backward key/value exchange", cur.flat, spare.flat)
		}
		f.pairs(j, func(qa, kb int) {
			cfg := f.blockConfig(j, qa, kb)
			tensor.AttentionBlockBackward(dq[qa], dkv.parts[kb], dkv.parts[2+kb], dout[qa], f.q[qa], cur.parts[kb], cur.parts[2+kb],
				f.out[qa], f.lse[qa], cfg)
		})
		if wait != nil && !wait() {
			break
		}
		if size == 1 {
			break // a ring of one: the gradients are home
		}
		// the key/value gradients of rank j go on to the next rank (after
		// the last step, rank r+1's reach it complete)
		if !f.a.exchangeNow(tp, "ring attention key/value gradient exchange", dkv.flat, dspare.flat) {
			break
		}
		dkv, dspare = dspare, dkv
		if cur == f.kv {
			cur, spare = spare, newPacked(dev, 4, g.b, g.c, g.hkv, g.d)
		} else {
			cur, spare = spare, cur
		}
	}
	return []*tensor.Tensor{tp.Concat(1, dq[0], dq[1]), tp.Concat(1, dkv.parts[0], dkv.parts[1]), tp.Concat(1, dkv.parts[2], dkv.parts[3])}
}
