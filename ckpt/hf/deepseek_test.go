package hf

import (
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// TestDeepSeekImportErrors: DeepSeek configs gotron cannot compute as
// transformers does are refused with the config.json field named.
func TestDeepSeekImportErrors(t *testing.T) {
	const v3, v2 = "deepseek_v3_untied_f32", "deepseek_v2_tied_f32"
	cases := []struct {
		name, fixture, old, new, want string
	}{
		{"kv heads", v3, `"num_key_value_heads": 4`, `"num_key_value_heads": 2`, "num_key_value_heads=2: DeepSeek's multi-latent attention has one key and value per head"},
		{"attention bias", v3, `"attention_bias": false`, `"attention_bias": true`, "attention_bias or mlp_bias true"},
		{"eps", v3, `"rms_norm_eps": 1e-06`, `"rms_norm_eps": 1e-05`, "rms_norm_eps=1e-05: gotron normalises every layer with one ε"},
		{"rotate half", v3, `"rope_interleave": true`, `"rope_interleave": false`, "rope_interleave=false: not supported"},
		{"missing shape", v3, `"kv_lora_rank": 10,`, ``, "kv_lora_rank: missing"},
		{"missing q_lora_rank", v3, `"q_lora_rank": 12,`, ``, "q_lora_rank: missing (null for a plain query projection)"},
		{"bad q_lora_rank", v3, `"q_lora_rank": 12`, `"q_lora_rank": "x"`, "q_lora_rank \"x\": want an integer or null"},
		{"zero v head", v3, `"v_head_dim": 5`, `"v_head_dim": 0`, "v_head_dim: 0 is out of range"},
		{"scoring", v3, `"scoring_func": "sigmoid"`, `"scoring_func": "softmax"`, `scoring_func "softmax": transformers' DeepSeek-V3 routes by sigmoid`},
		{"v3 method", v3, `"topk_method": "noaux_tc"`, `"topk_method": "greedy"`, `topk_method "greedy": transformers' DeepSeek-V3 routes by noaux_tc`},
		{"v3 not renormalised", v3, `"norm_topk_prob": true`, `"norm_topk_prob": false`, "norm_topk_prob=false with num_experts_per_tok=4"},
		{"group ranking", v3, `"topk_group": 2`, `"topk_group": 1`, "want num_experts_per_tok = 2·topk_group"},
		{"groups of one", v3, `"n_group": 4`, `"n_group": 8`, "want groups of at least 2 experts"},
		{"top-k above experts", v3, `"num_experts_per_tok": 4`, `"num_experts_per_tok": 9`, "num_experts_per_tok=9: want at most n_routed_experts=8"},
		{"rope type", v3, `"type": "yarn"`, `"type": "linear"`, "want rope_type yarn (DeepSeek's) or null"},
		{"rope key", v3, `"type": "yarn"`, `"type": "yarn", "attention_factor": 1.2`, "rope_scaling.attention_factor: not supported"},
		{"factor versions", v3, `"factor": 4.0`, `"factor": 8.0`, "rope_scaling.factor=8 with max_position_embeddings/original_max_position_embeddings = 128/32 = 4"},
		{"mscale_all_dim alone", v3, `"mscale": 0.9`, `"mscale": 0`, "mscale_all_dim=0.7 without mscale: not supported"},
		{"truncate", v3, `"type": "yarn"`, `"type": "yarn", "truncate": false`, "truncate=false: not supported"},
		{"layer freq", v2, `"moe_layer_freq": 1`, `"moe_layer_freq": 2`, "moe_layer_freq=2: not supported"},
		{"v2 renormalised", v2, `"norm_topk_prob": false`, `"norm_topk_prob": true`, "norm_topk_prob=true: not supported for deepseek_v2"},
		{"v2 method", v2, `"topk_method": "greedy"`, `"topk_method": "noaux_tc"`, `topk_method "noaux_tc": want greedy or group_limited_greedy`},
		{"v2 groups", v2, `"topk_method": "greedy"`, `"topk_method": "group_limited_greedy"`, "group_limited_greedy: n_group and topk_group are required"},
		{"v2 group ranking", v2, `"n_group": null`, `"n_group": 3|"topk_group": null|"topk_group": 1|"topk_method": "greedy"|"topk_method": "group_limited_greedy"`, "group_limited_greedy with num_experts_per_tok=2 and topk_group=1"},
		{"v2 mscales", v2, `"mscale": 0.707`, `"mscale": 0.5`, "mscale=0.5 mscale_all_dim=0.707: not supported for deepseek_v2"},
		{"tensor shapes", v3, `"qk_rope_head_dim": 8`, `"qk_rope_head_dim": 6`, "q_b_proj.weight has shape [56 12], config.json implies [48 12]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyFixture(t, c.fixture)
			// new may go on with more old|new pairs
			editConfig(t, dir, append([]string{c.old}, strings.Split(c.new, "|")...)...)
			wantImportError(t, dir, c.want)
		})
	}
}

