package hf

import (
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// TestMoEImportErrors: MoE configs gotron cannot represent are refused
// with the config.json field named.
func TestMoEImportErrors(t *testing.T) {
	cases := []struct {
		name, fixture, old, new, want string
	}{
		{"top-k above experts", "mixtral_gqa_untied_f32", `"num_experts_per_tok": 2`, `"num_experts_per_tok": 5`, "num_experts_per_tok=5: want at most num_local_experts=4"},
		{"qwen3 class for qwen2_moe", "qwen2_moe_untied_f32", `"Qwen2MoeForCausalLM"`, `"Qwen3MoeForCausalLM"`, `model_type "qwen2_moe" contradicts architectures ["Qwen3MoeForCausalLM"]`},
		{"qwen3 attention bias", "qwen3_moe_untied_f32", `"attention_bias": false`, `"attention_bias": true`, "attention_bias or mlp_bias true"},
		{"qwen3 sliding window", "qwen3_moe_untied_f32", `"use_sliding_window": false`, `"use_sliding_window": true`, "use_sliding_window=true"},
		{"qwen3 shared expert", "qwen3_moe_untied_f32", `"num_experts": 6`, `"num_experts": 6, "shared_expert_intermediate_size": 8`, "shared_expert_intermediate_size=8: Qwen3-MoE has no shared expert"},
		{"qwen3 expert count alias", "qwen3_moe_untied_f32", `"num_experts": 6`, `"num_experts": 6, "num_local_experts": 4`, "num_experts=6 contradicts num_local_experts=4"},
		{"qwen3 top-k", "qwen3_moe_untied_f32", `"num_experts_per_tok": 2`, `"num_experts_per_tok": 7`, "num_experts_per_tok=7: want at most num_experts=6"},
		{"qwen3 head_dim", "qwen3_moe_untied_f32", `"head_dim": 16`, `"head_dim": 8`, "self_attn.q_proj.weight has shape [64 32], config.json implies [32 32]"},
		{"rope_parameters type", "qwen3_moe_step2_tied_f32", `"rope_type": "default"`, `"rope_type": "yarn"`, `rope_parameters.rope_type "yarn": not supported`},
		{"rope_parameters key", "qwen3_moe_step2_tied_f32", `"rope_type": "default"`, `"rope_type": "default", "factor": 4`, "rope_parameters.factor: not supported"},
		{"rope_parameters contradiction", "qwen3_moe_step2_tied_f32", `"rope_parameters": {`, `"rope_theta": 10000, "rope_parameters": {`, "rope_theta 10000 contradicts rope_parameters.rope_theta 500000"},
		{"zero experts", "qwen2_moe_untied_f32", `"num_experts": 6`, `"num_experts": 0`, "num_experts: 0 is out of range"},
		{"mlp_only_layers out of range", "qwen2_moe_untied_f32", "\"mlp_only_layers\": [\n    1\n  ]", `"mlp_only_layers": [7]`, "mlp_only_layers: layer 7 outside 0..2"},
		{"no sparse layer", "qwen2_moe_untied_f32", `"decoder_sparse_step": 1`, `"decoder_sparse_step": 4`, "leaves no sparse layer"},
		{"sliding window", "qwen2_moe_untied_f32", `"use_sliding_window": false`, `"use_sliding_window": true`, "use_sliding_window=true"},
		{"experts' tensors", "mixtral_gqa_untied_f32", `"num_local_experts": 4`, `"num_local_experts": 5`, "block_sparse_moe.gate.weight has shape [4 32], config.json implies [5 32]"},
		{"router shape", "qwen2_moe_untied_f32", `"moe_intermediate_size": 16`, `"moe_intermediate_size": 8`, "mlp.experts.0.gate_proj.weight has shape [16 32], config.json implies [8 32]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyFixture(t, c.fixture)
			editConfig(t, dir, c.old, c.new)
			wantImportError(t, dir, c.want)
		})
	}
}

// TestMoEExportWithoutInfo: MoE models never imported export as Mixtral,
// Qwen2-MoE or Qwen3-MoE (inferred from the config) and import back to the same
// config, weights and logits; a second export is byte-identical. Settings
// none of them has are refused by name.
func TestMoEExportWithoutInfo(t *testing.T) {
	base := gpt.Config{NumLayers: 3, HiddenSize: 16, NumAttentionHeads: 4, NumQueryGroups: 2, FFNHiddenSize: 24, VocabSize: 128,
		MaxPositionEmbeddings: 8, PositionEmbeddingType: gpt.RoPE, Normalization: gpt.RMSNorm, Activation: gpt.SwiGLU,
		DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true, RotaryBase: 1e6}
	mixtral := base
	mixtral.MoE = gpt.MoEConfig{NumExperts: 4, TopK: 2, FFNHiddenSize: 12}
	qwen := base
	qwen.AddQKVBias = true
	qwen.MoE = gpt.MoEConfig{NumExperts: 5, TopK: 2, FFNHiddenSize: 8, PreSoftmax: true, LayerFreq: "[0,1,1]",
		SharedExpertFFN: 20, SharedExpertGate: true, GroupedGEMM: true}
	qwen3 := base
	qwen3.QKLayerNorm, qwen3.KVChannels = true, 8
	qwen3.MoE = gpt.MoEConfig{NumExperts: 5, TopK: 3, FFNHiddenSize: 8, LayerFreq: "[1,0,1]"}
	for _, tc := range []struct {
		c    gpt.Config
		arch string
	}{{mixtral, ArchMixtral}, {qwen, ArchQwen2MoE}, {qwen3, ArchQwen3MoE}} {
		t.Run(tc.arch, func(t *testing.T) {
			m, err := gpt.New(tc.c, tensor.NewRNG(3))
			if err != nil {
				t.Fatal(err)
			}
			back := exportRoundTrip(t, m, tc.arch, nil)
			sameWeights(t, m, back, false) // names differ where the experts' naming does (grouped or not)
		})
	}
	wantArchOfRefusals(t, mixtral, []archRefusal{
		{func(c *gpt.Config) { c.MoE.Score = gpt.ScoreSigmoid }, "--moe-router-score-function sigmoid"},
		{func(c *gpt.Config) { c.MoE.CapacityFactor = 1 }, "--moe-expert-capacity-factor 1"},
		{func(c *gpt.Config) { c.MoE.LayerFreq = "[1,0,1]" }, "Mixtral's layers are all MoE"},
		{func(c *gpt.Config) { c.QKLayerNorm, c.MoE.SharedExpertFFN, c.MoE.SharedExpertGate = true, 8, true }, "Qwen3-MoE (the MoE model with q/k norms) has no shared expert"},
		{func(c *gpt.Config) { c.QKLayerNorm, c.AddQKVBias = true, true }, "--qk-layernorm with --add-qkv-bias"},
		{func(c *gpt.Config) { c.QKLayerNorm, c.LayerNorm1P = true, true }, "--apply-layernorm-1p"},
		{func(c *gpt.Config) { c.MoE.PreSoftmax = true }, "--moe-router-pre-softmax without a shared expert"},
		{func(c *gpt.Config) { c.MoE.SharedExpertFFN = 8 }, "without --moe-shared-expert-gate"},
		{func(c *gpt.Config) { c.MoE.SharedExpertFFN, c.MoE.SharedExpertGate = 8, true }, "without --add-qkv-bias"},
	})
}
