package tensor

import "github.com/gotron/gotron/internal/cpu"

// The gated delta net's ops on the CUDA backend, gdn.cu's kernels: the
// causal depthwise convolution with SiLU (CausalConvSiLU), L2Norm, the
// gates (GDNGates), the gated delta rule (GatedDeltaRule and
// GatedDeltaRuleRecurrent) and the decoding runs (CausalConvSiLURuns,
// GatedDeltaRuleRuns). Each value is the CPU's (internal/cpu's order,
// products and sums rounded one at a time, the float64 parts in float64:
// equal up to the float64 exp's last bit, hostcheck's TestHostCausalConvSiLU,
// TestHostL2Norm, TestHostGDNGates, TestHostGatedDeltaRule,
// TestHostGDNRuns). The delta rule runs its recurrence on the GPU, one
// thread a state column, for both ops: bit for bit the CPU's
// GatedDeltaRuleRecurrent, and the chunked (WY) form's values within
// float32 rounding (the CPU computes GatedDeltaRule by matrix products over
// chunks). Built, not yet run on a GPU: gpt.Config.CheckDevice refuses
// the gated delta net on --device cuda unless GOTRON_CUDA_UNVERIFIED names
// gdn.

// cudaCausalConvSiLUForward writes silu(causal_conv(x, w)) into out, x and
// out dense (b, t, c) and w dense (c, k) on the GPU.
func cudaCausalConvSiLUForward(out, x, w *Tensor, b, t, c, k int) {
	be := cudaBackend{rt: cudaRT()}
	n := b * t * c
	be.launch1D("gdn_conv_silu_fwd_f32", n, gdnConvArgs(be.ptr(out), 0, be.ptr(x), be.ptr(w), n, 0, t, c, k)...)
}

// cudaCausalConvSiLUBackward adds the gradients of dout into dx (b, t, c)
// and dw (c, k): the gradient before SiLU first (a scratch of b·t·c), then
// dx by the transposed convolution and dw by one thread per weight.
func cudaCausalConvSiLUBackward(dx, dw, dout, x, w *Tensor, b, t, c, k int) {
	be := cudaBackend{rt: cudaRT()}
	n := b * t * c
	dpre := be.empty(Float32, n)
	defer dpre.dbuf.free()
	be.launch1D("gdn_conv_silu_dpre_f32", n, gdnConvArgs(be.ptr(dpre), be.ptr(dout), be.ptr(x), be.ptr(w), n, 0, t, c, k)...)
	be.launch1D("gdn_conv_silu_dx_f32", n, gdnConvArgs(be.ptr(dx), 0, be.ptr(dpre), be.ptr(w), n, 0, t, c, k)...)
	be.launch1D("gdn_conv_silu_dw_f32", c*k, gdnConvArgs(be.ptr(dw), 0, be.ptr(dpre), be.ptr(x), c*k, b, t, c, k)...)
}

// gdnConvArgs are gdn.cu's convolution kernels' arguments in their
// parameter order (TestGDNArgsMatchPTX): out, dout (the dpre pass only:
// non-zero), two inputs, the elements, b (the dw pass only: non-zero), t,
// c and k.
func gdnConvArgs(out, dout, a, bIn uintptr, n, b, t, c, k int) []any {
	args := []any{out}
	if dout != 0 {
		args = append(args, dout)
	}
	args = append(args, a, bIn, int64(n))
	if b != 0 {
		args = append(args, int32(b))
	}
	return append(args, int32(t), int32(c), int32(k))
}

// cudaL2NormForward writes x / sqrt(Σx² + eps) per row of d into out (n
// rows, dense, on the GPU).
func cudaL2NormForward(out, x *Tensor, n, d int, eps float64) {
	be := cudaBackend{rt: cudaRT()}
	be.launch1D("gdn_l2norm_fwd_f32", n, gdnL2NormArgs(be.ptr(out), 0, be.ptr(x), n, d, eps)...)
}

// cudaL2NormBackward adds L2Norm's gradient of dy into dx.
func cudaL2NormBackward(dx, dy, x *Tensor, n, d int, eps float64) {
	be := cudaBackend{rt: cudaRT()}
	be.launch1D("gdn_l2norm_bwd_f32", n, gdnL2NormArgs(be.ptr(dx), be.ptr(dy), be.ptr(x), n, d, eps)...)
}

