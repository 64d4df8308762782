package tensor

import (
	"fmt"
	"math"
	"sync/atomic"

	"github.com/gotron/gotron/internal/cpu"
)

// The MoE router on the GPU (moe.cu): Route's selection, probabilities and
// backward as device kernels, bit for bit internal/cpu's router (the same
// float64 operations in the same order, e^x by cpu.RouterExp's
// operations, no fused multiply-adds, ties lowest index first); the host
// reads back only the chosen experts (tokens × top-k int32), which the
// dispatcher's permutation and token counts are built from, where the host
// router read back the logits (tokens × experts float32). Built but not
// yet run on a GPU, so used only while SetCUDARouter is on.

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

// cudaRoutable reports whether moe.cu routes c: softmax (after or before
// the top-k) or sigmoid scores, with or without the expert bias, group
// limits and scaling; not the square-root softplus score, capacity
// dropping (a sort of each expert's tokens) or the auxiliary losses, which
// route on the host.
func cudaRoutable(c *RouterConfig) bool {
	return cudaRouter.Load() && c.Score != ScoreSqrtSoftplus && c.CapacityFactor <= 0 && !c.Losses &&
		(c.GroupTopK <= 0 || c.NumGroups <= moeRouterMaxGroups) && c.Experts <= math.MaxInt32/2
}

// routeCUDA runs moe_route_fwd_f32 on logits (T, E) on the GPU, reads the
// chosen experts back into f's routing and keeps them on the device for
// backwardCUDA; it returns the probabilities (T, E), on the device.
func (f *routeFn) routeCUDA(logits *Tensor) *Tensor {
	be := cudaBackend{rt: cudaRT()}
	c := f.r.cfg
	T, E, k := f.T, f.E, c.TopK
	groups := 0
	if c.GroupTopK > 0 {
		groups = c.NumGroups
	}
	logits = logits.Contiguous()
	probs, sel := be.empty(Float32, T, E), be.empty(Int32, T, k)
	scratch := be.empty(Float32, 2*T*(E+groups)) // float64 (T, E + groups)
	var bias *Tensor
	if c.ExpertBias != nil {
		bias = toCUDA(FromFloat32(c.ExpertBias, E), "the MoE router's expert bias")
	}
	be.launch1D("moe_route_fwd_f32", T, moeRouteFwdArgs(be.ptr(probs), be.ptr(sel), be.ptr(scratch), be.ptr(logits), be.ptr(bias), T, E, c)...)
	res, err := cpu.RouteFromSelection(c, T, ToHost(sel).i32s())
	if err != nil {
		panic("tensor: CUDA MoE router: " + err.Error())
	}
	f.r.res, f.logits, f.sel = res, logits, sel
	return probs
}

// backwardCUDA is moe_route_bwd_f32: the logits' gradient (T, E) for the
// probabilities' gradient dprobs.
func (f *routeFn) backwardCUDA(dprobs *Tensor) *Tensor {
	be := cudaBackend{rt: cudaRT()}
	T, E := f.T, f.E
	dprobs = dprobs.Contiguous()
	dl, scratch := be.empty(Float32, T, E), be.empty(Float32, 2*T*E)
	be.launch1D("moe_route_bwd_f32", T, moeRouteBwdArgs(be.ptr(dl), be.ptr(scratch), be.ptr(dprobs), be.ptr(f.logits), be.ptr(f.sel), T, E, f.r.cfg)...)
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

func moeRouteBwdArgs(dlogits, scratch, dprobs, logits, sel uintptr, T, E int, c *RouterConfig) []any {
	score, pre := moeRouterScore(c)
	return []any{dlogits, scratch, dprobs, logits, sel, int64(T), int32(E), int32(c.TopK), score, pre, c.ScalingFactor}
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
