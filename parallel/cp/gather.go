package cp

import (
	"context"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// gatherCall is all_gather context parallelism, one call: Megatron's
// AttnFuncWithCPAndKVAllGather. Every rank's key and value chunks are
// all-gathered (rank p's message holds chunks p and 2C−1−p), each local
// query chunk A attends to the chunks B ≤ A (all of them without the causal
// mask), merged through the log-sum-exp; backward accumulates the key and
// value gradients of every chunk and reduce-scatters them to their owners.
// The communication is not overlapped (as Megatron's).
type gatherCall struct {
	a   *Attention
	cfg tensor.AttentionConfig
	localChunks
}

// gather all-gathers every rank's packed key/value chunks: rank p's four
// parts are all.parts[4p : 4p+4].
func (f *gatherCall) gather(tp *tensor.Tape) (*packed, bool) {
	g, size := f.g, f.a.Group.Size()
	all := newPacked(f.kv.flat.Device(), 4*size, g.b, g.c, g.hkv, g.d)
	if dc, ok := f.a.device(f.kv.flat, all.flat); ok {
		return all, f.a.wait(tp, "all_gather of keys and values", func(ctx context.Context) error {
			return dc.AllGatherTensor(ctx, all.flat, f.kv.flat)
		})
	}
	in, out := stageOut(f.kv.flat), hostBuffer(all.flat)
	ok := f.a.wait(tp, "all_gather of keys and values", func(ctx context.Context) error {
		return f.a.Group.AllGather(ctx, comm.Float32s(out), comm.Float32s(in), nil)
	})
	if ok {
		stageIn(all.flat, out)
	}
	return all, ok
}

// visible calls fn for each sequence chunk local query chunk qa attends to,
// with the index of its key part in the gathered buffer and its position.
func (f *gatherCall) visible(qa int, fn func(k, v int, pos int)) {
	size := f.a.Group.Size()
	last := 2*size - 1
	if f.cfg.Causal {
		last = f.ids[qa]
	}
	for id := 0; id <= last; id++ {
		owner, slot := id, 0
		if id >= size {
			owner, slot = 2*size-1-id, 1
		}
		fn(4*owner+slot, 4*owner+2+slot, id*f.g.c)
	}
}

func (f *gatherCall) Forward(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
	f.split(in[0], in[1], in[2], f.a.Group.Rank(), f.a.Group.Size())
	all, ok := f.gather(tp)
	for qa := range 2 {
		first := true
		f.visible(qa, func(kp, vp, pos int) {
			if !ok {
				return
			}
			cfg := f.cfg
			cfg.QPos, cfg.KPos, cfg.Accumulate = f.ids[qa]*f.g.c, pos, !first
			tensor.AttentionBlockForward(f.out[qa], f.lse[qa], f.q[qa], all.parts[kp], all.parts[vp], cfg)
			first = false
		})
	}
	return []*tensor.Tensor{tp.Concat(1, f.out[0], f.out[1])}
}

// Backward gathers the keys and values again (they are not kept: C× the
// local size), runs each block's backward with the final output and
// log-sum-exp, and reduce-scatters the key/value gradients to their owners.
func (f *gatherCall) Backward(tp *tensor.Tape, gout []*tensor.Tensor) []*tensor.Tensor {
	g, size := f.g, f.a.Group.Size()
	dev := gout[0].Device()
	dout := [2]*tensor.Tensor{chunk(gout[0], 0, g.c), chunk(gout[0], 1, g.c)}
	dq := [2]*tensor.Tensor{tensor.ZerosOn(dev, g.b, g.c, g.hq, g.d), tensor.ZerosOn(dev, g.b, g.c, g.hq, g.d)}
	dall := newPacked(dev, 4*size, g.b, g.c, g.hkv, g.d)
	all, ok := f.gather(tp)
	for qa := range 2 {
		f.visible(qa, func(kp, vp, pos int) {
			if !ok {
				return
			}
			cfg := f.cfg
			cfg.QPos, cfg.KPos = f.ids[qa]*g.c, pos
			tensor.AttentionBlockBackward(dq[qa], dall.parts[kp], dall.parts[vp], dout[qa], f.q[qa], all.parts[kp], all.parts[vp],
				f.out[qa], f.lse[qa], cfg)
		})
	}
	mine := newPacked(dev, 4, g.b, g.c, g.hkv, g.d)
	if dc, ok := f.a.device(dall.flat, mine.flat); ok {
		f.a.wait(tp, "reduce_scatter of key/value gradients", func(ctx context.Context) error {
			return dc.ReduceScatterTensor(ctx, mine.flat, dall.flat, comm.Sum)
		})
	} else if in, out := stageOut(dall.flat), hostBuffer(mine.flat); f.a.wait(tp, "reduce_scatter of key/value gradients", func(ctx context.Context) error {
		return f.a.Group.ReduceScatter(ctx, comm.Float32s(out), comm.Float32s(in), comm.Sum, nil)
	}) {
		stageIn(mine.flat, out)
	}
	return []*tensor.Tensor{tp.Concat(1, dq[0], dq[1]), tp.Concat(1, mine.parts[0], mine.parts[1]), tp.Concat(1, mine.parts[2], mine.parts[3])}
}
