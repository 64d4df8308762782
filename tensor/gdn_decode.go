package tensor

import (
	"fmt"

	"github.com/gotron/gotron/internal/cpu"
)

// The gated delta net's ops for decoding (no gradients): a decode step
// holds several sequences' next tokens, flattened one sequence after
// another, and each sequence carries its recurrent state from one step to
// the next. Runs lists the sequences in token order.

// RecurrentRun is one sequence's share of a decode step's tokens and its
// state, kept by the caller between steps: host memory (State), or a
// dense float32 tensor on the step's device (Dev: the GPU advances it in
// place, no copy a step).
type RecurrentRun struct {
	Tokens int // consecutive tokens of the step
	// State is updated in place: CausalConvSiLURuns' (k-1, channels), the
	// last k-1 inputs, oldest first; GatedDeltaRuleRuns' (heads, dk, dv).
	State []float32
	// Dev, when set, holds the state instead of State (the same layout).
	Dev *Tensor
}

// state returns r's state as a host slice: State, or Dev's storage on a
// host-memory device (the CPU, the simulated device).
func (r RecurrentRun) state() []float32 {
	if r.Dev != nil {
		return r.Dev.f32s()
	}
	return r.State
}

// devRuns reports whether every run keeps its state in a tensor on the
// GPU (the in-place kernels' case).
func devRuns(runs []RecurrentRun) bool {
	for _, r := range runs {
		if r.Dev == nil || r.Dev.dev != CUDA {
			return false
		}
	}
	return len(runs) > 0
}

// checkRuns fails tp unless runs cover n tokens with states of size each,
// those in tensors on dev, the step's device.
func checkRuns(tp *Tape, op string, dev Device, runs []RecurrentRun, n, size int) bool {
	total := 0
	for i, r := range runs {
		n := len(r.State)
		if r.Dev != nil {
			n = r.Dev.Numel()
			if r.Dev.dtype != Float32 || !r.Dev.IsContiguous() || r.Dev.dev != dev {
				tp.Fail(fmt.Errorf("tensor: %s: run %d's state is %v on %v, want a dense float32 tensor on %v, the step's device", op, i, r.Dev, r.Dev.dev, dev))
				return false
			}
		}
		if r.Tokens <= 0 || n != size {
			tp.Fail(fmt.Errorf("tensor: %s: run %d has %d tokens and a state of %d floats: want > 0 tokens and %d floats", op, i, r.Tokens, n, size))
			return false
		}
		total += r.Tokens
	}
	if total != n {
		tp.Fail(fmt.Errorf("tensor: %s: runs of %d tokens for %d", op, total, n))
		return false
	}
	return true
}

// CausalConvSiLURuns is CausalConvSiLU of x (1, n, c) whose tokens are
// runs of sequences, each continuing from its run's state (see
// cpu.CausalConvSiLUStateForward), which it advances. A sequence decoded
// in pieces gets the bits CausalConvSiLU gives it whole.
func (tp *Tape) CausalConvSiLURuns(x, w *Tensor, runs []RecurrentRun) *Tensor {
	if x.NDim() != 3 || x.Dim(0) != 1 || w.NDim() < 2 || w.Dim(0) != x.Dim(2) || x.Dim(2) == 0 {
		panic(fmt.Sprintf("tensor: CausalConvSiLURuns of x %v with weight %v: want (1, n, c) and (c, k) or (c, 1, k)", x.shape, w.shape))
	}
	n, c := x.Dim(1), x.Dim(2)
	k := w.Numel() / c
	x = tp.Contiguous(x)
	out := tp.EmptyLike(x, 1, n, c)
	if !checkRuns(tp, "CausalConvSiLURuns", x.dev, runs, n, (k-1)*c) {
		return out
	}
	if x.dev == CUDA && w.dev == CUDA {
		cudaCausalConvSiLURuns(out, x, w.Contiguous(), runs, c, k)
		return out
	}
	if !hostOnly(tp, "CausalConvSiLURuns", x, w) {
		return out
	}
	o, xs, ws := out.f32s(), x.f32s(), w.f32s()
	cpu.Parallel(len(runs), 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			r0 := 0
			for _, r := range runs[:i] {
				r0 += r.Tokens
			}
			t := runs[i].Tokens
			cpu.CausalConvSiLUStateForward(o[r0*c:(r0+t)*c], xs[r0*c:(r0+t)*c], ws, runs[i].state(), t, c, k)
		}
	})
	return out
}

