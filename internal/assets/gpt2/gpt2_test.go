package gpt2

import "testing"

func TestEmbeddedTokenizer(t *testing.T) {
	tok, err := Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != 50257 || tok.EOD() != 50256 {
		t.Fatalf("vocab %d eod %d", tok.VocabSize(), tok.EOD())
	}
	// "Hello world" is [15496, 995] in GPT-2.
	if ids := tok.Encode("Hello world"); len(ids) != 2 || ids[0] != 15496 || ids[1] != 995 {
		t.Fatalf("Hello world -> %v", ids)
	}
}
