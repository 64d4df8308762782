package main

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestTrainDistOptInstances: --num-distributed-optimizer-instances 2 on 4
// data-parallel ranks shards the optimizer state over the 2 ranks of each
// instance (twice the state per rank of 4-way sharding) and trains the same
// losses as one instance; a checkpoint it saves (the first instance writes
// the optimizer shards) resumes with 4 instances of one rank each, again
// with the same losses; an MoE model with expert parallelism trains one
// process's losses too. Without --use-distributed-optimizer it is refused.
func TestTrainDistOptInstances(t *testing.T) {
	dir := t.TempDir()
	run := func(name string, extra ...string) (string, []float64) {
		t.Helper()
		metrics := filepath.Join(dir, name+".jsonl")
		out, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
			with(dpTrain, append([]string{"--use-distributed-optimizer", "--metrics-file", metrics}, extra...)...)...)...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", name, code, errs)
		}
		losses, _ := metricsLosses(t, metrics)
		return out, losses
	}
	stateMB := func(out string) float64 {
		t.Helper()
		m := regexp.MustCompile(`optimizer state per rank: ([0-9.]+) MB`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no optimizer state line:\n%s", out)
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	oneOut, want := run("one")
	twoOut, got := run("two", "--num-distributed-optimizer-instances", "2")
	sameLosses(t, "2 distributed-optimizer instances", got, want)
	if one, two := stateMB(oneOut), stateMB(twoOut); two < 1.9*one || two > 2.1*one {
		t.Fatalf("optimizer state per rank %.3f MB with 2 instances, %.3f MB with one: want twice", two, one)
	}

	_, got = run("overlap", "--num-distributed-optimizer-instances", "2", "--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size", "2000")
	sameLosses(t, "2 instances, buckets reduced during backward", got, want)
	_, got = run("avg", "--num-distributed-optimizer-instances", "2", "--ddp-average-in-collective")
	sameLosses(t, "2 instances, averaging in the collectives", got, want)

	ck := filepath.Join(dir, "ck")
	_, got = run("save", "--num-distributed-optimizer-instances", "2", "--save", ck, "--exit-interval", "6")
	sameLosses(t, "2 instances, saving", got, want[:6])
	_, got = run("resume", "--num-distributed-optimizer-instances", "4", "--load", ck)
	sameLosses(t, "resumed with 4 instances", got, want[6:])

	// An MoE model: the routed experts' state is sharded within the
	// experts' instance (expert DP 2 → 1 rank each), the dense weights'
	// within theirs (DP 4 → 2), both summed across the 2 instances.
	ref := filepath.Join(dir, "moe-one.jsonl")
	if _, errs, code := runCLI(t, with(moeTrain, "--metrics-file", ref)...); code != 0 {
		t.Fatalf("MoE single process: exit %d: %s", code, errs)
	}
	wantLM, _ := moeMetrics(t, ref)
	moe := filepath.Join(dir, "moe.jsonl")
	if _, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
		with(moeTrain, "--metrics-file", moe, "--expert-model-parallel-size", "2", "--use-distributed-optimizer",
			"--num-distributed-optimizer-instances", "2")...)...); code != 0 {
		t.Fatalf("MoE EP=2 with 2 instances: exit %d: %s", code, errs)
	}
	lm, _ := moeMetrics(t, moe)
	sameLosses(t, "MoE EP=2, 2 distributed-optimizer instances", lm, wantLM)

	_, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
		with(dpTrain, "--num-distributed-optimizer-instances", "2")...)...)
	if code == 0 || !strings.Contains(errs, "--num-distributed-optimizer-instances=2 needs --use-distributed-optimizer") {
		t.Fatalf("without --use-distributed-optimizer: exit %d, %s", code, errs)
	}
	_, errs, code = runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
		with(dpTrain, "--use-distributed-optimizer", "--num-distributed-optimizer-instances", "3")...)...)
	if code == 0 || !strings.Contains(errs, "must divide by 3 distributed-optimizer instances") {
		t.Fatalf("3 instances of 4 ranks: exit %d, %s", code, errs)
	}
}

// TestTrainOverlapParamGatherWithOptimizerStep: the switch is a schedule
// (Megatron starts the first chunk's parameter all-gather inside the
// optimizer step; gotron's --overlap-param-gather starts every all-gather
// right after it): accepted with one line where Megatron accepts it, and
// refused without the distributed optimizer, --overlap-param-gather or the
// interleaved schedule, as Megatron's validate_args.
func TestTrainOverlapParamGatherWithOptimizerStep(t *testing.T) {
	launch := func(extra ...string) []string {
		return append([]string{"launch", "--inproc", "--nproc-per-node", "2", "--"},
			with(ppTrain, append([]string{"--pipeline-model-parallel-size", "2", "--train-iters", "2", "--overlap-param-gather-with-optimizer-step"}, extra...)...)...)
	}
	_, errs, code := runCLI(t, launch("--use-distributed-optimizer", "--overlap-param-gather", "--num-virtual-stages-per-pipeline-rank", "2")...)
	if code != 0 || !strings.Contains(errs, "--overlap-param-gather-with-optimizer-step: accepted: ") {
		t.Fatalf("interleaved, distributed optimizer, --overlap-param-gather: exit %d, %s", code, errs)
	}
	for _, c := range []struct {
		extra []string
		want  string
	}{
		{[]string{"--overlap-param-gather", "--num-virtual-stages-per-pipeline-rank", "2"}, "needs --use-distributed-optimizer"},
		{[]string{"--use-distributed-optimizer", "--num-virtual-stages-per-pipeline-rank", "2"}, "needs --overlap-param-gather"},
		{[]string{"--use-distributed-optimizer", "--overlap-param-gather"}, "needs the interleaved pipeline schedule"},
	} {
		_, errs, code := runCLI(t, launch(c.extra...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, %s; want %q", c.extra, code, errs, c.want)
		}
	}
}
