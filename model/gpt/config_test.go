package gpt

import (
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// TestValidateRejectsBadFlags checks that every out-of-range field is refused
// with an error naming its flag, before any tensor is shaped from it (a
// negative size used to panic in tensor.numel or Reshape).
func TestValidateRejectsBadFlags(t *testing.T) {
	base := func() Config {
		return Config{NumLayers: 2, HiddenSize: 64, NumAttentionHeads: 4, VocabSize: 128, MaxPositionEmbeddings: 32}
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string // substring of the error
	}{
		{"negative ffn", func(c *Config) { c.FFNHiddenSize = -1 }, "--ffn-hidden-size=-1"},
		{"negative kv-channels", func(c *Config) { c.KVChannels = -1 }, "--kv-channels=-1"},
		{"negative query groups", func(c *Config) { c.NumQueryGroups = -1 }, "--num-query-groups=-1"},
		{"negative norm epsilon", func(c *Config) { c.NormEpsilon = -1 }, "--norm-epsilon=-1"},
		{"NaN norm epsilon", func(c *Config) { c.NormEpsilon = float32(math.NaN()) }, "--norm-epsilon=NaN"},
		{"negative init std", func(c *Config) { c.InitMethodStd = -0.02 }, "--init-method-std=-0.02"},
		{"negative rotary base", func(c *Config) { c.RotaryBase = -1 }, "--rotary-base=-1"},
		{"negative rotary percent", func(c *Config) { c.RotaryPercent = -0.5 }, "--rotary-percent=-0.5"},
		{"NaN dropout", func(c *Config) { c.HiddenDropout = float32(math.NaN()) }, "--hidden-dropout=NaN"},
		{"more groups than heads", func(c *Config) { c.NumQueryGroups = 8 }, "--num-query-groups=8"},
		{"zero layers", func(c *Config) { c.NumLayers = 0 }, "--num-layers=0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.mutate(&c)
			err := c.Validate()
			if err == nil {
				t.Fatalf("Validate accepted %+v", c)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not name %q", err, tt.want)
			}
		})
	}
}

// TestValidateAcceptsPresets checks that the zero values documented as
// defaults still validate and are filled in.
func TestValidateAcceptsPresets(t *testing.T) {
	for _, name := range []string{"tiny", "gpt2-small", "gpt2-medium", "llama-tiny"} {
		c, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("preset %s: %v", name, err)
		}
		if c.NormEpsilon != 1e-5 || c.InitMethodStd != 0.02 || c.FFNHiddenSize == 0 || c.KVChannels == 0 {
			t.Errorf("preset %s: defaults not filled: %+v", name, c)
		}
	}
}

// TestParamCountMatchesNew: the count computed without allocating equals
// the allocated model's, for the presets' layouts and the optional pieces.
func TestParamCountMatchesNew(t *testing.T) {
	configs := map[string]Config{
		"qkv bias only": {NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, NumQueryGroups: 2, VocabSize: 64,
			MaxPositionEmbeddings: 16, DisableBiasLinear: true, AddQKVBias: true, KVChannels: 16, PositionEmbeddingType: "none"},
		"untied rope swiglu": {NumLayers: 1, HiddenSize: 32, NumAttentionHeads: 4, VocabSize: 64, MaxPositionEmbeddings: 16,
			PositionEmbeddingType: "rope", Activation: "swiglu", FFNHiddenSize: 40, UntieEmbeddingsAndOutputWeights: true},
	}
	for _, name := range []string{"tiny", "llama-tiny"} {
		p, err := Preset(name)
		if err != nil {
			t.Fatal(err)
		}
		p.VocabSize, p.NumLayers = 64, 1 // small: the test allocates it
		configs[name] = p
	}
	for name, c := range configs {
		m, err := New(c, tensor.NewRNG(1))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got, want := m.Config.ParamCount(), float64(m.NumParams()); got != want {
			t.Errorf("%s: ParamCount %v, NumParams %v", name, got, want)
		}
	}
}
