package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func runBenchServe(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	env := &cli{stdout: &out, stderr: &out, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
	err := benchServe(context.Background(), env, args)
	return out.String(), err
}

// TestBenchServe runs the load test small: 20 concurrent streaming clients
// on a Llama-style model (GQA, RoPE) with a KV pool too small for all of
// them (so the youngest are preempted and recomputed) and a shared prompt
// prefix (so the prefix cache is hit). Every output must equal its output
// alone, and blocks and goroutines must be back after.
func TestBenchServe(t *testing.T) {
	out, err := runBenchServe(t, "--preset", "llama-tiny", "--clients", "20", "--prompt-tokens", "12", "--max-tokens", "10",
		"--shared-prefix-tokens", "8", "--block-size", "4", "--kv-cache-bytes", "256KiB", "--timeout", "60s", "--bandwidth-bound")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// The bounds are measured after the timed run, which they would disturb.
	if a, b := strings.Index(out, "after: 0 KV blocks used"), strings.Index(out, "bandwidth bound: "); a < 0 || b < a || !strings.Contains(out[b:], "compute bound: FMA peak") {
		t.Errorf("want the bandwidth and compute bounds after the run's report:\n%s", out)
	}
	for _, want := range []string{"requests: 20 completed, 0 failed; outputs: 20 of 20 equal their alone output",
		"after: 0 KV blocks used", "time to first token: p50", "tokens/s"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, " 0 preemptions") || strings.Contains(out, " 0 prompt tokens from the prefix cache") {
		t.Errorf("want preemptions and prefix-cache hits:\n%s", out)
	}
	t.Log(out)
	if _, err := runBenchServe(t, "--clients", "0"); err == nil || !strings.Contains(err.Error(), "--clients 0") {
		t.Errorf("--clients 0: %v", err)
	}
}
