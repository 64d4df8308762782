package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/train"
)

// rerunTrain is tinyTrain with dropout on, so that a rerun that did not
// restore the dropout streams would give another loss.
func rerunTrain(extra ...string) []string {
	return append(append(append([]string{}, tinyTrain...), "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters", "0"), extra...)
}

// TestRerunInjectedTransientError: Megatron's gpt3_mcore_reruns_transient
// at tiny size: the injected error is detected at the first validated
// iteration (the second), the rerun differs, the verdict is a transient
// error and the job exits with status 17 without a checkpoint.
func TestRerunInjectedTransientError(t *testing.T) {
	dir := t.TempDir()
	out, errs, code := runCLI(t, rerunTrain("--train-iters", "4", "--save", dir, "--rerun-mode", "validate_results",
		"--error-injection-rate", "1", "--error-injection-type", "transient_error")...)
	if code != train.ExitFailedOnResultValidation {
		t.Fatalf("exit %d, want 17: %s\n%s", code, errs, out)
	}
	for _, w := range []string{"RerunStateMachine initialized in mode RerunMode.VALIDATE_RESULTS", "Result validation enabled",
		"Injecting error type Transient error", "on rank 0 at iteration #2 invocation #1 (message='found NaN in local forward loss calculation')",
		"Need to rerun step to check reproducibility of initial result", "First rerun: unexpected result is not reproducible within the tolerance",
		"iteration #2: Possible transient error!", "Exiting now. The job can be resumed from a previous checkpoint"} {
		if !strings.Contains(errs, w) && !strings.Contains(out, w) {
			t.Errorf("log lacks %q:\n%s\n%s", w, out, errs)
		}
	}
	if !strings.Contains(errs, "result validation failed (exit status 17)") || strings.Contains(out, "iteration        2/") {
		t.Errorf("stderr %q; the failed iteration must not be logged:\n%s", errs, out)
	}
	if _, err := os.Stat(filepath.Join(dir, ckpt.TrackerFile)); err == nil {
		t.Errorf("a transient error saved a checkpoint")
	}
}

// TestRerunInjectedPersistentError: Megatron's gpt3_mcore_reruns_persistent
// at tiny size: the rerun reproduces the result, so the job saves a
// checkpoint at iteration 1 with the machine's state and exits with 16;
// resumed from it on the same host and rank (the same "GPU") it asks to
// be resumed again (16); with --rerun-mode disabled the saved state is
// ignored and training goes on.
func TestRerunInjectedPersistentError(t *testing.T) {
	dir := t.TempDir()
	args := rerunTrain("--train-iters", "4", "--save", dir, "--rerun-mode", "validate_results",
		"--error-injection-rate", "1", "--error-injection-type", "persistent_error")
	out, errs, code := runCLI(t, args...)
	if code != train.ExitResumeToDisambiguate {
		t.Fatalf("exit %d, want 16: %s\n%s", code, errs, out)
	}
	for _, w := range []string{"Injecting error type Persistent error", "First rerun: unexpected result is reproducible within the tolerance",
		"Saving a checkpoint and exiting now", "saving checkpoint at iteration       1"} {
		if !strings.Contains(errs, w) && !strings.Contains(out, w) {
			t.Errorf("log lacks %q:\n%s\n%s", w, out, errs)
		}
	}
	r, err := ckpt.Open(dir, -1)
	if err != nil {
		t.Fatal(err)
	}
	var ra train.RunArgs
	err = json.Unmarshal(r.Meta.Args, &ra)
	r.Close()
	if err != nil || r.Meta.Iteration != 1 || ra.Rerun == nil || ra.Rerun.State != 3 || ra.Rerun.Iteration != 1 || len(ra.Rerun.Ranks) != 1 ||
		!ra.Rerun.Ranks[0].CheckpointRequested || ra.Rerun.Ranks[0].InjectedErrorType != 3 {
		t.Fatalf("checkpoint: iteration %d, rerun state %+v (%v)", r.Meta.Iteration, ra.Rerun, err)
	}
	resume := append(args, "--load", dir)
	out, errs, code = runCLI(t, resume...)
	if code != train.ExitResumeToDisambiguate || !strings.Contains(errs, "Getting RerunStateMachine state from checkpoint. Will rerun step.") ||
		!strings.Contains(errs, "Got rescheduled on the same GPU. Need to resume again from the same checkpoint (node: ") ||
		!strings.Contains(errs, "Exiting now. Please resume the job from the same checkpoint") {
		t.Fatalf("resumed: exit %d, want 16: %s\n%s", code, errs, out)
	}
	disabled := rerunTrain("--train-iters", "4", "--save", dir, "--load", dir)
	out, errs, code = runCLI(t, disabled...)
	if code != 0 || !strings.Contains(errs, "RerunStateMachine disabled via CLI, ignoring machine state saved in checkpoint") ||
		!strings.Contains(out, "iteration        4/       4") {
		t.Fatalf("resumed with --rerun-mode disabled: exit %d: %s\n%s", code, errs, out)
	}
}

