package tensor

import (
	"fmt"

	"github.com/gotron/gotron/internal/cpu"
)

// Mixture-of-Experts ops: the router (Route), the token permutation
// (Embedding gathers the rows; IndexAddRows sums them back), the per-row
// probability scale (ScaleRows) and the experts' grouped GEMM
// (GroupedLinear).
//
// The router's selection is discrete and small (tokens × experts): Route
// reads the logits back to the host, routes there (internal/cpu's
// TopKRouter) and copies the probabilities to the logits' device, as
// Megatron's dispatchers read the token counts back to the host for the
// split sizes. On the CPU the copies are no-ops. On the GPU with
// SetCUDARouter, the configurations moe.cu covers route and permute on the
// device and only the experts' token counts (and the losses' statistics)
// come back (cuda_backend_router.go).

// RouterConfig is one MoE router (Megatron's TopKRouter settings).
type RouterConfig = cpu.RouterConfig

// ScoreFunction is --moe-router-score-function.
type ScoreFunction = cpu.ScoreFunction

// LoadBalancing is one --moe-router-load-balancing-type and its coefficient.
type LoadBalancing = cpu.LoadBalancing

// The score functions.
const (
	ScoreSoftmax      = cpu.ScoreSoftmax
	ScoreSigmoid      = cpu.ScoreSigmoid
	ScoreSqrtSoftplus = cpu.ScoreSqrtSoftplus
)

// Capacity is Megatron's get_capacity: ceil(tokens/experts·factor).
func Capacity(tokens, experts int, factor float64) int { return cpu.Capacity(tokens, experts, factor) }

// UpdateExpertBias is Megatron's expert-bias update on counts summed over
// the data-parallel ranks: b_i += rate·sign(mean(c) − c_i), in float32.
func UpdateExpertBias(bias []float32, counts []float64, rate float64) {
	cpu.UpdateExpertBias(bias, counts, rate)
}

// Routing is the result of Route: which tokens go to which experts.
type Routing struct {
	cfg *RouterConfig
	res *cpu.RouteResult
	// AuxScale is the gradient each attached loss receives in backward
	// (MoEAuxLossAutoScaler's main_loss_backward_scale); it may be changed
	// until Backward runs.
	AuxScale float64
	// routed on the GPU (cuda_backend_router.go): the chosen experts
	// (T, k), read back only if the host asks for the map, and the
	// permutation's rows and probability indices (T·k int32)
	sel, rows, flat *Tensor
}

// Map reports whether token t is routed to expert e (after dropping).
func (r *Routing) Map(t, e int) bool { return r.hostMap()[t*r.cfg.Experts+e] }

// hostMap is the routing map (T, E), read back from the device's chosen
// experts on first use when the GPU routed (a copy Permutation and Map
// cost there; PermutationOn does not).
func (r *Routing) hostMap() []bool {
	if r.res.Map == nil && r.sel != nil {
		if err := r.res.SetSelection(r.cfg, r.sel.Dim(0), ToHost(r.sel).i32s()); err != nil {
			panic("tensor: CUDA MoE router: " + err.Error())
		}
	}
	return r.res.Map
}

// TokensPerExpert is the number of tokens routed to each expert.
func (r *Routing) TokensPerExpert() []float64 { return r.res.TokensPerExpert }

// Aux returns the load-balancing losses (one per RouterConfig.Balancing
// entry, coefficients included) and the z-loss (coefficient included).
func (r *Routing) Aux() ([]float64, float64) { return r.res.Aux, r.res.Z }

// AuxCounts returns the per-expert counts of the aux-loss map (the top-k of
// the all-expert scores).
func (r *Routing) AuxCounts() []float64 { return r.res.AuxCounts(r.cfg) }

// SetGlobalCounts sets Balancing entry i (a global_aux_loss, or an
// aux_loss) to use the counts (the running mean, or the sum over the ranks
// sharing the sequences) over tTot tokens, before Backward.
func (r *Routing) SetGlobalCounts(i int, mean []float64, tTot float64) {
	r.res.SetGlobalCounts(r.cfg, i, mean, tTot)
}

