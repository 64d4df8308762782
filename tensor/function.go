package tensor

import (
	"fmt"
	"unsafe"
)

// Function is an op with a hand-written backward, the way tensor-parallel
// communication ops (copy-to/reduce-from/gather-from/scatter-to the TP
// region) are written: Forward computes outputs from inputs without
// recording; Backward maps the outputs' gradients to the inputs' (nil entries
// for inputs that need none). A gradient an output never received is passed
// as a zero tensor. The tape each is given shares the recording tape's
// context and failure: a Function that blocks uses tp.Context(), and one
// that fails calls tp.Fail and still returns tensors of the right shapes.
type Function interface {
	Forward(tp *Tape, in []*Tensor) []*Tensor
	Backward(tp *Tape, gradOut []*Tensor) []*Tensor
}

// Apply runs f and, when recording, pushes its Backward onto the tape.
//
// Backward's results become the inputs' gradients without a copy when the
// tape owns them: an output's gradient passed back unchanged (an identity
// backward) is shared as reshapes share theirs, and a tensor Backward
// allocated with tp.Empty is adopted when the input has no gradient yet, as
// the tape's own kernels do. Backward must not keep or write such a result
// after returning it. Anything else (a communication buffer, a heap tensor)
// is added into the input's gradient.
func (tp *Tape) Apply(f Function, in ...*Tensor) []*Tensor {
	// A strided view records no step of its own (ops route its gradient
	// through their Contiguous): give f dense inputs, so the gradients f
	// returns reach the viewed tensors.
	in = denseInputs(tp, in)
	outs := f.Forward(tp.nonRecording(), in)
	if !tp.recording(in...) {
		return outs
	}
	tp.record("function", func(tp *Tape) {
		gouts := make([]*Tensor, len(outs))
		for i, o := range outs {
			if g := tp.grad(o); g != nil {
				gouts[i] = g
			} else {
				gouts[i] = tp.zeros(o.dev, o.shape...)
			}
		}
		before := len(tp.live) // the child's buffers land in tp.live
		gins := f.Backward(tp.nonRecording(), gouts)
		fresh := append([]liveBuf(nil), tp.live[before:]...)
	inputs:
		for i, x := range in {
			if i >= len(gins) || gins[i] == nil {
				continue
			}
			g := gins[i]
			for j, o := range outs {
				if g == gouts[j] && tp.grad(o) == g {
					tp.passGrad(x, o)
					continue inputs
				}
			}
			if k := freshBuffer(fresh, g); k >= 0 && x.requiresGrad && !x.leaf && tp.grad(x) == nil {
				fresh[k] = liveBuf{} // adopted once
				tp.addGrad(x, g)
				continue
			}
			tp.accumulate(x, g)
		}
	}, outs...)
	return outs
}

// denseInputs is in with every strided view replaced by tp.Contiguous of
// it (in itself when all are dense: the caller's slice is not written).
func denseInputs(tp *Tape, in []*Tensor) []*Tensor {
	out := in
	for i, x := range in {
		if x == nil || x.IsContiguous() {
			continue
		}
		if len(out) > 0 && &out[0] == &in[0] {
			out = append([]*Tensor(nil), in...)
		}
		out[i] = tp.Contiguous(x)
	}
	return out
}

// freshBuffer returns the index of the buffer in fresh that g (a float32
// tensor) covers exactly and contiguously, or -1.
func freshBuffer(fresh []liveBuf, g *Tensor) int {
	if g.dtype != Float32 || !g.IsContiguous() || g.Numel() == 0 {
		return -1
	}
	if g.dbuf != nil {
		for k, b := range fresh {
			if b.dev == g.dbuf && g.offset == 0 && b.floats() == g.Numel() {
				return k
			}
		}
		return -1
	}
	d := g.f32s()
	for k, b := range fresh {
		if len(b.host) == len(d) && &b.host[0] == &d[0] {
			return k
		}
	}
	return -1
}

// accumulate adds g into x's gradient, copying (g may be owned by someone
// else, e.g. a communication buffer).
func (tp *Tape) accumulate(x, g *Tensor) {
	if d := tp.gradFor(x); d != nil {
		backendFor(d, g).Axpy(d, 1, g.Contiguous())
	}
}

