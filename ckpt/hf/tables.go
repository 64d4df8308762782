package hf

import (
	"fmt"
	"strings"

	"github.com/gotron/gotron/model/gpt"
)

// hfTensor is one Hugging Face tensor: its name and shape.
type hfTensor struct {
	Name  string
	Shape []int
}

// entry maps one gotron parameter to the Hugging Face tensors it is made of.
type entry struct {
	Gotron string // Megatron/gotron parameter name
	// More are parameters whose rows follow Gotron's: op reads and writes
	// their concatenation (the gated delta net's in_proj and conv1d
	// sections, one Hugging Face tensor).
	More []string
	HF   []hfTensor // in the order op takes them
	Op   op
}

// table returns the name map of arch for a model config (padded vocabulary in
// c.VocabSize) whose Hugging Face vocabulary has vocab rows.
func table(arch string, c gpt.Config, vocab int) ([]entry, error) {
	switch arch {
	case ArchGPT2:
		return gpt2Table(c, vocab), nil
	case ArchLlama:
		return llamaTable(c, vocab), nil
	case ArchMixtral, ArchQwen2MoE, ArchQwen3MoE:
		return moeTable(arch, c, vocab), nil
	case ArchDeepSeekV2, ArchDeepSeekV3:
		return deepseekTable(c, vocab), nil
	case ArchQwen3Next:
		return qwen3NextTable(c, vocab), nil
	}
	return nil, fmt.Errorf("hf: unknown architecture %q (want %s, %s, %s, %s, %s, %s, %s or %s)", arch, ArchGPT2, ArchLlama, ArchMixtral, ArchQwen2MoE, ArchQwen3MoE, ArchDeepSeekV2, ArchDeepSeekV3, ArchQwen3Next)
}

func one(gotron string, o op, name string, shape ...int) entry {
	return entry{Gotron: gotron, HF: []hfTensor{{name, shape}}, Op: o}
}

// gpt2Table is GPT2LMHeadModel ↔ gotron. Conv1D weights are (in, out) in the
// HF file, so every linear weight is transposed; biases are copied, except
// c_attn's, which is regrouped per head like its weight.
//
//	transformer.wte.weight          (V, h)        embedding.word_embeddings.weight (Vp, h)  pad rows
//	transformer.wpe.weight          (P, h)        embedding.position_embeddings.weight
//	transformer.h.N.ln_1.{weight,bias}            decoder.layers.N.input_layernorm.{weight,bias}
//	transformer.h.N.attn.c_attn.weight (h, 3h)    …self_attention.linear_qkv.weight (3h, h)  transpose + per-head [q;k;v]
//	transformer.h.N.attn.c_attn.bias   (3h)       …self_attention.linear_qkv.bias            per-head [q;k;v]
//	transformer.h.N.attn.c_proj.weight (h, h)     …self_attention.linear_proj.weight         transpose
//	transformer.h.N.attn.c_proj.bias              …self_attention.linear_proj.bias
//	transformer.h.N.ln_2.{weight,bias}            …pre_mlp_layernorm.{weight,bias}
//	transformer.h.N.mlp.c_fc.weight   (h, f)      …mlp.linear_fc1.weight (f, h)              transpose
//	transformer.h.N.mlp.c_fc.bias                 …mlp.linear_fc1.bias
//	transformer.h.N.mlp.c_proj.weight (f, h)      …mlp.linear_fc2.weight (h, f)              transpose
//	transformer.h.N.mlp.c_proj.bias               …mlp.linear_fc2.bias
//	transformer.ln_f.{weight,bias}                decoder.final_layernorm.{weight,bias}
//	lm_head.weight (V, h), untied only            output_layer.weight (Vp, h)                pad rows
func gpt2Table(c gpt.Config, vocab int) []entry {
	h, f, ad := c.HiddenSize, c.FFNHiddenSize, c.NumAttentionHeads*c.KVChannels
	t := []entry{
		one("embedding.word_embeddings.weight", opPadVocab, "transformer.wte.weight", vocab, h),
		one("embedding.position_embeddings.weight", opCopy, "transformer.wpe.weight", c.MaxPositionEmbeddings, h),
	}
	for i := range c.NumLayers {
		g, p := fmt.Sprintf("decoder.layers.%d.", i), fmt.Sprintf("transformer.h.%d.", i)
		t = append(t,
			one(g+"input_layernorm.weight", opCopy, p+"ln_1.weight", h),
			one(g+"input_layernorm.bias", opCopy, p+"ln_1.bias", h),
			one(g+"self_attention.linear_qkv.weight", opGPT2QKV, p+"attn.c_attn.weight", h, 3*ad),
			one(g+"self_attention.linear_qkv.bias", opGPT2QKVBias, p+"attn.c_attn.bias", 3*ad),
			one(g+"self_attention.linear_proj.weight", opTranspose, p+"attn.c_proj.weight", ad, h),
			one(g+"self_attention.linear_proj.bias", opCopy, p+"attn.c_proj.bias", h),
			one(g+"pre_mlp_layernorm.weight", opCopy, p+"ln_2.weight", h),
			one(g+"pre_mlp_layernorm.bias", opCopy, p+"ln_2.bias", h),
			one(g+"mlp.linear_fc1.weight", opTranspose, p+"mlp.c_fc.weight", h, f),
			one(g+"mlp.linear_fc1.bias", opCopy, p+"mlp.c_fc.bias", f),
			one(g+"mlp.linear_fc2.weight", opTranspose, p+"mlp.c_proj.weight", f, h),
			one(g+"mlp.linear_fc2.bias", opCopy, p+"mlp.c_proj.bias", h),
		)
	}
	t = append(t,
		one("decoder.final_layernorm.weight", opCopy, "transformer.ln_f.weight", h),
		one("decoder.final_layernorm.bias", opCopy, "transformer.ln_f.bias", h))
	if c.UntieEmbeddingsAndOutputWeights {
		t = append(t, one("output_layer.weight", opPadVocab, "lm_head.weight", vocab, h))
	}
	return t
}