// SeqAuxCounts returns the aux-loss map's counts per sequence and expert
// (Batch, E), for seq_aux_loss.
func (r *Routing) SeqAuxCounts() []float64 { return r.res.SeqAuxCounts(r.cfg) }

// SetSeqCounts sets Balancing entry i (a seq_aux_loss) to use counts
// (Batch, E) of sequences of seqLen tokens (summed over the ranks holding
// the sequences' other tokens), before Backward.
func (r *Routing) SetSeqCounts(i int, counts []float64, seqLen int) {
	r.res.SetSeqCounts(r.cfg, i, counts, seqLen)
}

// Permutation returns the rows of the permuted tokens, expert-major and
// ascending within an expert (Megatron's permute), the flat index t·E+e of
// each one's probability, and the number of rows of each expert.
func (r *Routing) Permutation() (rows, flat []int32, counts []int) {
	E := r.cfg.Experts
	m := r.hostMap()
	T := len(m) / E
	counts = make([]int, E)
	for e := range E {
		for t := range T {
			if m[t*E+e] {
				rows = append(rows, int32(t))
				flat = append(flat, int32(t*E+e))
				counts[e]++
			}
		}
	}
	return rows, flat, counts
}

// PermutationOn is Permutation with rows and flat as int32 tensors on dev
// (the gathers' indices): built on the GPU when it routed (no copy: the
// counts came back with the routing), else uploaded from the host's.
func (r *Routing) PermutationOn(dev Device) (rows, flat *Tensor, counts []int) {
	if r.rows != nil && dev == CUDA {
		counts = make([]int, r.cfg.Experts)
		for e, n := range r.res.TokensPerExpert {
			counts[e] = int(n)
		}
		return r.rows, r.flat, counts
	}
	hr, hf, counts := r.Permutation()
	return FromInt32(hr, len(hr)).ToDevice(dev), FromInt32(hf, len(hf)).ToDevice(dev), counts
}

type routeFn struct {
	r    *Routing
	dev  Device
	T, E int
	// logits and sel (T, k int32, the chosen experts) on the GPU when the
	// device routed (cuda_backend_router.go)
	logits, sel *Tensor
}

func (f *routeFn) Forward(tp *Tape, in []*Tensor) []*Tensor {
	if f.dev == CUDA && cudaRoutable(f.r.cfg, f.T) {
		return []*Tensor{f.routeCUDA(in[0])}
	}
	logits := ToHost(in[0].Contiguous())
	f.r.res = cpu.Route(f.r.cfg, logits.f32s())
	return []*Tensor{FromFloat32(f.r.res.Probs, f.T, f.E).ToDevice(f.dev)}
}

func (f *routeFn) Backward(tp *Tape, g []*Tensor) []*Tensor {
	if f.sel != nil {
		return []*Tensor{f.backwardCUDA(g[0])}
	}
	dp := ToHost(g[0].Contiguous())
	dl := make([]float32, f.T*f.E)
	cpu.RouteBackward(f.r.cfg, f.r.res, dp.f32s(), f.r.AuxScale, dl)
	return []*Tensor{FromFloat32(dl, f.T, f.E).ToDevice(f.dev)}
}

// Route routes the tokens of logits (T, E): it returns the probabilities
// (T, E), zero outside each token's routed experts, and the routing. In
// backward the logits receive the probabilities' gradient and, when
// cfg.Losses, routing.AuxScale times the gradients of the losses.
func (tp *Tape) Route(logits *Tensor, cfg *RouterConfig) (*Tensor, *Routing) {
	if logits.Dim(-1) != cfg.Experts || len(logits.shape) != 2 {
		panic(fmt.Sprintf("tensor: Route logits %v with %d experts: want (tokens, experts)", logits.shape, cfg.Experts))
	}
	if err := cfg.Validate(); err != nil {
		panic("tensor: Route: " + err.Error())
	}
	r := &Routing{cfg: cfg}
	f := &routeFn{r: r, dev: logits.dev, T: logits.Dim(0), E: cfg.Experts}
	return tp.Apply(f, logits)[0], r
}

