package hf

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gotron/gotron/model/gpt"
)

// Mixture-of-Experts architectures: Mixtral, Qwen2-MoE and Qwen3-MoE. All
// route with a softmax over the experts' logits and keep the top k;
// gotron's router (Megatron's TopKRouter) computes the same probabilities:
//
//   - Mixtral (and Qwen-MoE with norm_topk_prob=true) renormalises the k
//     kept probabilities: softmax over the k largest logits, Megatron's
//     default (post-softmax).
//   - Qwen-MoE with norm_topk_prob=false keeps softmax(all logits)'s k
//     largest as they are: --moe-router-pre-softmax.
//
// Qwen2-MoE adds a shared expert gated by sigmoid(x·g) (gotron's
// --moe-shared-expert-gate); both Qwens have dense layers (mlp_only_layers,
// decoder_sparse_step: layer i is sparse iff i is not in mlp_only_layers
// and (i+1) % decoder_sparse_step == 0), kept as --moe-layer-freq's list.
// Qwen3-MoE has no shared expert and no attention biases, and normalises
// each query and key head before RoPE (q_norm, k_norm: --qk-layernorm).
// Imported experts are named for --moe-grouped-gemm (TEGroupedMLP's
// experts.linear_fc1.weightE), Megatron's Mixtral recipe.
const (
	ArchMixtral  = "mixtral"   // MixtralForCausalLM
	ArchQwen2MoE = "qwen2_moe" // Qwen2MoeForCausalLM
	ArchQwen3MoE = "qwen3_moe" // Qwen3MoeForCausalLM
)

// llamaDefault holds a Llama-family config class's defaults
// (transformers' LlamaConfig, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig).
type llamaDefault struct {
	vocab, hidden, ffn, layers, heads, kvHeads, positions int // kvHeads 0: = heads
	theta, eps                                            float64
}

var llamaDefaults = map[string]llamaDefault{
	ArchLlama:    {vocab: 32000, hidden: 4096, ffn: 11008, layers: 32, heads: 32, positions: 2048, theta: 10000, eps: 1e-6},
	ArchMixtral:  {vocab: 32000, hidden: 4096, ffn: 14336, layers: 32, heads: 32, kvHeads: 8, positions: 4096 * 32, theta: 1e6, eps: 1e-5},
	ArchQwen2MoE: {vocab: 151936, hidden: 2048, ffn: 5632, layers: 24, heads: 16, positions: 32768, theta: 10000, eps: 1e-6},
	ArchQwen3MoE: {vocab: 151936, hidden: 2048, ffn: 6144, layers: 24, heads: 32, kvHeads: 4, positions: 32768, theta: 10000, eps: 1e-6},
}

// mixtralMoE sets cfg's MoE part from a MixtralConfig: every layer sparse,
// experts of intermediate_size.
func mixtralMoE(c *hfConfig, cfg *gpt.Config) (warns []string, err error) {
	e, k := intOr(c.NumLocalExperts, 8), intOr(c.NumExpertsPerTok, 2)
	if k > e {
		return nil, fmt.Errorf("num_experts_per_tok=%d: want at most num_local_experts=%d", k, e)
	}
	if j := floatOr(c.RouterJitterNoise, 0); j != 0 {
		// HF multiplies the whole MoE input by the noise in training;
		// gotron's --moe-input-jitter-eps only the router's. Inference and
		// the weights are unaffected.
		warns = append(warns, fmt.Sprintf("router_jitter_noise=%g is ignored (training-time noise; gotron's --moe-input-jitter-eps jitters the router input only)", j))
	}
	cfg.MoE = gpt.MoEConfig{NumExperts: e, TopK: k, FFNHiddenSize: cfg.FFNHiddenSize, GroupedGEMM: true}
	return warns, nil
}

