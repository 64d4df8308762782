package gpt

import (
	"fmt"
	"math"
)

// Config describes a GPT-family model with Megatron's semantics. Zero values
// are Megatron's defaults where Megatron has one; every field names its flag.
type Config struct {
	NumLayers         int // --num-layers
	HiddenSize        int // --hidden-size
	NumAttentionHeads int // --num-attention-heads
	// NumQueryGroups (--num-query-groups with --group-query-attention) is the
	// number of key/value heads; 0 means NumAttentionHeads (no GQA).
	NumQueryGroups int
	// KVChannels (--kv-channels) is the head dimension; 0 means
	// HiddenSize/NumAttentionHeads.
	KVChannels int
	// FFNHiddenSize (--ffn-hidden-size); 0 means 4·HiddenSize.
	FFNHiddenSize int
	// VocabSize is the padded vocabulary: the rows of the embedding table
	// (see tokenizer.PaddedVocabSize).
	VocabSize int
	// MaxPositionEmbeddings (--max-position-embeddings) bounds sequence length
	// for learned positions and RoPE tables.
	MaxPositionEmbeddings int
	// PositionEmbeddingType (--position-embedding-type): LearnedAbsolute
	// (the zero value), RoPE or NoPositionEmbedding.
	PositionEmbeddingType PositionEmbeddingType
	RotaryBase            float64 // --rotary-base; 0 means 10000
	RotaryPercent         float64 // --rotary-percent; 0 means 1.0
	RotaryInterleaved     bool    // --rotary-interleaved: pairs (2i, 2i+1) instead of halves
	// Normalization (--normalization): LayerNorm (the zero value) or RMSNorm.
	Normalization Normalization
	NormEpsilon   float32 // --norm-epsilon; 0 means 1e-5
	// LayerNorm1P (--apply-layernorm-1p, Megatron's
	// layernorm_zero_centered_gamma): every norm scales by 1 + γ, and the
	// stored weight γ starts at zero. The function is the same as a plain
	// norm with weight 1 + γ; what differs is the parameter the optimizer
	// sees (weight decay, when applied to norms, pulls γ to 0, so the scale
	// to 1) and the checkpoint's values, which are Megatron's.
	LayerNorm1P bool
	// QKLayerNorm (--qk-layernorm) normalises each query and key head
	// before RoPE with the model's normalisation (Megatron's q_layernorm and
	// k_layernorm; 1 + γ with LayerNorm1P). With MLA it instead gives the
	// query and key-value latents their norms (q_layernorm, kv_layernorm),
	// which Megatron's MLA has only with --qk-layernorm.
	QKLayerNorm bool
	// Activation of the MLP: GELU (exact erf GELU, Megatron's default; the
	// zero value), GELUTanh (--openai-gelu, GPT-2's) or SwiGLU (--swiglu:
	// fc1 outputs [gate; up], 2·FFNHiddenSize rows).
	Activation Activation
	// DisableBiasLinear (--disable-bias-linear) drops the biases of every linear.
	DisableBiasLinear bool
	// AddQKVBias (--add-qkv-bias) keeps the QKV bias when DisableBiasLinear is set.
	AddQKVBias bool
	// AttentionDropout (--attention-dropout) drops attention probabilities
	// (after the softmax, before the product with v), as Megatron, inside
	// the fused attention kernel; see coreAttention for the masks' stream.
	AttentionDropout float32
	HiddenDropout    float32 // --hidden-dropout
	// UntieEmbeddingsAndOutputWeights (--untie-embeddings-and-output-weights)
	// gives the output layer its own weight; the zero value ties it to the
	// word embeddings.
	UntieEmbeddingsAndOutputWeights bool
	// InitMethodStd (--init-method-std); 0 means 0.02. Output projections use
	// std/sqrt(2·NumLayers), as Megatron's scaled_init_method_normal.
	InitMethodStd float32
	// AttentionOutputGate (--attention-output-gate) gates each attention
	// head's output by sigmoid of a projection of the layer's input, before
	// the output projection (Megatron's Attention._apply_output_gate): QKV
	// rows per query group become [q (r·d); gate (r·d); k (d); v (d)].
	AttentionOutputGate bool
	// MoE makes the layers it marks Mixture-of-Experts layers (moe.go);
	// the zero value is a dense model.
	MoE MoEConfig
	// MLA replaces the fused-QKV attention with multi-latent attention
	// (mla.go); the zero value is off.
	MLA MLAConfig
	// GDN makes the layers it marks gated delta nets (gdn.go); the zero
	// value is attention in every layer.
	GDN GDNConfig
	// DSA makes every MLA layer's attention DeepSeek sparse attention
	// (dsa.go); the zero value is off.
	DSA DSAConfig
	// MuP is Megatron's maximal update parametrisation (mup.go); the zero
	// value is off.
	MuP MuPConfig
}