// gdnL2NormArgs are the L2Norm kernels' arguments in their parameter order
// (TestGDNArgsMatchPTX): out, dy (the backward only: non-zero), x, rows, d,
// eps.
func gdnL2NormArgs(out, dy, x uintptr, n, d int, eps float64) []any {
	args := []any{out}
	if dy != 0 {
		args = append(args, dy)
	}
	return append(args, x, int64(n), int32(d), eps)
}

// cudaGDNGatesForward writes the gates g and beta (n·h, dense) of alpha,
// b (n·h), aLog and dtBias (h).
func cudaGDNGatesForward(g, beta, alpha, b, aLog, dtBias *Tensor, n, h int) {
	be := cudaBackend{rt: cudaRT()}
	p := gdnPtrs{g: be.ptr(g), beta: be.ptr(beta), alpha: be.ptr(alpha), b: be.ptr(b), aLog: be.ptr(aLog), dtBias: be.ptr(dtBias)}
	be.launch1D("gdn_gates_fwd_f32", n*h, gdnGatesArgs("gdn_gates_fwd_f32", p, n, h)...)
}

// cudaGDNGatesBackward adds the gates' gradients into d (dalpha, db,
// daLog, ddtBias): per element first, leaving the per-head terms in a
// scratch of 2·n·h, then one thread a head sums them in row order.
func cudaGDNGatesBackward(d []*Tensor, dg, dbeta, alpha, b, aLog, dtBias *Tensor, n, h int) {
	be := cudaBackend{rt: cudaRT()}
	tdt, taLog := be.empty(Float32, n*h), be.empty(Float32, n*h)
	defer tdt.dbuf.free()
	defer taLog.dbuf.free()
	p := gdnPtrs{dalpha: be.ptr(d[0]), db: be.ptr(d[1]), daLog: be.ptr(d[2]), ddtBias: be.ptr(d[3]), tdt: be.ptr(tdt), taLog: be.ptr(taLog),
		dg: be.ptr(dg), dbeta: be.ptr(dbeta), alpha: be.ptr(alpha), b: be.ptr(b), aLog: be.ptr(aLog), dtBias: be.ptr(dtBias)}
	be.launch1D("gdn_gates_bwd_f32", n*h, gdnGatesArgs("gdn_gates_bwd_f32", p, n, h)...)
	be.launch1D("gdn_gates_sums_f32", h, gdnGatesArgs("gdn_gates_sums_f32", p, n, h)...)
}

// gdnPtrs are the device addresses the gated delta net's kernels take,
// by role (0 where a kernel does not take it).
type gdnPtrs struct {
	// the gates
	g, beta, alpha, b, aLog, dtBias, dalpha, db, daLog, ddtBias, dg, dbeta, tdt, taLog uintptr
	// the delta rule (g, beta, dg, dbeta above)
	out, saved, state, q, k, v, dout, dq, dk, dv, states, dS, dS1, us, dds uintptr
	// decoding: the runs' token offsets; x and w of the convolution
	starts, x, w uintptr
}

// gdnGatesArgs are the gate kernels' arguments in their parameter order
// (TestGDNArgsMatchPTX) over n rows of h heads.
func gdnGatesArgs(kernel string, p gdnPtrs, n, h int) []any {
	switch kernel {
	case "gdn_gates_fwd_f32":
		return []any{p.g, p.beta, p.alpha, p.b, p.aLog, p.dtBias, int64(n * h), int32(h)}
	case "gdn_gates_bwd_f32":
		return []any{p.dalpha, p.db, p.tdt, p.taLog, p.dg, p.dbeta, p.alpha, p.b, p.aLog, p.dtBias, int64(n * h), int32(h)}
	case "gdn_gates_sums_f32":
		return []any{p.daLog, p.ddtBias, p.taLog, p.tdt, int64(n), int32(h)}
	}
	panic("tensor: no gate kernel " + kernel)
}

