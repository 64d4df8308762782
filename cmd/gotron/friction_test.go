package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
	"github.com/gotron/gotron/tokenizer"
	"github.com/gotron/gotron/train"
)

// gpt2SizedCheckpoint saves a tiny model with GPT-2's padded vocabulary and
// no tokenizer files (what gotron train and the quickstart write) and
// returns its directory.
func gpt2SizedCheckpoint(t *testing.T, maxPos int) string {
	t.Helper()
	m, err := gpt.New(gpt.Config{NumLayers: 1, HiddenSize: 16, NumAttentionHeads: 2, VocabSize: 50304,
		MaxPositionEmbeddings: maxPos, Activation: gpt.GELUTanh}, tensor.NewRNG(3))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "ck")
	if err := train.SaveModel(context.Background(), dir, 0, m, maxPos, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestScoreTextUsesCheckpointTokenizer: score --text finds the tokenizer as
// generate does (here the embedded GPT-2 BPE for a GPT-2-sized vocabulary);
// it used to ask for --tokenizer-type.
func TestScoreTextUsesCheckpointTokenizer(t *testing.T) {
	dir := gpt2SizedCheckpoint(t, 32)
	out, errs, code := runCLI(t, "score", "--load", dir, "--text", "hello world")
	if code != 0 || !strings.Contains(out, `" world"`) {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestGenerateReportsSpeedAndContextStop: generate prints tokens/s on
// stderr, and says when the model's context ends generation early.
func TestGenerateReportsSpeedAndContextStop(t *testing.T) {
	dir := gpt2SizedCheckpoint(t, 8)
	_, errs, code := runCLI(t, "generate", "--load", dir, "--prompt", "hello world", "--max-new-tokens", "20", "--top-k", "1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !regexp.MustCompile(`gotron generate: \d+ tokens in [0-9.]+ s: [0-9.]+ tokens/s`).MatchString(errs) {
		t.Errorf("no tokens/s line in stderr %q", errs)
	}
	if !strings.Contains(errs, "stopped after 7 of --max-new-tokens 20: the model's context of 8 positions (--max-position-embeddings) is full") {
		t.Errorf("no context-length note in stderr %q", errs)
	}
	_, errs, code = runCLI(t, "generate", "--load", dir, "--prompt", "hello world", "--max-new-tokens", "3", "--top-k", "1")
	if code != 0 || strings.Contains(errs, "stopped after") {
		t.Errorf("3 tokens within the context: exit %d, stderr %q", code, errs)
	}
}

// TestHelpListsOwnFlags: a subcommand's --help lists the flags it reads,
// not those of the commands it shares flag definitions with.
func TestHelpListsOwnFlags(t *testing.T) {
	cases := []struct {
		cmd           []string
		want, notWant []string
	}{
		{[]string{"generate"}, []string{"--prompt", "--top-p", "--tokenizer-type"}, []string{"--data-path", "--mock-data", "--split", "--eod-mask-loss"}},
		{[]string{"memory"}, []string{"--world-size", "--num-layers", "--seq-length", "Every other 'gotron train' flag is accepted"},
			[]string{"--lr ", "--cpu-profile ", "--save ", "--sample-prompt "}},
		{[]string{"data", "samples"}, []string{"--data-path", "--seq-length"}, []string{"--mock-data"}},
		{[]string{"score"}, []string{"--tokens-file", "--text"}, []string{"--data-path"}},
	}
	for _, c := range cases {
		out, errs, code := runCLI(t, append(c.cmd, "--help")...)
		if code != 0 {
			t.Fatalf("%v --help: exit %d: %s", c.cmd, code, errs)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v --help lacks %q", c.cmd, w)
			}
		}
		for _, w := range c.notWant {
			if strings.Contains(out, "  "+w) {
				t.Errorf("%v --help lists %q", c.cmd, w)
			}
		}
	}
}

// TestExportGotronCheckpointToHF: a checkpoint gotron trained (GPT-2-sized
// vocabulary, no tokenizer files, no import record) exports with GPT-2's
// tokenizer files and a generation_config.json, the unpadded 50257 rows,
// files of mode 0644 and config floats as written (0.00001, not
// 9.999999747378752e-06).
func TestExportGotronCheckpointToHF(t *testing.T) {
	m, err := gpt.New(gpt.Config{NumLayers: 1, HiddenSize: 16, NumAttentionHeads: 2, VocabSize: 50304,
		MaxPositionEmbeddings: 32, Activation: gpt.GELUTanh, HiddenDropout: 0.1, AttentionDropout: 0.1}, tensor.NewRNG(3))
	if err != nil {
		t.Fatal(err)
	}
	ck := filepath.Join(t.TempDir(), "ck")
	if err := train.SaveModel(context.Background(), ck, 0, m, 32, nil); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "hf")
	stdout, errs, code := runCLI(t, "convert", "--to", "hf", "--load", ck, "--save", out)
	if code != 0 || strings.Contains(errs, "warning") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, errs)
	}
	ents, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode().Perm() != 0o644 {
			t.Errorf("%s has mode %v, want 0644", e.Name(), info.Mode().Perm())
		}
		names = append(names, e.Name())
	}
	want := []string{"config.json", "generation_config.json", "merges.txt", "model.safetensors", "tokenizer_config.json", "vocab.json"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("files %v, want %v", names, want)
	}
	cfg, err := os.ReadFile(filepath.Join(out, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`"layer_norm_epsilon": 0.00001`, `"attn_pdrop": 0.1,`, `"initializer_range": 0.02,`, `"vocab_size": 50257`} {
		if !strings.Contains(string(cfg), w) {
			t.Errorf("config.json lacks %s:\n%s", w, cfg)
		}
	}
	gc, err := os.ReadFile(filepath.Join(out, "generation_config.json"))
	if err != nil || !strings.Contains(string(gc), `"eos_token_id": 50256`) || !strings.Contains(string(gc), `"bos_token_id": 50256`) {
		t.Errorf("generation_config.json %s (%v)", gc, err)
	}
	st, err := safetensors.ReadFile(filepath.Join(out, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if info, ok := st.Info("transformer.wte.weight"); !ok || info.Shape[0] != 50257 {
		t.Errorf("transformer.wte.weight %+v, want 50257 rows", info)
	}
	// The exported directory loads back, tokenizer included.
	if out, errs, code := runCLI(t, "score", "--load", out, "--text", "hello world"); code != 0 || !strings.Contains(out, `" world"`) {
		t.Errorf("score of the export: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestTokenizerExportGPT2 writes the embedded GPT-2 files, which load as a
// GPT2BPETokenizer (--vocab-file, --merge-file).
func TestTokenizerExportGPT2(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gpt2")
	out, errs, code := runCLI(t, "tokenizer", "export-gpt2", dir)
	if code != 0 || !strings.Contains(out, "vocab.json, merges.txt, tokenizer_config.json") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	tok, err := tokenizer.New(tokenizer.Config{Type: tokenizer.TypeGPT2BPE, VocabFile: filepath.Join(dir, "vocab.json"),
		MergeFile: filepath.Join(dir, "merges.txt")})
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != 50257 || tok.EOD() != 50256 {
		t.Fatalf("vocab %d, eod %d", tok.VocabSize(), tok.EOD())
	}
	if _, errs, code := runCLI(t, "tokenizer", "export-gpt"); code == 0 || !strings.Contains(errs, `did you mean "export-gpt2"`) {
		t.Errorf("typo: exit %d, stderr %q", code, errs)
	}
	if _, errs, code := runCLI(t, "tokenizer", "export-gpt2"); code == 0 || !strings.Contains(errs, "want one directory") {
		t.Errorf("no directory: exit %d, stderr %q", code, errs)
	}
}
