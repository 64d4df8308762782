package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
)

// everySubcommand is each runnable command line's prefix: the commands and,
// for those that dispatch, each of their subcommands.
var everySubcommand = [][]string{
	{"train"}, {"generate"}, {"serve"}, {"score"}, {"convert"},
	{"ckpt", "inspect"}, {"ckpt", "reshard"}, {"preprocess"}, {"tokenizer", "export-gpt2"},
	{"data", "samples"}, {"data", "inspect"}, {"parallel", "groups"}, {"parallel", "schedule"},
	{"memory"}, {"launch"}, {"bench", "gemm"}, {"bench", "attention"}, {"bench", "comm"},
	{"bench", "serve"}, {"bench", "moe"}, {"version"}, {"inference"},
}

// TestFlagsAfterArguments: on every subcommand a flag after a positional
// argument is parsed as a flag (the standard flag package stopped at the
// first positional argument and left "--bogus-flag" as an argument).
func TestFlagsAfterArguments(t *testing.T) {
	listed := map[string]bool{}
	for _, sub := range everySubcommand {
		listed[sub[0]] = true
	}
	for _, c := range commands() {
		if !listed[c.name] {
			t.Errorf("command %q is not in everySubcommand: add it (and its subcommands)", c.name)
		}
	}
	for _, sub := range everySubcommand {
		args := append(append([]string{}, sub...), "positional", "--bogus-flagg")
		if sub[0] == "launch" {
			// launch's positional arguments are the worker's command line:
			// flags after it are the worker's, so check the flag before it.
			args = []string{"launch", "--bogus-flagg", "positional"}
		}
		_, errs, code := runCLI(t, args...)
		if code == 0 || !strings.Contains(errs, "unknown flag --bogus-flagg") {
			t.Errorf("%v: exit %d, stderr %q; want the flag after the argument parsed (unknown flag --bogus-flagg)", args, code, errs)
		}
	}
}

// TestCkptInspectJSONAfterDir: the order docs/checkpoints.md documents,
// 'gotron ckpt inspect DIR --json', prints JSON; --flag=value works too.
func TestCkptInspectJSONAfterDir(t *testing.T) {
	dir := gpt2SizedCheckpoint(t, 16)
	for _, args := range [][]string{
		{"ckpt", "inspect", dir, "--json"},
		{"ckpt", "inspect", "--json=true", dir},
		{"ckpt", "inspect", dir, "--iteration=0", "--json"},
	} {
		out, errs, code := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Errorf("%v: not JSON (%v): %.200s", args, err, out)
		}
	}
}

// TestTokenizerExportFlagAfterDir: a flag after the directory takes effect.
func TestTokenizerExportFlagAfterDir(t *testing.T) {
	dir := t.TempDir()
	if _, errs, code := runCLI(t, "tokenizer", "export-gpt2", dir, "--model-max-length", "77"); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), "77") {
		t.Errorf("--model-max-length 77 after the directory not applied: %s", raw)
	}
}

// TestLaunchLeavesWorkerFlags: launch's flags end at the worker command;
// the worker's flags are not the launcher's.
func TestLaunchLeavesWorkerFlags(t *testing.T) {
	env := &cli{getenv: func(string) string { return "" }}
	lf, command, err := parseLaunchFlags(env, []string{"--nproc-per-node", "2", "train", "--nproc-per-node", "3", "--lr=1e-4"})
	if err != nil {
		t.Fatal(err)
	}
	if lf.nproc != 2 || strings.Join(command, " ") != "train --nproc-per-node 3 --lr=1e-4" {
		t.Errorf("nproc %d, command %q; want 2 and the worker's flags untouched", lf.nproc, command)
	}
}