// TestRerunReportStatsIsBitIdentical: report_stats reruns every iteration
// from the saved state; the reruns give the same losses bit for bit (the
// stats say so) and the run's losses are those of a run without reruns:
// the dropout streams, the data position and the optimizer are as before
// the first pass.
func TestRerunReportStatsIsBitIdentical(t *testing.T) {
	dir := t.TempDir()
	plain, stats := filepath.Join(dir, "plain.jsonl"), filepath.Join(dir, "stats.jsonl")
	if _, errs, code := runCLI(t, rerunTrain("--train-iters", "4", "--metrics-file", plain)...); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	_, errs, code := runCLI(t, rerunTrain("--train-iters", "4", "--metrics-file", stats, "--rerun-mode", "report_stats")...)
	if code != 0 {
		t.Fatalf("report_stats: exit %d: %s", code, errs)
	}
	if !strings.Contains(errs, "Stats on computation determinism in validation calls") ||
		!strings.Contains(errs, "From validation call 'found NaN in local forward loss calculation':") ||
		!strings.Contains(errs, "6 samples, all identical") {
		t.Errorf("report_stats log:\n%s", errs)
	}
	sameLossesBits(t, "one process", readLosses(t, plain), readLosses(t, stats))

	// Pipelined × data-parallel with the distributed optimizer and the
	// overlapped reductions, as Megatron's reruns configs run.
	layout := []string{"launch", "--inproc", "--nproc-per-node", "4", "--"}
	par := []string{"--pipeline-model-parallel-size", "2", "--global-batch-size", "8", "--micro-batch-size", "1",
		"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"}
	plain, stats = filepath.Join(dir, "pplain.jsonl"), filepath.Join(dir, "pstats.jsonl")
	if _, errs, code := runCLI(t, append(layout, rerunTrain(append(par, "--train-iters", "4", "--metrics-file", plain)...)...)...); code != 0 {
		t.Fatalf("PP=2 DP=2: exit %d: %s", code, errs)
	}
	_, errs, code = runCLI(t, append(layout, rerunTrain(append(par, "--train-iters", "4", "--metrics-file", stats, "--rerun-mode", "report_stats")...)...)...)
	if code != 0 || !strings.Contains(errs, "samples, all identical") {
		t.Fatalf("PP=2 DP=2 report_stats: exit %d: %s", code, errs)
	}
	sameLossesBits(t, "PP=2 DP=2", readLosses(t, plain), readLosses(t, stats))
}

func sameLossesBits(t *testing.T, what string, a, b []float64) {
	t.Helper()
	if len(a) != 4 || len(a) != len(b) {
		t.Fatalf("%s: losses %v and %v", what, a, b)
	}
	for i := range a {
		if a[i] != b[i] {
			t.Errorf("%s: iteration %d: loss %v with reruns, %v without", what, i+1, b[i], a[i])
		}
	}
}

func readLosses(t *testing.T, path string) []float64 {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []float64
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var rec struct {
			Loss *float64 `json:"lm_loss"`
		}
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if rec.Loss != nil {
			out = append(out, *rec.Loss)
		}
	}
	return out
}

