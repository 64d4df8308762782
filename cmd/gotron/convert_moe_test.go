package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestConvertMegatronMoEToHF: a Megatron legacy MoE checkpoint
// (tools/golden/megatron_moe_ckpt.py, PP=2, SequentialMLP experts)
// converts to a gotron checkpoint and on to Hugging Face Mixtral, and gotron
// score gives the same logits from all three.
func TestConvertMegatronMoEToHF(t *testing.T) {
	src, tmp := megatronFixture("moe_pp2_sequential"), t.TempDir()
	g, h := filepath.Join(tmp, "gotron"), filepath.Join(tmp, "hf")
	mustGotron(t, "convert", "--from", "megatron", "--load", src, "--save", g)
	mustGotron(t, "convert", "--to", "hf", "--load", g, "--save", h)
	if b, err := os.ReadFile(filepath.Join(h, "config.json")); err != nil || !strings.Contains(string(b), `"model_type": "mixtral"`) {
		t.Fatalf("config.json: %v\n%s", err, b)
	}
	tokens := filepath.Join(tmp, "tokens.json")
	os.WriteFile(tokens, []byte("[1, 17, 42, 99, 5, 5, 64]"), 0o644)
	var want []float32
	for i, load := range []string{src, g, h} {
		npy := filepath.Join(tmp, "logits.npy")
		mustGotron(t, "score", "--load", load, "--tokens-file", tokens, "--out", npy)
		got, _, _ := readNPY(t, npy)
		if i == 0 {
			want = got
			continue
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s: logits differ from the Megatron checkpoint's", load)
		}
	}
}
