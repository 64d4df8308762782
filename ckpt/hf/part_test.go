package hf

import (
	"math"
	"testing"

	"github.com/gotron/gotron/model/gpt"
)

// TestImportPart: a decoding rank's import of its pipeline stage
// (ImportOptions.Part) builds and decodes only the stage's tensors, each
// the same bits as the whole import's: the two stages of PP=2 hold about
// half of the model each (the tied model's last stage its word embedding
// too, which SplitStages copies to its output layer).
func TestImportPart(t *testing.T) {
	for _, fixture := range []string{"llama_gqa_untied_f32", "gpt2_tied_f32"} {
		dir := "testdata/" + fixture
		full, _, err := LoadModel(dir)
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string][]float32{}
		for _, p := range full.Params() {
			byName[p.Name] = p.Float32s()
		}
		L := full.Config.NumLayers
		if L%2 != 0 {
			t.Fatalf("%s: %d layers: want an even number", fixture, L)
		}
		for stage := range 2 {
			part := gpt.Part{FirstLayer: stage * L / 2, EndLayer: (stage + 1) * L / 2, Embedding: stage == 0, Head: stage == 1}
			m, _, err := Import(dir, ImportOptions{Part: func(gpt.Config) (gpt.Part, error) { return part, nil }})
			if err != nil {
				t.Fatalf("%s stage %d: %v", fixture, stage, err)
			}
			for i := range m.Layers {
				if held := m.Layers[i].InputNorm != nil; held != (i >= part.FirstLayer && i < part.EndLayer) {
					t.Errorf("%s stage %d: layer %d held %t", fixture, stage, i, held)
				}
			}
			for _, p := range m.Params() {
				want := byName[p.Name]
				if len(want) != p.Numel() {
					t.Fatalf("%s stage %d: %s has %d values, the whole import %d", fixture, stage, p.Name, p.Numel(), len(want))
				}
				for j, v := range p.Float32s() {
					if math.Float32bits(v) != math.Float32bits(want[j]) {
						t.Fatalf("%s stage %d: %s[%d] = %v, the whole import %v", fixture, stage, p.Name, j, v, want[j])
					}
				}
			}
			share := float64(m.NumParams()) / float64(full.NumParams())
			t.Logf("%s stage %d of 2: %d of the model's %d values (%.3f)", fixture, stage, m.NumParams(), full.NumParams(), share)
			if share > 0.75 {
				t.Errorf("%s stage %d holds %.3f of the model", fixture, stage, share)
			}
		}
	}
}