// TestDeepSeekExportWithoutInfo: MLA models never imported export as
// DeepSeek-V3 (dense, or sigmoid routing with the expert bias) or
// DeepSeek-V2 (softmax routing, top-k not renormalised) and import back to
// the same config, weights and expert biases; a second export is
// byte-identical. Settings neither has are refused by name.
func TestDeepSeekExportWithoutInfo(t *testing.T) {
	dense := gpt.Config{NumLayers: 3, HiddenSize: 16, NumAttentionHeads: 4, FFNHiddenSize: 24, VocabSize: 128,
		MaxPositionEmbeddings: 64, PositionEmbeddingType: gpt.NoPositionEmbedding, Normalization: gpt.RMSNorm, NormEpsilon: 1e-6,
		Activation: gpt.SwiGLU, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true, RotaryBase: 10000, MLA: gpt.DefaultMLA(), QKLayerNorm: true}
	dense.MLA.QLoraRank, dense.MLA.KVLoraRank, dense.MLA.QKHeadDim, dense.MLA.QKPosEmbHeadDim, dense.MLA.VHeadDim = 8, 6, 4, 4, 6
	dense.MLA.ScalingFactor, dense.MLA.OriginalMaxPositions, dense.MLA.Mscale, dense.MLA.MscaleAllDim = 4, 16, 0.8, 0.6
	v3 := dense
	v3.MoE = gpt.MoEConfig{NumExperts: 8, TopK: 4, FFNHiddenSize: 8, LayerFreq: "[0,1,1]", Score: gpt.ScoreSigmoid, ExpertBias: true,
		NumGroups: 4, GroupTopK: 2, TopKScalingFactor: 2.5, SharedExpertFFN: 16, GroupedGEMM: true}
	v2 := dense
	v2.MLA.QLoraRank, v2.MLA.Mscale, v2.MLA.MscaleAllDim = 0, 0, 0
	v2.MoE = gpt.MoEConfig{NumExperts: 6, TopK: 2, FFNHiddenSize: 8, LayerFreq: "[0,0,1]", PreSoftmax: true, TopKScalingFactor: 1.5,
		SharedExpertFFN: 8, GroupedGEMM: true}
	plain := dense
	plain.MLA.Rope, plain.MLA.ScalingFactor, plain.MLA.Mscale, plain.MLA.MscaleAllDim = gpt.PlainRoPE, 1, 1, 0
	for _, tc := range []struct {
		name string
		c    gpt.Config
		arch string
	}{{"dense", dense, ArchDeepSeekV3}, {"v3", v3, ArchDeepSeekV3}, {"v2", v2, ArchDeepSeekV2}, {"plain rope", plain, ArchDeepSeekV3}} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := gpt.New(tc.c, tensor.NewRNG(3))
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range m.Buffers() { // a trained expert bias
				for i := range b.Float32s() {
					b.Float32s()[i] = 0.01 * float32(i+1)
				}
			}
			back := exportRoundTrip(t, m, tc.arch, sameDeepSeek)
			sameWeights(t, m, back, true)
		})
	}
	wantArchOfRefusals(t, v3, []archRefusal{
		{func(c *gpt.Config) { c.Normalization = gpt.LayerNorm }, "DeepSeek-V2/V3 want RMSNorm"},
		{func(c *gpt.Config) { c.PositionEmbeddingType = gpt.LearnedAbsolute }, "learned_absolute: DeepSeek-V2/V3 have no position table"},
		{func(c *gpt.Config) { c.NormEpsilon = 1e-5 }, "--norm-epsilon 1e-05"},
		{func(c *gpt.Config) { c.MoE.ExpertBias = false }, "DeepSeek-V3 routes by sigmoid with e_score_correction_bias"},
		{func(c *gpt.Config) { c.MoE.GroupTopK = 4 }, "want top-k = 2 × group top-k"},
		{func(c *gpt.Config) { c.MoE.LayerFreq = "[1,0,1]" }, "dense up to first_k_dense_replace"},
		{func(c *gpt.Config) { c.MoE.SharedExpertFFN = 12 }, "n_shared_experts × moe_intermediate_size"},
		{func(c *gpt.Config) { c.MoE.SharedExpertGate = true }, "DeepSeek's shared experts are not gated"},
		{func(c *gpt.Config) { c.MaxPositionEmbeddings = 128 }, "YaRN factor 4 with --max-position-embeddings 128 over YaRN's 16 original positions"},
		{func(c *gpt.Config) { c.MLA.Mscale = 0 }, "--mscale 0 --mscale-all-dim 0.6"},
	})
	wantArchOfRefusals(t, v2, []archRefusal{
		{func(c *gpt.Config) { c.MoE.PreSoftmax = false }, "DeepSeek-V2 keeps softmax's top-k unnormalised"},
	})
}
