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
// represent (QK norm outside MLA, sliding windows, RoPE scaling,
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
// Multi-latent attention (MLASelfAttention; its latents' norms exist only
// with --qk-layernorm, args.qk_layernorm, in Megatron and in gotron) maps
// its up-projections as column-parallel rows, linear_proj as columns, the
// latents' norms (standalone, or fused into the up-projections as
// layer_norm_weight) as replicas, and its down-projections by their shape:
// TransformerEngine replicates them, the local spec splits their rows.
//
// Load converts the weights alone (those of the model state dicts). Import
// also converts the optimizer state of Megatron's non-distributed optimizer
// (OptimizerState): FP32Optimizer's torch state dict, or
// Float16OptimizerWithFloat16Params' {optimizer, grad_scaler,
// fp32_from_fp16_params} with bf16/fp16 training. Its per-parameter state
// is keyed by index: Megatron's _get_param_groups puts each rank's
// parameters, in named_parameters() order (model chunk by chunk), into
// param groups by weight decay (biases and 1-D parameters take none) and
// decoupled learning rate (embedding and output layer), and torch numbers
// them group by group. The import lists each rank's parameters from its
// state dicts the same way, reads each group's members from its keys
// (wd_mult, is_decoupled_lr or default_config), in whatever order the
// groups come, and checks every state tensor's shape and that every fp32
// main param rounds to its bf16/fp16 weight. The per-rank tensors then
// merge over tensor and pipeline ranks by the weights' own plan, so QKV
// groups, SwiGLU halves and the padded vocabulary come out as the weights
// do (moments of a zero-centred norm weight are not shifted by 1); the
// tied embeddings' copy on the last stage is compared with the embeddings'.
// Imported: Adam's exp_avg and exp_avg_sq ("adamw") or SGD's
// momentum_buffer ("sgd"), the step count (param group or per-parameter
// "step"), the fp32 main params (which become the weights),
// opt_param_scheduler, fp16's loss scaler, the consumed and skipped sample
// counts and num_floating_point_operations_so_far; Megatron's RNG states
// are not.
//
// With the distributed optimizer (args.use_distributed_optimizer) the
// moments and fp32 main params come from the distrib_optim.pt beside each
// rank file (distopt.go): Megatron's coalesced dp_zero layout (Megatron-LM
// since commit 369e698d, 2024-04-03, checked against d98e8a64), one flat
// fp32 tensor per state and gradient buffer (model chunk and dtype), its
// buckets concatenated without their end padding. The parameters' offsets
// come from the DDP buffer walk of package ddp (reverse order, 64-element
// alignment, --ddp-bucket-size buckets on the first chunk of the first
// stage, the shared embedding alone), chosen by the file's numel_unpadded
// and checked by every main param rounding to its weight.
//
// Without optimizer state, for a release checkpoint, a distrib_optim.pt in
// another layout (per-bucket, another sharding type, a size no layout
// gives), chained optimizers, another optimizer, amsgrad, param groups
// whose members cannot be derived (lr_mult) or missing state, Import
// converts the weights alone and says why in Info.Warnings, naming the
// file; a malformed optimizer section or distrib_optim.pt is an
// *OptimizerError.
package megatron
