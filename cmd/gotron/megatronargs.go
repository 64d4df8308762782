package main

import (
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync"

	"github.com/gotron/gotron/model/gpt"
)

// megatronArgumentsTSV is Megatron-LM's list of training arguments as its
// own argparse parser builds it (megatron/training/arguments.py at
// d98e8a6), written by tools/megatroncompat/extract_args.py: group, option
// strings, dest, type, default, nargs, choices.
//
//go:embed megatron_arguments.tsv
var megatronArgumentsTSV string

// megatronArg is one of Megatron-LM's training arguments.
type megatronArg struct {
	group string // argparse group title ("network size", "checkpointing", ...)
	name  string // first option string without the dashes
	typ   string // argparse type (int, float, str, bool for store_true/false)
	def   string // default, as Python's repr
	nargs string // argparse nargs ("", "*", "+", ...)
}

// megatronTable is Megatron's arguments by every option string (without
// dashes) and its groups in the order arguments.py adds them.
type megatronTable struct {
	byName map[string]megatronArg
	groups []string
	count  int // arguments (an argument with two option strings counts once)
}

var loadMegatronTable = sync.OnceValue(func() megatronTable {
	t := megatronTable{byName: map[string]megatronArg{}}
	seen := map[string]bool{}
	for i, line := range strings.Split(strings.TrimSpace(megatronArgumentsTSV), "\n") {
		cells := strings.Split(line, "\t")
		if i == 0 || len(cells) < 5 {
			continue // header
		}
		opts := strings.Split(cells[1], ",")
		a := megatronArg{group: cells[0], name: strings.TrimLeft(opts[0], "-"), typ: cells[3], def: cells[4]}
		if len(cells) > 5 {
			a.nargs = cells[5]
		}
		for _, o := range opts {
			t.byName[strings.TrimLeft(o, "-")] = a
		}
		t.count++
		if !seen[a.group] {
			seen[a.group] = true
			t.groups = append(t.groups, a.group)
		}
	}
	return t
})

// megatronArgs returns Megatron-LM's training arguments by option name
// (without dashes).
func megatronArgs() map[string]megatronArg { return loadMegatronTable().byName }

// megatronGroupOrder returns Megatron's argument groups in arguments.py's order.
func megatronGroupOrder() []string { return loadMegatronTable().groups }

// megatronOnlyFlag explains a flag that a gotron command does not define but
// Megatron-LM does; "" if Megatron does not have it either.
func megatronOnlyFlag(command, name string) string {
	a, ok := megatronArgs()[name]
	if !ok {
		return ""
	}
	return fmt.Sprintf("--%s is a Megatron-LM argument (group %q) that gotron %s does not take", name, a.group, command)
}

// compatKind is what gotron train does with a Megatron-LM argument it takes
// only so that Megatron's launch scripts and configs run unchanged.
type compatKind int

const (
	// compatSame: gotron already does what the argument asks; one line
	// says so.
	compatSame compatKind = iota
	// compatDetail: the argument picks a GPU, Python or I/O implementation
	// detail with no meaning in gotron (same numbers either way); one line
	// says so.
	compatDetail
	// compatNeeds: the argument asks for a feature gotron does not have;
	// it is refused, naming the feature (a value equal to Megatron's
	// default asks for nothing and is accepted).
	compatNeeds
)

// compatArg is gotron's answer to one Megatron argument.
type compatArg struct {
	kind compatKind
	why  string
	// refuse maps values of a value argument that need a feature gotron
	// does not have to that feature (e.g. --rerun-mode validate_results).
	refuse map[string]string
}

