package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestServeAndGenerateMoE: a trained Mixtral-style checkpoint (4 experts,
// top-2, grouped GEMM) generates with gotron generate, and gotron serve's
// greedy completions — two requests at once, batched in the engine's steps
// — equal generate's text; so do they over two expert-parallel ranks
// (--expert-model-parallel-size 2, gotron launch --inproc: rank 0 serves,
// each rank holds two of the experts).
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
	stop()

	addr := make(chan string, 1)
	out := &serveLog{addr: addr}
	var errb bytes.Buffer
	env := &cli{stdout: out, stderr: &errb, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, env, []string{"launch", "--inproc", "--nproc-per-node", "2", "--",
			"serve", "--load", dir, "--host", "127.0.0.1", "--port", "0", "--expert-model-parallel-size", "2"})
	}()
	select {
	case base = <-addr:
	case code := <-done:
		t.Fatalf("serve at EP=2 exited %d: %s%s", code, out, errb.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("serve at EP=2 did not start: %s%s", out, errb.String())
	}
	code, b = postJSON(t, base+"/v1/completions", body)
	c.Choices = nil
	if code != 200 || json.Unmarshal(b, &c) != nil || len(c.Choices) != 2 || c.Choices[0].Text != want[0] || c.Choices[1].Text != want[1] {
		t.Errorf("serve at EP=2: %d %s; generate printed %q", code, b, want)
	}
	cancel() // as SIGTERM to the launcher: its ranks shut down
	<-done
	if !strings.Contains(out.String(), "[rank0]: gotron serve: stopped") || !strings.Contains(errb.String(), "expert-parallel rank 1: rank 0 stopped") {
		t.Errorf("serve at EP=2 did not stop cleanly:\n%s%s", out, errb.String())
	}
}
