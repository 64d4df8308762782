package main

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestTrainFSDPProcesses: two worker processes over tcp (gotron launch)
// with --use-megatron-fsdp (optim_grads_params) log the single process's
// losses at each of 10 iterations, and say what a rank keeps.
func TestTrainFSDPProcesses(t *testing.T) {
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	dir, prefix := preprocessToy(t)
	base := append(cpTrain(prefix, filepath.Join(dir, "cache")), llamaFlags...)
	base = with(base, "--seq-length", "32", "--max-position-embeddings", "32")
	ref := filepath.Join(dir, "one.jsonl")
	if _, errs, code := runCLI(t, with(base, "--metrics-file", ref)...); code != 0 {
		t.Fatalf("single process: exit %d: %s", code, errs)
	}
	want, _ := metricsLosses(t, ref)
	got := filepath.Join(dir, "fsdp2.jsonl")
	cmd := exec.Command(bin, append([]string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--"},
		with(base, "--metrics-file", got, "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
			"--use-distributed-optimizer", "--megatron-fsdp-main-params-dtype", "fp32", "--megatron-fsdp-main-grads-dtype", "fp32",
			"--megatron-fsdp-grad-comm-dtype", "fp32", "--ckpt-format", "fsdp_dtensor")...)...)
	cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gotron launch --nproc-per-node 2 -- train --use-megatron-fsdp: %v\n%s", err, out)
	}
	losses, _ := metricsLosses(t, got)
	sameLosses(t, "tcp DP=2 FSDP", losses, want)
	if !strings.Contains(string(out), "fully sharded data parallelism: this rank keeps") {
		t.Fatalf("no FSDP line in the output:\n%s", out)
	}
}

// TestTrainFSDPBadInput: FSDP flag combinations Megatron refuses, or gotron
// does not build, are refused before training, naming the flags.
func TestTrainFSDPBadInput(t *testing.T) {
	dir, prefix := preprocessToy(t)
	base := cpTrain(prefix, filepath.Join(dir, "cache"))
	for _, tc := range []struct {
		extra []string
		want  string
	}{
		{[]string{"--use-megatron-fsdp", "--data-parallel-sharding-strategy", "zero3"}, "--data-parallel-sharding-strategy=zero3"},
		{[]string{"--data-parallel-sharding-strategy", "optim_grads"}, "needs --use-megatron-fsdp"},
		{[]string{"--use-megatron-fsdp", "--megatron-fsdp-main-params-dtype", "bf16"}, "--megatron-fsdp-main-params-dtype=bf16"},
		{[]string{"--megatron-fsdp-grad-comm-dtype", "fp32"}, "--megatron-fsdp-grad-comm-dtype needs --use-megatron-fsdp"},
		{[]string{"--ckpt-format", "fsdp_dtensor"}, "--ckpt-format fsdp_dtensor needs --use-megatron-fsdp"},
		{[]string{"--use-torch-fsdp2"}, "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights"},
		{[]string{"--use-torch-fsdp2", "--untie-embeddings-and-output-weights", "--use-distributed-optimizer"}, "--use-distributed-optimizer"},
		{[]string{"--use-torch-fsdp2", "--untie-embeddings-and-output-weights", "--fp16"}, "--fp16"},
		{[]string{"--use-megatron-fsdp", "--use-torch-fsdp2"}, "exclude each other"},
		{[]string{"--use-megatron-fsdp", "--device", "sim"}, "--device"},
	} {
		_, errs, code := runCLI(t, with(base, tc.extra...)...)
		if code == 0 || !strings.Contains(errs, tc.want) {
			t.Fatalf("%v: exit %d, stderr %q; want a refusal containing %q", tc.extra, code, errs, tc.want)
		}
	}
}

// TestMemoryFSDP: gotron memory counts --use-megatron-fsdp as Megatron's
// formula does (the distributed optimizer: 6 + 12/DP bytes a parameter)
// and adds what gotron's FSDP keeps: 16/DP bytes a parameter with
// optim_grads_params, 4 + 12/DP with optim_grads.
func TestMemoryFSDP(t *testing.T) {
	base := []string{"memory", "--num-layers", "12", "--hidden-size", "512", "--num-attention-heads", "8", "--seq-length", "1024",
		"--micro-batch-size", "4", "--global-batch-size", "32", "--vocab-size", "50257", "--world-size", "8", "--tensor-model-parallel-size", "2"}
	plain, errs, code := runCLI(t, base...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	dist, _, _ := runCLI(t, append(base, "--use-distributed-optimizer")...)
	z3, errs, code := runCLI(t, append(base, "--use-megatron-fsdp")...)
	if code != 0 {
		t.Fatalf("--use-megatron-fsdp: exit %d: %s", code, errs)
	}
	z2, _, _ := runCLI(t, append(base, "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads")...)
	mb := func(out, prefix string) float64 {
		i := strings.Index(out, prefix)
		if i < 0 {
			t.Fatalf("no %q in:\n%s", prefix, out)
		}
		var v float64
		if _, err := fmt.Sscanf(out[i+len(prefix):], "%f", &v); err != nil {
			t.Fatalf("%q: %v", out[i:], err)
		}
		return v
	}
	const megatron, gotron = "weight and optimizer=", "keeps weight and optimizer="
	whole := mb(plain, megatron) // 18 bytes a parameter
	if got, want := mb(z3, megatron), mb(dist, megatron); got != want {
		t.Fatalf("Megatron's line under --use-megatron-fsdp: %.2f MB, want the distributed optimizer's %.2f", got, want)
	}
	for _, c := range []struct {
		out   string
		bytes float64
	}{{z3, 16.0 / 4}, {z2, 4 + 12.0/4}} {
		if got, want := mb(c.out, gotron), whole*c.bytes/18; math.Abs(got-want) > 0.01 {
			t.Fatalf("FSDP line: %.2f MB, want %.2f (%.2f bytes a parameter)", got, want, c.bytes)
		}
	}
}
