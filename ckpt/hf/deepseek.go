package hf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"

	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/model/gpt"
)

// DeepSeek-V2 and DeepSeek-V3: multi-latent attention (gotron's
// --multi-latent-attention, Megatron's MLASelfAttention) with YaRN, RMSNorm,
// SwiGLU, and DeepSeekMoE layers after the first first_k_dense_replace dense
// ones: routed experts of moe_intermediate_size, shared experts of
// moe_intermediate_size·n_shared_experts (one ungated MLP, --moe-shared-
// expert-intermediate-size), routing weights times routed_scaling_factor
// (--moe-router-topk-scaling-factor). What they compute is transformers'
// modeling_deepseek_v3.py and modeling_deepseek_v2.py:
//
//   - V3 routes by sigmoid scores plus e_score_correction_bias (Megatron's
//     --moe-router-score-function sigmoid with --moe-router-enable-expert-
//     bias: mlp.router.expert_bias), keeps the topk_group of n_group groups
//     ranked by the sum of each group's top 2 (Megatron's group-limited
//     top-k ranks by its top topk/topk_group: equal when that is 2), and
//     renormalises the chosen scores (norm_topk_prob; Megatron always does
//     for sigmoid with k > 1). Its softmax scale is mscale(factor,
//     mscale_all_dim)²/√(q head dim), Megatron's MLA scale.
//   - V2 routes by softmax over all experts, top-k not renormalised
//     (--moe-router-pre-softmax), group_limited_greedy ranking groups by
//     their best expert (Megatron's group top-k with topk = topk_group).
//     transformers' DeepseekV2Attention scales by 1/√(q head dim) alone.
//
// The rotary channels: V3's apply_rotary_pos_emb_interleave (rope_interleave)
// and V2's complex product rotate the pairs (2i, 2i+1) by frequency i, as
// gotron's MLA does: no permutation of the weights. transformers normalises
// q_a_layernorm and kv_a_layernorm with ε = 1e-6 whatever rms_norm_eps is;
// gotron has one ε: rms_norm_eps must be 1e-6 (DeepSeek's).
const (
	ArchDeepSeekV2 = "deepseek_v2" // DeepseekV2ForCausalLM
	ArchDeepSeekV3 = "deepseek_v3" // DeepseekV3ForCausalLM
)

// latentNormEps is transformers' ε of DeepSeek's q_a_layernorm and
// kv_a_layernorm (DeepseekV3RMSNorm's default).
const latentNormEps = 1e-6

// deepseekConfig holds DeepseekV2Config's and DeepseekV3Config's keys
// beyond hfConfig's. q_lora_rank is kept raw: null means a plain query
// projection, as Megatron's None.
type deepseekConfig struct {
	QLoraRank           json.RawMessage `json:"q_lora_rank"`
	KVLoraRank          *int            `json:"kv_lora_rank"`
	QKNopeHeadDim       *int            `json:"qk_nope_head_dim"`
	QKRopeHeadDim       *int            `json:"qk_rope_head_dim"`
	VHeadDim            *int            `json:"v_head_dim"`
	NRoutedExperts      *int            `json:"n_routed_experts"`
	NSharedExperts      *int            `json:"n_shared_experts"`
	RoutedScalingFactor *float64        `json:"routed_scaling_factor"`
	NGroup              *int            `json:"n_group"`
	TopKGroup           *int            `json:"topk_group"`
	TopKMethod          *string         `json:"topk_method"`
	ScoringFunc         *string         `json:"scoring_func"`
	FirstKDenseReplace  *int            `json:"first_k_dense_replace"`
	MoELayerFreq        *int            `json:"moe_layer_freq"`
	RopeInterleave      *bool           `json:"rope_interleave"`
}

// yarnKeys are the rope_scaling (transformers 5: rope_parameters) keys read;
// any other is refused by name.
var yarnKeys = []string{"type", "rope_type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
	"mscale", "mscale_all_dim", "truncate", "rope_theta"}

