package hf

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/model/gpt"
)

// Qwen3-Next (transformers' modeling_qwen3_next.py): the hybrid of gated
// delta net layers (gotron's --experimental-attention-variant
// gated_delta_net, "linear_attention" in layer_types) and gated full
// attention (--attention-output-gate with --qk-layernorm), with Qwen's MoE
// (softmax routing, a shared expert scaled by sigmoid(shared_expert_gate ·
// x): --moe-shared-expert-gate). Its RMSNorms scale by 1 + weight
// (--apply-layernorm-1p: the stored weights are gotron's γ as they are),
// except the gated norm inside the delta net (Qwen3NextRMSNormGated), whose
// weight w is the scale itself: gotron normalises the delta net's output
// with the model's norm, 1 + γ under --apply-layernorm-1p, so γ = w − 1 on
// import and w = γ + 1 on export (exact for w in [0.5, 2] (Sterbenz), and
// for γ a multiple of 2⁻²³ in [−0.5, 1]; trained gated-norm weights sit
// near 1). RoPE rotates halves of the first head_dim·partial_rotary_factor
// channels (--rotary-percent).
const ArchQwen3Next = "qwen3_next" // Qwen3NextForCausalLM

// qwen3NextConfig holds Qwen3NextConfig's keys beyond hfConfig's.
type qwen3NextConfig struct {
	LayerTypes            []string `json:"layer_types"`
	FullAttentionInterval *int     `json:"full_attention_interval"`
	LinearNumKeyHeads     *int     `json:"linear_num_key_heads"`
	LinearNumValueHeads   *int     `json:"linear_num_value_heads"`
	LinearKeyHeadDim      *int     `json:"linear_key_head_dim"`
	LinearValueHeadDim    *int     `json:"linear_value_head_dim"`
	LinearConvKernelDim   *int     `json:"linear_conv_kernel_dim"`
	PartialRotaryFactor   *float64 `json:"partial_rotary_factor"`
}

// qwen3NextRopeParameters is transformers 5's rope_parameters for Qwen3-Next.
type qwen3NextRopeParameters struct {
	RopeType            *string  `json:"rope_type"`
	RopeTheta           *float64 `json:"rope_theta"`
	PartialRotaryFactor *float64 `json:"partial_rotary_factor"`
}

// qwen3NextPartialRotary is Qwen3NextConfig's default partial_rotary_factor.
const qwen3NextPartialRotary = 0.25

