package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestServeGenerateAndInferenceMLA: trained multi-latent attention
// checkpoints — with --q-lora-rank and YaRN (factor 40, DeepSeek-V2's
// mscales), and with a plain query projection and v wider than the q/k
// heads — decode: gotron serve's greedy completions (two requests batched in
// the engine's steps) and gotron inference's (Megatron's MLA arguments
// given, checked against the checkpoint's) equal gotron generate's text;
// --sample-prompt samples after training. With --cache-mla-latents (the
// latents cached, the up-projection absorbed) the text is the same.
func TestServeGenerateAndInferenceMLA(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "gpt2")
	if _, errs, code := runCLI(t, "tokenizer", "export-gpt2", tok); code != 0 {
		t.Fatalf("tokenizer export-gpt2: %s", errs)
	}
	tokFlags := []string{"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", filepath.Join(tok, "vocab.json"), "--merge-file", filepath.Join(tok, "merges.txt")}
	for _, c := range []struct {
		name string
		mla  []string
	}{
		{"qlora-yarn", []string{"--multi-latent-attention", "--q-lora-rank", "12", "--kv-lora-rank", "10", "--qk-head-dim", "6",
			"--qk-pos-emb-head-dim", "4", "--v-head-dim", "5", "--rotary-scaling-factor", "40", "--mscale", "0.707", "--mscale-all-dim", "0.707"}},
		{"plain-q", []string{"--multi-latent-attention", "--kv-lora-rank", "12", "--qk-head-dim", "2", "--qk-pos-emb-head-dim", "4",
			"--v-head-dim", "8", "--rotary-scaling-factor", "4", "--mscale-all-dim", "0.5"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "tiny-mla")
			args := append([]string{"train", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
				"--seq-length", "16", "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "2",
				"--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear", "--position-embedding-type", "none",
				"--lr", "1e-3", "--mock-data", "--vocab-size", "50257", "--train-iters", "1", "--eval-iters", "0",
				"--init-method-std", "0.5", "--save", dir, "--sample-prompt", "Once", "--sample-tokens", "4"}, c.mla...)
			_, errs, code := runCLI(t, args...)
			if code != 0 {
				t.Fatalf("train: %s", errs)
			}
			prompts := []string{"Once upon a time", "The capital of France is"}
			want := []string{generateText(t, dir, prompts[0], 10), generateText(t, dir, prompts[1], 10)}
			if got := generateText(t, dir, prompts[0], 10, "--cache-mla-latents"); got != want[0] {
				t.Fatalf("generate --cache-mla-latents printed %q, without %q", got, want[0])
			}
			for _, latents := range [][]string{nil, {"--cache-mla-latents"}} {
				base, stop := startServe(t, append([]string{"--load", dir}, latents...)...)
				body := `{"prompt":["` + prompts[0] + `","` + prompts[1] + `"],"max_tokens":10,"temperature":0}`
				code, b := postJSON(t, base+"/v1/completions", body)
				stop()
				var r struct{ Choices []struct{ Text string } }
				if code != 200 || json.Unmarshal(b, &r) != nil || len(r.Choices) != 2 || r.Choices[0].Text != want[0] || r.Choices[1].Text != want[1] {
					t.Fatalf("serve %v: %d %s; generate printed %q", latents, code, b, want)
				}
				inf := append(append(append([]string{"inference", "--load", dir, "--top_k", "1", "--num-tokens-to-generate", "10",
					"--termination-id", "-1", "--prompts", prompts[0], "--output-path", filepath.Join(t.TempDir(), "out.json")}, c.mla...), latents...), tokFlags...)
				so, errs, code := runCLI(t, inf...)
				if code != 0 || !strings.Contains(so, prompts[0]+want[0]) {
					t.Fatalf("inference %v: %d %q %s; generate continued with %q", latents, code, so, errs, want[0])
				}
			}
			// Megatron's MLA arguments must be the checkpoint's
			bad := append([]string{"inference", "--load", dir, "--prompts", "x", "--output-path", filepath.Join(t.TempDir(), "o.json"),
				"--multi-latent-attention", "--v-head-dim", "7"}, tokFlags...)
			if _, errs, code := runCLI(t, bad...); code == 0 || !strings.Contains(errs, "--v-head-dim 7: the checkpoint") {
				t.Fatalf("inference with another --v-head-dim: exit %d, %s", code, errs)
			}
		})
	}
}

// TestCacheMLALatentsRefusals: --cache-mla-latents on a model without
// multi-latent attention is refused naming the model, by generate and
// serve (train refuses it without --multi-latent-attention:
// TestMegatronCompatRefusals).
func TestCacheMLALatentsRefusals(t *testing.T) {
	ck := hfFixture("llama_gqa_untied_f32")
	for _, args := range [][]string{
		{"generate", "--load", ck, "--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--prompt", "1 2", "--cache-mla-latents"},
		{"serve", "--load", ck, "--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--port", "0", "--cache-mla-latents"},
	} {
		_, errs, code := runCLI(t, args...)
		if code == 0 || !strings.Contains(errs, "--cache-mla-latents: the model "+ck+" has no multi-latent attention") {
			t.Errorf("%s --cache-mla-latents on a Llama: exit %d, %s", args[0], code, errs)
		}
	}
}
