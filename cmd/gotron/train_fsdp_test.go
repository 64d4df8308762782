package main

import (
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
