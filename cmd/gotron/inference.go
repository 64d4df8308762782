package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gotron/gotron/infer"
	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/internal/pyjson"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tokenizer"
)

// gotron inference runs the argument list of Megatron-LM's inference
// scripts (examples/inference/advanced/gpt_dynamic_inference.py,
// gpt_static_inference.py, examples/inference/offline_inference.py). Those
// scripts parse Megatron's training arguments plus add_inference_args
// (megatron/inference/utils.py) with one parser, so this command takes
// gotron train's flags plus those arguments: the model comes from --load,
// the prompts from --prompts or --prompt-file, and the requests run through
// gotron's continuous-batching engine (infer.Engine) with Megatron's
// arrival schedule; --output-path writes the script's JSON. docs/design/cli.md
// says why this is a command of its own.

const inferenceSynopsis = "inference --load DIR (--prompts TEXT... | --prompt-file FILE.jsonl) [--num-tokens-to-generate N --temperature T --top_k K --top_p P --return-log-probs --top-n-logprobs N --stop-words W... --output-path FILE.json ...] (Megatron's inference-script arguments; training arguments accepted and unused)"

// inferenceArgs are add_inference_args' arguments (and the inference
// group of Megatron's training arguments) that gotron inference gives a
// meaning.
type inferenceArgs struct {
	temperature, topP           float64
	topK                        int
	returnLogProbs, skipPrompt  bool
	prompts, stopWords          []string // nargs='+': collected by splitNargs
	numTokensToGenerate         int
	numTokensFromFile           bool
	topN                        int
	perStep                     int
	perSec, duration            float64
	modelProvider               string
	outputPath                  string
	everyN                      int
	promptFile                  string
	promptFileTruncate          int
	noRecordThroughput          bool
	terminationID               int
	repeatN                     int
	maxSeqLen, maxRequests      int
	bufferGB                    float64
	blockSize                   int
	dynMaxRequests, dynMaxToken int
	prefixCaching               bool
	evictionPolicy              string
	logprobsMode                string
	loggingInterval             int
	legacyStatic                bool
	runSecs                     float64 // the last run's wall time (the static script's latency)
	coordinatorPolicy           string
}

// inferenceNargs are the arguments Megatron declares with nargs='+': every
// following word up to the next --flag is one value (a prompt, a stop word).
var inferenceNargs = []string{"prompts", "stop-words", "num-tokens-to-prompt"}

// inferenceDetails are inference arguments that pick a GPU kernel, a CUDA
// graph or an engine loop: the same tokens either way. Each is accepted
// with one line.
var inferenceDetails = map[string]string{
	"enable-cuda-graph":                                         "captures CUDA graphs of the decode steps",
	"cuda-graph-impl":                                           "picks Megatron's CUDA graph implementation",
	"decode-only-cuda-graphs":                                   "restricts CUDA graphs to decode steps",
	"inference-dynamic-batching-num-cuda-graphs":                "sizes Megatron's set of CUDA graphs",
	"inference-dynamic-batching-cuda-graph-sizing-distribution": "spaces the batch sizes of Megatron's CUDA graphs (exponential or linear)",
	"flash-decode":                                              "picks the flash-decoding attention kernel",
	"use-flashinfer-fused-rope":                                 "picks a FlashInfer RoPE kernel",
	"inference-dynamic-batching-sampling-backend":               "picks the sampling kernel (torch or FlashInfer); gotron's sampler follows Megatron's rules",
	"inference-dynamic-batching-unified-memory-level":           "places Megatron's KV buffer in CUDA unified memory",
	"inference-dynamic-batching-async-sched-mode":               "overlaps Megatron's scheduling of step N+1 with the GPU work of step N; gotron's engine schedules each step after the last, the same tokens",
	"inference-fuse-tp-communication":                           "fuses tensor-parallel communication kernels",
	"max-tokens-to-oom":                                         "caps the static engine's batch × length to avoid CUDA out-of-memory; gotron's KV pool is sized by --inference-dynamic-batching-buffer-size-gb and checked per request",
	"enable-chunked-prefill":                                    "lets Megatron's engine prefill a prompt over several steps; gotron's engine always prefills in chunks within --inference-dynamic-batching-max-tokens",
	"use-legacy-static-engine":                                  "runs Megatron's static-batching engine; gotron runs its one engine (the same tokens) and writes gpt_static_inference.py's JSON layout",
	"async-mode":                                                "runs offline_inference.py's asyncio engine loop; gotron's engine loop gives the same results",
	"throughput-check-only":                                     "skips Megatron's functional test's output comparison",
	"inference-dynamic-batching-prefix-caching-eviction-policy": "picks which cached prefix blocks Megatron drops first (ref_zero: when no request holds them; lru); gotron keeps freed blocks cached and reuses the least recently used, the same tokens, other hit counts",
	"attention-backend":                                         "picks a GPU attention kernel; the CPU runs its one fused attention kernel",
	"inference-rng-tracker":                                     "picks Megatron's CUDA RNG tracker for inference",
	"stream":                                                    "streams gpt_static_inference.py's results as they come; the results are the same",
	"sequence-parallel":                                         "shards the activations between the tensor-parallel regions along the sequence; gotron's decoding steps keep them whole on each tensor-parallel rank, the same tokens",
}

