package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotron/gotron/train"
)

// perTokenTrain is a run on the preprocessed toy corpus (a real .bin/.idx
// dataset of short documents) with --eod-mask-loss, so that its
// micro-batches hold different numbers of unmasked tokens; dropout off.
func perTokenTrain(prefix, cache string) []string {
	return []string{"train", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
		"--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "8",
		"--lr", "1e-3", "--data-path", prefix, "--split", "90,10,0", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
		"--data-cache-path", cache, "--log-interval", "1", "--eval-iters", "1", "--eval-interval", "3", "--eod-mask-loss",
		"--hidden-dropout", "0", "--attention-dropout", "0", "--train-iters", "6"}
}

// TestTrainPerTokenLossProcesses: --calculate-per-token-loss over two
// worker processes on tcp (gotron launch), data-parallel with the
// distributed optimizer, logs the single process's per-token losses in
// its metrics file, which differ from the default run's; the checkpoint
// records the flag in its args, and resuming it without the flag says so.
func TestTrainPerTokenLossProcesses(t *testing.T) {
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	dir, prefix := preprocessToy(t)
	base := perTokenTrain(prefix, filepath.Join(dir, "cache"))
	def := filepath.Join(dir, "default.jsonl")
	if _, errs, code := runCLI(t, with(base, "--metrics-file", def)...); code != 0 {
		t.Fatalf("default single process: exit %d: %s", code, errs)
	}
	one := filepath.Join(dir, "one.jsonl")
	if _, errs, code := runCLI(t, with(base, "--metrics-file", one, "--calculate-per-token-loss")...); code != 0 {
		t.Fatalf("per-token single process: exit %d: %s", code, errs)
	}
	want, _ := metricsLosses(t, one)
	defLosses, _ := metricsLosses(t, def)
	differ := false
	for i := range min(len(want), len(defLosses)) {
		differ = differ || relDiff(want[i], defLosses[i]) > 1e-5
	}
	if !differ {
		t.Fatalf("per-token losses %v equal the default run's %v", want, defLosses)
	}

	got := filepath.Join(dir, "dp2.jsonl")
	ck := filepath.Join(dir, "ck")
	cmd := exec.Command(bin, append([]string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--"},
		with(base, "--metrics-file", got, "--calculate-per-token-loss", "--use-distributed-optimizer", "--save", ck, "--save-interval", "6")...)...)
	cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gotron launch --nproc-per-node 2 -- train --calculate-per-token-loss: %v\n%s", err, out)
	}
	losses, _ := metricsLosses(t, got)
	sameLosses(t, "tcp DP=2 distributed optimizer, per-token loss", losses, want)

	ra, err := train.ReadRunArgs(ck)
	if err != nil {
		t.Fatal(err)
	}
	if !ra.CalculatePerTokenLoss {
		t.Fatalf("the checkpoint's args do not record --calculate-per-token-loss: %+v", ra)
	}
	stdout, errs, code := runCLI(t, with(base, "--load", ck, "--train-iters", "7", "--use-checkpoint-opt_param-scheduler")...)
	if code != 0 || !strings.Contains(stdout, "was trained with --calculate-per-token-loss, this run without it") {
		t.Fatalf("resume without the flag: exit %d, want a line saying so:\n%s%s", code, stdout, errs)
	}
}

func relDiff(a, b float64) float64 {
	d := a - b
	if d < 0 {
		d = -d
	}
	if b < 0 {
		b = -b
	}
	return d / b
}
