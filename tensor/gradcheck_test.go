package tensor

import (
	"math"
	"testing"
)

// gradCheck compares the tape's gradients of loss = Σ out⊙r (r fixed random)
// with central finite differences, for every element of every input that
// requires grad. Kernels compute in float32, so the step is 1e-2 and the
// tolerance 2e-2 relative plus 2e-3 absolute; the float64 checks of each
// kernel's reference live in internal/cpu.
func gradCheck(t *testing.T, name string, inputs []*Tensor, fn func(tp *Tape, in []*Tensor) *Tensor) {
	t.Helper()
	rng := NewRNG(99)
	var r []float32
	loss := func(tp *Tape) (*Tensor, float64) {
		out := fn(tp, inputs)
		if r == nil {
			r = make([]float32, out.Numel())
			rng.Normal(r, 0, 1)
		}
		w := FromFloat32(r, out.shape...)
		l := tp.Sum(tp.Mul(out, w))
		return l, float64(l.Float32s()[0])
	}
	for _, in := range inputs {
		if in.Grad != nil {
			clear(in.Grad.Float32s())
		}
	}
	tp := NewTape()
	l, _ := loss(tp)
	if err := tp.Backward(l); err != nil {
		t.Fatalf("%s: backward: %v", name, err)
	}
	const h = 1e-2
	for k, in := range inputs {
		if !in.requiresGrad {
			continue
		}
		x := in.Float32s()
		g := in.Grad.Float32s()
		for i := range x {
			orig := x[i]
			x[i] = orig + h
			_, lp := loss(nil)
			x[i] = orig - h
			_, lm := loss(nil)
			x[i] = orig
			num := (lp - lm) / (2 * h)
			if d := math.Abs(num - float64(g[i])); d > 2e-3+2e-2*math.Abs(num) {
				t.Fatalf("%s: input %d (%s) element %d: analytic %.6g, numeric %.6g", name, k, in.Name, i, g[i], num)
			}
		}
	}
}

func randParam(rng *RNG, name string, std float32, shape ...int) *Tensor {
	p := Param(name, shape...)
	rng.Normal(p.Float32s(), 0, std)
	return p
}

