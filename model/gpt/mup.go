package gpt

import (
	"fmt"
	"math"
)

// MuPConfig is Megatron's maximal update parametrisation (--use-mup,
// TransformerConfig's mup_* fields and __post_init__): with a width
// multiplier m = HiddenSize/BaseHiddenSize, hidden matrices start with
// std/√m (output projections std/(√(2L)·√m)), embeddings and an untied
// output layer keep std, attention scales q·k by √BaseHeadDim/d^AttnScalePower
// instead of 1/√d, logits are multiplied by OutputMult (1/m unless set) and
// embeddings by EmbeddingMult. The optimizer side (Adam's lr and ε of hidden
// matrices divided by m) lives in package train. The zero value is off; a
// zero field means Megatron's default.
type MuPConfig struct {
	Enabled bool // --use-mup
	// BaseHiddenSize (--mup-base-hidden-size) is the proxy model's width;
	// 0 means HiddenSize (m = 1).
	BaseHiddenSize int
	// EmbeddingMult (--mup-embedding-mult) multiplies the embeddings'
	// output; 0 means 1.
	EmbeddingMult float64
	// OutputMult (--mup-output-mult) multiplies the logits; 0 (or 1, as
	// Megatron, which cannot tell 1 from its default) means 1/m.
	OutputMult float64
	// BaseHeadDim (--mup-base-head-dim): the attention scale's numerator is
	// its square root; 0 means Megatron's None (numerator 1).
	BaseHeadDim float64
	// AttnScalePower (--mup-attn-scale-power): the attention scale divides
	// by KVChannels to this power; 0 means 1 (Megatron's default; a power
	// of exactly 0 cannot be asked for).
	AttnScalePower float64
}

func (c *MuPConfig) validate(cfg *Config) error {
	if !c.Enabled {
		// Megatron's defaults (1.0) or zero are "not set"; anything else
		// would be ignored, as Megatron ignores it without use_mup.
		for _, f := range []struct {
			flag string
			v    float64
		}{{"--mup-embedding-mult", c.EmbeddingMult}, {"--mup-output-mult", c.OutputMult}, {"--mup-attn-scale-power", c.AttnScalePower}} {
			if f.v != 0 && f.v != 1 {
				return fmt.Errorf("gpt: %s=%g without --use-mup: it has no effect then (set --use-mup or drop it)", f.flag, f.v)
			}
		}
		if c.BaseHiddenSize != 0 || c.BaseHeadDim != 0 {
			return fmt.Errorf("gpt: --mup-base-hidden-size or --mup-base-head-dim without --use-mup: no effect then (set --use-mup or drop it)")
		}
		*c = MuPConfig{}
		return nil
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case c.BaseHiddenSize < 0:
		return fmt.Errorf("gpt: --mup-base-hidden-size=%d: want > 0", c.BaseHiddenSize)
	case !(c.EmbeddingMult >= 0) || !finite(c.EmbeddingMult):
		return fmt.Errorf("gpt: --mup-embedding-mult=%g: want a finite value > 0", c.EmbeddingMult)
	case !(c.OutputMult >= 0) || !finite(c.OutputMult):
		return fmt.Errorf("gpt: --mup-output-mult=%g: want a finite value > 0", c.OutputMult)
	case !(c.BaseHeadDim >= 0) || !finite(c.BaseHeadDim):
		return fmt.Errorf("gpt: --mup-base-head-dim=%g: want a finite value > 0", c.BaseHeadDim)
	case !(c.AttnScalePower >= 0) || !finite(c.AttnScalePower):
		return fmt.Errorf("gpt: --mup-attn-scale-power=%g: want a finite value > 0", c.AttnScalePower)
	case cfg.MoE.Enabled(), cfg.MLA.Enabled, cfg.GDN.Enabled:
		// Megatron's muP also rescales the routers', experts', MLA's and
		// GDN's initialisation and MLA's own softmax scale; not built here.
		return fmt.Errorf("gpt: --use-mup with MoE, MLA or gated delta net layers is not built in gotron (dense attention models only)")
	}
	if c.BaseHiddenSize == 0 {
		c.BaseHiddenSize = cfg.HiddenSize
	}
	if c.EmbeddingMult == 0 {
		c.EmbeddingMult = 1
	}
	if c.AttnScalePower == 0 {
		c.AttnScalePower = 1
	}
	if c.OutputMult == 0 {
		c.OutputMult = 1 // Megatron's default: 1/m at use (LogitMult)
	}
	return nil
}

// WidthMult is Megatron's mup_width_mult: HiddenSize/BaseHiddenSize with
// muP, else 1.
func (c *Config) WidthMult() float64 {
	if !c.MuP.Enabled || c.MuP.BaseHiddenSize == 0 {
		return 1
	}
	return float64(c.HiddenSize) / float64(c.MuP.BaseHiddenSize)
}

// SoftmaxScale is the factor multiplying q·k in attention: muP's
// √BaseHeadDim / KVChannels^AttnScalePower, else 0 (the kernel's
// 1/√KVChannels).
func (c *Config) SoftmaxScale() float32 {
	if !c.MuP.Enabled {
		return 0
	}
	num := 1.0
	if c.MuP.BaseHeadDim > 0 {
		num = math.Sqrt(c.MuP.BaseHeadDim)
	}
	return float32(num / math.Pow(float64(c.KVChannels), c.MuP.AttnScalePower))
}

// LogitMult is muP's mup_output_mult: the factor on the logits (1 without
// muP; 1/WidthMult unless --mup-output-mult is set to other than 1).
func (c *Config) LogitMult() float64 {
	if !c.MuP.Enabled {
		return 1
	}
	if c.MuP.OutputMult != 0 && c.MuP.OutputMult != 1 {
		return c.MuP.OutputMult
	}
	if m := c.WidthMult(); m != 1 {
		return 1 / m
	}
	return 1
}

// EmbeddingMult is muP's mup_embedding_mult (1 without muP).
func (c *Config) EmbeddingMult() float64 {
	if !c.MuP.Enabled || c.MuP.EmbeddingMult == 0 {
		return 1
	}
	return c.MuP.EmbeddingMult
}

// InitStds are the standard deviations New draws from, as Megatron's
// TransformerConfig.__post_init__ sets its init methods: Hidden for the
// input-side matrices (linear_qkv, linear_fc1; init_method), Output for the
// output projections (linear_proj, linear_fc2; output_layer_init_method),
// Embedding for the word and position tables (embedding_init_method) and
// OutputLayer for an untied output layer (embedding_init_method with muP,
// init_method without).
type InitStds struct {
	Hidden, Output, Embedding, OutputLayer float64
}

// InitStds computes the standard deviations in float64, as Python does,
// for a validated c.
func (c *Config) InitStds() InitStds {
	std := float64(c.InitMethodStd)
	m := c.WidthMult()
	depth := math.Sqrt(2 * float64(c.NumLayers))
	if !c.MuP.Enabled {
		return InitStds{Hidden: std, Output: std / depth, Embedding: std, OutputLayer: std}
	}
	return InitStds{Hidden: std / math.Sqrt(m), Output: std / (depth * math.Sqrt(m)), Embedding: std, OutputLayer: std}
}
