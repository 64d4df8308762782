package tensor

import "github.com/gotron/gotron/internal/cpu"

// RoPEStyle selects which dimensions of a head rotary embeddings rotate
// together.
type RoPEStyle int

const (
	// RotateHalf pairs dimension i with i+Dim/2 (GPT-NeoX, Llama, Megatron's
	// default rotate_half). It is the zero value.
	RotateHalf RoPEStyle = iota
	// Interleaved pairs dimensions (2i, 2i+1) (GPT-J, Megatron
	// --rotary-interleaved).
	Interleaved
)

// RoPEConfig configures rotary position embeddings.
type RoPEConfig struct {
	// Dim is the number of rotated dimensions at the start of each head
	// (kv_channels·rotary_percent); even, at most the head size.
	Dim int
	// Base is the theta base of the frequencies; 0 means 10000 (Megatron's
	// --rotary-base default).
	Base float64
	// MaxPositions is the number of positions the tables hold; positions
	// must be in [0, MaxPositions).
	MaxPositions int
	// Style is RotateHalf (the zero value) or Interleaved.
	Style RoPEStyle
	// InterpolationFactor divides positions before the angles are formed
	// (Megatron --rotary-seq-len-interpolation-factor); 0 means none.
	InterpolationFactor float64
	// Llama3, if non-nil, rescales the frequencies as Llama 3.1+ does
	// (Megatron --use-rope-scaling, Hugging Face rope_type "llama3").
	Llama3 *Llama3Scaling
	// Yarn, if non-nil, builds the tables as Megatron's YarnRotaryEmbedding
	// (multi-latent attention's rope_type "yarn"): blended frequencies, and
	// cos and sin multiplied by the concentration factor, so the rotation
	// also scales. At most one of Llama3 and Yarn.
	Yarn *YarnScaling
}

// YarnScaling holds YaRN's parameters (Megatron's MLATransformerConfig
// rotary_scaling_factor, original_max_position_embeddings, beta_fast,
// beta_slow, mscale, mscale_all_dim). Every field is used as given.
type YarnScaling = cpu.YarnScaling

// YarnMscale is Megatron's _yarn_get_mscale(scale, mscale): 1 for
// scale ≤ 1, else 0.1·mscale·ln(scale) + 1.
func YarnMscale(scale, mscale float64) float64 { return cpu.YarnMscale(scale, mscale) }

// Llama3Scaling holds the Llama-3.x frequency scaling; each zero field takes
// the Llama 3.1 default (Factor 8, LowFreqFactor 1, HighFreqFactor 4,
// OriginalMaxPositions 8192).
type Llama3Scaling struct {
	Factor, LowFreqFactor, HighFreqFactor float64
	OriginalMaxPositions                  int
}

// RoPE is a rotary position embedding with its cos/sin tables computed once
// (as Megatron's RotaryEmbedding, in float32). It is immutable and safe for
// concurrent use. A backend reads the tables through Tables; the CPU
// backend keeps its own kernel's form.
type RoPE struct {
	cfg      RoPEConfig
	cos, sin *Tensor // (MaxPositions, Dim/2)
	cpu      *cpu.RoPE
}

// NewRoPE builds the tables for cfg, or says which field is wrong.
func NewRoPE(cfg RoPEConfig) (*RoPE, error) {
	c := cpu.RoPEConfig{Dim: cfg.Dim, Base: cfg.Base, MaxPositions: cfg.MaxPositions,
		Style: cpu.RotateHalf, InterpolationFactor: cfg.InterpolationFactor}
	if cfg.Style == Interleaved {
		c.Style = cpu.Interleaved
	}
	if l := cfg.Llama3; l != nil {
		c.Llama3 = &cpu.Llama3Scaling{Factor: l.Factor, LowFreqFactor: l.LowFreqFactor,
			HighFreqFactor: l.HighFreqFactor, OriginalMaxPositions: l.OriginalMaxPositions}
	}
	if cfg.Yarn != nil {
		y := *cfg.Yarn
		c.Yarn = &y
	}
	r, err := cpu.NewRoPE(c)
	if err != nil {
		return nil, err
	}
	cfg.Base = r.Config().Base // the default filled in
	cos, sin := r.Tables()
	half := cfg.Dim / 2
	return &RoPE{cfg: cfg, cpu: r, cos: FromFloat32(cos, len(cos)/max(half, 1), half), sin: FromFloat32(sin, len(sin)/max(half, 1), half)}, nil
}

// Config returns the configuration the tables were built from, defaults
// filled in.
func (r *RoPE) Config() RoPEConfig { return r.cfg }

// Tables returns the cos and sin tables (MaxPositions, Dim/2): entry (p, i)
// is the rotation of pair i at position p. Do not modify them.
func (r *RoPE) Tables() (cos, sin *Tensor) { return r.cos, r.sin }
