package tokenizer

import (
	"path/filepath"
	"strings"
	"testing"
	"testing/quick"
	"unicode/utf8"
)

// roundTripSeeds are fuzz seeds: pre-tokenizer edge cases and corpus lines.
func roundTripSeeds(t testing.TB) []string {
	seeds := append([]string{}, pretokCases...)
	lines := strings.Split(string(readTestdata(t, "multilingual.txt.gz")), "\n")
	for i := 0; i < len(lines); i += 97 {
		seeds = append(seeds, lines[i])
	}
	return append(seeds, "\xff\xfe invalid \xc3", "<|endoftext|> inside", "  leading", "trailing  ", "\t\n\r\v\f")
}

// lossless lists the tokenizers for which decode(encode(x)) == x, with the
// inputs each accepts (byte-level ones take any bytes; SentencePiece-style
// ones valid UTF-8 without "▁", which decodes to a space).
func lossless(t testing.TB) []struct {
	name string
	tok  Tokenizer
	ok   func(string) bool
} {
	anyBytes := func(string) bool { return true }
	spText := func(s string) bool { return utf8.ValidString(s) && !strings.Contains(s, spSpace) }
	sp, err := LoadSentencePiece(filepath.Join("testdata", "spm", "llama2_bpe.model"))
	if err != nil {
		t.Fatal(err)
	}
	fx := hfFixtures(t)
	hf3, err := ParseHuggingFace(fx["llama3"], nil)
	if err != nil {
		t.Fatal(err)
	}
	hf2, err := ParseHuggingFace(fx["llama2"], nil)
	if err != nil {
		t.Fatal(err)
	}
	tik, err := ParseTikToken(mustJSONTikToken(t), TikTokenOptions{Pattern: "v1", VocabSize: 1000 + 260, NumSpecialTokens: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return []struct {
		name string
		tok  Tokenizer
		ok   func(string) bool
	}{
		{"gpt2", gpt2Fixture(t), anyBytes},
		{"sentencepiece", sp, spText},
		{"hf-llama3", hf3, anyBytes},
		{"hf-llama2", hf2, func(s string) bool {
			return spText(s) && !strings.Contains(s, "<s>") && !strings.Contains(s, "</s>") && !strings.Contains(s, "<unk>")
		}},
		{"tiktoken-v1", tik, anyBytes},
	}
}

func mustJSONTikToken(t testing.TB) []byte {
	var entries []map[string]any
	for i := range 256 {
		entries = append(entries, map[string]any{"rank": i, "token_bytes": b64([]byte{byte(i)}), "token_str": ""})
	}
	for _, s := range []string{"th", "the", " the", "in"} {
		entries = append(entries, map[string]any{"rank": len(entries), "token_bytes": b64([]byte(s)), "token_str": s})
	}
	return mustJSON(t, entries)
}

// TestRoundTripQuick: decode(encode(x)) == x on random strings.
func TestRoundTripQuick(t *testing.T) {
	for _, tc := range lossless(t) {
		f := func(s string) bool {
			if !tc.ok(s) {
				return true
			}
			return tc.tok.Decode(tc.tok.Encode(s)) == s
		}
		if err := quick.Check(f, &quick.Config{MaxCount: 300}); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		for _, s := range roundTripSeeds(t) {
			if tc.ok(s) {
				if back := tc.tok.Decode(tc.tok.Encode(s)); back != s {
					t.Errorf("%s: decode(encode(%q)) = %q", tc.name, s, back)
				}
			}
		}
	}
}

// FuzzRoundTrip: decode(encode(x)) == x for every lossless tokenizer
// (go test -fuzz FuzzRoundTrip ./tokenizer for a long run).
func FuzzRoundTrip(f *testing.F) {
	for _, s := range roundTripSeeds(f) {
		f.Add(s)
	}
	toks := lossless(f)
	f.Fuzz(func(t *testing.T, s string) {
		for _, tc := range toks {
			if tc.ok(s) {
				if back := tc.tok.Decode(tc.tok.Encode(s)); back != s {
					t.Errorf("%s: decode(encode(%q)) = %q", tc.name, s, back)
				}
			}
		}
	})
}