func TestGradients(t *testing.T) {
	rng := NewRNG(1)
	ids := FromInt32([]int32{3, 1, 3, 0, 2, 4}, 2, 3)
	targets := FromInt32([]int32{1, 0, 4, -1, 2, 3}, 6)
	mask := FromFloat32([]float32{1, 1, 0.5, 1, 0, 1}, 6)
	rope, err := NewRoPE(RoPEConfig{Dim: 4, Base: 10000, MaxPositions: 16})
	if err != nil {
		t.Fatal(err)
	}
	ropeI, err := NewRoPE(RoPEConfig{Dim: 4, Base: 10000, MaxPositions: 16, Style: Interleaved})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		inputs []*Tensor
		fn     func(tp *Tape, in []*Tensor) *Tensor
	}{
		{"linear", []*Tensor{randParam(rng, "x", 1, 2, 3, 5), randParam(rng, "w", 1, 4, 5), randParam(rng, "b", 1, 4)},
			func(tp *Tape, in []*Tensor) *Tensor { return tp.Linear(in[0], in[1], in[2]) }},
		{"matmul_nn_batched", []*Tensor{randParam(rng, "a", 1, 2, 3, 4), randParam(rng, "b", 1, 2, 4, 5)},
			func(tp *Tape, in []*Tensor) *Tensor { return tp.MatMul(in[0], in[1], NoTrans, NoTrans) }},
		{"matmul_nt", []*Tensor{randParam(rng, "a", 1, 3, 4), randParam(rng, "b", 1, 5, 4)},
			func(tp *Tape, in []*Tensor) *Tensor { return tp.MatMul(in[0], in[1], NoTrans, Trans) }},
		{"matmul_tn", []*Tensor{randParam(rng, "a", 1, 4, 3), randParam(rng, "b", 1, 4, 5)},
			func(tp *Tape, in []*Tensor) *Tensor { return tp.MatMul(in[0], in[1], Trans, NoTrans) }},
		{"matmul_tt_shared_weight", []*Tensor{randParam(rng, "a", 1, 2, 4, 3), randParam(rng, "b", 1, 5, 4)},
			func(tp *Tape, in []*Tensor) *Tensor { return tp.MatMul(in[0], in[1], Trans, Trans) }},
		{"add_broadcast", []*Tensor{randParam(rng, "a", 1, 2, 3, 4), randParam(rng, "b", 1, 3, 4)},
			func(tp *Tape, in []*Tensor) *Tensor { return tp.Add(in[0], in[1]) }},
		{"sub_mul", []*Tensor{randParam(rng, "a", 1, 3, 4), randParam(rng, "b", 1, 4)},
			func(tp *Tape, in []*Tensor) *Tensor { return tp.Mul(tp.Sub(in[0], in[1]), in[1]) }},
		{"shared_input", []*Tensor{randParam(rng, "a", 1, 3, 4)},
			func(tp *Tape, in []*Tensor) *Tensor { return tp.Mul(tp.Add(in[0], in[0]), in[0]) }},
		{"embedding", []*Tensor{randParam(rng, "table", 1, 5, 3)},
			func(tp *Tape, in []*Tensor) *Tensor { return tp.Embedding(ids, in[0]) }},
		{"layernorm", []*Tensor{randParam(rng, "x", 1, 3, 6), randParam(rng, "w", 1, 6), randParam(rng, "b", 1, 6)},
			func(tp *Tape, in []*Tensor) *Tensor { return tp.LayerNorm(in[0], in[1], in[2], 1e-5) }},
		{"rmsnorm", []*Tensor{randParam(rng, "x", 1, 3, 6), randParam(rng, "w", 1, 6)},
			func(tp *Tape, in []*Tensor) *Tensor { return tp.RMSNorm(in[0], in[1], 1e-5) }},
		{"gelu_tanh", []*Tensor{randParam(rng, "x", 1, 10)}, func(tp *Tape, in []*Tensor) *Tensor { return tp.GELU(in[0], GELUTanh) }},
		{"gelu_erf", []*Tensor{randParam(rng, "x", 1, 10)}, func(tp *Tape, in []*Tensor) *Tensor { return tp.GELU(in[0], GELUErf) }},
		{"silu", []*Tensor{randParam(rng, "x", 1, 10)}, func(tp *Tape, in []*Tensor) *Tensor { return tp.SiLU(in[0]) }},
		{"squared_relu", []*Tensor{randParam(rng, "x", 1, 10)}, func(tp *Tape, in []*Tensor) *Tensor { return tp.SquaredReLU(in[0]) }},
		{"swiglu", []*Tensor{randParam(rng, "x", 1, 3, 8)}, func(tp *Tape, in []*Tensor) *Tensor { return tp.SwiGLU(in[0]) }},
		{"softmax", []*Tensor{randParam(rng, "x", 1, 3, 7)}, func(tp *Tape, in []*Tensor) *Tensor { return tp.Softmax(in[0]) }},
		{"rope_half", []*Tensor{randParam(rng, "x", 1, 2, 3, 2, 6)}, func(tp *Tape, in []*Tensor) *Tensor { return tp.RoPE(in[0], rope, nil) }},
		{"rope_interleaved", []*Tensor{randParam(rng, "x", 1, 2, 3, 2, 4)}, func(tp *Tape, in []*Tensor) *Tensor { return tp.RoPE(in[0], ropeI, nil) }},
		{"attention_gqa_causal", []*Tensor{randParam(rng, "q", 1, 2, 5, 4, 3), randParam(rng, "k", 1, 2, 5, 2, 3), randParam(rng, "v", 1, 2, 5, 2, 3)},
			func(tp *Tape, in []*Tensor) *Tensor {
				return tp.Attention(in[0], in[1], in[2], AttentionOptions{Causal: true})
			}},
		{"attention_docmask", []*Tensor{randParam(rng, "q", 1, 1, 6, 2, 4), randParam(rng, "k", 1, 1, 6, 1, 4), randParam(rng, "v", 1, 1, 6, 1, 4)},
			func(tp *Tape, in []*Tensor) *Tensor {
				return tp.Attention(in[0], in[1], in[2], AttentionOptions{Causal: true, DocIDs: FromInt32([]int32{0, 0, 0, 1, 1, 2}, 1, 6)})
			}},
		// Dropout: each evaluation draws from a fresh stream of one seed, so
		// the mask is fixed and the function smooth.
		{"dropout", []*Tensor{randParam(rng, "x", 1, 3, 7)},
			func(tp *Tape, in []*Tensor) *Tensor { return tp.Dropout(in[0], 0.4, NewRNG(5)) }},
		{"attention_dropout_gqa_causal", []*Tensor{randParam(rng, "q", 1, 2, 5, 4, 3), randParam(rng, "k", 1, 2, 5, 2, 3), randParam(rng, "v", 1, 2, 5, 2, 3)},
			func(tp *Tape, in []*Tensor) *Tensor {
				return tp.Attention(in[0], in[1], in[2], AttentionOptions{Causal: true, Dropout: 0.3, RNG: NewRNG(6), FirstHead: 4})
			}},
		{"cross_entropy_masked_smoothed", []*Tensor{randParam(rng, "logits", 1, 6, 5)},
			func(tp *Tape, in []*Tensor) *Tensor {
				return tp.CrossEntropy(in[0], targets, CrossEntropyOptions{LossMask: mask, LabelSmoothing: 0.1})
			}},
		{"token_logprobs", []*Tensor{randParam(rng, "logits", 1.5, 6, 5)},
			func(tp *Tape, in []*Tensor) *Tensor {
				return tp.TokenLogProbs(in[0], FromInt32([]int32{1, 0, 4, 3, 2, 2}, 6))
			}},
		{"views_transpose_narrow_concat_split", []*Tensor{randParam(rng, "a", 1, 3, 4), randParam(rng, "b", 1, 4, 2)},
			func(tp *Tape, in []*Tensor) *Tensor {
				at := tp.Transpose(in[0], 0, 1)   // (4, 3) strided view
				c := tp.Concat(1, at, in[1])      // (4, 5)
				parts := tp.Split(c, 1, 2, 3)     // (4, 2), (4, 3) strided
				n := tp.Narrow(parts[1], 0, 1, 2) // (2, 3)
				r := tp.Reshape(parts[0], 2, 4)   // copied through Contiguous
				return tp.Concat(1, r, n)         // (2, 7)
			}},
		{"reductions", []*Tensor{randParam(rng, "x", 1, 3, 5)},
			func(tp *Tape, in []*Tensor) *Tensor {
				return tp.Concat(0, tp.SumLast(in[0]), tp.MaxLast(in[0]), tp.Mean(in[0]))
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { gradCheck(t, c.name, c.inputs, c.fn) })
	}
}