func defineInferenceArgs(fs *flag.FlagSet, a *inferenceArgs) {
	fs.Float64Var(&a.temperature, "temperature", 1.0, "sampling temperature (Megatron's default 1.0)")
	fs.IntVar(&a.topK, "top_k", 1, "top-k sampling; 1 is greedy (Megatron's default), 0 off")
	fs.Float64Var(&a.topP, "top_p", 0, "top-p (nucleus) sampling mass; 0 off")
	fs.BoolVar(&a.returnLogProbs, "return-log-probs", false, "write the prompt's and the generated tokens' log-probabilities (log-softmax of the raw logits)")
	fs.BoolVar(&a.skipPrompt, "skip-prompt-log-probs", false, "with --return-log-probs: no prompt log-probabilities")
	fs.String("prompts", "", "prompts, one word each (Megatron's nargs='+': quote each prompt)")
	fs.String("num-tokens-to-prompt", "", "the prompt lengths of Megatron's synthetic requests, which are not built in gotron inference: with --prompts or --prompt-file it has no effect, as in Megatron")
	fs.IntVar(&a.numTokensToGenerate, "num-tokens-to-generate", 30, "tokens to generate per prompt")
	fs.BoolVar(&a.numTokensFromFile, "num-tokens-from-file", false, "with --prompt-file: each line's chatgpt_output_token_length is its number of tokens to generate")
	fs.IntVar(&a.topN, "top-n-logprobs", 0, "also write the n most likely tokens of each generated position with their log-probabilities")
	fs.IntVar(&a.perStep, "incoming-requests-per-step", 0, "add this many requests before each engine step (Megatron's deterministic arrival)")
	fs.Float64Var(&a.perSec, "incoming-requests-per-sec", 100, "requests arrive at this Poisson rate (exponential gaps, seeded by --seed); -1 or 0: all at once")
	fs.Float64Var(&a.duration, "incoming-requests-duration", 10, "Megatron's synthetic-request duration (synthetic prompts are not built: unused with --prompts/--prompt-file)")
	fs.StringVar(&a.modelProvider, "model-provider", "gpt", "gpt (hybrid/mamba: not built in gotron)")
	fs.String("stop-words", "", "stop words, one word each (nargs='+'): generation ends when the generated tokens end with a stop word's tokens, which are dropped, as Megatron's engine")
	fs.StringVar(&a.outputPath, "output-path", "", "write the results as the Megatron script's JSON")
	fs.IntVar(&a.everyN, "output-every-n-results", 1, "write only every n-th request's result (and the last)")
	fs.Bool("output-request-events", false, "refused: Megatron's request event records are not built in gotron inference")
	fs.StringVar(&a.promptFile, "prompt-file", "", "JSONL file: each line's \"text\" is a prompt")
	fs.IntVar(&a.promptFileTruncate, "prompt-file-num-truncate", 0, "use the first N prompts of --prompt-file (0: all)")
	fs.BoolVar(&a.noRecordThroughput, "no-record-throughput", false, "leave the throughput list out of --output-path")
	fs.Bool("inference-ckpt-non-strict", false, "accepted: load the checkpoint with strict=False; gotron loads the model's tensors and reports unused ones by --dist-ckpt-strictness")
	fs.IntVar(&a.terminationID, "termination-id", math.MinInt, "token id that ends generation (default: the tokenizer's end of document; a negative id: none)")
	fs.String("suspend-resume-interval", "", "refused: Megatron's engine suspend/resume test is not built in gotron inference")
	fs.String("suspend-timeout", "", "refused: Megatron's engine suspend/resume test is not built in gotron inference")
	fs.IntVar(&a.repeatN, "inference-repeat-n", 1, "run all requests this many times (a fresh engine each time); the JSON has the last run's results and each run's throughput")
	fs.Bool("drain-between-batches", false, "refused: Megatron's batch-drain mode is not built in gotron inference")
	fs.String("batch-boundaries", "", "refused: Megatron's batch-drain mode is not built in gotron inference")
	fs.String("coordinator-schedule-output-path", "", "refused: needs Megatron's inference coordinator")
	fs.String("moe-routing-trace-max-inference-steps", "", "refused: MoE routing traces are not built in gotron")
	fs.Bool("use-coordinator", false, "route the requests through Megatron's inference coordinator: with gotron's one engine replica it routes every request to that engine (the same results); more replicas (a launcher's WORLD_SIZE > 1) are refused")
	fs.StringVar(&a.coordinatorPolicy, "inference-dynamic-batching-prefix-caching-coordinator-policy", "load_balanced", "with --use-coordinator: how the coordinator routes requests")
	fs.IntVar(&a.maxSeqLen, "inference-max-seq-length", 2560, "the longest prompt + generated tokens of a request (checked when given; the model's --max-position-embeddings bounds it always)")
	fs.IntVar(&a.maxRequests, "inference-max-requests", 8, "requests running at once with --use-legacy-static-engine (the static engine's batch)")
	fs.Float64Var(&a.bufferGB, "inference-dynamic-batching-buffer-size-gb", 40, "the KV cache's size in GiB, at most (gotron allocates no more than the running requests can use: --inference-dynamic-batching-max-requests × the model's context)")
	fs.IntVar(&a.blockSize, "inference-dynamic-batching-block-size", 256, "positions per KV block")
	fs.IntVar(&a.dynMaxRequests, "inference-dynamic-batching-max-requests", 0, "requests running at once (0: gotron's default, 256)")
	fs.IntVar(&a.dynMaxToken, "inference-dynamic-batching-max-tokens", 0, "tokens of one engine step, decode tokens and prefill chunks together (0: gotron's default, 512)")
	fs.BoolVar(&a.prefixCaching, "inference-dynamic-batching-prefix-caching", false, "reuse the KV blocks of prompt prefixes already computed")
	fs.Bool("no-inference-dynamic-batching-prefix-caching", false, "no prefix caching (the default)")
	fs.StringVar(&a.evictionPolicy, "inference-dynamic-batching-prefix-caching-eviction-policy", "ref_zero", "accepted, no effect: "+inferenceDetails["inference-dynamic-batching-prefix-caching-eviction-policy"])
	fs.StringVar(&a.logprobsMode, "inference-dynamic-batching-logprobs-mode", "raw_logprobs", "raw_logprobs: log-softmax of the raw logits (processed_logprobs: not built)")
	fs.IntVar(&a.loggingInterval, "inference-logging-step-interval", 0, "print the engine's state every N steps to stderr (0: never)")
	for name, why := range inferenceDetails {
		if fs.Lookup(name) != nil {
			continue
		}
		switch name {
		case "cuda-graph-impl", "inference-dynamic-batching-num-cuda-graphs", "inference-dynamic-batching-cuda-graph-sizing-distribution", "inference-dynamic-batching-unified-memory-level",
			"inference-dynamic-batching-sampling-backend", "inference-dynamic-batching-async-sched-mode", "max-tokens-to-oom", "attention-backend":
			fs.String(name, "", "accepted, no effect: it "+why)
		default:
			fs.Bool(name, false, "accepted, no effect: it "+why)
		}
	}
}

