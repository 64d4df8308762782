package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/infer/server"
	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/rl"
	"github.com/gotron/gotron/tokenizer"
	"github.com/gotron/gotron/train"
)

// rlFlags are Megatron's RL step flags (--perform-rl-step, train_rl.py's
// GRPO) that gotron train runs; Megatron's other --rl-* flags stay refused
// (megatronargs.go). Defaults are Megatron's.
type rlFlags struct {
	perform                    bool
	envConfig                  string
	promptsPerStep, groupSize  int
	iterations                 int
	epsLower, epsUpper, klBeta float64
	entropyWeight              float64
	temperature, topP          float64
	topK                       int
	isCorrection               bool
	isTruncation               float64
	skipBOS                    bool
	offloadOptimizer           bool
	refitMethod                string
	packing                    bool
	packingAlgo                string
	maxPerBin                  int
	// Megatron's rollout engine arguments the RL step applies
	// (engineArgs): --inference-dynamic-batching-buffer-size-gb,
	// --inference-max-seq-length and --inference-logging-step-interval
	// (0: not given).
	kvCacheGB         float64
	maxSeqLen         int
	engineLogInterval int
	// inferTP is --rl-inference-tensor-model-parallel-size (0: not given).
	inferTP int
}

// rlOnlyFlags need --perform-rl-step.
var rlOnlyFlags = []string{"langrl-env-config", "grpo-prompts-per-step", "grpo-group-size", "grpo-iterations",
	"grpo-clamp-eps-lower", "grpo-clamp-eps-upper", "grpo-kl-beta", "grpo-entropy-term-weight",
	"rl-default-temperature", "rl-default-top-p", "rl-default-top-k", "rl-inference-logprobs-is-correction",
	"rl-importance-sampling-truncation-coef", "rl-skip-bos-token", "rl-offload-optimizer-during-inference", "refit-method",
	"rl-use-sequence-packing", "rl-sequence-packing-algo", "rl-sequence-packing-max-sequences-per-bin",
	"rl-inference-tensor-model-parallel-size"}

func addRLFlags(fs *flag.FlagSet, f *rlFlags) {
	fs.BoolVar(&f.perform, "perform-rl-step", false, "Megatron's RL step (train_rl.py): GRPO on rollouts gotron generates with the current weights from --langrl-env-config's environment (one process, data- and tensor-parallel ranks, the CPU; docs/training.md)")
	fs.IntVar(&f.inferTP, "rl-inference-tensor-model-parallel-size", 0, "RL: generate the rollouts on a separate inference layout of this tensor-parallel size (from a training layout without tensor parallelism: before each collection the ranks slice the current weights into their shards); 0: the training layout")
	fs.StringVar(&f.envConfig, "langrl-env-config", "", "RL: a YAML list with one environment, {agent_type: CountdownAgent, agent_args: {dataset_file: TASKS.jsonl}}")
	fs.IntVar(&f.promptsPerStep, "grpo-prompts-per-step", 32, "RL: prompts drawn per rollout collection")
	fs.IntVar(&f.groupSize, "grpo-group-size", 2, "RL: rollouts per prompt (a GRPO group; at least 2)")
	fs.IntVar(&f.iterations, "grpo-iterations", 2, "RL: passes over each collection's rollouts before the next collection")
	fs.Float64Var(&f.epsLower, "grpo-clamp-eps-lower", 0.01, "RL: the policy ratio is clipped below at 1 - eps")
	fs.Float64Var(&f.epsUpper, "grpo-clamp-eps-upper", 0.01, "RL: the policy ratio is clipped above at 1 + eps")
	fs.Float64Var(&f.klBeta, "grpo-kl-beta", 0.001, "RL: weight of the KL term against the reference model (the weights the run starts from)")
	fs.Float64Var(&f.entropyWeight, "grpo-entropy-term-weight", 0, "RL: weight of the entropy bonus")
	fs.Float64Var(&f.temperature, "rl-default-temperature", 1, "RL: sampling temperature of the rollouts")
	fs.Float64Var(&f.topP, "rl-default-top-p", 0, "RL: top-p of the rollouts (0: off)")
	fs.IntVar(&f.topK, "rl-default-top-k", -1, "RL: top-k of the rollouts (-1: off)")
	fs.BoolVar(&f.isCorrection, "rl-inference-logprobs-is-correction", false, "RL: weigh each token's loss by exp(old - inference log-probability)")
	fs.Float64Var(&f.isTruncation, "rl-importance-sampling-truncation-coef", 0, "RL: upper bound of that weight (with --rl-inference-logprobs-is-correction; unset: none)")
	fs.BoolVar(&f.skipBOS, "rl-skip-bos-token", false, "RL: no BOS token before the prompt")
	fs.BoolVar(&f.offloadOptimizer, "rl-offload-optimizer-during-inference", false, "RL: accepted; no effect on the CPU (the optimizer state stays in host memory while gotron generates)")
	fs.BoolVar(&f.packing, "rl-use-sequence-packing", false, "RL: pack each collection's rollouts into bins of --seq-length tokens and train on bins (needs --micro-batch-size 1)")
	fs.StringVar(&f.packingAlgo, "rl-sequence-packing-algo", "fifo", "RL: how the bins are dealt to data-parallel ranks: fifo (contiguous runs) or round-robin (every N-th bin)")
	fs.IntVar(&f.maxPerBin, "rl-sequence-packing-max-sequences-per-bin", 50, "RL: at most this many rollouts in a bin")
	fs.StringVar(&f.refitMethod, "refit-method", "gloo", "RL: nccl, gloo or nvshmem: accepted; gotron generates in the training process from a copy of its weights")
}

