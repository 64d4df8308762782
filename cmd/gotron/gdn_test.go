package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotron/gotron/train"
)

// gdnTrain is a tiny hybrid model in the gpt3_mcore_te_tp2_pp1_gdn
// configs' shape: gated delta nets at layers 0 and 1, output-gated full
// attention at layer 2, MoE with a gated shared expert in every layer.
var gdnTrain = []string{"train", "--num-layers", "3", "--hidden-size", "32", "--num-attention-heads", "4",
	"--group-query-attention", "--num-query-groups", "2", "--swiglu", "--position-embedding-type", "rope", "--rotary-percent", "0.5",
	"--apply-layernorm-1p", "--attention-output-gate", "--experimental-attention-variant", "gated_delta_net",
	"--linear-attention-freq", "3", "--linear-conv-kernel-dim", "4", "--linear-key-head-dim", "8", "--linear-value-head-dim", "8",
	"--linear-num-key-heads", "2", "--linear-num-value-heads", "4", "--num-experts", "4", "--moe-ffn-hidden-size", "16",
	"--moe-shared-expert-intermediate-size", "16", "--moe-shared-expert-gate", "--moe-router-topk", "2",
	"--moe-aux-loss-coeff", "0.01", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
	"--seq-length", "24", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3", "--mock-data",
	"--vocab-size", "100", "--make-vocab-size-divisible-by", "64", "--log-interval", "1", "--eval-iters", "0"}

// TestTrainGDNResume: a hybrid gated-delta-net model trains from the
// Megatron flags, and 2 iterations, a save and a resume for 2 more end
// bit for bit where 4 straight iterations do (the gated delta net's
// parameters and their Adam state are saved and loaded).
func TestTrainGDNResume(t *testing.T) {
	dir := t.TempDir()
	run := func(extra ...string) {
		t.Helper()
		_, errs, code := runCLI(t, append(append([]string{}, gdnTrain...), extra...)...)
		if code != 0 {
			t.Fatalf("gotron train %s: exit %d: %s", strings.Join(extra, " "), code, errs)
		}
	}
	straight, split := filepath.Join(dir, "straight"), filepath.Join(dir, "split")
	run("--train-iters", "4", "--save", straight)
	run("--train-iters", "4", "--exit-interval", "2", "--save", split)
	run("--train-iters", "4", "--save", split, "--load", split)
	a, _, err := train.LoadModel(straight)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := train.LoadModel(split)
	if err != nil {
		t.Fatal(err)
	}
	if a.Layers[0].GDN == nil || a.Layers[2].GDN != nil {
		t.Fatal("the loaded model's layers 0 and 1 are not gated delta nets (layer 2 full attention)")
	}
	seen := 0
	bp := b.Params()
	for i, p := range a.Params() {
		if strings.Contains(p.Name, "conv1d") || strings.Contains(p.Name, "A_log") || strings.Contains(p.Name, "dt_bias") {
			seen++
		}
		x, y := p.Float32s(), bp[i].Float32s()
		for j := range x {
			if x[j] != y[j] {
				t.Fatalf("%s[%d]: %g after 4 straight iterations, %g after 2 + resume + 2", p.Name, j, x[j], y[j])
			}
		}
	}
	if seen != 10 { // 2 layers × (conv1d query, key, value; A_log; dt_bias)
		t.Fatalf("%d gated delta net conv/A_log/dt_bias parameters in the checkpoint, want 10", seen)
	}
}

// TestTrainGDNRefusals: what the hybrid model does not build is refused
// naming the flag.
func TestTrainGDNRefusals(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--experimental-attention-variant", "dsa"}, "needs --dsa-indexer-n-heads"},
		{[]string{"--experimental-attention-variant", "linear"}, "want gated_delta_net"},
		{[]string{"--linear-attention-freq", "0"}, "--linear-attention-freq=0"},
		{[]string{"--linear-num-value-heads", "3"}, "must be a multiple of --linear-num-key-heads=2"},
	} {
		_, errs, code := runCLI(t, append(append(append([]string{}, gdnTrain...), "--train-iters", "1"), c.args...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error containing %q", c.args, code, errs, c.want)
		}
	}
	_, errs, code := runCLI(t, append(append([]string{}, tinyTrain...), "--train-iters", "1", "--linear-num-key-heads", "4")...)
	if code == 0 || !strings.Contains(errs, "--linear-num-key-heads needs --experimental-attention-variant gated_delta_net") {
		t.Errorf("--linear-num-key-heads without the variant: exit %d, %q", code, errs)
	}
}