// qwen3NextParse turns a Qwen3NextConfig (raw, c its common keys) into
// gotron's model config. The shapes must be in config.json (not
// transformers' class defaults).
func qwen3NextParse(raw []byte, c *hfConfig) (cfg gpt.Config, vocab int, err error) {
	var q qwen3NextConfig
	if err := json.Unmarshal(raw, &q); err != nil {
		return gpt.Config{}, 0, err
	}
	need := func(name string, p *int, min int64) int {
		if err != nil {
			return 0
		}
		if p == nil {
			err = fmt.Errorf("%s: missing (gotron reads Qwen3-Next's shapes from config.json, not transformers' class defaults)", name)
			return 0
		}
		err = checked.Range(name, int64(*p), min, maxDim)
		return *p
	}
	vocab = need("vocab_size", c.VocabSize, 1)
	h, layers := need("hidden_size", c.HiddenSize, 1), need("num_hidden_layers", c.NumHiddenLayers, 1)
	heads, kv, d := need("num_attention_heads", c.NumAttentionHeads, 1), need("num_key_value_heads", c.NumKeyValueHeads, 1), need("head_dim", c.HeadDim, 1)
	ffn, positions := need("intermediate_size", c.IntermediateSize, 1), need("max_position_embeddings", c.MaxPositionEmbeddings, 1)
	nk, nv := need("linear_num_key_heads", q.LinearNumKeyHeads, 1), need("linear_num_value_heads", q.LinearNumValueHeads, 1)
	dk, dv := need("linear_key_head_dim", q.LinearKeyHeadDim, 1), need("linear_value_head_dim", q.LinearValueHeadDim, 1)
	conv := need("linear_conv_kernel_dim", q.LinearConvKernelDim, 1)
	if err != nil {
		return gpt.Config{}, 0, err
	}
	switch {
	case heads%kv != 0:
		return gpt.Config{}, 0, fmt.Errorf("num_attention_heads=%d: want a multiple of num_key_value_heads=%d", heads, kv)
	case nv%nk != 0:
		return gpt.Config{}, 0, fmt.Errorf("linear_num_value_heads=%d: want a multiple of linear_num_key_heads=%d", nv, nk)
	case c.HiddenAct != nil && *c.HiddenAct != "silu":
		return gpt.Config{}, 0, fmt.Errorf("hidden_act %q: want silu (SwiGLU; the delta net's convolution and gate use it too)", *c.HiddenAct)
	case boolOr(c.AttentionBias, false):
		return gpt.Config{}, 0, fmt.Errorf("attention_bias=true: not supported (gotron's gated attention has no q/k/v/o biases)")
	case !isNull(c.RopeScaling):
		return gpt.Config{}, 0, fmt.Errorf("rope_scaling %s: not supported (gotron imports Qwen3-Next with plain RoPE: want null)", c.RopeScaling)
	}
	theta, partial := floatOr(c.RopeTheta, 10000), floatOr(q.PartialRotaryFactor, qwen3NextPartialRotary)
	if !isNull(c.RopeParameters) {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(c.RopeParameters, &keys); err != nil {
			return gpt.Config{}, 0, fmt.Errorf("rope_parameters %s: want an object: %w", c.RopeParameters, err)
		}
		for k := range keys {
			if k != "rope_type" && k != "rope_theta" && k != "partial_rotary_factor" {
				return gpt.Config{}, 0, fmt.Errorf("rope_parameters.%s: not supported (gotron reads rope_type default, rope_theta and partial_rotary_factor)", k)
			}
		}
		var rp qwen3NextRopeParameters
		if err := json.Unmarshal(c.RopeParameters, &rp); err != nil {
			return gpt.Config{}, 0, fmt.Errorf("rope_parameters %s: %w", c.RopeParameters, err)
		}
		if rp.RopeType != nil && *rp.RopeType != "default" {
			return gpt.Config{}, 0, fmt.Errorf("rope_parameters.rope_type %q: want default (plain RoPE)", *rp.RopeType)
		}
		if rp.RopeTheta != nil {
			if c.RopeTheta != nil && *c.RopeTheta != *rp.RopeTheta {
				return gpt.Config{}, 0, fmt.Errorf("rope_theta %v contradicts rope_parameters.rope_theta %v", *c.RopeTheta, *rp.RopeTheta)
			}
			theta = *rp.RopeTheta
		}
		if rp.PartialRotaryFactor != nil {
			if q.PartialRotaryFactor != nil && *q.PartialRotaryFactor != *rp.PartialRotaryFactor {
				return gpt.Config{}, 0, fmt.Errorf("partial_rotary_factor %v contradicts rope_parameters.partial_rotary_factor %v", *q.PartialRotaryFactor, *rp.PartialRotaryFactor)
			}
			partial = *rp.PartialRotaryFactor
		}
	}
	if !(theta > 0) || math.IsInf(theta, 0) {
		return gpt.Config{}, 0, fmt.Errorf("rope_theta %v: want a positive finite number", theta)
	}
	// transformers rotates int(head_dim·partial_rotary_factor) channels, gotron floor(kv_channels·rotary_percent)
	if rd := int(float64(d) * partial); !(partial > 0 && partial <= 1) || rd <= 0 || rd%2 != 0 {
		return gpt.Config{}, 0, fmt.Errorf("partial_rotary_factor=%g with head_dim=%d rotates %d channels: want a factor in (0, 1] giving an even, positive count", partial, d, rd)
	}
	pattern, err := qwen3NextLayers(&q, layers)
	if err != nil {
		return gpt.Config{}, 0, err
	}
	eps := floatOr(c.RMSNormEps, 1e-6)
	if !(eps > 0) || math.IsInf(eps, 0) {
		return gpt.Config{}, 0, fmt.Errorf("rms_norm_eps %v: want a positive finite number", eps)
	}
	cfg = gpt.Config{NumLayers: layers, HiddenSize: h, NumAttentionHeads: heads, NumQueryGroups: kv, KVChannels: d,
		FFNHiddenSize: ffn, MaxPositionEmbeddings: positions, PositionEmbeddingType: gpt.RoPE, RotaryBase: theta,
		RotaryPercent: partial, Normalization: gpt.RMSNorm, NormEpsilon: float32(eps), LayerNorm1P: true, QKLayerNorm: true,
		Activation: gpt.SwiGLU, DisableBiasLinear: true, AttentionOutputGate: true,
		UntieEmbeddingsAndOutputWeights: !boolOr(c.TieWordEmb, false),
		GDN: gpt.GDNConfig{Enabled: true, LinearAttentionFreq: layerList(pattern), ConvKernel: conv, KeyHeadDim: dk,
			ValueHeadDim: dv, NumKeyHeads: nk, NumValueHeads: nv}}
	if c.NumExperts == nil {
		return gpt.Config{}, 0, fmt.Errorf("num_experts: missing (0 for a dense model)")
	}
	e := *c.NumExperts
	if err := checked.Range("num_experts", int64(e), 0, maxDim); err != nil {
		return gpt.Config{}, 0, err
	}
	if e == 0 {
		return cfg, vocab, nil
	}
	k, f := need("num_experts_per_tok", c.NumExpertsPerTok, 1), need("moe_intermediate_size", c.MoEIntermediateSize, 1)
	shared := need("shared_expert_intermediate_size", c.SharedExpertIntermediateSize, 1)
	if err != nil {
		return gpt.Config{}, 0, fmt.Errorf("%w (num_experts=%d)", err, e)
	}
	if k > e {
		return gpt.Config{}, 0, fmt.Errorf("num_experts_per_tok=%d: want at most num_experts=%d", k, e)
	}
	moe, err := qwenPattern(intOr(c.DecoderSparseStep, 1), c.MLPOnlyLayers, layers)
	if err != nil {
		return gpt.Config{}, 0, err
	}
	cfg.MoE = gpt.MoEConfig{NumExperts: e, TopK: k, FFNHiddenSize: f, PreSoftmax: !boolOr(c.NormTopKProb, true),
		LayerFreq: layerFreq(moe), GroupedGEMM: true, SharedExpertFFN: shared, SharedExpertGate: true}
	return cfg, vocab, nil
}

