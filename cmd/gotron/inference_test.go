package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gotron/gotron/infer"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
	"github.com/gotron/gotron/tokenizer"
	"github.com/gotron/gotron/train"
)

// inferenceCheckpoint saves a tiny model with GPT-2's padded vocabulary
// and exports GPT-2's tokenizer files; it returns the checkpoint and the
// tokenizer flags.
func inferenceCheckpoint(t *testing.T) (dir string, tokFlags []string) {
	t.Helper()
	m, err := gpt.New(gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, VocabSize: 50304,
		MaxPositionEmbeddings: 128, Activation: gpt.GELUTanh}, tensor.NewRNG(5))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	dir = filepath.Join(root, "ck")
	if err := train.SaveModel(context.Background(), dir, 0, m, 128, nil); err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(root, "gpt2")
	if _, errs, code := runCLI(t, "tokenizer", "export-gpt2", tok); code != 0 {
		t.Fatalf("tokenizer export-gpt2: %s", errs)
	}
	return dir, []string{"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", filepath.Join(tok, "vocab.json"), "--merge-file", filepath.Join(tok, "merges.txt")}
}

// TestInferenceGreedyEqualsGenerate: Megatron's dynamic-inference arguments
// (greedy: --top_k 1) give the tokens gotron generate gives, the output JSON
// has gpt_dynamic_inference.py's keys in its order and layout, and the
// log-probabilities are the engine's (prompt and generated).
func TestInferenceGreedyEqualsGenerate(t *testing.T) {
	dir, tokFlags := inferenceCheckpoint(t)
	prompt := "Time travel to 2008, and go to a bar"
	out, errs, code := runCLI(t, append([]string{"generate", "--load", dir, "--prompt", prompt, "--max-new-tokens", "12", "--top-k", "1"}, tokFlags...)...)
	if code != 0 {
		t.Fatalf("generate: %s", errs)
	}
	want := strings.TrimSuffix(strings.TrimPrefix(out, prompt), "\n")

	outPath := filepath.Join(t.TempDir(), "out.json")
	args := append([]string{"inference", "--load", dir, "--use-checkpoint-args", "--num-layers", "24", "--micro-batch-size", "1",
		"--log-num-zeros-in-grad", "--transformer-impl", "transformer_engine", "--enable-cuda-graph",
		"--temperature", "1.0", "--top_k", "1", "--return-log-probs", "--num-tokens-to-generate", "12",
		"--termination-id", "-1", "--inference-dynamic-batching-buffer-size-gb", "20", "--inference-repeat-n", "2",
		"--output-path", outPath, "--prompts", prompt, "the quick brown fox", "--incoming-requests-per-sec", "-1"}, tokFlags...)
	so, errs, code := runCLI(t, args...)
	if code != 0 {
		t.Fatalf("inference: %s", errs)
	}
	for _, line := range []string{"--use-checkpoint-args: the checkpoint's model arguments replace --num-layers 24 (checkpoint: 2)",
		"training arguments accepted and unused, as Megatron's inference scripts do (their parser is pretrain's): --log-num-zeros-in-grad --micro-batch-size",
		"--transformer-impl", "--enable-cuda-graph: no effect in gotron"} {
		if !strings.Contains(errs, line) {
			t.Errorf("stderr lacks %q:\n%s", line, errs)
		}
	}
	if !strings.Contains(so, prompt+want) {
		t.Errorf("inference printed %q, generate continued with %q", so, want)
	}
	raw, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(raw), "{\n \"0\": {\n  \"input_prompt\": ") {
		t.Errorf("not json.dump(indent=1)'s layout: %.60q", raw)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("output JSON: %v\n%s", err, raw)
	}
	for _, k := range []string{"0", "1", "throughput", "mem-max-allocated-bytes", "lifetime_prefill_token_count", "async_sched_step_count", "async_sched_compaction_step_count"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("output JSON lacks %q", k)
		}
	}
	var thr []float64
	_ = json.Unmarshal(doc["throughput"], &thr)
	if len(thr) != 2 {
		t.Errorf("throughput %v: want one per --inference-repeat-n run (2)", thr)
	}
	keys := []string{"input_prompt", "generated_text", "generated_tokens", "latency", "ttft", "cuda_graph_request_count_map",
		"step_count", "top_n_logprobs", "prompt_top_n_logprobs", "prompt_logprobs", "generated_logprobs", "logprobs"}
	var prev int
	for _, k := range keys {
		i := strings.Index(string(raw), "\""+k+"\"")
		if i < prev {
			t.Errorf("key %q missing or out of the script's order", k)
		}
		prev = i
	}
	var r0 struct {
		InputPrompt     string    `json:"input_prompt"`
		GeneratedText   string    `json:"generated_text"`
		GeneratedTokens []int     `json:"generated_tokens"`
		PromptLogprobs  []float64 `json:"prompt_logprobs"`
		GeneratedLP     []float64 `json:"generated_logprobs"`
		Logprobs        []float64 `json:"logprobs"`
	}
	if err := json.Unmarshal(doc["0"], &r0); err != nil {
		t.Fatal(err)
	}
	if r0.InputPrompt != prompt || r0.GeneratedText != want || len(r0.GeneratedTokens) != 12 {
		t.Errorf("request 0: %q -> %q (%d tokens); generate gave %q", r0.InputPrompt, r0.GeneratedText, len(r0.GeneratedTokens), want)
	}

	// The engine's log-probabilities for the same request.
	m, _, err := train.LoadModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.New(tokenizer.Config{Type: tokenizer.TypeGPT2BPE, VocabFile: tokFlags[3], MergeFile: tokFlags[5]})
	if err != nil {
		t.Fatal(err)
	}
	eng, err := infer.NewEngine(m, infer.EngineConfig{VocabSize: tok.VocabSize(), DisablePrefixCaching: true})
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(prompt)
	p := make([]int32, len(ids))
	for i, id := range ids {
		p[i] = int32(id)
	}
	if _, err := eng.Add(infer.Request{Prompt: p, MaxTokens: 12, Sampling: infer.Sampling{TopK: 1}, Logprobs: true, PromptLogprobs: true}); err != nil {
		t.Fatal(err)
	}
	var promptLP, genLP []float64
	var gen []int
	for eng.HasWork() {
		evs, err := eng.Step()
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			for _, x := range ev.PromptLogprobs {
				promptLP = append(promptLP, float64(x))
			}
			if ev.Token >= 0 {
				gen, genLP = append(gen, ev.Token), append(genLP, float64(ev.Logprob))
			}
		}
	}
	if !equalFloats(r0.PromptLogprobs, promptLP) || !equalFloats(r0.GeneratedLP, genLP) || !equalFloats(r0.Logprobs, append(promptLP, genLP...)) {
		t.Errorf("log-probabilities differ from the engine's:\nprompt %v\n  want %v\ngenerated %v\n  want %v", r0.PromptLogprobs, promptLP, r0.GeneratedLP, genLP)
	}
	if len(r0.PromptLogprobs) != len(ids)-1 {
		t.Errorf("%d prompt log-probabilities for a %d-token prompt: want %d", len(r0.PromptLogprobs), len(ids), len(ids)-1)
	}
	for i := range gen {
		if gen[i] != r0.GeneratedTokens[i] {
			t.Fatalf("generated tokens %v, the engine's %v", r0.GeneratedTokens, gen)
		}
	}
}

func equalFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if float32(a[i]) != float32(b[i]) {
			return false
		}
	}
	return true
}

// TestInferenceStaticLayoutStopWordsPromptFile: --use-legacy-static-engine
// writes gpt_static_inference.py's layout (json.dump without indent); the
// prompt file's first --prompt-file-num-truncate lines are the prompts;
// --output-every-n-results keeps every n-th and the last; a stop word ends
// generation with its tokens dropped.
func TestInferenceStaticLayoutStopWordsPromptFile(t *testing.T) {
	dir, tokFlags := inferenceCheckpoint(t)
	tmp := t.TempDir()
	pf := filepath.Join(tmp, "prompts.jsonl")
	var lines []string
	for _, p := range []string{"one two", "three four", "five six", "seven eight", "nine"} {
		b, _ := json.Marshal(map[string]any{"text": p, "other": 1})
		lines = append(lines, string(b))
	}
	if err := os.WriteFile(pf, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(extra ...string) map[string]json.RawMessage {
		t.Helper()
		out := filepath.Join(tmp, "o.json")
		args := append(append([]string{"inference", "--load", dir, "--prompt-file", pf, "--prompt-file-num-truncate", "4",
			"--num-tokens-to-generate", "8", "--termination-id", "-1", "--output-path", out, "--incoming-requests-per-step", "2"}, tokFlags...), extra...)
		_, errs, code := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("inference %v: %s", extra, errs)
		}
		raw, _ := os.ReadFile(out)
		var doc map[string]json.RawMessage
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatalf("%v\n%s", err, raw)
		}
		doc["raw"] = raw
		return doc
	}
	static := run("--use-legacy-static-engine", "--return-log-probs")
	if !strings.HasPrefix(string(static["raw"]), `{"0": {"input_prompt": "one two", "generated_text": `) {
		t.Errorf("not gpt_static_inference.py's json.dump layout: %.80s", static["raw"])
	}
	if len(static) != 5 || static["3"] == nil || !strings.Contains(string(static["0"]), `"tpot": [`) {
		t.Errorf("static: want requests 0..3 with tpot: %s", static["raw"])
	}
	var l0, l3 struct {
		Latency float64 `json:"latency"`
	}
	_ = json.Unmarshal(static["0"], &l0)
	_ = json.Unmarshal(static["3"], &l3)
	if l0.Latency <= 0 || l0.Latency != l3.Latency {
		t.Errorf("static latency %v and %v: want the one run's time in every request, as the script", l0.Latency, l3.Latency)
	}
	every := run("--output-every-n-results", "3")
	if every["0"] == nil || every["3"] == nil || every["1"] != nil || every["2"] != nil {
		t.Errorf("--output-every-n-results 3 of 4: want 0 and 3 (the last): %s", every["raw"])
	}
	// A stop word: the greedy continuation of request 0, cut where its
	// second generated token's text is (as a word of its own).
	var r struct {
		Tokens []int  `json:"generated_tokens"`
		Text   string `json:"generated_text"`
	}
	_ = json.Unmarshal(every["0"], &r)
	tok, _ := tokenizer.New(tokenizer.Config{Type: tokenizer.TypeGPT2BPE, VocabFile: tokFlags[3], MergeFile: tokFlags[5]})
	word := tok.Decode(r.Tokens[2:3])
	if len(tok.Encode(word)) != 1 {
		t.Skipf("token %q does not encode back to itself", word)
	}
	stopped := run("--stop-words", word, "zzzz")
	var s struct {
		Tokens []int  `json:"generated_tokens"`
		Text   string `json:"generated_text"`
	}
	_ = json.Unmarshal(stopped["0"], &s)
	k := 0 // the stop word's first occurrence
	for r.Tokens[k] != r.Tokens[2] {
		k++
	}
	if len(s.Tokens) != k || s.Text != tok.Decode(r.Tokens[:k]) {
		t.Errorf("--stop-words %q: got %v %q, want the %d tokens before it (%v)", word, s.Tokens, s.Text, k, r.Tokens[:k])
	}
}

