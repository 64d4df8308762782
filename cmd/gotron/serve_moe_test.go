package main

import (
	"encoding/json"
	"path/filepath"
	"testing"
)

// TestServeAndGenerateMoE: a trained Mixtral-style checkpoint (4 experts,
// top-2, grouped GEMM) generates with gotron generate, and gotron serve's
// greedy completions — two requests at once, batched in the engine's steps
// — equal generate's text.
func TestServeAndGenerateMoE(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny-moe")
	_, errs, code := runCLI(t, "train", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
		"--seq-length", "16", "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "2",
		"--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
		"--num-experts", "4", "--moe-router-topk", "2", "--moe-grouped-gemm", "--moe-aux-loss-coeff", "1e-2",
		"--lr", "1e-3", "--mock-data", "--vocab-size", "50257", "--train-iters", "1", "--eval-iters", "0",
		"--init-method-std", "0.5", "--save", dir)
	if code != 0 {
		t.Fatalf("train: %s", errs)
	}
	prompts := []string{"Once upon a time", "The capital of France is"}
	want := []string{generateText(t, dir, prompts[0], 10), generateText(t, dir, prompts[1], 10)}
	base, stop := startServe(t, "--load", dir)
	defer stop()
	body := `{"prompt":["` + prompts[0] + `","` + prompts[1] + `"],"max_tokens":10,"temperature":0}`
	code, b := postJSON(t, base+"/v1/completions", body)
	var c struct{ Choices []struct{ Text string } }
	if code != 200 || json.Unmarshal(b, &c) != nil || len(c.Choices) != 2 || c.Choices[0].Text != want[0] || c.Choices[1].Text != want[1] {
		t.Fatalf("serve: %d %s; generate printed %q", code, b, want)
	}
}