// qwen3NextLayers is each layer's kind (true: linear attention, a gated
// delta net): layer_types, or else full_attention_interval's (layer i is
// full attention iff (i+1) % interval == 0).
func qwen3NextLayers(q *qwen3NextConfig, layers int) ([]bool, error) {
	p := make([]bool, layers)
	if q.LayerTypes != nil {
		if len(q.LayerTypes) != layers {
			return nil, fmt.Errorf("layer_types has %d entries: want num_hidden_layers=%d", len(q.LayerTypes), layers)
		}
		for i, t := range q.LayerTypes {
			switch t {
			case "linear_attention":
				p[i] = true
			case "full_attention":
			default:
				return nil, fmt.Errorf("layer_types[%d] %q: want linear_attention or full_attention", i, t)
			}
		}
		return p, nil
	}
	if q.FullAttentionInterval == nil {
		return nil, fmt.Errorf("layer_types and full_attention_interval: both missing (gotron reads the layer kinds from config.json)")
	}
	n := *q.FullAttentionInterval
	if err := checked.Range("full_attention_interval", int64(n), 1, maxDim); err != nil {
		return nil, err
	}
	for i := range p {
		p[i] = (i+1)%n != 0
	}
	return p, nil
}

// layerList is a 0/1 per-layer list flag value ("[1,0,1]").
func layerList(p []bool) string {
	s := make([]string, len(p))
	for i, on := range p {
		s[i] = map[bool]string{true: "1", false: "0"}[on]
	}
	return "[" + strings.Join(s, ",") + "]"
}

