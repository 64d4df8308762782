package main

import (
	"flag"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/gotron/gotron/ckpt/hf"
	"github.com/gotron/gotron/internal/checked"
)

// numberRule is what a numeric flag may hold: a value in
// [Min, Max] (MinOpen: above Min), with Meaning saying why in the error.
type numberRule struct {
	Integer    bool
	IMin, IMax int64 // integers
	Min, Max   float64
	MinOpen    bool
	Meaning    string
}

const (
	maxMinutes = 1e8     // 190 years: minutes × time.Minute stays well inside time.Duration (292 years)
	maxRanks   = 1 << 24 // more ranks than any machine has
	maxSize    = 1 << 40 // a bound on counts (iterations, samples, elements) that keeps their products with a size in int64
)

func intAtLeast(min int64, meaning string) numberRule {
	return numberRule{Integer: true, IMin: min, IMax: maxSize, Meaning: meaning}
}

// intDim is a size: a model dimension, a layer or batch count, a sequence
// length. Sizes are at most 2^31-1 (as tensor dimensions are in practice),
// so that a product of two stays in int64.
func intDim(min int64, meaning string) numberRule {
	return numberRule{Integer: true, IMin: min, IMax: math.MaxInt32, Meaning: meaning}
}

func intIn(min, max int64, meaning string) numberRule {
	return numberRule{Integer: true, IMin: min, IMax: max, Meaning: meaning}
}

func floatIn(min, max float64, meaning string) numberRule {
	return numberRule{Min: min, Max: max, Meaning: meaning}
}

func floatAbove(min, max float64, meaning string) numberRule {
	return numberRule{Min: min, Max: max, MinOpen: true, Meaning: meaning}
}