// check refuses RL flags without --perform-rl-step and values gotron does
// not run, and returns a note for each accepted flag without effect.
func (f *rlFlags) check(given map[string]bool) (notes []string, err error) {
	if !f.perform {
		for _, name := range rlOnlyFlags {
			if given[name] {
				return nil, fmt.Errorf("--%s needs --perform-rl-step", name)
			}
		}
		return nil, nil
	}
	switch f.refitMethod {
	case "nccl", "gloo", "nvshmem":
	default:
		return nil, fmt.Errorf("--refit-method %q: want nccl, gloo or nvshmem", f.refitMethod)
	}
	if f.packingAlgo != rl.PackFIFO && f.packingAlgo != rl.PackRoundRobin {
		return nil, fmt.Errorf("--rl-sequence-packing-algo %q: want %s or %s (Megatron's choices)", f.packingAlgo, rl.PackFIFO, rl.PackRoundRobin)
	}
	if !f.packing && (given["rl-sequence-packing-algo"] || given["rl-sequence-packing-max-sequences-per-bin"]) {
		return nil, fmt.Errorf("--rl-sequence-packing-algo and --rl-sequence-packing-max-sequences-per-bin need --rl-use-sequence-packing")
	}
	if given["rl-importance-sampling-truncation-coef"] && !f.isCorrection {
		return nil, fmt.Errorf("--rl-importance-sampling-truncation-coef needs --rl-inference-logprobs-is-correction (Megatron applies it only then)")
	}
	if given["eval-interval"] || given["eval-iters"] {
		// Megatron's RL loop evaluates the environment's validation prompts
		// (evaluate_and_print_results_rl) every --eval-interval; it changes
		// no training number, and gotron has no RL evaluation.
		notes = append(notes, "--eval-interval/--eval-iters: no effect with --perform-rl-step: Megatron's RL evaluation (its environment's validation prompts) is not built in gotron; training is unchanged")
	}
	if given["mock-data"] {
		// train_rl.py's train_valid_test_datasets_provider builds minimal
		// placeholder datasets whatever the data arguments say.
		notes = append(notes, "--mock-data: no effect with --perform-rl-step: the RL step trains on the rollouts it generates (Megatron's train_rl.py builds placeholder datasets whatever the data arguments say)")
	}
	if given["rl-offload-optimizer-during-inference"] {
		notes = append(notes, "--rl-offload-optimizer-during-inference: no effect on the CPU: the optimizer state stays in host memory while gotron generates (the same numbers)")
	}
	if given["refit-method"] {
		notes = append(notes, "--refit-method "+f.refitMethod+": no effect in gotron: the rollouts are generated in the training process from a copy of its weights, not through Megatron's copy service (the same numbers)")
	}
	return notes, nil
}