// qwen3NextTable is Qwen3NextForCausalLM ↔ gotron:
//
//	model.layers.N.input_layernorm, post_attention_layernorm      decoder.layers.N.input_layernorm, pre_mlp_layernorm
//	full attention: …self_attn.q_proj (a·2d, h) per head [q; gate],
//	  k_proj, v_proj (g·d, h)                                      …self_attention.linear_qkv.weight, per group
//	                                                                  [q (r·d); gate (r·d); k; v] (opGatedQKV)
//	  …self_attn.q_norm, k_norm (d), o_proj                        …q_layernorm, k_layernorm, linear_proj
//	linear attention: …linear_attn.in_proj_qkvz, in_proj_ba        …self_attention.in_proj.weight.{query,key,value,
//	                                                                  z,beta,alpha} (opGDNInProj)
//	  …linear_attn.conv1d.weight (2qk+v, 1, K)                     …conv1d.weight.{query,key,value}
//	  …linear_attn.dt_bias, A_log, out_proj                        …dt_bias, A_log, out_proj.weight
//	  …linear_attn.norm.weight (dv) w                              …out_norm.weight γ = w − 1 (opPlusOne)
//	MoE layers: …mlp.gate, experts.E.*, shared_expert.*,
//	  shared_expert_gate                                           as Qwen2-MoE's (moeTable)
func qwen3NextTable(c gpt.Config, vocab int) []entry {
	h, moe, g := c.HiddenSize, c.MoE, c.GDN
	t := []entry{one("embedding.word_embeddings.weight", opPadVocab, "model.embed_tokens.weight", vocab, h)}
	for i := range c.NumLayers {
		gn, p := fmt.Sprintf("decoder.layers.%d.", i), fmt.Sprintf("model.layers.%d.", i)
		if c.IsGDNLayer(i) {
			a, s := gn+"self_attention.", p+"linear_attn."
			qk, v := g.NumKeyHeads*g.KeyHeadDim, g.NumValueHeads*g.ValueHeadDim
			t = append(t, one(gn+"input_layernorm.weight", opCopy, p+"input_layernorm.weight", h),
				entry{Gotron: a + "in_proj.weight.query", More: []string{a + "in_proj.weight.key", a + "in_proj.weight.value",
					a + "in_proj.weight.z", a + "in_proj.weight.beta", a + "in_proj.weight.alpha"}, Op: opGDNInProj,
					HF: []hfTensor{{s + "in_proj_qkvz.weight", []int{2*qk + 2*v, h}}, {s + "in_proj_ba.weight", []int{2 * g.NumValueHeads, h}}}},
				entry{Gotron: a + "conv1d.weight.query", More: []string{a + "conv1d.weight.key", a + "conv1d.weight.value"}, Op: opCopy,
					HF: []hfTensor{{s + "conv1d.weight", []int{2*qk + v, 1, g.ConvKernel}}}},
				one(a+"dt_bias", opCopy, s+"dt_bias", g.NumValueHeads),
				one(a+"A_log", opCopy, s+"A_log", g.NumValueHeads),
				one(a+"out_norm.weight", opPlusOne, s+"norm.weight", g.ValueHeadDim),
				one(a+"out_proj.weight", opCopy, s+"out_proj.weight", h, v),
				one(gn+"pre_mlp_layernorm.weight", opCopy, p+"post_attention_layernorm.weight", h))
		} else {
			d, n, kv := c.KVChannels, c.NumAttentionHeads, c.NumQueryGroups
			t = append(t, one(gn+"input_layernorm.weight", opCopy, p+"input_layernorm.weight", h),
				entry{Gotron: gn + "self_attention.linear_qkv.weight", Op: opGatedQKV, HF: []hfTensor{
					{p + "self_attn.q_proj.weight", []int{2 * n * d, h}},
					{p + "self_attn.k_proj.weight", []int{kv * d, h}},
					{p + "self_attn.v_proj.weight", []int{kv * d, h}}}},
				one(gn+"self_attention.q_layernorm.weight", opCopy, p+"self_attn.q_norm.weight", d),
				one(gn+"self_attention.k_layernorm.weight", opCopy, p+"self_attn.k_norm.weight", d),
				one(gn+"self_attention.linear_proj.weight", opCopy, p+"self_attn.o_proj.weight", h, n*d),
				one(gn+"pre_mlp_layernorm.weight", opCopy, p+"post_attention_layernorm.weight", h))
		}
		if !moe.Enabled() || !moe.IsMoELayer(i, c.NumLayers) {
			t = append(t, swiGLU(gn+"mlp.linear_fc1.weight", gn+"mlp.linear_fc2.weight", p+"mlp.", c.FFNHiddenSize, h)...)
			continue
		}
		t = append(t, one(gn+"mlp.router.weight", opCopy, p+"mlp.gate.weight", moe.NumExperts, h))
		for e := range moe.NumExperts {
			fc1, fc2 := expertNames(c, i, e)
			t = append(t, swiGLU(fc1, fc2, fmt.Sprintf("%smlp.experts.%d.", p, e), moe.FFNHiddenSize, h)...)
		}
		t = append(t, swiGLU(gn+"mlp.shared_experts.linear_fc1.weight", gn+"mlp.shared_experts.linear_fc2.weight", p+"mlp.shared_expert.", moe.SharedExpertFFN, h)...)
		t = append(t, one(gn+"mlp.shared_experts.gate_weight", opCopy, p+"mlp.shared_expert_gate.weight", 1, h))
	}
	return append(t, llamaHead(c, vocab)...)
}

