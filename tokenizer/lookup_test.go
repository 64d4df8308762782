package tokenizer

import (
	"slices"
	"testing"
)

// TestTokenLookup: TokenID finds vocabulary and added tokens by their
// string, and DecodeSkippingSpecials drops exactly the special tokens
// (Hugging Face's ids_to_text(remove_special_tokens=True)).
func TestTokenLookup(t *testing.T) {
	cfg := `{"added_tokens":[
		{"id":10,"content":"<fim_prefix>","special":true,"lstrip":false,"rstrip":false,"single_word":false},
		{"id":11,"content":"<plain>","special":false,"lstrip":false,"rstrip":false,"single_word":false}],
		"pre_tokenizer":{"type":"WhitespaceSplit"},
		"decoder":{"type":"WordPiece","prefix":"##","cleanup":false},
		"model":{"type":"WordPiece","unk_token":"[UNK]","vocab":{"[UNK]":0,"x":1,"y":2,"ab":3,"##ab":4}}}`
	hf, err := ParseHuggingFace([]byte(cfg), nil)
	if err != nil {
		t.Fatal(err)
	}
	for tok, want := range map[string]int{"<fim_prefix>": 10, "<plain>": 11, "##ab": 4, "x": 1} {
		if id, ok := hf.TokenID(tok); !ok || id != want {
			t.Errorf("TokenID(%q) = %d, %v; want %d", tok, id, ok, want)
		}
	}
	if id, ok := hf.TokenID("<fim_middle>"); ok {
		t.Errorf("TokenID(<fim_middle>) = %d, want not found", id)
	}
	ids := []int{1, 10, 3, 4, 11, 2}
	if got, all := hf.DecodeSkippingSpecials(ids), hf.Decode(ids); got == all || got != hf.Decode([]int{1, 3, 4, 11, 2}) {
		t.Errorf("DecodeSkippingSpecials = %q (Decode %q): want the text without <fim_prefix> only", got, all)
	}

	g, err := ParseGPT2([]byte(`{"a":0,"b":1,"ab":2,"<|endoftext|>":3}`), []byte("#version: 0.2\na b\n"), "vocab.json", "merges.txt")
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := g.TokenID("ab"); !ok || id != 2 {
		t.Errorf("GPT2 TokenID(ab) = %d, %v", id, ok)
	}
	if _, ok := g.TokenID("<fim_prefix>"); ok {
		t.Error("GPT2 TokenID(<fim_prefix>) found")
	}
	if got := g.DecodeSkippingSpecials([]int{2, 3, 0, 3}); got != "aba" {
		t.Errorf("GPT2 DecodeSkippingSpecials = %q, want %q", got, "aba")
	}
	if got := g.Decode([]int{2, 3, 0}); !slices.Contains([]string{"ab<|endoftext|>a"}, got) {
		t.Errorf("GPT2 Decode keeps <|endoftext|>: got %q", got)
	}
}
