package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/hf/hftest"
	"github.com/gotron/gotron/ckpt/safetensors"
	"path/filepath"
)

// TestGenerateHFDirTensorParallel: gotron generate straight from a Hugging
// Face directory over tensor-parallel ranks (each rank importing only its
// slice, hf.ImportOptions.Part) prints what one process prints: GPT-2 with
// its own tokenizer, Llama (MHA, sharded F16 files) at TP=2 and TP=2×PP=2,
// Qwen3-MoE, DeepSeek-V2 (multi-latent attention) and Qwen3-Next (gated
// delta nets; its reference's greedy tokens) at TP=2, and Qwen3-MoE over two
// expert-parallel ranks; serve at TP=2 answers what generate prints; a
// TP size the query groups do not divide is refused naming the flags.
func TestGenerateHFDirTensorParallel(t *testing.T) {
	gpt2 := hfFixture("gpt2_tied_f32")
	for _, sampling := range [][]string{{"--top-k", "1"}, {"--temperature", "0.7", "--seed", "9"}} {
		gen := append([]string{"generate", "--load", gpt2, "--prompt", "the quick brown", "--max-new-tokens", "12"}, sampling...)
		one := mustGotron(t, gen...)
		got := mustGotron(t, append([]string{"launch", "--inproc", "--nproc-per-node", "2", "--"}, append(gen, "--tensor-model-parallel-size", "2")...)...)
		if got != "[rank0]: "+one {
			t.Errorf("generate %v from %s at TP=2 printed %q, one process %q", sampling, gpt2, got, one)
		}
		t.Logf("gpt2 %v at TP=2: %q", sampling, got)
	}
	for _, c := range []struct {
		fixture string
		layout  []string
	}{
		{"llama_mha_untied_f16_sharded", []string{"--tensor-model-parallel-size", "2"}},
		{"llama_mha_untied_f16_sharded", []string{"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}},
		{"qwen3_moe_step2_tied_f32", []string{"--tensor-model-parallel-size", "2"}},
		{"qwen3_moe_untied_f32", []string{"--expert-model-parallel-size", "2"}},
		{"deepseek_v2_tied_f32", []string{"--tensor-model-parallel-size", "2"}},
		{"qwen3_next_untied_f32", []string{"--tensor-model-parallel-size", "2"}},
	} {
		src := hfFixture(c.fixture)
		gen := []string{"generate", "--load", src, "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
			"--prompt", "1 17 42 99", "--top-k", "1", "--max-new-tokens", "8"}
		one := mustGotron(t, gen...)
		ranks := 2
		if slices.Contains(c.layout, "--pipeline-model-parallel-size") {
			ranks = 4
		}
		got := mustGotron(t, append([]string{"launch", "--inproc", "--nproc-per-node", fmt.Sprint(ranks), "--"}, append(gen, c.layout...)...)...)
		if got != "[rank0]: "+one {
			t.Errorf("generate from %s at %v printed %q, one process %q", c.fixture, c.layout, got, one)
		}
		t.Logf("%s at %v: %q", c.fixture, c.layout, got)
		if c.fixture != "qwen3_next_untied_f32" {
			continue
		}
		// and the reference's greedy continuation of its own prompt
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
		out := mustGotron(t, "launch", "--inproc", "--nproc-per-node", "2", "--", "generate", "--load", src, "--tokenizer-type", "NullTokenizer",
			"--vocab-size", "100", "--prompt", strings.Join(want[:4], " "), "--top-k", "1", "--max-new-tokens", fmt.Sprint(len(want)-4),
			"--tensor-model-parallel-size", "2")
		if got := strings.Fields(strings.TrimPrefix(out, "[rank0]: ")); !slices.Equal(got, want) {
			t.Errorf("%s at TP=2: generate printed %q, want %q (the reference's greedy tokens)", src, got, want)
		}
	}

	// a size the heads do not divide is refused, naming the flags and sizes
	gqa := hfFixture("llama_gqa_untied_f32") // 2 query groups
	_, errs, code := gotronHF(t, "launch", "--inproc", "--nproc-per-node", "4", "--", "generate", "--load", gqa, "--tokenizer-type", "NullTokenizer",
		"--vocab-size", "100", "--prompt", "1 2", "--max-new-tokens", "2", "--tensor-model-parallel-size", "4")
	if want := "--num-query-groups=2 is not divisible by --tensor-model-parallel-size=4"; code == 0 || !strings.Contains(errs, want) {
		t.Errorf("generate from %s at TP=4: exit %d, %q; want an error naming %q", gqa, code, errs, want)
	}

	prompt := "the" // the fixture's context is 16 tokens
	want := generateText(t, gpt2, prompt, 8)
	base, stop := serveOverTwoRanks(t, gpt2, "--tensor-model-parallel-size")
	code, body := postJSON(t, base+"/v1/completions", `{"prompt":"`+prompt+`","max_tokens":8,"temperature":0}`)
	var r struct{ Choices []struct{ Text string } }
	if code != 200 || json.Unmarshal(body, &r) != nil || len(r.Choices) != 1 || r.Choices[0].Text != want {
		t.Errorf("serve from %s at TP=2: completion of %q: %d %s; one process's generate: %q", gpt2, prompt, code, body, want)
	}
	stop()
}