// qwen3NextArchOf is ArchOf for a model with gated delta nets or the
// attention output gate: Qwen3-Next, or an error naming the first setting
// it does not have.
func qwen3NextArchOf(c gpt.Config) (string, error) {
	m := c.MoE
	switch {
	case !c.GDN.Enabled || !c.AttentionOutputGate:
		return "", fmt.Errorf("hf: gated delta net %v, attention output gate %v: Qwen3-Next has both (--experimental-attention-variant gated_delta_net --attention-output-gate)", c.GDN.Enabled, c.AttentionOutputGate)
	case c.Normalization != gpt.RMSNorm || !c.LayerNorm1P || !c.QKLayerNorm:
		return "", fmt.Errorf("hf: %s, layernorm 1p %v, qk layernorm %v: Qwen3-Next wants RMSNorm with --apply-layernorm-1p and --qk-layernorm", c.Normalization, c.LayerNorm1P, c.QKLayerNorm)
	case c.Activation != gpt.SwiGLU || !c.DisableBiasLinear || c.AddQKVBias:
		return "", fmt.Errorf("hf: activation %s, disable bias %v, qkv bias %v: Qwen3-Next wants swiglu and no biases", c.Activation, c.DisableBiasLinear, c.AddQKVBias)
	case c.PositionEmbeddingType != gpt.RoPE || c.RotaryInterleaved:
		return "", fmt.Errorf("hf: position embedding %s, interleaved %v: Qwen3-Next wants rope rotating halves", c.PositionEmbeddingType, c.RotaryInterleaved)
	case int(float64(c.KVChannels)*c.RotaryPercent) != c.RotaryDim():
		return "", fmt.Errorf("hf: --rotary-percent %g with --kv-channels %d: transformers' int(head_dim·partial_rotary_factor) differs from gotron's rotary dim %d", c.RotaryPercent, c.KVChannels, c.RotaryDim())
	case c.MLA.Enabled || c.MuP.Enabled:
		return "", fmt.Errorf("hf: Qwen3-Next has neither multi-latent attention nor muP")
	}
	if !m.Enabled() {
		return ArchQwen3Next, nil
	}
	switch {
	case m.Score != gpt.ScoreSoftmax || m.NumGroups > 0 || m.ExpertBias || m.CapacityFactor != 0 ||
		m.TopKScalingFactor != 0 && m.TopKScalingFactor != 1:
		return "", fmt.Errorf("hf: MoE routing (%s, groups %d, expert bias %v, capacity %g, scaling %g): Qwen3-Next routes by softmax top-k, no groups, bias, capacity or scaling", m.Score, m.NumGroups, m.ExpertBias, m.CapacityFactor, m.TopKScalingFactor)
	case m.SharedExpertFFN == 0 || !m.SharedExpertGate:
		return "", fmt.Errorf("hf: shared expert %d, gate %v: Qwen3-Next's MoE layers have a shared expert with its sigmoid gate (--moe-shared-expert-intermediate-size, --moe-shared-expert-gate)", m.SharedExpertFFN, m.SharedExpertGate)
	}
	return ArchQwen3Next, nil
}

