package tensor

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/internal/cpu"
)

// The ops of Megatron's gated delta net layer (model/gpt's hybrid model)
// and of its attention output gate. They compute with internal/cpu's
// kernels on host memory (the CPU and the simulated device, whose buffers
// are host memory) and with CUDA kernels on the GPU (cuda_backend_gate.go,
// cuda_backend_gdn.go: built, not yet run on a GPU, so gpt.Config.CheckDevice
// refuses such a model on --device cuda unless GOTRON_CUDA_UNVERIFIED names
// gdn or output-gate). Each is a Function: Forward keeps what Backward
// needs.

// hostOnly fails tp when x is on a device whose memory the host cannot
// read, naming op; it reports whether the op can run.
func hostOnly(tp *Tape, op string, xs ...*Tensor) bool {
	for _, x := range xs {
		if x.dev == CUDA {
			tp.Fail(fmt.Errorf("tensor: %s has no CUDA kernel in this release (it runs on the CPU)", op))
			return false
		}
	}
	return true
}

// allCUDA reports whether every x is on the GPU (a mix fails the tape in
// hostOnly).
func allCUDA(xs ...*Tensor) bool {
	for _, x := range xs {
		if x.dev != CUDA {
			return false
		}
	}
	return true
}

// zeroGrad is a zeroed gradient buffer shaped like x, from the tape.
func zeroGrad(tp *Tape, x *Tensor) *Tensor {
	g := tp.EmptyLike(x, x.shape...)
	Zero(g)
	return g
}

// CausalConvSiLU is silu of a causal depthwise convolution over time: x
// (b, t, c), w (c, k) (or PyTorch's (c, 1, k)), where w[ch][k-1] weighs the current
// step and earlier steps before 0 are zero (PyTorch's F.conv1d with
// groups=c, padding k-1, the first t outputs; cpu.CausalConvSiLUForward).
func (tp *Tape) CausalConvSiLU(x, w *Tensor) *Tensor {
	if x.NDim() != 3 || w.NDim() < 2 || w.Dim(0) != x.Dim(2) || x.Dim(2) == 0 {
		panic(fmt.Sprintf("tensor: CausalConvSiLU of x %v with weight %v: want (b, t, c) and (c, k) or (c, 1, k)", x.shape, w.shape))
	}
	b, t, c := x.Dim(0), x.Dim(1), x.Dim(2)
	k := w.Numel() / c
	f := &convSiLU{b: b, t: t, c: c, k: k}
	return tp.Apply(f, tp.Contiguous(x), w)[0]
}

type convSiLU struct {
	b, t, c, k int
	in         []*Tensor
}

func (f *convSiLU) Forward(tp *Tape, in []*Tensor) []*Tensor {
	f.in = in
	out := tp.EmptyLike(in[0], f.b, f.t, f.c)
	if in[0].dev == CUDA && in[1].dev == CUDA {
		cudaCausalConvSiLUForward(out, in[0], in[1].Contiguous(), f.b, f.t, f.c, f.k)
		return []*Tensor{out}
	}
	if hostOnly(tp, "CausalConvSiLU", in...) {
		cpu.CausalConvSiLUForward(out.f32s(), in[0].f32s(), in[1].f32s(), f.b, f.t, f.c, f.k)
	}
	return []*Tensor{out}
}

func (f *convSiLU) Backward(tp *Tape, g []*Tensor) []*Tensor {
	dx, dw := zeroGrad(tp, f.in[0]), zeroGrad(tp, f.in[1])
	if f.in[0].dev == CUDA && f.in[1].dev == CUDA {
		cudaCausalConvSiLUBackward(dx, dw, g[0].Contiguous(), f.in[0], f.in[1].Contiguous(), f.b, f.t, f.c, f.k)
		return []*Tensor{dx, dw}
	}
	if hostOnly(tp, "CausalConvSiLU", f.in...) {
		cpu.CausalConvSiLUBackward(dx.f32s(), dw.f32s(), g[0].Contiguous().f32s(), f.in[0].f32s(), f.in[1].f32s(), f.b, f.t, f.c, f.k)
	}
	return []*Tensor{dx, dw}
}

