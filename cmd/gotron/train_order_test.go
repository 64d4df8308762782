package main

import (
	"path/filepath"
	"regexp"
	"testing"
)

// TestTrainTPPPDPMapping: --use-tp-pp-dp-mapping orders the ranks
// tp-cp-ep-pp-dp, as Megatron's initialize.py (the groups of that order are
// checked against Megatron's RankGenerator in parallel/testdata): with PP=2
// and DP=2 on 4 ranks, rank 1 is pipeline stage 1 of replica 0 (with the
// default order tp-cp-ep-dp-pp it is stage 0 of replica 1), so it prints
// the parameter count of pipeline rank 1; and the losses are the default
// order's.
func TestTrainTPPPDPMapping(t *testing.T) {
	dir := t.TempDir()
	run := func(name string, extra ...string) (string, []float64) {
		t.Helper()
		metrics := filepath.Join(dir, name+".jsonl")
		args := append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
			with(ppTrain, append([]string{"--pipeline-model-parallel-size", "2", "--train-iters", "4", "--metrics-file", metrics}, extra...)...)...)
		out, errs, code := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", name, code, errs)
		}
		losses, _ := metricsLosses(t, metrics)
		return out, losses
	}
	defOut, want := run("default")
	out, got := run("tppp", "--use-tp-pp-dp-mapping")
	sameLosses(t, "--use-tp-pp-dp-mapping", got, want)
	stage1 := regexp.MustCompile(`\[rank(\d)\]: +> number of parameters on \(tensor, pipeline\) model parallel rank \(0, 1\)`)
	for _, c := range []struct {
		name, out, rank string
	}{{"default order", defOut, "2"}, {"--use-tp-pp-dp-mapping", out, "1"}} {
		m := stage1.FindAllStringSubmatch(c.out, -1)
		if len(m) != 1 || m[0][1] != c.rank {
			t.Fatalf("%s: pipeline rank 1's parameter count printed by %v, want [rank%s] only:\n%s", c.name, m, c.rank, c.out)
		}
	}
}