type yarnConfig struct {
	Type         *string  `json:"type"`
	RopeType     *string  `json:"rope_type"`
	Factor       *float64 `json:"factor"`
	OrigMaxPos   *int     `json:"original_max_position_embeddings"`
	BetaFast     *float64 `json:"beta_fast"`
	BetaSlow     *float64 `json:"beta_slow"`
	Mscale       *float64 `json:"mscale"`
	MscaleAllDim *float64 `json:"mscale_all_dim"`
	Truncate     *bool    `json:"truncate"`
	RopeTheta    *float64 `json:"rope_theta"`
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// deepseekParse turns a DeepseekV2Config or DeepseekV3Config (raw, c its
// common keys) into gotron's MLA (and MoE) model config.
func deepseekParse(raw []byte, c *hfConfig, arch string) (cfg gpt.Config, vocab int, err error) {
	var d deepseekConfig
	if err := json.Unmarshal(raw, &d); err != nil {
		return gpt.Config{}, 0, err
	}
	need := func(name string, p *int) int {
		if err == nil && p == nil {
			err = fmt.Errorf("%s: missing (gotron reads DeepSeek's shapes from config.json, not transformers' class defaults)", name)
		}
		if p == nil {
			return 0
		}
		return *p
	}
	vocab = need("vocab_size", c.VocabSize)
	h, layers, heads := need("hidden_size", c.HiddenSize), need("num_hidden_layers", c.NumHiddenLayers), need("num_attention_heads", c.NumAttentionHeads)
	ffn, positions := need("intermediate_size", c.IntermediateSize), need("max_position_embeddings", c.MaxPositionEmbeddings)
	kvLora, nope, rope, vd := need("kv_lora_rank", d.KVLoraRank), need("qk_nope_head_dim", d.QKNopeHeadDim), need("qk_rope_head_dim", d.QKRopeHeadDim), need("v_head_dim", d.VHeadDim)
	firstDense := need("first_k_dense_replace", d.FirstKDenseReplace)
	if err != nil {
		return gpt.Config{}, 0, err
	}
	for _, f := range []struct {
		name string
		v    *int
		min  int64
	}{{"kv_lora_rank", d.KVLoraRank, 1}, {"qk_nope_head_dim", d.QKNopeHeadDim, 1}, {"qk_rope_head_dim", d.QKRopeHeadDim, 1},
		{"v_head_dim", d.VHeadDim, 1}, {"n_routed_experts", d.NRoutedExperts, 1}, {"n_shared_experts", d.NSharedExperts, 0},
		{"n_group", d.NGroup, 1}, {"topk_group", d.TopKGroup, 1}, {"first_k_dense_replace", d.FirstKDenseReplace, 0},
		{"moe_layer_freq", d.MoELayerFreq, 1}} {
		if f.v != nil {
			if err := checked.Range(f.name, int64(*f.v), f.min, maxDim); err != nil {
				return gpt.Config{}, 0, err
			}
		}
	}
	qLora := 0
	if !isNull(d.QLoraRank) {
		if err := json.Unmarshal(d.QLoraRank, &qLora); err != nil {
			return gpt.Config{}, 0, fmt.Errorf("q_lora_rank %s: want an integer or null: %w", d.QLoraRank, err)
		}
		if err := checked.Range("q_lora_rank", int64(qLora), 1, maxDim); err != nil {
			return gpt.Config{}, 0, err
		}
	} else if len(bytes.TrimSpace(d.QLoraRank)) == 0 {
		return gpt.Config{}, 0, fmt.Errorf("q_lora_rank: missing (null for a plain query projection)")
	}
	switch {
	case c.NumKeyValueHeads != nil && *c.NumKeyValueHeads != heads:
		return gpt.Config{}, 0, fmt.Errorf("num_key_value_heads=%d: DeepSeek's multi-latent attention has one key and value per head (want num_attention_heads=%d)", *c.NumKeyValueHeads, heads)
	case c.HiddenAct != nil && *c.HiddenAct != "silu":
		return gpt.Config{}, 0, fmt.Errorf("hidden_act %q: want silu (SwiGLU)", *c.HiddenAct)
	case boolOr(c.AttentionBias, false) || boolOr(c.MLPBias, false):
		return gpt.Config{}, 0, fmt.Errorf("attention_bias or mlp_bias true: not supported (gotron's MLA projections and MoE layers have no biases)")
	case float32(floatOr(c.RMSNormEps, 1e-6)) != float32(latentNormEps):
		return gpt.Config{}, 0, fmt.Errorf("rms_norm_eps=%g: gotron normalises every layer with one ε, and transformers' q_a_layernorm and kv_a_layernorm use 1e-6 whatever rms_norm_eps is: want 1e-6", *c.RMSNormEps)
	case !boolOr(d.RopeInterleave, true):
		return gpt.Config{}, 0, fmt.Errorf("rope_interleave=false: not supported (gotron rotates the rope channels' pairs (2i, 2i+1), DeepSeek's layout; rotate-half weights would need their rows permuted)")
	case d.MoELayerFreq != nil && *d.MoELayerFreq != 1:
		return gpt.Config{}, 0, fmt.Errorf("moe_layer_freq=%d: not supported (transformers' DeepSeek makes every layer from first_k_dense_replace on an MoE layer)", *d.MoELayerFreq)
	}
	mla, theta, err := deepseekRope(c, arch, positions)
	if err != nil {
		return gpt.Config{}, 0, err
	}
	mla.QLoraRank, mla.KVLoraRank, mla.QKHeadDim, mla.QKPosEmbHeadDim, mla.VHeadDim = qLora, kvLora, nope, rope, vd
	cfg = gpt.Config{NumLayers: layers, HiddenSize: h, NumAttentionHeads: heads, NumQueryGroups: heads, FFNHiddenSize: ffn,
		MaxPositionEmbeddings: positions, PositionEmbeddingType: gpt.NoPositionEmbedding, RotaryBase: theta,
		Normalization: gpt.RMSNorm, NormEpsilon: float32(latentNormEps), Activation: gpt.SwiGLU, DisableBiasLinear: true,
		UntieEmbeddingsAndOutputWeights: !boolOr(c.TieWordEmb, false), MLA: mla,
		QKLayerNorm: true} // q_a_layernorm and kv_a_layernorm: Megatron's MLA has them with --qk-layernorm only
	if firstDense >= layers {
		return cfg, vocab, nil // every layer dense: the MoE keys describe no layer
	}
	cfg.MoE, err = deepseekMoE(c, &d, arch, layers, firstDense)
	return cfg, vocab, err
}

// deepseekRope maps rope_theta and rope_scaling (or transformers 5's
// rope_parameters) to MLA's rotary settings as transformers computes them:
// _compute_yarn_parameters' inverse frequencies and attention_factor, and
// the attention's softmax scale.
func deepseekRope(c *hfConfig, arch string, positions int) (gpt.MLAConfig, float64, error) {
	mla := gpt.DefaultMLA()
	raw, where := c.RopeScaling, "rope_scaling"
	if isNull(raw) && !isNull(c.RopeParameters) {
		raw, where = c.RopeParameters, "rope_parameters"
	}
	theta := floatOr(c.RopeTheta, 10000)
	if isNull(raw) {
		mla.Rope = gpt.PlainRoPE
		return mla, theta, nil
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil {
		return mla, 0, fmt.Errorf("%s %s: want an object: %w", where, raw, err)
	}
	for k := range keys {
		if !slices.Contains(yarnKeys, k) {
			return mla, 0, fmt.Errorf("%s.%s: not supported (gotron reads YaRN's factor, original_max_position_embeddings, beta_fast, beta_slow, mscale and mscale_all_dim)", where, k)
		}
	}
	var y yarnConfig
	if err := json.Unmarshal(raw, &y); err != nil {
		return mla, 0, fmt.Errorf("%s %s: %w", where, raw, err)
	}
	if y.RopeTheta != nil {
		if c.RopeTheta != nil && *c.RopeTheta != *y.RopeTheta {
			return mla, 0, fmt.Errorf("rope_theta %v contradicts %s.rope_theta %v", *c.RopeTheta, where, *y.RopeTheta)
		}
		theta = *y.RopeTheta
	}
	if !(theta > 0) || math.IsInf(theta, 0) {
		return mla, 0, fmt.Errorf("rope_theta %v: want a positive finite number", theta)
	}
	typ := y.RopeType
	if typ == nil {
		typ = y.Type
	}
	switch {
	case typ != nil && *typ == "default" && len(keys) <= 2:
		mla.Rope = gpt.PlainRoPE // transformers 5's {"rope_type": "default", "rope_theta": θ}
		return mla, theta, nil
	case typ == nil || *typ != "yarn":
		return mla, 0, fmt.Errorf("%s %s: want rope_type yarn (DeepSeek's) or null", where, raw)
	case y.Factor == nil || !(*y.Factor > 0) || math.IsInf(*y.Factor, 0):
		return mla, 0, fmt.Errorf("%s.factor: want a positive finite number", where)
	case y.Truncate != nil && !*y.Truncate:
		return mla, 0, fmt.Errorf("%s.truncate=false: not supported (gotron's YaRN floors and ceils the correction range, as Megatron)", where)
	}
	mla.ScalingFactor = *y.Factor
	mla.OriginalMaxPositions = positions
	if y.OrigMaxPos != nil {
		if err := checked.Range(where+".original_max_position_embeddings", int64(*y.OrigMaxPos), 1, maxDim); err != nil {
			return mla, 0, err
		}
		mla.OriginalMaxPositions = *y.OrigMaxPos
		// transformers 4.5x takes factor = max_position_embeddings /
		// original_max_position_embeddings, later versions factor: they
		// agree only when the two are equal (DeepSeek's: 163840/4096 = 40)
		if r := float64(positions) / float64(*y.OrigMaxPos); r != *y.Factor {
			return mla, 0, fmt.Errorf("%s.factor=%g with max_position_embeddings/original_max_position_embeddings = %d/%d = %g: transformers versions differ on which factor applies; want them equal", where, *y.Factor, positions, *y.OrigMaxPos, r)
		}
	}
	if y.BetaFast != nil && *y.BetaFast != 0 { // transformers: beta_fast or 32
		mla.BetaFast = *y.BetaFast
	}
	if y.BetaSlow != nil && *y.BetaSlow != 0 {
		mla.BetaSlow = *y.BetaSlow
	}
	ms, msAll := floatOr(y.Mscale, 0), floatOr(y.MscaleAllDim, 0)
	for _, v := range []float64{ms, msAll, mla.BetaFast, mla.BetaSlow} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return mla, 0, fmt.Errorf("%s %s: want finite values", where, raw)
		}
	}
	// gotron's YaRN multiplies cos and sin by mscale(s, Mscale)/mscale(s,
	// MscaleAllDim) and the softmax scale by mscale(s, MscaleAllDim)²;
	// transformers' attention_factor is mscale(s, mscale)/mscale(s,
	// mscale_all_dim) when both are non-zero, else mscale(s, 1).
	switch {
	case msAll == 0:
		mla.Mscale, mla.MscaleAllDim = 1, 0
	case arch == ArchDeepSeekV2 && ms == 0:
		mla.Mscale, mla.MscaleAllDim = 1, 0 // V2's softmax scale ignores mscale_all_dim
	case arch == ArchDeepSeekV2 && ms == msAll:
		mla.Mscale, mla.MscaleAllDim = 0, 0 // attention_factor 1, softmax scale 1/√(q head dim)
	case arch == ArchDeepSeekV2:
		return mla, 0, fmt.Errorf("%s mscale=%g mscale_all_dim=%g: not supported for deepseek_v2 (transformers' DeepseekV2Attention leaves mscale_all_dim out of the softmax scale; gotron represents that when mscale equals mscale_all_dim)", where, ms, msAll)
	case ms == 0:
		return mla, 0, fmt.Errorf("%s mscale_all_dim=%g without mscale: not supported (transformers then scales cos and sin by mscale(factor, 1) and the softmax by mscale(factor, mscale_all_dim)², which gotron's YaRN does not pair)", where, msAll)
	default:
		mla.Mscale, mla.MscaleAllDim = ms, msAll
	}
	return mla, theta, nil
}