// splitNargs takes the values of Megatron's nargs='+' arguments out of
// args: "--prompts a b --x" gives prompts [a b]. The words are kept apart
// (a prompt may contain spaces), which the flag parser would not do.
func splitNargs(args []string) (rest []string, vals map[string][]string, err error) {
	vals = map[string][]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(rest, args[i:]...), vals, nil
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "--") || !contains(inferenceNargs, name) {
			rest = append(rest, a)
			continue
		}
		if _, dup := vals[name]; dup {
			return nil, nil, fmt.Errorf("--%s given twice", name)
		}
		var words []string
		if hasValue {
			words = append(words, value)
		}
		for i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			i++
			words = append(words, args[i])
		}
		if len(words) == 0 {
			return nil, nil, fmt.Errorf("--%s: expected at least one value (Megatron's nargs='+')", name)
		}
		vals[name] = words
		rest = append(rest, "--"+name+"=") // marks it given
	}
	return rest, vals, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// inferenceModelArgs are the model arguments Megatron's
// load_args_from_checkpoint takes from the checkpoint under
// --use-checkpoint-args, with the checkpoint's value each has in gotron's
// model config.
var inferenceModelArgs = []struct {
	name string
	get  func(c *gpt.Config) string
}{
	{"num-layers", func(c *gpt.Config) string { return strconv.Itoa(c.NumLayers) }},
	{"hidden-size", func(c *gpt.Config) string { return strconv.Itoa(c.HiddenSize) }},
	{"ffn-hidden-size", func(c *gpt.Config) string { return strconv.Itoa(c.FFNHiddenSize) }},
	{"num-attention-heads", func(c *gpt.Config) string { return strconv.Itoa(c.NumAttentionHeads) }},
	{"kv-channels", func(c *gpt.Config) string { return strconv.Itoa(c.KVChannels) }},
	{"num-query-groups", func(c *gpt.Config) string { return strconv.Itoa(c.NumQueryGroups) }},
	{"max-position-embeddings", func(c *gpt.Config) string { return strconv.Itoa(c.MaxPositionEmbeddings) }},
	// Megatron does not take MLA's from the checkpoint; a model built with
	// other ones would not load it: they must match
	{"multi-latent-attention", func(c *gpt.Config) string { return strconv.FormatBool(c.MLA.Enabled) }},
	{"q-lora-rank", func(c *gpt.Config) string { return strconv.Itoa(c.MLA.QLoraRank) }},
	{"kv-lora-rank", func(c *gpt.Config) string { return strconv.Itoa(c.MLA.KVLoraRank) }},
	{"qk-head-dim", func(c *gpt.Config) string { return strconv.Itoa(c.MLA.QKHeadDim) }},
	{"qk-pos-emb-head-dim", func(c *gpt.Config) string { return strconv.Itoa(c.MLA.QKPosEmbHeadDim) }},
	{"v-head-dim", func(c *gpt.Config) string { return strconv.Itoa(c.MLA.VHeadDim) }},
}

// inferenceUsed are gotron train's flags that gotron inference uses; every
// other training argument given is accepted and unused, as Megatron's
// inference scripts do (their parser is pretrain's).
var inferenceUsed = map[string]bool{
	"load": true, "cache-mla-latents": true, "use-checkpoint-args": true, "seed": true, "bf16": true, "device": true, "device-memory-fraction": true,
	"tokenizer-type": true, "vocab-file": true, "merge-file": true, "tokenizer-model": true, "vocab-size": true,
	"vocab-extra-ids": true, "tiktoken-pattern": true, "tiktoken-num-special-tokens": true,
	"tensor-model-parallel-size": true, "pipeline-model-parallel-size": true, "context-parallel-size": true,
	"expert-model-parallel-size": true, "expert-tensor-parallel-size": true, "dist-ckpt-strictness": true, "distributed-timeout-minutes": true,
}

// pipelineSplitFlags are training's pipeline-split flags beyond
// --pipeline-model-parallel-size, which decoding refuses.
var pipelineSplitFlags = []string{"num-virtual-stages-per-pipeline-rank", "virtual-pipeline-model-parallel-size", "num-layers-per-virtual-pipeline-stage",
	"decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers", "account-for-embedding-in-pipeline-split", "account-for-loss-in-pipeline-split"}

// inferenceRefusedNeeds are the features of Megatron's compatibility
// refusals that change what inference computes; the others (wandb,
// profilers, FSDP, ...) are training-only and unused here.
var inferenceRefusedNeeds = []string{needFP8}

func cmdInference(ctx context.Context, env *cli, args []string) error {
	a, f, given, err := parseInference(env, args)
	if err != nil {
		return err
	}
	return runMegatronInference(ctx, env, a, f, given, args)
}

// parseInference parses and checks gotron inference's arguments, printing
// one line for each accepted without an effect; it reads no file.
func parseInference(env *cli, args []string) (*inferenceArgs, *trainFlags, map[string]bool, error) {
	a := &inferenceArgs{}
	fs, f := newTrainFlagsWith("inference", func(fs *flag.FlagSet) { defineInferenceArgs(fs, a) })
	rest, nargs, err := splitNargs(args)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := parseFlagsHelp(fs, rest, env.stdout, helpText{synopsis: inferenceSynopsis,
		group: &helpGroup{title: "inference scripts (add_inference_args and the scripts' own)", has: isInferenceFlag}}); err != nil {
		return nil, nil, nil, err
	}
	if fs.NArg() > 0 {
		return nil, nil, nil, fmt.Errorf("unexpected argument %q: prompts are given with --prompts or --prompt-file", fs.Arg(0))
	}
	f.finish()
	a.prompts, a.stopWords = nargs["prompts"], nargs["stop-words"]
	a.legacyStatic = fs.Lookup("use-legacy-static-engine").Value.String() == "true"
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	lines, err := a.check(fs, given, f)
	if err != nil {
		return nil, nil, nil, err
	}
	// The ranks of one tensor-parallel group are one engine replica;
	// more ranks would be replicas, each running every request.
	world := 1
	if env.world != nil {
		world = env.world.Size()
	} else if env.getenv != nil && env.getenv("WORLD_SIZE") != "" {
		if n, err := strconv.Atoi(env.getenv("WORLD_SIZE")); err == nil {
			world = n
		}
	}
	l := f.decodeLayout()
	if mp, err := l.worldSize(); err != nil {
		return nil, nil, nil, err
	} else if world > 1 && world != mp {
		return nil, nil, nil, fmt.Errorf("a world of %d ranks with %s: needs data-parallel inference replicas (Megatron's coordinator over ZMQ), not built in gotron: launch the layout's %d ranks (%s)", world, l, mp, l.rankRule())
	}
	if fs.Lookup("use-coordinator").Value.String() == "true" {
		lines = append(lines, "--use-coordinator: one engine replica (this process): the coordinator's every request goes to it, the same results as Megatron's coordinator over one data-parallel rank")
	}
	for _, l := range lines {
		fmt.Fprintf(env.stderr, "gotron inference: %s\n", l)
	}
	return a, f, given, nil
}