// trainNumberRules gives every integer and float flag of gotron train its
// range, by Megatron's meaning of the flag (TestEveryNumericTrainFlagHasARule
// keeps the list complete). Megatron checks few of these and trains on
// with e.g. a negative --clip-grad (clipping silently off) or fails deep in
// the run with a zero --log-interval (ZeroDivisionError); gotron refuses
// them before any arithmetic.
var trainNumberRules = withFIMRules(withTokenizerRules(map[string]numberRule{
	// Model.
	"num-layers":                   intDim(0, "transformer layers; required unless --model or --use-checkpoint-args"),
	"hidden-size":                  intDim(0, "hidden size"),
	"ffn-hidden-size":              intDim(0, "MLP hidden size; 0: 4×--hidden-size"),
	"num-attention-heads":          intDim(0, "attention heads"),
	"kv-channels":                  intDim(0, "head dimension; 0: hidden/heads"),
	"num-query-groups":             intDim(0, "key/value heads"),
	"max-position-embeddings":      intDim(0, "position table size; 0: --seq-length"),
	"rotary-base":                  floatAbove(0, math.MaxFloat64, "the RoPE base"),
	"rotary-percent":               floatAbove(0, 1, "the fraction of head dimensions RoPE rotates"),
	"norm-epsilon":                 floatAbove(0, 1, "the normalisation epsilon"),
	"attention-dropout":            floatIn(0, 0.999999, "a dropout probability"),
	"hidden-dropout":               floatIn(0, 0.999999, "a dropout probability"),
	"init-method-std":              floatIn(0, 1e6, "a standard deviation"),
	"mup-base-hidden-size":         intDim(0, "muP's base hidden size; 0: --hidden-size"),
	"mup-embedding-mult":           floatAbove(0, 1e6, "a multiplier on the embeddings"),
	"mup-output-mult":              floatAbove(0, 1e6, "a multiplier on the logits"),
	"mup-base-head-dim":            floatIn(0, 1e6, "muP's base head dimension; 0: none"),
	"mup-attn-scale-power":         floatAbove(0, 16, "the power of the head dimension in the attention scale"),
	"make-vocab-size-divisible-by": intIn(1, 1<<20, "the vocabulary is padded to a multiple of this × TP"),

	// Parallelism.
	"tensor-model-parallel-size":                       intIn(1, maxRanks, "ranks"),
	"pipeline-model-parallel-size":                     intIn(1, maxRanks, "ranks"),
	"num-distributed-optimizer-instances":              intIn(1, maxRanks, "distributed-optimizer instances; the data × context parallel size must divide by it"),
	"context-parallel-size":                            intIn(1, maxRanks, "ranks"),
	"num-virtual-stages-per-pipeline-rank":             intIn(0, maxRanks, "model chunks per pipeline rank; 0: one"),
	"virtual-pipeline-model-parallel-size":             intIn(0, maxRanks, "model chunks per pipeline rank; 0: one"),
	"num-layers-per-virtual-pipeline-stage":            intDim(0, "layers per model chunk; 0: not interleaved"),
	"decoder-first-pipeline-num-layers":                intDim(0, "layers; 0: an even split"),
	"decoder-last-pipeline-num-layers":                 intDim(0, "layers; 0: an even split"),
	"microbatch-group-size-per-virtual-pipeline-stage": intDim(0, "micro-batches; 0: the pipeline size"),
	"ddp-bucket-size":                                  intAtLeast(0, "elements; 0: the default"),
	"distributed-timeout-minutes":                      floatIn(0, maxMinutes, "minutes; 0: the default"),
	"device-memory-fraction":                           floatIn(0, 1, "a fraction of the device's memory; 0: the default"),

	"expert-model-parallel-size":  intIn(1, maxRanks, "ranks"),
	"expert-tensor-parallel-size": intIn(0, maxRanks, "ranks; 0: the tensor-parallel size"),

	// Heartbeats (Megatron's --inprocess-heartbeat-* names too): the flag
	// default 0 stands for "not given"; a value given must be above 0, which
	// heartbeatFlags.resolve checks (with the interval below the timeout).
	"heartbeat-timeout":            floatIn(0, 86400, "seconds"),
	"inprocess-heartbeat-timeout":  floatIn(0, 86400, "seconds"),
	"heartbeat-interval":           floatIn(0, 86400, "seconds"),
	"inprocess-heartbeat-interval": floatIn(0, 86400, "seconds"),

	// Multi-latent attention.
	"q-lora-rank":           intDim(0, "the query latent's rank; 0: a plain query projection"),
	"kv-lora-rank":          intDim(1, "the key-value latent's rank"),
	"qk-head-dim":           intDim(1, "per-head query/key channels"),
	"qk-pos-emb-head-dim":   intDim(2, "rotary channels per head (even)"),
	"v-head-dim":            intDim(1, "per-head value channels"),
	"rotary-scaling-factor": floatAbove(0, math.MaxFloat64, "YaRN's scaling factor"),
	"mscale":                floatIn(-math.MaxFloat64, math.MaxFloat64, "YaRN's mscale, a finite number"),
	"mscale-all-dim":        floatIn(-math.MaxFloat64, math.MaxFloat64, "YaRN's mscale_all_dim, a finite number"),

	// DeepSeek sparse attention.
	"dsa-indexer-n-heads":          intIn(0, 1<<16, "the indexer's heads"),
	"dsa-indexer-head-dim":         intIn(0, 1<<16, "the indexer's head dimension"),
	"dsa-indexer-topk":             intIn(0, 1<<30, "keys per query"),
	"dsa-indexer-topk-freq":        intIn(1, 1<<20, "layers per top-k computation"),
	"dsa-indexer-skip-topk-offset": intIn(0, 1<<20, "a layer offset"),
	"dsa-indexer-loss-coeff":       floatIn(0, math.MaxFloat64, "a loss coefficient; 0: none"),
	"dsa-indexer-k-norm-epsilon":   floatIn(0, math.MaxFloat64, "an epsilon; 0: --norm-epsilon"),

	// Mixture of experts.
	"num-experts":                         intIn(0, 1<<20, "experts per MoE layer; 0: a dense model"),
	"linear-conv-kernel-dim":              intDim(1, "gated delta net: the causal convolution's kernel size"),
	"linear-key-head-dim":                 intDim(1, "gated delta net: query/key head dimension"),
	"linear-value-head-dim":               intDim(1, "gated delta net: value head dimension"),
	"linear-num-key-heads":                intDim(1, "gated delta net: query/key heads"),
	"linear-num-value-heads":              intDim(1, "gated delta net: value heads"),
	"moe-ffn-hidden-size":                 intDim(0, "each expert's MLP hidden size; 0: --ffn-hidden-size"),
	"moe-router-topk":                     intIn(1, 1<<20, "experts per token"),
	"moe-router-num-groups":               intIn(0, 1<<20, "expert groups; 0: none"),
	"moe-router-group-topk":               intIn(0, 1<<20, "groups per token; 0: none"),
	"moe-router-topk-scaling-factor":      floatIn(0, math.MaxFloat64, "a factor; 0: none"),
	"moe-router-bias-update-rate":         floatIn(0, math.MaxFloat64, "an update rate"),
	"moe-input-jitter-eps":                floatIn(0, 0.999999, "the jitter's half-width: noise in (1-eps, 1+eps); 0: none"),
	"moe-z-loss-coeff":                    floatIn(0, math.MaxFloat64, "a loss coefficient; 0: none"),
	"moe-expert-capacity-factor":          floatIn(-math.MaxFloat64, math.MaxFloat64, "a capacity factor; negative: dropless"),
	"moe-shared-expert-intermediate-size": intDim(0, "the shared expert's hidden size; 0: none"),

	// Batches and iterations.
	"seq-length":             intDim(0, "tokens per sample"),
	"micro-batch-size":       intDim(0, "samples per forward/backward"),
	"global-batch-size":      intDim(0, "samples per optimizer step; 0: the micro batch × data-parallel size"),
	"eval-global-batch-size": intDim(0, "samples per evaluation batch; 0: --global-batch-size"),
	"eval-micro-batch-size":  intDim(0, "samples per evaluation forward; 0: --micro-batch-size"),
	"train-iters":            intAtLeast(0, "iterations"),
	"train-samples":          intAtLeast(0, "samples"),
	"seed":                   intIn(0, math.MaxUint32, "NumPy's seeds, which Megatron's datasets use, are below 2^32"),

	// Optimizer and schedules.
	"lr":                   floatIn(0, 1e6, "a learning rate"),
	"min-lr":               floatIn(0, 1e6, "a learning rate"),
	"lr-warmup-init":       floatIn(0, 1e6, "a learning rate"),
	"decoupled-lr":         floatIn(0, 1e6, "a learning rate; 0: --lr"),
	"decoupled-min-lr":     floatIn(0, 1e6, "a learning rate; 0: --min-lr"),
	"lr-decay-iters":       intAtLeast(0, "iterations; 0: --train-iters"),
	"lr-decay-samples":     intAtLeast(0, "samples"),
	"lr-wsd-decay-iters":   intAtLeast(0, "iterations"),
	"lr-wsd-decay-samples": intAtLeast(0, "samples"),
	"lr-warmup-iters":      intAtLeast(0, "iterations"),
	"lr-warmup-samples":    intAtLeast(0, "samples"),
	"lr-warmup-fraction":   floatIn(0, 1, "a fraction of the decay length"),
	"weight-decay":         floatIn(0, 1e6, "a weight-decay coefficient"),
	"start-weight-decay":   floatIn(0, 1e6, "a weight-decay coefficient"),
	"end-weight-decay":     floatIn(0, 1e6, "a weight-decay coefficient"),
	"clip-grad":            floatIn(0, math.MaxFloat64, "the global gradient L2 norm to clip to; 0 turns clipping off"),
	"adam-beta1":           floatIn(0, 0.999999999, "Adam's β1, in [0, 1)"),
	"adam-beta2":           floatIn(0, 0.999999999, "Adam's β2, in [0, 1)"),
	"adam-eps":             floatAbove(0, 1, "Adam's ε"),
	"sgd-momentum":         floatIn(0, 1, "a momentum"),
	"loss-scale":           floatIn(0, math.MaxFloat32, "a constant loss scale; 0: dynamic scaling"),
	"initial-loss-scale":   floatAbove(0, math.MaxFloat32, "a loss scale"),
	"min-loss-scale":       floatAbove(0, math.MaxFloat32, "a loss scale"),
	"loss-scale-window":    intIn(1, math.MaxInt32, "iterations"),
	"hysteresis":           intIn(1, math.MaxInt32, "iterations"),
	"max-nan-iterations":   intIn(0, math.MaxInt32, "iterations; 0: 10"),
	"error-injection-rate": intIn(0, math.MaxInt32, "one validation in this many; 0: no injection"),
	"check-weight-hash-across-dp-replicas-interval": intAtLeast(0, "iterations; 0: never"),
	"recompute-num-layers":                          intDim(0, "layers"),
	"fp8-margin":                                    intIn(0, 64, "delayed FP8 recipe: scales divided by 2^margin"),
	"fp8-amax-history-len":                          intIn(1, 1<<16, "delayed FP8 recipe: amaxes kept per tensor (TE's default 1024)"),
	"num-layers-at-start-in-bf16":                   intDim(0, "layers kept out of FP8 at the start"),
	"num-layers-at-end-in-bf16":                     intDim(0, "layers kept out of FP8 at the end"),

	// Evaluation, logging, checkpoints.
	"eval-interval":            intIn(1, math.MaxInt64, "iterations between evaluations; --eval-iters 0 turns evaluation off"),
	"eval-iters":               intAtLeast(0, "global batches per evaluation; 0 turns evaluation off"),
	"num-workers":              intIn(0, 1024, "data-loader workers (data/gpt.MaxWorkers)"),
	"log-interval":             intIn(1, math.MaxInt64, "iterations between log lines"),
	"tensorboard-log-interval": intIn(1, math.MaxInt64, "iterations between TensorBoard scalars"),
	"tensorboard-queue-size":   intAtLeast(1, "events"),
	"peak-flops":               floatIn(0, math.MaxFloat64, "FLOP/s; 0: measured"),
	"save-interval":            intIn(0, math.MaxInt64, "iterations between checkpoints; 0: no periodic checkpoints"),
	"exit-interval":            intIn(0, math.MaxInt64, "iterations; 0: none"),
	"timing-log-level":         intIn(0, 2, "Megatron's timer level: 0, 1 or 2"),
	"profile-step-start":       intIn(0, math.MaxInt64, "iterations before profiling starts"),
	"profile-step-end":         intIn(1, math.MaxInt64, "iterations after which profiling stops"),
	"save-retain-interval":     intIn(0, math.MaxInt64, "iterations whose checkpoints are kept; 0: keep all"),
	"exit-duration-in-mins":    floatIn(0, maxMinutes, "minutes of training; 0: no limit"),
	"async-save-rate":          floatIn(0, 1e9, "MB/s per rank; 0: unpaced"),
	"sample-tokens":            intIn(0, math.MaxInt32, "tokens"),

	// Megatron's RL step (rlflags.go).
	"grpo-prompts-per-step":                     intIn(1, 1<<20, "prompts per rollout collection"),
	"grpo-group-size":                           intIn(1, 1<<20, "rollouts per prompt (GRPO needs at least 2; the RL step says why)"),
	"grpo-iterations":                           intIn(1, 1<<20, "passes over each collection's rollouts"),
	"rl-sequence-packing-max-sequences-per-bin": intIn(1, 1<<20, "rollouts in a packed bin"),
	"grpo-clamp-eps-lower":                      floatIn(0, 1, "the policy ratio's lower clip, 1 - eps"),
	"grpo-clamp-eps-upper":                      floatIn(0, 1e6, "the policy ratio's upper clip, 1 + eps"),
	"grpo-kl-beta":                              floatIn(0, 1e6, "the KL term's weight"),
	"grpo-entropy-term-weight":                  floatIn(-1e6, 1e6, "the entropy term's weight"),
	"rl-default-temperature":                    floatAbove(0, 1e6, "a sampling temperature"),
	"rl-default-top-p":                          floatIn(0, 1, "a nucleus probability; 0: off"),
	"rl-default-top-k":                          intIn(-1, math.MaxInt32, "tokens; -1 or 0: off"),
	"rl-inference-tensor-model-parallel-size":   intIn(0, 1<<16, "ranks; 0: the training layout's"),
	"rl-importance-sampling-truncation-coef":    floatIn(0, 1e6, "the importance weight's upper bound; 0 (unset): none"),
}))

