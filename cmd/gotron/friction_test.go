package main

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
	"github.com/gotron/gotron/train"
)

// gpt2SizedCheckpoint saves a tiny model with GPT-2's padded vocabulary and
// no tokenizer files (what gotron train and the quickstart write) and
// returns its directory.
func gpt2SizedCheckpoint(t *testing.T, maxPos int) string {
	t.Helper()
	m, err := gpt.New(gpt.Config{NumLayers: 1, HiddenSize: 16, NumAttentionHeads: 2, VocabSize: 50304,
		MaxPositionEmbeddings: maxPos, Activation: "gelu_tanh"}, tensor.NewRNG(3))
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
			[]string{"--lr\n", "--cpu-profile", "--save\n", "--sample-prompt"}},
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