// deepseekMoE maps DeepSeek's MoE keys to gotron's MoE config.
func deepseekMoE(c *hfConfig, d *deepseekConfig, arch string, layers, firstDense int) (gpt.MoEConfig, error) {
	var err error
	need := func(name string, p *int) int {
		if err == nil && p == nil {
			err = fmt.Errorf("%s: missing (the model has MoE layers from first_k_dense_replace=%d on)", name, firstDense)
		}
		if p == nil {
			return 0
		}
		return *p
	}
	e, k, f := need("n_routed_experts", d.NRoutedExperts), need("num_experts_per_tok", c.NumExpertsPerTok), need("moe_intermediate_size", c.MoEIntermediateSize)
	if err != nil {
		return gpt.MoEConfig{}, err
	}
	if k > e {
		return gpt.MoEConfig{}, fmt.Errorf("num_experts_per_tok=%d: want at most n_routed_experts=%d", k, e)
	}
	shared := 0
	if d.NSharedExperts != nil {
		shared = *d.NSharedExperts
	}
	scale := floatOr(d.RoutedScalingFactor, map[string]float64{ArchDeepSeekV2: 1, ArchDeepSeekV3: 2.5}[arch])
	if !(scale > 0) || math.IsInf(scale, 0) {
		return gpt.MoEConfig{}, fmt.Errorf("routed_scaling_factor=%g: want a positive finite number", scale)
	}
	sharedFFN, ok := checked.Mul(int64(f), int64(shared))
	if !ok || sharedFFN > maxDim {
		return gpt.MoEConfig{}, fmt.Errorf("moe_intermediate_size=%d × n_shared_experts=%d: too large", f, shared)
	}
	pattern := make([]bool, layers)
	for i := range pattern {
		pattern[i] = i >= firstDense
	}
	m := gpt.MoEConfig{NumExperts: e, TopK: k, FFNHiddenSize: f, LayerFreq: layerFreq(pattern), GroupedGEMM: true,
		SharedExpertFFN: int(sharedFFN), TopKScalingFactor: scale}
	norm := boolOr(c.NormTopKProb, arch == ArchDeepSeekV3)
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	if arch == ArchDeepSeekV3 {
		switch {
		case d.ScoringFunc != nil && *d.ScoringFunc != "sigmoid":
			return gpt.MoEConfig{}, fmt.Errorf("scoring_func %q: transformers' DeepSeek-V3 routes by sigmoid", *d.ScoringFunc)
		case d.TopKMethod != nil && *d.TopKMethod != "noaux_tc":
			return gpt.MoEConfig{}, fmt.Errorf("topk_method %q: transformers' DeepSeek-V3 routes by noaux_tc (sigmoid scores plus e_score_correction_bias, group-limited)", *d.TopKMethod)
		case norm != (k > 1):
			// Megatron renormalises sigmoid's top-k exactly when k > 1
			return gpt.MoEConfig{}, fmt.Errorf("norm_topk_prob=%v with num_experts_per_tok=%d: gotron's sigmoid router (Megatron's) renormalises the top-k weights exactly when k > 1", norm, k)
		}
		g, gk := 8, 4 // DeepseekV3Config's defaults
		if d.NGroup != nil {
			g = *d.NGroup
		}
		if d.TopKGroup != nil {
			gk = *d.TopKGroup
		}
		switch {
		case e%g != 0 || gk > g || e/g < 2:
			return gpt.MoEConfig{}, fmt.Errorf("n_group=%d topk_group=%d with n_routed_experts=%d: want groups of at least 2 experts (transformers ranks a group by its top 2) and topk_group <= n_group", g, gk, e)
		case gk < g && (k%gk != 0 || k/gk != 2):
			return gpt.MoEConfig{}, fmt.Errorf("n_group=%d topk_group=%d with num_experts_per_tok=%d: transformers ranks groups by their top 2 experts, Megatron's group-limited routing by their top num_experts_per_tok/topk_group: want num_experts_per_tok = 2·topk_group", g, gk, k)
		case gk < g:
			m.NumGroups, m.GroupTopK = g, gk
		}
		m.Score, m.ExpertBias = gpt.ScoreSigmoid, true
		return m, nil
	}
	switch method := str(d.TopKMethod); {
	case d.ScoringFunc != nil && *d.ScoringFunc != "softmax":
		return gpt.MoEConfig{}, fmt.Errorf("scoring_func %q: transformers' DeepSeek-V2 routes by softmax", *d.ScoringFunc)
	case norm:
		return gpt.MoEConfig{}, fmt.Errorf("norm_topk_prob=true: not supported for deepseek_v2 (transformers' DeepseekV2Moe scales the top-k softmax by routed_scaling_factor without renormalising, DeepSeek's own code renormalises and does not scale)")
	case method == "" || method == "greedy":
	case method == "group_limited_greedy":
		if d.NGroup == nil || d.TopKGroup == nil {
			return gpt.MoEConfig{}, fmt.Errorf("topk_method group_limited_greedy: n_group and topk_group are required")
		}
		g, gk := *d.NGroup, *d.TopKGroup
		switch {
		case e%g != 0 || gk > g:
			return gpt.MoEConfig{}, fmt.Errorf("n_group=%d topk_group=%d with n_routed_experts=%d: want n_group dividing the experts and topk_group <= n_group", g, gk, e)
		case gk < g && k != gk:
			return gpt.MoEConfig{}, fmt.Errorf("group_limited_greedy with num_experts_per_tok=%d and topk_group=%d: transformers ranks groups by their best expert, Megatron's group-limited routing by their top num_experts_per_tok/topk_group: want them equal", k, gk)
		case gk < g:
			m.NumGroups, m.GroupTopK = g, gk
		}
	default:
		return gpt.MoEConfig{}, fmt.Errorf("topk_method %q: want greedy or group_limited_greedy (DeepSeek-V2's)", method)
	}
	m.PreSoftmax = true
	return m, nil
}