// fimNumberRules are the FIM data flags' (train and data samples); the
// rates' lower bounds (non-zero --fim-rate and --fim-spm-rate, as Megatron
// asserts) are checked by data/gpt.
var fimNumberRules = map[string]numberRule{
	"fim-rate":          floatIn(0, 1, "a probability"),
	"fim-spm-rate":      floatIn(0, 1, "a probability"),
	"fim-fragment-rate": floatIn(0, 1, "a probability"),
}

// tokenizerNumberRules are the numeric tokenizer flags every command with
// a tokenizer shares.
var tokenizerNumberRules = map[string]numberRule{
	"vocab-size":                  intIn(0, math.MaxInt32, "token ids are int32"),
	"vocab-extra-ids":             intIn(0, math.MaxInt32, "token ids are int32"),
	"tiktoken-num-special-tokens": intIn(0, math.MaxInt32, "token ids are int32"),
}

// preprocessNumberRules are gotron preprocess's numeric flags.
var preprocessNumberRules = withTokenizerRules(map[string]numberRule{
	"workers":      intIn(1, 1<<16, "tokenizing goroutines"),
	"partitions":   intIn(1, 1<<12, "partitions, each with open output files"),
	"log-interval": intIn(1, math.MaxInt64, "documents between progress lines"),
})