// gdnDeltaArgs are the delta rule's kernels' arguments in their parameter
// order (TestGDNArgsMatchPTX), for shape s and, in the backward, chunk ci.
func gdnDeltaArgs(kernel string, p gdnPtrs, s cpu.DeltaRuleShape, ci int) []any {
	cols := int64(s.B * s.Heads * s.DV)
	T, H, DK, DV, sc, c := int32(s.T), int32(s.Heads), int32(s.DK), int32(s.DV), float32(s.Scale), int32(s.Chunk)
	switch kernel {
	case "gdn_delta_fwd_f32":
		return []any{p.out, p.saved, p.state, p.q, p.k, p.v, p.g, p.beta, cols, T, H, DK, DV, sc, c}
	case "gdn_delta_states_f32":
		return []any{p.states, p.saved, p.k, p.v, p.g, p.beta, cols, T, H, DK, DV, c, int32(ci)}
	case "gdn_delta_sweep_f32":
		return []any{p.dS, p.dS1, p.us, p.dds, p.dv, p.states, p.q, p.k, p.v, p.g, p.beta, p.dout, cols, T, H, DK, DV, sc, c, int32(ci)}
	case "gdn_delta_rowsums_f32":
		return []any{p.dq, p.dk, p.states, p.dS1, p.us, p.dds, p.q, p.k, p.v, p.g, p.beta, p.dout, int64(s.B * s.Heads * s.Chunk * s.DK),
			T, H, DK, DV, sc, c, int32(ci)}
	case "gdn_delta_stepsums_f32":
		return []any{p.dg, p.dbeta, p.states, p.dS1, p.us, p.dds, p.k, p.v, p.g, p.beta, int64(s.B * s.Heads * s.Chunk), T, H, DK, DV, c, int32(ci)}
	}
	panic("tensor: no delta-rule kernel " + kernel)
}

// gdnDeltaWork is how many work items kernel's launch covers.
func gdnDeltaWork(kernel string, s cpu.DeltaRuleShape) int {
	switch kernel {
	case "gdn_delta_rowsums_f32":
		return s.B * s.Heads * s.Chunk * s.DK
	case "gdn_delta_stepsums_f32":
		return s.B * s.Heads * s.Chunk
	}
	return s.B * s.Heads * s.DV
}

// gdnHeadsArgs are gdn_repeat_heads_f32's and gdn_fold_heads_f32's
// arguments (TestGDNArgsMatchPTX): the destination, the source, the
// destination's elements, the key heads, the value heads and the head
// width.
func gdnHeadsArgs(dst, src uintptr, n, kh, heads, d int) []any {
	return []any{dst, src, int64(n), int32(kh), int32(heads), int32(d)}
}

// cudaRepeatHeads returns x (rows, kh, d) with its heads repeated to
// (rows, heads, d) (x itself when kh == heads).
func cudaRepeatHeads(x *Tensor, rows, kh, heads, d int) *Tensor {
	if kh == heads {
		return x
	}
	be := cudaBackend{rt: cudaRT()}
	out := be.empty(Float32, rows, heads, d)
	n := rows * heads * d
	be.launch1D("gdn_repeat_heads_f32", n, gdnHeadsArgs(be.ptr(out), be.ptr(x), n, kh, heads, d)...)
	return out
}

// cudaFoldHeads adds the repeated heads' gradients dr (rows, heads, d)
// into dx (rows, kh, d), in head order.
func cudaFoldHeads(dx, dr *Tensor, rows, kh, heads, d int) {
	be := cudaBackend{rt: cudaRT()}
	n := rows * kh * d
	be.launch1D("gdn_fold_heads_f32", n, gdnHeadsArgs(be.ptr(dx), be.ptr(dr), n, kh, heads, d)...)
}

// cudaDeltaRuleForward runs the recurrence of s over q, k (repeated to
// s.Heads), v, g and beta into out, and returns the states saved every
// s.Chunk steps for the backward (on the GPU, the CPU's layout).
func cudaDeltaRuleForward(out, q, k, v, g, beta *Tensor, s cpu.DeltaRuleShape) *Tensor {
	be := cudaBackend{rt: cudaRT()}
	saved := be.empty(Float32, s.SavedStates())
	state := be.empty(Float32, s.B*s.Heads*s.DK*s.DV)
	defer state.dbuf.free()
	p := gdnPtrs{out: be.ptr(out), saved: be.ptr(saved), state: be.ptr(state), q: be.ptr(q), k: be.ptr(k), v: be.ptr(v), g: be.ptr(g), beta: be.ptr(beta)}
	const kernel = "gdn_delta_fwd_f32"
	be.launch1D(kernel, gdnDeltaWork(kernel, s), gdnDeltaArgs(kernel, p, s, 0)...)
	return saved
}