// Features not built in gotron, as refusals name them.
const (
	needFP8       = "a Transformer Engine FP8 feature not built in gotron (gotron builds --fp8-format e4m3/hybrid with --fp8-recipe tensorwise or delayed)"
	needFSDP      = "this part of Megatron-FSDP, not built in gotron (--use-megatron-fsdp with --data-parallel-sharding-strategy is)"
	needRL        = "this part of Megatron's RL step, not built in gotron (--perform-rl-step's GRPO is, data- and tensor-parallel: docs/training.md)"
	needRLAsync   = "Megatron's asynchronous rollout pipeline (--rl-partial-rollouts: rollouts generated across weight updates, with --rl-generation-lag and the --rl-submission/--rl-consumption-granularity), not built in gotron: gotron generates each collection to the end on the current weights"
	needRLLayout  = "a separate inference layout with pipeline or expert parallelism for the RL step's rollouts (Megatron's --rl-inference-pipeline/expert-*-model-parallel-size, with a weight refit between the layouts), not built in gotron: --rl-inference-tensor-model-parallel-size is, from a training layout without tensor parallelism"
	needInference = "Megatron's inference scripts: run this argument list with gotron inference, not gotron train"
	needExport    = "ModelOpt export and distillation, not built in gotron"
	needWandB     = "Weights & Biases logging, which cannot be reached from here; use --tensorboard-dir"
	needProfile   = "the PyTorch profiler; gotron's --profile writes a Go CPU profile of the same iterations"
	needCUDAGraph = "CUDA graphs, not built in gotron"
	needNotBuilt  = "a Megatron feature not built in gotron yet"
)