// dataSamplesNumberRules are gotron data samples's numeric flags.
var dataSamplesNumberRules = withFIMRules(withTokenizerRules(map[string]numberRule{
	"seq-length": intIn(0, maxSize, "tokens per sample"),
	"seed":       intIn(0, math.MaxUint32, "NumPy's seeds, which Megatron's datasets use, are below 2^32"),
	"first":      intIn(0, math.MaxInt64, "samples to print; 0: all"),
	"eod-id":     intIn(-1, math.MaxInt32, "a token id; -1: none given"),
}))

func withFIMRules(rules map[string]numberRule) map[string]numberRule {
	for k, v := range fimNumberRules {
		rules[k] = v
	}
	return rules
}

func withTokenizerRules(rules map[string]numberRule) map[string]numberRule {
	for k, v := range tokenizerNumberRules {
		rules[k] = v
	}

	return rules
}

// checkNumbers checks every numeric flag's value (value returns a flag's
// text by name) against its rule: one place, before the run does
// arithmetic with any of them.
func checkNumbers(rules map[string]numberRule, value func(name string) (string, bool)) error {
	names := make([]string, 0, len(rules))
	for name := range rules {
		names = append(names, name)
	}
	sort.Strings(names) // report in a fixed order
	for _, name := range names {
		text, ok := value(name)
		if !ok {
			continue
		}
		if err := rules[name].check("--"+name, text); err != nil {
			return err
		}
	}
	return nil
}