// cudaDeltaRuleBackward adds the gradients of dout into dq, dk (repeated
// to s.Heads), dv, dg and dbeta: chunk by chunk from the last, the chunk's
// states recomputed from the saved one, the columns' reverse sweep, then
// the sums across columns (gdn.cu). Its scratch is (2·Chunk+2)·dk·dv +
// 2·Chunk·dv floats per sequence and head.
func cudaDeltaRuleBackward(dq, dk, dv, dg, dbeta, dout, saved, q, k, v, g, beta *Tensor, s cpu.DeltaRuleShape) {
	be := cudaBackend{rt: cudaRT()}
	n, sz, c := s.B*s.Heads, s.DK*s.DV, s.Chunk
	states, dS1 := be.empty(Float32, n*(c+1)*sz), be.empty(Float32, n*c*sz)
	dS := be.alloc(Float32, n*sz) // zero before the last chunk
	us, dds := be.empty(Float32, n*c*s.DV), be.empty(Float32, n*c*s.DV)
	for _, t := range []*Tensor{states, dS1, dS, us, dds} {
		defer t.dbuf.free()
	}
	p := gdnPtrs{dq: be.ptr(dq), dk: be.ptr(dk), dv: be.ptr(dv), dg: be.ptr(dg), dbeta: be.ptr(dbeta), dout: be.ptr(dout), saved: be.ptr(saved),
		q: be.ptr(q), k: be.ptr(k), v: be.ptr(v), g: be.ptr(g), beta: be.ptr(beta),
		states: be.ptr(states), dS: be.ptr(dS), dS1: be.ptr(dS1), us: be.ptr(us), dds: be.ptr(dds)}
	for ci := (s.T+c-1)/c - 1; ci >= 0; ci-- {
		for _, kernel := range gdnDeltaBackwardKernels {
			be.launch1D(kernel, gdnDeltaWork(kernel, s), gdnDeltaArgs(kernel, p, s, ci)...)
		}
	}
}

// gdnDeltaBackwardKernels are the backward's kernels for one chunk, in
// launch order.
var gdnDeltaBackwardKernels = []string{"gdn_delta_states_f32", "gdn_delta_sweep_f32", "gdn_delta_rowsums_f32", "gdn_delta_stepsums_f32"}

// cudaRuns uploads the runs' token offsets (len(runs)+1, int32) and their
// states packed run after run, size floats each.
func cudaRuns(runs []RecurrentRun, size int) (starts, states *Tensor) {
	off := make([]int32, len(runs)+1)
	packed := make([]float32, 0, len(runs)*size)
	for i, r := range runs {
		if r.Dev != nil { // some runs' states on the GPU, others in host memory
			r.State = ToHost(r.Dev).f32s()
		}
		off[i+1] = off[i] + int32(r.Tokens)
		packed = append(packed, r.State...)
	}
	if len(packed) == 0 { // a width-1 convolution keeps no inputs
		packed = make([]float32, 1)
	}
	return toCUDA(FromInt32(off, len(off)), "gated delta net decoding: run offsets"),
		toCUDA(FromFloat32(packed, len(packed)), "gated delta net decoding: states in")
}

// cudaRunPtrs uploads the runs' token offsets (len(runs)+1, int32) and
// their device states' addresses (one uint64 a run): the in-place kernels'
// arguments, two small copies instead of the states.
func cudaRunPtrs(runs []RecurrentRun) (starts, ptrs *Tensor) {
	off := make([]int32, len(runs)+1)
	addr := New(Int64, len(runs))
	for i, r := range runs {
		off[i+1] = off[i] + int32(r.Tokens)
		addr.i64[i] = int64(devPtr(r.Dev))
	}
	return toCUDA(FromInt32(off, len(off)), "gated delta net decoding: run offsets"), toCUDA(addr, "gated delta net decoding: state addresses")
}

// cudaRunsBack copies the advanced states back into the runs' host
// slices.
func cudaRunsBack(runs []RecurrentRun, states *Tensor, size int) {
	h := New(Float32, states.Numel())
	copyFromCUDA(h, states, "gated delta net decoding: states out")
	v := h.f32s()
	for i, r := range runs {
		if r.Dev != nil {
			Copy(r.Dev, FromFloat32(v[i*size:(i+1)*size], size))
			continue
		}
		copy(r.State, v[i*size:(i+1)*size])
	}
}