// compatArgs are the Megatron arguments used by Megatron's GPT example
// scripts and GPT functional-test configs (cmd/gotron/testdata/megatron)
// that gotron train takes without a flag of its own. A flag gotron defines
// itself (in newTrainFlags, addMoEFlags, ...) is not looked up here.
var compatArgs = map[string]compatArg{
	// Deprecated, and passed by examples/mixtral: with rope Megatron core
	// ignores it; without rope Megatron refuses it (checked in modelConfig).
	"no-position-embedding": {kind: compatSame, why: "with --position-embedding-type rope there is no position table to drop, as in Megatron core (which refuses the flag otherwise)"},
	// Kernel, fusion and memory choices of the GPU build.
	"transformer-impl":                       {kind: compatDetail, why: "picks Megatron's layer implementation (Transformer Engine or local PyTorch); gotron has one"},
	"use-persistent-ckpt-worker":             {kind: compatDetail, why: "keeps Megatron's async checkpoint process alive; gotron's --async-save writes from a goroutine"},
	"attention-softmax-in-fp32":              {kind: compatSame, why: "gotron computes attention scores and softmax in float32 always"},
	"apply-query-key-layer-scaling":          {kind: compatSame, why: "divides QK^T by the layer number and multiplies it back inside an fp32 softmax, which changes fp16 rounding only; gotron's attention scores and softmax are float32, so the numbers are the same"},
	"no-create-attention-mask-in-dataloader": {kind: compatSame, why: "gotron's attention applies the causal mask inside its kernel; no mask tensor is built for plain causal batches"},
	"no-mmap-bin-files":                      {kind: compatDetail, why: "picks how Megatron reads .bin files; gotron maps them, the tokens are the same"},
	"manual-gc":                              {kind: compatDetail, why: "controls Python's garbage collector"},
	"manual-gc-interval":                     {kind: compatDetail, why: "controls Python's garbage collector"},
	"empty-unused-memory-level":              {kind: compatDetail, why: "empties PyTorch's CUDA caching allocator"},
	"cross-entropy-loss-fusion":              {kind: compatDetail, why: "picks a fused CUDA cross-entropy kernel"},
	"cross-entropy-fusion-impl":              {kind: compatDetail, why: "picks a fused CUDA cross-entropy kernel"},
	"use-flashinfer-fused-rope":              {kind: compatDetail, why: "picks a FlashInfer RoPE kernel"},
	"tp-comm-overlap-cfg":                    {kind: compatDetail, why: "configures Transformer Engine's tensor-parallel communication overlap"},
	"tp-comm-overlap":                        {kind: compatDetail, why: "overlaps Transformer Engine's tensor-parallel GEMMs with NCCL userbuffers"},
	"wgrad-deferral-limit":                   {kind: compatDetail, why: "defers weight-gradient GEMMs to overlap pipeline communication on GPUs"},
	"defer-embedding-wgrad-compute":          {kind: compatDetail, why: "defers the embedding weight-gradient GEMM to overlap pipeline communication on GPUs"},
	"overlap-p2p-communication-warmup-flush": {kind: compatDetail, why: "overlaps pipeline sends with compute in the warm-up and flush on GPUs"},
	"disable-gloo-process-groups":            {kind: compatDetail, why: "skips creating PyTorch's gloo side groups"},
	"te-rng-tracker":                         {kind: compatDetail, why: "picks Transformer Engine's CUDA RNG tracker"},
	"inference-rng-tracker":                  {kind: compatDetail, why: "picks Megatron's CUDA RNG tracker for inference"},
	"async-strategy":                         {kind: compatDetail, why: "picks Megatron's async checkpoint writer; gotron's --async-save has one"},
	"async-ckpt-use-cpu-shm":                 {kind: compatDetail, why: "stages Megatron's async checkpoint in shared memory; gotron copies the shards in its own process"},
	// Megatron starts the first model chunk's parameter all-gather inside
	// the optimizer step (a separate optimizer for that chunk, whose
	// per-element Adam update and the joint grad norm are the same):
	// a schedule, checked against Megatron's preconditions in megatronCompat.
	"overlap-param-gather-with-optimizer-step": {kind: compatSame, why: "starts the first model chunk's parameter all-gather right after the optimizer step; gotron's --overlap-param-gather starts every bucket's all-gather right after the optimizer step already (the same numbers: only when the gather runs changes)"},
	"deterministic-mode":                       {kind: compatSame, why: "gotron's CPU kernels are deterministic already: a fixed reduction order and no atomics give the same numbers run to run"},
	// Checkpoint options whose meaning gotron's format already has.
	"ckpt-fully-parallel-save":                    {kind: compatSame, why: "every rank writes its own shards in gotron's format"},
	"ckpt-fully-parallel-load":                    {kind: compatSame, why: "every rank reads only the shards it needs in gotron's format"},
	"no-ckpt-fully-parallel-save":                 {kind: compatDetail, why: "picks Megatron's save strategy; every rank writes its own shards in gotron's format"},
	"ckpt-assume-constant-structure":              {kind: compatDetail, why: "caches Megatron's save plan between saves"},
	"dist-ckpt-optim-fully-reshardable":           {kind: compatSame, why: "gotron's checkpoints, optimizer state included, load at any parallel layout"},
	"auto-detect-ckpt-format":                     {kind: compatSame, why: "gotron train loads the format --ckpt-format names: gotron's sharded one, or Megatron's legacy torch files with --ckpt-format torch; --load pointed at the other says which flag loads it"},
	"no-use-tokenizer-model-from-checkpoint-args": {kind: compatSame, why: "gotron train takes the tokenizer from its flags, not from the checkpoint"},
	// Megatron's validate_args: "Legacy RoPE arguments": it sets
	// position_embedding_type = 'rope'; gotron takes it beside
	// --position-embedding-type rope (megatronCompat) and refuses it
	// otherwise.
	"use-rotary-position-embeddings": {kind: compatNeeds, why: needNotBuilt + " (the deprecated spelling: use --position-embedding-type rope)"},
	// Features gotron does not have.
	// Megatron configures its StragglerDetector only with --log-straggler
	// (training.py); the count alone changes nothing.
	"log-straggler":          {kind: compatNeeds, why: "Megatron's straggler detector (per-rank step times and throughput with the slowest and fastest ranks), not built in gotron"},
	"straggler-minmax-count": {kind: compatSame, why: "how many slowest and fastest ranks Megatron's straggler detector lists; the detector runs only with --log-straggler (not built in gotron), so without it the count does nothing, as in Megatron"},
	"enable-cuda-graph":      {kind: compatNeeds, why: needCUDAGraph},
	"cuda-graph-impl":        {kind: compatNeeds, why: needCUDAGraph},
	"use-pytorch-profiler":   {kind: compatNeeds, why: needProfile},
	"wandb-save-dir":         {kind: compatNeeds, why: needWandB},
	"wandb-exp-name":         {kind: compatNeeds, why: needWandB},
	"wandb-entity":           {kind: compatNeeds, why: needWandB},
	"mup-width-mult":         {kind: compatDetail, why: "is recomputed by Megatron as --hidden-size / --mup-base-hidden-size under --use-mup and read nowhere else; gotron computes it the same way"},
	"export-te-mcore-model":  {kind: compatNeeds, why: needExport},
	"export-kd-teacher-load": {kind: compatNeeds, why: needExport},
	"export-kd-cfg":          {kind: compatNeeds, why: needExport},
	// The RL step's features gotron does not have, named more precisely
	// than the rl- family's needRL.
	"rl-partial-rollouts":                            {kind: compatNeeds, why: needRLAsync},
	"rl-generation-lag":                              {kind: compatNeeds, why: needRLAsync},
	"rl-max-inflight-requests":                       {kind: compatNeeds, why: needRLAsync},
	"rl-submission-granularity":                      {kind: compatNeeds, why: needRLAsync},
	"rl-consumption-granularity":                     {kind: compatNeeds, why: needRLAsync},
	"rl-inference-pipeline-model-parallel-size":      {kind: compatNeeds, why: needRLLayout},
	"rl-inference-expert-model-parallel-size":        {kind: compatNeeds, why: needRLLayout},
	"rl-inference-expert-tensor-model-parallel-size": {kind: compatNeeds, why: needRLLayout},
}