// deepseekTable is DeepseekV2ForCausalLM or DeepseekV3ForCausalLM ↔ gotron:
//
//	model.layers.N.self_attn.q_proj.weight (n·(nope+rope), h)       …self_attention.linear_q_proj.weight
//	  or q_a_proj (r, h), q_a_layernorm (r), q_b_proj (n·(nope+rope), r)
//	                                                             …linear_q_down_proj, q_layernorm, linear_q_up_proj
//	…self_attn.kv_a_proj_with_mqa.weight (kv_lora+rope, h)        …self_attention.linear_kv_down_proj.weight
//	…self_attn.kv_a_layernorm.weight (kv_lora)                    …self_attention.kv_layernorm.weight
//	…self_attn.kv_b_proj.weight (n·(nope+v), kv_lora)             …self_attention.linear_kv_up_proj.weight
//	…self_attn.o_proj.weight (h, n·v)                             …self_attention.linear_proj.weight
//	…mlp.gate.weight (E, h)                                       …mlp.router.weight
//	…mlp.gate.e_score_correction_bias (E) (V3)                    …mlp.router.expert_bias (a buffer)
//	…mlp.experts.E.{gate,up}_proj, down_proj                      …mlp.experts.linear_fc1.weightE [gate; up], fc2
//	…mlp.shared_experts.{gate,up}_proj, down_proj                 …mlp.shared_experts.linear_fc1.weight, fc2
//	dense layers: …mlp.{gate,up,down}_proj                        …mlp.linear_fc1/fc2.weight
//
// Rows and columns are in the same order on both sides (per head [nope;
// rope] queries, [latent; rotary key] down-projection, per head [k_nope; v]
// up-projection): every tensor is copied.
func deepseekTable(c gpt.Config, vocab int) []entry {
	h, mla, n := c.HiddenSize, c.MLA, c.NumAttentionHeads
	qd := mla.QHeadDim()
	t := []entry{one("embedding.word_embeddings.weight", opPadVocab, "model.embed_tokens.weight", vocab, h)}
	for i := range c.NumLayers {
		gn, p := fmt.Sprintf("decoder.layers.%d.", i), fmt.Sprintf("model.layers.%d.", i)
		a, s := gn+"self_attention.", p+"self_attn."
		t = append(t, one(gn+"input_layernorm.weight", opCopy, p+"input_layernorm.weight", h))
		if mla.QLoraRank == 0 {
			t = append(t, one(a+"linear_q_proj.weight", opCopy, s+"q_proj.weight", n*qd, h))
		} else {
			r := mla.QLoraRank
			t = append(t, one(a+"linear_q_down_proj.weight", opCopy, s+"q_a_proj.weight", r, h),
				one(a+"q_layernorm.weight", opCopy, s+"q_a_layernorm.weight", r),
				one(a+"linear_q_up_proj.weight", opCopy, s+"q_b_proj.weight", n*qd, r))
		}
		t = append(t, one(a+"linear_kv_down_proj.weight", opCopy, s+"kv_a_proj_with_mqa.weight", mla.KVLoraRank+mla.QKPosEmbHeadDim, h),
			one(a+"kv_layernorm.weight", opCopy, s+"kv_a_layernorm.weight", mla.KVLoraRank),
			one(a+"linear_kv_up_proj.weight", opCopy, s+"kv_b_proj.weight", n*(mla.QKHeadDim+mla.VHeadDim), mla.KVLoraRank),
			one(a+"linear_proj.weight", opCopy, s+"o_proj.weight", h, n*mla.VHeadDim),
			one(gn+"pre_mlp_layernorm.weight", opCopy, p+"post_attention_layernorm.weight", h))
		moe := c.MoE
		if !moe.Enabled() || !moe.IsMoELayer(i, c.NumLayers) {
			t = append(t, swiGLU(gn+"mlp.linear_fc1.weight", gn+"mlp.linear_fc2.weight", p+"mlp.", c.FFNHiddenSize, h)...)
			continue
		}
		t = append(t, one(gn+"mlp.router.weight", opCopy, p+"mlp.gate.weight", moe.NumExperts, h))
		if moe.ExpertBias {
			t = append(t, one(gn+"mlp.router.expert_bias", opCopy, p+"mlp.gate.e_score_correction_bias", moe.NumExperts))
		}
		for e := range moe.NumExperts {
			fc1, fc2 := expertNames(c, i, e)
			t = append(t, swiGLU(fc1, fc2, fmt.Sprintf("%smlp.experts.%d.", p, e), moe.FFNHiddenSize, h)...)
		}
		if moe.SharedExpertFFN > 0 {
			t = append(t, swiGLU(gn+"mlp.shared_experts.linear_fc1.weight", gn+"mlp.shared_experts.linear_fc2.weight", p+"mlp.shared_experts.", moe.SharedExpertFFN, h)...)
		}
	}
	return append(t, llamaHead(c, vocab)...)
}