// TestFlagErrorsNameTwoDashes: every flag error names the flag as it is
// typed, with two dashes.
func TestFlagErrorsNameTwoDashes(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"train", "-lr", "1e-4"}, "-lr: flags take two dashes: --lr"},
		{[]string{"train", "-load", "x"}, "-load: flags take two dashes: --load"},
		{[]string{"train", "--lr", "fast"}, `invalid value "fast" for flag --lr: want a number`},
		{[]string{"train", "--lr=fast"}, `invalid value "fast" for flag --lr: want a number`},
		{[]string{"train", "--num-layers"}, "flag --num-layers needs a value (a int"},
		{[]string{"ckpt", "inspect", "d", "--iteration", "x"}, `invalid value "x" for flag --iteration: want an integer`},
		{[]string{"train", "--num-layer", "2"}, "unknown flag --num-layer (did you mean --num-layers?)"},
		{[]string{"serve", "--num-layers", "2"}, `--num-layers is a Megatron-LM argument (group "transformer configuration") that gotron serve does not take`},
	}
	for _, c := range cases {
		_, errs, code := runCLI(t, c.args...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", c.args, code, errs, c.want)
		}
	}
}

// TestHelpGroupedLikeMegatron: train --help lists its flags under
// Megatron's argument groups, in arguments.py's order, each flag with its
// type and its default, and gotron's own flags last.
func TestHelpGroupedLikeMegatron(t *testing.T) {
	out, errs, code := runCLI(t, "train", "--help")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	groupOf := map[string]string{}
	var order []string
	group := ""
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasSuffix(line, ":") && !strings.HasPrefix(line, " "):
			group = strings.TrimSuffix(line, ":")
			order = append(order, group)
		case strings.HasPrefix(line, "  --"):
			fields := strings.Fields(line)
			if len(fields) != 2 {
				t.Errorf("flag line %q: want --name TYPE", line)
				continue
			}
			groupOf[fields[0]] = group + " " + fields[1]
		}
	}
	for flag, want := range map[string]string{
		"--num-layers":                 "Megatron: transformer configuration int",
		"--max-position-embeddings":    "Megatron: network size int",
		"--lr":                         "Megatron: learning rate and weight decay float",
		"--save":                       "Megatron: checkpointing string",
		"--data-path":                  "Megatron: data and dataloader list",
		"--tensor-model-parallel-size": "Megatron: transformer configuration int",
		"--use-distributed-optimizer":  "Megatron: distributed init bool",
		"--device":                     gotronGroup + " string",
	} {
		if groupOf[flag] != want {
			t.Errorf("%s: in group/type %q, want %q", flag, groupOf[flag], want)
		}
	}
	if len(order) < 5 || order[len(order)-1] != gotronGroup {
		t.Errorf("groups %q: want several, gotron's own last", order)
	}
	// Megatron's order: network size comes before learning rate, which
	// comes before checkpointing (arguments.py adds them so).
	pos := map[string]int{}
	for i, g := range order {
		pos[g] = i
	}
	if !(pos["Megatron: network size"] < pos["Megatron: learning rate and weight decay"] &&
		pos["Megatron: learning rate and weight decay"] < pos["Megatron: checkpointing"]) {
		t.Errorf("groups out of Megatron's order: %q", order)
	}
	for _, want := range []string{"(default 0.01)", `(default "linear")`, "(default 1234)"} {
		if !strings.Contains(out, want) {
			t.Errorf("train --help lacks default %s", want)
		}
	}
}

// TestHelpCommand: 'gotron help CMD [SUB]' prints the command's --help;
// 'gotron help' the command list.
func TestHelpCommand(t *testing.T) {
	for _, sub := range [][]string{{"train"}, {"ckpt", "inspect"}, {"data", "samples"}} {
		want, _, _ := runCLI(t, append(append([]string{}, sub...), "--help")...)
		got, errs, code := runCLI(t, append([]string{"help"}, sub...)...)
		if code != 0 || got != want || !strings.HasPrefix(got, "Usage: gotron "+strings.Join(sub, " ")) {
			t.Errorf("help %v: exit %d (%s), output %.80q; want the --help text %.80q", sub, code, errs, got, want)
		}
	}
	out, _, code := runCLI(t, "help")
	if code != 0 || !strings.Contains(out, "version ") || !strings.Contains(out, "gotron help <command>") {
		t.Errorf("help: exit %d: %s", code, out)
	}
}

// TestVersion: 'gotron version' and 'gotron --version' print the module
// version and the Go toolchain.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, errs, code := runCLI(t, args...)
		if code != 0 || !strings.HasPrefix(out, "gotron ") || !strings.Contains(out, runtime.Version()) {
			t.Errorf("%v: exit %d (%s): %q", args, code, errs, out)
		}
	}
}