// TestInferenceRefusals: what gotron inference cannot do is refused naming
// the feature; bad values name the flag.
func TestInferenceRefusals(t *testing.T) {
	dir, tokFlags := inferenceCheckpoint(t)
	base := append([]string{"inference", "--load", dir, "--prompts", "hi"}, tokFlags...)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--pipeline-model-parallel-size", "8"}, "--pipeline-model-parallel-size 8 needs 8 ranks: start them with gotron launch"},
		{[]string{"--context-parallel-size", "2"}, "--context-parallel-size 2: needs context-parallel inference, not built"},
		{[]string{"--fp8-format", "hybrid"}, "--fp8-recipe delayed at inference: not built"},
		{[]string{"--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"}, "--fp8-recipe mxfp8: needs TE's MXFP8BlockScaling recipe"},
		{[]string{"--top_k", "2", "--top_p", "0.5"}, "cannot both be greater than zero"},
		{[]string{"--num-tokens-to-generate", "-1"}, "--num-tokens-to-generate"},
		{[]string{"--prompt-file", "x.jsonl"}, "--prompts and --prompt-file"},
		{[]string{"--num-layers", "3"}, "--num-layers 3: the checkpoint"},
		{[]string{"--inference-max-seq-length", "2"}, "exceed --inference-max-seq-length 2"},
		{[]string{"--use-mup"}, "--use-mup: needs decoding with muP's attention scale"},
	} {
		_, errs, code := runCLI(t, append(append([]string{}, base...), c.args...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", c.args, code, errs, c.want)
		}
	}
}