// gdnRunsArgs are the decoding kernels' arguments in their parameter order
// (TestGDNArgsMatchPTX): runs runs of c channels (the convolution, kernel
// width k) or of heads heads (the rule).
func gdnRunsArgs(kernel string, p gdnPtrs, runs, c, k, heads, dk, dv int, scale float64) []any {
	switch kernel {
	case "gdn_conv_runs_f32", "gdn_conv_runs_ptr_f32":
		return []any{p.out, p.state, p.x, p.w, p.starts, int64(runs * c), int32(c), int32(k)}
	case "gdn_delta_runs_f32", "gdn_delta_runs_ptr_f32":
		return []any{p.out, p.state, p.q, p.k, p.v, p.g, p.beta, p.starts, int64(runs * heads * dv), int32(heads), int32(dk), int32(dv), float32(scale)}
	}
	panic("tensor: no decoding kernel " + kernel)
}

// cudaCausalConvSiLURuns is CausalConvSiLURuns on the GPU: x (n, c) and
// out dense, w (c, k); the runs' states go up and come back (host memory,
// RecurrentRun's contract): two copies of runs·(k-1)·c floats a call.
func cudaCausalConvSiLURuns(out, x, w *Tensor, runs []RecurrentRun, c, k int) {
	be := cudaBackend{rt: cudaRT()}
	if devRuns(runs) {
		starts, ptrs := cudaRunPtrs(runs)
		defer starts.dbuf.free()
		defer ptrs.dbuf.free()
		p := gdnPtrs{out: be.ptr(out), state: be.ptr(ptrs), x: be.ptr(x), w: be.ptr(w), starts: be.ptr(starts)}
		be.launch1D("gdn_conv_runs_ptr_f32", len(runs)*c, gdnRunsArgs("gdn_conv_runs_ptr_f32", p, len(runs), c, k, 0, 0, 0, 0)...)
		return
	}
	size := (k - 1) * c
	starts, states := cudaRuns(runs, size)
	defer starts.dbuf.free()
	defer states.dbuf.free()
	p := gdnPtrs{out: be.ptr(out), state: be.ptr(states), x: be.ptr(x), w: be.ptr(w), starts: be.ptr(starts)}
	be.launch1D("gdn_conv_runs_f32", len(runs)*c, gdnRunsArgs("gdn_conv_runs_f32", p, len(runs), c, k, 0, 0, 0, 0)...)
	if size > 0 {
		cudaRunsBack(runs, states, size)
	}
}

// cudaGatedDeltaRuleRuns is GatedDeltaRuleRuns on the GPU (q, k repeated
// to heads): the runs' states (heads·dk·dv floats each) go up and come
// back.
func cudaGatedDeltaRuleRuns(out, q, k, v, g, beta *Tensor, runs []RecurrentRun, heads, dk, dv int, scale float64) {
	be := cudaBackend{rt: cudaRT()}
	if devRuns(runs) {
		starts, ptrs := cudaRunPtrs(runs)
		defer starts.dbuf.free()
		defer ptrs.dbuf.free()
		p := gdnPtrs{out: be.ptr(out), state: be.ptr(ptrs), q: be.ptr(q), k: be.ptr(k), v: be.ptr(v), g: be.ptr(g), beta: be.ptr(beta), starts: be.ptr(starts)}
		be.launch1D("gdn_delta_runs_ptr_f32", len(runs)*heads*dv, gdnRunsArgs("gdn_delta_runs_ptr_f32", p, len(runs), 0, 0, heads, dk, dv, scale)...)
		return
	}
	size := heads * dk * dv
	starts, states := cudaRuns(runs, size)
	defer starts.dbuf.free()
	defer states.dbuf.free()
	p := gdnPtrs{out: be.ptr(out), state: be.ptr(states), q: be.ptr(q), k: be.ptr(k), v: be.ptr(v), g: be.ptr(g), beta: be.ptr(beta), starts: be.ptr(starts)}
	be.launch1D("gdn_delta_runs_f32", len(runs)*heads*dv, gdnRunsArgs("gdn_delta_runs_f32", p, len(runs), 0, 0, heads, dk, dv, scale)...)
	cudaRunsBack(runs, states, size)
}
