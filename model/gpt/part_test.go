package gpt

import (
	"strings"
	"testing"

	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/parallel/ep"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// TestPartExpertsOverTPRefusals: a part that splits its experts over the
// tensor-parallel ranks is refused, with what is wrong, without tensor
// parallelism, with an expert layout too, without experts, with sequence
// parallelism and with an expert FFN the TP size does not divide.
func TestPartExpertsOverTPRefusals(t *testing.T) {
	world, err := inproc.NewWorld(2)
	if err != nil {
		t.Fatal(err)
	}
	moe := Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, NumQueryGroups: 4, KVChannels: 8, FFNHiddenSize: 64,
		Activation: SwiGLU, Normalization: RMSNorm, PositionEmbeddingType: RoPE, RotaryBase: 10000, RotaryPercent: 1,
		VocabSize: 128, MaxPositionEmbeddings: 64, InitMethodStd: 0.02, DisableBiasLinear: true,
		MoE: MoEConfig{NumExperts: 4, TopK: 2, FFNHiddenSize: 48}}
	dense := moe
	dense.MoE = MoEConfig{}
	odd := moe
	odd.MoE.FFNHiddenSize = 9
	whole := Part{FirstLayer: 0, EndLayer: 2, Embedding: true, Head: true, ExpertsOverTP: true}
	with := func(f func(*Part)) Part { p := whole; f(&p); return p }
	region := &tp.Region{Group: world[1]}
	for _, c := range []struct {
		cfg  Config
		part Part
		want string
	}{
		{moe, whole, "no tensor parallelism"},
		{moe, with(func(p *Part) { p.TP, p.Experts = region, &ep.Group{PG: world[0]} }), "both over the tensor-parallel ranks and by an expert layout"},
		{dense, with(func(p *Part) { p.TP = region }), "without (--num-experts)"},
		{moe, with(func(p *Part) { p.TP = &tp.Region{Group: world[1], SequenceParallel: true} }), "is sequence-parallel"},
		{odd, with(func(p *Part) { p.TP = region }), "--moe-ffn-hidden-size=9 is not divisible by --tensor-model-parallel-size=2"},
	} {
		if _, err := NewPart(c.cfg, tensor.NewRNG(0), c.part); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.part, err, c.want)
		}
	}
}
