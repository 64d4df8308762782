package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// cpTrain is a run at sequence length 128 on the preprocessed toy corpus
// (a real .bin/.idx dataset), dropout off.
func cpTrain(prefix, cache string) []string {
	return []string{"train", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
		"--seq-length", "128", "--max-position-embeddings", "128", "--micro-batch-size", "2", "--global-batch-size", "4",
		"--lr", "1e-3", "--data-path", prefix, "--split", "90,10,0", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
		"--data-cache-path", cache, "--log-interval", "1", "--eval-iters", "0",
		"--hidden-dropout", "0", "--attention-dropout", "0", "--train-iters", "10"}
}

// llamaFlags make cpTrain's model Llama-style: RoPE, GQA, RMSNorm, SwiGLU.
var llamaFlags = []string{"--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
	"--group-query-attention", "--num-query-groups", "2", "--disable-bias-linear", "--untie-embeddings-and-output-weights"}

// TestTrainContextParallelProcesses: two worker processes over tcp
// (gotron launch) with --context-parallel-size 2 (p2p ring attention) log
// the single-process losses, for the GPT-2-style and the Llama-style model.
func TestTrainContextParallelProcesses(t *testing.T) {
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	dir, prefix := preprocessToy(t)
	for _, model := range []struct {
		name  string
		flags []string
	}{{"gpt2", nil}, {"llama", llamaFlags}} {
		base := append(cpTrain(prefix, filepath.Join(dir, "cache")), model.flags...)
		ref := filepath.Join(dir, model.name+"-one.jsonl")
		if _, errs, code := runCLI(t, with(base, "--metrics-file", ref)...); code != 0 {
			t.Fatalf("%s single process: exit %d: %s", model.name, code, errs)
		}
		want, _ := metricsLosses(t, ref)
		got := filepath.Join(dir, model.name+"-cp2.jsonl")
		cmd := exec.Command(bin, append([]string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--"},
			with(base, "--metrics-file", got, "--context-parallel-size", "2", "--cp-comm-type", "p2p")...)...)
		cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: gotron launch --nproc-per-node 2 -- train --context-parallel-size 2: %v\n%s", model.name, err, out)
		}
		losses, _ := metricsLosses(t, got)
		sameLosses(t, model.name+" tcp CP=2 p2p", losses, want)
		if !strings.Contains(string(out), "context-parallel size 2 (--cp-comm-type p2p)") {
			t.Fatalf("%s: no context-parallel layout in the output:\n%s", model.name, out)
		}
	}
}

// TestTrainContextParallelBadInput: the context-parallel configurations
// that cannot run are refused before training with an error naming the
// flags.
func TestTrainContextParallelBadInput(t *testing.T) {
	dir, prefix := preprocessToy(t)
	base := cpTrain(prefix, filepath.Join(dir, "cache"))
	for _, tc := range []struct {
		n     int
		extra []string
		want  string
	}{
		{2, []string{"--context-parallel-size", "2", "--seq-length", "126"}, "--seq-length=126 is not divisible by 2×--context-parallel-size = 4"},
		{2, []string{"--context-parallel-size", "2", "--cp-comm-type", "a2a", "--num-attention-heads", "3", "--hidden-size", "36"}, "--num-attention-heads=3"},
		{2, []string{"--context-parallel-size", "2", "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "2", "2"}, "multiply to 4, not --context-parallel-size=2"},
		{2, []string{"--context-parallel-size", "2", "--cp-comm-type", "a2a+p2p"}, "needs --hierarchical-context-parallel-sizes"},
		{2, []string{"--context-parallel-size", "2", "--hierarchical-context-parallel-sizes", "2", "1"}, "needs --cp-comm-type a2a+p2p"},
		{2, []string{"--context-parallel-size", "2", "--cp-comm-type", "ring"}, "--cp-comm-type"},
	} {
		args := append([]string{"launch", "--inproc", "--nproc-per-node", fmt.Sprint(tc.n), "--"}, with(base, tc.extra...)...)
		_, errs, code := runCLI(t, args...)
		if code == 0 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error mentioning %q", tc.extra, code, errs, tc.want)
		}
	}
}

// TestTrainContextParallelHierarchical: launch --inproc, 4 ranks at
// --context-parallel-size 4 --cp-comm-type a2a+p2p
// --hierarchical-context-parallel-sizes 2 2 (the Llama-style model: 2 query
// groups split by the a2a level) logs the single-process losses.
func TestTrainContextParallelHierarchical(t *testing.T) {
	dir, prefix := preprocessToy(t)
	base := append(cpTrain(prefix, filepath.Join(dir, "cache")), llamaFlags...)
	ref := filepath.Join(dir, "one.jsonl")
	if _, errs, code := runCLI(t, with(base, "--metrics-file", ref)...); code != 0 {
		t.Fatalf("single process: exit %d: %s", code, errs)
	}
	want, _ := metricsLosses(t, ref)
	got := filepath.Join(dir, "cp4.jsonl")
	out, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
		with(base, "--metrics-file", got, "--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
			"--hierarchical-context-parallel-sizes", "2", "2")...)...)
	if code != 0 {
		t.Fatalf("a2a+p2p: exit %d: %s", code, errs)
	}
	losses, _ := metricsLosses(t, got)
	sameLosses(t, "inproc CP=4 a2a+p2p 2×2", losses, want)
	if !strings.Contains(out, "context-parallel size 4 (--cp-comm-type a2a+p2p)") {
		t.Fatalf("no context-parallel layout in the output:\n%s", out)
	}
}