// TestMegatronArgumentTable: the embedded table is Megatron's whole list.
func TestMegatronArgumentTable(t *testing.T) {
	tab := loadMegatronTable()
	if tab.count != 838 {
		t.Errorf("%d Megatron arguments, want 838 (arguments.py at d98e8a6)", tab.count)
	}
	for name, group := range map[string]string{"lr": "learning rate and weight decay", "transformer-impl": "transformer configuration",
		"eval-interval": "validation", "log-num-zeros-in-grad": "logging"} {
		if a := megatronArgs()[name]; a.group != group {
			t.Errorf("--%s: group %q, want %q", name, a.group, group)
		}
	}
}

// TestMegatronCompatSameNumbers: the arguments accepted because gotron
// already does what they ask train exactly as without them (same losses,
// bit for bit), each named in one line; --sequence-parallel at TP=1 is
// switched off with a warning, as Megatron does. The --no-bias-*-fusion
// flags run the unfused ops (TestFusionFlags), which give the fused ones'
// numbers bit for bit.
func TestMegatronCompatSameNumbers(t *testing.T) {
	dir := t.TempDir()
	base := append(append([]string{}, tinyTrain...), "--train-iters", "3")
	want := filepath.Join(dir, "plain.jsonl")
	if _, errs, code := runCLI(t, append(append([]string{}, base...), "--metrics-file", want)...); code != 0 {
		t.Fatalf("plain run: %s", errs)
	}
	extra := []string{"--deterministic-mode", "--attention-softmax-in-fp32", "--apply-query-key-layer-scaling",
		"--transformer-impl", "transformer_engine", "--use-persistent-ckpt-worker", "--no-create-attention-mask-in-dataloader",
		"--rerun-mode", "disabled", "--sequence-parallel", "--num-workers", "8", "--num-distributed-optimizer-instances", "1",
		"--timing-log-level", "0", "--distributed-backend", "nccl",
		"--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-bias-swiglu-fusion"}
	got := filepath.Join(dir, "compat.jsonl")
	_, errs, code := runCLI(t, append(append(append([]string{}, base...), extra...), "--metrics-file", got)...)
	if code != 0 {
		t.Fatalf("with Megatron's arguments: exit %d: %s", code, errs)
	}
	wantLosses, _ := metricsLosses(t, want)
	gotLosses, _ := metricsLosses(t, got)
	if len(gotLosses) != 3 || fmt.Sprint(gotLosses) != fmt.Sprint(wantLosses) {
		t.Errorf("losses %v with the arguments, %v without: want the same numbers", gotLosses, wantLosses)
	}
	for _, line := range []string{
		"gotron train: --deterministic-mode: accepted: gotron's CPU kernels are deterministic",
		"gotron train: --attention-softmax-in-fp32: accepted: gotron computes attention scores and softmax in float32",
		"gotron train: --apply-query-key-layer-scaling: accepted:",
		"gotron train: --transformer-impl transformer_engine: no effect in gotron:",
		"gotron train: --use-persistent-ckpt-worker: no effect in gotron:",
		"gotron train: --num-workers 8: no effect without --fim-data:",
		"gotron train: --distributed-backend nccl: NCCL moves GPU memory, and this run is on --device cpu: the collectives run over gotron's CPU process group",
		"gotron train: --sequence-parallel: disabled, as Megatron does, because --tensor-model-parallel-size is 1",
		"gotron train: --no-bias-swiglu-fusion: no effect on a gelu model (it applies to --swiglu models, as Megatron's)",
	} {
		if strings.Count(errs, line) != 1 {
			t.Errorf("stderr should have the line %q once:\n%s", line, errs)
		}
	}
}