// qwen2MoE sets cfg's MoE part from a Qwen2MoeConfig.
func qwen2MoE(c *hfConfig, cfg *gpt.Config) error {
	e, k := intOr(c.NumExperts, 60), intOr(c.NumExpertsPerTok, 4)
	if k > e {
		return fmt.Errorf("num_experts_per_tok=%d: want at most num_experts=%d", k, e)
	}
	if boolOr(c.UseSlidingWindow, false) {
		return fmt.Errorf("use_sliding_window=true: not supported (gotron attends to the whole sequence)")
	}
	pattern, err := qwenPattern(intOr(c.DecoderSparseStep, 1), c.MLPOnlyLayers, cfg.NumLayers)
	if err != nil {
		return err
	}
	if !boolOr(c.QKVBias, true) {
		return fmt.Errorf("qkv_bias=false: Qwen2-MoE's q/k/v projections have biases in gotron's import")
	}
	cfg.AddQKVBias = true
	cfg.MoE = gpt.MoEConfig{NumExperts: e, TopK: k, FFNHiddenSize: intOr(c.MoEIntermediateSize, 1408),
		PreSoftmax: !boolOr(c.NormTopKProb, false), LayerFreq: layerFreq(pattern), GroupedGEMM: true,
		SharedExpertFFN: intOr(c.SharedExpertIntermediateSize, 5632), SharedExpertGate: true}
	return nil
}

// qwen3MoE sets cfg's MoE part from a Qwen3MoeConfig: Qwen2-MoE's routing
// and layer pattern, no shared expert, q/k norms. transformers 5 names the
// expert count num_local_experts as well (an attribute alias): either key
// is read, and two that differ are refused.
func qwen3MoE(c *hfConfig, cfg *gpt.Config) error {
	e := intOr(c.NumExperts, 128)
	if c.NumExperts != nil && c.NumLocalExperts != nil && *c.NumExperts != *c.NumLocalExperts {
		return fmt.Errorf("num_experts=%d contradicts num_local_experts=%d", *c.NumExperts, *c.NumLocalExperts)
	}
	if c.NumExperts == nil && c.NumLocalExperts != nil {
		e = *c.NumLocalExperts
	}
	k := intOr(c.NumExpertsPerTok, 8)
	if k > e {
		return fmt.Errorf("num_experts_per_tok=%d: want at most num_experts=%d", k, e)
	}
	if boolOr(c.UseSlidingWindow, false) {
		return fmt.Errorf("use_sliding_window=true: not supported (gotron attends to the whole sequence)")
	}
	if c.SharedExpertIntermediateSize != nil {
		return fmt.Errorf("shared_expert_intermediate_size=%d: Qwen3-MoE has no shared expert (Qwen2-MoE's model_type is qwen2_moe)", *c.SharedExpertIntermediateSize)
	}
	pattern, err := qwenPattern(intOr(c.DecoderSparseStep, 1), c.MLPOnlyLayers, cfg.NumLayers)
	if err != nil {
		return err
	}
	cfg.QKLayerNorm = true
	cfg.MoE = gpt.MoEConfig{NumExperts: e, TopK: k, FFNHiddenSize: intOr(c.MoEIntermediateSize, 768),
		PreSoftmax: !boolOr(c.NormTopKProb, false), LayerFreq: layerFreq(pattern), GroupedGEMM: true}
	return nil
}

// qwenPattern is Qwen2MoeDecoderLayer's (and Qwen3MoeDecoderLayer's)
// choice of sparse layers.
func qwenPattern(step int, mlpOnly []int, layers int) ([]bool, error) {
	p := make([]bool, layers)
	for i := range p {
		p[i] = (i+1)%step == 0
	}
	for _, i := range mlpOnly {
		if i < 0 || i >= layers {
			return nil, fmt.Errorf("mlp_only_layers: layer %d outside 0..%d (num_hidden_layers=%d)", i, layers-1, layers)
		}
		p[i] = false
	}
	if !slices.Contains(p, true) {
		return nil, fmt.Errorf("decoder_sparse_step=%d with mlp_only_layers=%v leaves no sparse layer of %d: such a model is a dense Qwen, which gotron does not import", step, mlpOnly, layers)
	}
	return p, nil
}

// layerFreq is --moe-layer-freq for a pattern: "" for every layer, else
// the 0/1 list.
func layerFreq(p []bool) string {
	if !slices.Contains(p, false) {
		return ""
	}
	s := make([]string, len(p))
	for i, on := range p {
		s[i] = map[bool]string{true: "1", false: "0"}[on]
	}
	return "[" + strings.Join(s, ",") + "]"
}

