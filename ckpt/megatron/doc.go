// Package megatron imports Megatron-LM checkpoints saved in the legacy
// torch format (--ckpt-format torch) into gotron's GPT model, without
// Python or Megatron.
//
// Layout (megatron/training/checkpointing.py): <load>/latest_checkpointed_iteration.txt
// names the iteration (or release); <load>/iter_0000100/mp_rank_TT/model_optim_rng.pt
// holds tensor-parallel rank TT's state dict, mp_rank_TT_PPP/ with pipeline
// parallelism. Each file is a torch.save of a dict with args (the
// argparse.Namespace of the run), checkpoint_version (3.0), iteration, model
// (model0, model1, ... with virtual pipeline stages), optimizer, rng_state
// and more; package torchpt reads it.
//
// The model configuration comes from args (Megatron's flag names; both the
// older and the current names of renamed flags), and arguments gotron cannot
// represent (mixture of experts, MLA, QK norm, sliding windows, RoPE scaling,
// other activations, ...) are refused by name. Parameters keep Megatron
// core's names, which are gotron's; layer numbers, local to each pipeline
// stage and virtual chunk, are renumbered in Megatron's layer order (virtual
// stage, then pipeline rank). Tensor-parallel slices merge as Megatron split
// them: linear_qkv rows (whole query groups per rank, each [q heads; k; v],
// gotron's layout), SwiGLU linear_fc1 rows [gate_r; up_r] per rank
// regrouped to [gate; up], linear_proj and linear_fc2 columns, embedding and
// output-layer rows (the padded vocabulary), norms and row-parallel biases
// replicated. TransformerEngine's fused-norm names (linear_qkv.layer_norm_weight,
// linear_fc1.layer_norm_weight) map to input_layernorm and pre_mlp_layernorm;
// _extra_state entries are skipped. With --apply-layernorm-1p the norm
// weights are stored as 1 + w.
//
// Only weights are converted: optimizer state, RNG state and the scheduler
// are not (Info.Optimizer says whether the files held optimizer state).
package megatron
