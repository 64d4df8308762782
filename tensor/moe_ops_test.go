package tensor

import (
	"encoding/json"
	"math"
	"os"
	"testing"
)

// TestMoEOpGradients checks the MoE ops' backward against finite
// differences: the un-permutation, the probability scale, the grouped and
// the per-expert linear layers over uneven groups (one empty), and the
// router with its losses (AuxScale 0.5).
func TestMoEOpGradients(t *testing.T) {
	rng := NewRNG(5)
	x := randParam(rng, "x", 1, 7, 5)
	p := randParam(rng, "p", 1, 7, 1)
	w0 := randParam(rng, "w0", 1, 3, 5)
	w1 := randParam(rng, "w1", 1, 3, 5)
	w2 := randParam(rng, "w2", 1, 3, 5)
	idx := FromInt32([]int32{2, 0, 2, 1, 3, 0, 1}, 7)
	counts := []int{3, 0, 4}
	gradCheck(t, "IndexAddRows", []*Tensor{x}, func(tp *Tape, in []*Tensor) *Tensor { return tp.IndexAddRows(4, idx, in[0]) })
	gradCheck(t, "ScaleRows", []*Tensor{x, p}, func(tp *Tape, in []*Tensor) *Tensor { return tp.ScaleRows(in[0], in[1]) })
	for _, grouped := range []bool{true, false} {
		gradCheck(t, "GroupedLinear", []*Tensor{x, w0, w1, w2}, func(tp *Tape, in []*Tensor) *Tensor {
			return tp.GroupedLinear(in[0], in[1:], counts, grouped)
		})
	}
	// The probabilities' path (internal/cpu checks the losses' gradients in
	// float64, TestRouteBackwardFiniteDifference).
	logits := randParam(rng, "logits", 2, 6, 4)
	for _, cfg := range []*RouterConfig{{Experts: 4, TopK: 2}, {Experts: 4, TopK: 2, Score: ScoreSigmoid}} {
		gradCheck(t, "Route", []*Tensor{logits}, func(tp *Tape, in []*Tensor) *Tensor {
			probs, _ := tp.Route(in[0], cfg)
			return probs
		})
	}
}

// TestGroupedLinearMatchesLoop: the grouped GEMM and the per-expert loop
// give the same products bit for bit on the CPU (cpu.GroupedSgemm computes
// each expert by the loop's own Sgemm call).
func TestGroupedLinearMatchesLoop(t *testing.T) {
	rng := NewRNG(6)
	x := randParam(rng, "x", 1, 300, 32)
	ws := []*Tensor{randParam(rng, "w0", 1, 48, 32), randParam(rng, "w1", 1, 48, 32), randParam(rng, "w2", 1, 48, 32)}
	counts := []int{170, 1, 129}
	var outs [2][]float32
	var grads [2][]float32
	for i, grouped := range []bool{true, false} {
		x.Grad, ws[0].Grad = nil, nil
		tp := NewTape()
		y := tp.GroupedLinear(x, ws, counts, grouped)
		if err := tp.Backward(tp.Sum(tp.Mul(y, y))); err != nil {
			t.Fatal(err)
		}
		outs[i] = append([]float32(nil), y.Float32s()...)
		grads[i] = append(append([]float32(nil), x.Grad.Float32s()...), ws[0].Grad.Float32s()...)
	}
	for k, pair := range [][2][]float32{{outs[0], outs[1]}, {grads[0], grads[1]}} {
		for i := range pair[0] {
			if pair[0][i] != pair[1][i] {
				t.Fatalf("%d[%d]: grouped %g, loop %g", k, i, pair[0][i], pair[1][i])
			}
		}
	}
}

// TestRouteFP64Golden: --moe-router-dtype fp64 against Megatron's
// RouterGatingLinearFunction and topk_routing_with_score_function in
// float64 (tools/golden/moe.py), on inputs where float32 gating moves the
// probabilities by more than the tolerance.
func TestRouteFP64Golden(t *testing.T) {
	raw, err := os.ReadFile("testdata/moe_router_fp64.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		T, H, E, K               int
		X, W, DProbs, Probs, Map []float64
		DX, DW                   []float64
		ProbsFP32Gating          []float64 `json:"probs_fp32_gating"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	f32 := func(v []float64) []float32 {
		out := make([]float32, len(v))
		for i, x := range v {
			out[i] = float32(x)
		}
		return out
	}
	var worst float64
	for i := range g.Probs {
		worst = math.Max(worst, math.Abs(g.Probs[i]-g.ProbsFP32Gating[i]))
	}
	if worst < 1e-5 {
		t.Fatalf("the fixture does not need fp64 (fp32 gating within %g)", worst)
	}
	x := Param("x", g.T, g.H)
	copy(x.Float32s(), f32(g.X))
	w := Param("w", g.E, g.H)
	copy(w.Float32s(), f32(g.W))
	cfg := &RouterConfig{Experts: g.E, TopK: g.K}
	tp := NewTape()
	probs, r := tp.RouteFP64(x, w, cfg)
	if err := tp.Backward(tp.Sum(tp.Mul(probs, FromFloat32(f32(g.DProbs), g.T, g.E)))); err != nil {
		t.Fatal(err)
	}
	check := func(name string, got []float32, want []float64, tol float64) {
		t.Helper()
		for i := range want {
			if math.Abs(float64(got[i])-want[i]) > tol*math.Max(1, math.Abs(want[i])) {
				t.Fatalf("%s[%d] = %g, Megatron fp64 %g", name, i, got[i], want[i])
			}
		}
	}
	check("probs", probs.Float32s(), g.Probs, 1e-6)
	for i := range g.Map {
		if r.Map(i/g.E, i%g.E) != (g.Map[i] != 0) {
			t.Fatalf("map[%d,%d] differs from Megatron's", i/g.E, i%g.E)
		}
	}
	// Megatron's softmax backward runs in float32 (its softmax has
	// dtype=float32), gotron's in float64: the gradients agree to its noise.
	check("dx", x.Grad.Float32s(), g.DX, 1e-4)
	check("dw", w.Grad.Float32s(), g.DW, 1e-4)
}