// moePattern is which of c's layers are MoE layers.
func moePattern(c gpt.Config) []bool {
	p := make([]bool, c.NumLayers)
	for i := range p {
		p[i] = c.MoE.IsMoELayer(i, c.NumLayers)
	}
	return p
}

// expertNames are gotron's names of expert e's fc1 and fc2 in layer i
// (TEGroupedMLP's with --moe-grouped-gemm, SequentialMLP's without).
func expertNames(c gpt.Config, i, e int) (fc1, fc2 string) {
	if c.MoE.GroupedGEMM {
		return fmt.Sprintf("decoder.layers.%d.mlp.experts.linear_fc1.weight%d", i, e), fmt.Sprintf("decoder.layers.%d.mlp.experts.linear_fc2.weight%d", i, e)
	}
	return fmt.Sprintf("decoder.layers.%d.mlp.experts.local_experts.%d.linear_fc1.weight", i, e), fmt.Sprintf("decoder.layers.%d.mlp.experts.local_experts.%d.linear_fc2.weight", i, e)
}

// moeTable is MixtralForCausalLM, Qwen2MoeForCausalLM or
// Qwen3MoeForCausalLM ↔ gotron; the attention is Llama's (plus Qwen2's
// q/k/v biases, Qwen3's q/k norms: llamaAttention).
//
//	Mixtral  model.layers.N.block_sparse_moe.gate.weight (E, h)   decoder.layers.N.mlp.router.weight
//	         …block_sparse_moe.experts.E.w1 (f, h), w3 (f, h)    …mlp.experts.linear_fc1.weightE (2f, h) [w1; w3]
//	         …block_sparse_moe.experts.E.w2 (h, f)               …mlp.experts.linear_fc2.weightE
//	Qwen2    model.layers.N.mlp.gate.weight (E, h)               decoder.layers.N.mlp.router.weight
//	         …mlp.experts.E.{gate,up}_proj (f, h)               …mlp.experts.linear_fc1.weightE [gate; up]
//	         …mlp.experts.E.down_proj (h, f)                     …mlp.experts.linear_fc2.weightE
//	         …mlp.shared_expert.{gate,up,down}_proj             …mlp.shared_experts.linear_fc1/fc2.weight
//	         …mlp.shared_expert_gate.weight (1, h)               …mlp.shared_experts.gate_weight
//	         dense layers: …mlp.{gate,up,down}_proj              …mlp.linear_fc1/fc2.weight
//	Qwen3    as Qwen2 without the shared expert and its gate
func moeTable(arch string, c gpt.Config, vocab int) []entry {
	h, moe := c.HiddenSize, c.MoE
	t := []entry{one("embedding.word_embeddings.weight", opPadVocab, "model.embed_tokens.weight", vocab, h)}
	for i := range c.NumLayers {
		gn, p := fmt.Sprintf("decoder.layers.%d.", i), fmt.Sprintf("model.layers.%d.", i)
		t = append(t, llamaAttention(c, gn, p)...)
		if !moe.IsMoELayer(i, c.NumLayers) {
			t = append(t, swiGLU(gn+"mlp.linear_fc1.weight", gn+"mlp.linear_fc2.weight", p+"mlp.", c.FFNHiddenSize, h)...)
			continue
		}
		f := moe.FFNHiddenSize
		if arch == ArchMixtral {
			t = append(t, one(gn+"mlp.router.weight", opCopy, p+"block_sparse_moe.gate.weight", moe.NumExperts, h))
			for e := range moe.NumExperts {
				fc1, fc2 := expertNames(c, i, e)
				x := fmt.Sprintf("%sblock_sparse_moe.experts.%d.", p, e)
				t = append(t, entry{Gotron: fc1, Op: opSwiGLU, HF: []hfTensor{{x + "w1.weight", []int{f, h}}, {x + "w3.weight", []int{f, h}}}},
					one(fc2, opCopy, x+"w2.weight", h, f))
			}
			continue
		}
		t = append(t, one(gn+"mlp.router.weight", opCopy, p+"mlp.gate.weight", moe.NumExperts, h))
		for e := range moe.NumExperts {
			fc1, fc2 := expertNames(c, i, e)
			t = append(t, swiGLU(fc1, fc2, fmt.Sprintf("%smlp.experts.%d.", p, e), f, h)...)
		}
		if arch == ArchQwen3MoE {
			continue
		}
		t = append(t, swiGLU(gn+"mlp.shared_experts.linear_fc1.weight", gn+"mlp.shared_experts.linear_fc2.weight", p+"mlp.shared_expert.", moe.SharedExpertFFN, h)...)
		t = append(t, one(gn+"mlp.shared_experts.gate_weight", opCopy, p+"mlp.shared_expert_gate.weight", 1, h))
	}
	return append(t, llamaHead(c, vocab)...)
}