// llamaTable is LlamaForCausalLM (and MistralForCausalLM) ↔ gotron. HF
// linears are torch.nn.Linear, (out, in) like gotron's: nothing is
// transposed. q/k/v are fused per query group, gate/up stacked.
//
//	model.embed_tokens.weight (V, h)                 embedding.word_embeddings.weight (Vp, h)  pad rows
//	model.layers.N.input_layernorm.weight            decoder.layers.N.input_layernorm.weight
//	model.layers.N.self_attn.q_proj.weight (a·d, h)  ┐
//	model.layers.N.self_attn.k_proj.weight (g·d, h)  ├ …self_attention.linear_qkv.weight (g·(r+2)·d, h)
//	model.layers.N.self_attn.v_proj.weight (g·d, h)  ┘   per group j: [q heads of j; k_j; v_j]
//	model.layers.N.self_attn.o_proj.weight (h, a·d)  …self_attention.linear_proj.weight
//	model.layers.N.post_attention_layernorm.weight   …pre_mlp_layernorm.weight
//	model.layers.N.mlp.gate_proj.weight (f, h)       ┐ …mlp.linear_fc1.weight (2f, h) [gate; up]
//	model.layers.N.mlp.up_proj.weight   (f, h)       ┘
//	model.layers.N.mlp.down_proj.weight (h, f)       …mlp.linear_fc2.weight
//	model.norm.weight                                decoder.final_layernorm.weight
//	lm_head.weight (V, h), untied only               output_layer.weight (Vp, h)                pad rows
func llamaTable(c gpt.Config, vocab int) []entry {
	h, f := c.HiddenSize, c.FFNHiddenSize
	t := []entry{one("embedding.word_embeddings.weight", opPadVocab, "model.embed_tokens.weight", vocab, h)}
	for i := range c.NumLayers {
		gn, p := fmt.Sprintf("decoder.layers.%d.", i), fmt.Sprintf("model.layers.%d.", i)
		t = append(t, llamaAttention(c, gn, p)...)
		t = append(t, swiGLU(gn+"mlp.linear_fc1.weight", gn+"mlp.linear_fc2.weight", p+"mlp.", f, h)...)
	}
	return append(t, llamaHead(c, vocab)...)
}