// check refuses what gotron inference cannot do, naming the feature, and
// returns one line for each argument accepted without an effect.
func (a *inferenceArgs) check(fs *flag.FlagSet, given map[string]bool, f *trainFlags) ([]string, error) {
	var lines, unused []string
	names := make([]string, 0, len(given))
	for n := range given {
		names = append(names, n)
	}
	sort.Strings(names)
	if err := checked.Range("--tensor-model-parallel-size", int64(f.tpSize), 1, math.MaxInt32); err != nil {
		return nil, err
	}
	if err := checked.Range("--pipeline-model-parallel-size", int64(f.ppSize), 1, math.MaxInt32); err != nil {
		return nil, err
	}
	if math.IsNaN(f.timeoutMins) || f.timeoutMins < 0 || f.timeoutMins > 1e6 {
		return nil, fmt.Errorf("--distributed-timeout-minutes %g: want minutes >= 0 (0: 10 minutes, as Megatron)", f.timeoutMins)
	}
	if fl := fs.Lookup("context-parallel-size"); fl != nil && given["context-parallel-size"] && fl.Value.String() != "1" {
		return nil, fmt.Errorf("--context-parallel-size %s: needs context-parallel inference, not built in gotron (gotron inference splits the model over tensor-parallel ranks, pipeline stages and expert-parallel ranks)", fl.Value)
	}
	if err := f.decodeLayout().check(); err != nil {
		return nil, err
	}
	// Decoding splits the layers evenly over the stages, one chunk each.
	for _, name := range pipelineSplitFlags {
		if fl := fs.Lookup(name); fl != nil && given[name] && fl.Value.String() != "0" && fl.Value.String() != "false" {
			return nil, fmt.Errorf("--%s %s: needs an uneven or interleaved pipeline split at inference, not built in gotron (gotron inference splits --num-layers evenly over --pipeline-model-parallel-size stages, one model chunk each)", name, fl.Value)
		}
	}
	for _, name := range names {
		fl := fs.Lookup(name)
		v := fl.Value.String()
		atDefault := v == "false" || v == pythonDefault(megatronArgs()[name].def)
		switch {
		case name == "use-mup" && v != "false":
			return nil, fmt.Errorf("--use-mup: needs decoding with muP's attention scale, not built in gotron; gotron trains and scores muP models")
		case isInferenceFlag(name) && strings.HasPrefix(fl.Usage, "refused: ") && v != "false":
			return nil, fmt.Errorf("--%s: %s", name, strings.TrimPrefix(fl.Usage, "refused: "))
		case fp8FlagNames[name]: // decodeConfig below
		case strings.HasPrefix(fl.Usage, "refused: needs "):
			why := strings.TrimPrefix(fl.Usage, "refused: needs ")
			c, compat := lookupCompat(name)
			switch {
			case atDefault:
			case why == needFP8:
				return nil, fmt.Errorf("--%s: needs %s", name, why)
			case contains(inferenceRefusedNeeds, why):
				return nil, fmt.Errorf("--%s: needs %s", name, why)
			case compat && c.why == needInference:
				return nil, fmt.Errorf("--%s: needs Megatron's %s argument, not built in gotron inference", name, name)
			case compat && c.why == needCUDAGraph:
				lines = append(lines, fmt.Sprintf("--%s: no effect in gotron: CUDA graphs replay the same kernels", name))
				continue
			}
			unused = append(unused, "--"+name)
		case inferenceDetails[name] != "" && v != "false":
			lines = append(lines, fmt.Sprintf("--%s: no effect in gotron: it %s", name, inferenceDetails[name]))
		case name == "use-coordinator" || name == "no-inference-dynamic-batching-prefix-caching":
		case name == "inference-ckpt-non-strict":
			lines = append(lines, "--inference-ckpt-non-strict: accepted: gotron loads the model's tensors; checkpoint tensors it does not use are handled by --dist-ckpt-strictness")
		case name == "inference-dynamic-batching-prefix-caching-coordinator-policy":
			lines = append(lines, fmt.Sprintf("--%s %s: no effect in gotron: it picks the replica the coordinator routes a request to, and there is one", name, v))
		case name == "num-tokens-to-prompt" || name == "incoming-requests-duration":
			lines = append(lines, fmt.Sprintf("--%s: no effect with --prompts or --prompt-file: it sizes Megatron's synthetic requests, as in Megatron", name))
		case name == "inference-max-requests" && fs.Lookup("use-legacy-static-engine").Value.String() != "true":
			lines = append(lines, "--inference-max-requests: no effect without --use-legacy-static-engine: it is the static engine's batch (the dynamic engine's is --inference-dynamic-batching-max-requests), as in Megatron")
		case isInferenceFlag(name) || inferenceUsed[name]:
		default:
			unused = append(unused, "--"+name)
		}
	}
	if _, err := f.fp8.decodeConfig(given, math.MaxInt32, 1); err != nil {
		return nil, err // checked again with the checkpoint's layers
	}
	switch {
	case a.modelProvider != "gpt":
		return nil, fmt.Errorf("--model-provider %s: needs Mamba/hybrid models, not built in gotron", a.modelProvider)
	case a.logprobsMode != "raw_logprobs":
		return nil, fmt.Errorf("--inference-dynamic-batching-logprobs-mode %s: needs processed log-probabilities (after temperature and top-k/p), not built in gotron; raw_logprobs is", a.logprobsMode)
	case a.topK > 0 && a.topP > 0:
		return nil, fmt.Errorf("--top_k %d and --top_p %g: cannot both be greater than zero (Megatron's rule)", a.topK, a.topP)
	case len(a.prompts) > 0 && a.promptFile != "":
		return nil, errors.New("--prompts and --prompt-file: give one (Megatron's rule)")
	case len(a.prompts) == 0 && a.promptFile == "":
		return nil, errors.New("--prompts or --prompt-file is required (Megatron's synthetic prompts, --num-tokens-to-prompt, are not built in gotron inference)")
	case a.numTokensFromFile && a.promptFile == "":
		return nil, errors.New("--num-tokens-from-file needs --prompt-file")
	}
	for _, c := range []struct {
		name string
		v    int
		min  int64
	}{{"num-tokens-to-generate", a.numTokensToGenerate, 0}, {"top-n-logprobs", a.topN, 0}, {"incoming-requests-per-step", a.perStep, 1},
		{"output-every-n-results", a.everyN, 1}, {"prompt-file-num-truncate", a.promptFileTruncate, 1}, {"inference-repeat-n", a.repeatN, 1},
		{"inference-max-seq-length", a.maxSeqLen, 1}, {"inference-max-requests", a.maxRequests, 1}, {"inference-dynamic-batching-block-size", a.blockSize, 1},
		{"inference-dynamic-batching-max-requests", a.dynMaxRequests, 1}, {"inference-dynamic-batching-max-tokens", a.dynMaxToken, 1},
		{"inference-logging-step-interval", a.loggingInterval, 0}} {
		if given[c.name] {
			if err := checked.Range("--"+c.name, int64(c.v), c.min, math.MaxInt32); err != nil {
				return nil, err
			}
		}
	}
	if math.IsNaN(a.bufferGB) || a.bufferGB <= 0 || a.bufferGB > 1<<20 {
		return nil, fmt.Errorf("--inference-dynamic-batching-buffer-size-gb %g: want a size in GiB > 0", a.bufferGB)
	}
	if math.IsNaN(a.perSec) || math.IsInf(a.perSec, 0) {
		return nil, fmt.Errorf("--incoming-requests-per-sec %g: want a finite rate (-1: all at once)", a.perSec)
	}
	if !given["incoming-requests-per-step"] {
		a.perStep = 0
	}
	if len(unused) > 0 {
		lines = append(lines, fmt.Sprintf("training arguments accepted and unused, as Megatron's inference scripts do (their parser is pretrain's): %s", strings.Join(unused, " ")))
	}
	return lines, nil
}