// moeArchOf is ArchOf for an MoE model: Mixtral, Qwen2-MoE or Qwen3-MoE
// (--qk-layernorm), or an error naming the first setting none represents.
func moeArchOf(c gpt.Config) (string, error) {
	m := c.MoE
	llama := c.PositionEmbeddingType == gpt.RoPE && c.Normalization == gpt.RMSNorm && c.Activation == gpt.SwiGLU &&
		c.DisableBiasLinear && c.RotaryPercent == 1 && !c.RotaryInterleaved
	switch {
	case !llama:
		return "", fmt.Errorf("hf: MoE model (position embedding %s, %s, activation %s, rotary percent %g, interleaved %v): Mixtral and Qwen-MoE want rope, RMSNorm, swiglu, no biases, full rotate-half RoPE",
			c.PositionEmbeddingType, c.Normalization, c.Activation, c.RotaryPercent, c.RotaryInterleaved)
	case m.Score != gpt.ScoreSoftmax:
		return "", fmt.Errorf("hf: --moe-router-score-function %s: Mixtral and Qwen-MoE route by softmax", m.Score)
	case m.NumGroups > 0:
		return "", fmt.Errorf("hf: --moe-router-num-groups %d: Mixtral and Qwen-MoE have no group-limited routing", m.NumGroups)
	case m.TopKScalingFactor != 0 && m.TopKScalingFactor != 1:
		return "", fmt.Errorf("hf: --moe-router-topk-scaling-factor %g: Mixtral and Qwen-MoE do not scale the routing weights", m.TopKScalingFactor)
	case m.ExpertBias:
		return "", fmt.Errorf("hf: --moe-router-enable-expert-bias: Mixtral and Qwen-MoE have no expert bias")
	case m.CapacityFactor != 0:
		return "", fmt.Errorf("hf: --moe-expert-capacity-factor %g: Mixtral and Qwen-MoE drop no tokens", m.CapacityFactor)
	case c.QKLayerNorm && m.SharedExpertFFN > 0:
		return "", fmt.Errorf("hf: --qk-layernorm with a shared expert: Qwen3-MoE (the MoE model with q/k norms) has no shared expert")
	case c.QKLayerNorm && c.AddQKVBias:
		return "", fmt.Errorf("hf: --qk-layernorm with --add-qkv-bias: Qwen3-MoE's attention has no biases")
	case c.QKLayerNorm:
		return ArchQwen3MoE, nil
	case m.SharedExpertFFN > 0 && !m.SharedExpertGate:
		return "", fmt.Errorf("hf: a shared expert without --moe-shared-expert-gate: Qwen2-MoE gates its shared expert, Mixtral has none")
	case m.SharedExpertFFN > 0 && !c.AddQKVBias:
		return "", fmt.Errorf("hf: a gated shared expert without --add-qkv-bias: Qwen2-MoE's attention has q/k/v biases (and Mixtral no shared expert)")
	case m.SharedExpertFFN > 0:
		return ArchQwen2MoE, nil
	case m.PreSoftmax:
		return "", fmt.Errorf("hf: --moe-router-pre-softmax without a shared expert or --qk-layernorm: Mixtral renormalises the top-k probabilities (Qwen2-MoE with norm_topk_prob=false needs its gated shared expert, Qwen3-MoE its q/k norms)")
	case c.AddQKVBias:
		return "", fmt.Errorf("hf: --add-qkv-bias without a shared expert: Mixtral has no attention biases")
	case slices.Contains(moePattern(c), false):
		return "", fmt.Errorf("hf: --moe-layer-freq %q without a shared expert or --qk-layernorm: Mixtral's layers are all MoE", m.LayerFreq)
	}
	return ArchMixtral, nil
}