// deepseekArchOf is ArchOf for an MLA model: DeepSeek-V3 (sigmoid routing
// with the expert bias, or no MoE layer), or DeepSeek-V2 (softmax routing,
// top-k not renormalised); prefer (an imported arch) wins when it fits.
// The error names the first setting neither represents.
func deepseekArchOf(c gpt.Config, prefer string) (string, error) {
	m := c.MoE
	switch {
	case c.Normalization != gpt.RMSNorm || c.Activation != gpt.SwiGLU || !c.DisableBiasLinear || c.LayerNorm1P:
		return "", fmt.Errorf("hf: MLA model (%s, activation %s, disable bias %v, layernorm 1p %v): DeepSeek-V2/V3 want RMSNorm, swiglu and no biases", c.Normalization, c.Activation, c.DisableBiasLinear, c.LayerNorm1P)
	case c.PositionEmbeddingType == gpt.LearnedAbsolute:
		return "", fmt.Errorf("hf: MLA model with --position-embedding-type learned_absolute: DeepSeek-V2/V3 have no position table (use none or rope)")
	case c.NormEpsilon != float32(latentNormEps):
		return "", fmt.Errorf("hf: --norm-epsilon %g: transformers' DeepSeek normalises the MLA latents with 1e-6 whatever rms_norm_eps is; export needs 1e-6", c.NormEpsilon)
	case c.MuP.Enabled || c.GDN.Enabled:
		return "", fmt.Errorf("hf: MLA model with muP or gated delta net layers: DeepSeek-V2/V3 have neither")
	case !c.QKLayerNorm:
		return "", fmt.Errorf("hf: MLA model without --qk-layernorm: DeepSeek-V2/V3 always normalise the query and key-value latents (q_a_layernorm, kv_a_layernorm), which an MLA model has only with --qk-layernorm")
	}
	if m.Enabled() {
		first := c.NumLayers
		for i, on := range moePattern(c) {
			if on && first == c.NumLayers {
				first = i
			}
			if !on && first < c.NumLayers {
				return "", fmt.Errorf("hf: --moe-layer-freq %q: DeepSeek's layers are dense up to first_k_dense_replace and MoE from there on (layer %d is dense after MoE layer %d)", m.LayerFreq, i, first)
			}
		}
		switch {
		case m.SharedExpertGate:
			return "", fmt.Errorf("hf: --moe-shared-expert-gate: DeepSeek's shared experts are not gated")
		case m.SharedExpertFFN%m.FFNHiddenSize != 0:
			return "", fmt.Errorf("hf: --moe-shared-expert-intermediate-size %d: DeepSeek's is n_shared_experts × moe_intermediate_size (%d)", m.SharedExpertFFN, m.FFNHiddenSize)
		case m.CapacityFactor != 0:
			return "", fmt.Errorf("hf: --moe-expert-capacity-factor %g: DeepSeek drops no tokens", m.CapacityFactor)
		}
	}
	v3err := deepseekV3Fits(c)
	v2err := deepseekV2Fits(c)
	switch {
	case prefer == ArchDeepSeekV2 && v2err == nil, prefer != ArchDeepSeekV3 && v3err != nil && v2err == nil:
		return ArchDeepSeekV2, nil
	case v3err == nil:
		return ArchDeepSeekV3, nil
	case m.Enabled() && m.Score == gpt.ScoreSoftmax:
		return "", v2err
	}
	return "", v3err
}