// compatSwitches are the switches of compatArgs that Megatron's training
// argument table does not list (ModelOpt's arguments) or lists with a
// string type (a BooleanOptionalAction without type=bool: it takes no
// value).
var compatSwitches = map[string]bool{"export-te-mcore-model": true, "rl-partial-rollouts": true,
	"rl-offload-inference-model-weights-when-idle": true, "rl-verify-model-weights-swap": true}

// compatPrefixes give the feature for whole families of Megatron arguments.
var compatPrefixes = []struct{ prefix, why string }{
	{"inference-", needInference}, {"rl-", needRL}, {"grpo-", needRL}, {"fp8-", needFP8}, {"megatron-fsdp-", needFSDP},
}

// compatInferenceArgs are the arguments of Megatron's inference scripts
// (examples/inference, tools/run_text_generation_server.py) that its GPT
// inference configs pass.
var compatInferenceArgs = []string{"prompts", "prompt-file", "prompt-file-num-truncate", "num-tokens-to-generate", "temperature",
	"top_k", "top_p", "top-n-logprobs", "return-log-probs", "output-path", "output-every-n-results", "max-tokens-to-oom",
	"incoming-requests-per-sec", "incoming-requests-per-step", "termination-id", "stop-words", "use-coordinator",
	"use-legacy-static-engine", "enable-chunked-prefill", "flash-decode", "decode-only-cuda-graphs", "async-mode"}

// compatRLArgs are the arguments of Megatron's RL configs gotron does not
// define (rlflags.go defines --perform-rl-step and those it runs).
var compatRLArgs = []string{}

// lookupCompat returns gotron's answer to Megatron argument name.
func lookupCompat(name string) (compatArg, bool) {
	if a, ok := compatArgs[name]; ok {
		return a, true
	}
	for _, n := range compatInferenceArgs {
		if n == name {
			return compatArg{kind: compatNeeds, why: needInference}, true
		}
	}
	for _, n := range compatRLArgs {
		if n == name {
			return compatArg{kind: compatNeeds, why: needRL}, true
		}
	}
	for _, p := range compatPrefixes {
		if strings.HasPrefix(name, p.prefix) {
			if _, megatron := megatronArgs()[name]; megatron {
				return compatArg{kind: compatNeeds, why: p.why}, true
			}
		}
	}
	return compatArg{}, false
}

