package gpt

import (
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// fusionStep runs one training step (dropout on) of c's model with the
// given fusions, its biases drawn non-zero, and returns the loss, every
// gradient, the tape's recorded op names and its activations (floats).
func fusionStep(t *testing.T, c Config, bt Batch, f Fusions, rc Recompute) (float32, [][]float32, []string, int) {
	t.Helper()
	m := stageModel(t, c)
	m.Fusions, m.Recompute = f, rc
	for _, p := range m.Params() {
		if strings.HasSuffix(p.Name, ".bias") {
			tensor.NewRNG(7).Fork(p.Name).Normal(p.Float32s(), 0, 0.5)
		}
	}
	tp := tensor.NewTape()
	loss := m.Loss(tp, m.Forward(tp, bt, tensor.NewRNG(3), true), bt)
	names, live := tp.StepNames(), tp.LiveFloats()
	if err := tp.Backward(loss); err != nil {
		t.Fatal(err)
	}
	var grads [][]float32
	for _, p := range m.Params() {
		grads = append(grads, p.Grad.Float32s())
	}
	return loss.Float32s()[0], grads, names, live
}

// TestFusionsSameNumbers: the fused layer (the default) and the unfused
// one (--no-bias-gelu-fusion, --no-bias-swiglu-fusion,
// --no-bias-dropout-fusion, and the residual add and the MLP's norm apart:
// Fusions.NoAddNorm) give the same loss and gradients bit for bit, and so
// does the add-norm alone (the Megatron flags' fusions off), for GELU,
// tanh-GELU and SwiGLU models with and without biases, LayerNorm (also
// 1 + γ) and RMSNorm, with dropout and recomputation; the fusions change
// which ops run, and the fused tape keeps fewer activations (no dropout
// masks; the add-norm keeps what its two ops keep).
func TestFusionsSameNumbers(t *testing.T) {
	gelu := gpt2Tiny()
	gelu.Activation = GELU
	onePlus := gpt2Tiny()
	onePlus.LayerNorm1P = true
	swigluBias := llamaTiny()
	swigluBias.DisableBiasLinear = false
	megatronOff := Fusions{NoBiasGELU: true, NoBiasSwiGLU: true, NoBiasDropout: true}
	off := megatronOff
	off.NoAddNorm = true
	for _, c := range []Config{gpt2Tiny(), gelu, onePlus, llamaTiny(), swigluBias} {
		c, bt := deviceCase(c)
		name := c.Activation.String() + " " + c.Normalization.String()
		if c.DisableBiasLinear {
			name += " without biases"
		}
		if c.LayerNorm1P {
			name += " 1p"
		}
		for _, rc := range []Recompute{{}, {Full: true, Method: "uniform", NumLayers: 2}} {
			fl, fg, fops, flive := fusionStep(t, c, bt, Fusions{}, rc)
			ul, ug, uops, ulive := fusionStep(t, c, bt, off, rc)
			al, ag, aops, alive := fusionStep(t, c, bt, megatronOff, rc)
			sameBits(t, name+" loss", []float32{fl}, []float32{ul})
			sameBits(t, name+" add-norm alone loss", []float32{al}, []float32{ul})
			for i := range ug {
				sameBits(t, name+" gradient", fg[i], ug[i])
				sameBits(t, name+" add-norm alone gradient", ag[i], ug[i])
			}
			if rc.Full {
				continue // the layers are one recorded step each
			}
			act := "bias_gelu"
			if c.Activation == SwiGLU {
				act = "bias_swiglu"
			}
			count := func(ops []string, op string) int {
				n := 0
				for _, o := range ops {
					if o == op {
						n++
					}
				}
				return n
			}
			// the embedding's dropout, then one per half layer unfused;
			// the first half's bias-dropout-add also computes the MLP's norm
			if count(fops, "bias_dropout_add") != c.NumLayers || count(fops, "bias_dropout_add_norm") != c.NumLayers || count(fops, "dropout") != 1 {
				t.Errorf("%s fused: ops %v: want bias_dropout_add and bias_dropout_add_norm once a layer, dropout once", name, fops)
			}
			norm := "layernorm"
			if c.Normalization == RMSNorm {
				norm = "rmsnorm"
			}
			if got, want := count(fops, norm), c.NumLayers+1; got != want { // each layer's first, the final norm
				t.Errorf("%s fused: %d %s ops, want %d", name, got, norm, want)
			}
			if count(aops, "bias_dropout_add_norm") != c.NumLayers || count(aops, "dropout") != 1+2*c.NumLayers || alive != ulive {
				t.Errorf("%s add-norm alone: ops %v, %d floats (unfused %d): want bias_dropout_add_norm once a layer, as many floats", name, aops, alive, ulive)
			}
			if count(uops, norm) != 1+2*c.NumLayers {
				t.Errorf("%s unfused: ops %v: want %s twice a layer and once more", name, uops, norm)
			}
			if slices.Contains(fops, act) == c.DisableBiasLinear { // no bias: nothing to fuse into the activation
				t.Errorf("%s fused: ops %v: %s present should be %v", name, fops, act, !c.DisableBiasLinear)
			}
			if slices.Contains(uops, "bias_dropout_add") || slices.Contains(uops, "bias_dropout_add_norm") || slices.Contains(uops, act) || count(uops, "dropout") != 1+2*c.NumLayers {
				t.Errorf("%s unfused: ops %v: want no fused op", name, uops)
			}
			// per layer, each half keeps the mask's bits instead of the
			// mask and the dropped copy
			h := bt.Tokens.Numel() * c.HiddenSize
			if want := ulive - 2*c.NumLayers*(2*h-(h+31)/32); flive != want {
				t.Errorf("%s: the fused tape holds %d floats, the unfused %d: want %d", name, flive, ulive, want)
			}
		}
	}
}