// deepseekV3Fits reports why c is not a DeepSeek-V3 (nil: it is).
func deepseekV3Fits(c gpt.Config) error {
	mla, m := c.MLA, c.MoE
	if _, err := yarnExport(mla, ArchDeepSeekV3, c.MaxPositionEmbeddings); err != nil {
		return err
	}
	if !m.Enabled() {
		return nil
	}
	switch {
	case m.Score != gpt.ScoreSigmoid || !m.ExpertBias:
		return fmt.Errorf("hf: MoE routing (%s, expert bias %v): DeepSeek-V3 routes by sigmoid with e_score_correction_bias (--moe-router-score-function sigmoid --moe-router-enable-expert-bias); DeepSeek-V2 by softmax with --moe-router-pre-softmax", m.Score, m.ExpertBias)
	case m.NumGroups > 0 && m.TopK != 2*m.GroupTopK:
		return fmt.Errorf("hf: --moe-router-group-topk %d with --moe-router-topk %d: DeepSeek-V3 ranks groups by their top 2 experts: want top-k = 2 × group top-k", m.GroupTopK, m.TopK)
	case m.NumGroups > 0 && m.NumExperts/m.NumGroups < 2, m.NumGroups == 0 && m.NumExperts < 2:
		return fmt.Errorf("hf: groups of fewer than 2 experts: DeepSeek-V3 ranks groups by their top 2")
	}
	return nil
}

