package gpt

import (
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// norm1pLossGrads runs one training micro-batch and returns the loss and
// every parameter's gradient by name.
func norm1pLossGrads(t *testing.T, m *Model) (float32, map[string][]float32) {
	t.Helper()
	const b, T = 2, 6
	ids, labels := make([]int32, b*T), make([]int32, b*T)
	for i := range ids {
		ids[i], labels[i] = int32((i*7+3)%m.Config.VocabSize), int32((i*5+1)%m.Config.VocabSize)
	}
	bt := Batch{Tokens: tensor.FromInt32(ids, b, T), Labels: tensor.FromInt32(labels, b, T)}
	tp := tensor.NewTape()
	loss := m.Loss(tp, m.Forward(tp, bt, nil, true), bt)
	if err := tp.Backward(loss); err != nil {
		t.Fatal(err)
	}
	grads := map[string][]float32{}
	for _, p := range m.Params() {
		grads[p.Name] = append([]float32(nil), p.Grad.Float32s()...)
	}
	return loss.Float32s()[0], grads
}

// isNormWeight reports whether a parameter is a norm's scale (γ with
// --apply-layernorm-1p), as Megatron names them.
func isNormWeight(name string) bool { return strings.HasSuffix(name, "layernorm.weight") }

// TestLayerNorm1P checks --apply-layernorm-1p against the exact identity it
// is built on: a 1p model with γ equals a plain model whose norm weights are
// 1 + γ, in the loss and in every gradient (∂L/∂γ = ∂L/∂w); γ starts at zero;
// and the flag is not ignored (the same stored values give another loss).
func TestLayerNorm1P(t *testing.T) {
	for _, norm := range []Normalization{LayerNorm, RMSNorm} {
		t.Run(norm.String(), func(t *testing.T) {
			cfg := Config{NumLayers: 2, HiddenSize: 16, NumAttentionHeads: 2, FFNHiddenSize: 24, VocabSize: 40,
				MaxPositionEmbeddings: 8, PositionEmbeddingType: RoPE, Normalization: norm, LayerNorm1P: true}
			m1p, err := New(cfg, tensor.NewRNG(5))
			if err != nil {
				t.Fatal(err)
			}
			plainCfg := cfg
			plainCfg.LayerNorm1P = false
			plain, err := New(plainCfg, tensor.NewRNG(5))
			if err != nil {
				t.Fatal(err)
			}
			norms := 0
			for i, p := range m1p.Params() {
				q := plain.Params()[i]
				if p.Name != q.Name {
					t.Fatalf("parameter %d: %s vs %s", i, p.Name, q.Name)
				}
				if !isNormWeight(p.Name) {
					continue
				}
				norms++
				for j, g := range p.Float32s() {
					if g != 0 || q.Float32s()[j] != 1 {
						t.Fatalf("%s[%d]: initial γ %g (want 0), plain weight %g (want 1)", p.Name, j, g, q.Float32s()[j])
					}
				}
			}
			if want := 2*cfg.NumLayers + 1; norms != want {
				t.Fatalf("%d norm weights, want %d", norms, want)
			}
			// Move γ off zero so the identity is tested away from the initial point.
			rng := tensor.NewRNG(9)
			for i, p := range m1p.Params() {
				if isNormWeight(p.Name) {
					rng.Fork(p.Name).Normal(p.Float32s(), 0, 0.3)
					for j, g := range p.Float32s() {
						plain.Params()[i].Float32s()[j] = 1 + g
					}
				}
			}
			loss1p, grads1p := norm1pLossGrads(t, m1p)
			lossPlain, gradsPlain := norm1pLossGrads(t, plain)
			if loss1p != lossPlain {
				t.Fatalf("loss with γ %.9g, plain with 1 + γ %.9g: want equal", loss1p, lossPlain)
			}
			for name, g := range grads1p {
				closeTo(t, "grad of "+name, g, gradsPlain[name], 1e-6)
			}
			// The flag has an effect: the same stored values read as plain weights.
			for i, p := range m1p.Params() {
				copy(plain.Params()[i].Float32s(), p.Float32s())
			}
			if other, _ := norm1pLossGrads(t, plain); other == loss1p {
				t.Fatalf("loss %g with and without --apply-layernorm-1p: the flag has no effect", other)
			}
		})
	}
}

// TestQKLayerNorm checks --qk-layernorm: Megatron's parameters exist
// (self_attention.q_layernorm.weight, k_layernorm.weight, (d) each, counted
// by ParamCount); RMSNorm per head makes attention invariant to scaling the
// query and key projections (an exact identity, up to the epsilon), which
// the model without the norms is not; and the norm weights' gradient matches
// central finite differences.
func TestQKLayerNorm(t *testing.T) {
	cfg := Config{NumLayers: 2, HiddenSize: 16, NumAttentionHeads: 4, NumQueryGroups: 2, FFNHiddenSize: 24, VocabSize: 40,
		MaxPositionEmbeddings: 8, PositionEmbeddingType: RoPE, Normalization: RMSNorm, Activation: SwiGLU,
		DisableBiasLinear: true, NormEpsilon: 1e-12, QKLayerNorm: true}
	build := func(c Config) *Model {
		m, err := New(c, tensor.NewRNG(7))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := build(cfg)
	if m.Layers[1].QNorm == nil || m.Layers[1].QNorm.Name != "decoder.layers.1.self_attention.q_layernorm.weight" ||
		m.Layers[1].KNorm.Name != "decoder.layers.1.self_attention.k_layernorm.weight" || m.Layers[1].KNorm.Numel() != 4 {
		t.Fatalf("q/k norms %v %v: want Megatron's names, (kv-channels) each", m.Layers[1].QNorm, m.Layers[1].KNorm)
	}
	if got, want := float64(m.NumParams()), m.Config.ParamCount(); got != want {
		t.Fatalf("NumParams %g, ParamCount %g", got, want)
	}
	// scaleQK multiplies the query and key rows of every fused QKV by s: per
	// group j the rows are [r·d queries; d keys; d values].
	scaleQK := func(m *Model, s float32) {
		d, r := m.Config.KVChannels, m.Config.NumAttentionHeads/m.Config.NumQueryGroups
		for _, l := range m.Layers {
			w, h := l.QKV.Float32s(), m.Config.HiddenSize
			for row := range l.QKV.Dim(0) {
				if row%((r+2)*d) < (r+1)*d {
					for i := range h {
						w[row*h+i] *= s
					}
				}
			}
		}
	}
	rng := tensor.NewRNG(11)
	for _, l := range m.Layers { // norm weights off one so their gradient path is exercised
		rng.Fork(l.QNorm.Name).Normal(l.QNorm.Float32s(), 1, 0.2)
		rng.Fork(l.KNorm.Name).Normal(l.KNorm.Float32s(), 1, 0.2)
	}
	base, grads := norm1pLossGrads(t, m)
	scaleQK(m, 30)
	if scaled, _ := norm1pLossGrads(t, m); math.Abs(float64(scaled-base)) > 1e-5 {
		t.Fatalf("loss %.7g, with q and k scaled by 30 %.7g: per-head norms should cancel the scale", base, scaled)
	}
	scaleQK(m, 1.0/30)
	plainCfg := cfg
	plainCfg.QKLayerNorm = false
	plain := build(plainCfg)
	p0, _ := norm1pLossGrads(t, plain)
	scaleQK(plain, 30)
	if p1, _ := norm1pLossGrads(t, plain); math.Abs(float64(p1-p0)) < 1e-4 {
		t.Fatalf("without --qk-layernorm the loss %g barely moves with q, k scaled (%g): the identity tests nothing", p0, p1)
	}
	// Central differences in float32 on the loss (≈3.7): step 1e-2 leaves
	// rounding errors ≈ 1e-5 in the quotient.
	for _, w := range []*tensor.Tensor{m.Layers[0].QNorm, m.Layers[1].KNorm} {
		for i := range w.Float32s() {
			v := w.Float32s()[i]
			const h = 1e-2
			w.Float32s()[i] = v + h
			up, _ := norm1pLossGrads(t, m)
			w.Float32s()[i] = v - h
			down, _ := norm1pLossGrads(t, m)
			w.Float32s()[i] = v
			fd, g := float64(up-down)/(2*h), float64(grads[w.Name][i])
			if math.Abs(fd-g) > 2e-4+1e-2*math.Abs(g) {
				t.Errorf("∂L/∂%s[%d] = %.6g, finite differences %.6g", w.Name, i, g, fd)
			}
		}
	}
}
