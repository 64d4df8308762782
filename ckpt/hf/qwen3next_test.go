package hf

import (
	"context"
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// TestQwen3NextImportErrors: Qwen3-Next configs gotron cannot compute as
// transformers does are refused with the config.json field named.
func TestQwen3NextImportErrors(t *testing.T) {
	const fx = "qwen3_next_untied_f32"
	cases := []struct {
		name, old, new, want string
	}{
		{"missing linear dim", `"linear_key_head_dim": 8,`, ``, "linear_key_head_dim: missing"},
		{"missing head_dim", `"head_dim": 16,`, ``, "head_dim: missing"},
		{"value heads", `"linear_num_value_heads": 4`, `"linear_num_value_heads": 3`, "linear_num_value_heads=3: want a multiple of linear_num_key_heads=2"},
		{"layer kind", `"full_attention",
    "linear_attention"`, `"sliding_attention",
    "linear_attention"`, `layer_types[1] "sliding_attention": want linear_attention or full_attention`},
		{"layer count", `"full_attention",
    "linear_attention",`, ``, "layer_types has 2 entries: want num_hidden_layers=4"},
		{"odd rotary", `"partial_rotary_factor": 0.25`, `"partial_rotary_factor": 0.1875`, "partial_rotary_factor=0.1875 with head_dim=16 rotates 3 channels"},
		{"rope scaling", `"rope_scaling": null`, `"rope_scaling": {"rope_type": "yarn", "factor": 4}`, "rope_scaling {\"rope_type\": \"yarn\", \"factor\": 4}: not supported"},
		{"attention bias", `"attention_bias": false`, `"attention_bias": true`, "attention_bias=true: not supported"},
		{"activation", `"hidden_act": "silu"`, `"hidden_act": "gelu"`, `hidden_act "gelu": want silu`},
		{"no shared expert", `"shared_expert_intermediate_size": 20`, `"shared_expert_intermediate_size": 0`, "shared_expert_intermediate_size: 0 is out of range"},
		{"top-k", `"num_experts_per_tok": 2`, `"num_experts_per_tok": 7`, "num_experts_per_tok=7: want at most num_experts=6"},
		{"missing num_experts", `"num_experts": 6,`, ``, "num_experts: missing (0 for a dense model)"},
		{"tensor shapes", `"linear_value_head_dim": 6`, `"linear_value_head_dim": 5`, "in_proj_qkvz.weight has shape [80 32], config.json implies [72 32]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyFixture(t, fx)
			editConfig(t, dir, c.old, c.new)
			wantImportError(t, dir, c.want)
		})
	}
}

// TestQwen3NextExportWithoutInfo: gated delta net models never imported
// export as Qwen3-Next (with MoE and a gated shared expert, or dense) and
// import back to the same config, weights and logits; a second export is
// byte-identical. Settings Qwen3-Next does not have are refused by name.
func TestQwen3NextExportWithoutInfo(t *testing.T) {
	dense := gpt.Config{NumLayers: 3, HiddenSize: 16, NumAttentionHeads: 4, NumQueryGroups: 2, KVChannels: 8,
		FFNHiddenSize: 24, VocabSize: 128, MaxPositionEmbeddings: 64, PositionEmbeddingType: gpt.RoPE, RotaryPercent: 0.5,
		Normalization: gpt.RMSNorm, NormEpsilon: 1e-6, LayerNorm1P: true, QKLayerNorm: true, AttentionOutputGate: true,
		Activation: gpt.SwiGLU, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true, RotaryBase: 10000,
		GDN: gpt.GDNConfig{Enabled: true, LinearAttentionFreq: "[1,0,1]", ConvKernel: 3, KeyHeadDim: 4, ValueHeadDim: 6,
			NumKeyHeads: 1, NumValueHeads: 2}}
	moe := dense
	moe.GDN.LinearAttentionFreq = "3"
	moe.MoE = gpt.MoEConfig{NumExperts: 4, TopK: 2, FFNHiddenSize: 8, LayerFreq: "[1,0,1]", SharedExpertFFN: 12,
		SharedExpertGate: true, GroupedGEMM: true}
	for _, tc := range []struct {
		name string
		c    gpt.Config
	}{{"dense", dense}, {"moe", moe}} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := gpt.New(tc.c, tensor.NewRNG(5))
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range m.Params() { // trained norms: γ ≠ 0 (multiples of 2⁻⁶, exact through 1 + γ)
				if strings.HasSuffix(p.Name, "norm.weight") {
					for i := range p.Float32s() {
						p.Float32s()[i] = float32(i%7-3) / 64
					}
				}
			}
			back := exportRoundTrip(t, m, ArchQwen3Next, sameQwen3Next)
			sameWeights(t, m, back, true)
		})
	}
	wantArchOfRefusals(t, moe, []archRefusal{
		{func(c *gpt.Config) { c.GDN = gpt.GDNConfig{} }, "gated delta net false, attention output gate true: Qwen3-Next has both"},
		{func(c *gpt.Config) { c.AttentionOutputGate = false }, "gated delta net true, attention output gate false"},
		{func(c *gpt.Config) { c.LayerNorm1P = false }, "Qwen3-Next wants RMSNorm with --apply-layernorm-1p and --qk-layernorm"},
		{func(c *gpt.Config) { c.QKLayerNorm = false }, "Qwen3-Next wants RMSNorm with --apply-layernorm-1p and --qk-layernorm"},
		{func(c *gpt.Config) { c.RotaryInterleaved = true }, "Qwen3-Next wants rope rotating halves"},
		{func(c *gpt.Config) { c.MoE.SharedExpertGate = false }, "shared expert 12, gate false"},
		{func(c *gpt.Config) { c.MoE.Score = gpt.ScoreSigmoid }, "Qwen3-Next routes by softmax top-k"},
	})
}

// TestQwen3NextConfigForms: the fixture's config.json written without
// layer_types (full_attention_interval alone) or in transformers 5's form
// (rope_parameters holding rope_theta and partial_rotary_factor, dtype)
// imports to the same model and logits.
func TestQwen3NextConfigForms(t *testing.T) {
	const fx = "qwen3_next_untied_f32"
	ref, _, err := LoadModel(fixtureDir(fx))
	if err != nil {
		t.Fatal(err)
	}
	ids := []int32{3, 17, 42, 99, 5}
	want := forward(ref, ids)
	for name, edits := range map[string][]string{
		"interval": {`"layer_types": [
    "linear_attention",
    "full_attention",
    "linear_attention",
    "full_attention"
  ],`, ``},
		"transformers 5": {`"partial_rotary_factor": 0.25,`, ``, `"rope_theta": 10000.0,`, `"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},`,
			`"torch_dtype": "float32"`, `"dtype": "float32"`},
	} {
		t.Run(name, func(t *testing.T) {
			dir := copyFixture(t, fx)
			editConfig(t, dir, edits...)
			m, info, err := LoadModel(dir)
			if err != nil {
				t.Fatal(err)
			}
			if !sameArch(m.Config, ref.Config) || !sameQwen3Next(m.Config, ref.Config) {
				t.Fatalf("config %+v, want %+v", m.Config, ref.Config)
			}
			got := forward(m, ids)
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("logit %d: %g, want %g", i, got[i], want[i])
				}
			}
			out := t.TempDir()
			if err := Export(context.Background(), out, m, info, ExportOptions{}); err != nil {
				t.Fatal(err)
			}
			CompareHFDirs(t, dir, out)
		})
	}
}
