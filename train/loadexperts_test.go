package train

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/ep"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// TestLoadModelPartReadsOnlyItsExperts: a decoding rank's LoadModelPart
// with Part.Experts holds, bit for bit, what SliceExperts keeps of the
// whole model (its expert-parallel rank's experts, sliced for its
// expert-tensor rank), and reads only those experts from the checkpoint.
func TestLoadModelPartReadsOnlyItsExperts(t *testing.T) {
	cfg := gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, NumQueryGroups: 4, KVChannels: 8, FFNHiddenSize: 64,
		Activation: gpt.SwiGLU, Normalization: gpt.RMSNorm, PositionEmbeddingType: gpt.RoPE, RotaryBase: 10000, RotaryPercent: 1,
		VocabSize: 128, MaxPositionEmbeddings: 64, InitMethodStd: 0.02, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true,
		MoE: gpt.MoEConfig{NumExperts: 8, TopK: 2, FFNHiddenSize: 48, GroupedGEMM: true}}
	full, err := gpt.New(cfg, tensor.NewRNG(7))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := SaveModel(context.Background(), dir, 0, full, 32, nil); err != nil {
		t.Fatal(err)
	}
	var experts, total int64
	for _, p := range full.Params() {
		total += int64(p.Numel())
		if gpt.IsRoutedExpert(p.Name) {
			experts += int64(p.Numel())
		}
	}
	epWorld, err := inproc.NewWorld(4)
	if err != nil {
		t.Fatal(err)
	}
	etpWorld, err := inproc.NewWorld(2)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ ep, etp, epRank, etpRank int }{{2, 1, 1, 0}, {4, 1, 2, 0}, {2, 2, 0, 1}, {4, 2, 3, 1}} {
		name := fmt.Sprintf("EP=%d ETP=%d rank (ep %d, etp %d)", c.ep, c.etp, c.epRank, c.etpRank)
		pg := epWorld[c.epRank]
		if c.ep == 2 {
			sub, err := epWorld[c.epRank].NewGroup([]int{0, 1})
			if err != nil {
				t.Fatal(err)
			}
			pg = sub
		}
		g := &ep.Group{PG: pg}
		if c.etp > 1 {
			g.TP = etpWorld[c.etpRank]
		}
		m, _, read, err := LoadModelPart(dir, func(gpt.Config) (gpt.Part, error) {
			return gpt.Part{FirstLayer: 0, EndLayer: cfg.NumLayers, Embedding: true, Head: true, Experts: g}, nil
		})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want, err := gpt.New(cfg, tensor.NewRNG(7))
		if err != nil {
			t.Fatal(err)
		}
		if err := want.SliceExperts(g); err != nil {
			t.Fatal(err)
		}
		got, wantPs := m.Params(), want.Params()
		if len(got) != len(wantPs) {
			t.Fatalf("%s: %d tensors, SliceExperts keeps %d", name, len(got), len(wantPs))
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
		if want := total - experts + experts/int64(c.ep*c.etp); read != held || read != want {
			t.Errorf("%s: read %d values, holds %d; want the dense part and 1/%d of the experts: %d", name, read, held, c.ep*c.etp, want)
		}
		t.Logf("%s: read %d of the model's %d values (experts: %d)", name, read, total, experts)
	}
}

// TestLoadModelPartSplitsExpertsOverTP: a tensor-parallel decoding rank's
// LoadModelPart with Part.ExpertsOverTP (decoding's default expert layout)
// holds, bit for bit, what Parallelize then SplitExpertsOverTP keep of the
// whole model, and reads only those values: half of the experts at TP=2,
// not all of them.
func TestLoadModelPartSplitsExpertsOverTP(t *testing.T) {
	cfg := gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, NumQueryGroups: 4, KVChannels: 8, FFNHiddenSize: 64,
		Activation: gpt.SwiGLU, Normalization: gpt.RMSNorm, PositionEmbeddingType: gpt.RoPE, RotaryBase: 10000, RotaryPercent: 1,
		VocabSize: 128, MaxPositionEmbeddings: 64, InitMethodStd: 0.02, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true,
		MoE: gpt.MoEConfig{NumExperts: 4, TopK: 2, FFNHiddenSize: 48, GroupedGEMM: true, SharedExpertFFN: 16}}
	full, err := gpt.New(cfg, tensor.NewRNG(7))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := SaveModel(context.Background(), dir, 0, full, 32, nil); err != nil {
		t.Fatal(err)
	}
	world, err := inproc.NewWorld(2)
	if err != nil {
		t.Fatal(err)
	}
	var experts int64
	for _, p := range full.Params() {
		if gpt.IsRoutedExpert(p.Name) {
			experts += int64(p.Numel())
		}
	}
	for rank := range 2 {
		region := &tp.Region{Group: world[rank]}
		m, _, read, err := LoadModelPart(dir, func(gpt.Config) (gpt.Part, error) {
			return gpt.Part{FirstLayer: 0, EndLayer: cfg.NumLayers, Embedding: true, Head: true, TP: region, ExpertsOverTP: true}, nil
		})
		if err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
		if !m.ExpertsOverTP() {
			t.Errorf("rank %d: the model does not say its experts are split over the tensor-parallel ranks", rank)
		}
		want, err := gpt.Parallelize(full, region, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := want.SplitExpertsOverTP(); err != nil {
			t.Fatal(err)
		}
		got, wantPs := m.Params(), want.Params()
		if len(got) != len(wantPs) {
			t.Fatalf("rank %d: %d tensors, SplitExpertsOverTP keeps %d", rank, len(got), len(wantPs))
		}
		var held, heldExperts int64
		for i, p := range got {
			w := wantPs[i]
			if p.Name != w.Name || !slices.Equal(p.Shape(), w.Shape()) {
				t.Fatalf("rank %d: tensor %d is %s%v, want %s%v", rank, i, p.Name, p.Shape(), w.Name, w.Shape())
			}
			for j, v := range p.Float32s() {
				if math.Float32bits(v) != math.Float32bits(w.Float32s()[j]) {
					t.Fatalf("rank %d: %s[%d] = %v, want %v", rank, p.Name, j, v, w.Float32s()[j])
				}
			}
			held += int64(p.Numel())
			if gpt.IsRoutedExpert(p.Name) {
				heldExperts += int64(p.Numel())
			}
		}
		if read != held || 2*heldExperts != experts {
			t.Errorf("rank %d: read %d values, holds %d, of the experts %d of %d: want what it holds, half of the experts", rank, read, held, heldExperts, experts)
		}
		t.Logf("rank %d: read %d of the model's %d values (experts: %d of %d)", rank, read, full.NumParams(), heldExperts, experts)
	}
}