// GatedDeltaRuleRuns is GatedDeltaRule of q, k (1, n, key heads, dk), v
// (1, n, heads, dv), g and beta (1, n, heads) whose tokens are runs of
// sequences, each continuing from its run's state (heads, dk, dv), which
// it advances (cpu.GatedDeltaRuleStateForward). It returns (1, n, heads,
// dv). A sequence decoded in pieces gets the bits GatedDeltaRuleRecurrent
// gives it whole (and GatedDeltaRule's chunked form within float32
// rounding).
func (tp *Tape) GatedDeltaRuleRuns(q, k, v, g, beta *Tensor, scale float64, runs []RecurrentRun) *Tensor {
	if q.NDim() != 4 || v.NDim() != 4 || q.Dim(0) != 1 {
		panic(fmt.Sprintf("tensor: GatedDeltaRuleRuns of q %v and v %v: want (1, n, heads, d)", q.shape, v.shape))
	}
	n, kh, dk := q.Dim(1), q.Dim(2), q.Dim(3)
	heads, dv := v.Dim(2), v.Dim(3)
	if !sameShape(q.shape, k.shape) || v.Dim(0) != 1 || v.Dim(1) != n || kh <= 0 || heads%kh != 0 ||
		g.Numel() != n*heads || beta.Numel() != n*heads {
		panic(fmt.Sprintf("tensor: GatedDeltaRuleRuns of q %v, k %v, v %v, g %v, beta %v", q.shape, k.shape, v.shape, g.shape, beta.shape))
	}
	q, k, v, g, beta = tp.Contiguous(q), tp.Contiguous(k), tp.Contiguous(v), tp.Contiguous(g), tp.Contiguous(beta)
	out := tp.EmptyLike(v, 1, n, heads, dv)
	if !checkRuns(tp, "GatedDeltaRuleRuns", v.dev, runs, n, heads*dk*dv) {
		return out
	}
	if allCUDA(q, k, v, g, beta) {
		qr, kr := cudaRepeatHeads(q, n, kh, heads, dk), cudaRepeatHeads(k, n, kh, heads, dk)
		cudaGatedDeltaRuleRuns(out, qr, kr, v, g, beta, runs, heads, dk, dv, scale)
		if kh != heads {
			qr.dbuf.free()
			kr.dbuf.free()
		}
		return out
	}
	if !hostOnly(tp, "GatedDeltaRuleRuns", q, k, v, g, beta) {
		return out
	}
	f := &deltaRule{s: cpu.DeltaRuleShape{B: 1, T: n, Heads: heads, DK: dk, DV: dv}, keyHeads: kh}
	qs, ks := f.repeat(q.f32s()), f.repeat(k.f32s())
	vs, gs, bs, o := v.f32s(), g.f32s(), beta.f32s(), out.f32s()
	r0 := 0
	for _, r := range runs {
		t := r.Tokens
		s := cpu.DeltaRuleShape{B: 1, T: t, Heads: heads, DK: dk, DV: dv, Scale: scale, Chunk: 1}
		qa, kv := r0*heads*dk, r0*heads*dv
		cpu.GatedDeltaRuleStateForward(o[kv:kv+t*heads*dv], r.state(), qs[qa:qa+t*heads*dk], ks[qa:qa+t*heads*dk],
			vs[kv:kv+t*heads*dv], gs[r0*heads:(r0+t)*heads], bs[r0*heads:(r0+t)*heads], s)
		r0 += t
	}
	return out
}