func (r numberRule) check(name, text string) error {
	if r.Integer {
		v, err := strconv.ParseInt(strings.TrimSpace(text), 10, 64)
		if err != nil {
			return fmt.Errorf("%s: %q is not an integer", name, text)
		}
		return checked.RangeWhy(name, v, r.IMin, r.IMax, r.Meaning)
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(text), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("%s: %q is not a finite number (%s)", name, text, r.Meaning)
	}
	low := v < r.Min || (r.MinOpen && v == r.Min)
	if low || v > r.Max {
		want := "at least"
		if r.MinOpen {
			want = "above"
		}
		bound := fmt.Sprintf("%s %g", want, r.Min)
		if r.Max < math.MaxFloat64 {
			bound += fmt.Sprintf(" and at most %g", r.Max)
		}
		return fmt.Errorf("%s: %s is out of range: must be %s (%s)", name, text, bound, r.Meaning)
	}
	return nil
}

// missingRequired lists, all at once, the flags a gotron train run needs
// that are missing. Any flag makes gotron train a run of its own rather
// than the quickstart, so the message says so.
func (f *trainFlags) missingRequired() error {
	var missing []string
	// --use-checkpoint-args and a Hugging Face --load give the architecture.
	if f.preset == "" && !f.useCkptArgs && !(f.cfg.Load != "" && hf.IsHFDir(f.cfg.Load)) {
		var model []string
		for _, m := range []struct {
			name string
			v    int
		}{{"--num-layers", f.model.NumLayers}, {"--hidden-size", f.model.HiddenSize}, {"--num-attention-heads", f.model.NumAttentionHeads}} {
			if m.v == 0 {
				model = append(model, m.name)
			}
		}
		if len(model) > 0 {
			missing = append(missing, strings.Join(model, ", ")+" (or --model PRESET)")
		}
	}
	if f.cfg.SeqLength == 0 {
		missing = append(missing, "--seq-length")
	}
	if f.cfg.MicroBatchSize == 0 {
		missing = append(missing, "--micro-batch-size")
	}
	if f.schedule.LR == 0 {
		missing = append(missing, "--lr")
	}
	if f.cfg.TrainIters == 0 && f.cfg.TrainSamples == 0 {
		missing = append(missing, "--train-iters or --train-samples")
	}
	d := &f.data
	if !f.rl.perform && !d.mock && len(d.dataPath.values)+len(d.trainPath.values)+len(d.validPath.values)+len(d.testPath.values) == 0 {
		missing = append(missing, "--data-path (or --train-data-path ...) or --mock-data")
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("flags were given, so this is a run of its own, not the quickstart (gotron train with no flags, or only --quickstart-dir, runs that); missing required flags: %s",
		strings.Join(missing, "; "))
}

// flagText returns a flag's value as text by name, for checkNumbers.
func flagText(fs *flag.FlagSet) func(name string) (string, bool) {
	return func(name string) (string, bool) {
		fl := fs.Lookup(name)
		if fl == nil {
			return "", false
		}
		return fl.Value.String(), true
	}
}

// trainValidTestSamples is Megatron's get_train_valid_test_num_samples:
// the samples each split must supply for iters iterations of gbs samples,
// evaluating evalIters batches of evalGBS samples every evalInterval
// iterations (0: only after training) and once on the test split. The
// products are checked: flags within their ranges can still ask for more
// than 2^63 samples.
func trainValidTestSamples(iters, gbs, evalGBS, evalInterval, evalIters int64) ([3]int64, error) {
	var num [3]int64
	evals := evalIters
	if evalInterval > 0 {
		n, ok := checked.Mul(iters/evalInterval+1, evalIters)
		if !ok {
			return num, fmt.Errorf("--train-iters=%d with --eval-interval=%d and --eval-iters=%d: too many evaluation batches", iters, evalInterval, evalIters)
		}
		evals = n
	}
	for i, batches := range []int64{iters, evals, evalIters} {
		size := gbs
		if i > 0 {
			size = evalGBS
		}
		n, ok := checked.Mul(batches, size)
		if !ok {
			return num, fmt.Errorf("%d batches of %d samples (--train-iters, --eval-interval, --eval-iters, --global-batch-size, --eval-global-batch-size): more than 2^63 samples", batches, size)
		}
		num[i] = n
	}
	return num, nil
}