type gatedRoute64 struct {
	r       *Routing
	x, w    []float32
	T, E, H int
	dev     Device
}

func (f *gatedRoute64) Forward(tp *Tape, in []*Tensor) []*Tensor {
	f.x, f.w = ToHost(in[0].Contiguous()).f32s(), ToHost(in[1].Contiguous()).f32s()
	logits := make([]float64, f.T*f.E)
	cpu.Parallel(f.T, 16, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			xr := f.x[t*f.H : (t+1)*f.H]
			for e := range f.E {
				wr := f.w[e*f.H : (e+1)*f.H]
				var s float64
				for j, v := range xr {
					s += float64(v) * float64(wr[j])
				}
				logits[t*f.E+e] = s
			}
		}
	})
	f.r.res = cpu.Route64(f.r.cfg, logits)
	return []*Tensor{FromFloat32(f.r.res.Probs, f.T, f.E).ToDevice(f.dev)}
}

func (f *gatedRoute64) Backward(tp *Tape, g []*Tensor) []*Tensor {
	dp := ToHost(g[0].Contiguous())
	dl := make([]float64, f.T*f.E)
	cpu.RouteBackward64(f.r.cfg, f.r.res, dp.f32s(), f.r.AuxScale, dl)
	// RouterGatingLinearFunction's fp64 backward: dx = dl·W, dW = dlᵀ·x in
	// float64, cast to the inputs' float32.
	dx := make([]float32, f.T*f.H)
	cpu.Parallel(f.T, 16, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			for j := range f.H {
				var s float64
				for e := range f.E {
					s += dl[t*f.E+e] * float64(f.w[e*f.H+j])
				}
				dx[t*f.H+j] = float32(s)
			}
		}
	})
	dw := make([]float32, f.E*f.H)
	cpu.Parallel(f.E*f.H, 64, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			e, j := i/f.H, i%f.H
			var s float64
			for t := range f.T {
				s += dl[t*f.E+e] * float64(f.x[t*f.H+j])
			}
			dw[i] = float32(s)
		}
	})
	return []*Tensor{FromFloat32(dx, f.T, f.H).ToDevice(f.dev), FromFloat32(dw, f.E, f.H).ToDevice(f.dev)}
}

// RouteFP64 is the router's gating and routing with float64 logits
// (Megatron's --moe-router-dtype fp64: x·Wᵀ of the float32 x (T, h) and
// W (E, h) in float64, the routing on those, the gating's backward in
// float64), computed on the host. The probabilities are float32.
func (tp *Tape) RouteFP64(x, w *Tensor, cfg *RouterConfig) (*Tensor, *Routing) {
	if len(x.shape) != 2 || len(w.shape) != 2 || w.Dim(0) != cfg.Experts || w.Dim(1) != x.Dim(1) {
		panic(fmt.Sprintf("tensor: RouteFP64 x %v w %v with %d experts: want (tokens, h) and (experts, h)", x.shape, w.shape, cfg.Experts))
	}
	if err := cfg.Validate(); err != nil {
		panic("tensor: RouteFP64: " + err.Error())
	}
	r := &Routing{cfg: cfg}
	f := &gatedRoute64{r: r, T: x.Dim(0), E: cfg.Experts, H: x.Dim(1), dev: x.dev}
	return tp.Apply(f, x, w)[0], r
}

