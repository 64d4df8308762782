package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/hf/hftest"
	"github.com/gotron/gotron/ckpt/safetensors"
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

// TestGenerateImportedQwen3MoE: gotron generate runs the Qwen3-MoE
// fixtures and the DeepSeek-V3 and -V2 ones (multi-latent attention decoding
// with its KV cache, per-head or --cache-mla-latents, YaRN, DeepSeekMoE
// routing), straight from the HF directory and from their gotron
// conversion: each greedy token after a prefix of the reference tokens is
// the argmax of the PyTorch reference's logits at that position.
func TestGenerateImportedQwen3MoE(t *testing.T) {
	for _, name := range []string{"qwen3_moe_untied_f32", "qwen3_moe_step2_tied_f32", "deepseek_v3_untied_f32", "deepseek_v2_tied_f32", "qwen3_next_untied_f32"} {
		t.Run(name, func(t *testing.T) {
			src := hfFixture(name)
			g := filepath.Join(t.TempDir(), "gotron")
			mustGotron(t, "convert", "--from", "hf", "--load", src, "--save", g)
			ids, logits := hftest.Golden(t, src)
			V := len(logits) / len(ids)
			for _, load := range []string{src, g} {
				for _, n := range []int{1, 5, len(ids)} {
					prompt := make([]string, n)
					for i, id := range ids[:n] {
						prompt[i] = fmt.Sprint(id)
					}
					row := logits[(n-1)*V : n*V]
					want := 0
					for v, x := range row {
						if x > row[want] {
							want = v
						}
					}
					args := []string{"generate", "--load", load, "--tokenizer-type", "NullTokenizer", "--vocab-size", fmt.Sprint(V),
						"--prompt", strings.Join(prompt, " "), "--top-k", "1", "--max-new-tokens", "1"}
					variants := [][]string{args}
					if strings.HasPrefix(name, "deepseek") { // and with the MLA latents cached
						variants = append(variants, append(slices.Clone(args), "--cache-mla-latents"))
					}
					for _, a := range variants {
						out := mustGotron(t, a...)
						f := strings.Fields(out)
						if len(f) != n+1 || f[n] != fmt.Sprint(want) {
							t.Fatalf("%s, %d-token prompt (%v): generate printed %q, want the prompt then %d (the reference's argmax)", load, n, a[len(a)-1], out, want)
						}
					}
				}
			}
		})
	}
}

// TestGenerateImportedQwen3NextGreedy: gotron generate on the Qwen3-Next
// fixture (tools/golden/hf_qwen3next.py), from the HF directory and from its
// gotron conversion, continues the 4-token prompt with the reference's 8
// greedy tokens: the gated delta nets' convolution and recurrent states and
// the full-attention layers' KV cache carried across decoding steps give
// what a full forward over each prefix gives in PyTorch.
func TestGenerateImportedQwen3NextGreedy(t *testing.T) {
	src := hfFixture("qwen3_next_untied_f32")
	f, err := safetensors.ReadFile(filepath.Join(src, "golden.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	greedy, err := hftest.Int32s(f, "greedy")
	if err != nil {
		t.Fatal(err)
	}
	want := make([]string, len(greedy))
	for i, id := range greedy {
		want[i] = fmt.Sprint(id)
	}
	const prompt = 4
	g := filepath.Join(t.TempDir(), "gotron")
	mustGotron(t, "convert", "--from", "hf", "--load", src, "--save", g)
	for _, load := range []string{src, g} {
		out := mustGotron(t, "generate", "--load", load, "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
			"--prompt", strings.Join(want[:prompt], " "), "--top-k", "1", "--max-new-tokens", fmt.Sprint(len(want)-prompt))
		if got := strings.Fields(out); !slices.Equal(got, want) {
			t.Fatalf("%s: generate printed %q, want %q (the reference's greedy tokens)", load, got, want)
		}
	}
}