// collector builds the RL step for cfg with tokenizer tok (whose files
// d names: a Hugging Face tokenizer directory's chat template renders the
// prompts, as Megatron's chat completions do; without one the plain
// "User: …\nAssistant:" format of gotron serve).
func (f *rlFlags) collector(cfg *train.Config, tok tokenizer.Tokenizer, d tokenizer.Config, printf func(string, ...any)) (*rl.Collector, error) {
	env, err := rl.LoadEnv(f.envConfig)
	if err != nil {
		return nil, err
	}
	if printf != nil {
		printf("rl: %d countdown tasks from %s", len(env.Tasks), env.Source)
		if env.Note != "" {
			printf("rl: %s", env.Note)
		}
	}
	var tmpl *server.ChatTemplate
	if d.Type == tokenizer.TypeHuggingFace && d.Model != "" {
		dir := d.Model
		if tmpl, err = server.LoadChatTemplate(dir); err != nil {
			return nil, fmt.Errorf("--tokenizer-model %s: chat template: %w", filepath.Clean(dir), err)
		}
	}
	render := func(prompt string) (string, error) {
		msgs := []server.Message{{Role: "user", Content: prompt}}
		if tmpl != nil {
			return tmpl.Render(msgs, true)
		}
		return server.PlainTemplate(msgs, true), nil
	}
	gbs := cfg.GlobalBatchSize
	if gbs == 0 {
		gbs = cfg.MicroBatchSize
	}
	var dp, tpg comm.ProcessGroup
	if cfg.Parallel != nil {
		dp, tpg = cfg.Parallel.DP, cfg.Parallel.TP
	}
	inferTP, err := f.inferenceLayout(cfg)
	if err != nil {
		return nil, err
	}
	if inferTP != nil && printf != nil {
		printf("rl: the rollouts are generated on a separate inference layout: groups of %d tensor-parallel ranks (the weights are sliced into it before each collection)", inferTP.Size())
	}
	c, err := rl.NewCollector(rl.Config{Env: env, DP: dp, TP: tpg, InferenceTP: inferTP, Tokenizer: tok, Render: render,
		PromptsPerStep: f.promptsPerStep, GroupSize: f.groupSize, Iterations: f.iterations,
		GlobalBatchSize: gbs, MicroBatchSize: cfg.MicroBatchSize, SeqLength: cfg.SeqLength,
		Loss: rl.LossConfig{ClampEpsLower: f.epsLower, ClampEpsUpper: f.epsUpper, KLBeta: f.klBeta, EntropyWeight: f.entropyWeight,
			ISCorrection: f.isCorrection, ISTruncation: f.isTruncation},
		Temperature: f.temperature, TopP: f.topP, TopK: f.topK, SkipBOS: f.skipBOS, Seed: cfg.Seed, BF16: cfg.BF16, Printf: printf,
		Packing: f.packing, MaxSequencesPerBin: f.maxPerBin, PackingAlgo: f.packingAlgo,
		KVCacheGB: f.kvCacheGB, MaxSequenceLength: f.maxSeqLen, EngineLogInterval: f.engineLogInterval})
	if err != nil {
		return nil, err
	}
	// The rollouts are not checkpointed: Megatron asserts saves and exits
	// fall where a collection starts.
	n := c.IterationsPerCollection()
	for _, iv := range []struct {
		name string
		v    int64
	}{{"--save-interval", cfg.SaveInterval}, {"--exit-interval", cfg.ExitInterval}} {
		if iv.v > 0 && iv.v%n != 0 {
			return nil, fmt.Errorf("%s=%d must be a multiple of the %d iterations each rollout collection trains (--grpo-iterations × --grpo-prompts-per-step × --grpo-group-size / --global-batch-size), as Megatron asserts: the rollouts are not checkpointed", iv.name, iv.v, n)
		}
	}
	return c, nil
}

