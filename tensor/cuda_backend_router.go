package tensor

import (
	"fmt"
	"math"
	"runtime"
	"sync/atomic"

	"github.com/gotron/gotron/internal/cpu"
)

// The MoE router on the GPU (moe.cu): Route's selection, probabilities,
// load-balancing statistics, z-loss and backward as device kernels, bit for
// bit internal/cpu's router (the same float64 operations in the same order,
// e^x by cpu.RouterExp's operations, the z-loss's log by cpu.RouterLog's,
// no fused multiply-adds, ties lowest index first), and the permutation of
// the routed tokens (Megatron's permute, as Routing.Permutation) built
// there too: the host reads back, in one copy, only the experts' token
// counts (E int32, the grouped products' split sizes) and with losses each
// sequence's aux-loss counts and score sums and the z-loss's sum, where the
// host router read back the logits (tokens × experts float32) and the
// dispatcher uploaded the permutation's rows and probability indices. Built
// but not yet run on a GPU, so used only while SetCUDARouter is on.

// cudaRouter selects the device router (SetCUDARouter).
var cudaRouter atomic.Bool

// SetCUDARouter turns on (or off) the CUDA backend's MoE router kernels,
// and returns the previous setting. Off by default: OpenCUDA turns it on
// when GOTRON_CUDA_UNVERIFIED is 1 or names moe-router (CUDAUnverified);
// off, or for a configuration the kernels do not cover
// (cudaRoutable), Route reads the logits back and routes on the host.
func SetCUDARouter(on bool) bool { return cudaRouter.Swap(on) }

// moeRouterMaxGroups is the most expert groups the kernel's group-limited
// top-k takes (a bit mask of the chosen groups).
const moeRouterMaxGroups = 64

// cudaRoutable reports whether moe.cu routes c over T tokens: softmax
// (after or before the top-k) or sigmoid scores, with or without the
// expert bias, group limits, scaling, the load-balancing losses (their
// statistics on the device: the aux-loss map and each sequence's score
// sums) and the z-loss (its sum over the tokens); not the square-root
// softplus score or capacity dropping (a sort of each expert's tokens),
// which route on the host.
func cudaRoutable(c *RouterConfig, T int) bool {
	losses := !c.Losses || (c.Batch > 0 && c.SeqLen > 0 && c.Batch*c.SeqLen == T)
	// the permutation's probability indices t·E + e are int32
	return cudaRouter.Load() && c.Score != ScoreSqrtSoftplus && c.CapacityFactor <= 0 && losses &&
		(c.GroupTopK <= 0 || c.NumGroups <= moeRouterMaxGroups) && c.Experts <= math.MaxInt32/2 && T <= math.MaxInt32/c.Experts
}

// moePermChunk is the tokens a thread of moe.cu's permutation kernels
// takes (any chunk gives the same permutation).
const moePermChunk = 128

