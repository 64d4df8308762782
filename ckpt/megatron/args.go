package megatron

import (
	"fmt"
	"math"
	"math/big"

	"github.com/gotron/gotron/ckpt/torchpt"
	"github.com/gotron/gotron/model/gpt"
)

// argset is the args namespace of a state dict: Megatron's parsed command
// line, an argparse.Namespace whose attributes are the flags' dest names.
type argset struct {
	d    *torchpt.Dict
	file string
}

func readArgs(f *torchpt.File, sd *torchpt.Dict) (argset, error) {
	v, ok := sd.Get("args")
	if !ok || v == nil {
		return argset{}, fmt.Errorf("%s has no args (saved without arguments): the model configuration cannot be derived", f.Path)
	}
	o, ok := v.(*torchpt.Object)
	if !ok || o.Attrs() == nil {
		return argset{}, fmt.Errorf("%s: args is a %T, want an argparse.Namespace", f.Path, v)
	}
	return argset{d: o.Attrs(), file: f.Path}, nil
}

// get returns the value of name; ok is false when it is absent or None.
func (a argset) get(name string) (any, bool) {
	v, ok := a.d.Get(name)
	return v, ok && v != nil
}

func (a argset) typeErr(name string, v any, want string) error {
	return fmt.Errorf("%s: args.%s=%v is a %T, want %s", a.file, name, v, v, want)
}

func (a argset) intOr(name string, def int64) (int64, error) {
	v, ok := a.get(name)
	if !ok {
		return def, nil
	}
	switch x := v.(type) {
	case int64:
		return x, nil
	case bool: // Python's bool is an int
		if x {
			return 1, nil
		}
		return 0, nil
	case *big.Int:
		return 0, fmt.Errorf("%s: args.%s=%v is out of range", a.file, name, x)
	}
	return 0, a.typeErr(name, v, "an int")
}

func (a argset) floatOr(name string, def float64) (float64, error) {
	v, ok := a.get(name)
	if !ok {
		return def, nil
	}
	switch x := v.(type) {
	case float64:
		return x, nil
	case int64:
		return float64(x), nil
	}
	return 0, a.typeErr(name, v, "a number")
}

func (a argset) boolOr(name string, def bool) (bool, error) {
	v, ok := a.get(name)
	if !ok {
		return def, nil
	}
	switch x := v.(type) {
	case bool:
		return x, nil
	case int64:
		return x != 0, nil
	}
	return false, a.typeErr(name, v, "a bool")
}

func (a argset) strOr(name, def string) (string, error) {
	v, ok := a.get(name)
	if !ok {
		return def, nil
	}
	s, ok := v.(string)
	if !ok {
		return "", a.typeErr(name, v, "a str")
	}
	return s, nil
}

// Settings derived from args beyond gpt.Config.
type derived struct {
	SeqLength int
	// ZeroCenteredGamma is --apply-layernorm-1p (layernorm_zero_centered_gamma
	// at Megatron HEAD): norms scale by 1 + weight, so 1 is added on import.
	ZeroCenteredGamma bool
	// Dropouts the checkpoint was trained with (not imported).
	HiddenDropout, AttentionDropout                     float64
	TokenizerType, VocabFile, MergeFile, TokenizerModel string
	Warnings                                            []string
}

// unsupported lists arguments whose non-default values change the model
// in ways gotron cannot represent: name, what it is.
var unsupported = []struct{ name, what string }{
	{"mtp_num_layers", "multi-token prediction layers"},
	{"qk_layernorm", "QK layer norm"},
	{"apply_residual_connection_post_layernorm", "post-norm residual connections"},
	{"window_size", "sliding-window attention"},
	{"window_attn_skip_freq", "sliding-window attention"},
	{"heterogeneous_layers_config_path", "heterogeneous layers"},
	{"heterogeneous_layers_config_encoded_json", "heterogeneous layers"},
	{"hybrid_layer_pattern", "hybrid (Mamba) layers"},
	{"hybrid_override_pattern", "hybrid (Mamba) layers"},
	{"quick_geglu", "the quick-GeGLU activation"},
	{"use_rope_scaling", "Llama 3.1 RoPE frequency scaling"},
	{"rotary_seq_len_interpolation_factor", "RoPE position interpolation"},
	{"no_rope_freq", "layers without RoPE"},
	{"attention_output_gate", "importing the attention output gate from Megatron's torch format (gotron trains it: --attention-output-gate)"},
	{"experimental_attention_variant", "importing experimental attention variants (gated delta net layers) from Megatron's torch format (gotron trains gated_delta_net models)"},
	{"activation_func_clamp_value", "clamped activations"},
	{"use_mup", "muP multipliers"},
	{"softmax_scale", "a custom softmax scale"},
	{"qk_clip", "QK clipping"},
}

