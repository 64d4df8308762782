// Package hf converts between Hugging Face checkpoints (config.json plus
// safetensors, single or sharded) and gotron's GPT model, for GPT-2
// (GPT2LMHeadModel), Llama/Mistral (LlamaForCausalLM, MistralForCausalLM)
// and the Mixture-of-Experts Mixtral (MixtralForCausalLM), Qwen2-MoE
// (Qwen2MoeForCausalLM) and Qwen3-MoE (Qwen3MoeForCausalLM; moe.go).
//
// Each architecture is one name-map table (tables.go) from gotron's Megatron
// parameter names to Hugging Face tensors, with the layout change spelled out
// per entry (layout.go):
//
//   - GPT-2's Conv1D weights are stored (in, out) and are transposed.
//   - The Q, K and V projections (GPT-2's c_attn columns, Llama's q/k/v_proj
//     rows) become Megatron's fused linear_qkv, whose rows are grouped per
//     query group: [q heads of group j; k_j; v_j] for j = 0…g−1.
//   - Llama's gate_proj and up_proj become linear_fc1 rows [gate; up].
//   - The embedding (and an untied lm_head) gain zero rows up to a multiple of
//     --make-vocab-size-divisible-by; export drops them.
//
// HF Llama checkpoints already hold q/k rows in rotate-half order (the HF
// conversion script permuted Meta's interleaved layout), and gotron's RoPE
// rotates halves too, so no permutation is applied.
//
// Every layout change is a permutation of values, so HF → gotron → HF gives
// byte-identical tensors for F32, BF16 and F16 files (16-bit values widen to
// float32 exactly), and config.json keeps every key gotron does not derive.
//
// Import and LoadModel read a Hugging Face directory; Export writes one.
// WriteInfo/ReadInfo keep what an import knew (architecture, dtype, unpadded
// vocabulary, the original config.json) next to a gotron checkpoint as
// hf_import.json, and CopyTokenizerFiles carries tokenizer files along, so a
// converted checkpoint is self-contained. The package does not depend on
// package train; cmd/gotron saves the model with train.SaveModel.
package hf
