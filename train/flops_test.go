package train

import (
	"math"
	"testing"

	"github.com/gotron/gotron/model/gpt"
)

// TestFLOPsMatchesMegatronReferenceValues checks Megatron's reference values
// (computed by its num_floating_point_operations,
// megatron/training/training.py).
func TestFLOPsMatchesMegatronReferenceValues(t *testing.T) {
	cases := []struct {
		name string
		cfg  gpt.Config
		b, s int
		want float64
	}{
		{"gpt2-124M", gpt.Config{NumLayers: 12, HiddenSize: 768, NumAttentionHeads: 12, VocabSize: 50304, MaxPositionEmbeddings: 1024}, 1, 1024, 8.171846e11},
		{"gpt3-175B", gpt.Config{NumLayers: 96, HiddenSize: 12288, NumAttentionHeads: 96, VocabSize: 51200, MaxPositionEmbeddings: 2048}, 1, 2048, 2.174868e15},
		{"llama2-7B", gpt.Config{NumLayers: 32, HiddenSize: 4096, NumAttentionHeads: 32, FFNHiddenSize: 11008, Activation: gpt.SwiGLU, VocabSize: 32000, MaxPositionEmbeddings: 4096}, 1, 4096, 1.755697e14},
		{"llama3-8B", gpt.Config{NumLayers: 32, HiddenSize: 4096, NumAttentionHeads: 32, NumQueryGroups: 8, FFNHiddenSize: 14336, Activation: gpt.SwiGLU, VocabSize: 128256, MaxPositionEmbeddings: 8192}, 1, 8192, 4.216455e14},
		{"readme-177B", gpt.Config{NumLayers: 96, HiddenSize: 12288, NumAttentionHeads: 96, VocabSize: 131072, MaxPositionEmbeddings: 4096}, 1152, 4096, 5.107082e18},
	}
	for _, c := range cases {
		if err := c.cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		got := FLOPsPerIteration(c.cfg, c.b, c.s)
		if math.Abs(got-c.want) > 5e-7*c.want {
			t.Errorf("%s: %.7g FLOPs, want %.7g", c.name, got, c.want)
		}
	}
}
