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
		// multi-latent attention: the MLA configs' model (test_gpt3_mcore_te_tp2_pp2_mla) and one
		// without --q-lora-rank, Megatron's values from its function run out of tree
		{"mla-config", gpt.Config{NumLayers: 4, HiddenSize: 512, NumAttentionHeads: 8, VocabSize: 50304, MaxPositionEmbeddings: 1024,
			MLA: mlaDims(192, 64, 16, 8, 16)}, 32, 1024, 7041800208384},
		{"mla-plain-q-swiglu", gpt.Config{NumLayers: 2, HiddenSize: 256, NumAttentionHeads: 4, FFNHiddenSize: 512, Activation: gpt.SwiGLU,
			VocabSize: 1024, MaxPositionEmbeddings: 128, MLA: mlaDims(0, 32, 32, 16, 48)}, 4, 128, 4114808832},
		// the hybrid gated delta net model: the gdn configs' (test_gpt3_mcore_te_tp2_pp1_gdn), a tiny
		// dense one, and output-gated attention alone; Megatron's values from its
		// num_floating_point_operations run out of tree (tools/golden/megatron_flops_gdn.py)
		{"gdn-config", gpt.Config{NumLayers: 6, HiddenSize: 512, NumAttentionHeads: 8, NumQueryGroups: 2, Activation: gpt.SwiGLU, DisableBiasLinear: true,
			VocabSize: 50304, MaxPositionEmbeddings: 1024, AttentionOutputGate: true,
			GDN: gpt.GDNConfig{Enabled: true, LinearAttentionFreq: "3", ConvKernel: 4, KeyHeadDim: 64, ValueHeadDim: 64, NumKeyHeads: 4, NumValueHeads: 8},
			MoE: gpt.MoEConfig{NumExperts: 32, TopK: 8, FFNHiddenSize: 64, SharedExpertFFN: 64, SharedExpertGate: true}}, 32, 1024, 7611755790336},
		{"gdn-tiny-dense", gpt.Config{NumLayers: 4, HiddenSize: 32, NumAttentionHeads: 4, NumQueryGroups: 2, KVChannels: 8, FFNHiddenSize: 48,
			Activation: gpt.SwiGLU, VocabSize: 64, MaxPositionEmbeddings: 16, AttentionOutputGate: true,
			GDN: gpt.GDNConfig{Enabled: true, LinearAttentionFreq: "2", ConvKernel: 4, KeyHeadDim: 4, ValueHeadDim: 6, NumKeyHeads: 2, NumValueHeads: 4}}, 8, 16, 28655616},
		{"gated-attention", gpt.Config{NumLayers: 2, HiddenSize: 64, NumAttentionHeads: 4, FFNHiddenSize: 256, VocabSize: 128,
			MaxPositionEmbeddings: 32, AttentionOutputGate: true}, 4, 32, 91226112},
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

// mlaDims is Megatron's command-line MLA with the given dimensions.
func mlaDims(qLora, kvLora, qk, pe, v int) gpt.MLAConfig {
	m := gpt.DefaultMLA()
	m.QLoraRank, m.KVLoraRank, m.QKHeadDim, m.QKPosEmbHeadDim, m.VHeadDim = qLora, kvLora, qk, pe, v
	return m
}
