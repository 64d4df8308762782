package tokenizer

import (
	"context"
	"strings"
	"testing"
)

var goSnippets = []string{
	"package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello, world\")\n}\n",
	"func (s *Server) Close() error {\n\tif s.closed {\n\t\treturn errClosed\n\t}\n\ts.closed = true\n\treturn nil\n}\n",
	"for i := 0; i < len(xs); i++ {\n\tif err := f(xs[i]); err != nil {\n\t\treturn err\n\t}\n}\n",
	"// Ünïcödé 世界 and a literal <|endoftext|> in a comment; tabs\t\tand  spaces 12345\r\n",
}

// TestTrainGPT2BPEReproducesSegmentation: the trained files load as a
// GPT2BPETokenizer of the asked size whose encoder splits every training
// piece exactly as the training did, and decoding returns the text.
func TestTrainGPT2BPEReproducesSegmentation(t *testing.T) {
	const size = 330
	tr := newBPETrainer(countPieces(goSnippets))
	for len(tr.syms.bytes) < size-1 && tr.mergeBest() {
	}
	files := tr.files()
	tok, err := files.Tokenizer()
	if err != nil {
		t.Fatalf("%v\n%s", err, files.VocabJSON)
	}
	if tok.VocabSize() != size || tok.EOD() != size-1 {
		t.Fatalf("vocabulary %d, EOD %d; want %d, %d", tok.VocabSize(), tok.EOD(), size, size-1)
	}
	for _, w := range tr.words {
		var piece strings.Builder
		for _, s := range w.syms {
			piece.WriteString(tr.syms.bytes[s])
		}
		ids := tok.Encode(piece.String())
		if len(ids) != len(w.syms) {
			t.Fatalf("piece %q: encoder gives %d tokens, training %d", piece.String(), len(ids), len(w.syms))
		}
		for j, id := range ids {
			if got, want := tok.Decode([]int{id}), tr.syms.bytes[w.syms[j]]; got != want {
				t.Errorf("piece %q token %d: encoder %q, training %q", piece.String(), j, got, want)
			}
		}
	}
	tokens, bytes := 0, 0
	for _, text := range goSnippets {
		ids := tok.Encode(text)
		if got := tok.Decode(ids); got != text {
			t.Errorf("round trip of %q gives %q", text, got)
		}
		tokens, bytes = tokens+len(ids), bytes+len(text)
	}
	if merges := len(tr.merges); merges < size-257 || tokens > bytes-merges { // each merge saves at least one token
		t.Errorf("%d merges left %d tokens for %d bytes", merges, tokens, bytes)
	}
	if ids := tok.Encode("<|endoftext|>"); len(ids) != 1 || ids[0] != tok.EOD() {
		t.Errorf("<|endoftext|> encodes to %v, want [%d]", ids, tok.EOD())
	}
}

// TestTrainGPT2BPEFrequentWordIsOneToken: the most frequent piece of a
// repetitive text ends up as one token, and training is deterministic.
func TestTrainGPT2BPEFrequentWordIsOneToken(t *testing.T) {
	text := strings.Repeat("if err != nil {\n\treturn err\n}\n", 50)
	a, err := TrainGPT2BPE(context.Background(), []string{text}, 280)
	if err != nil {
		t.Fatal(err)
	}
	b, err := TrainGPT2BPE(context.Background(), []string{text}, 280)
	if err != nil {
		t.Fatal(err)
	}
	if string(a.VocabJSON) != string(b.VocabJSON) || string(a.MergesTxt) != string(b.MergesTxt) {
		t.Fatal("two trainings on the same text differ")
	}
	tok, err := a.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{" err", "return", " nil"} {
		if ids := tok.Encode(w); len(ids) != 1 {
			t.Errorf("%q encodes to %d tokens, want 1", w, len(ids))
		}
	}
}

// TestTrainGPT2BPETies: among pairs of equal count the one whose bytes sort
// first merges first (" c" < "ab" < "cd": space is 0x20).
func TestTrainGPT2BPETies(t *testing.T) {
	f, err := TrainGPT2BPE(context.Background(), []string{"ab cd"}, 258)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(f.MergesTxt), "#version: 0.2\nĠ c\n"; got != want {
		t.Errorf("merges.txt %q, want %q", got, want)
	}
}

// TestTrainGPT2BPEBytesAndLimits: 257 is the byte-level tokenizer (one token
// per byte), a small text runs out of pairs before a large vocabulary, and
// sizes below 257 are refused.
func TestTrainGPT2BPEBytesAndLimits(t *testing.T) {
	f, err := TrainGPT2BPE(context.Background(), goSnippets, 257)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := f.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range goSnippets {
		text = strings.ReplaceAll(text, GPT2EndOfText, "")
		if ids := tok.Encode(text); len(ids) != len(text) || tok.Decode(ids) != text {
			t.Errorf("byte-level tokenizer: %d ids for %d bytes of %q", len(ids), len(text), text)
		}
	}
	f, err = TrainGPT2BPE(context.Background(), []string{"abab abab"}, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if tok, err = f.Tokenizer(); err != nil {
		t.Fatal(err)
	}
	// Pieces "abab" and " abab": merges ab, abab, " abab" (or Ġ+ab first).
	if tok.VocabSize() >= 1000 || len(tok.Encode("abab abab")) != 2 {
		t.Errorf("vocabulary %d, %d tokens for the text; want it to stop when the pieces are single tokens", tok.VocabSize(), len(tok.Encode("abab abab")))
	}
	if _, err := TrainGPT2BPE(context.Background(), goSnippets, 256); err == nil || !strings.Contains(err.Error(), "≥ 257") {
		t.Errorf("size 256: err %v, want a refusal", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := TrainGPT2BPE(ctx, goSnippets, 300); err != context.Canceled {
		t.Errorf("cancelled context: err %v", err)
	}
}
