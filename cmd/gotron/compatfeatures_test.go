package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotron/gotron/train"
)

// trainCLI runs gotron train with tinyTrain and extra, failing the test on
// a non-zero exit; it returns stdout and stderr.
func trainCLI(t *testing.T, extra ...string) (string, string) {
	t.Helper()
	out, errs, code := runCLI(t, append(append([]string{}, tinyTrain...), extra...)...)
	if code != 0 {
		t.Fatalf("gotron train %s: exit %d: %s", strings.Join(extra, " "), code, errs)
	}
	return out, errs
}

// TestTrainApplyWDToQKLayerNorm: --apply-wd-to-qk-layernorm reaches the
// optimizer (the q/k norm weights of the checkpoint differ from a run
// without it, every other parameter is the same), and without
// --qk-layernorm one line says it has no effect.
func TestTrainApplyWDToQKLayerNorm(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--train-iters", "1", "--qk-layernorm", "--weight-decay", "0.5", "--attention-dropout", "0", "--hidden-dropout", "0", "--eval-iters", "0"}
	trainCLI(t, append(args, "--save", filepath.Join(dir, "plain"))...)
	trainCLI(t, append(args, "--save", filepath.Join(dir, "wd"), "--apply-wd-to-qk-layernorm")...)
	plain, _, err := train.LoadModel(filepath.Join(dir, "plain"))
	if err != nil {
		t.Fatal(err)
	}
	wd, _, err := train.LoadModel(filepath.Join(dir, "wd"))
	if err != nil {
		t.Fatal(err)
	}
	wp := map[string][]float32{}
	for _, p := range wd.Params() {
		wp[p.Name] = p.Float32s()
	}
	decayed := 0
	for _, p := range plain.Params() {
		qkWeight := strings.HasSuffix(p.Name, "q_layernorm.weight") || strings.HasSuffix(p.Name, "k_layernorm.weight")
		a, b := p.Float32s(), wp[p.Name]
		for i := range a {
			if qkWeight && !(b[i] < a[i]) {
				t.Fatalf("%s[%d]: %g with --apply-wd-to-qk-layernorm, %g without: want it decayed (smaller)", p.Name, i, b[i], a[i])
			}
			if !qkWeight && a[i] != b[i] {
				t.Fatalf("%s[%d]: %g with the flag, %g without: only the q/k norms may change", p.Name, i, b[i], a[i])
			}
		}
		if qkWeight {
			decayed++
		}
	}
	if decayed != 4 {
		t.Fatalf("%d q/k norm weights, want 4 (2 layers)", decayed)
	}
	_, errs := trainCLI(t, "--train-iters", "1", "--eval-iters", "0", "--apply-wd-to-qk-layernorm")
	if !strings.Contains(errs, "--apply-wd-to-qk-layernorm: no effect without --qk-layernorm") {
		t.Fatalf("stderr without --qk-layernorm: %q", errs)
	}
}