// Validate fills defaults and rejects impossible shapes, naming the flags.
func (c *Config) Validate() error {
	switch {
	case c.NumLayers <= 0:
		return fmt.Errorf("gpt: --num-layers=%d: want > 0", c.NumLayers)
	case c.HiddenSize <= 0:
		return fmt.Errorf("gpt: --hidden-size=%d: want > 0", c.HiddenSize)
	case c.NumAttentionHeads <= 0:
		return fmt.Errorf("gpt: --num-attention-heads=%d: want > 0", c.NumAttentionHeads)
	case c.VocabSize <= 0:
		return fmt.Errorf("gpt: vocab size %d: want > 0 (set --vocab-size or a tokenizer)", c.VocabSize)
	case c.MaxPositionEmbeddings <= 0:
		return fmt.Errorf("gpt: --max-position-embeddings=%d: want > 0", c.MaxPositionEmbeddings)
	case c.FFNHiddenSize < 0:
		return fmt.Errorf("gpt: --ffn-hidden-size=%d: want > 0 (or 0 for 4×--hidden-size)", c.FFNHiddenSize)
	case c.KVChannels < 0:
		return fmt.Errorf("gpt: --kv-channels=%d: want > 0 (or 0 for --hidden-size/--num-attention-heads)", c.KVChannels)
	case c.NumQueryGroups < 0:
		return fmt.Errorf("gpt: --num-query-groups=%d: want > 0 (or 0 for --num-attention-heads)", c.NumQueryGroups)
	case !(c.NormEpsilon >= 0) || math.IsInf(float64(c.NormEpsilon), 0):
		return fmt.Errorf("gpt: --norm-epsilon=%g: want a finite value > 0 (or 0 for 1e-5)", c.NormEpsilon)
	case !(c.InitMethodStd >= 0) || math.IsInf(float64(c.InitMethodStd), 0):
		return fmt.Errorf("gpt: --init-method-std=%g: want a finite value > 0 (or 0 for 0.02)", c.InitMethodStd)
	case c.RotaryBase < 0 || math.IsNaN(c.RotaryBase):
		return fmt.Errorf("gpt: --rotary-base=%g: want > 0 (or 0 for 10000)", c.RotaryBase)
	case c.RotaryPercent < 0 || math.IsNaN(c.RotaryPercent):
		return fmt.Errorf("gpt: --rotary-percent=%g: want in (0, 1] (or 0 for 1)", c.RotaryPercent)
	}
	if c.KVChannels == 0 {
		if c.HiddenSize%c.NumAttentionHeads != 0 {
			return fmt.Errorf("gpt: --hidden-size=%d is not divisible by --num-attention-heads=%d (or set --kv-channels)", c.HiddenSize, c.NumAttentionHeads)
		}
		c.KVChannels = c.HiddenSize / c.NumAttentionHeads
	}
	if c.NumQueryGroups == 0 {
		c.NumQueryGroups = c.NumAttentionHeads
	}
	if c.NumAttentionHeads%c.NumQueryGroups != 0 {
		return fmt.Errorf("gpt: --num-attention-heads=%d is not divisible by --num-query-groups=%d", c.NumAttentionHeads, c.NumQueryGroups)
	}
	if c.FFNHiddenSize == 0 {
		c.FFNHiddenSize = 4 * c.HiddenSize
	}
	switch {
	case !c.PositionEmbeddingType.valid():
		return fmt.Errorf("gpt: --position-embedding-type=%v: want learned_absolute, rope or none", c.PositionEmbeddingType)
	case !c.Normalization.valid():
		return fmt.Errorf("gpt: --normalization=%v: want LayerNorm or RMSNorm", c.Normalization)
	case !c.Activation.valid():
		return fmt.Errorf("gpt: activation %v: want gelu, gelu_tanh (--openai-gelu), swiglu (--swiglu) or squared_relu (--squared-relu)", c.Activation)
	}
	if c.RotaryBase == 0 {
		c.RotaryBase = 10000
	}
	if c.RotaryPercent == 0 {
		c.RotaryPercent = 1
	}
	if rd := c.RotaryDim(); c.PositionEmbeddingType == RoPE && !c.MLA.Enabled && (rd <= 0 || rd%2 != 0 || c.RotaryPercent > 1) {
		return fmt.Errorf("gpt: --rotary-percent=%g with --kv-channels=%d gives rotary dim %d: want an even number in (0, kv-channels]", c.RotaryPercent, c.KVChannels, rd)
	}
	if c.NormEpsilon == 0 {
		c.NormEpsilon = 1e-5
	}
	if c.InitMethodStd == 0 {
		c.InitMethodStd = 0.02
	}
	for name, p := range map[string]float32{"--attention-dropout": c.AttentionDropout, "--hidden-dropout": c.HiddenDropout} {
		if !(p >= 0 && p < 1) {
			return fmt.Errorf("gpt: %s=%g: want 0 <= p < 1", name, p)
		}
	}
	if err := c.MuP.validate(c); err != nil {
		return err
	}
	if err := c.MLA.validate(c); err != nil {
		return err
	}
	if err := c.GDN.validate(c); err != nil {
		return err
	}
	if err := c.DSA.validate(c); err != nil {
		return err
	}
	return c.MoE.validate(c)
}

// RotaryDim is the number of rotated dimensions per head.
func (c *Config) RotaryDim() int {
	return int(math.Floor(float64(c.KVChannels) * c.RotaryPercent))
}