// L2Norm scales each vector along x's last dimension to unit length:
// x / sqrt(Σx² + eps) (FLA's l2norm).
func (tp *Tape) L2Norm(x *Tensor, eps float64) *Tensor {
	d := x.Dim(-1)
	return tp.Apply(&l2Norm{n: x.Numel() / max(1, d), d: d, eps: eps}, tp.Contiguous(x))[0]
}

type l2Norm struct {
	n, d int
	eps  float64
	x    *Tensor
}

func (f *l2Norm) Forward(tp *Tape, in []*Tensor) []*Tensor {
	f.x = in[0]
	out := tp.EmptyLike(in[0], in[0].shape...)
	if in[0].dev == CUDA {
		cudaL2NormForward(out, in[0], f.n, f.d, f.eps)
		return []*Tensor{out}
	}
	if hostOnly(tp, "L2Norm", in...) {
		cpu.L2NormForward(out.f32s(), in[0].f32s(), f.n, f.d, f.eps)
	}
	return []*Tensor{out}
}

func (f *l2Norm) Backward(tp *Tape, g []*Tensor) []*Tensor {
	dx := zeroGrad(tp, f.x)
	if f.x.dev == CUDA {
		cudaL2NormBackward(dx, g[0].Contiguous(), f.x, f.n, f.d, f.eps)
		return []*Tensor{dx}
	}
	if hostOnly(tp, "L2Norm", f.x) {
		cpu.L2NormBackward(dx.f32s(), g[0].Contiguous().f32s(), f.x.f32s(), f.n, f.d, f.eps)
	}
	return []*Tensor{dx}
}

// GDNGates computes a gated delta net's gates from alpha and b (…, h) and
// the per-head aLog and dtBias (h): the log-decay g = -exp(aLog)·
// softplus(alpha + dtBias) and beta = sigmoid(b), both shaped like alpha
// (Megatron's GatedDeltaNet._compute_gates).
func (tp *Tape) GDNGates(alpha, b, aLog, dtBias *Tensor) (g, beta *Tensor) {
	h := aLog.Numel()
	if alpha.Dim(-1) != h || b.Numel() != alpha.Numel() || dtBias.Numel() != h {
		panic(fmt.Sprintf("tensor: GDNGates of alpha %v, b %v, A_log %v, dt_bias %v", alpha.shape, b.shape, aLog.shape, dtBias.shape))
	}
	out := tp.Apply(&gdnGates{n: alpha.Numel() / h, h: h, shape: alpha.shape}, tp.Contiguous(alpha), tp.Contiguous(b), aLog, dtBias)
	return out[0], out[1]
}

type gdnGates struct {
	n, h  int
	shape []int
	in    []*Tensor
}

func (f *gdnGates) Forward(tp *Tape, in []*Tensor) []*Tensor {
	f.in = in
	g, beta := tp.EmptyLike(in[0], f.shape...), tp.EmptyLike(in[0], f.shape...)
	if allCUDA(in...) {
		cudaGDNGatesForward(g, beta, in[0], in[1], in[2].Contiguous(), in[3].Contiguous(), f.n, f.h)
		return []*Tensor{g, beta}
	}
	if hostOnly(tp, "GDNGates", in...) {
		cpu.GDNGatesForward(g.f32s(), beta.f32s(), in[0].f32s(), in[1].f32s(), in[2].f32s(), in[3].f32s(), f.n, f.h)
	}
	return []*Tensor{g, beta}
}

