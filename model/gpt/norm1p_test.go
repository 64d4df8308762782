package gpt

import (
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
