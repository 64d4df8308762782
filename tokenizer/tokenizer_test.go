package tokenizer

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"testing/quick"
)

// TestPaddedVocabSize: Megatron's vocab_size_with_padding
// (megatron/core/tokenizers/utils/build_tokenizer.py; _vocab_size_with_padding
// in older releases).
func TestPaddedVocabSize(t *testing.T) {
	for _, tc := range []struct{ orig, div, tp, want int }{
		{50257, 128, 1, 50304},
		{50257, 128, 8, 51200},
		{32000, 128, 1, 32000},
		{32000, 128, 3, 32256},
		{128256, 128, 8, 129024},
		{1, 128, 1, 128},
		{100, 0, 0, 100}, // zero divisors count as 1
	} {
		if got := PaddedVocabSize(tc.orig, tc.div, tc.tp); got != tc.want {
			t.Errorf("PaddedVocabSize(%d, %d, %d) = %d, want %d", tc.orig, tc.div, tc.tp, got, tc.want)
		}
	}
}

// writeGPT2Files writes the GPT-2 fixtures as plain files (New reads files).
func writeGPT2Files(t *testing.T) (vocab, merges string) {
	dir := t.TempDir()
	vocab, merges = filepath.Join(dir, "vocab.json"), filepath.Join(dir, "merges.txt")
	if err := os.WriteFile(vocab, readTestdata(t, "gpt2/vocab.json.gz"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(merges, readTestdata(t, "gpt2/merges.txt.gz"), 0o644); err != nil {
		t.Fatal(err)
	}
	return vocab, merges
}

// TestNew: every --tokenizer-type builds from its files with Megatron's
// vocabulary size and EOD, and Tokenize adds what Megatron's tokenize adds.
func TestNew(t *testing.T) {
	vocab, merges := writeGPT2Files(t)
	llama := filepath.Join("testdata", "spm", "llama2_bpe.model")
	hfDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(hfDir, "tokenizer.json"), hfFixtures(t)["llama2"], 0o644); err != nil {
		t.Fatal(err)
	}
	tik := writeTikTokenVocab(t, "he", "ll")
	for _, tc := range []struct {
		cfg       Config
		vocab     int
		eod       int
		tokenized []int // Tokenize("hello")[:1] when not nil
	}{
		{Config{Type: TypeGPT2BPE, VocabFile: vocab, MergeFile: merges}, 50257, 50256, []int{31373}},
		{Config{Type: TypeGPTSentencePiece, Model: llama}, 1000, 2, nil},
		{Config{Type: TypeLlama2, Model: llama}, 1000, 2, []int{1}},
		// SentencePieceTokenizer adds <CLS> <SEP> <EOD> <MASK> <PAD>; <s> and </s> exist.
		{Config{Type: TypeSentencePiece, Model: llama}, 1005, 1002, nil},
		{Config{Type: TypeSentencePiece, Model: llama, VocabExtraIDs: 3}, 1008, 1002, nil},
		{Config{Type: TypeHuggingFace, Model: hfDir}, 1000, 2, []int{1}},
		{Config{Type: TypeTikToken, Model: tik, TikTokenPattern: "v1", VocabSize: 1000 + 258}, 1258, 2, nil},
		{Config{Type: TypeNull, VocabSize: 100}, 100, 99, nil},
	} {
		tok, err := New(tc.cfg)
		if err != nil {
			t.Errorf("New(%+v): %v", tc.cfg, err)
			continue
		}
		if tok.VocabSize() != tc.vocab || tok.EOD() != tc.eod {
			t.Errorf("%s: VocabSize %d EOD %d, want %d %d", tc.cfg.Type, tok.VocabSize(), tok.EOD(), tc.vocab, tc.eod)
		}
		if tc.tokenized != nil {
			if got := Tokenize(tok, "hello"); !slices.Equal(got[:1], tc.tokenized) {
				t.Errorf("%s: Tokenize(hello) = %v, want prefix %v", tc.cfg.Type, got, tc.tokenized)
			}
		}
	}
}

// TestNewErrors: bad configs are errors naming the flag, never panics.
func TestNewErrors(t *testing.T) {
	vocab, merges := writeGPT2Files(t)
	bad := filepath.Join(t.TempDir(), "bad")
	if err := os.WriteFile(bad, []byte("not a model"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []Config{
		{},
		{Type: "GPT3Tokenizer"},
		{Type: TypeGPT2BPE, VocabFile: vocab},
		{Type: TypeGPT2BPE, VocabFile: vocab, MergeFile: "/nonexistent/merges.txt"},
		{Type: TypeGPT2BPE, VocabFile: merges, MergeFile: merges},
		{Type: TypeGPT2BPE, VocabFile: vocab, MergeFile: vocab},
		{Type: TypeLlama2},
		{Type: TypeLlama2, Model: bad},
		{Type: TypeSentencePiece, Model: vocab},
		{Type: TypeHuggingFace, Model: bad},
		{Type: TypeHuggingFace, Model: vocab},
		{Type: TypeTikToken, Model: vocab, TikTokenPattern: "v1"},
		{Type: TypeNull},
		{Type: TypeNull, VocabSize: -1},
	} {
		if tok, err := New(cfg); err == nil {
			t.Errorf("New(%+v) = %T, want an error", cfg, tok)
		} else {
			t.Logf("%+v: %v", cfg, err)
		}
	}
	if _, err := New(Config{Type: "x"}); !errors.Is(err, ErrConfig) {
		t.Errorf("unknown type: %v is not ErrConfig", err)
	}
}

// TestNull: ids round-trip through text; EOD = vocab-1.
func TestNull(t *testing.T) {
	tok, err := NewNull(10)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Encode(" 1  2\n3 "); !slices.Equal(got, []int{1, 2, 3}) {
		t.Errorf("Encode = %v", got)
	}
	if _, err := tok.Parse("1 x 2"); err == nil {
		t.Error("Parse(1 x 2) succeeded")
	}
	f := func(ids []uint16) bool {
		in := make([]int, len(ids))
		for i, v := range ids {
			in[i] = int(v)
		}
		return slices.Equal(tok.Encode(tok.Decode(in)), in)
	}
	if err := quick.Check(f, nil); err != nil {
		t.Error(err)
	}
}