// qwen3NextExportConfig fills owned and template with Qwen3-Next's keys.
func qwen3NextExportConfig(c gpt.Config, vocab int, dtype string) (owned, template, nullMeans map[string]any, err error) {
	pattern, err := c.GDN.Pattern(c.NumLayers)
	if err != nil {
		return nil, nil, nil, err
	}
	kinds := make([]any, len(pattern))
	for i, lin := range pattern {
		kinds[i] = map[bool]string{true: "linear_attention", false: "full_attention"}[lin]
	}
	var interval any // null unless the layer kinds are a period
	for n := 1; n <= c.NumLayers; n++ {
		periodic := true
		for i, lin := range pattern {
			periodic = periodic && lin == ((i+1)%n != 0)
		}
		if periodic {
			interval = n
			break
		}
	}
	g, m := c.GDN, c.MoE
	owned = map[string]any{"model_type": ArchQwen3Next, "vocab_size": vocab, "hidden_size": c.HiddenSize,
		"intermediate_size": c.FFNHiddenSize, "num_hidden_layers": c.NumLayers, "num_attention_heads": c.NumAttentionHeads,
		"num_key_value_heads": c.NumQueryGroups, "head_dim": c.KVChannels, "max_position_embeddings": c.MaxPositionEmbeddings,
		"rms_norm_eps": decimal32(c.NormEpsilon), "rope_theta": c.RotaryBase, "partial_rotary_factor": c.RotaryPercent,
		"hidden_act": "silu", "tie_word_embeddings": !c.UntieEmbeddingsAndOutputWeights, "torch_dtype": torchDType(dtype),
		"layer_types": kinds, "full_attention_interval": interval, "linear_conv_kernel_dim": g.ConvKernel,
		"linear_key_head_dim": g.KeyHeadDim, "linear_value_head_dim": g.ValueHeadDim, "linear_num_key_heads": g.NumKeyHeads,
		"linear_num_value_heads": g.NumValueHeads, "num_experts": 0, "rope_scaling": nil, "attention_bias": false}
	template = map[string]any{"architectures": []any{"Qwen3NextForCausalLM"}, "attention_dropout": 0.0,
		"initializer_range": decimal32(c.InitMethodStd), "use_cache": true, "output_router_logits": false}
	if m.Enabled() {
		var dense []any
		for i, on := range moePattern(c) {
			if !on {
				dense = append(dense, i)
			}
		}
		owned["num_experts"], owned["num_experts_per_tok"] = m.NumExperts, m.TopK
		owned["moe_intermediate_size"], owned["shared_expert_intermediate_size"] = m.FFNHiddenSize, m.SharedExpertFFN
		owned["norm_topk_prob"] = !m.PreSoftmax
		owned["decoder_sparse_step"], owned["mlp_only_layers"] = 1, append([]any{}, dense...)
		template["router_aux_loss_coef"] = m.AuxLossCoeff
	}
	return owned, template, map[string]any{}, nil
}

// sameQwen3Next compares what Qwen3-Next's config.json carries beyond sameArch.
func sameQwen3Next(a, b gpt.Config) bool {
	pa, err1 := a.GDN.Pattern(a.NumLayers)
	pb, err2 := b.GDN.Pattern(b.NumLayers)
	ga, gb := a.GDN, b.GDN
	ga.LinearAttentionFreq, gb.LinearAttentionFreq = "", ""
	return err1 == nil && err2 == nil && slices.Equal(pa, pb) && ga == gb && a.RotaryPercent == b.RotaryPercent &&
		a.AttentionOutputGate == b.AttentionOutputGate && a.LayerNorm1P == b.LayerNorm1P
}

// keepQwen3NextForm keeps the imported config's form where it describes
// the model: layer kinds given by full_attention_interval alone gain no
// layer_types, and a partial_rotary_factor inside transformers 5's
// rope_parameters stays there.
func keepQwen3NextForm(orig, merged map[string]any, origRaw []byte, c gpt.Config) {
	var q qwen3NextConfig
	if orig == nil || decodeInto(origRaw, &q) != nil {
		return
	}
	if _, ok := orig["layer_types"]; !ok && q.FullAttentionInterval != nil {
		p, err := qwen3NextLayers(&q, c.NumLayers)
		want, err2 := c.GDN.Pattern(c.NumLayers)
		if err == nil && err2 == nil && slices.Equal(p, want) {
			delete(merged, "layer_types")
			merged["full_attention_interval"] = orig["full_attention_interval"]
		}
	}
	rp, ok := orig["rope_parameters"].(map[string]any)
	if _, top := orig["partial_rotary_factor"]; ok && !top && sameValue("partial_rotary_factor", rp["partial_rotary_factor"], c.RotaryPercent) {
		delete(merged, "partial_rotary_factor")
	}
}
