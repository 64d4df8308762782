package tensor

import (
	"math"
	"testing"
)

// TestGDNOpsGradients: the gated delta net's tape ops (their kernels are
// float64-checked in internal/cpu) pass the tape's float32 finite
// differences as wired here: inputs, outputs and the gradients each
// Backward returns, the delta rule with two value heads per key head (its
// repeat and fold), and strided inputs (Split pieces).
func TestGDNOpsGradients(t *testing.T) {
	rng := NewRNG(5)
	x := randParam(rng, "x", 1, 2, 5, 6)
	w := randParam(rng, "w", 0.5, 3, 4)
	gradCheck(t, "CausalConvSiLU", []*Tensor{x, w}, func(tp *Tape, in []*Tensor) *Tensor {
		return tp.CausalConvSiLU(tp.Split(in[0], 2, 3, 3)[1], in[1]) // a strided piece
	})
	v := randParam(rng, "v", 1, 2, 3, 2, 4)
	gradCheck(t, "L2Norm", []*Tensor{v}, func(tp *Tape, in []*Tensor) *Tensor { return tp.L2Norm(in[0], 1e-6) })
	a, b := randParam(rng, "alpha", 1, 2, 3, 4), randParam(rng, "b", 1, 2, 3, 4)
	aLog, dt := randParam(rng, "A_log", 0.5, 4), randParam(rng, "dt_bias", 0.5, 4)
	gradCheck(t, "GDNGates", []*Tensor{a, b, aLog, dt}, func(tp *Tape, in []*Tensor) *Tensor {
		g, beta := tp.GDNGates(in[0], in[1], in[2], in[3])
		return tp.Concat(2, g, beta)
	})
	q, k := randParam(rng, "q", 1, 2, 5, 1, 3), randParam(rng, "k", 1, 2, 5, 1, 3)
	vv := randParam(rng, "v", 1, 2, 5, 2, 4)
	g := randParam(rng, "g", 0.3, 2, 5, 2)
	for i := range g.Float32s() {
		g.Float32s()[i] -= 0.4
	}
	beta := randParam(rng, "beta", 0.2, 2, 5, 2)
	for i := range beta.Float32s() {
		beta.Float32s()[i] += 0.5
	}
	gradCheck(t, "GatedDeltaRule", []*Tensor{q, k, vv, g, beta}, func(tp *Tape, in []*Tensor) *Tensor {
		return tp.GatedDeltaRule(in[0], in[1], in[2], in[3], in[4], 1/math.Sqrt(3), 2)
	})
	gradCheck(t, "GatedDeltaRuleRecurrent", []*Tensor{q, k, vv, g, beta}, func(tp *Tape, in []*Tensor) *Tensor {
		return tp.GatedDeltaRuleRecurrent(in[0], in[1], in[2], in[3], in[4], 1/math.Sqrt(3), 2)
	})
	o, gate := randParam(rng, "o", 1, 3, 4), randParam(rng, "gate", 1, 3, 4)
	gradCheck(t, "SigmoidGate", []*Tensor{o, gate}, func(tp *Tape, in []*Tensor) *Tensor { return tp.SigmoidGate(in[0], in[1]) })
}