// nonRecording returns a tape sharing tp's arena and buffers that records
// nothing (nil for a nil tape).
func (tp *Tape) nonRecording() *Tape {
	if tp == nil {
		return nil
	}
	return &Tape{arena: tp.arena, disabled: true, grads: map[*Tensor]gradRef{}, parent: tp, matmul: tp.matmul, ready: tp.ready, run: tp.run, child: true}
}

// Checkpoint runs fn without keeping its intermediate activations (activation
// recomputation): only the inputs are kept, and during backward fn runs again
// on a fresh tape under the same RNG states (so dropout masks repeat), then
// its backward. Parameters used inside fn receive their gradients as usual.
// Both runs of fn see tp's context and record failures on tp.
func (tp *Tape) Checkpoint(fn func(tp *Tape, in []*Tensor) []*Tensor, in []*Tensor, rngs ...*RNG) []*Tensor {
	saved := make([]RNGState, len(rngs))
	for i, r := range rngs {
		saved[i] = r.State()
	}
	if tp == nil {
		return fn(nil, in)
	}
	// The forward runs on a tape of its own so that its intermediate
	// buffers go back to the arena as soon as it returns (only the
	// outputs' buffers stay with tp): the memory recomputation saves.
	fwd := &Tape{arena: tp.arena, disabled: true, grads: map[*Tensor]gradRef{}, matmul: tp.matmul, ready: tp.ready, run: tp.run, child: true,
		replayed: tp.recording(in...) || tp.recordingParams()}
	outs := fn(fwd, in)
	owner := tp
	if tp.parent != nil {
		owner = tp.parent
	}
	for _, b := range fwd.live {
		if b.host == nil && b.dev == nil {
			continue // returned already (ForwardDone)
		}
		if backsAny(b, outs) {
			owner.live = append(owner.live, b)
		} else {
			b.release(tp.arena)
		}
	}
	fwd.live = nil
	tp.pinOperands(in...) // the recomputation reads them
	if !tp.recording(in...) && !tp.recordingParams() {
		return outs
	}
	tp.record("checkpoint", func(tp *Tape) {
		after := make([]RNGState, len(rngs))
		for i, r := range rngs {
			after[i] = r.State()
			r.SetState(saved[i])
		}
		// The recomputed activations go back to the arena as the
		// backward passes them (only the inputs' gradients are read
		// after): one layer's recomputation holds about one layer's
		// activations, not its forward's and its backward's at once.
		sub := &Tape{arena: tp.arena, grads: map[*Tensor]gradRef{}, matmul: tp.matmul, ready: tp.ready, nested: true, run: tp.run, child: true, release: true}
		det := make([]*Tensor, len(in))
		for i, x := range in {
			d := x.view(x.shape, x.strides, x.offset)
			d.requiresGrad = x.requiresGrad
			d.leaf = false // gradients land in sub.grads, not in a Grad field
			det[i] = d
		}
		// Mark detached inputs as recorded so sub records ops on them.
		re := fn(sub, det)
		var routs, rgrads []*Tensor
		for i, o := range re {
			if g := tp.grad(outs[i]); g != nil && o.requiresGrad {
				routs = append(routs, o)
				rgrads = append(rgrads, g)
			}
		}
		if len(routs) > 0 {
			if err := sub.BackwardFrom(routs, rgrads); err != nil && tp.Err() == nil {
				tp.Fail(fmt.Errorf("tensor: checkpoint recompute: %w", err))
			}
		}
		for i, x := range in {
			if g := sub.grad(det[i]); g != nil {
				tp.accumulate(x, g)
			}
		}
		sub.Reset()
		for i, r := range rngs {
			r.SetState(after[i])
		}
	}, outs...)
	return outs
}

// recordingParams reports whether tp records at all: a checkpointed block's
// parameters need gradients even when its inputs do not.
func (tp *Tape) recordingParams() bool { return tp != nil && !tp.disabled }

// backsAny reports whether buffer b holds the data of one of ts.
func backsAny(lb liveBuf, ts []*Tensor) bool {
	if lb.dev != nil {
		for _, t := range ts {
			if t != nil && t.dbuf == lb.dev {
				return true
			}
		}
		return false
	}
	b := lb.host
	if cap(b) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(b[:1])))
	hi := lo + uintptr(cap(b))*4
	for _, t := range ts {
		if t == nil || cap(t.f32) == 0 {
			continue
		}
		p := uintptr(unsafe.Pointer(unsafe.SliceData(t.f32[:1])))
		if p >= lo && p < hi {
			return true
		}
	}
	return false
}