// deepseekV2Fits reports why c is not a DeepSeek-V2 (nil: it is).
func deepseekV2Fits(c gpt.Config) error {
	m := c.MoE
	if !m.Enabled() {
		return fmt.Errorf("hf: a dense MLA model exports as DeepSeek-V3")
	}
	if _, err := yarnExport(c.MLA, ArchDeepSeekV2, c.MaxPositionEmbeddings); err != nil {
		return err
	}
	switch {
	case m.Score != gpt.ScoreSoftmax || !m.PreSoftmax || m.ExpertBias:
		return fmt.Errorf("hf: MoE routing (%s, pre-softmax %v, expert bias %v): DeepSeek-V2 keeps softmax's top-k unnormalised (--moe-router-pre-softmax), DeepSeek-V3 routes by sigmoid with --moe-router-enable-expert-bias", m.Score, m.PreSoftmax, m.ExpertBias)
	case m.NumGroups > 0 && m.GroupTopK != m.TopK:
		return fmt.Errorf("hf: --moe-router-group-topk %d with --moe-router-topk %d: DeepSeek-V2's group_limited_greedy ranks groups by their best expert: want them equal", m.GroupTopK, m.TopK)
	}
	return nil
}

// yarnExport is config.json's rope_scaling for mla (nil: plain RoPE), or
// why arch's transformers attention cannot compute gotron's.
func yarnExport(mla gpt.MLAConfig, arch string, positions int) (map[string]any, error) {
	s, ms, all := mla.ScalingFactor, mla.Mscale, mla.MscaleAllDim
	if mla.Rope == gpt.PlainRoPE {
		if s > 1 && all != 0 {
			return nil, fmt.Errorf("hf: --rope-type rope with --mscale-all-dim %g at --rotary-scaling-factor %g: transformers' DeepSeek scales the softmax by mscale_all_dim only with YaRN", all, s)
		}
		return nil, nil
	}
	if float64(positions)/float64(mla.OriginalMaxPositions) != s {
		return nil, fmt.Errorf("hf: YaRN factor %g with --max-position-embeddings %d over YaRN's %d original positions (%g): transformers versions take one or the other; export needs them equal", s, positions, mla.OriginalMaxPositions, float64(positions)/float64(mla.OriginalMaxPositions))
	}
	y := map[string]any{"type": "yarn", "factor": s, "original_max_position_embeddings": mla.OriginalMaxPositions,
		"beta_fast": mla.BetaFast, "beta_slow": mla.BetaSlow}
	switch {
	case s <= 1: // every mscale is 1
		y["mscale"], y["mscale_all_dim"] = ms, all
	case arch == ArchDeepSeekV2 && ms == 0 && all == 0:
		y["mscale"], y["mscale_all_dim"] = 1.0, 1.0
	case arch == ArchDeepSeekV2 && ms == 1 && all == 0, arch == ArchDeepSeekV3 && ms == 1 && all == 0:
		y["mscale"], y["mscale_all_dim"] = 1.0, 0.0
	case arch == ArchDeepSeekV3 && ms != 0 && all != 0:
		y["mscale"], y["mscale_all_dim"] = ms, all
	default:
		return nil, fmt.Errorf("hf: --mscale %g --mscale-all-dim %g at --rotary-scaling-factor %g: transformers' %s cannot scale cos, sin and the softmax so", ms, all, s, arch)
	}
	return y, nil
}