// TestRerunInjectionLaunch: the transient injection in two-rank
// launches (data-parallel, and pipelined as Megatron's reruns configs
// are): each rank validates its own loss (the last stage, pipelined), the
// rerun is agreed over the world, and every rank stops at the same
// iteration with status 17.
func TestRerunInjectionLaunch(t *testing.T) {
	for _, tc := range []struct {
		layout []string
		want   []string
	}{
		{nil, []string{"[rank0]: [", "ERROR: Rank 0, node ", "[rank1]: [", "ERROR: Rank 1, node ", "Possible transient error!"}},
		{[]string{"--pipeline-model-parallel-size", "2"}, []string{"ERROR: Rank 1, node ", "iteration #2: Possible transient error!"}},
	} {
		args := append([]string{"launch", "--inproc", "--nproc-per-node", "2", "--"},
			rerunTrain(append(tc.layout, "--train-iters", "4", "--rerun-mode", "validate_results", "--error-injection-rate", "1")...)...)
		out, errs, code := runCLI(t, args...)
		if code == 0 || !strings.Contains(errs, "gotron train exited with status 17") ||
			strings.Count(errs, "the rerun state machine stopped the job at iteration 2: result validation failed (exit status 17)") != 2 {
			t.Fatalf("%v: exit %d, want both ranks' status 17: %s\n%s", tc.layout, code, errs, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(out+errs, w) {
				t.Errorf("%v: log lacks %q:\n%s\n%s", tc.layout, w, out, errs)
			}
		}
	}
}

// TestTrainWeightHashLaunch: --check-weight-hash-across-dp-replicas-interval
// in a two-rank data-parallel launch checks before training and every 2
// iterations (train/weighthash_test.go corrupts a replica).
func TestTrainWeightHashLaunch(t *testing.T) {
	out, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "2", "--"},
		rerunTrain("--train-iters", "4", "--check-weight-hash-across-dp-replicas-interval", "2")...)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, w := range []string{">>> Weight hashes match after 0 iterations...", ">>> Weight hashes match after 2 iterations...", ">>> Weight hashes match after 4 iterations..."} {
		if !strings.Contains(out, w) {
			t.Errorf("log lacks %q:\n%s", w, out)
		}
	}
}

// TestTrainVerifyIntegrity: --verify-integrity on --load reads every shard
// (the optimizer's too, under --no-load-optim) against its recorded
// CRC-32C: a clean checkpoint resumes, one with a flipped byte in a shard
// is refused naming the file, which a plain --no-load-optim resume would
// not read.
func TestTrainVerifyIntegrity(t *testing.T) {
	dir := t.TempDir()
	if _, errs, code := runCLI(t, rerunTrain("--train-iters", "3", "--exit-interval", "2", "--save", dir)...); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	out, errs, code := runCLI(t, rerunTrain("--train-iters", "3", "--load", dir, "--verify-integrity")...)
	if code != 0 || !strings.Contains(out, "Checkpoint integrity verified: ") {
		t.Fatalf("clean checkpoint: exit %d: %s\n%s", code, errs, out)
	}
	shards, _ := filepath.Glob(filepath.Join(dir, "iter_0000002", "*.safetensors"))
	var optim string
	for _, s := range shards {
		data, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data[:min(len(data), 4096)]), "optimizer/") {
			optim = s
		}
	}
	if optim == "" {
		t.Fatalf("no shard file holds the optimizer state among %v", shards)
	}
	data, _ := os.ReadFile(optim)
	data[len(data)-1] ^= 0x40
	if err := os.WriteFile(optim, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := runCLI(t, rerunTrain("--train-iters", "3", "--load", dir, "--no-load-optim")...); code != 0 {
		t.Fatalf("--no-load-optim without --verify-integrity does not read the optimizer shards: exit %d: %s", code, errs)
	}
	_, errs, code = runCLI(t, rerunTrain("--train-iters", "3", "--load", dir, "--no-load-optim", "--verify-integrity")...)
	if code == 0 || !strings.Contains(errs, "--verify-integrity: checkpoint integrity verification failed") || !strings.Contains(errs, "corrupted") {
		t.Fatalf("corrupted shard: exit %d: %s", code, errs)
	}
}

// TestTrainTestModeLaunch: --test-mode with --qk-layernorm under TP=2 × DP=2
// (Megatron's qk_layernorm_test_mode configs at tiny size) runs: the
// query/key layer norms agree across both groups (train/weighthash_test.go
// changes one replica's to see the check fail).
func TestTrainTestModeLaunch(t *testing.T) {
	out, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
		rerunTrain("--train-iters", "2", "--qk-layernorm", "--test-mode", "--tensor-model-parallel-size", "2")...)...)
	if code != 0 || !strings.Contains(out, "iteration        2/       2") {
		t.Fatalf("exit %d: %s\n%s", code, errs, out)
	}
}