// llamaAttention is one Llama-style layer's norms and attention (gotron
// prefix gn, HF prefix p), with Qwen2's q/k/v biases when c.AddQKVBias and
// Qwen3's per-head q/k norms (self_attn.q_norm, k_norm, (d)) when
// c.QKLayerNorm.
func llamaAttention(c gpt.Config, gn, p string) []entry {
	h, d, a, g := c.HiddenSize, c.KVChannels, c.NumAttentionHeads, c.NumQueryGroups
	t := []entry{
		one(gn+"input_layernorm.weight", opCopy, p+"input_layernorm.weight", h),
		{Gotron: gn + "self_attention.linear_qkv.weight", Op: opLlamaQKV, HF: []hfTensor{
			{p + "self_attn.q_proj.weight", []int{a * d, h}},
			{p + "self_attn.k_proj.weight", []int{g * d, h}},
			{p + "self_attn.v_proj.weight", []int{g * d, h}},
		}},
	}
	if c.AddQKVBias {
		t = append(t, entry{Gotron: gn + "self_attention.linear_qkv.bias", Op: opLlamaQKVBias, HF: []hfTensor{
			{p + "self_attn.q_proj.bias", []int{a * d}},
			{p + "self_attn.k_proj.bias", []int{g * d}},
			{p + "self_attn.v_proj.bias", []int{g * d}},
		}})
	}
	if c.QKLayerNorm {
		t = append(t, one(gn+"self_attention.q_layernorm.weight", opCopy, p+"self_attn.q_norm.weight", d),
			one(gn+"self_attention.k_layernorm.weight", opCopy, p+"self_attn.k_norm.weight", d))
	}
	return append(t,
		one(gn+"self_attention.linear_proj.weight", opCopy, p+"self_attn.o_proj.weight", h, a*d),
		one(gn+"pre_mlp_layernorm.weight", opCopy, p+"post_attention_layernorm.weight", h))
}

// swiGLU maps an HF MLP (p+"gate_proj", "up_proj", "down_proj", hidden f)
// to gotron's fc1 [gate; up] and fc2.
func swiGLU(fc1, fc2, p string, f, h int) []entry {
	return []entry{
		{Gotron: fc1, Op: opSwiGLU, HF: []hfTensor{{p + "gate_proj.weight", []int{f, h}}, {p + "up_proj.weight", []int{f, h}}}},
		one(fc2, opCopy, p+"down_proj.weight", h, f),
	}
}

// llamaHead is the final norm and an untied lm_head.
func llamaHead(c gpt.Config, vocab int) []entry {
	h := c.HiddenSize
	t := []entry{one("decoder.final_layernorm.weight", opCopy, "model.norm.weight", h)}
	if c.UntieEmbeddingsAndOutputWeights {
		t = append(t, one("output_layer.weight", opPadVocab, "lm_head.weight", vocab, h))
	}
	return t
}

// ignored reports whether an HF tensor that no table entry names may be
// skipped: buffers older transformers versions saved (GPT-2's causal mask
// attn.bias and attn.masked_bias, Llama's rotary_emb.inv_freq) and a tied
// lm_head.weight (a copy of the embedding).
func ignored(arch, name string, tied bool) bool {
	switch {
	case tied && name == "lm_head.weight":
		return true
	case arch == ArchGPT2 && (hasSuffix(name, ".attn.bias") || hasSuffix(name, ".attn.masked_bias")):
		return true
	case arch != ArchGPT2 && hasSuffix(name, ".rotary_emb.inv_freq"):
		return true
	case arch == ArchQwen3Next && strings.HasPrefix(name, "mtp."):
		// the multi-token-prediction head, which transformers' Qwen3NextForCausalLM also drops
		// (_keys_to_ignore_on_load_unexpected)
		return true
	}
	return false
}

func hasSuffix(s, suf string) bool { return len(s) >= len(suf) && s[len(s)-len(suf):] == suf }