// decodeLayout is the model-parallel layout of the flags.
func (f *trainFlags) decodeLayout() decodeLayout {
	return decodeLayout{tp: f.tpSize, pp: f.ppSize, ep: f.moe.ep, etp: f.moe.etp}
}

// isInferenceFlag reports whether name is one of defineInferenceArgs'.
func isInferenceFlag(name string) bool {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	defineInferenceArgs(fs, &inferenceArgs{})
	return fs.Lookup(name) != nil
}

// megRequest is one prompt's request and its result, as the script's
// Request object (examples/inference/utils.py).
type megRequest struct {
	prompt   string
	tokens   []int32
	maxNew   int
	arrival  float64 // seconds after the start; < 0: at once
	out      []int
	logprobs []float32
	top      [][]infer.TokenLogprob
	promptLP []float32
	// promptTop: the prompt's top-n (--top-n-logprobs without
	// --skip-prompt-log-probs), one entry per prompt token after the first.
	promptTop [][]infer.TokenLogprob
	start     time.Time
	ttft      float64
	latency   float64
	tpot      []float64
	last      time.Time
	done      bool
}

func runMegatronInference(ctx context.Context, env *cli, a *inferenceArgs, f *trainFlags, given map[string]bool, args []string) error {
	dev, err := parseDevice(f.device, f.memFraction)
	if err != nil {
		return err
	}
	if f.cfg.Load == "" {
		return errors.New("--load is required")
	}
	group, closeGroup, err := joinDecodeGroup(ctx, env, f.decodeLayout(), time.Duration(f.timeoutMins*float64(time.Minute)), args)
	if err != nil {
		return err
	}
	defer closeGroup()
	m, tokDir, err := loadForDecoding(f.cfg.Load, group)
	if err != nil {
		return err
	}
	// Model arguments: the checkpoint's under --use-checkpoint-args (as
	// Megatron's load_args_from_checkpoint), else they must match it
	// (Megatron would build that model and fail to load the checkpoint).
	var overridden []string
	for _, ma := range inferenceModelArgs {
		if !given[ma.name] {
			continue
		}
		v, want := ma.get(&m.Config), fsValue(f, ma.name)
		if v == want {
			continue
		}
		if !f.useCkptArgs {
			return fmt.Errorf("--%s %s: the checkpoint %s has %s (add --use-checkpoint-args to take the checkpoint's model arguments, as Megatron)", ma.name, want, f.cfg.Load, v)
		}
		overridden = append(overridden, fmt.Sprintf("--%s %s (checkpoint: %s)", ma.name, want, v))
	}
	if len(overridden) > 0 {
		fmt.Fprintf(env.stderr, "gotron inference: --use-checkpoint-args: the checkpoint's model arguments replace %s\n", strings.Join(overridden, ", "))
	}
	tc := f.data.tok
	if tc.Type == "" && tc.VocabFile != "" {
		tc.Type = tokenizer.TypeGPT2BPE // Megatron's GPT scripts give --vocab-file alone
	}
	tok, err := checkpointTokenizer(tc, tokDir, m.Config.VocabSize, f.cfg.Load, env.stderr)
	if err != nil {
		return err
	}
	if f.cfg.BF16 {
		m.RoundToBF16()
	}
	if err := m.Config.CheckDevice(dev); err != nil {
		return err
	}
	if err := m.Config.CheckDecode(); err != nil {
		return err
	}
	// before the split: the tensor-parallel slices and the pipeline
	// stages share the model's FP8 state
	if err := applyDecodeFP8(m, &f.fp8, given, f.cfg.BF16, f.ppSize, dev, env.getenv); err != nil {
		return err
	}
	dm, err := shardForDecoding(m, group)
	if err != nil {
		return err
	}
	m = dm.m
	if err := applyCacheMLALatents(m, f.mla.cacheLatents, f.cfg.Load); err != nil {
		return err
	}
	m.ToDevice(dev)
	leader := group.leader()

	// Only rank 0 reads the requests: the others get them from its
	// broadcasts, so no two ranks can run different prompts.
	var reqs []*megRequest
	if leader {
		if reqs, err = a.buildRequests(tok); err != nil {
			return err
		}
	}
	term := tok.EOD()
	if a.terminationID != math.MinInt {
		term = a.terminationID
	}
	var stopIDs [][]int
	for _, w := range a.stopWords {
		ids := tok.Encode(w)
		if len(ids) == 0 {
			return fmt.Errorf("--stop-words %q: encodes to no tokens", w)
		}
		stopIDs = append(stopIDs, ids)
	}
	ec := infer.EngineConfig{VocabSize: tok.VocabSize(), DisablePrefixCaching: !a.prefixCaching, BF16: f.cfg.BF16,
		BlockTokens: 16, MaxNumBatchedTokens: a.dynMaxToken, MaxNumSeqs: a.dynMaxRequests}
	if given["inference-dynamic-batching-block-size"] {
		ec.BlockTokens = a.blockSize
	}
	if a.legacyStatic {
		ec.MaxNumSeqs = a.maxRequests
	}
	seqs := ec.MaxNumSeqs
	if seqs == 0 {
		seqs = 256
	}
	// The pool is the smaller of the buffer and what the running requests
	// can use (float64: no integer overflow for any flag values).
	perToken := float64(m.KVBytesPerToken()) // this rank's layers and heads
	need := float64(seqs) * float64(m.Config.MaxPositionEmbeddings+ec.BlockTokens) * perToken
	need += float64(seqs) * float64(m.GDNStateBytes()) // gated delta net layers' states, out of the same budget
	ec.KVCacheBytes = int64(min(need, a.bufferGB*(1<<30)))
	for i, r := range reqs {
		n := len(r.tokens) + r.maxNew
		if given["inference-max-seq-length"] && n > a.maxSeqLen {
			return fmt.Errorf("request %d: %d prompt tokens + %d to generate exceed --inference-max-seq-length %d", i, len(r.tokens), r.maxNew, a.maxSeqLen)
		}
	}

	var throughputs []float64
	var stats infer.Stats
	var prefill int64
	var peak uint64
	for rep := 0; rep < a.repeatN; rep++ {
		eng, err := dm.newEngine(ctx, ec)
		if err != nil {
			return err
		}
		t0 := time.Now()
		var total int
		led, err := leadOrFollow(ctx, group, eng, func(eng decodeEngine) (err error) {
			total, err = a.runOnce(ctx, env, eng, reqs, term, stopIDs, f.cfg.Seed)
			return err
		})
		if err != nil {
			return err
		}
		if !led {
			continue
		}
		secs := time.Since(t0).Seconds()
		a.runSecs = secs
		throughputs = append(throughputs, float64(total)/max(secs, 1e-9))
		stats = eng.Stats()
		prefill += stats.PromptTokens - stats.PrefixCacheHitTokens
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapAlloc)
		fmt.Fprintf(env.stderr, "gotron inference: run %d/%d: %d requests, %d tokens generated in %.2f s (%.1f tokens/s), %d engine steps\n",
			rep+1, a.repeatN, len(reqs), total, secs, throughputs[rep], stats.Steps)
	}
	if !leader {
		fmt.Fprintf(env.stderr, "gotron inference: %s rank %d of %d: followed rank 0, which prints the results\n", group.kind(), group.world.Rank(), group.world.Size())
		return nil
	}
	for i, r := range reqs {
		text := tok.Decode(textIDs(r.out, term))
		fmt.Fprintf(env.stdout, "%d [%d prompt tokens, %d generated] %s\n", i, len(r.tokens), len(r.out), strings.ReplaceAll(r.prompt+text, "\n", `\n`))
	}
	if a.outputPath == "" {
		return nil
	}
	var doc pyObj
	for i, r := range reqs {
		if !a.legacyStatic && i%a.everyN != 0 && i != len(reqs)-1 {
			continue
		}
		doc = append(doc, pyField{strconv.Itoa(i), a.resultJSON(r, tok, term, stats)})
	}
	if !a.legacyStatic {
		if !a.noRecordThroughput {
			doc = append(doc, pyField{"throughput", floats(throughputs)})
		}
		doc = append(doc,
			pyField{"mem-max-allocated-bytes", int64(peak)},
			pyField{"lifetime_prefill_token_count", prefill},
			pyField{"async_sched_step_count", int64(0)},
			pyField{"async_sched_compaction_step_count", int64(0)})
	}
	indent := 1
	if a.legacyStatic {
		indent = -1 // gpt_static_inference.py: json.dump without indent
	}
	var b strings.Builder
	writePyJSON(&b, doc, indent, 0)
	if err := os.WriteFile(a.outputPath, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("--output-path: %w", err)
	}
	fmt.Fprintf(env.stderr, "gotron inference: saved results to %s\n", a.outputPath)
	return nil
}

