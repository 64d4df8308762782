package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gotron/gotron/rl"
	"github.com/gotron/gotron/tokenizer"
	"github.com/gotron/gotron/train"
)

// rlFixture writes a tiny countdown environment: a JSON Lines task file, its
// --langrl-env-config, and a byte-level BPE tokenizer learnt from the
// prompts (a small vocabulary keeps the model tiny).
func rlFixture(t *testing.T, dir string) (envConfig string, tokArgs []string) {
	t.Helper()
	tasks := []rl.Countdown{{Target: 24, Nums: []int64{3, 8, 1}}, {Target: 98, Nums: []int64{44, 19, 35}},
		{Target: 10, Nums: []int64{2, 5}}, {Target: 7, Nums: []int64{3, 4}}, {Target: 12, Nums: []int64{6, 2}}}
	var lines, texts []string
	for _, task := range tasks {
		nums := make([]string, len(task.Nums))
		for i, n := range task.Nums {
			nums[i] = strconv.FormatInt(n, 10)
		}
		lines = append(lines, `{"target": `+strconv.FormatInt(task.Target, 10)+`, "nums": [`+strings.Join(nums, ", ")+`]}`)
		texts = append(texts, "User: "+task.Prompt()+"\nAssistant: <answer> (1 + 2) * 3 </answer>")
	}
	data := filepath.Join(dir, "countdown.jsonl")
	if err := os.WriteFile(data, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	envConfig = filepath.Join(dir, "env_config.yaml")
	if err := os.WriteFile(envConfig, []byte("- agent_type: CountdownAgent\n  agent_args:\n    dataset_file: \""+data+"\"\n    split: \"train\"\n  weight: 1.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	files, err := tokenizer.TrainGPT2BPE(context.Background(), texts, 400)
	if err != nil {
		t.Fatal(err)
	}
	tokDir := filepath.Join(dir, "tok")
	if err := files.Write(tokDir); err != nil {
		t.Fatal(err)
	}
	return envConfig, []string{"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", filepath.Join(tokDir, "vocab.json"), "--merge-file", filepath.Join(tokDir, "merges.txt")}
}

// tinyGRPO is a GRPO run of a tiny model (the flags of Megatron's
// gpt_grpo_* tests that apply to one process).
func tinyGRPO(env string, tok []string) []string {
	return append([]string{"train", "--perform-rl-step", "--langrl-env-config", env,
		"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "128",
		"--max-position-embeddings", "128", "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
		"--disable-bias-linear", "--micro-batch-size", "2", "--global-batch-size", "4",
		"--grpo-prompts-per-step", "2", "--grpo-group-size", "2", "--grpo-iterations", "1",
		"--grpo-clamp-eps-lower", "0.2", "--grpo-clamp-eps-upper", "0.2", "--grpo-kl-beta", "0", "--grpo-entropy-term-weight", "0.01",
		"--calculate-per-token-loss", "--lr", "1e-3", "--lr-decay-style", "constant", "--lr-decay-iters", "100", "--adam-beta2", "0.999", "--clip-grad", "1.0", "--weight-decay", "0.01",
		"--log-interval", "1", "--seed", "42", "--rl-default-temperature", "1.0"}, tok...)
}

// rlMetrics reads a --metrics-file's lm losses and gradient norms (the log
// line leaves a negative loss out, as Megatron's: GRPO's often is).
func rlMetrics(t *testing.T, path string) (losses, norms []float64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r struct {
			LMLoss   *float64 `json:"lm_loss"`
			GradNorm *float64 `json:"grad_norm"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		if r.LMLoss == nil || r.GradNorm == nil {
			t.Fatalf("metrics line without a finite lm_loss and grad_norm: %s", line)
		}
		losses, norms = append(losses, *r.LMLoss), append(norms, *r.GradNorm)
	}
	return losses, norms
}

// TestGRPOTrainEndToEnd runs gotron train --perform-rl-step on a tiny model
// and a tiny countdown JSON Lines file: rollouts are generated and scored,
// the loss is finite, the weights change, and a checkpoint saved after the
// first collection resumes to the same second iteration as the run that
// did not stop.
func TestGRPOTrainEndToEnd(t *testing.T) {
	dir := t.TempDir()
	env, tok := rlFixture(t, dir)
	whole := filepath.Join(dir, "whole")
	out, errs, code := runCLI(t, append(tinyGRPO(env, tok), "--train-iters", "2", "--save", whole, "--save-interval", "1",
		"--metrics-file", filepath.Join(dir, "whole.jsonl"))...)
	if code != 0 {
		t.Fatalf("train exit %d: %s\n%s", code, errs, out)
	}
	for _, want := range []string{"rl: 5 countdown tasks from", "rl: collection 0: 2 prompts × 2 rollouts, reward mean", "rl: collection 1:", "iteration        2/       2"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	ls, norms := rlMetrics(t, filepath.Join(dir, "whole.jsonl"))
	if len(ls) != 2 {
		t.Fatalf("%d lm losses logged, want 2:\n%s", len(ls), out)
	}
	for i, l := range ls {
		if math.IsNaN(l) || math.IsInf(l, 0) || l == 0 || norms[i] == 0 {
			t.Errorf("iteration %d: lm loss %g, grad norm %g: want finite and non-zero (the entropy term alone makes them so)", i+1, l, norms[i])
		}
	}
	t.Logf("lm losses %v, grad norms %v", ls, norms)

	// Resume: one iteration, then a second from its checkpoint.
	first := filepath.Join(dir, "first")
	if out, errs, code := runCLI(t, append(tinyGRPO(env, tok), "--train-iters", "1", "--save", first)...); code != 0 {
		t.Fatalf("first run exit %d: %s\n%s", code, errs, out)
	}
	resumed := filepath.Join(dir, "resumed")
	out2, errs, code := runCLI(t, append(tinyGRPO(env, tok), "--train-iters", "2", "--load", first, "--save", resumed, "--use-checkpoint-opt_param-scheduler",
		"--metrics-file", filepath.Join(dir, "resumed.jsonl"))...)
	if code != 0 {
		t.Fatalf("resumed run exit %d: %s\n%s", code, errs, out2)
	}
	if !strings.Contains(out2, "rl: collection 1:") || strings.Contains(out2, "rl: collection 0:") {
		t.Errorf("the resumed run should collect collection 1 only:\n%s", out2)
	}
	if l2, _ := rlMetrics(t, filepath.Join(dir, "resumed.jsonl")); len(l2) != 1 || l2[0] != ls[1] {
		t.Errorf("resumed iteration 2 lm loss %v, the uninterrupted run's %g", l2, ls[1])
	}

	m1, _, err := train.LoadModel(first)
	if err != nil {
		t.Fatal(err)
	}
	m2, _, err := train.LoadModel(whole)
	if err != nil {
		t.Fatal(err)
	}
	m3, _, err := train.LoadModel(resumed)
	if err != nil {
		t.Fatal(err)
	}
	changed := 0
	for i, p := range m1.Params() {
		a, b, c := p.Float32s(), m2.Params()[i].Float32s(), m3.Params()[i].Float32s()
		for j := range a {
			if a[j] != b[j] {
				changed++
			}
			if b[j] != c[j] {
				t.Fatalf("parameter %s element %d: %g uninterrupted, %g resumed", p.Name, j, b[j], c[j])
			}
		}
	}
	if changed == 0 {
		t.Error("iteration 2 changed no weight")
	}
}

func TestGRPOTrainErrors(t *testing.T) {
	dir := t.TempDir()
	env, tok := rlFixture(t, dir)
	unknown := filepath.Join(dir, "unknown.yaml")
	if err := os.WriteFile(unknown, []byte("- agent_type: ChessAgent\n  agent_args:\n    dataset_file: x.jsonl\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.jsonl")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	emptyEnv := filepath.Join(dir, "empty.yaml")
	if err := os.WriteFile(emptyEnv, []byte("- agent_type: CountdownAgent\n  agent_args:\n    dataset_file: "+empty+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := append(tinyGRPO(env, tok), "--train-iters", "1")
	with := func(extra ...string) []string { return append(append([]string{}, base...), extra...) }
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"missing env config", with("--langrl-env-config", filepath.Join(dir, "nope.yaml")), "--langrl-env-config: open"},
		{"unknown agent", with("--langrl-env-config", unknown), `unknown agent_type "ChessAgent"`},
		{"empty dataset", with("--langrl-env-config", emptyEnv), "has no tasks"},
		{"group of one", with("--grpo-group-size", "1", "--global-batch-size", "2"), "--grpo-group-size=1: want >= 2"},
		{"batch not dividing", with("--grpo-prompts-per-step", "3"), "--global-batch-size=4 must divide --grpo-prompts-per-step × --grpo-group-size = 6"},
		{"save interval", with("--grpo-iterations", "2", "--save", filepath.Join(dir, "s"), "--save-interval", "1"), "--save-interval=1 must be a multiple of the 2 iterations"},
		{"no tokenizer", append(tinyGRPO(env, nil), "--train-iters", "1"), "--perform-rl-step needs --tokenizer-type"},
		{"data path", with("--data-path", filepath.Join(dir, "corpus")), "--data-path (and --train/--valid/--test-data-path) have no use"},
		{"flag without the step", []string{"train", "--grpo-group-size", "4"}, "--grpo-group-size needs --perform-rl-step"},
		{"truncation without correction", with("--rl-importance-sampling-truncation-coef", "2"), "needs --rl-inference-logprobs-is-correction"},
		{"bad clamp", with("--grpo-clamp-eps-lower", "-0.1"), "--grpo-clamp-eps-lower"},
		{"packing micro-batch", with("--rl-use-sequence-packing"), "--rl-use-sequence-packing needs --micro-batch-size 1, not 2"},
		{"packing algorithm", with("--rl-use-sequence-packing", "--micro-batch-size", "1", "--rl-sequence-packing-algo", "sorted"), "--rl-sequence-packing-algo \"sorted\": want fifo or round-robin"},
		{"packing options alone", with("--rl-sequence-packing-max-sequences-per-bin", "2"), "need --rl-use-sequence-packing"},
		{"packing bins", with("--rl-use-sequence-packing", "--micro-batch-size", "1", "--rl-sequence-packing-max-sequences-per-bin", "0"), "--rl-sequence-packing-max-sequences-per-bin"},
	} {
		_, errs, code := runCLI(t, c.args...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%s: exit %d, stderr %q; want an error containing %q", c.name, code, errs, c.want)
		}
	}
}

// packableGRPO is tinyGRPO with --micro-batch-size 1, without dropout
// and at --seq-length 512, from weights (written to dir/crafted) whose
// rollouts end early, so that several share a bin. run runs gotron in
// process with a --metrics-file dir/NAME.jsonl and fails the test on an
// error.
func packableGRPO(t *testing.T, dir string) ([]string, func(name string, args ...string) string) {
	t.Helper()
	env, tok := rlFixture(t, dir)
	// Without dropout: the packed run's micro-batches hold the rollouts
	// in another order, and so other dropout masks. Prompts of this
	// tokenizer are long: two rollouts fit a bin of 512 tokens.
	base := append(tinyGRPO(env, tok), "--micro-batch-size", "1", "--hidden-dropout", "0", "--attention-dropout", "0",
		"--seq-length", "512", "--max-position-embeddings", "512")
	run := func(name string, args ...string) string {
		t.Helper()
		out, errs, code := runCLI(t, append(args, "--metrics-file", filepath.Join(dir, name+".jsonl"))...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s\n%s", name, code, errs, out)
		}
		return out
	}
	// A random tiny model rarely samples the end of document, and rollouts
	// that fill --seq-length pack one per bin. The runs start from weights
	// whose word embeddings share one direction, the end of document's
	// longer: it follows with probability about 1/3, and the short
	// rollouts share bins.
	init := filepath.Join(dir, "init")
	run("init", append(base, "--train-iters", "1", "--save", init)...)
	m, _, err := train.LoadModel(init)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := tokenizer.New(tokenizer.Config{Type: tokenizer.TypeGPT2BPE, VocabFile: tok[3], MergeFile: tok[5]})
	if err != nil {
		t.Fatal(err)
	}
	emb, h := m.WordEmb.Float32s(), m.WordEmb.Dim(1)
	for v := range m.WordEmb.Dim(0) {
		u := float32(0.25)
		if v == tk.EOD() {
			u *= 1.6
		}
		for j := range h {
			emb[v*h+j] += u
		}
	}
	crafted := filepath.Join(dir, "crafted")
	if err := train.SaveModel(context.Background(), crafted, 1, m, 512, nil); err != nil {
		t.Fatal(err)
	}
	return append(base, "--load", crafted, "--finetune"), run
}

// TestGRPOTrainPacked: --rl-use-sequence-packing packs each collection's
// four rollouts into bins and trains on them. With --global-batch-size the
// collection's rollouts (every bin each iteration) and per-token loss, an
// iteration's loss and gradient are the unpacked run's over the same
// rollouts (float tolerance: the bins' sums run in another order); the
// consumed count is sequences; and a run resumed from a packed checkpoint
// ends bit for bit where the uninterrupted one does.
func TestGRPOTrainPacked(t *testing.T) {
	dir := t.TempDir()
	base, run := packableGRPO(t, dir)
	packed := append(append([]string{}, base...), "--rl-use-sequence-packing", "--rl-sequence-packing-algo", "fifo")

	whole := filepath.Join(dir, "whole")
	out := run("packed", append(packed, "--train-iters", "2", "--save", whole, "--save-interval", "1")...)
	for _, want := range []string{"rl: collection 0: 4 rollouts packed into 1 bins, 1 bins per iteration", "rl: collection 1: 4 rollouts packed into", "consumed samples:            4", "consumed samples:            8"} {
		if !strings.Contains(out, want) {
			t.Errorf("packed run's output lacks %q:\n%s", want, out)
		}
	}
	uout := run("unpacked", append(base, "--train-iters", "1")...)
	pl, pn := rlMetrics(t, filepath.Join(dir, "packed.jsonl"))
	ul, un := rlMetrics(t, filepath.Join(dir, "unpacked.jsonl"))
	if len(pl) != 2 || len(ul) != 1 {
		t.Fatalf("%d packed and %d unpacked losses, want 2 and 1", len(pl), len(ul))
	}
	t.Logf("iteration 1: packed loss %.9g norm %.9g; unpacked %.9g %.9g", pl[0], pn[0], ul[0], un[0])
	// The same rollouts and log-probabilities give the same sum of token
	// losses and of gradients; the mean divides by the loss tokens, where
	// train_rl.loss_func counts a micro-batch without one as one: an
	// unpacked rollout that ended at once (e of the four) adds 1, a bin
	// holding it nothing. Both the logged loss and the gradient norm are
	// the unpacked run's times (tokens + e) / tokens.
	var tokens int
	i := strings.Index(uout, " generated loss tokens")
	if i < 0 {
		t.Fatalf("no loss token count in the unpacked run's output:\n%s", uout)
	}
	if _, err := fmt.Sscan(uout[strings.LastIndex(uout[:i], " ")+1:i], &tokens); err != nil || tokens <= 0 {
		t.Fatalf("loss token count %q: %v", uout[strings.LastIndex(uout[:i], " ")+1:i], err)
	}
	matched := -1
	for e := 0; e <= 4; e++ {
		r := float64(tokens+e) / float64(tokens)
		if math.Abs(pl[0]-ul[0]*r) <= 1e-6*math.Abs(pl[0]) && math.Abs(pn[0]-un[0]*r) <= 1e-4*pn[0] {
			matched = e
		}
	}
	if matched < 0 {
		t.Errorf("iteration 1: packed lm loss %.9g grad norm %.9g, unpacked %.9g and %.9g over %d loss tokens: want the unpacked times (%d + e)/%d, e = 0…4",
			pl[0], pn[0], ul[0], un[0], tokens, tokens, tokens)
	}
	t.Logf("%d loss tokens, %d empty rollouts", tokens, matched)

	// Half the rollouts per iteration: ⌈1/2 × 1 bin⌉ = 1 bin, its four
	// sequences consumed (two iterations per collection, one collection).
	out = run("half", append(packed, "--global-batch-size", "2", "--train-iters", "2")...)
	// Megatron's log line with packing: the consumed bins after the
	// consumed samples, and the global batch size in bins.
	for _, want := range []string{"1 bins per iteration", "iteration        1/       2 | consumed samples:            4 | consumed bins:            1 |",
		"iteration        2/       2 | consumed samples:            8 | consumed bins:            2 |", "| global batch size:     1 |"} {
		if !strings.Contains(out, want) || strings.Contains(out, "rl: collection 1") {
			t.Errorf("the run of half a collection per iteration: output lacks %q or collects twice:\n%s", want, out)
		}
	}

	first := filepath.Join(dir, "first")
	run("first", append(packed, "--train-iters", "1", "--save", first)...)
	resumed := filepath.Join(dir, "resumed")
	resumedArgs := append(append([]string{}, packed[:len(packed)-6]...), packed[len(packed)-3:]...) // without --load crafted --finetune
	run("resumed", append(resumedArgs, "--train-iters", "2", "--load", first, "--save", resumed, "--use-checkpoint-opt_param-scheduler")...)
	if rl2, _ := rlMetrics(t, filepath.Join(dir, "resumed.jsonl")); len(rl2) != 1 || rl2[0] != pl[1] {
		t.Errorf("resumed iteration 2 lm loss %v, the uninterrupted packed run's %g", rl2, pl[1])
	}
	m2, _, err := train.LoadModel(whole)
	if err != nil {
		t.Fatal(err)
	}
	m3, _, err := train.LoadModel(resumed)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range m2.Params() {
		a, b := p.Float32s(), m3.Params()[i].Float32s()
		for j := range a {
			if a[j] != b[j] {
				t.Fatalf("parameter %s element %d: %g uninterrupted, %g resumed", p.Name, j, a[j], b[j])
			}
		}
	}
}

// TestGRPOCompatSameNumbers: the RL arguments accepted without effect
// change no number and say so, once each: Megatron's CUDA-graph arguments
// of the rollout engine (gotron inference's words), its memory placement
// and OOM cap, --mock-data, a generation lag of 0 with partial rollouts at
// batch granularity, and the deprecated --use-rotary-position-embeddings
// beside rope. The engine settings
// gotron applies keep the numbers too: a KV cache too small for all the
// rollouts at once (they wait for blocks: the same tokens), the rollouts'
// length cap at --seq-length, and the engine's step log, which logs.
func TestGRPOCompatSameNumbers(t *testing.T) {
	dir := t.TempDir()
	env, tok := rlFixture(t, dir)
	base := append(tinyGRPO(env, tok), "--train-iters", "1")
	if _, errs, code := runCLI(t, append(append([]string{}, base...), "--metrics-file", filepath.Join(dir, "plain.jsonl"))...); code != 0 {
		t.Fatalf("plain run: %s", errs)
	}
	// 2 layers × K and V × 32 channels × 4 bytes: 256 KiB would hold all
	// four rollouts of up to 128 tokens; 0.0001 GiB holds one or two.
	out, errs, code := runCLI(t, append(append([]string{}, base...), "--rl-offload-optimizer-during-inference", "--refit-method", "nccl",
		"--cuda-graph-impl", "local", "--inference-dynamic-batching-num-cuda-graphs", "1", "--inference-dynamic-batching-cuda-graph-sizing-distribution", "linear",
		"--rl-training-cuda-graphs", "--inference-dynamic-batching-unified-memory-level", "1", "--max-tokens-to-oom", "3600000", "--mock-data",
		"--rl-partial-rollouts", "--rl-generation-lag", "0", "--rl-submission-granularity", "B", "--use-rotary-position-embeddings",
		"--inference-dynamic-batching-buffer-size-gb", "0.0001", "--inference-max-seq-length", "128",
		"--inference-logging-step-interval", "1", "--metrics-file", filepath.Join(dir, "compat.jsonl"))...)
	if code != 0 {
		t.Fatalf("with Megatron's arguments: exit %d: %s", code, errs)
	}
	want, _ := rlMetrics(t, filepath.Join(dir, "plain.jsonl"))
	got, _ := rlMetrics(t, filepath.Join(dir, "compat.jsonl"))
	if len(got) != 1 || got[0] != want[0] {
		t.Errorf("losses %v with the arguments, %v without: want the same numbers", got, want)
	}
	for _, line := range []string{
		"gotron train: --rl-offload-optimizer-during-inference: no effect on the CPU:",
		"gotron train: --refit-method nccl: no effect in gotron:",
		"gotron train: --cuda-graph-impl local: no effect in gotron: it picks Megatron's CUDA graph implementation; gotron generates and trains without CUDA graphs, which replay the same kernels (the same numbers)",
		"gotron train: --inference-dynamic-batching-num-cuda-graphs 1: no effect in gotron: it sizes Megatron's set of CUDA graphs;",
		"gotron train: --inference-dynamic-batching-cuda-graph-sizing-distribution linear: no effect in gotron: it spaces the batch sizes of Megatron's CUDA graphs",
		"gotron train: --rl-training-cuda-graphs: no effect in gotron: it keeps Megatron's CUDA graphs on while it trains",
		"gotron train: --inference-dynamic-batching-unified-memory-level 1: no effect in gotron: it places Megatron's KV buffer in CUDA unified memory;",
		"gotron train: --max-tokens-to-oom 3600000: no effect in gotron:",
		"gotron train: --mock-data: no effect with --perform-rl-step:",
		"gotron train: --rl-generation-lag 0: generation is synchronous, as gotron's",
		"gotron train: --rl-partial-rollouts: no effect with --rl-generation-lag 0 and batch (B) submission and consumption:",
		"gotron train: --rl-submission-granularity B: Megatron's default, nothing to do",
		"gotron train: --use-rotary-position-embeddings: accepted: Megatron's deprecated spelling of --position-embedding-type rope",
	} {
		if strings.Count(errs, line) != 1 {
			t.Errorf("stderr should have the line %q once:\n%s", line, errs)
		}
	}
	for _, arg := range []string{"dynamic-batching-buffer-size-gb", "max-seq-length", "logging-step-interval"} {
		if strings.Contains(errs, "gotron train: --inference-"+arg) {
			t.Errorf("stderr has a line for --inference-%s, which the RL step applies:\n%s", arg, errs)
		}
	}
	// The engine's log: every step, with rollouts waiting for KV blocks.
	if !strings.Contains(out, "rl: engine step 1: ") || !regexp.MustCompile(`rl: engine step \d+: \d+ running, [1-9]\d* waiting`).MatchString(out) {
		t.Errorf("output lacks the engine's step lines with rollouts waiting for the small KV cache:\n%s", out)
	}

	// Refused, naming what they need.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--rl-training-cuda-graphs"}, "--rl-training-cuda-graphs without --cuda-graph-impl"},
		{[]string{"--cuda-graph-impl", "graphs"}, `--cuda-graph-impl "graphs": want none, local, transformer_engine or full_iteration`},
		{[]string{"--cuda-graph-impl", "local", "--enable-cuda-graph"}, "--enable-cuda-graph with --cuda-graph-impl"},
		{[]string{"--cuda-graph-impl", "local", "--inference-dynamic-batching-num-cuda-graphs", "0"}, "want a positive integer or -1"},
		{[]string{"--inference-dynamic-batching-cuda-graph-sizing-distribution", "cubic"}, "want exponential or linear"},
		{[]string{"--inference-dynamic-batching-buffer-size-gb", "0"}, "want a size in GiB > 0"},
		{[]string{"--inference-max-seq-length", "129"}, "--inference-max-seq-length"},
		{[]string{"--inference-logging-step-interval", "-1"}, "--inference-logging-step-interval"},
		{[]string{"--rl-partial-rollouts"}, "needs Megatron's asynchronous rollout pipeline"}, // the lag autotuned
		{[]string{"--rl-partial-rollouts", "--rl-generation-lag", "0", "--rl-consumption-granularity", "G"}, "needs Megatron's asynchronous rollout pipeline"},
		{[]string{"--rl-generation-lag", "2"}, "needs Megatron's asynchronous rollout pipeline"},
		{[]string{"--rl-submission-granularity", "G"}, "needs Megatron's asynchronous rollout pipeline"},
		// one process: the inference layout needs the ranks
		{[]string{"--rl-inference-tensor-model-parallel-size", "2"}, "--rl-inference-tensor-model-parallel-size=2: a separate inference layout of 2 tensor-parallel ranks needs a launched run"},
		{[]string{"--rl-inference-pipeline-model-parallel-size", "2"}, "needs a separate inference layout with pipeline or expert parallelism"},
	} {
		_, errs, code := runCLI(t, append(append([]string{}, base...), c.args...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error containing %q", c.args, code, errs, c.want)
		}
	}
	if _, errs, code := runCLI(t, append(append([]string{}, base...), "--position-embedding-type", "learned_absolute", "--use-rotary-position-embeddings")...); code == 0 ||
		!strings.Contains(errs, "--use-rotary-position-embeddings: needs") {
		t.Errorf("--use-rotary-position-embeddings with learned positions: exit %d, %s", code, errs)
	}
	// Outside the RL step gotron train refuses CUDA graphs.
	if _, errs, code := runCLI(t, "train", "--cuda-graph-impl", "local", "--mock-data", "--train-iters", "1"); code == 0 || !strings.Contains(errs, "--cuda-graph-impl local: needs CUDA graphs, not built in gotron") {
		t.Errorf("--cuda-graph-impl without --perform-rl-step: exit %d, %s", code, errs)
	}
}

// TestGRPOTrainDataParallel: --perform-rl-step over two worker processes on
// tcp (gotron launch), data-parallel with and without the distributed
// optimizer, logs one process's losses and ends at its weights (float
// tolerance: the gradient sums' order differs). Each rank generates only
// the rollouts it trains on (or, with --rl-inference-tensor-model-parallel-size
// 2, both generate both ranks' rollouts at TP=2 from slices of their weights:
// Megatron's separate inference layout); two collections of two iterations each, so the
// second collection's rollouts come from weights the ranks updated.
func TestGRPOTrainDataParallel(t *testing.T) {
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	env, tok := rlFixture(t, dir)
	// Dropout off: each rank draws its own dropout masks (Megatron's
	// streams), so only without dropout are the numbers one process's.
	base := with(tinyGRPO(env, tok), "--grpo-prompts-per-step", "4", "--micro-batch-size", "1", "--train-iters", "4",
		"--hidden-dropout", "0", "--attention-dropout", "0", "--grpo-kl-beta", "0.1")
	one := filepath.Join(dir, "one")
	out, errs, code := runCLI(t, with(base, "--metrics-file", filepath.Join(dir, "one.jsonl"), "--save", one, "--save-interval", "4")...)
	if code != 0 {
		t.Fatalf("one process: exit %d: %s\n%s", code, errs, out)
	}
	want, _ := rlMetrics(t, filepath.Join(dir, "one.jsonl"))
	m1, _, err := train.LoadModel(one)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		extra []string
	}{{"dp2", nil}, {"dp2-distopt", []string{"--use-distributed-optimizer"}},
		// Megatron's separate inference layout: both ranks generate
		// both ranks' rollouts at TP=2 from slices of their weights
		{"dp2-inference-tp2", []string{"--rl-inference-tensor-model-parallel-size", "2"}}} {
		ck := filepath.Join(dir, c.name)
		metrics := filepath.Join(dir, c.name+".jsonl")
		cmd := exec.Command(bin, append([]string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--"},
			with(with(base, c.extra...), "--metrics-file", metrics, "--save", ck, "--save-interval", "4")...)...)
		cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: gotron launch --nproc-per-node 2 -- train --perform-rl-step: %v\n%s", c.name, err, out)
		}
		if n := strings.Count(string(out), "rl: collection 1:"); n != 1 {
			t.Errorf("%s: %d lines for collection 1, want 1 (the logging rank's):\n%s", c.name, n, out)
		}
		if layout := strings.Contains(string(out), "separate inference layout: groups of 2"); layout != (c.name == "dp2-inference-tp2") {
			t.Errorf("%s: the line on the separate inference layout printed: %v:\n%s", c.name, layout, out)
		}
		if c.name == "dp2-inference-tp2" {
			// the rollouts came from TP=2 shards, refit before each collection
			refits := regexp.MustCompile(`refit for collection \d+: this rank's inference shards hold (\d+) of the model's (\d+) parameters`).FindAllStringSubmatch(string(out), -1)
			if len(refits) != 2 {
				t.Errorf("%s: %d refit lines, want one per collection (2):\n%s", c.name, len(refits), out)
			}
			for _, m := range refits {
				shard, _ := strconv.Atoi(m[1])
				whole, _ := strconv.Atoi(m[2])
				if !(shard > whole/2 && shard < whole) { // halves, plus the replicated norms and biases
					t.Errorf("%s: an inference shard of %d of %d parameters, want a TP=2 slice", c.name, shard, whole)
				}
			}
		}
		got, _ := rlMetrics(t, metrics)
		sameLosses(t, c.name, got, want)
		m2, _, err := train.LoadModel(ck)
		if err != nil {
			t.Fatal(err)
		}
		worst := 0.0
		for i, p := range m1.Params() {
			a, b := p.Float32s(), m2.Params()[i].Float32s()
			for j := range a {
				worst = max(worst, math.Abs(float64(a[j])-float64(b[j])))
			}
		}
		if worst > 1e-5 {
			t.Errorf("%s: weights differ from one process's by up to %g", c.name, worst)
		}
		t.Logf("%s: losses %v (one process %v), weights within %g", c.name, got, want, worst)
	}
}

// TestGRPOTrainTensorParallel: --perform-rl-step at TP=2 over two worker
// processes on tcp: the rollouts are generated by the two ranks' shards in
// lockstep (infer.Lockstep) and the log-probabilities computed over the
// gathered vocabulary; the run logs one process's losses and ends at its
// weights (float tolerance: the shards' partial sums).
func TestGRPOTrainTensorParallel(t *testing.T) {
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	env, tok := rlFixture(t, dir)
	base := with(tinyGRPO(env, tok), "--grpo-prompts-per-step", "4", "--micro-batch-size", "1", "--train-iters", "4",
		"--hidden-dropout", "0", "--attention-dropout", "0", "--grpo-kl-beta", "0.1")
	one := filepath.Join(dir, "one")
	if out, errs, code := runCLI(t, with(base, "--metrics-file", filepath.Join(dir, "one.jsonl"), "--save", one, "--save-interval", "4")...); code != 0 {
		t.Fatalf("one process: exit %d: %s\n%s", code, errs, out)
	}
	want, _ := rlMetrics(t, filepath.Join(dir, "one.jsonl"))
	m1, _, err := train.LoadModel(one)
	if err != nil {
		t.Fatal(err)
	}
	ck, metrics := filepath.Join(dir, "tp2"), filepath.Join(dir, "tp2.jsonl")
	cmd := exec.Command(bin, append([]string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--"},
		with(base, "--tensor-model-parallel-size", "2", "--metrics-file", metrics, "--save", ck, "--save-interval", "4")...)...)
	cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gotron launch --nproc-per-node 2 -- train --perform-rl-step --tensor-model-parallel-size 2: %v\n%s", err, out)
	}
	got, _ := rlMetrics(t, metrics)
	sameLosses(t, "tp2", got, want)
	m2, _, err := train.LoadModel(ck)
	if err != nil {
		t.Fatal(err)
	}
	worst := 0.0
	for i, p := range m1.Params() {
		a, b := p.Float32s(), m2.Params()[i].Float32s()
		for j := range a {
			worst = max(worst, math.Abs(float64(a[j])-float64(b[j])))
		}
	}
	if worst > 1e-5 {
		t.Errorf("tp2: weights differ from one process's by up to %g", worst)
	}
	t.Logf("tp2: losses %v (one process %v), weights within %g", got, want, worst)
}

// TestGRPOTrainPackedParallel: packed GRPO over worker processes on tcp
// (gotron launch), data-parallel (DP=2) and data- and tensor-parallel
// (DP=2 × TP=2). Every rank packs all the rollouts as one process does and
// runs the bins Megatron's fifo split deals it; with
// --calculate-per-token-loss the ranks' sums of token losses and gradients
// are then one process's packed run's. With two bins (eight rollouts) the
// runs log one process's packed loss and gradient norm and end at its
// weights (float tolerance), and so the unpacked run's loss and norm times
// (tokens + e) / (tokens + b), e the rollouts and b the bins without a
// loss token (train_rl.loss_func counts each as one token; here the
// shortest rollouts, ended at once, share the last bin). With one bin
// (four rollouts) rank 1 runs an empty bin, which counts one token too:
// the loss and norm are one process's times tokens / (tokens + 1). Without
// --calculate-per-token-loss (each bin's loss its token mean, averaged
// over the micro-batches and the ranks, Megatron's default) two bins over
// two ranks give one process's numbers too. The consumed count is the
// sequences in both ranks' bins.
func TestGRPOTrainPackedParallel(t *testing.T) {
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	base, run := packableGRPO(t, dir)
	base = with(base, "--train-iters", "1", "--grpo-kl-beta", "0.1")
	for _, sc := range []struct {
		name, id        string
		prompts, bins   int
		empty           int
		layouts         []string
		compareUnpacked bool
		meanPerBin      bool // without --calculate-per-token-loss
	}{
		{name: "two bins", id: "4", prompts: 4, bins: 2, empty: 0, layouts: []string{"dp2", "dp2tp2"}, compareUnpacked: true},
		{name: "one bin", id: "2", prompts: 2, bins: 1, empty: 1, layouts: []string{"dp2"}},
		// Megatron's default normalization: each bin's loss is the mean over
		// its tokens, averaged over the micro-batches and the ranks.
		{name: "two bins, mean per bin", id: "4m", prompts: 4, bins: 2, empty: 0, layouts: []string{"dp2"}, meanPerBin: true},
	} {
		rollouts := 2 * sc.prompts
		b := with(base, "--grpo-prompts-per-step", strconv.Itoa(sc.prompts), "--global-batch-size", strconv.Itoa(rollouts))
		if sc.meanPerBin {
			b = slices.DeleteFunc(b, func(a string) bool { return a == "--calculate-per-token-loss" })
		}
		packed := with(b, "--rl-use-sequence-packing")
		one := filepath.Join(dir, "one"+sc.id)
		pout := run("packed"+sc.id, with(packed, "--save", one)...)
		if want := fmt.Sprintf("rl: collection 0: %d rollouts packed into %d bins, %d bins per iteration\n", rollouts, sc.bins, sc.bins); !strings.Contains(pout, want) {
			t.Fatalf("%s: the one-process packed run's output lacks %q (the fixture changed?):\n%s", sc.name, want, pout)
		}
		pl, pn := rlMetrics(t, filepath.Join(dir, "packed"+sc.id+".jsonl"))
		tokens := loggedLossTokens(t, pout)
		if sc.compareUnpacked {
			run("unpacked"+sc.id, b...)
			ul, un := rlMetrics(t, filepath.Join(dir, "unpacked"+sc.id+".jsonl"))
			eu, ep := -1, -1
			for u := 0; u <= rollouts; u++ {
				for p := 0; p <= sc.bins; p++ {
					r := float64(tokens+u) / float64(tokens+p)
					if math.Abs(pl[0]-ul[0]*r) <= 1e-6*math.Abs(pl[0]) && math.Abs(pn[0]-un[0]*r) <= 1e-4*pn[0] {
						eu, ep = u, p
					}
				}
			}
			if eu < 0 {
				t.Fatalf("%s: one process: packed loss %.9g norm %.9g, unpacked %.9g %.9g over %d tokens: want the unpacked times (%d + e)/(%d + b), e rollouts and b bins without a loss token", sc.name, pl[0], pn[0], ul[0], un[0], tokens, tokens, tokens)
			}
			t.Logf("%s: one process: packed loss %.9g norm %.9g = unpacked %.9g %.9g × (%d + %d)/(%d + %d)", sc.name, pl[0], pn[0], ul[0], un[0], tokens, eu, tokens, ep)
		}
		m1, _, err := train.LoadModel(one)
		if err != nil {
			t.Fatal(err)
		}
		scale := float64(tokens) / float64(tokens+sc.empty)
		for _, layout := range sc.layouts {
			nproc, extra := 2, []string(nil)
			if layout == "dp2tp2" {
				nproc, extra = 4, []string{"--tensor-model-parallel-size", "2"}
			}
			name := layout + "-" + sc.id
			ck, metrics := filepath.Join(dir, name), filepath.Join(dir, name+".jsonl")
			cmd := exec.Command(bin, append([]string{"launch", "--nproc-per-node", strconv.Itoa(nproc), "--master-port", freeTCPPort(t), "--"},
				with(with(packed, extra...), "--metrics-file", metrics, "--save", ck)...)...)
			cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: gotron launch --nproc-per-node %d -- train --perform-rl-step --rl-use-sequence-packing: %v\n%s", name, nproc, err, out)
			}
			for _, want := range []string{
				fmt.Sprintf("rl: collection 0: %d rollouts packed into %d bins, 1 bins per iteration on each of 2 data-parallel ranks (fifo: 1 bins per rank, %d empty in all)", rollouts, sc.bins, sc.empty),
				fmt.Sprintf("consumed samples: %12d | consumed bins: %12d |", rollouts, 2),
				"| global batch size:     2 |",
			} {
				if !strings.Contains(string(out), want) {
					t.Errorf("%s: output lacks %q:\n%s", name, want, out)
				}
			}
			dl, dn := rlMetrics(t, metrics)
			if len(dl) != 1 || math.Abs(dl[0]-pl[0]*scale) > 1e-5*math.Abs(pl[0]) || math.Abs(dn[0]-pn[0]*scale) > 1e-4*pn[0] {
				t.Errorf("%s: loss %v norm %v; want one process's packed %.9g and %.9g times %d/%d", name, dl, dn, pl[0], pn[0], tokens, tokens+sc.empty)
			}
			m2, _, err := train.LoadModel(ck)
			if err != nil {
				t.Fatal(err)
			}
			worst := 0.0
			for i, p := range m1.Params() {
				a, b := p.Float32s(), m2.Params()[i].Float32s()
				for j := range a {
					worst = max(worst, math.Abs(float64(a[j])-float64(b[j])))
				}
			}
			if sc.empty == 0 && worst > 1e-5 {
				t.Errorf("%s: weights differ from one process's by up to %g", name, worst)
			}
			t.Logf("%s: loss %.9g norm %.9g (one process %.9g %.9g, × %d/%d); weights within %g of one process's", name, dl[0], dn[0], pl[0], pn[0], tokens, tokens+sc.empty, worst)
		}
	}
}

// loggedLossTokens is the loss tokens of the first collection a run logged.
func loggedLossTokens(t *testing.T, out string) int {
	t.Helper()
	i := strings.Index(out, " generated loss tokens")
	if i < 0 {
		t.Fatalf("no loss token count in the output:\n%s", out)
	}
	var tokens int
	if _, err := fmt.Sscan(out[strings.LastIndex(out[:i], " ")+1:i], &tokens); err != nil || tokens <= 0 {
		t.Fatalf("loss token count %q: %v", out[strings.LastIndex(out[:i], " ")+1:i], err)
	}
	return tokens
}