// IndexAddRows returns out (n, h) with out[idx[i]] += src[i] (src (m, h),
// idx int32 (m)): the un-permutation that sums each token's expert outputs.
// Its backward gathers the rows.
func (tp *Tape) IndexAddRows(n int, idx, src *Tensor) *Tensor {
	src = tp.Contiguous(src)
	idx = idx.Contiguous()
	if len(src.shape) != 2 || idx.Numel() != src.Dim(0) {
		panic(fmt.Sprintf("tensor: IndexAddRows src %v idx %v: want (m, h) and (m)", src.shape, idx.shape))
	}
	out := tp.zeros(src.dev, n, src.Dim(1))
	be := backendFor(src, idx)
	be.EmbeddingBackward(out, src, idx)
	if tp.recording(src) {
		tp.record("index_add_rows", func(tp *Tape) {
			if ds := tp.gradFor(src); ds != nil {
				tmp := tp.empty(src.dev, src.shape...)
				be.EmbeddingForward(tmp, tp.grad(out), idx)
				be.Axpy(ds, 1, tmp)
			}
		}, out)
	}
	return out
}

// ScaleRows returns x (n, f) with row r multiplied by p[r] (p (n, 1) or
// (n)): the probabilities' product with an expert's activation.
func (tp *Tape) ScaleRows(x, p *Tensor) *Tensor {
	x = tp.Contiguous(x)
	p = tp.Contiguous(p)
	n, f := x.Dim(0), x.Dim(-1)
	if len(x.shape) != 2 || p.Numel() != n {
		panic(fmt.Sprintf("tensor: ScaleRows x %v p %v: want (n, f) and (n)", x.shape, p.shape))
	}
	be := backendFor(x, p)
	pv := p.view([]int{n}, []int{1}, p.offset)
	pe := tp.zeros(x.dev, n, f)
	be.AddRowBroadcast(pe, pv)
	out := tp.empty(x.dev, n, f)
	be.Mul(out, x, pe)
	if tp.recording(x, p) {
		tp.record("scale_rows", func(tp *Tape) {
			g := tp.grad(out)
			if dx := tp.gradFor(x); dx != nil {
				tmp := tp.empty(x.dev, n, f)
				be.Mul(tmp, g, pe)
				be.Axpy(dx, 1, tmp)
			}
			if dp := tp.gradFor(p); dp != nil {
				tmp := tp.empty(x.dev, n, f)
				be.Mul(tmp, g, x)
				s := tp.empty(x.dev, n)
				be.RowSum(s, tmp)
				be.Axpy(dp.view([]int{n}, []int{1}, dp.offset), 1, s)
			}
		}, out)
	}
	return out
}

// groupedGemmer is a backend with a grouped GEMM kernel (the CPU's, the
// simulated device's, which embeds it, and the GPU's cuBLAS call); others
// run GroupedLinear as a loop of Gemm calls. groupedGemm computes c_i +=
// op(a_i)·op(b_i) for every i and reports true, or does nothing and
// reports false when it cannot take these products (the GPU's without
// cublasGemmGroupedBatchedEx, with --bf16, or not turned on): the caller
// then runs the loop.
type groupedGemmer interface {
	groupedGemm(prec MatmulPrecision, tA, tB Transpose, a []*Tensor, b []*Tensor, c []*Tensor) bool
}

func (cpuBackend) groupedGemm(prec MatmulPrecision, tA, tB Transpose, a, b, c []*Tensor) bool {
	hostGroupedGemm(prec, tA, tB, a, b, c)
	return true
}

// hostGroupedGemm is c_i += op(a_i)·op(b_i) for every i in one
// cpu.GroupedSgemm call.
func hostGroupedGemm(prec MatmulPrecision, tA, tB Transpose, a, b, c []*Tensor) {
	gs := make([]cpu.GemmGroup, 0, len(c))
	for i := range c {
		m, n := c[i].Dim(0), c[i].Dim(1)
		k := a[i].Dim(1)
		if tA == Trans {
			k = a[i].Dim(0)
		}
		if m == 0 || n == 0 {
			continue
		}
		av, bv := f(a[i]), f(b[i])
		if prec == MatmulFP16 {
			av, bv = roundFP16(av), roundFP16(bv)
		}
		gs = append(gs, cpu.GemmGroup{M: m, N: n, K: k, A: av, Lda: a[i].Dim(1), B: bv, Ldb: b[i].Dim(1), C: f(c[i]), Ldc: n})
	}
	cpu.GroupedSgemm(prec == MatmulBF16, tA, tB, 1, 1, gs)
}