// deepseekExportConfig fills owned and template with DeepSeek's keys.
func deepseekExportConfig(arch string, c gpt.Config, vocab int, dtype string) (owned, template, nullMeans map[string]any, err error) {
	mla, m := c.MLA, c.MoE
	rs, err := yarnExport(mla, arch, c.MaxPositionEmbeddings)
	if err != nil {
		return nil, nil, nil, err
	}
	var qLora any
	if mla.QLoraRank > 0 {
		qLora = mla.QLoraRank
	}
	owned = map[string]any{"model_type": arch, "vocab_size": vocab, "hidden_size": c.HiddenSize, "intermediate_size": c.FFNHiddenSize,
		"num_hidden_layers": c.NumLayers, "num_attention_heads": c.NumAttentionHeads, "num_key_value_heads": c.NumAttentionHeads,
		"max_position_embeddings": c.MaxPositionEmbeddings, "rms_norm_eps": decimal32(c.NormEpsilon), "rope_theta": c.RotaryBase,
		"hidden_act": "silu", "tie_word_embeddings": !c.UntieEmbeddingsAndOutputWeights, "torch_dtype": torchDType(dtype),
		"q_lora_rank": qLora, "kv_lora_rank": mla.KVLoraRank, "qk_nope_head_dim": mla.QKHeadDim,
		"qk_rope_head_dim": mla.QKPosEmbHeadDim, "v_head_dim": mla.VHeadDim, "rope_scaling": rs,
		"first_k_dense_replace": c.NumLayers}
	template = map[string]any{"attention_bias": false, "attention_dropout": 0.0, "initializer_range": decimal32(c.InitMethodStd),
		"use_cache": true}
	if arch == ArchDeepSeekV3 {
		template["architectures"] = []any{"DeepseekV3ForCausalLM"}
		template["rope_interleave"] = true
	} else {
		template["architectures"] = []any{"DeepseekV2ForCausalLM"}
	}
	if !m.Enabled() {
		return owned, template, map[string]any{}, nil
	}
	for i, on := range moePattern(c) {
		if on {
			owned["first_k_dense_replace"] = i
			break
		}
	}
	scale := m.TopKScalingFactor
	if scale == 0 {
		scale = 1
	}
	owned["n_routed_experts"] = m.NumExperts
	owned["num_experts_per_tok"] = m.TopK
	owned["moe_intermediate_size"] = m.FFNHiddenSize
	owned["n_shared_experts"] = m.SharedExpertFFN / m.FFNHiddenSize
	owned["routed_scaling_factor"] = scale
	g, gk := 1, 1
	if m.NumGroups > 0 {
		g, gk = m.NumGroups, m.GroupTopK
	}
	if arch == ArchDeepSeekV3 {
		owned["norm_topk_prob"] = m.TopK > 1
		owned["n_group"], owned["topk_group"] = g, gk
		template["scoring_func"], template["topk_method"] = "sigmoid", "noaux_tc"
	} else {
		owned["norm_topk_prob"] = false
		owned["topk_method"] = "greedy"
		if m.NumGroups > 0 {
			owned["topk_method"] = "group_limited_greedy"
			owned["n_group"], owned["topk_group"] = g, gk
		}
		template["scoring_func"] = "softmax"
	}
	return owned, template, map[string]any{}, nil
}

// keepDeepSeekRope keeps the imported config's rope_scaling (or
// rope_parameters) where it reads as the model's rotary settings: "type"
// stays "type", 0.707 stays 0.707.
func keepDeepSeekRope(orig, merged map[string]any, origRaw []byte, arch string, c gpt.Config) {
	var hc hfConfig
	if orig == nil || decodeInto(origRaw, &hc) != nil {
		return
	}
	mla, theta, err := deepseekRope(&hc, arch, c.MaxPositionEmbeddings)
	if err != nil || theta != c.RotaryBase {
		return
	}
	want := c.MLA
	mla.QLoraRank, mla.KVLoraRank, mla.QKHeadDim, mla.QKPosEmbHeadDim, mla.VHeadDim = want.QLoraRank, want.KVLoraRank, want.QKHeadDim, want.QKPosEmbHeadDim, want.VHeadDim
	if !sameMLA(mla, want) {
		return
	}
	for _, k := range []string{"rope_scaling", "rope_parameters", "rope_theta"} {
		if v, ok := orig[k]; ok {
			merged[k] = v
		} else {
			delete(merged, k)
		}
	}
}

// sameMLA reports whether a and b compute the same attention: equal, or
// both plain RoPE with the same shapes and softmax scale (YaRN's other
// settings then do nothing).
func sameMLA(a, b gpt.MLAConfig) bool {
	if a.Rope != gpt.PlainRoPE || b.Rope != gpt.PlainRoPE {
		return a == b
	}
	return a.QLoraRank == b.QLoraRank && a.KVLoraRank == b.KVLoraRank && a.QKHeadDim == b.QKHeadDim &&
		a.QKPosEmbHeadDim == b.QKPosEmbHeadDim && a.VHeadDim == b.VHeadDim && a.SoftmaxScale() == b.SoftmaxScale()
}

// sameDeepSeek compares what DeepSeek's config.json carries beyond sameArch.
func sameDeepSeek(a, b gpt.Config) bool {
	if !sameMLA(a.MLA, b.MLA) {
		return false
	}
	x, y := a.MoE, b.MoE
	if !x.Enabled() || !y.Enabled() {
		return x.Enabled() == y.Enabled()
	}
	scale := func(v float64) float64 { // 0 is none: 1
		if v == 0 {
			return 1
		}
		return v
	}
	return x.Score == y.Score && x.ExpertBias == y.ExpertBias && x.NumGroups == y.NumGroups && x.GroupTopK == y.GroupTopK &&
		scale(x.TopKScalingFactor) == scale(y.TopKScalingFactor)
}
