package gpt

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
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
			MaxPositionEmbeddings: 16, DisableBiasLinear: true, AddQKVBias: true, KVChannels: 16, PositionEmbeddingType: NoPositionEmbedding},
		"untied rope swiglu": {NumLayers: 1, HiddenSize: 32, NumAttentionHeads: 4, VocabSize: 64, MaxPositionEmbeddings: 16,
			PositionEmbeddingType: RoPE, Activation: SwiGLU, FFNHiddenSize: 40, UntieEmbeddingsAndOutputWeights: true},
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

// TestEnumsText: the enums marshal as Megatron's spellings (the JSON
// checkpoints record), read them and the empty string (the zero value)
// back, and refuse anything else naming the flag.
func TestEnumsText(t *testing.T) {
	c := Config{PositionEmbeddingType: RoPE, Normalization: RMSNorm, Activation: SwiGLU}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"PositionEmbeddingType":"rope"`, `"Normalization":"RMSNorm"`, `"Activation":"swiglu"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s does not contain %s", b, want)
		}
	}
	var back Config
	if err := json.Unmarshal(b, &back); err != nil || back != c {
		t.Errorf("round trip: %+v, %v; want %+v", back, err, c)
	}
	zero := Config{NumLayers: 1}
	if err := json.Unmarshal([]byte(`{"PositionEmbeddingType":"","Normalization":"","Activation":""}`), &zero); err != nil ||
		zero.PositionEmbeddingType != LearnedAbsolute || zero.Normalization != LayerNorm || zero.Activation != GELU {
		t.Errorf("empty strings: %+v, %v; want the zero values", zero, err)
	}
	bad := map[string]string{
		`{"Normalization":"LayerNorm1P"}`:  `--normalization="LayerNorm1P": want LayerNorm or RMSNorm`,
		`{"PositionEmbeddingType":"yarn"}`: `--position-embedding-type="yarn": want learned_absolute, rope or none`,
		`{"Activation":"relu"}`:            `activation "relu": want gelu, gelu_tanh, swiglu or squared_relu`,
	}
	for in, want := range bad {
		if err := json.Unmarshal([]byte(in), &back); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", in, err, want)
		}
	}
	for _, v := range []fmt.Stringer{GELU, GELUTanh, SwiGLU, SquaredReLU, LayerNorm, RMSNorm, LearnedAbsolute, RoPE, NoPositionEmbedding} {
		var err error
		switch v := v.(type) {
		case Activation:
			var got Activation
			if got, err = ParseActivation(v.String()); got != v {
				t.Errorf("ParseActivation(%q) = %v", v, got)
			}
		case Normalization:
			var got Normalization
			if got, err = ParseNormalization(v.String()); got != v {
				t.Errorf("ParseNormalization(%q) = %v", v, got)
			}
		case PositionEmbeddingType:
			var got PositionEmbeddingType
			if got, err = ParsePositionEmbeddingType(v.String()); got != v {
				t.Errorf("ParsePositionEmbeddingType(%q) = %v", v, got)
			}
		}
		if err != nil {
			t.Error(err)
		}
	}
}

// TestEnumFlags: Normalization and PositionEmbeddingType are flag.Values,
// and Validate refuses values outside the enums.
func TestEnumFlags(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var c Config
	fs.Var(&c.Normalization, "normalization", "")
	fs.Var(&c.PositionEmbeddingType, "position-embedding-type", "")
	if err := fs.Parse([]string{"--normalization", "RMSNorm", "--position-embedding-type=none"}); err != nil {
		t.Fatal(err)
	}
	if c.Normalization != RMSNorm || c.PositionEmbeddingType != NoPositionEmbedding {
		t.Errorf("parsed %v, %v", c.Normalization, c.PositionEmbeddingType)
	}
	err := fs.Parse([]string{"--normalization", "rmsnorm"})
	if err == nil || !strings.Contains(err.Error(), "-normalization: want LayerNorm or RMSNorm") {
		t.Errorf("error %v does not name the flag and the choices", err)
	}
	for _, mutate := range []func(*Config){
		func(c *Config) { c.Activation = 4 }, // one past SquaredReLU
		func(c *Config) { c.Normalization = 2 },
		func(c *Config) { c.PositionEmbeddingType = 3 },
	} {
		c := Config{NumLayers: 1, HiddenSize: 8, NumAttentionHeads: 2, VocabSize: 8, MaxPositionEmbeddings: 4}
		mutate(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "(4)") && !strings.Contains(err.Error(), "(3)") && !strings.Contains(err.Error(), "(2)") {
			t.Errorf("Validate of %+v: %v", c, err)
		}
	}
}
