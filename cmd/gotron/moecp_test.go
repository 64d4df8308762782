package main

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// metricsColumn reads one key of every record of a --metrics-file.
func metricsColumn(t *testing.T, path, key string) []float64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []float64
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		v, ok := m[key].(float64)
		if !ok {
			t.Fatalf("%s: record without %s: %s", path, key, l)
		}
		out = append(out, v)
	}
	return out
}

// sameColumn fails unless got equals want (one process's) at every
// iteration within 1e-5.
func sameColumn(t *testing.T, what, key string, got, want []float64) {
	t.Helper()
	if len(got) != len(want) || len(want) == 0 {
		t.Fatalf("%s: %d logged iterations of %s, single process %d", what, len(got), key, len(want))
	}
	for i := range want {
		if want[i] == 0 || math.Abs(got[i]-want[i]) > 1e-5*math.Abs(want[i]) {
			t.Fatalf("%s: iteration %d %s %.9g, single process %.9g", what, i+1, key, got[i], want[i])
		}
	}
}

// TestLaunchMoEContextParallelAndGlobalAux: through gotron launch, MoE with
// context parallelism (CP=2 × EP=2 over two tcp processes, alltoall) logs
// one process's lm, aux and z losses at each of 10 iterations within 1e-5,
// and global_aux_loss over two inproc data-parallel ranks logs those of one
// process on micro-batches twice the size with half the coefficient
// (Megatron's 1/DP on its gradient, docs/moe.md).
func TestLaunchMoEContextParallelAndGlobalAux(t *testing.T) {
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	keys := []string{"lm_loss", "load_balancing_loss", "z_loss"}
	ref := filepath.Join(dir, "one.jsonl")
	if _, errs, code := runCLI(t, with(moeTrain, "--metrics-file", ref)...); code != 0 {
		t.Fatalf("single process: exit %d: %s", code, errs)
	}
	got := filepath.Join(dir, "cp2ep2.jsonl")
	cmd := exec.Command(bin, append([]string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--"},
		with(moeTrain, "--metrics-file", got, "--context-parallel-size", "2", "--expert-model-parallel-size", "2",
			"--moe-token-dispatcher-type", "alltoall")...)...)
	cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gotron launch --nproc-per-node 2 -- train --context-parallel-size 2 --expert-model-parallel-size 2: %v\n%s", err, out)
	}
	for _, k := range keys {
		sameColumn(t, "tcp CP=2×EP=2", k, metricsColumn(t, got, k), metricsColumn(t, ref, k))
	}

	// moeTrain with global_aux_loss at coefficient c
	global := func(c string) []string {
		a := with(moeTrain, "--moe-router-load-balancing-type", "global_aux_loss")
		for i := range a {
			if a[i] == "--moe-aux-loss-coeff" {
				a[i+1] = c
			}
		}
		return a
	}
	ref = filepath.Join(dir, "global-one.jsonl")
	if _, errs, code := runCLI(t, with(global("1e-2"), "--metrics-file", ref, "--micro-batch-size", "4")...); code != 0 {
		t.Fatalf("single process, global_aux_loss: exit %d: %s", code, errs)
	}
	got = filepath.Join(dir, "global-dp2.jsonl")
	if _, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "2", "--"},
		with(global("2e-2"), "--metrics-file", got)...)...); code != 0 {
		t.Fatalf("launch --inproc 2, global_aux_loss: exit %d: %s", code, errs)
	}
	for _, k := range []string{"lm_loss", "global_load_balancing_loss", "z_loss"} {
		sameColumn(t, "inproc DP=2 global_aux_loss", k, metricsColumn(t, got, k), metricsColumn(t, ref, k))
	}
}