func fsValue(f *trainFlags, name string) string {
	m := f.model
	switch name {
	case "num-layers":
		return strconv.Itoa(m.NumLayers)
	case "hidden-size":
		return strconv.Itoa(m.HiddenSize)
	case "ffn-hidden-size":
		return strconv.Itoa(m.FFNHiddenSize)
	case "num-attention-heads":
		return strconv.Itoa(m.NumAttentionHeads)
	case "kv-channels":
		return strconv.Itoa(m.KVChannels)
	case "num-query-groups":
		return strconv.Itoa(m.NumQueryGroups)
	case "max-position-embeddings":
		return strconv.Itoa(m.MaxPositionEmbeddings)
	case "multi-latent-attention":
		return strconv.FormatBool(f.mla.on)
	case "q-lora-rank":
		return strconv.Itoa(f.mla.qLoraRank)
	case "kv-lora-rank":
		return strconv.Itoa(f.mla.kvLoraRank)
	case "qk-head-dim":
		return strconv.Itoa(f.mla.qkHeadDim)
	case "qk-pos-emb-head-dim":
		return strconv.Itoa(f.mla.qkPosEmbHeadDim)
	case "v-head-dim":
		return strconv.Itoa(f.mla.vHeadDim)
	}
	return ""
}

// textIDs are the ids generated_text decodes: without the termination
// token (Megatron's detokenize_stop_sequence is False by default).
func textIDs(out []int, term int) []int {
	if n := len(out); n > 0 && out[n-1] == term {
		return out[:n-1]
	}
	return out
}

