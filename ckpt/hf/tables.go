package hf

import (
	"fmt"

	"github.com/gotron/gotron/model/gpt"
)

// hfTensor is one Hugging Face tensor: its name and shape.
type hfTensor struct {
	Name  string
	Shape []int
}

// entry maps one gotron parameter to the Hugging Face tensors it is made of.
type entry struct {
	Gotron string     // Megatron/gotron parameter name
	HF     []hfTensor // in the order op takes them
	Op     op
}

// table returns the name map of arch for a model config (padded vocabulary in
// c.VocabSize) whose Hugging Face vocabulary has vocab rows.
func table(arch string, c gpt.Config, vocab int) ([]entry, error) {
	switch arch {
	case ArchGPT2:
		return gpt2Table(c, vocab), nil
	case ArchLlama:
		return llamaTable(c, vocab), nil
	}
	return nil, fmt.Errorf("hf: unknown architecture %q (want %s or %s)", arch, ArchGPT2, ArchLlama)
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
	h, f, d, a, g := c.HiddenSize, c.FFNHiddenSize, c.KVChannels, c.NumAttentionHeads, c.NumQueryGroups
	t := []entry{one("embedding.word_embeddings.weight", opPadVocab, "model.embed_tokens.weight", vocab, h)}
	for i := range c.NumLayers {
		gn, p := fmt.Sprintf("decoder.layers.%d.", i), fmt.Sprintf("model.layers.%d.", i)
		t = append(t,
			one(gn+"input_layernorm.weight", opCopy, p+"input_layernorm.weight", h),
			entry{Gotron: gn + "self_attention.linear_qkv.weight", Op: opLlamaQKV, HF: []hfTensor{
				{p + "self_attn.q_proj.weight", []int{a * d, h}},
				{p + "self_attn.k_proj.weight", []int{g * d, h}},
				{p + "self_attn.v_proj.weight", []int{g * d, h}},
			}},
			one(gn+"self_attention.linear_proj.weight", opCopy, p+"self_attn.o_proj.weight", h, a*d),
			one(gn+"pre_mlp_layernorm.weight", opCopy, p+"post_attention_layernorm.weight", h),
			entry{Gotron: gn + "mlp.linear_fc1.weight", Op: opSwiGLU, HF: []hfTensor{
				{p + "mlp.gate_proj.weight", []int{f, h}},
				{p + "mlp.up_proj.weight", []int{f, h}},
			}},
			one(gn+"mlp.linear_fc2.weight", opCopy, p+"mlp.down_proj.weight", h, f),
		)
	}
	t = append(t, one("decoder.final_layernorm.weight", opCopy, "model.norm.weight", h))
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
	case arch == ArchLlama && hasSuffix(name, ".rotary_emb.inv_freq"):
		return true
	}
	return false
}

func hasSuffix(s, suf string) bool { return len(s) >= len(suf) && s[len(s)-len(suf):] == suf }