// addCompatFlags defines on fs every Megatron argument of compatArgs and the
// families of lookupCompat that fs does not define itself: a boolean where
// Megatron's argument is a switch, else a string. Only names Megatron's
// argument table has are defined. It returns the names it defined.
func addCompatFlags(fs *flag.FlagSet) map[string]bool {
	defined := map[string]bool{}
	names := make([]string, 0, len(megatronArgs()))
	for name := range megatronArgs() {
		names = append(names, name)
	}
	for name := range compatArgs {
		if _, ok := megatronArgs()[name]; !ok {
			names = append(names, name) // an argument of another Megatron entry point (ModelOpt's)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		if fs.Lookup(name) != nil {
			continue
		}
		c, ok := lookupCompat(name)
		if !ok {
			continue
		}
		usage := "Megatron compatibility: " + c.why
		switch c.kind {
		case compatNeeds:
			usage = "refused: needs " + c.why
		case compatDetail:
			usage = "accepted, no effect: " + c.why
		case compatSame:
			usage = "accepted: " + c.why
		}
		if megatronArgs()[name].typ == "bool" || compatSwitches[name] {
			fs.Bool(name, false, usage)
		} else {
			fs.String(name, "", usage)
		}
		defined[name] = true
	}
	return defined
}

// checkCompatFlags returns one line for each compatibility argument given
// (of those addCompatFlags defined) that gotron accepts, or an error naming
// the feature a given argument needs.
func checkCompatFlags(fs *flag.FlagSet, given, defined map[string]bool) ([]string, error) {
	var lines []string
	var names []string
	for name := range given {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		c, ok := lookupCompat(name)
		if !ok || !defined[name] {
			continue
		}
		v := fs.Lookup(name).Value.String()
		isBool := megatronArgs()[name].typ == "bool" || compatSwitches[name]
		shown := "--" + name
		if !isBool {
			shown += " " + v
		}
		if isBool && v == "false" {
			continue // --flag=false asks for nothing
		}
		if why, refused := c.refuse[v]; refused {
			return nil, fmt.Errorf("%s: needs %s", shown, why)
		}
		switch c.kind {
		case compatNeeds:
			if !isBool && v == pythonDefault(megatronArgs()[name].def) {
				lines = append(lines, fmt.Sprintf("%s: Megatron's default, nothing to do", shown))
				continue
			}
			return nil, fmt.Errorf("%s: needs %s", shown, c.why)
		case compatDetail:
			lines = append(lines, fmt.Sprintf("%s: no effect in gotron: it %s", shown, c.why))
		case compatSame:
			lines = append(lines, fmt.Sprintf("%s: accepted: %s", shown, c.why))
		}
	}
	return lines, nil
}

// compatBool is the value of compatibility switch name.
func (f *trainFlags) compatBool(fs *flag.FlagSet, name string) bool {
	fl := fs.Lookup(name)
	return fl != nil && fl.Value.String() == "true"
}

// pythonDefault turns a default as Python's repr writes it ('x', 1, None)
// into the text a flag would carry.
func pythonDefault(repr string) string {
	return strings.Trim(repr, "'")
}