// inferenceLayout makes the tensor-parallel group of the separate inference
// layout --rl-inference-tensor-model-parallel-size asks for (nil when it
// is not given or is training's size). Built from a training layout of
// data parallelism only, whose ranks each hold the whole model: inference
// groups of k consecutive ranks (Megatron's rank order puts the inference
// tensor-parallel ranks next to each other).
func (f *rlFlags) inferenceLayout(cfg *train.Config) (comm.ProcessGroup, error) {
	k := f.inferTP
	trainTP := 1
	if cfg.Parallel != nil {
		trainTP = cfg.Parallel.TP.Size()
	}
	if k == 0 || k == trainTP {
		return nil, nil
	}
	const flag = "--rl-inference-tensor-model-parallel-size"
	if cfg.Parallel == nil || cfg.Parallel.World.Size() == 1 {
		return nil, fmt.Errorf("%s=%d: a separate inference layout of %d tensor-parallel ranks needs a launched run of at least %d ranks (gotron launch --nproc-per-node %d)", flag, k, k, k, k)
	}
	p := cfg.Parallel
	l := p.Layout.Config
	switch {
	case trainTP != 1:
		return nil, fmt.Errorf("%s=%d with --tensor-model-parallel-size=%d: not built: gotron builds the inference layout from a training layout without tensor parallelism (every rank holding the whole model); generate on the training layout (leave %s out) or train at TP=1", flag, k, trainTP, flag)
	case max(l.PP, 1) != 1 || max(l.CP, 1) != 1 || max(l.EP, 1) != 1:
		return nil, fmt.Errorf("%s=%d: not built with pipeline, context or expert parallelism in training (PP=%d, CP=%d, EP=%d): gotron builds the inference layout from data-parallel ranks that each hold the whole model", flag, k, max(l.PP, 1), max(l.CP, 1), max(l.EP, 1))
	case p.World.Size()%k != 0:
		return nil, fmt.Errorf("%s=%d does not divide the world of %d ranks (Megatron's inference layout uses every rank)", flag, k, p.World.Size())
	case p.DP.Size() != p.World.Size():
		return nil, fmt.Errorf("%s=%d: the data-parallel group (%d ranks) is not the world (%d)", flag, k, p.DP.Size(), p.World.Size())
	}
	base := p.World.Rank() / k * k
	ranks := make([]int, k)
	for i := range ranks {
		ranks[i] = base + i
	}
	g, err := p.World.NewGroup(ranks)
	if err != nil {
		return nil, fmt.Errorf("%s=%d: the inference tensor-parallel group of ranks %v: %w", flag, k, ranks, err)
	}
	return g, nil
}

// openRLTokenizer opens the tokenizer of an RL run, whose data are its
// rollouts: no --data-path or --mock-data.
func openRLTokenizer(d *dataArgs, divisor int) (*dataSources, error) {
	if len(d.dataPath.values)+len(d.trainPath.values)+len(d.validPath.values)+len(d.testPath.values) > 0 {
		return nil, fmt.Errorf("--perform-rl-step trains on the rollouts it generates: --data-path (and --train/--valid/--test-data-path) have no use (remove them)")
	}
	if d.tok.Type == "" && d.tok.VocabFile != "" && d.tok.MergeFile != "" {
		d.tok.Type = tokenizer.TypeGPT2BPE
	}
	if d.tok.Type == "" {
		return nil, fmt.Errorf("--perform-rl-step needs --tokenizer-type (and its files): the prompts are text and the rewards read the generated text")
	}
	tok, err := tokenizer.New(d.tok)
	if err != nil {
		return nil, err
	}
	return &dataSources{tok: tok, paddedVocab: tokenizer.PaddedVocabSize(tok.VocabSize(), divisor, 1)}, nil
}

