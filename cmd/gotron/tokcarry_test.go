package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/hf"
	"github.com/gotron/gotron/tokenizer"
)

// copyFiles copies the named files of src into a new directory.
func copyFiles(t *testing.T, src string, names ...string) string {
	t.Helper()
	dst := t.TempDir()
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(src, n))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// TestCheckpointCarriesTokenizer: a checkpoint trained with a tokenizer
// carries it, so generate and score need no tokenizer flags even after the
// tokenizer's own files are deleted; a resumed run with another tokenizer
// is refused; a GPT-2-sized vocabulary without a carried tokenizer says
// that it falls back to GPT-2's.
func TestCheckpointCarriesTokenizer(t *testing.T) {
	tokDir := copyFiles(t, "../../ckpt/hf/testdata/gpt2_tied_f32", "vocab.json", "merges.txt")
	ck := filepath.Join(t.TempDir(), "ck")
	args := []string{"train", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4",
		"--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "2", "--lr", "1e-3", "--lr-decay-iters", "100", "--mock-data",
		"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", filepath.Join(tokDir, "vocab.json"), "--merge-file", filepath.Join(tokDir, "merges.txt"),
		"--eval-iters", "0", "--save", ck}
	if _, errs, code := runCLI(t, append(args, "--train-iters", "2")...); code != 0 {
		t.Fatalf("train exit %d: %s", code, errs)
	}
	if err := os.RemoveAll(tokDir); err != nil {
		t.Fatal(err)
	}
	out, errs, code := runCLI(t, "generate", "--load", ck, "--prompt", "hello", "--max-new-tokens", "4", "--top-k", "1")
	if code != 0 {
		t.Fatalf("generate from the checkpoint alone: exit %d: %s", code, errs)
	}
	if !strings.HasPrefix(out, "hello") || strings.Contains(errs, "carries no tokenizer") {
		t.Fatalf("generate printed %q, stderr %q", out, errs)
	}
	if _, errs, code := runCLI(t, "score", "--load", ck, "--text", "hello world", "--out", filepath.Join(t.TempDir(), "s.npy")); code != 0 {
		t.Fatalf("score --text from the checkpoint alone: exit %d: %s", code, errs)
	}

	// The manifest names the type: a SentencePiece model is read as
	// SentencePieceTokenizer, not as the Llama2Tokenizer its file name
	// alone would suggest.
	spm := copyFiles(t, "../../tokenizer/testdata/spm", "bpe_nfkc.model")
	sp := filepath.Join(t.TempDir(), "sp")
	if err := carryRunTokenizer(sp, tokenizer.Config{Type: tokenizer.TypeSentencePiece, Model: filepath.Join(spm, "bpe_nfkc.model")}); err != nil {
		t.Fatal(err)
	}
	cfg, ok, err := carriedTokenizerConfig(filepath.Join(sp, hf.TokenizerDir))
	if err != nil || !ok || cfg.Type != tokenizer.TypeSentencePiece || cfg.Model != filepath.Join(sp, hf.TokenizerDir, "tokenizer.model") {
		t.Fatalf("carried %+v %v %v", cfg, ok, err)
	}

	// Resuming into the directory with another tokenizer is refused.
	other := copyFiles(t, "../../ckpt/hf/testdata/gpt2_tied_f32", "vocab.json", "merges.txt")
	os.WriteFile(filepath.Join(other, "merges.txt"), []byte("#version: 0.2\n"), 0o644)
	resume := append([]string{}, args...)
	for i, a := range resume {
		if strings.HasSuffix(a, "merges.txt") {
			resume[i] = filepath.Join(other, "merges.txt")
		}
		if strings.HasSuffix(a, "vocab.json") {
			resume[i] = filepath.Join(other, "vocab.json")
		}
	}
	if _, errs, code := runCLI(t, append(resume, "--train-iters", "2", "--load", ck)...); code == 0 || !strings.Contains(errs, "carries another tokenizer") {
		t.Fatalf("resume with another tokenizer: exit %d: %s", code, errs)
	}

	// No carried tokenizer and GPT-2's vocabulary: the fallback is named.
	gpt2ck := filepath.Join(t.TempDir(), "g")
	if _, errs, code := runCLI(t, "train", "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
		"--micro-batch-size", "1", "--global-batch-size", "1", "--lr", "1e-3", "--mock-data", "--eval-iters", "0",
		"--train-iters", "1", "--save", gpt2ck); code != 0 {
		t.Fatalf("train exit %d: %s", code, errs)
	}
	_, errs, code = runCLI(t, "generate", "--load", gpt2ck, "--prompt", "hello", "--max-new-tokens", "1")
	if code != 0 || !strings.Contains(errs, "carries no tokenizer") || !strings.Contains(errs, "built-in GPT-2 BPE") {
		t.Fatalf("generate with GPT-2's vocabulary and no tokenizer: exit %d: %s", code, errs)
	}
}
