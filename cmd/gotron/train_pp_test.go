package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// ppTrain is dpTrain with 4 layers (divisible by 4 stages and by 2 stages
// of 2 chunks) and 4 micro-batches of 2 per iteration.
var ppTrain = with(dpTrain, "--num-layers", "4", "--micro-batch-size", "2")

// TestTrainPipelineParallel: gotron train with --pipeline-model-parallel-size
// under "gotron launch --inproc" (PP=2 with virtual stages, PP=2 × TP=2 ×
// DP=2 on 8 ranks) and over tcp processes (PP=2) logs the single-process
// losses; the last stage logs, every (tensor, pipeline) rank reports its
// parameter count, and the PP=2 checkpoint resumes at PP=4.
func TestTrainPipelineParallel(t *testing.T) {
	dir := t.TempDir()
	ref := filepath.Join(dir, "one.jsonl")
	if _, errs, code := runCLI(t, with(ppTrain, "--metrics-file", ref)...); code != 0 {
		t.Fatalf("single process: exit %d: %s", code, errs)
	}
	want, _ := metricsLosses(t, ref)
	for _, c := range []struct {
		n     int
		extra []string
	}{
		{2, []string{"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}},
		{8, []string{"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
			"--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "2000"}},
	} {
		got := filepath.Join(dir, "pp-"+strconv.Itoa(c.n)+".jsonl")
		out, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", strconv.Itoa(c.n), "--"},
			with(ppTrain, append(c.extra, "--metrics-file", got)...)...)...)
		if code != 0 {
			t.Fatalf("launch --inproc %d %v: exit %d: %s", c.n, c.extra, code, errs)
		}
		losses, _ := metricsLosses(t, got)
		sameLosses(t, strings.Join(c.extra, " "), losses, want)
		last := regexp.MustCompile(`\[rank` + strconv.Itoa(c.n-1) + `\]: +\[20`) // a timestamped line
		if !last.MatchString(out) || regexp.MustCompile(`\[rank0\]: +\[20`).MatchString(out) {
			t.Fatalf("the log should come from the last rank only:\n%s", out)
		}
		if !strings.Contains(out, "model parallel rank (0, 1): ") {
			t.Fatalf("no parameter count of pipeline rank 1:\n%s", out)
		}
	}

	// Over tcp processes, saving; the checkpoint resumes at PP=4.
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	got, ck := filepath.Join(dir, "tcp.jsonl"), filepath.Join(dir, "ck")
	cmd := exec.Command(bin, append([]string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--"},
		with(ppTrain, "--metrics-file", got, "--pipeline-model-parallel-size", "2", "--save", ck, "--exit-interval", "6")...)...)
	cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gotron launch --nproc-per-node 2 -- train --pipeline-model-parallel-size 2: %v\n%s", err, out)
	}
	losses, _ := metricsLosses(t, got)
	sameLosses(t, "tcp PP=2", losses, want[:6])
	got = filepath.Join(dir, "pp4.jsonl")
	if _, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
		with(ppTrain, "--metrics-file", got, "--pipeline-model-parallel-size", "4", "--load", ck)...)...); code != 0 {
		t.Fatalf("resume at PP=4: exit %d: %s", code, errs)
	}
	losses, _ = metricsLosses(t, got)
	sameLosses(t, "PP=2 checkpoint resumed at PP=4", losses, want[6:])
}

// TestTrainPipelineParallelBadInput: pipeline layouts Megatron refuses are
// refused before training, naming the flags.
func TestTrainPipelineParallelBadInput(t *testing.T) {
	launch := func(n int, extra ...string) []string {
		return append([]string{"launch", "--inproc", "--nproc-per-node", strconv.Itoa(n), "--"}, with(ppTrain, extra...)...)
	}
	cases := []struct {
		args []string
		want string
	}{
		{launch(3, "--pipeline-model-parallel-size", "3"), "--num-layers=4 is not divisible by --pipeline-model-parallel-size=3"},
		{launch(2, "--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2", "--global-batch-size", "6"),
			"--global-batch-size"},
		{with(ppTrain, "--num-virtual-stages-per-pipeline-rank", "2"), "need --pipeline-model-parallel-size > 1"},
		{launch(2, "--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1", "--decoder-last-pipeline-num-layers", "2"),
			"do not add up to --num-layers=4"},
		{with(ppTrain, "--pipeline-model-parallel-size", "2"), "--pipeline-model-parallel-size=2 needs 2 ranks"},
		{launch(2, "--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2", "--num-layers-per-virtual-pipeline-stage", "1"),
			"give only one of them"},
	}
	for _, c := range cases {
		_, errs, code := runCLI(t, c.args...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", c.args, code, errs, c.want)
		}
	}
}
