package hf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"

	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tokenizer"
)

// hfConfig holds the config.json fields the conversion reads. Pointers are
// nil when a key is absent or null; transformers' class defaults apply then.
type hfConfig struct {
	Architectures []string `json:"architectures"`
	ModelType     string   `json:"model_type"`
	VocabSize     *int     `json:"vocab_size"`
	TieWordEmb    *bool    `json:"tie_word_embeddings"`

	// GPT2Config
	NEmbd                      *int     `json:"n_embd"`
	NLayer                     *int     `json:"n_layer"`
	NHead                      *int     `json:"n_head"`
	NInner                     *int     `json:"n_inner"`
	NPositions                 *int     `json:"n_positions"`
	LayerNormEpsilon           *float64 `json:"layer_norm_epsilon"`
	ActivationFunction         *string  `json:"activation_function"`
	ScaleAttnWeights           *bool    `json:"scale_attn_weights"`
	ScaleAttnByInverseLayerIdx *bool    `json:"scale_attn_by_inverse_layer_idx"`

	// LlamaConfig / MistralConfig
	HiddenSize            *int            `json:"hidden_size"`
	IntermediateSize      *int            `json:"intermediate_size"`
	NumHiddenLayers       *int            `json:"num_hidden_layers"`
	NumAttentionHeads     *int            `json:"num_attention_heads"`
	NumKeyValueHeads      *int            `json:"num_key_value_heads"`
	HeadDim               *int            `json:"head_dim"`
	MaxPositionEmbeddings *int            `json:"max_position_embeddings"`
	HiddenAct             *string         `json:"hidden_act"`
	RMSNormEps            *float64        `json:"rms_norm_eps"`
	RopeTheta             *float64        `json:"rope_theta"`
	RopeScaling           json.RawMessage `json:"rope_scaling"`
	// RopeParameters is transformers 5's form of rope_theta and
	// rope_scaling: {"rope_type": "default", "rope_theta": θ}.
	RopeParameters json.RawMessage `json:"rope_parameters"`
	AttentionBias  *bool           `json:"attention_bias"`
	MLPBias        *bool           `json:"mlp_bias"`
	SlidingWindow  *int            `json:"sliding_window"`

	// MixtralConfig
	NumLocalExperts   *int     `json:"num_local_experts"`
	NumExpertsPerTok  *int     `json:"num_experts_per_tok"`
	RouterJitterNoise *float64 `json:"router_jitter_noise"`

	// Qwen2MoeConfig
	NumExperts                   *int  `json:"num_experts"`
	MoEIntermediateSize          *int  `json:"moe_intermediate_size"`
	SharedExpertIntermediateSize *int  `json:"shared_expert_intermediate_size"`
	NormTopKProb                 *bool `json:"norm_topk_prob"`
	DecoderSparseStep            *int  `json:"decoder_sparse_step"`
	MLPOnlyLayers                []int `json:"mlp_only_layers"`
	QKVBias                      *bool `json:"qkv_bias"`
	UseSlidingWindow             *bool `json:"use_sliding_window"`
}

// ropeParameters is rope_parameters with the keys gotron reads; ropeTheta
// returns the RoPE base it sets, refusing settings plain RoPE does not have.
type ropeParameters struct {
	RopeType  *string  `json:"rope_type"`
	RopeTheta *float64 `json:"rope_theta"`
}