func (f *gdnGates) Backward(tp *Tape, g []*Tensor) []*Tensor {
	d := make([]*Tensor, 4)
	for i := range d {
		d[i] = zeroGrad(tp, f.in[i])
	}
	if allCUDA(f.in...) {
		cudaGDNGatesBackward(d, g[0].Contiguous(), g[1].Contiguous(), f.in[0], f.in[1], f.in[2].Contiguous(), f.in[3].Contiguous(), f.n, f.h)
		return d
	}
	if hostOnly(tp, "GDNGates", f.in...) {
		cpu.GDNGatesBackward(d[0].f32s(), d[1].f32s(), d[2].f32s(), d[3].f32s(), g[0].Contiguous().f32s(), g[1].Contiguous().f32s(),
			f.in[0].f32s(), f.in[1].f32s(), f.in[2].f32s(), f.in[3].f32s(), f.n, f.h)
	}
	return d
}

// GatedDeltaRule is the gated delta rule of q, k (b, t, key heads, dk), v
// (b, t, heads, dv), g and beta (b, t, heads) in its chunked (WY) form, as
// Megatron's torch_chunk_gated_delta_rule and FLA compute it
// (cpu.GatedDeltaRuleChunkedForward, chunks of chunk steps; its backward
// recomputes each chunk from the state saved before it): value head j
// reads key head j/(heads/key heads), as Megatron's repeat_interleave;
// scale multiplies the queries. It returns (b, t, heads, dv).
// GatedDeltaRuleRecurrent computes the same function token by token, the
// reference.
func (tp *Tape) GatedDeltaRule(q, k, v, g, beta *Tensor, scale float64, chunk int) *Tensor {
	return tp.gatedDeltaRule(q, k, v, g, beta, scale, chunk, false)
}

// GatedDeltaRuleRecurrent is GatedDeltaRule computed by the recurrence,
// step by step (cpu.GatedDeltaRuleForward; its backward recomputes the
// states from one saved every chunk steps): the reference of the chunked
// form, and the arithmetic GatedDeltaRuleRuns (decoding) repeats.
func (tp *Tape) GatedDeltaRuleRecurrent(q, k, v, g, beta *Tensor, scale float64, chunk int) *Tensor {
	return tp.gatedDeltaRule(q, k, v, g, beta, scale, chunk, true)
}