// buildRequests reads the prompts (build_requests in
// examples/inference/utils.py) and their arrival offsets.
func (a *inferenceArgs) buildRequests(tok tokenizer.Tokenizer) ([]*megRequest, error) {
	var reqs []*megRequest
	add := func(text string, maxNew int) {
		ids := tok.Encode(text)
		p := make([]int32, len(ids))
		for i, id := range ids {
			p[i] = int32(id)
		}
		reqs = append(reqs, &megRequest{prompt: text, tokens: p, maxNew: maxNew})
	}
	if len(a.prompts) > 0 {
		for _, p := range a.prompts {
			add(p, a.numTokensToGenerate)
		}
	} else {
		fh, err := os.Open(a.promptFile)
		if err != nil {
			return nil, fmt.Errorf("--prompt-file: %w", err)
		}
		defer fh.Close()
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 1<<28)
		line := 0
		for sc.Scan() {
			line++
			var rec struct {
				Text   *string `json:"text"`
				Tokens *int    `json:"chatgpt_output_token_length"`
			}
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				return nil, fmt.Errorf("--prompt-file %s:%d: %w", a.promptFile, line, err)
			}
			if rec.Text == nil {
				return nil, fmt.Errorf("--prompt-file %s:%d: no \"text\" field", a.promptFile, line)
			}
			n := a.numTokensToGenerate
			if a.numTokensFromFile {
				if rec.Tokens == nil || *rec.Tokens < 0 {
					return nil, fmt.Errorf("--prompt-file %s:%d: --num-tokens-from-file needs a chatgpt_output_token_length >= 0", a.promptFile, line)
				}
				n = *rec.Tokens
			}
			add(*rec.Text, n)
			if len(reqs) == a.promptFileTruncate {
				break
			}
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("--prompt-file %s: %w", a.promptFile, err)
		}
		if len(reqs) == 0 {
			return nil, fmt.Errorf("--prompt-file %s: no prompts", a.promptFile)
		}
	}
	for i, r := range reqs {
		if len(r.tokens) == 0 {
			return nil, fmt.Errorf("prompt %d: encodes to no tokens", i)
		}
		r.arrival = -1
	}
	return reqs, nil
}

// arrivals sets Megatron's time offsets (get_time_offsets): all at once
// with --incoming-requests-per-step or a rate <= 0, else a Poisson process
// of that rate (exponential gaps from --seed; Python's random stream is not
// reproduced, so the times differ from Megatron's, not the outputs).
func (a *inferenceArgs) arrivals(reqs []*megRequest, seed int64) {
	if a.perStep > 0 || a.perSec <= 0 {
		for _, r := range reqs {
			r.arrival = -1
		}
		return
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x6d656761))
	t := 0.0
	for i, r := range reqs {
		if i > 0 {
			t += rng.ExpFloat64() / a.perSec
		}
		r.arrival = t
	}
}

// runOnce is run_inference: requests are added by the arrival schedule,
// the engine steps until every request has finished; it returns the tokens
// generated.
func (a *inferenceArgs) runOnce(ctx context.Context, env *cli, eng decodeEngine, reqs []*megRequest, term int, stopIDs [][]int, seed int64) (int, error) {
	a.arrivals(reqs, seed)
	byID := map[infer.SeqID]*megRequest{}
	var stop []int
	if term >= 0 {
		stop = []int{term}
	}
	added, finished, total := 0, 0, 0
	start := time.Now()
	addOne := func() error {
		r := reqs[added]
		*r = megRequest{prompt: r.prompt, tokens: r.tokens, maxNew: r.maxNew, arrival: r.arrival}
		s := infer.Sampling{Temperature: a.temperature, TopK: a.topK, TopP: a.topP, Seed: uint64(seed) + uint64(added)}
		// The prompt's top-n come with its log-probabilities: Megatron
		// computes both unless --skip-prompt-log-probs.
		prompt := (a.returnLogProbs || a.topN > 0) && !a.skipPrompt && len(r.tokens) > 1
		req := infer.Request{Prompt: r.tokens, MaxTokens: r.maxNew, Sampling: s, StopTokens: stop,
			Logprobs: a.returnLogProbs, TopLogprobs: a.topN, PromptLogprobs: prompt, PromptTopLogprobs: prompt && a.topN > 0}
		if r.maxNew == 0 && !req.PromptLogprobs {
			r.done, r.start = true, time.Now()
			added++
			finished++
			return nil
		}
		id, err := eng.Add(req)
		if err != nil {
			return fmt.Errorf("request %d: %w", added, err)
		}
		r.start, r.last = time.Now(), time.Now()
		byID[id] = r
		added++
		return nil
	}
	for step := int64(0); finished < len(reqs); {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		switch {
		case a.perStep > 0:
			for n := 0; n < a.perStep && added < len(reqs); n++ {
				if err := addOne(); err != nil {
					return total, err
				}
			}
		default:
			now := time.Since(start).Seconds()
			for added < len(reqs) && reqs[added].arrival <= now {
				if err := addOne(); err != nil {
					return total, err
				}
			}
			if !eng.HasWork() && added < len(reqs) {
				time.Sleep(time.Duration((reqs[added].arrival - now) * float64(time.Second)))
				continue
			}
		}
		evs, err := eng.Step()
		if err != nil {
			return total, err
		}
		step++
		now := time.Now()
		for _, ev := range evs {
			r := byID[ev.Seq]
			if r == nil || r.done {
				continue
			}
			if ev.PromptLogprobs != nil {
				r.promptLP = append([]float32(nil), ev.PromptLogprobs...)
				r.promptTop = ev.PromptTopLogprobs
			}
			if ev.Token >= 0 {
				if len(r.out) == 0 {
					r.ttft = now.Sub(r.start).Seconds()
				}
				r.tpot = append(r.tpot, now.Sub(r.last).Seconds())
				r.last = now
				r.out = append(r.out, ev.Token)
				r.logprobs = append(r.logprobs, ev.Logprob)
				if a.topN > 0 {
					r.top = append(r.top, ev.TopLogprobs)
				}
				total++
				if ev.Finish == "" {
					if n := stopWordEnd(r.out, stopIDs); n > 0 {
						// Megatron's _check_stop_words_for_request_post_append:
						// the stop word's tokens are dropped, with their
						// log-probabilities.
						r.out, r.logprobs = r.out[:len(r.out)-n], r.logprobs[:len(r.logprobs)-n]
						if a.topN > 0 {
							r.top = r.top[:len(r.top)-n]
						}
						eng.Cancel(ev.Seq)
						ev.Finish = infer.FinishStop
					}
				}
			}
			if ev.Finish != "" {
				if ev.Finish == infer.FinishAbort {
					return total, fmt.Errorf("request %d: aborted by the engine", indexOf(reqs, r))
				}
				r.done, r.latency = true, now.Sub(r.start).Seconds()
				finished++
			}
		}
		if a.loggingInterval > 0 && step%int64(a.loggingInterval) == 0 {
			st := eng.Stats()
			fmt.Fprintf(env.stderr, "gotron inference: step %d: %d running, %d waiting, %d finished of %d, KV blocks %d/%d used (%d cached)\n",
				step, st.Running, st.Waiting, finished, len(reqs), st.KVBlocksUsed, st.KVBlocksTotal, st.KVBlocksCached)
		}
	}
	return total, nil
}

