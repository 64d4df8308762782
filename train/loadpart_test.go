package train

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// TestLoadModelPartReadsOnlyItsPart: a decoding rank's LoadModelPart
// holds, bit for bit, what slicing the whole model (Parallelize, then
// SplitStages) keeps, and reads only that from the checkpoint: a PP=2
// stage about half of the model's values, a TP=2 rank of it about half of
// the stage's.
func TestLoadModelPartReadsOnlyItsPart(t *testing.T) {
	cfg := gpt.Config{NumLayers: 4, HiddenSize: 64, NumAttentionHeads: 4, NumQueryGroups: 2, KVChannels: 16, FFNHiddenSize: 128,
		Activation: gpt.SwiGLU, Normalization: gpt.RMSNorm, PositionEmbeddingType: gpt.RoPE, RotaryBase: 10000, RotaryPercent: 1,
		VocabSize: 256, MaxPositionEmbeddings: 64, InitMethodStd: 0.02, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true}
	full, err := gpt.New(cfg, tensor.NewRNG(7))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := SaveModel(context.Background(), dir, 0, full, 32, nil); err != nil {
		t.Fatal(err)
	}
	total := int64(full.NumParams())
	groups, err := inproc.NewWorld(2)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ tp, pp, tpRank, ppRank int }{{1, 2, 0, 0}, {1, 2, 0, 1}, {2, 1, 0, 0}, {2, 1, 1, 0}, {2, 2, 1, 0}, {2, 2, 0, 1}} {
		name := fmt.Sprintf("TP=%d PP=%d rank (tp %d, pp %d)", c.tp, c.pp, c.tpRank, c.ppRank)
		var region *tp.Region
		if c.tp > 1 {
			region = &tp.Region{Group: groups[c.tpRank]}
		}
		per := cfg.NumLayers / c.pp
		part := gpt.Part{FirstLayer: c.ppRank * per, EndLayer: (c.ppRank + 1) * per, Embedding: c.ppRank == 0, Head: c.ppRank == c.pp-1, TP: region}
		m, _, read, err := LoadModelPart(dir, func(gpt.Config) (gpt.Part, error) { return part, nil })
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// What slicing the whole model keeps.
		want := full
		if region != nil {
			if want, err = gpt.Parallelize(full, region, nil); err != nil {
				t.Fatal(err)
			}
		}
		stages, err := gpt.SplitStages(want, gpt.PipelineSplit{PP: c.pp}, c.ppRank)
		if err != nil {
			t.Fatal(err)
		}
		wantPs := stages[0].Params()
		got := m.Params()
		if len(got) != len(wantPs) {
			t.Fatalf("%s: %d tensors, slicing the whole model keeps %d", name, len(got), len(wantPs))
		}
		var held int64
		for i, p := range got {
			w := wantPs[i]
			if p.Name != w.Name || !slices.Equal(p.Shape(), w.Shape()) {
				t.Fatalf("%s: tensor %d is %s%v, want %s%v", name, i, p.Name, p.Shape(), w.Name, w.Shape())
			}
			for j, v := range p.Float32s() {
				if math.Float32bits(v) != math.Float32bits(w.Float32s()[j]) {
					t.Fatalf("%s: %s[%d] = %v, want %v", name, p.Name, j, v, w.Float32s()[j])
				}
			}
			held += int64(p.Numel())
		}
		if read != held {
			t.Errorf("%s: read %d values, holds %d", name, read, held)
		}
		share := float64(read) / float64(total)
		wantShare := 1 / float64(c.tp*c.pp)
		t.Logf("%s: read %d of the model's %d values (%.3f)", name, read, total, share)
		// Norms are replicated over TP and the embedding sits on one stage:
		// about 1/(TP·PP), within 15%.
		if share > wantShare*1.15 || share < wantShare*0.85 {
			t.Errorf("%s: read %.3f of the model, want about %.3f", name, share, wantShare)
		}
	}
}
