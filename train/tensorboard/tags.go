package tensorboard

// Scalar tags Megatron's training loop writes (megatron/training/training.py:
// training_log and evaluate_and_print_results). Unless a constant says
// otherwise, the step is the iteration and Megatron writes the tag every
// --tensorboard-log-interval iterations (default 1), on the last rank, with a
// twin tag VsSamples(tag) whose step is the consumed training samples.
const (
	// TagLMLoss is the training loss of this iteration (the mean over its
	// microbatches, not the --log-interval average of the log line): the
	// "lm loss" key of pretrain_gpt.py's loss dictionary.
	TagLMLoss = "lm loss"
	// TagLearningRate is the learning rate (after the scheduler step).
	TagLearningRate = "learning-rate"
	// TagBatchSize is the global batch size in samples (with RL sequence
	// packing, in bins).
	TagBatchSize = "batch-size"
	// TagConsumedBins is the bins an RL run with sequence packing has
	// trained on (consumed_train_bins, from 0 in each run), written when
	// positive, without a " vs samples" twin.
	TagConsumedBins = "consumed-bins"
	// TagLossScale is the loss scale (1 without fp16); Megatron writes it
	// unless --no-log-loss-scale-to-tensorboard.
	TagLossScale = "loss-scale"
	// TagGradNorm is the gradient norm before clipping; absent when the
	// iteration computed none.
	TagGradNorm = "grad-norm"
	// TagNumZeros is the number of zeros in the gradient, with
	// --log-num-zeros-in-grad.
	TagNumZeros = "num-zeros"
	// TagParamsNorm is the parameters' L2 norm, with --log-params-norm.
	TagParamsNorm = "params-norm"
	// TagWorldSize is the number of ranks, with
	// --log-world-size-to-tensorboard.
	TagWorldSize = "world-size"
	// TagSkippedTrainSamples is the number of skipped training samples,
	// written only when it is positive.
	TagSkippedTrainSamples = "skipped-train-samples"
	// TagIterationTime is the mean seconds per iteration over the last
	// --log-interval iterations. Megatron writes it at --log-interval
	// iterations (not the first), with --log-timers-to-tensorboard, and
	// has no " vs samples" twin.
	TagIterationTime = "iteration-time"
	// TagThroughput is the model TFLOP/s per GPU, written as
	// TagIterationTime is, when --log-throughput is also set.
	TagThroughput = "throughput"
	// TagLMLossValidation is the validation loss (evaluate_and_print_results:
	// "<loss key> validation"), at each evaluation with the iteration as
	// step and a " vs samples" twin. Megatron's end-of-training test
	// evaluation writes the test loss under this tag too.
	TagLMLossValidation = "lm loss validation"
	// TagLMLossValidationPPL is the validation perplexity exp(min(20,
	// loss)), with --log-validation-ppl-to-tensorboard, written as
	// TagLMLossValidation is.
	TagLMLossValidationPPL = "lm loss validation ppl"
	// TagMemReservedBytes is the memory held by the allocator in bytes, with
	// --log-memory-to-tensorboard (torch.cuda.memory_stats
	// "reserved_bytes.all.current"); no " vs samples" twin.
	TagMemReservedBytes = "mem-reserved-bytes"
	// TagMemAllocatedBytes is the memory in use in bytes
	// ("allocated_bytes.all.current"), written as TagMemReservedBytes is.
	TagMemAllocatedBytes = "mem-allocated-bytes"
	// TagMemMaxAllocatedBytes is the peak memory in use in bytes
	// ("allocated_bytes.all.peak"), written as TagMemReservedBytes is.
	TagMemMaxAllocatedBytes = "mem-max-allocated-bytes"
	// TagMemAllocatedCount is the number of live allocations
	// ("allocation.all.current"), written as TagMemReservedBytes is.
	TagMemAllocatedCount = "mem-allocated-count"
)

// VsSamplesSuffix ends the tags Megatron writes a second time with the
// consumed training samples as step.
const VsSamplesSuffix = " vs samples"

// VsSamples is tag's twin whose step is the consumed training samples, as
// Megatron writes it: "lm loss" → "lm loss vs samples".
func VsSamples(tag string) string { return tag + VsSamplesSuffix }

// ValidationTag is Megatron's validation tag of a loss key: "<key>
// validation", or "<key> validation-<set>" for a named validation set
// (--multiple-validation-sets); set "" is the single validation set.
func ValidationTag(lossKey, set string) string {
	if set != "" {
		return lossKey + " validation-" + set
	}
	return lossKey + " validation"
}

// ValidationPPLTag is the perplexity tag of ValidationTag(lossKey, set):
// "<key> validation ppl".
func ValidationPPLTag(lossKey, set string) string { return ValidationTag(lossKey, set) + " ppl" }

// MegatronTags lists the scalar tags of a Megatron GPT run, in the order
// training.py writes them (the " vs samples" twins left out).
func MegatronTags() []string {
	return []string{TagLearningRate, TagSkippedTrainSamples, TagBatchSize, TagLMLoss, TagLossScale, TagWorldSize,
		TagGradNorm, TagNumZeros, TagParamsNorm, TagMemReservedBytes, TagMemAllocatedBytes, TagMemMaxAllocatedBytes,
		TagMemAllocatedCount, TagIterationTime, TagThroughput, TagLMLossValidation, TagLMLossValidationPPL}
}