// rlGraphArgs are Megatron's CUDA-graph arguments that, with
// --perform-rl-step, change how kernels are launched and not what they
// compute: Megatron captures CUDA graphs of its rollout engine's steps
// (and, with --rl-training-cuda-graphs, keeps the training forward's
// graphs on instead of turning them off after generating, as
// prepare_data_for_update does); a graph replays the same kernels. gotron
// generates and trains without CUDA graphs, so each is accepted with one
// line, in gotron inference's words (inferenceDetails) where it has them.
// Outside the RL step gotron train refuses them (needCUDAGraph).
var rlGraphArgs = map[string]string{
	"cuda-graph-impl":                                           inferenceDetails["cuda-graph-impl"],
	"enable-cuda-graph":                                         inferenceDetails["enable-cuda-graph"],
	"decode-only-cuda-graphs":                                   inferenceDetails["decode-only-cuda-graphs"],
	"inference-dynamic-batching-num-cuda-graphs":                inferenceDetails["inference-dynamic-batching-num-cuda-graphs"],
	"inference-dynamic-batching-cuda-graph-sizing-distribution": inferenceDetails["inference-dynamic-batching-cuda-graph-sizing-distribution"],
	"rl-training-cuda-graphs":                                   "keeps Megatron's CUDA graphs on while it trains on the rollouts (it turns them off after generating otherwise)",
}

// noteRLGraphArgs marks, on gotron train's flags, the CUDA-graph arguments
// the RL step accepts (their usage says they are refused otherwise).
func noteRLGraphArgs(fs *flag.FlagSet, defined map[string]bool) {
	for name, why := range rlGraphArgs {
		if fl := fs.Lookup(name); fl != nil && defined[name] {
			fl.Usage += "; with --perform-rl-step accepted, no effect: it " + why
		}
	}
}