// ropeTheta is the RoPE base of c: rope_theta, else rope_parameters'
// rope_theta, else def. rope_parameters with another rope_type, with keys
// other than rope_type and rope_theta, or a rope_theta contradicting the
// top-level one is refused by name.
func ropeTheta(c *hfConfig, def float64) (float64, error) {
	raw := bytes.TrimSpace(c.RopeParameters)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return floatOr(c.RopeTheta, def), nil
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil {
		return 0, fmt.Errorf("rope_parameters %s: want an object: %w", raw, err)
	}
	for k := range keys {
		if k != "rope_type" && k != "rope_theta" {
			return 0, fmt.Errorf("rope_parameters.%s: not supported (gotron implements plain RoPE: rope_type and rope_theta only)", k)
		}
	}
	var rp ropeParameters
	if err := json.Unmarshal(raw, &rp); err != nil {
		return 0, fmt.Errorf("rope_parameters %s: %w", raw, err)
	}
	if rp.RopeType != nil && *rp.RopeType != "default" {
		return 0, fmt.Errorf("rope_parameters.rope_type %q: not supported (gotron implements plain RoPE, rope_type \"default\")", *rp.RopeType)
	}
	if rp.RopeTheta == nil {
		return floatOr(c.RopeTheta, def), nil
	}
	if t := *rp.RopeTheta; !(t > 0) || math.IsInf(t, 0) {
		return 0, fmt.Errorf("rope_parameters.rope_theta: %v: want a positive finite number", t)
	}
	if c.RopeTheta != nil && *c.RopeTheta != *rp.RopeTheta {
		return 0, fmt.Errorf("rope_theta %v contradicts rope_parameters.rope_theta %v", *c.RopeTheta, *rp.RopeTheta)
	}
	return *rp.RopeTheta, nil
}

func intOr(p *int, def int) int {
	if p == nil {
		return def
	}
	return *p
}

func floatOr(p *float64, def float64) float64 {
	if p == nil {
		return def
	}
	return *p
}

func boolOr(p *bool, def bool) bool {
	if p == nil {
		return def
	}
	return *p
}

// supportedArchs is what archOf accepts, for its errors.
const supportedArchs = "gpt2 (GPT2LMHeadModel), llama (LlamaForCausalLM), mistral (MistralForCausalLM), mixtral (MixtralForCausalLM), qwen2_moe (Qwen2MoeForCausalLM), qwen3_moe (Qwen3MoeForCausalLM), deepseek_v2 (DeepseekV2ForCausalLM), deepseek_v3 (DeepseekV3ForCausalLM) or qwen3_next (Qwen3NextForCausalLM)"

// archOf names the table for a config.json: by model_type, which
// transformers itself dispatches on, else (no model_type) by the first
// architecture. A model_type gotron does not know is refused even when
// architectures names a known class: the weights would be read by the
// wrong table, or another model's as this one's.
func archOf(c *hfConfig) (string, error) {
	byClass := ""
	for _, a := range c.Architectures {
		switch a {
		case "GPT2LMHeadModel":
			byClass = ArchGPT2
		case "LlamaForCausalLM", "MistralForCausalLM":
			byClass = ArchLlama
		case "MixtralForCausalLM":
			byClass = ArchMixtral
		case "Qwen2MoeForCausalLM":
			byClass = ArchQwen2MoE
		case "Qwen3MoeForCausalLM":
			byClass = ArchQwen3MoE
		case "DeepseekV2ForCausalLM":
			byClass = ArchDeepSeekV2
		case "DeepseekV3ForCausalLM":
			byClass = ArchDeepSeekV3
		case "Qwen3NextForCausalLM":
			byClass = ArchQwen3Next
		default:
			continue
		}
		break
	}
	var arch string
	switch c.ModelType {
	case "gpt2":
		arch = ArchGPT2
	case "llama", "mistral":
		arch = ArchLlama
	case "mixtral":
		arch = ArchMixtral
	case "qwen2_moe":
		arch = ArchQwen2MoE
	case "qwen3_moe":
		arch = ArchQwen3MoE
	case "":
		if byClass == "" {
			return "", fmt.Errorf("model_type absent, architectures %q: want %s", c.Architectures, supportedArchs)
		}
		return byClass, nil
	case "deepseek_v2":
		arch = ArchDeepSeekV2
	case "deepseek_v3":
		arch = ArchDeepSeekV3
	case "qwen3_next":
		arch = ArchQwen3Next
	default:
		return "", fmt.Errorf("model_type %q is not supported: want %s", c.ModelType, supportedArchs)
	}
	if byClass != "" && byClass != arch {
		return "", fmt.Errorf("model_type %q contradicts architectures %q", c.ModelType, c.Architectures)
	}
	return arch, nil
}

