// Package optim holds gotron's optimizers and the schedules around them,
// each matching Megatron-LM (megatron/core/optimizer/,
// megatron/core/optimizer_param_scheduler.py and
// megatron/core/num_microbatches_calculator.py):
//
//   - AdamW (TE/Apex FusedAdam, adam_w_mode) and SGD (torch semantics) over
//     flat float32 parameters grouped like Megatron's param groups
//     (DefaultGroups: decay / no_decay by DefaultNoWeightDecay);
//   - Grads: global-norm gradient clipping (--clip-grad), split into a local
//     sum of squares and a finish step so parallel code can all-reduce in
//     between, and NaN/Inf detection (found_inf);
//   - Scheduler: OptimizerParamScheduler, LR (constant, linear, cosine,
//     inverse-square-root, WSD) and weight decay as functions of consumed
//     samples, with Megatron's checkpoint load rules; SchedulerFlags builds
//     its config from Megatron flags;
//   - Microbatches: the number-of-microbatches calculator (constant,
//     ramp-up, step schedule);
//   - LossScaler: fp16 dynamic (or constant) loss scaling, with
//     Grads.Unscale for the unscale-and-check step.
//
// Everything except the elementwise kernels is a pure function of its
// inputs; the kernels are the tensor package's list ops (tensor.AdamW,
// tensor.SGD, tensor.SumSquares, ...), which the backend splits over all
// parameters at once, and a step allocates nothing.
//
// One training iteration, as in Megatron's train_step:
//
//	mb.UpdateChecked(consumed)            // microbatches for this iteration
//	... forward/backward over mb.Num() microbatches, accumulating Grad ...
//	if grads.FoundInf() { skip }          // (all-reduce MAX across ranks first)
//	norm := grads.ClipGradNorm(clipGrad)  // or SumSquares → all-reduce → L2Norm → ClipByNorm
//	sched.Apply(opt.Groups())
//	opt.Step()
//	sched.Step(int64(mb.CurrentRunningGlobalBatchSize())) // num_microbatches·mbs·DP
//	consumed += int64(mb.CurrentRunningGlobalBatchSize())
package optim