// isSet reports whether an argument holds a value other than its "off"
// default (None, False, 0, an empty string, or 1 for the factors).
func isSet(name string, v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case int64:
		if name == "rotary_seq_len_interpolation_factor" {
			return x != 1
		}
		return x != 0
	case float64:
		if name == "rotary_seq_len_interpolation_factor" {
			return x != 1
		}
		return x != 0
	case string:
		return x != ""
	}
	return true
}

// config derives gotron's model configuration from the args, refusing
// (naming the argument) what gotron cannot represent.
func (a argset) config() (gpt.Config, derived, error) {
	var cfg gpt.Config
	var dv derived
	fail := func(name string, v any, why string) (gpt.Config, derived, error) {
		return gpt.Config{}, derived{}, fmt.Errorf("%s: args.%s=%v: %s", a.file, name, v, why)
	}
	for _, u := range unsupported {
		if v, _ := a.d.Get(u.name); isSet(u.name, v) {
			if u.name == "softmax_scale" {
				continue // checked below, against the head size
			}
			if mla, _ := a.boolOr("multi_latent_attention", false); mla && u.name == "qk_layernorm" {
				continue // MLA's q_layernorm and kv_layernorm on its latents (mlaConfig)
			}
			return fail(u.name, v, u.what+" is not supported by gotron")
		}
	}
	if v, ok := a.get("softmax_type"); ok && v != "vanilla" {
		return fail("softmax_type", v, "only the vanilla softmax is supported")
	}
	if v, ok := a.get("glu_linear_offset"); ok && v != 0.0 && v != int64(0) {
		return fail("glu_linear_offset", v, "an offset GLU is not supported")
	}

	ints := map[string]*int{
		"num_layers": &cfg.NumLayers, "hidden_size": &cfg.HiddenSize, "num_attention_heads": &cfg.NumAttentionHeads,
		"padded_vocab_size": &cfg.VocabSize,
	}
	for _, name := range []string{"num_layers", "hidden_size", "num_attention_heads", "padded_vocab_size"} {
		n, err := a.intOr(name, 0)
		if err != nil {
			return gpt.Config{}, derived{}, err
		}
		if n <= 0 || n > math.MaxInt32 {
			if _, ok := a.get(name); !ok {
				return gpt.Config{}, derived{}, fmt.Errorf("%s: args has no %s", a.file, name)
			}
			return fail(name, n, "want a positive size")
		}
		*ints[name] = int(n)
	}
	opt := func(name string, dst *int) error {
		n, err := a.intOr(name, 0)
		if err != nil {
			return err
		}
		if n < 0 || n > math.MaxInt32 {
			return fmt.Errorf("%s: args.%s=%d: want a positive size", a.file, name, n)
		}
		*dst = int(n)
		return nil
	}
	for name, dst := range map[string]*int{"ffn_hidden_size": &cfg.FFNHiddenSize, "kv_channels": &cfg.KVChannels,
		"max_position_embeddings": &cfg.MaxPositionEmbeddings, "seq_length": &dv.SeqLength} {
		if err := opt(name, dst); err != nil {
			return gpt.Config{}, derived{}, err
		}
	}
	gqa, err := a.boolOr("group_query_attention", false)
	if err != nil {
		return gpt.Config{}, derived{}, err
	}
	if gqa {
		if err := opt("num_query_groups", &cfg.NumQueryGroups); err != nil {
			return gpt.Config{}, derived{}, err
		}
	}

	if err := a.mlaConfig(&cfg); err != nil {
		return gpt.Config{}, derived{}, err
	}
	// Position embeddings: --position-embedding-type, or the older
	// --use-rotary-position-embeddings / --no-position-embedding.
	pet, err := a.strOr("position_embedding_type", "")
	if err != nil {
		return gpt.Config{}, derived{}, err
	}
	if pet == "" {
		rot, _ := a.boolOr("use_rotary_position_embeddings", false)
		add, _ := a.boolOr("add_position_embedding", true)
		switch {
		case rot:
			cfg.PositionEmbeddingType = gpt.RoPE
		case !add:
			cfg.PositionEmbeddingType = gpt.NoPositionEmbedding
		}
	} else if err := cfg.PositionEmbeddingType.Set(pet); err != nil {
		return fail("position_embedding_type", pet, err.Error())
	}
	if cfg.PositionEmbeddingType == gpt.RoPE || cfg.MLA.Enabled {
		if cfg.RotaryBase, err = a.floatOr("rotary_base", 10000); err != nil {
			return gpt.Config{}, derived{}, err
		}
		if cfg.RotaryPercent, err = a.floatOr("rotary_percent", 1); err != nil {
			return gpt.Config{}, derived{}, err
		}
		if cfg.RotaryInterleaved, err = a.boolOr("rotary_interleaved", false); err != nil {
			return gpt.Config{}, derived{}, err
		}
		if cfg.MaxPositionEmbeddings == 0 && cfg.PositionEmbeddingType == gpt.RoPE {
			cfg.MaxPositionEmbeddings = dv.SeqLength // RoPE has no table: the training length bounds it
		}
	}
	if cfg.MaxPositionEmbeddings == 0 {
		return gpt.Config{}, derived{}, fmt.Errorf("%s: args has neither max_position_embeddings nor seq_length", a.file)
	}
	if dv.SeqLength == 0 || dv.SeqLength > cfg.MaxPositionEmbeddings {
		dv.SeqLength = cfg.MaxPositionEmbeddings
	}

	norm, err := a.strOr("normalization", "LayerNorm")
	if err != nil {
		return gpt.Config{}, derived{}, err
	}
	if err := cfg.Normalization.Set(norm); err != nil {
		return fail("normalization", norm, err.Error())
	}
	// --norm-epsilon: dest norm_epsilon until Megatron made TransformerConfig
	// the source of its flags (layernorm_epsilon); older still: layernorm_epsilon.
	eps := 1e-5
	for _, name := range []string{"norm_epsilon", "layernorm_epsilon"} {
		if _, ok := a.get(name); ok {
			if eps, err = a.floatOr(name, 1e-5); err != nil {
				return gpt.Config{}, derived{}, err
			}
			if !(eps > 0) || eps > 1 {
				return fail(name, eps, "want a small positive epsilon")
			}
			break
		}
	}
	cfg.NormEpsilon = float32(eps)
	for _, name := range []string{"apply_layernorm_1p", "layernorm_zero_centered_gamma"} {
		b, err := a.boolOr(name, false)
		if err != nil {
			return gpt.Config{}, derived{}, err
		}
		dv.ZeroCenteredGamma = dv.ZeroCenteredGamma || b
	}

	swiglu, err := a.boolOr("swiglu", false)
	if err != nil {
		return gpt.Config{}, derived{}, err
	}
	openai, err := a.boolOr("openai_gelu", false)
	if err != nil {
		return gpt.Config{}, derived{}, err
	}
	squared, err := a.boolOr("squared_relu", false)
	if err != nil {
		return gpt.Config{}, derived{}, err
	}
	switch {
	case squared && swiglu:
		return gpt.Config{}, derived{}, fmt.Errorf("%s: args.squared_relu=true with args.swiglu=true: Megatron asserts not both", a.file)
	case squared: // Megatron's argument_utils sets squared_relu last
		cfg.Activation = gpt.SquaredReLU
	case swiglu:
		cfg.Activation = gpt.SwiGLU
	case openai:
		cfg.Activation = gpt.GELUTanh
	default:
		cfg.Activation = gpt.GELU // F.gelu (erf), Megatron's default
	}
	// --disable-bias-linear: dest add_bias_linear (store_false); some
	// checkpoints carry disable_bias_linear instead (Megatron's load_args
	// converts it the same way).
	bias, err := a.boolOr("add_bias_linear", true)
	if err != nil {
		return gpt.Config{}, derived{}, err
	}
	if _, ok := a.get("add_bias_linear"); !ok {
		dis, err := a.boolOr("disable_bias_linear", false)
		if err != nil {
			return gpt.Config{}, derived{}, err
		}
		bias = !dis
	}
	cfg.DisableBiasLinear = !bias
	if cfg.AddQKVBias, err = a.boolOr("add_qkv_bias", false); err != nil {
		return gpt.Config{}, derived{}, err
	}
	if cfg.UntieEmbeddingsAndOutputWeights, err = a.boolOr("untie_embeddings_and_output_weights", false); err != nil {
		return gpt.Config{}, derived{}, err
	}
	std, err := a.floatOr("init_method_std", 0.02)
	if err != nil {
		return gpt.Config{}, derived{}, err
	}
	if std > 0 && !math.IsInf(std, 0) {
		cfg.InitMethodStd = float32(std)
	}
	if dv.HiddenDropout, err = a.floatOr("hidden_dropout", 0); err != nil {
		return gpt.Config{}, derived{}, err
	}
	if dv.AttentionDropout, err = a.floatOr("attention_dropout", 0); err != nil {
		return gpt.Config{}, derived{}, err
	}
	dv.TokenizerType, _ = a.strOr("tokenizer_type", "")
	dv.VocabFile, _ = a.strOr("vocab_file", "")
	dv.MergeFile, _ = a.strOr("merge_file", "")
	dv.TokenizerModel, _ = a.strOr("tokenizer_model", "")

	if err := a.moeConfig(&cfg); err != nil {
		return gpt.Config{}, derived{}, err
	}
	if err := cfg.Validate(); err != nil {
		return gpt.Config{}, derived{}, fmt.Errorf("%s: args describe a model gotron rejects: %w", a.file, err)
	}
	if v, ok := a.get("softmax_scale"); ok {
		s, err := a.floatOr("softmax_scale", 0)
		if err != nil {
			return gpt.Config{}, derived{}, err
		}
		if want := 1 / math.Sqrt(float64(cfg.KVChannels)); math.Abs(s-want) > 1e-6*want {
			return fail("softmax_scale", v, fmt.Sprintf("gotron scales attention by 1/sqrt(kv_channels) = %g", want))
		}
	}
	return cfg, dv, nil
}