// TestMegatronCompatRefusals: an argument for a feature gotron does not
// have is refused naming the feature, before any work.
func TestMegatronCompatRefusals(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--log-num-zeros-in-grad", "--device", "sim"}, "--log-num-zeros-in-grad: counts the gradients on the host: --device cpu only"},
		{[]string{"--use-pytorch-profiler"}, "--use-pytorch-profiler: needs the PyTorch profiler"},
		{[]string{"--cache-mla-latents"}, "--cache-mla-latents needs --multi-latent-attention"},
		{[]string{"--q-lora-rank", "8"}, "--q-lora-rank needs --multi-latent-attention"},
		{[]string{"--rope-type", "yarn"}, "--rope-type needs --multi-latent-attention"},
		{[]string{"--multi-latent-attention", "--rope-type", "ntk"}, "--rope-type=\"ntk\": want yarn or rope"},
		{[]string{"--multi-latent-attention", "--group-query-attention", "--num-query-groups", "2"}, "mutually exclusive"},
		{[]string{"--dsa-indexer-topk", "8"}, "--dsa-indexer-topk needs --experimental-attention-variant dsa"},
		{[]string{"--experimental-attention-variant", "dsa", "--dsa-indexer-topk", "8"}, "--experimental-attention-variant dsa needs --dsa-indexer-n-heads, --dsa-indexer-head-dim and --dsa-indexer-topk"},
		{[]string{"--experimental-attention-variant", "gdn2"}, "--experimental-attention-variant gdn2: not built in gotron (gated_delta_net and dsa are)"},
		{[]string{"--linear-num-value-heads", "8"}, "--linear-num-value-heads needs --experimental-attention-variant gated_delta_net"},
		{[]string{"--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"}, "--fp8-recipe mxfp8: needs TE's MXFP8BlockScaling recipe, not built in gotron"},
		{[]string{"--fp8-param-gather"}, "fp8_param must be used together with fp8 mode"},
		{[]string{"--fp8-recipe", "tensorwise"}, "--fp8-recipe without --fp8-format"},
		{[]string{"--fp8-format", "hybrid", "--fp8-param-gather"}, "--fp8-param-gather: Megatron supports it only with --use-distributed-optimizer"},
		{[]string{"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-margin", "1"}, "--fp8-margin: read only by --fp8-recipe delayed"},
		{[]string{"--fp8-format", "hybrid", "--first-last-layers-bf16"}, "Delayed scaling does not support first / last layer in BF16"},
		{[]string{"--fp8-format", "hybrid", "--fp8-output-proj"}, "--fp8-output-proj: needs a Transformer Engine FP8 feature not built in gotron"},
		{[]string{"--fp8-format", "e5m2"}, "--fp8-format \"e5m2\": want e4m3 or hybrid"},
		{[]string{"--fp8-format", "hybrid", "--fp8-amax-history-len", "0"}, "--fp8-amax-history-len"},
		{[]string{"--megatron-fsdp-version", "2"}, "needs this part of Megatron-FSDP"},
		{[]string{"--log-straggler"}, "--log-straggler: needs Megatron's straggler detector"},
		{[]string{"--inference-max-seq-length", "64"}, "needs Megatron's inference scripts"},
		{[]string{"--rl-use-sequence-packing"}, "--rl-use-sequence-packing needs --perform-rl-step"},
		{[]string{"--rl-sequence-packing-algo", "round-robin"}, "--rl-sequence-packing-algo needs --perform-rl-step"},
		{[]string{"--grpo-filter-groups-with-same-reward"}, "--grpo-filter-groups-with-same-reward: needs this part of Megatron's RL step"},
		{[]string{"--num-distributed-optimizer-instances", "2"}, "--num-distributed-optimizer-instances=2 needs --use-distributed-optimizer (as Megatron)"},
		{[]string{"--deterministic-mode", "--device", "sim"}, "--deterministic-mode: checked on --device cpu only"},
		{[]string{"--mup-output-mult", "0.5"}, "--mup-output-mult=0.5 without --use-mup"},
		{[]string{"--use-mup", "--mup-attn-scale-power", "0"}, "--mup-attn-scale-power: 0 is out of range"},
		{[]string{"--use-mup", "--mup-base-hidden-size", "-8"}, "--mup-base-hidden-size: -8 is out of range"},
		{[]string{"--use-mup", "--num-experts", "2"}, "--use-mup with MoE, MLA or gated delta net layers is not built"},
		{[]string{"--use-mup", "--sample-prompt", "x"}, "gpt: decoding a --use-mup model"},
		{[]string{"--use-mup", "--ckpt-format", "torch"}, "--use-mup with the torch checkpoint format"},
	}
	for _, c := range cases {
		args := append(append(append([]string{}, tinyTrain...), "--train-iters", "1"), c.args...)
		out, errs, code := runCLI(t, args...)
		if code == 0 || !strings.Contains(errs, c.want) || strings.Contains(out, "iteration ") {
			t.Errorf("%v: exit %d, stderr %q; want refused before training with %q", c.args, code, errs, c.want)
		}
	}
}