// engineArgs takes the RL step's arguments of Megatron's rollout engine:
// the CUDA-graph arguments (rlGraphArgs), checked as Megatron's
// validate_args does, the unified-memory level and --max-tokens-to-oom,
// each accepted with one line (the same numbers: gotron launches no CUDA
// graph, keeps the KV cache in host memory and sizes it by the buffer
// size); the KV cache's size, the rollouts' length cap and
// the engine's step log, which the collector applies; and
// --rl-generation-lag 0, with --rl-partial-rollouts only at batch
// granularity: Megatron's synchronous generation, which is gotron's. It returns given without
// these, for the compatibility check that refuses them outside the RL
// step.
func (f *rlFlags) engineArgs(fs *flag.FlagSet, given map[string]bool) (lines []string, rest map[string]bool, err error) {
	if !f.perform {
		return nil, given, nil
	}
	value := func(name string) string {
		if fl := fs.Lookup(name); fl != nil {
			return fl.Value.String()
		}
		return ""
	}
	impl := value("cuda-graph-impl")
	if !given["cuda-graph-impl"] {
		impl = "none"
	}
	switch impl {
	case "none", "local", "transformer_engine", "full_iteration":
	default:
		return nil, nil, fmt.Errorf("--cuda-graph-impl %q: want none, local, transformer_engine or full_iteration (Megatron's choices)", impl)
	}
	if given["enable-cuda-graph"] && value("enable-cuda-graph") == "true" {
		if impl != "none" {
			return nil, nil, errors.New("--enable-cuda-graph with --cuda-graph-impl: Megatron refuses both (\"Do not use --enable-cuda-graph or --external-cuda-graph with --cuda-graph-impl\"); --enable-cuda-graph is its deprecated --cuda-graph-impl local")
		}
		impl = "local"
	}
	if given["rl-training-cuda-graphs"] && value("rl-training-cuda-graphs") == "true" && impl == "none" {
		return nil, nil, errors.New("--rl-training-cuda-graphs without --cuda-graph-impl: Megatron asserts \"--rl-training-cuda-graphs is set but no CUDA graphs are being built\"")
	}
	if d := value("inference-dynamic-batching-cuda-graph-sizing-distribution"); given["inference-dynamic-batching-cuda-graph-sizing-distribution"] && d != "exponential" && d != "linear" {
		return nil, nil, fmt.Errorf("--inference-dynamic-batching-cuda-graph-sizing-distribution %q: want exponential or linear (Megatron's choices)", d)
	}
	intArg := func(name string, lo int64) (int, error) {
		v := value(name)
		n, perr := strconv.ParseInt(v, 10, 64)
		if perr != nil {
			return 0, fmt.Errorf("--%s %q: want an integer", name, v)
		}
		if err := checked.Range("--"+name, n, lo, 1<<30); err != nil {
			return 0, err
		}
		return int(n), nil
	}
	if name := "inference-dynamic-batching-num-cuda-graphs"; given[name] {
		n, perr := strconv.Atoi(value(name))
		if perr != nil || (impl == "local" && n <= 0 && n != -1) {
			return nil, nil, fmt.Errorf("--%s %q: want a positive integer or -1 (Megatron asserts it with --cuda-graph-impl local; -1 lets it pick)", name, value(name))
		}
	}
	for _, name := range []string{"inference-dynamic-batching-unified-memory-level", "max-tokens-to-oom"} {
		if _, err := intArg(name, 0); given[name] && err != nil {
			return nil, nil, err
		}
	}
	if name := "inference-dynamic-batching-buffer-size-gb"; given[name] {
		gb, perr := strconv.ParseFloat(value(name), 64)
		if perr != nil || math.IsNaN(gb) || gb <= 0 || gb > 1<<20 {
			return nil, nil, fmt.Errorf("--%s %q: want a size in GiB > 0", name, value(name))
		}
		f.kvCacheGB = gb
	}
	if name := "inference-max-seq-length"; given[name] {
		if f.maxSeqLen, err = intArg(name, 1); err != nil {
			return nil, nil, err
		}
	}
	if name := "inference-logging-step-interval"; given[name] {
		if f.engineLogInterval, err = intArg(name, 0); err != nil {
			return nil, nil, err
		}
	}
	partial := given["rl-partial-rollouts"] && value("rl-partial-rollouts") == "true"
	lag := value("rl-generation-lag")
	lagZero := given["rl-generation-lag"] && (lag == "0" || lag == "0.0")
	batchWise := func(name string) bool { v := value(name); return !given[name] || v == "" || v == "B" }
	// Megatron's RolloutPipeline with a lag of 0 and whole batches (B)
	// submitted and consumed: its one gate slot is freed when the trainer
	// resumes the rollout generator after taking the whole previous
	// collection, at the next collection, after the weights are refit; so
	// no rollout is in flight across a weight update, and partial rollouts
	// are synchronous generation, gotron's. A lag left to Megatron's
	// autotuning, above 0, or groups (G) are not.
	syncPartial := partial && lagZero && batchWise("rl-submission-granularity") && batchWise("rl-consumption-granularity")
	rest = map[string]bool{}
	names := make([]string, 0, len(given))
	for name := range given {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		v := value(name)
		switch why, graph := rlGraphArgs[name]; {
		case graph && v == "false": // --flag=false asks for nothing
		case graph:
			shown := "--" + name
			if v != "true" {
				shown += " " + v
			}
			lines = append(lines, fmt.Sprintf("%s: no effect in gotron: it %s; gotron generates and trains without CUDA graphs, which replay the same kernels (the same numbers)", shown, why))
		case name == "inference-dynamic-batching-unified-memory-level":
			lines = append(lines, fmt.Sprintf("--%s %s: no effect in gotron: it %s; gotron's rollout engine keeps its KV cache in host memory (the same numbers)", name, v, inferenceDetails[name]))
		case name == "max-tokens-to-oom":
			lines = append(lines, fmt.Sprintf("--%s %s: no effect in gotron: it %s", name, v, inferenceDetails[name]))
		case name == "inference-dynamic-batching-buffer-size-gb" || name == "inference-max-seq-length" || name == "inference-logging-step-interval":
		case name == "rl-generation-lag" && lagZero && (!partial || syncPartial):
			lines = append(lines, "--rl-generation-lag 0: generation is synchronous, as gotron's: each collection is generated to the end on the current weights (Megatron's behaviour without --rl-partial-rollouts, and with it at lag 0 and batch granularity)")
		case name == "rl-partial-rollouts" && syncPartial:
			lines = append(lines, "--rl-partial-rollouts: no effect with --rl-generation-lag 0 and batch (B) submission and consumption: Megatron's rollout pipeline submits a collection's rollouts only after the trainer has taken the whole previous one, so no rollout is generated across a weight update (the same rollouts as gotron's synchronous generation)")
		default:
			rest[name] = true
		}
	}
	return lines, rest, nil
}