// moeExportConfig adds the MoE keys of config.json to owned and template.
func moeExportConfig(arch string, c gpt.Config, owned, template map[string]any) {
	m := c.MoE
	owned["num_experts_per_tok"] = m.TopK
	if arch == ArchMixtral {
		owned["model_type"] = "mixtral"
		owned["num_local_experts"] = m.NumExperts
		owned["intermediate_size"] = m.FFNHiddenSize
		template["architectures"] = []any{"MixtralForCausalLM"}
		template["router_aux_loss_coef"] = m.AuxLossCoeff
		template["output_router_logits"] = false
		template["router_jitter_noise"] = 0.0
		template["sliding_window"] = nil
		delete(template, "pretraining_tp")
		delete(template, "mlp_bias")
		delete(template, "attention_bias")
		return
	}
	owned["model_type"] = arch
	owned["num_experts"] = m.NumExperts
	owned["moe_intermediate_size"] = m.FFNHiddenSize
	if arch == ArchQwen2MoE {
		owned["shared_expert_intermediate_size"] = m.SharedExpertFFN
	}
	owned["norm_topk_prob"] = !m.PreSoftmax
	owned["decoder_sparse_step"] = 1
	var dense []any
	for i, on := range moePattern(c) {
		if !on {
			dense = append(dense, i)
		}
	}
	owned["mlp_only_layers"] = append([]any{}, dense...)
	template["architectures"] = []any{"Qwen2MoeForCausalLM"}
	template["router_aux_loss_coef"] = m.AuxLossCoeff
	template["output_router_logits"] = false
	template["use_sliding_window"] = false
	template["sliding_window"] = nil
	template["max_window_layers"] = c.NumLayers
	delete(template, "pretraining_tp")
	delete(template, "mlp_bias")
	delete(template, "attention_bias")
	if arch == ArchQwen3MoE {
		template["architectures"] = []any{"Qwen3MoeForCausalLM"}
		template["attention_bias"] = false
		template["head_dim"] = c.KVChannels // Qwen3's configs always carry it
	}
}

// keepQwenPattern (Qwen2-MoE and Qwen3-MoE) keeps the imported config's decoder_sparse_step and
// mlp_only_layers where they describe the model's layers (a step of 2
// stays a step of 2 rather than becoming the list of dense layers).
func keepQwenPattern(orig, merged map[string]any, origRaw []byte, c gpt.Config) {
	var hc hfConfig
	if orig == nil || decodeInto(origRaw, &hc) != nil {
		return
	}
	p, err := qwenPattern(intOr(hc.DecoderSparseStep, 1), hc.MLPOnlyLayers, c.NumLayers)
	if err != nil || !slices.Equal(p, moePattern(c)) {
		return
	}
	for _, k := range []string{"decoder_sparse_step", "mlp_only_layers"} {
		if v, ok := orig[k]; ok {
			merged[k] = v
		} else {
			delete(merged, k)
		}
	}
}

// sameMoE compares the MoE settings config.json carries.
func sameMoE(a, b gpt.Config) bool {
	x, y := a.MoE, b.MoE
	if x.Enabled() != y.Enabled() {
		return false
	}
	if !x.Enabled() {
		return true
	}
	return x.NumExperts == y.NumExperts && x.TopK == y.TopK && x.FFNHiddenSize == y.FFNHiddenSize &&
		x.PreSoftmax == y.PreSoftmax && x.SharedExpertFFN == y.SharedExpertFFN && x.SharedExpertGate == y.SharedExpertGate &&
		slices.Equal(moePattern(a), moePattern(b))
}

// denseFFN is the dense MLPs' hidden size, 0 when every layer is MoE
// (config.json then has no place for it).
func denseFFN(c gpt.Config) int {
	if c.MoE.Enabled() && c.MoE.NumMoELayers(c.NumLayers) == c.NumLayers {
		return 0
	}
	return c.FFNHiddenSize
}
