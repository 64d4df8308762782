package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// gotronOnPath builds the gotron binary and links it as dir/bin/gotron, so
// a Megatron launch script with only the program name changed finds it;
// it returns the PATH that puts it first.
func gotronOnPath(t *testing.T, dir string) string {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("bash not found: %v", err)
	}
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	binDir := filepath.Join(dir, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, filepath.Join(binDir, "gotron")); err != nil {
		t.Fatal(err)
	}
	return "PATH=" + binDir + string(os.PathListSeparator) + os.Getenv("PATH")
}

// gpt2Corpus writes GPT-2's tokenizer files under dir/gpt2 and a docs-
// document corpus tokenized by them, with end-of-document tokens, as
// gotron preprocess makes it: the dataset prefix dir/corpus_text_document.
func gpt2Corpus(t *testing.T, dir string, docs int) (data, vocab, merges string) {
	t.Helper()
	tok := filepath.Join(dir, "gpt2")
	if _, errs, code := runCLI(t, "tokenizer", "export-gpt2", tok); code != 0 {
		t.Fatalf("tokenizer export-gpt2: %s", errs)
	}
	var corpus strings.Builder
	for i := range docs {
		line, _ := json.Marshal(map[string]string{"text": fmt.Sprintf("Document %d: the quick brown fox jumps over the lazy dog %d times, and func main() { return %d }.", i, i%7, i*i)})
		corpus.Write(line)
		corpus.WriteByte('\n')
	}
	in := filepath.Join(dir, "corpus.jsonl")
	if err := os.WriteFile(in, []byte(corpus.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	vocab, merges = filepath.Join(tok, "vocab.json"), filepath.Join(tok, "merges.txt")
	if _, errs, code := runCLI(t, "preprocess", "--input", in, "--output-prefix", filepath.Join(dir, "corpus"),
		"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges, "--append-eod"); code != 0 {
		t.Fatalf("preprocess: %s", errs)
	}
	return filepath.Join(dir, "corpus_text_document"), vocab, merges
}