func (tp *Tape) gatedDeltaRule(q, k, v, g, beta *Tensor, scale float64, chunk int, recurrent bool) *Tensor {
	if q.NDim() != 4 || v.NDim() != 4 {
		panic(fmt.Sprintf("tensor: GatedDeltaRule of q %v and v %v: want (b, t, heads, d)", q.shape, v.shape))
	}
	b, t, kh, dk := q.Dim(0), q.Dim(1), q.Dim(2), q.Dim(3)
	heads, dv := v.Dim(2), v.Dim(3)
	if !sameShape(q.shape, k.shape) || v.Dim(0) != b || v.Dim(1) != t || kh <= 0 || heads%kh != 0 ||
		g.Numel() != b*t*heads || beta.Numel() != b*t*heads || chunk <= 0 {
		panic(fmt.Sprintf("tensor: GatedDeltaRule of q %v, k %v, v %v, g %v, beta %v, chunk %d", q.shape, k.shape, v.shape, g.shape, beta.shape, chunk))
	}
	f := &deltaRule{s: cpu.DeltaRuleShape{B: b, T: t, Heads: heads, DK: dk, DV: dv, Scale: scale, Chunk: chunk}, keyHeads: kh, recurrent: recurrent}
	in := []*Tensor{tp.Contiguous(q), tp.Contiguous(k), tp.Contiguous(v), tp.Contiguous(g), tp.Contiguous(beta)}
	f.forwardOnly = !tp.wantsGrad(in...)
	return tp.Apply(f, in...)[0]
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

type deltaRule struct {
	s         cpu.DeltaRuleShape
	keyHeads  int
	recurrent bool // the reference recurrence, not the chunked form
	// forwardOnly: no Backward will run (the GPU keeps no states then)
	forwardOnly bool
	in          []*Tensor
	q, k        []float32 // repeated to s.Heads
	saved       []float32
	// On the GPU: q and k repeated to s.Heads (the inputs themselves
	// without GQA) and the saved states.
	qDev, kDev, savedDev *Tensor
}

func (f *deltaRule) Forward(tp *Tape, in []*Tensor) []*Tensor {
	f.in = in
	s := f.s
	out := tp.EmptyLike(in[2], s.B, s.T, s.Heads, s.DV)
	if allCUDA(in...) {
		// The GPU runs the recurrence for the chunked form too
		// (cuda_backend_gdn.go).
		f.qDev = cudaRepeatHeads(in[0], s.B*s.T, f.keyHeads, s.Heads, s.DK)
		f.kDev = cudaRepeatHeads(in[1], s.B*s.T, f.keyHeads, s.Heads, s.DK)
		if f.forwardOnly {
			s.Chunk = s.T // one saved state a sequence and head, dropped below
		}
		f.savedDev = cudaDeltaRuleForward(out, f.qDev, f.kDev, in[2], in[3], in[4], s)
		if f.forwardOnly {
			f.freeDev()
		}
		return []*Tensor{out}
	}
	if !hostOnly(tp, "GatedDeltaRule", in...) {
		return []*Tensor{out}
	}
	f.q, f.k = f.repeat(in[0].f32s()), f.repeat(in[1].f32s())
	f.saved = make([]float32, s.SavedStates())
	if f.recurrent {
		cpu.GatedDeltaRuleForward(out.f32s(), f.saved, f.q, f.k, in[2].f32s(), in[3].f32s(), in[4].f32s(), s)
	} else {
		cpu.GatedDeltaRuleChunkedForward(out.f32s(), f.saved, f.q, f.k, in[2].f32s(), in[3].f32s(), in[4].f32s(), s)
	}
	return []*Tensor{out}
}

// repeat expands (b, t, keyHeads, dk) to (b, t, heads, dk).
func (f *deltaRule) repeat(x []float32) []float32 {
	s, r := f.s, f.s.Heads/f.keyHeads
	if r == 1 {
		return x
	}
	out := make([]float32, s.B*s.T*s.Heads*s.DK)
	for row := range s.B * s.T {
		for h := range s.Heads {
			copy(out[(row*s.Heads+h)*s.DK:(row*s.Heads+h+1)*s.DK], x[(row*f.keyHeads+h/r)*s.DK:])
		}
	}
	return out
}

// fold adds the repeated heads' gradients d (b, t, heads, dk) into dx
// (b, t, keyHeads, dk).
func (f *deltaRule) fold(dx, d []float32) {
	s, r := f.s, f.s.Heads/f.keyHeads
	for row := range s.B * s.T {
		for h := range s.Heads {
			dst := dx[(row*f.keyHeads+h/r)*s.DK : (row*f.keyHeads+h/r+1)*s.DK]
			for j, v := range d[(row*s.Heads+h)*s.DK : (row*s.Heads+h+1)*s.DK] {
				dst[j] += v
			}
		}
	}
}

func (f *deltaRule) Backward(tp *Tape, g []*Tensor) []*Tensor {
	s := f.s
	d := make([]*Tensor, 5)
	for i := range d {
		d[i] = zeroGrad(tp, f.in[i])
	}
	if f.savedDev != nil {
		f.cudaBackward(d, g[0].Contiguous())
		return d
	}
	if !hostOnly(tp, "GatedDeltaRule", f.in...) {
		return d
	}
	dq, dk := d[0].f32s(), d[1].f32s()
	if f.keyHeads != s.Heads {
		dq, dk = make([]float32, len(f.q)), make([]float32, len(f.k))
	}
	bwd := cpu.GatedDeltaRuleChunkedBackward[float32]
	if f.recurrent {
		bwd = cpu.GatedDeltaRuleBackward[float32]
	}
	bwd(dq, dk, d[2].f32s(), d[3].f32s(), d[4].f32s(), g[0].Contiguous().f32s(), f.saved,
		f.q, f.k, f.in[2].f32s(), f.in[3].f32s(), f.in[4].f32s(), s)
	if f.keyHeads != s.Heads {
		f.fold(d[0].f32s(), dq)
		f.fold(d[1].f32s(), dk)
	}
	f.saved, f.q, f.k = nil, nil, nil
	return d
}

// cudaBackward is Backward on the GPU: into d's buffers, through
// repeated-head scratch with GQA.
func (f *deltaRule) cudaBackward(d []*Tensor, dout *Tensor) {
	s := f.s
	dq, dk := d[0], d[1]
	if f.keyHeads != s.Heads {
		dq, dk = NewOn(CUDA, Float32, f.qDev.shape...), NewOn(CUDA, Float32, f.kDev.shape...)
		defer dq.dbuf.free()
		defer dk.dbuf.free()
	}
	cudaDeltaRuleBackward(dq, dk, d[2], d[3], d[4], dout, f.savedDev, f.qDev, f.kDev, f.in[2], f.in[3], f.in[4], s)
	if f.keyHeads != s.Heads {
		cudaFoldHeads(d[0], dq, s.B*s.T, f.keyHeads, s.Heads, s.DK)
		cudaFoldHeads(d[1], dk, s.B*s.T, f.keyHeads, s.Heads, s.DK)
	}
	f.freeDev()
}

// freeDev returns the GPU scratch the forward kept: the saved states and
// the repeated heads (not the inputs themselves).
func (f *deltaRule) freeDev() {
	if f.keyHeads != f.s.Heads {
		f.qDev.dbuf.free()
		f.kDev.dbuf.free()
	}
	f.savedDev.dbuf.free()
	f.savedDev, f.qDev, f.kDev = nil, nil, nil
}

// SigmoidGate is x·sigmoid(gate) for x and gate of one shape (Megatron's
// attention output gate, Attention._apply_output_gate).
func (tp *Tape) SigmoidGate(x, gate *Tensor) *Tensor {
	if !sameShape(x.shape, gate.shape) {
		panic(fmt.Sprintf("tensor: SigmoidGate of x %v and gate %v: want one shape", x.shape, gate.shape))
	}
	return tp.Apply(&sigmoidGate{}, tp.Contiguous(x), tp.Contiguous(gate))[0]
}

type sigmoidGate struct{ x, gate *Tensor }

func (f *sigmoidGate) Forward(tp *Tape, in []*Tensor) []*Tensor {
	f.x, f.gate = in[0], in[1]
	out := tp.EmptyLike(in[0], in[0].shape...)
	if in[0].dev == CUDA && in[1].dev == CUDA {
		cudaSigmoidGateForward(out, in[0], in[1])
		return []*Tensor{out}
	}
	if !hostOnly(tp, "SigmoidGate", in...) {
		return []*Tensor{out}
	}
	o, x, gt := out.f32s(), in[0].f32s(), in[1].f32s()
	cpu.Parallel(len(o), 4096, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			o[i] = x[i] * float32(1/(1+math.Exp(-float64(gt[i]))))
		}
	})
	return []*Tensor{out}
}

func (f *sigmoidGate) Backward(tp *Tape, g []*Tensor) []*Tensor {
	dx, dg := tp.EmptyLike(f.x, f.x.shape...), tp.EmptyLike(f.gate, f.gate.shape...)
	if f.x.dev == CUDA && f.gate.dev == CUDA {
		cudaSigmoidGateBackward(dx, dg, g[0].Contiguous(), f.x, f.gate)
		return []*Tensor{dx, dg}
	}
	if !hostOnly(tp, "SigmoidGate", f.x, f.gate) {
		return []*Tensor{dx, dg}
	}
	a, b, x, gt, d := dx.f32s(), dg.f32s(), f.x.f32s(), f.gate.f32s(), g[0].Contiguous().f32s()
	cpu.Parallel(len(a), 4096, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			sg := 1 / (1 + math.Exp(-float64(gt[i])))
			a[i] = d[i] * float32(sg)
			b[i] = float32(float64(d[i]) * float64(x[i]) * sg * (1 - sg))
		}
	})
	return []*Tensor{dx, dg}
}