// routeCUDA runs moe_route_fwd_f32 on logits (T, E) on the GPU (and, with
// losses, moe_route_aux_f32, moe_route_aux_sums_f64 and the aux-loss map's
// counts per sequence, with the z-loss moe_route_z_f64 and
// moe_route_zsum_f64), builds the permutation of the routed tokens there
// (moe_perm_*: the rows and probability indices stay on the device, f.r's
// PermutationOn), reads the experts' token counts (and the losses'
// statistics: score sums, z-loss sum, aux-loss counts per sequence) back
// into f's routing in one copy, and keeps what backwardCUDA needs on the
// device; it returns the probabilities (T, E), on the device.
func (f *routeFn) routeCUDA(logits *Tensor) *Tensor {
	be := cudaBackend{rt: cudaRT()}
	c := f.r.cfg
	T, E, k, B := f.T, f.E, c.TopK, c.Batch
	groups := 0
	if c.GroupTopK > 0 {
		groups = c.NumGroups
	}
	logits = logits.Contiguous()
	probs := be.empty(Float32, T, E)
	// the read-back (int32 words): with losses the sums (Batch·E float64)
	// and the z-loss's sum (one float64) first, 8-byte aligned; the token
	// counts (E); with losses the aux-loss map's counts (Batch·E)
	lossWords, words := 0, E
	if c.Losses {
		lossWords = 2*B*E + 2
		words = lossWords + E + B*E
	}
	back := be.empty(Int32, words)
	sel := be.empty(Int32, T, k)
	scratch := be.empty(Float32, 2*T*(E+groups)) // float64 (T, E + groups)
	var bias *Tensor
	if c.ExpertBias != nil {
		bias = toCUDA(FromFloat32(c.ExpertBias, E), "the MoE router's expert bias")
	}
	be.launch1D("moe_route_fwd_f32", T, moeRouteFwdArgs(be.ptr(probs), be.ptr(sel), be.ptr(scratch), be.ptr(logits), be.ptr(bias), T, E, c)...)
	base := be.ptr(back)
	counts := base + uintptr(4*lossWords)
	nc := (T + moePermChunk - 1) / moePermChunk
	cnt, rows, flat := be.empty(Int32, nc*E), be.empty(Int32, T*k), be.empty(Int32, T*k)
	be.launch1D("moe_perm_count_i32", nc*E, moePermCountArgs(be.ptr(cnt), be.ptr(sel), T, E, k, moePermChunk)...)
	be.launch1D("moe_perm_scan_i32", E, moePermScanArgs(counts, be.ptr(cnt), nc, E)...)
	be.launch1D("moe_perm_rows_i32", nc*E, moePermRowsArgs(be.ptr(rows), be.ptr(flat), be.ptr(cnt), counts, be.ptr(sel), T, E, k, moePermChunk)...)
	runtime.KeepAlive(cnt)
	if c.Losses {
		q, auxSel := be.empty(Float32, 2*T*E), be.empty(Int32, T, k) // q float64 (T, E)
		be.launch1D("moe_route_aux_f32", T, moeRouteAuxArgs(be.ptr(auxSel), be.ptr(q), be.ptr(logits), T, E, c)...)
		be.launch1D("moe_route_aux_sums_f64", B*E, moeRouteAuxSumsArgs(base, be.ptr(q), c)...)
		be.launch1D("moe_perm_count_i32", B*E, moePermCountArgs(counts+uintptr(4*E), be.ptr(auxSel), T, E, k, c.SeqLen)...)
		runtime.KeepAlive(q)
		runtime.KeepAlive(auxSel)
		if c.ZLossCoeff != 0 {
			lse := be.empty(Float32, 2*T) // float64 (T)
			be.launch1D("moe_route_z_f64", T, moeRouteZArgs(be.ptr(lse), be.ptr(logits), T, E)...)
			be.launch1D("moe_route_zsum_f64", 1, moeRouteZSumArgs(base+uintptr(8*B*E), be.ptr(lse), T)...)
			runtime.KeepAlive(lse)
		}
	}
	host := ToHost(back).i32s()
	var seqAux []int32
	var sums []float64
	var zSum float64
	f64 := func(i int) float64 { // the float64 at word i
		return math.Float64frombits(uint64(uint32(host[i+1]))<<32 | uint64(uint32(host[i])))
	}
	if c.Losses {
		sums = make([]float64, B*E)
		for i := range sums {
			sums[i] = f64(2 * i)
		}
		zSum = f64(2 * B * E)
		seqAux = host[lossWords+E:]
	}
	res, err := cpu.RouteFromCounts(c, T, host[lossWords:lossWords+E], seqAux, sums, zSum)
	if err != nil {
		panic("tensor: CUDA MoE router: " + err.Error())
	}
	f.r.res, f.logits, f.sel = res, logits, sel
	f.r.sel, f.r.rows, f.r.flat = sel, rows, flat
	return probs
}