// mlaConfig reads multi-latent attention's arguments (Megatron's
// _add_mla_args and MLATransformerConfig's fields) into cfg.MLA when
// args.multi_latent_attention is set. Arguments a checkpoint lacks take
// the values Megatron's command line gives (gpt.DefaultMLA).
func (a argset) mlaConfig(cfg *gpt.Config) error {
	on, err := a.boolOr("multi_latent_attention", false)
	if err != nil || !on {
		return err
	}
	mla := gpt.DefaultMLA()
	for _, f := range []struct {
		name string
		dst  *int
	}{{"q_lora_rank", &mla.QLoraRank}, // None (absent): 0, one plain query projection
		{"kv_lora_rank", &mla.KVLoraRank}, {"qk_head_dim", &mla.QKHeadDim},
		{"qk_pos_emb_head_dim", &mla.QKPosEmbHeadDim}, {"v_head_dim", &mla.VHeadDim},
		{"original_max_position_embeddings", &mla.OriginalMaxPositions}} {
		n, err := a.intOr(f.name, int64(*f.dst))
		if err != nil {
			return err
		}
		if n < 0 || n > math.MaxInt32 {
			return fmt.Errorf("%s: args.%s=%d: want a positive size", a.file, f.name, n)
		}
		*f.dst = int(n)
	}
	for _, f := range []struct {
		name string
		dst  *float64
	}{{"rotary_scaling_factor", &mla.ScalingFactor}, {"mscale", &mla.Mscale}, {"mscale_all_dim", &mla.MscaleAllDim},
		{"beta_fast", &mla.BetaFast}, {"beta_slow", &mla.BetaSlow}} {
		if *f.dst, err = a.floatOr(f.name, *f.dst); err != nil {
			return err
		}
	}
	rope, err := a.strOr("rope_type", "")
	if err != nil {
		return err
	}
	if rope != "" {
		if mla.Rope, err = gpt.ParseRopeType(rope); err != nil {
			return fmt.Errorf("%s: args.rope_type=%q: %w", a.file, rope, err)
		}
	}
	// Megatron builds MLA's latent norms (q_layernorm, kv_layernorm) only
	// with --qk-layernorm (gpt_layer_specs.py): without it the checkpoint
	// has no norm tensors and neither has the model.
	qk, err := a.boolOr("qk_layernorm", false)
	if err != nil {
		return err
	}
	cfg.QKLayerNorm = qk
	if fused, _ := a.boolOr("mla_down_proj_fusion", false); fused {
		return fmt.Errorf("%s: args.mla_down_proj_fusion=true: the fused query/key-value down-projection (FusedMLASelfAttention's linear_qkv_down_proj) is not imported by gotron", a.file)
	}
	cfg.MLA = mla
	return nil
}