// maxDim bounds config.json's sizes and counts, so that the arithmetic
// done with them (4 × n_embd, heads × head_dim, ...) cannot overflow.
const maxDim = math.MaxInt32

// checkFields validates the numeric fields config.json sets: a size or
// count of zero or less, or a base or epsilon that is not a positive
// finite number, would otherwise be taken for "unset" (gotron's defaults)
// or fail later without naming the field.
func checkFields(c *hfConfig) error {
	var errs []error
	experts := c.NumExperts
	if c.ModelType == "qwen3_next" && experts != nil && *experts == 0 {
		experts = nil // a dense Qwen3-Next (Qwen3NextDecoderLayer's num_experts > 0 test)
	}
	for _, f := range []struct {
		name string
		v    *int
	}{
		{"vocab_size", c.VocabSize}, {"n_embd", c.NEmbd}, {"n_layer", c.NLayer}, {"n_head", c.NHead}, {"n_inner", c.NInner},
		{"n_positions", c.NPositions}, {"hidden_size", c.HiddenSize}, {"intermediate_size", c.IntermediateSize},
		{"num_hidden_layers", c.NumHiddenLayers}, {"num_attention_heads", c.NumAttentionHeads},
		{"num_key_value_heads", c.NumKeyValueHeads}, {"head_dim", c.HeadDim}, {"max_position_embeddings", c.MaxPositionEmbeddings},
		{"sliding_window", c.SlidingWindow}, {"num_local_experts", c.NumLocalExperts}, {"num_experts_per_tok", c.NumExpertsPerTok},
		{"num_experts", experts}, {"moe_intermediate_size", c.MoEIntermediateSize},
		{"shared_expert_intermediate_size", c.SharedExpertIntermediateSize}, {"decoder_sparse_step", c.DecoderSparseStep},
	} {
		if f.v != nil {
			if err := checked.Range(f.name, int64(*f.v), 1, maxDim); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, f := range []struct {
		name    string
		v       *float64
		float32 bool // stored as float32: must stay positive there
	}{
		{"rope_theta", c.RopeTheta, false}, {"layer_norm_epsilon", c.LayerNormEpsilon, true}, {"rms_norm_eps", c.RMSNormEps, true},
	} {
		if f.v == nil {
			continue
		}
		v := *f.v
		if !(v > 0) || math.IsInf(v, 0) || (f.float32 && !(float32(v) > 0)) {
			errs = append(errs, fmt.Errorf("%s: %v: want a positive finite number%s", f.name, v, map[bool]string{true: " (as float32)", false: ""}[f.float32]))
		}
	}
	return errors.Join(errs...)
}

// gpt2Activation maps an HF activation_function to gotron's Activation
// (false when gotron has no equivalent). gelu_new, gelu_pytorch_tanh and
// gelu_fast are all the tanh approximation; gelu is the exact erf form.
func gpt2Activation(hf string) (gpt.Activation, bool) {
	switch hf {
	case "gelu_new", "gelu_pytorch_tanh", "gelu_fast":
		return gpt.GELUTanh, true
	case "gelu":
		return gpt.GELU, true
	}
	return 0, false
}

// parseConfig turns config.json into a gotron model config (vocabulary padded
// to a multiple of divisibleBy) and returns the unpadded vocabulary size and
// warnings about settings gotron ignores.
func parseConfig(raw []byte, divisibleBy int) (arch string, cfg gpt.Config, vocab int, warns []string, err error) {
	var c hfConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return "", gpt.Config{}, 0, nil, err
	}
	if arch, err = archOf(&c); err != nil {
		return "", gpt.Config{}, 0, nil, err
	}
	if err := checkFields(&c); err != nil {
		return "", gpt.Config{}, 0, nil, err
	}
	switch arch {
	case ArchDeepSeekV2, ArchDeepSeekV3:
		if cfg, vocab, err = deepseekParse(raw, &c, arch); err != nil {
			return "", gpt.Config{}, 0, nil, err
		}
	case ArchQwen3Next:
		if cfg, vocab, err = qwen3NextParse(raw, &c); err != nil {
			return "", gpt.Config{}, 0, nil, err
		}
	case ArchGPT2:
		vocab = intOr(c.VocabSize, 50257)
		h := intOr(c.NEmbd, 768)
		act := "gelu_new"
		if c.ActivationFunction != nil {
			act = *c.ActivationFunction
		}
		gact, ok := gpt2Activation(act)
		if !ok {
			return "", gpt.Config{}, 0, nil, fmt.Errorf("activation_function %q: want gelu_new, gelu_pytorch_tanh, gelu_fast or gelu", act)
		}
		if !boolOr(c.ScaleAttnWeights, true) || boolOr(c.ScaleAttnByInverseLayerIdx, false) {
			return "", gpt.Config{}, 0, nil, fmt.Errorf("scale_attn_weights=false or scale_attn_by_inverse_layer_idx=true: gotron scales attention by 1/sqrt(head dim) only")
		}
		cfg = gpt.Config{NumLayers: intOr(c.NLayer, 12), HiddenSize: h, NumAttentionHeads: intOr(c.NHead, 12),
			FFNHiddenSize: intOr(c.NInner, 4*h), MaxPositionEmbeddings: intOr(c.NPositions, 1024),
			PositionEmbeddingType: gpt.LearnedAbsolute, Normalization: gpt.LayerNorm,
			NormEpsilon: float32(floatOr(c.LayerNormEpsilon, 1e-5)), Activation: gact,
			UntieEmbeddingsAndOutputWeights: !boolOr(c.TieWordEmb, true)}
	case ArchLlama, ArchMixtral, ArchQwen2MoE, ArchQwen3MoE:
		d := llamaDefaults[arch]
		vocab = intOr(c.VocabSize, d.vocab)
		if act := c.HiddenAct; act != nil && *act != "silu" {
			return "", gpt.Config{}, 0, nil, fmt.Errorf("hidden_act %q: want silu (SwiGLU)", *act)
		}
		if len(c.RopeScaling) > 0 && !bytes.Equal(bytes.TrimSpace(c.RopeScaling), []byte("null")) {
			return "", gpt.Config{}, 0, nil, fmt.Errorf("rope_scaling %s: not supported (gotron implements plain RoPE)", c.RopeScaling)
		}
		if boolOr(c.AttentionBias, false) || boolOr(c.MLPBias, false) {
			return "", gpt.Config{}, 0, nil, fmt.Errorf("attention_bias or mlp_bias true: not supported (gotron's Llama layout has no biases)")
		}
		theta, err := ropeTheta(&c, d.theta)
		if err != nil {
			return "", gpt.Config{}, 0, nil, err
		}
		heads := intOr(c.NumAttentionHeads, d.heads)
		kv := d.kvHeads
		if kv == 0 {
			kv = heads
		}
		cfg = gpt.Config{NumLayers: intOr(c.NumHiddenLayers, d.layers), HiddenSize: intOr(c.HiddenSize, d.hidden),
			NumAttentionHeads: heads, NumQueryGroups: intOr(c.NumKeyValueHeads, kv), KVChannels: intOr(c.HeadDim, 0),
			FFNHiddenSize: intOr(c.IntermediateSize, d.ffn), MaxPositionEmbeddings: intOr(c.MaxPositionEmbeddings, d.positions),
			PositionEmbeddingType: gpt.RoPE, RotaryBase: theta, Normalization: gpt.RMSNorm,
			NormEpsilon: float32(floatOr(c.RMSNormEps, d.eps)), Activation: gpt.SwiGLU, DisableBiasLinear: true,
			UntieEmbeddingsAndOutputWeights: !boolOr(c.TieWordEmb, false)}
		if sw := c.SlidingWindow; sw != nil && *sw < cfg.MaxPositionEmbeddings && (arch != ArchQwen2MoE && arch != ArchQwen3MoE || boolOr(c.UseSlidingWindow, false)) {
			warns = append(warns, fmt.Sprintf("sliding_window=%d is ignored: gotron attends to the whole sequence (identical for sequences up to %d tokens)", *sw, *sw))
		}
		switch arch {
		case ArchMixtral:
			w, err := mixtralMoE(&c, &cfg)
			if err != nil {
				return "", gpt.Config{}, 0, nil, err
			}
			warns = append(warns, w...)
		case ArchQwen2MoE:
			if err := qwen2MoE(&c, &cfg); err != nil {
				return "", gpt.Config{}, 0, nil, err
			}
		case ArchQwen3MoE:
			if err := qwen3MoE(&c, &cfg); err != nil {
				return "", gpt.Config{}, 0, nil, err
			}
		}
	}
	if vocab <= 0 {
		return "", gpt.Config{}, 0, nil, fmt.Errorf("vocab_size=%d: want > 0", vocab)
	}
	cfg.VocabSize = tokenizer.PaddedVocabSize(vocab, divisibleBy, 1)
	if err := cfg.Validate(); err != nil {
		return "", gpt.Config{}, 0, nil, err
	}
	return arch, cfg, vocab, warns, nil
}

// torchDType is config.json's torch_dtype for a safetensors dtype.
func torchDType(d string) string {
	switch d {
	case "BF16":
		return "bfloat16"
	case "F16":
		return "float16"
	}
	return "float32"
}

// owned are the config.json keys the exporter derives from the model; other
// keys of the imported config.json are kept verbatim.
// template holds the further keys written when there is no imported
// config.json; nullMeans the value a null owned key stands for.
func exportConfig(arch string, c gpt.Config, vocab int, dtype string) (owned, template, nullMeans map[string]any, err error) {
	tied := !c.UntieEmbeddingsAndOutputWeights
	switch arch {
	case ArchGPT2:
		act := "gelu_new"
		if c.Activation == gpt.GELU {
			act = "gelu"
		}
		owned = map[string]any{"model_type": "gpt2", "vocab_size": vocab, "n_embd": c.HiddenSize, "n_layer": c.NumLayers,
			"n_head": c.NumAttentionHeads, "n_inner": c.FFNHiddenSize, "n_positions": c.MaxPositionEmbeddings,
			"layer_norm_epsilon": decimal32(c.NormEpsilon), "activation_function": act, "tie_word_embeddings": tied,
			"torch_dtype": torchDType(dtype)}
		template = map[string]any{"architectures": []any{"GPT2LMHeadModel"}, "n_ctx": c.MaxPositionEmbeddings,
			"attn_pdrop": decimal32(c.AttentionDropout), "embd_pdrop": decimal32(c.HiddenDropout), "resid_pdrop": decimal32(c.HiddenDropout),
			"initializer_range": decimal32(c.InitMethodStd), "scale_attn_weights": true, "scale_attn_by_inverse_layer_idx": false,
			"reorder_and_upcast_attn": false, "use_cache": true}
		nullMeans = map[string]any{"n_inner": 4 * c.HiddenSize}
	case ArchLlama, ArchMixtral, ArchQwen2MoE, ArchQwen3MoE:
		owned = map[string]any{"model_type": "llama", "vocab_size": vocab, "hidden_size": c.HiddenSize,
			"intermediate_size": c.FFNHiddenSize, "num_hidden_layers": c.NumLayers, "num_attention_heads": c.NumAttentionHeads,
			"num_key_value_heads": c.NumQueryGroups, "max_position_embeddings": c.MaxPositionEmbeddings,
			"rms_norm_eps": decimal32(c.NormEpsilon), "rope_theta": c.RotaryBase, "hidden_act": "silu",
			"tie_word_embeddings": tied, "torch_dtype": torchDType(dtype)}
		if c.KVChannels*c.NumAttentionHeads != c.HiddenSize {
			owned["head_dim"] = c.KVChannels
		}
		template = map[string]any{"architectures": []any{"LlamaForCausalLM"}, "attention_dropout": 0.0,
			"initializer_range": decimal32(c.InitMethodStd), "pretraining_tp": 1, "use_cache": true,
			"attention_bias": false, "mlp_bias": false, "rope_scaling": nil}
		nullMeans = map[string]any{"num_key_value_heads": c.NumAttentionHeads, "head_dim": c.HiddenSize / c.NumAttentionHeads}
		if arch != ArchLlama {
			moeExportConfig(arch, c, owned, template)
		}
	case ArchDeepSeekV2, ArchDeepSeekV3:
		return deepseekExportConfig(arch, c, vocab, dtype)
	case ArchQwen3Next:
		return qwen3NextExportConfig(c, vocab, dtype)
	default:
		return nil, nil, nil, fmt.Errorf("hf: unknown architecture %q", arch)
	}
	return owned, template, nullMeans, nil
}

// decimal32 is x as the float64 with the shortest decimal form that rounds
// to x in float32: gotron keeps these settings in float32, and float64(x)
// would write 1e-5 as 9.999999747378752e-06.
func decimal32(x float32) float64 {
	v, err := strconv.ParseFloat(strconv.FormatFloat(float64(x), 'g', -1, 32), 64)
	if err != nil { // unreachable: FormatFloat's output parses
		return float64(x)
	}
	return v
}

// mergeConfig is the config.json to write: the imported one (orig, may be
// nil) with every owned key set, except where orig already says the same
// (so "1e-06" stays "1e-06" and "gelu_pytorch_tanh" stays itself). Without
// orig the template keys are added.
func mergeConfig(orig, owned, template, nullMeans map[string]any) map[string]any {
	out := map[string]any{}
	if orig == nil {
		for k, v := range template {
			out[k] = v
		}
	}
	for k, v := range orig {
		out[k] = v
	}
	keys := make([]string, 0, len(owned))
	for k := range owned {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ov, ok := orig[k]
		if ok && (sameValue(k, ov, owned[k]) || ov == nil && nullMeans[k] != nil && nullMeans[k] == owned[k]) {
			continue
		}
		if k == "torch_dtype" && !ok && orig["dtype"] != nil {
			out["dtype"] = owned[k] // transformers >= 4.56 writes "dtype"
			continue
		}
		out[k] = owned[k]
	}
	if orig != nil && orig["model_type"] == "mistral" {
		out["model_type"] = "mistral" // same table as llama
	}
	return out
}

// sameValue compares a config value read with UseNumber (a) with one the
// exporter derived (b): numbers equal as float32 (gotron keeps epsilons in
// float32), activations equal when they mean the same function.
func sameValue(key string, a, b any) bool {
	if n, ok := a.(json.Number); ok {
		x, err := n.Float64()
		if err != nil {
			return false
		}
		var y float64
		switch v := b.(type) {
		case int:
			y = float64(v)
		case float64:
			y = v
		default:
			return false
		}
		return x == y || float32(x) == float32(y) && !math.IsNaN(x)
	}
	if key == "activation_function" {
		as, _ := a.(string)
		bs, _ := b.(string)
		x, okx := gpt2Activation(as)
		y, oky := gpt2Activation(bs)
		return okx && oky && x == y
	}
	if key == "model_type" && a == "mistral" && b == "llama" {
		return true
	}
	return reflect.DeepEqual(a, b)
}

// decodeInto unmarshals config.json into v.
func decodeInto(raw []byte, v any) error { return json.Unmarshal(raw, v) }

// decodeJSONObject reads a JSON object keeping numbers as written.
func decodeJSONObject(raw []byte) (map[string]any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("want a JSON object, got null")
	}
	return m, nil
}

// keepRopeParameters writes the RoPE base where the imported config.json
// had it: a transformers 5 config (rope_parameters, no rope_theta) keeps
// its form instead of gaining a rope_theta key.
func keepRopeParameters(orig, merged map[string]any, c gpt.Config) {
	rp, ok := orig["rope_parameters"].(map[string]any)
	if _, top := orig["rope_theta"]; !ok || top {
		return
	}
	delete(merged, "rope_theta")
	if !sameValue("rope_theta", rp["rope_theta"], c.RotaryBase) {
		out := map[string]any{}
		for k, v := range rp {
			out[k] = v
		}
		out["rope_theta"] = c.RotaryBase
		merged["rope_parameters"] = out
	}
}