// rowBlock is rows [lo, lo+n) of the contiguous 2-D t.
func rowBlock(t *Tensor, lo, n int) *Tensor {
	c := t.Dim(1)
	return t.view([]int{n, c}, []int{c, 1}, t.offset+lo*c)
}

// GroupedLinear computes y_l = x_l·w_lᵀ for consecutive row groups x_l of x
// (N, in) with counts[l] rows each and weights w_l (out, in): the experts'
// fc1 or fc2 (Megatron's TEGroupedMLP). With grouped, all groups run in one
// grouped-GEMM call (forward and each backward product); otherwise as a
// loop of Linear calls, one per expert (SequentialMLP): the same products.
func (tp *Tape) GroupedLinear(x *Tensor, ws []*Tensor, counts []int, grouped bool) *Tensor {
	if len(ws) != len(counts) || len(ws) == 0 {
		panic(fmt.Sprintf("tensor: GroupedLinear with %d weights and %d counts", len(ws), len(counts)))
	}
	total := 0
	for _, c := range counts {
		total += c
	}
	in, out := ws[0].Dim(1), ws[0].Dim(0)
	if len(x.shape) != 2 || x.Dim(0) != total || x.Dim(1) != in {
		panic(fmt.Sprintf("tensor: GroupedLinear x %v with %d rows in groups and weights (%d, %d)", x.shape, total, out, in))
	}
	if !grouped {
		var ys []*Tensor
		lo := 0
		for l, w := range ws {
			if counts[l] > 0 {
				ys = append(ys, tp.Linear(tp.Narrow(x, 0, lo, counts[l]), w, nil))
			}
			lo += counts[l]
		}
		if len(ys) == 0 {
			return tp.zeros(x.dev, 0, out)
		}
		if len(ys) == 1 {
			return ys[0]
		}
		return tp.Concat(0, ys...)
	}
	x = tp.Contiguous(x)
	y := tp.zeros(x.dev, total, out)
	prec := tp.MatmulPrecision()
	be := backendFor(append([]*Tensor{x}, ws...)...)
	rows := func(t *Tensor) []*Tensor {
		bs := make([]*Tensor, len(counts))
		lo := 0
		for l, c := range counts {
			bs[l] = rowBlock(t, lo, c)
			lo += c
		}
		return bs
	}
	run := func(tA, tB Transpose, a, b, c []*Tensor) {
		if gg, ok := be.(groupedGemmer); ok && gg.groupedGemm(prec, tA, tB, a, b, c) {
			return
		}
		for i := range c {
			if c[i].Numel() > 0 && a[i].Numel() > 0 {
				gemm(be, prec, tA, tB, 1, a[i], b[i], 1, c[i])
			}
		}
	}
	xs := rows(x)
	run(NoTrans, Trans, xs, ws, rows(y))
	if tp.recording(append([]*Tensor{x}, ws...)...) {
		tp.record("grouped_linear", func(tp *Tape) {
			gs := rows(tp.grad(y))
			if dx := tp.gradFor(x); dx != nil {
				run(NoTrans, NoTrans, gs, ws, rows(dx))
			}
			var a, b, c []*Tensor
			for l, w := range ws {
				if dw := tp.gradFor(w); dw != nil && counts[l] > 0 {
					a, b, c = append(a, gs[l]), append(b, xs[l]), append(c, dw)
				}
			}
			if len(c) > 0 {
				run(Trans, NoTrans, a, b, c)
			}
		}, y)
	}
	return y
}

// Recording reports whether tp records for backward: false for a nil or
// no-grad tape and for the first, discarded pass of a checkpointed block
// (whose recomputation records). MoE routers count tokens and losses only
// then, as Megatron's under torch.is_grad_enabled(), so that each
// micro-batch counts once.
func (tp *Tape) Recording() bool { return tp.recordingParams() }