func indexOf(reqs []*megRequest, r *megRequest) int {
	for i, x := range reqs {
		if x == r {
			return i
		}
	}
	return -1
}

// stopWordEnd returns the length of the stop word the generated tokens end
// with, or 0.
func stopWordEnd(out []int, stopIDs [][]int) int {
	for _, w := range stopIDs {
		if len(out) >= len(w) {
			match := true
			for i, id := range w {
				if out[len(out)-len(w)+i] != id {
					match = false
					break
				}
			}
			if match {
				return len(w)
			}
		}
	}
	return 0
}

// resultJSON is one request's entry in the script's output JSON.
func (a *inferenceArgs) resultJSON(r *megRequest, tok tokenizer.Tokenizer, term int, st infer.Stats) pyObj {
	gen := make([]any, len(r.out))
	for i, id := range r.out {
		gen[i] = int64(id)
	}
	text := tok.Decode(textIDs(r.out, term))
	// Megatron's top-n: one {token text: logprob} dict per position.
	topDicts := func(steps [][]infer.TokenLogprob) []any {
		list := make([]any, len(steps))
		for i, step := range steps {
			var o pyObj
			for _, t := range step {
				o = o.set(tok.Decode([]int{t.Token}), float64(t.Logprob))
			}
			list[i] = o
		}
		return list
	}
	var top, promptTop any
	if a.topN > 0 {
		top = topDicts(r.top)
		if r.promptTop != nil {
			promptTop = topDicts(r.promptTop)
		}
	}
	prompt := []float32{}
	if r.promptLP != nil {
		prompt = r.promptLP
	}
	if a.legacyStatic {
		// gpt_static_inference.py
		o := pyObj{{"input_prompt", r.prompt}, {"generated_text", text}, {"generated_tokens", gen},
			{"tpot", floats(r.tpot)}, {"latency", a.runSecs}} // the script's latency: the whole generate call
		if a.topN > 0 {
			o = append(o, pyField{"generated_top_n_logprobs", top})
		}
		if a.returnLogProbs {
			o = append(o, pyField{"logprobs", float32s(append(append([]float32{}, prompt...), r.logprobs...))})
		}
		return o
	}
	// gpt_dynamic_inference.py (offline_inference.py writes the same keys).
	o := pyObj{{"input_prompt", r.prompt}, {"generated_text", text}, {"generated_tokens", gen},
		{"latency", r.latency}, {"ttft", r.ttft}, {"cuda_graph_request_count_map", nil},
		{"step_count", st.Steps}, {"top_n_logprobs", top}, {"prompt_top_n_logprobs", promptTop}}
	if a.returnLogProbs {
		o = append(o, pyField{"prompt_logprobs", float32s(prompt)}, pyField{"generated_logprobs", float32s(r.logprobs)},
			pyField{"logprobs", float32s(append(append([]float32{}, prompt...), r.logprobs...))})
	}
	return o
}

func floats(v []float64) []any {
	out := make([]any, len(v))
	for i, x := range v {
		out[i] = x
	}
	return out
}

func float32s(v []float32) []any {
	out := make([]any, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// pyObj is a JSON object with Python's dict order (insertion order).
type pyObj []pyField

type pyField struct {
	key string
	val any
}

// set assigns key as a Python dict does: an existing key keeps its place.
func (o pyObj) set(key string, v any) pyObj {
	for i := range o {
		if o[i].key == key {
			o[i].val = v
			return o
		}
	}
	return append(o, pyField{key, v})
}

// writePyJSON writes v as Python's json.dump does: indent < 0 is the
// compact form with ", " and ": " separators, else each member on its own
// line indented by indent spaces per level; non-ASCII characters escaped
// (ensure_ascii); floats as Python's repr; NaN and infinities as Python's
// NaN, Infinity, -Infinity.
func writePyJSON(b *strings.Builder, v any, indent, level int) {
	nl := func(l int) {
		if indent >= 0 {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(" ", indent*l))
		}
	}
	sep := ", "
	if indent >= 0 {
		sep = ","
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		b.WriteString(pyjson.Float(x))
	case string:
		pyjson.WriteString(b, x)
	case []any:
		if len(x) == 0 {
			b.WriteString("[]")
			return
		}
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(sep)
			}
			nl(level + 1)
			writePyJSON(b, e, indent, level+1)
		}
		nl(level)
		b.WriteByte(']')
	case pyObj:
		if len(x) == 0 {
			b.WriteString("{}")
			return
		}
		b.WriteByte('{')
		for i, f := range x {
			if i > 0 {
				b.WriteString(sep)
			}
			nl(level + 1)
			pyjson.WriteString(b, f.key)
			b.WriteString(": ")
			writePyJSON(b, f.val, indent, level+1)
		}
		nl(level)
		b.WriteByte('}')
	default:
		panic(fmt.Sprintf("writePyJSON: %T", v)) // a programming error: every caller passes the types above
	}
}