// megatronCompat applies the compatibility arguments and Megatron's rules
// for combinations gotron would otherwise refuse, printing one line for each
// to stderr.
func (f *trainFlags) megatronCompat(env *cli, fs *flag.FlagSet, given map[string]bool) error {
	// The RL step takes the arguments of its rollout engine.
	lines, compatGiven, err := f.rl.engineArgs(fs, given)
	if err != nil {
		return err
	}
	if compatGiven["use-rotary-position-embeddings"] && f.compatBool(fs, "use-rotary-position-embeddings") && f.model.PositionEmbeddingType == gpt.RoPE {
		compatGiven = maps.Clone(compatGiven) // not the caller's
		delete(compatGiven, "use-rotary-position-embeddings")
		lines = append(lines, "--use-rotary-position-embeddings: accepted: Megatron's deprecated spelling of --position-embedding-type rope, which this run gives")
	}
	more, err := checkCompatFlags(fs, compatGiven, f.compat)
	if err != nil {
		return err
	}
	lines = append(lines, more...)
	if f.cfg.LogNumZerosInGrad && f.device != "cpu" {
		return fmt.Errorf("--log-num-zeros-in-grad: counts the gradients on the host: --device cpu only, not --device %s", f.device)
	}
	if given["no-weight-decay-cond-type"] {
		// Megatron's validate_args: deprecated, mapped onto the flag
		if f.noWDCond != "apply_wd_to_qk_layernorm" {
			return fmt.Errorf("--no-weight-decay-cond-type %q: want apply_wd_to_qk_layernorm (Megatron's only choice; deprecated: use --apply-wd-to-qk-layernorm)", f.noWDCond)
		}
		f.cfg.ApplyWDToQKLayerNorm = true
		lines = append(lines, "--no-weight-decay-cond-type apply_wd_to_qk_layernorm: Megatron's deprecated spelling of --apply-wd-to-qk-layernorm, which it sets")
	}
	switch mlaQNorm := f.mla.on && f.mla.qLoraRank > 0; { // MLA's latent norms exist with --qk-layernorm only
	case f.cfg.ApplyWDToQKLayerNorm && mlaQNorm && f.model.QKLayerNorm:
		// Megatron's predicate is the name: MLA's q_layernorm matches it (its kv_layernorm does not)
		lines = append(lines, "--apply-wd-to-qk-layernorm: decays multi-latent attention's q_layernorm (not its kv_layernorm), as Megatron's name rule does")
	case f.cfg.ApplyWDToQKLayerNorm && !f.model.QKLayerNorm:
		lines = append(lines, "--apply-wd-to-qk-layernorm: no effect without --qk-layernorm (there are no query/key layer norms to decay), as in Megatron")
	}
	if given["overlap-param-gather-with-optimizer-step"] && f.compatBool(fs, "overlap-param-gather-with-optimizer-step") {
		// Megatron's validate_args
		split := f.cfg.Pipeline
		split.PP = f.ppSize
		vpp, err := split.Chunks(f.model.NumLayers)
		switch {
		case !f.cfg.DDP.DistributedOptimizer:
			return errors.New("--overlap-param-gather-with-optimizer-step needs --use-distributed-optimizer (as Megatron)")
		case !f.cfg.DDP.OverlapParamGather:
			return errors.New("--overlap-param-gather-with-optimizer-step needs --overlap-param-gather (as Megatron)")
		case err == nil && vpp <= 1:
			return errors.New("--overlap-param-gather-with-optimizer-step needs the interleaved pipeline schedule (--num-virtual-stages-per-pipeline-rank or --num-layers-per-virtual-pipeline-stage giving more than one chunk), as Megatron")
		}
	}
	if given["deterministic-mode"] && f.device != "cpu" {
		return fmt.Errorf("--deterministic-mode: checked on --device cpu only (gotron's CPU kernels give the same numbers run to run); --device %s is not checked", f.device)
	}
	// Megatron's GPU configs pass --distributed-backend nccl; on the CPU
	// the collectives are gotron's tcp process group (Megatron's gloo),
	// as under launch --inproc they are goroutines.
	if f.distBackend == "nccl" && !strings.HasPrefix(f.device, "cuda") {
		f.distBackend = "tcp"
		lines = append(lines, fmt.Sprintf("--distributed-backend nccl: NCCL moves GPU memory, and this run is on --device %s: the collectives run over gotron's CPU process group (tcp between processes, as Megatron's gloo)", f.device))
	}
	// Megatron (validate_args): sequence parallelism needs tensor
	// parallelism; with TP=1 it warns and switches it off.
	if f.cfg.SequenceParallel && f.tpSize == 1 {
		f.cfg.SequenceParallel = false
		lines = append(lines, "--sequence-parallel: disabled, as Megatron does, because --tensor-model-parallel-size is 1")
	}
	for _, l := range lines {
		fmt.Fprintf(env.stderr, "gotron train: %s\n", l)
	}
	return nil
}