// backwardCUDA is moe_route_bwd_f32: the logits' gradient (T, E) for the
// probabilities' gradient dprobs and the losses' (the routing's AuxScale
// times the load-balancing losses' coefficients, uploaded: Batch·E
// float64; the z-loss's from its coefficient times the scale).
func (f *routeFn) backwardCUDA(dprobs *Tensor) *Tensor {
	be := cudaBackend{rt: cudaRT()}
	c := f.r.cfg
	T, E := f.T, f.E
	dprobs = dprobs.Contiguous()
	dl, scratch := be.empty(Float32, T, E), be.empty(Float32, 4*T*E) // float64 (T, 2E)
	var dsc *Tensor
	if d := f.r.res.LossGradients(c, f.r.AuxScale); d != nil {
		bits := make([]float32, 2*len(d))
		for i, v := range d {
			u := math.Float64bits(v)
			bits[2*i], bits[2*i+1] = math.Float32frombits(uint32(u)), math.Float32frombits(uint32(u>>32))
		}
		dsc = toCUDA(FromFloat32(bits, len(bits)), "the MoE router's loss gradients")
	}
	be.launch1D("moe_route_bwd_f32", T, moeRouteBwdArgs(be.ptr(dl), be.ptr(scratch), be.ptr(dprobs), be.ptr(f.logits), be.ptr(f.sel), be.ptr(dsc), T, E, c, f.r.AuxScale)...)
	runtime.KeepAlive(dsc)
	return dl
}

// moeRouteFwdArgs and moeRouteBwdArgs are moe.cu's kernels' arguments in
// their parameter order (TestMoERouterArgsMatchPTX checks them against the
// PTX without a GPU).
func moeRouteFwdArgs(probs, sel, scratch, logits, bias uintptr, T, E int, c *RouterConfig) []any {
	score, pre := moeRouterScore(c)
	groups, groupTopK := int32(0), int32(0)
	if c.GroupTopK > 0 {
		groups, groupTopK = int32(c.NumGroups), int32(c.GroupTopK)
	}
	return []any{probs, sel, scratch, logits, bias, int64(T), int32(E), int32(c.TopK), score, pre, groups, groupTopK, c.ScalingFactor}
}

// moeRouteBwdArgs: the losses' part runs as RouteBackward64's, when the
// losses are on and auxScale is not zero; the z-loss's factor is auxScale
// times its coefficient, rounded as the CPU's product.
func moeRouteBwdArgs(dlogits, scratch, dprobs, logits, sel, dsc uintptr, T, E int, c *RouterConfig, auxScale float64) []any {
	score, pre := moeRouterScore(c)
	seqLen := int64(max(c.SeqLen, 1))
	losses, zloss := int32(0), int32(0)
	if c.Losses && auxScale != 0 {
		losses = 1
		if c.ZLossCoeff != 0 {
			zloss = 1
		}
	}
	return []any{dlogits, scratch, dprobs, logits, sel, dsc, int64(T), seqLen, int32(E), int32(c.TopK), score, pre, c.ScalingFactor,
		losses, zloss, auxScale * c.ZLossCoeff}
}

func moeRouteZArgs(lse, logits uintptr, T, E int) []any {
	return []any{lse, logits, int64(T), int32(E)}
}

func moeRouteZSumArgs(z, lse uintptr, T int) []any { return []any{z, lse, int64(T)} }

func moePermCountArgs(cnt, sel uintptr, T, E, k, chunk int) []any {
	return []any{cnt, sel, int64(T), int32(E), int32(k), int64(chunk)}
}

func moePermScanArgs(counts, cnt uintptr, nc, E int) []any {
	return []any{counts, cnt, int64(nc), int32(E)}
}

func moePermRowsArgs(rows, flat, cnt, counts, sel uintptr, T, E, k, chunk int) []any {
	return []any{rows, flat, cnt, counts, sel, int64(T), int32(E), int32(k), int64(chunk)}
}

func moeRouteAuxArgs(auxSel, q, logits uintptr, T, E int, c *RouterConfig) []any {
	score, _ := moeRouterScore(c)
	return []any{auxSel, q, logits, int64(T), int32(E), int32(c.TopK), score}
}

func moeRouteAuxSumsArgs(sums, q uintptr, c *RouterConfig) []any {
	return []any{sums, q, int64(c.Batch), int64(c.SeqLen), int32(c.Experts)}
}

// moeRouterScore is moe.cu's score (MOE_SOFTMAX 0, MOE_SIGMOID 1) and pre
// flag.
func moeRouterScore(c *RouterConfig) (score, pre int32) {
	switch c.Score {
	case ScoreSoftmax:
	case ScoreSigmoid:
		score = 1
	default:
		panic(fmt.Sprintf("tensor: CUDA MoE router: score function %d has no kernel", c.Score))
	}
	if c.PreSoftmax {
		pre = 1
	}
	return score, pre
}
