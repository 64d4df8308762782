package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestCkptInspect: 'gotron ckpt inspect' reports a trained checkpoint's
// iteration, model, optimizer and every tensor with its bytes (text and
// --json, the byte totals adding up to the groups'), and bad input is a
// clear error.
func TestCkptInspect(t *testing.T) {
	ck := filepath.Join(t.TempDir(), "ck")
	if _, errs, code := runCLI(t, with(tinyTrain, "--train-iters", "3", "--save", ck, "--save-interval", "2")...); code != 0 {
		t.Fatalf("train: %s", errs)
	}
	out, errs, code := runCLI(t, "ckpt", "inspect", ck)
	if code != 0 {
		t.Fatalf("ckpt inspect: exit %d: %s", code, errs)
	}
	for _, want := range []string{"iteration 3 (saved iterations [2 3])", "model: 2 layers, hidden 32, 4 heads (4 query groups)", "optimizer: adamw, 3 steps",
		"decoder.layers.1.self_attention.linear_qkv.weight", "F32   (96, 32)", "12288 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("ckpt inspect lacks %q:\n%s", want, out)
		}
	}
	out, _, code = runCLI(t, "ckpt", "inspect", "--json", "--iteration", "2", ck)
	var r ckptReport
	if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil {
		t.Fatalf("ckpt inspect --json: exit %d, %v:\n%s", code, err, out)
	}
	sums := map[string]int{}
	for _, tn := range r.Tensors {
		sums[tn.Group] += int(tn.Bytes)
	}
	if r.Iteration != 2 || r.Meta.ConsumedTrainSamples != 8 || len(sums) != 2 || sums["model"] != r.Groups["model"] || sums["optimizer"] != 2*sums["model"] {
		t.Errorf("--json: iteration %d, consumed %d, group bytes %v, tensor sums %v", r.Iteration, r.Meta.ConsumedTrainSamples, r.Groups, sums)
	}
	// A TP=2 × DP=2 save with the distributed optimizer: the QKV weight in
	// two row blocks, Adam moments cut into flat pieces of such blocks by
	// the data-parallel ranks; --verify reads them all.
	par := filepath.Join(t.TempDir(), "par")
	if _, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
		with(tinyTrain, "--train-iters", "2", "--save", par, "--tensor-model-parallel-size", "2", "--use-distributed-optimizer")...)...); code != 0 {
		t.Fatalf("train TP=2 DP=2: %s", errs)
	}
	out, errs, code = runCLI(t, "ckpt", "inspect", "--verify", par)
	if code != 0 {
		t.Fatalf("ckpt inspect --verify: exit %d: %s", code, errs)
	}
	for _, want := range []string{"sharded, written by 4 rank(s) at TP=2 PP=1 DP=2 with the distributed optimizer", "verified: every shard read",
		"decoder.layers.1.self_attention.linear_qkv.weight            F32   (96, 32)                12288 2\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("ckpt inspect of the TP=2 DP=2 checkpoint lacks %q:\n%s", want, out)
		}
	}
	out, _, _ = runCLI(t, "ckpt", "inspect", "--json", par)
	r = ckptReport{}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatal(err)
	}
	flat := 0
	for _, tn := range r.Tensors {
		if len(tn.Pieces) != tn.Shards {
			t.Errorf("%s: %d shards, %d pieces listed", tn.Name, tn.Shards, len(tn.Pieces))
		}
		for _, p := range tn.Pieces {
			if p.Len() < p.Shape[0]*max(1, p.Shape[len(p.Shape)-1]) && len(p.Shape) == 2 || len(p.Shape) == 1 && p.Len() < p.Shape[0] {
				flat++
			}
		}
	}
	if flat == 0 {
		t.Errorf("no optimizer piece is a flat range of a block: the distributed optimizer's shards were not written as such")
	}
	// Offline reshard to TP=1 × DP=2: two rank files, and training resumes
	// from it.
	one := filepath.Join(t.TempDir(), "one")
	out, errs, code = runCLI(t, "ckpt", "reshard", par, "--out", one, "--data-parallel-size", "2")
	if code != 0 || !strings.Contains(out, "resharded iteration 2 of") || !strings.Contains(out, "(2 rank files)") {
		t.Fatalf("ckpt reshard: exit %d: %s%s", code, out, errs)
	}
	if out, _, _ = runCLI(t, "ckpt", "inspect", "--verify", one); !strings.Contains(out, "written by 2 rank(s) at TP=1 PP=1 DP=2") {
		t.Errorf("ckpt inspect of the resharded checkpoint:\n%s", out)
	}
	if out, errs, code = runCLI(t, with(tinyTrain, "--train-iters", "3", "--load", one, "--use-checkpoint-opt_param-scheduler")...); code != 0 || !strings.Contains(out, "loaded checkpoint from") {
		t.Fatalf("train --load the resharded checkpoint: exit %d: %s%s", code, out, errs)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ckpt", "reshard", par, "--out", filepath.Join(t.TempDir(), "x"), "--tensor-model-parallel-size", "3"},
			"--num-attention-heads=4 is not divisible by --tensor-model-parallel-size=3"},
		{[]string{"ckpt", "reshard", par, "--out", par}, "the output directory is the input"},
		{[]string{"ckpt", "reshard", par}, "--out is required"},
		{[]string{"ckpt", "reshard", par, "--out", filepath.Join(t.TempDir(), "x"), "--data-parallel-size", "0"}, "--data-parallel-size=0: want ≥ 1"},
		{[]string{"ckpt", "inspect", filepath.Join(ck, "missing")}, "no checkpoint"},
		{[]string{"ckpt", "inspect", "--iteration", "7", ck}, "iter_0000007"},
		{[]string{"ckpt", "inspct", ck}, `did you mean "inspect"`},
		{[]string{"ckpt", "inspect"}, "want one checkpoint directory"},
	} {
		if _, errs, code := runCLI(t, c.args...); code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", c.args, code, errs, c.want)
		}
	}
}
