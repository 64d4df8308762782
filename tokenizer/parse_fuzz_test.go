package tokenizer

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParseSentencePiece: corrupt .model files give errors or working
// tokenizers, never panics.
func FuzzParseSentencePiece(f *testing.F) {
	for _, name := range []string{"llama2_bpe", "unigram_bytes"} {
		b, err := os.ReadFile(filepath.Join("testdata", "spm", name+".model"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[:min(len(b), 4000)])
		f.Add(b)
	}
	f.Add([]byte("\x0a\x05\x0a\x03abc"))
	f.Fuzz(func(t *testing.T, b []byte) {
		sp, err := ParseSentencePiece(b)
		if err != nil {
			return
		}
		ids := sp.Encode("Hello wörld 123 日本")
		sp.Decode(ids)
		sp.Decode([]int{-1, 0, 1 << 30})
		NewMegatronSentencePiece(sp, 1).Encode("a<EOD>b")
	})
}

// FuzzParseHuggingFace: corrupt tokenizer.json files give errors or working
// tokenizers, never panics.
func FuzzParseHuggingFace(f *testing.F) {
	fx := hfFixtures(f)
	f.Add(fx["llama2"])
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},"pre_tokenizer":{"type":"Metaspace"},"decoder":{"type":"Metaspace"}}`))
	f.Add([]byte(`{"model":{"type":"WordPiece","unk_token":"[UNK]","vocab":{"[UNK]":0,"a":1,"##b":2}},"normalizer":{"type":"NFKC"},"pre_tokenizer":{"type":"BertPreTokenizer"},"decoder":{"type":"WordPiece"}}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"Split","pattern":{"Regex":"\\s+"},"behavior":"MergedWithNext"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tok, err := ParseHuggingFace(b, nil)
		if err != nil {
			return
		}
		ids := tok.Encode("Hello wörld 123 日本 <s>")
		tok.Decode(ids)
		tok.Tokenize("x")
		tok.Decode([]int{-1, 1 << 30})
	})
}