// TestMuPFlagsTakeEffect: --use-mup --mup-base-hidden-size changes the
// losses (init, attention and logit scales, per-group learning rates);
// --mup-width-mult, which Megatron recomputes, is accepted with a line
// and changes nothing.
func TestMuPFlagsTakeEffect(t *testing.T) {
	dir := t.TempDir()
	run := func(name string, extra ...string) ([]float64, string) {
		t.Helper()
		path := filepath.Join(dir, name+".jsonl")
		args := append(append(append([]string{}, tinyTrain...), "--train-iters", "2", "--metrics-file", path), extra...)
		_, errs, code := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", name, code, errs)
		}
		losses, _ := metricsLosses(t, path)
		return losses, errs
	}
	plain, _ := run("plain")
	mup, _ := run("mup", "--use-mup", "--mup-base-hidden-size", "8")
	if fmt.Sprint(plain) == fmt.Sprint(mup) {
		t.Fatalf("losses %v with --use-mup, the same without", mup)
	}
	again, errs := run("mup-width", "--use-mup", "--mup-base-hidden-size", "8", "--mup-width-mult", "3")
	if fmt.Sprint(again) != fmt.Sprint(mup) {
		t.Errorf("losses %v with --mup-width-mult 3, %v without: Megatron recomputes it", again, mup)
	}
	if !strings.Contains(errs, "--mup-width-mult 3: no effect in gotron:") {
		t.Errorf("no line for --mup-width-mult:\n%s", errs)
	}
}

// TestFusionFlags: Megatron's --no-bias-gelu-fusion, --no-bias-swiglu-fusion
// and --no-bias-dropout-fusion set the run's gpt.Fusions (the model then
// runs the unfused ops: gpt.TestFusionsSameNumbers); a flag for another
// activation than the model's is named as doing nothing.
func TestFusionFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want gpt.Fusions
	}{
		{nil, gpt.Fusions{}},
		{[]string{"--no-bias-gelu-fusion"}, gpt.Fusions{NoBiasGELU: true}},
		{[]string{"--no-bias-swiglu-fusion", "--no-bias-dropout-fusion"}, gpt.Fusions{NoBiasSwiGLU: true, NoBiasDropout: true}},
	} {
		fs, f := newTrainFlags()
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		if f.cfg.Fusions != c.want {
			t.Errorf("%v: fusions %+v, want %+v", c.args, f.cfg.Fusions, c.want)
		}
	}
	if n := fusionNote(gpt.SwiGLU, gpt.Fusions{NoBiasGELU: true}); !strings.Contains(n, "--no-bias-gelu-fusion: no effect on a swiglu model") {
		t.Errorf("note %q", n)
	}
	if n := fusionNote(gpt.GELUTanh, gpt.Fusions{NoBiasGELU: true, NoBiasDropout: true}); n != "" {
		t.Errorf("note %q for flags that act", n)
	}
}

// TestMuPFlagsOverAPreset: --model's presets take the muP flags as well
// (they set no muP of their own).
func TestMuPFlagsOverAPreset(t *testing.T) {
	fs, f := newTrainFlags()
	if err := fs.Parse([]string{"--model", "tiny", "--use-mup", "--mup-base-hidden-size", "64", "--mock-data", "--vocab-size", "100",
		"--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "1", "--lr", "1e-3"}); err != nil {
		t.Fatal(err)
	}
	f.finish()
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	cfg, src, err := f.build(context.Background(), given)
	if err != nil {
		t.Fatal(err)
	}
	src.close()
	if !cfg.Model.MuP.Enabled || cfg.Model.MuP.BaseHiddenSize != 64 {
		t.Fatalf("--model tiny --use-mup --mup-base-hidden-size 64: muP %+v", cfg.Model.MuP)
	}
}
