package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFP8Inference: gotron inference with Megatron's FP8 inference
// arguments (--bf16 --fp8-format hybrid --fp8-recipe tensorwise
// --fp8-param-gather) decodes with FP8 linear layers: the prompt's
// log-probabilities are close to the bf16 run's (0.05) and not equal;
// with --first-last-layers-bf16 over both layers of the model they are
// the bf16 run's exactly; gotron generate with the same FP8 flags draws
// the same greedy tokens; over two pipeline stages the log-probabilities
// are the one process's, over two tensor-parallel ranks close to them;
// the delayed recipe is refused.
func TestFP8Inference(t *testing.T) {
	dir, tokFlags := inferenceCheckpoint(t)
	prompt := "Time travel to 2008, and go to a bar"
	type result struct {
		Text     string    `json:"generated_text"`
		PromptLP []float64 `json:"prompt_logprobs"`
	}
	run := func(name string, extra ...string) result {
		t.Helper()
		out := filepath.Join(t.TempDir(), name+".json")
		var launch []string
		if j := strings.Join(extra, " "); strings.Contains(j, "--pipeline-model-parallel-size 2") || strings.Contains(j, "--tensor-model-parallel-size 2") {
			launch = []string{"launch", "--inproc", "--nproc-per-node", "2", "--"}
		}
		args := append(launch, "inference", "--load", dir, "--bf16", "--top_k", "1", "--return-log-probs", "--num-tokens-to-generate", "8",
			"--termination-id", "-1", "--output-path", out, "--prompts", prompt)
		args = append(args, tokFlags...)
		if _, errs, code := runCLI(t, append(args, extra...)...); code != 0 {
			t.Fatalf("%s: exit %d: %s", name, code, errs)
		}
		raw, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]json.RawMessage
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		var r result
		if err := json.Unmarshal(doc["0"], &r); err != nil {
			t.Fatal(err)
		}
		if len(r.PromptLP) == 0 {
			t.Fatalf("%s: no prompt log-probabilities", name)
		}
		return r
	}
	fp8 := []string{"--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather"}
	bf16 := run("bf16")
	got := run("fp8", fp8...)
	same := true
	for i, lp := range got.PromptLP {
		if math.Abs(lp-bf16.PromptLP[i]) > 0.05 {
			t.Errorf("prompt token %d: log-probability %.5f with FP8, %.5f in bf16", i+1, lp, bf16.PromptLP[i])
		}
		same = same && lp == bf16.PromptLP[i]
	}
	if same {
		t.Error("FP8 log-probabilities equal bf16's bit for bit: nothing was quantized")
	}
	kept := run("kept", append(fp8, "--first-last-layers-bf16")...)
	for i, lp := range kept.PromptLP {
		if lp != bf16.PromptLP[i] {
			t.Fatalf("both layers kept in bf16: prompt token %d: %v, bf16 run %v", i+1, lp, bf16.PromptLP[i])
		}
	}
	out, errs, code := runCLI(t, append(append([]string{"generate", "--load", dir, "--bf16", "--prompt", prompt, "--max-new-tokens", "8", "--top-k", "1"}, tokFlags...), fp8...)...)
	if code != 0 {
		t.Fatalf("generate: %s", errs)
	}
	if g := strings.TrimSuffix(strings.TrimPrefix(out, prompt), "\n"); g != got.Text {
		t.Errorf("generate with FP8 continued with %q, inference with %q", g, got.Text)
	}
	// over two pipeline stages: each stage's layers quantize as the whole model's
	pp := run("pp2", append(fp8, "--pipeline-model-parallel-size", "2")...)
	for i, lp := range pp.PromptLP {
		if math.Abs(lp-got.PromptLP[i]) > 1e-5 {
			t.Fatalf("FP8 over 2 pipeline stages: prompt token %d: log-probability %v, one process %v", i+1, lp, got.PromptLP[i])
		}
	}
	// over two tensor-parallel ranks: FP8 (each weight shard scaled by its
	// own amax, as TE), close to the one process's
	var apart float64 // from the bf16 run's: a tensor-parallel split alone moves them ~1e-6
	for i, lp := range run("tp2", append(fp8, "--tensor-model-parallel-size", "2")...).PromptLP {
		if math.Abs(lp-got.PromptLP[i]) > 0.05 {
			t.Errorf("FP8 over 2 tensor-parallel ranks: prompt token %d: log-probability %v, one process %v", i+1, lp, got.PromptLP[i])
		}
		apart = max(apart, math.Abs(lp-bf16.PromptLP[i]))
	}
	if apart < 1e-4 {
		t.Errorf("FP8 over 2 tensor-parallel ranks: within %g of the bf16 log-probabilities: nothing was quantized", apart)
	}
	_, errs, code = runCLI(t, append(append([]string{"generate", "--load", dir, "--prompt", prompt}, tokFlags...), "--fp8-format", "hybrid")...)
	if code == 0 || !strings.Contains(errs, "--fp8-recipe delayed at inference") {
		t.Errorf("delayed recipe at inference: exit %d, %s", code, errs)
	}
}