// TestInferenceTopNLogprobs: --top-n-logprobs writes one {token text:
// logprob} dict per generated token (greedy: the first is the generated
// token with its log-probability) and, without --skip-prompt-log-probs, one
// per prompt token after the first (Megatron's prompt_top_n_logprobs).
func TestInferenceTopNLogprobs(t *testing.T) {
	dir, tokFlags := inferenceCheckpoint(t)
	out := filepath.Join(t.TempDir(), "o.json")
	prompt := "Time travel to 2008"
	run := func(extra ...string) (r struct {
		Tokens    []int                `json:"generated_tokens"`
		GenLP     []float64            `json:"generated_logprobs"`
		Top       []map[string]float64 `json:"top_n_logprobs"`
		PromptTop []map[string]float64 `json:"prompt_top_n_logprobs"`
	}) {
		t.Helper()
		args := append(append([]string{"inference", "--load", dir, "--prompts", prompt, "--num-tokens-to-generate", "5", "--termination-id", "-1",
			"--return-log-probs", "--top-n-logprobs", "3", "--output-path", out}, tokFlags...), extra...)
		if _, errs, code := runCLI(t, args...); code != 0 {
			t.Fatalf("inference: %s", errs)
		}
		raw, _ := os.ReadFile(out)
		var doc map[string]json.RawMessage
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(doc["0"], &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := run()
	tok, _ := tokenizer.New(tokenizer.Config{Type: tokenizer.TypeGPT2BPE, VocabFile: tokFlags[3], MergeFile: tokFlags[5]})
	if len(r.Top) != 5 || len(r.PromptTop) != len(tok.Encode(prompt))-1 {
		t.Fatalf("%d generated and %d prompt top-n entries: want 5 and %d", len(r.Top), len(r.PromptTop), len(tok.Encode(prompt))-1)
	}
	for i, d := range r.Top {
		lp, ok := d[tok.Decode(r.Tokens[i:i+1])]
		if len(d) == 0 || len(d) > 3 || !ok || float32(lp) != float32(r.GenLP[i]) {
			t.Errorf("step %d: top-n %v lacks the greedy token %d with its logprob %v", i, d, r.Tokens[i], r.GenLP[i])
		}
	}
	if s := run("--skip-prompt-log-probs"); s.PromptTop != nil || len(s.Top) != 5 {
		t.Errorf("--skip-prompt-log-probs: prompt top-n %v, want null", s.PromptTop)
	}
}

// TestInferenceCoordinatorOneReplica: --use-coordinator with one process
// runs (one line says every request goes to its one engine); a launcher's
// world of several ranks is refused, naming data-parallel replicas.
func TestInferenceCoordinatorOneReplica(t *testing.T) {
	dir, tokFlags := inferenceCheckpoint(t)
	args := append([]string{"inference", "--load", dir, "--prompts", "hi", "--num-tokens-to-generate", "2", "--use-coordinator"}, tokFlags...)
	_, errs, code := runCLI(t, args...)
	if code != 0 || !strings.Contains(errs, "--use-coordinator: one engine replica") {
		t.Errorf("exit %d: %s", code, errs)
	}
	var out, eb strings.Builder
	env := &cli{stdout: &out, stderr: &eb, stdin: strings.NewReader(""), getenv: func(k string) string {
		if k == "WORLD_SIZE" {
			return "8"
		}
		return ""
	}}
	if code := run(context.Background(), env, args); code == 0 || !strings.Contains(eb.String(), "needs data-parallel inference replicas") {
		t.Errorf("WORLD_SIZE=8: exit %d, stderr %q", code, eb.String())
	}
}

// TestInferenceArrivalRate: requests arriving at --incoming-requests-per-sec
// (Megatron's Poisson arrivals) all finish, each with its own result; the
// synthetic-request arguments say they have no effect with --prompts.
func TestInferenceArrivalRate(t *testing.T) {
	dir, tokFlags := inferenceCheckpoint(t)
	out := filepath.Join(t.TempDir(), "o.json")
	args := append([]string{"inference", "--load", dir, "--prompts", "one", "two three", "four", "--num-tokens-to-generate", "3",
		"--incoming-requests-per-sec", "20", "--num-tokens-to-prompt", "8", "16", "--output-path", out}, tokFlags...)
	_, errs, code := runCLI(t, args...)
	if code != 0 || !strings.Contains(errs, "--num-tokens-to-prompt: no effect with --prompts") {
		t.Fatalf("exit %d: %s", code, errs)
	}
	raw, _ := os.ReadFile(out)
	var doc map[string]struct {
		Prompt string `json:"input_prompt"`
		Tokens []int  `json:"generated_tokens"`
	}
	_ = json.Unmarshal(raw, &doc)
	for i, p := range []string{"one", "two three", "four"} {
		if r := doc[strconv.Itoa(i)]; r.Prompt != p || len(r.Tokens) == 0 {
			t.Errorf("request %d: %+v, want prompt %q with tokens", i, r, p)
		}
	}
}

// TestInferenceHelp: --help lists the inference scripts' arguments first,
// under Megatron's group for them, then train's groups.
func TestInferenceHelp(t *testing.T) {
	out, _, code := runCLI(t, "inference", "--help")
	i := strings.Index(out, "Megatron: inference scripts (add_inference_args and the scripts' own):\n")
	j := strings.Index(out, "\n  --top_k int\n")
	k := strings.Index(out, "Megatron: transformer configuration:")
	if code != 0 || i < 0 || j < i || k < j {
		t.Errorf("--help: the inference group first, --top_k in it, then train's groups:\n%.600s", out)
	}
}