// Presets are named configurations (vocab and sequence length are set by the
// caller's data; the values here are the architecture).
func Preset(name string) (Config, error) {
	switch name {
	case "tiny": // unit tests and the serving benchmark
		return Config{NumLayers: 4, HiddenSize: 256, NumAttentionHeads: 4, VocabSize: 50304, MaxPositionEmbeddings: 256, Activation: GELUTanh}, nil
	case "gpt2-small": // 124M
		return Config{NumLayers: 12, HiddenSize: 768, NumAttentionHeads: 12, VocabSize: 50304, MaxPositionEmbeddings: 1024, Activation: GELUTanh}, nil
	case "gpt2-medium": // 350M
		return Config{NumLayers: 24, HiddenSize: 1024, NumAttentionHeads: 16, VocabSize: 50304, MaxPositionEmbeddings: 1024, Activation: GELUTanh}, nil
	case "llama-tiny": // Llama-style: RMSNorm, SwiGLU, RoPE, GQA, no biases, untied
		return Config{NumLayers: 4, HiddenSize: 256, NumAttentionHeads: 8, NumQueryGroups: 2, FFNHiddenSize: 688,
			VocabSize: 32000, MaxPositionEmbeddings: 2048, PositionEmbeddingType: RoPE, Normalization: RMSNorm,
			Activation: SwiGLU, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true}, nil
	}
	return Config{}, fmt.Errorf("gpt: unknown preset %q (want tiny, gpt2-small, gpt2-medium or llama-tiny)", name)
}

// ParamCount is the number of parameters New allocates for a validated c
// (tied weights once; Model.NumParams of the result). It is a float64 so that
// absurd sizes do not overflow: callers compare it with the machine's memory
// before allocating anything.
func (c *Config) ParamCount() float64 {
	h, d := float64(c.HiddenSize), float64(c.KVChannels)
	a, g := float64(c.NumAttentionHeads), float64(c.NumQueryGroups)
	ffn, v := float64(c.FFNHiddenSize), float64(c.VocabSize)
	norm := h // weight; LayerNorm adds a bias
	if c.Normalization == LayerNorm {
		norm = 2 * h
	}
	bias := 0.0
	if !c.DisableBiasLinear {
		bias = 1
	}
	qkvRows := (a + 2*g) * d
	if c.AttentionOutputGate {
		qkvRows += a * d
	}
	fc1Rows := ffn
	if c.Activation == SwiGLU {
		fc1Rows = 2 * ffn
	}
	layer := 2*norm + qkvRows*h + h*a*d + fc1Rows*h + h*ffn + bias*(h+fc1Rows+h)
	if !c.DisableBiasLinear || c.AddQKVBias {
		layer += qkvRows
	}
	if c.MLA.Enabled { // MLA's projections and norms in place of QKV; linear_proj is (h, a·v)
		layer += c.mlaParamCount(norm) + c.dsaParamCount() - qkvRows*h - h*a*d + h*a*float64(c.MLA.VHeadDim)
		if !c.DisableBiasLinear {
			layer -= qkvRows
		}
	}
	if c.QKLayerNorm && !c.MLA.Enabled { // q_layernorm and k_layernorm, (d) each, and their LayerNorm biases (MLA's latent norms are in mlaParamCount)
		layer += 2 * norm / h * d
	}
	n := v*h + float64(c.NumLayers)*layer + norm
	if c.MoE.Enabled() {
		// an MoE layer's MLP: router, experts, shared expert and gate
		moe := c.MoE
		e, f, glu := float64(moe.NumExperts), float64(moe.FFNHiddenSize), 1.0
		if c.Activation == SwiGLU {
			glu = 2
		}
		dense := fc1Rows*h + h*ffn + bias*(fc1Rows+h)
		sparse := e*h + e*(glu*f*h+h*f) + glu*float64(moe.SharedExpertFFN)*h + h*float64(moe.SharedExpertFFN)
		if moe.SharedExpertGate {
			sparse += h
		}
		n += float64(moe.NumMoELayers(c.NumLayers)) * (sparse - dense)
	}
	if c.GDN.Enabled {
		// a gated delta net layer's attention part in place of QKV, the
		// q/k norms and the output projection
		attn := qkvRows*h + h*a*d
		if !c.DisableBiasLinear || c.AddQKVBias {
			attn += qkvRows
		}
		if !c.DisableBiasLinear {
			attn += h
		}
		if c.QKLayerNorm {
			attn += 2 * norm / h * d
		}
		gd := &c.GDN
		_, vi, convi, ini := gd.dims()
		v, conv, in := float64(vi), float64(convi), float64(ini)
		gdn := in*h + conv*float64(gd.ConvKernel) + 2*float64(gd.NumValueHeads) + norm/h*float64(gd.ValueHeadDim) + h*v
		n += float64(gd.NumGDNLayers(c.NumLayers)) * (gdn - attn)
	}
	if c.PositionEmbeddingType == LearnedAbsolute {
		n += float64(c.MaxPositionEmbeddings) * h
	}
	if c.UntieEmbeddingsAndOutputWeights {
		n += v * h
	}
	return n
}
