package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// gdnDecodeModel is a tiny hybrid model for decoding: gated delta nets at
// layers 0 and 1, output-gated GQA attention at layer 2, GPT-2's
// vocabulary (the default tokenizer), heads that TP=2 divides.
var gdnDecodeModel = []string{"--num-layers", "3", "--hidden-size", "32", "--num-attention-heads", "4",
	"--group-query-attention", "--num-query-groups", "2", "--swiglu", "--position-embedding-type", "rope",
	"--normalization", "RMSNorm", "--attention-output-gate", "--experimental-attention-variant", "gated_delta_net",
	"--linear-attention-freq", "3", "--linear-conv-kernel-dim", "4", "--linear-key-head-dim", "8", "--linear-value-head-dim", "8",
	"--linear-num-key-heads", "2", "--linear-num-value-heads", "4", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
	"--init-method-std", "0.3", "--seq-length", "16", "--max-position-embeddings", "64", "--vocab-size", "50257"}

// TestServeAndGenerateGDN: a trained hybrid gated-delta-net checkpoint
// generates with gotron generate (one process and TP=2, which prints the
// same text), gotron inference at TP=2 gives one process's tokens and
// log-probabilities within 1e-5, and gotron serve's greedy completions — two requests at once,
// batched in the engine's steps, each with its recurrent state — equal
// generate's text.
func TestServeAndGenerateGDN(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny-gdn")
	_, errs, code := runCLI(t, append(append([]string{"train"}, gdnDecodeModel...), "--micro-batch-size", "2", "--global-batch-size", "2",
		"--lr", "1e-3", "--mock-data", "--train-iters", "1", "--eval-iters", "0", "--save", dir)...)
	if code != 0 {
		t.Fatalf("train: %s", errs)
	}
	prompts := []string{"Once upon a time", "The capital of France is"}
	want := []string{generateText(t, dir, prompts[0], 12), generateText(t, dir, prompts[1], 12)}
	if want[0] == "" || want[1] == "" {
		t.Fatalf("generate printed nothing: %q", want)
	}
	gen := []string{"generate", "--load", dir, "--prompt", prompts[0], "--top-k", "1", "--max-new-tokens", "12"}
	one, errs, code := runCLI(t, gen...)
	if code != 0 {
		t.Fatalf("generate: %s", errs)
	}
	got, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "2", "--"}, append(gen, "--tensor-model-parallel-size", "2")...)...)
	if code != 0 {
		t.Fatalf("generate at TP=2: %s", errs)
	}
	if got != "[rank0]: "+one {
		t.Errorf("generate at TP=2 printed %q, one process %q", got, one)
	}
	// gotron inference (the engine, its steps batching both prompts) at
	// TP=2, lockstepped ranks each with its heads' states, as one process
	inferArgs := func(out string, tp int) []string {
		return []string{"inference", "--load", dir, "--prompts", prompts[0], prompts[1], "--num-tokens-to-generate", "12", "--top_k", "1",
			"--return-log-probs", "--termination-id", "-1", "--tensor-model-parallel-size", itoa(tp), "--output-path", out}
	}
	oneJSON, tpJSON := filepath.Join(t.TempDir(), "one.json"), filepath.Join(t.TempDir(), "tp2.json")
	if _, errs, code := runCLI(t, inferArgs(oneJSON, 1)...); code != 0 {
		t.Fatalf("inference: %s", errs)
	}
	if _, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "2", "--"}, inferArgs(tpJSON, 2)...)...); code != 0 {
		t.Fatalf("inference at TP=2: %s", errs)
	}
	compareTPResults(t, "hybrid gated delta net model at TP=2", readTPResults(t, tpJSON), readTPResults(t, oneJSON), 1e-5)
	base, stop, log := startServeLog(t, "--load", dir, "--max-num-seqs", "8")
	if !strings.Contains(log.String(), "gated delta net layers: 8 recurrent-state slots (--max-num-seqs) of 3584 bytes, 28 KiB") {
		t.Errorf("serve does not report the state slots:\n%s", log)
	}
	defer stop()
	body := `{"prompt":["` + prompts[0] + `","` + prompts[1] + `"],"max_tokens":12,"temperature":0}`
	code, b := postJSON(t, base+"/v1/completions", body)
	var c struct{ Choices []struct{ Text string } }
	if code != 200 || json.Unmarshal(b, &c) != nil || len(c.Choices) != 2 || c.Choices[0].Text != want[0] || c.Choices[1].Text != want[1] {
		t.Fatalf("serve: %d %s; generate printed %q", code, b, want)
	}
}
