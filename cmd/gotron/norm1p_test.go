package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotron/gotron/train"
)

// TestTrainApplyLayerNorm1P: --apply-layernorm-1p reaches the model (the
// checkpoint stores γ, near 0 after a few steps, not a weight near 1, as
// Megatron's state dict does), is recorded so a resume without it is
// refused, and a Hugging Face export, whose norms have no 1 + γ, is refused.
func TestTrainApplyLayerNorm1P(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	if _, errs, code := runCLI(t, append(append([]string{}, tinyTrain...), "--train-iters", "2", "--apply-layernorm-1p", "--save", ck)...); code != 0 {
		t.Fatalf("train exited %d: %s", code, errs)
	}
	m, ra, err := train.LoadModel(ck)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Config.LayerNorm1P || !ra.Model.LayerNorm1P {
		t.Fatalf("checkpoint's model LayerNorm1P %v (args %v), want true", m.Config.LayerNorm1P, ra.Model.LayerNorm1P)
	}
	norms := 0
	for _, p := range m.Params() {
		if !strings.HasSuffix(p.Name, "layernorm.weight") {
			continue
		}
		norms++
		for i, g := range p.Float32s() {
			if g < -0.1 || g > 0.1 {
				t.Fatalf("%s[%d] = %g: want γ near 0 (the norm scales by 1 + γ)", p.Name, i, g)
			}
		}
	}
	if norms != 5 {
		t.Fatalf("%d norm weights, want 5", norms)
	}
	_, errs, code := runCLI(t, append(append([]string{}, tinyTrain...), "--train-iters", "3", "--load", ck)...)
	if code == 0 || !strings.Contains(errs, "--apply-layernorm-1p") {
		t.Fatalf("resume without --apply-layernorm-1p: exit %d, stderr %q; want a refusal naming the flag", code, errs)
	}
	_, errs, code = runCLI(t, "convert", "--to", "hf", "--load", ck, "--save", filepath.Join(dir, "hf"))
	if code == 0 || !strings.Contains(errs, "--apply-layernorm-1p") {
		t.Fatalf("HF export: exit %d, stderr %q; want a refusal naming --apply-layernorm-1p", code, errs)
	}
}
