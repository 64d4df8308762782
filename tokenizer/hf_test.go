package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

// TestHuggingFaceTokenizersJS: ids equal Hugging Face's tokenizers.js on
// the multilingual corpus for six tokenizer.json kinds: GPT-2 ByteLevel,
// Llama-3 style Split+ByteLevel with ignore_merges and the same after NFKC
// (whole corpus as one text), Llama-2 style BPE with byte fallback, BERT
// WordPiece cased and uncased (accents stripped) (per line).
func TestHuggingFaceTokenizersJS(t *testing.T) {
	fixtures := hfFixtures(t)
	corpus := string(readTestdata(t, "multilingual.txt.gz"))
	lines := strings.Split(strings.TrimSuffix(corpus, "\n"), "\n")
	for _, name := range []string{"gpt2", "llama3", "nfkc_llama3", "llama2", "bert", "bert_uncased"} {
		t.Run(name, func(t *testing.T) {
			tok, err := ParseHuggingFace(fixtures[name], nil)
			if err != nil {
				t.Fatal(err)
			}
			want := strings.Split(strings.TrimSuffix(string(readTestdata(t, "hf/"+name+".ids.gz")), "\n"), "\n")
			texts := lines
			if name == "gpt2" || strings.HasSuffix(name, "llama3") {
				texts = []string{corpus}
			}
			if len(want) != len(texts) {
				t.Fatalf("%d reference lines for %d texts", len(want), len(texts))
			}
			total, bad := 0, 0
			for i, text := range texts {
				w := parseIDs(t, want[i])
				total += len(w)
				got := tok.Encode(text)
				if j := firstDiff(got, w); j >= 0 {
					if bad++; bad <= 3 {
						t.Errorf("text %d %.60q: ids differ at %d: got %v want %v", i, text, j, window(got, j), window(w, j))
					}
				}
			}
			if bad > 0 {
				t.Fatalf("%d of %d texts differ", bad, len(texts))
			}
			t.Logf("%d tokens equal", total)
		})
	}
}

// TestHuggingFaceDecode: decode(encode(x)) == x where the tokenizer is
// lossless, and the post-processor's BOS/CLS in Tokenize.
func TestHuggingFaceDecode(t *testing.T) {
	fixtures := hfFixtures(t)
	for _, tc := range []struct {
		name, text string
		lossless   bool
		tokenize   func(*HuggingFace, []int) []int
	}{
		{"gpt2", "Hello  world!\n\tcode() // 日本語 🎉<|endoftext|>", true, func(_ *HuggingFace, ids []int) []int { return ids }},
		{"llama3", "Hello  world!\n\tcode() // 日本語 🎉", true, func(_ *HuggingFace, ids []int) []int { return ids }},
		{"llama2", "Hello  world!\n\tcode() // 日本語 🎉", true, func(_ *HuggingFace, ids []int) []int { return append([]int{1}, ids...) }},
		{"bert", "The cat, the hat. 42!", false, func(h *HuggingFace, ids []int) []int {
			return append(append([]int{h.special2("[CLS]")}, ids...), h.special2("[SEP]"))
		}},
	} {
		tok, err := ParseHuggingFace(fixtures[tc.name], nil)
		if err != nil {
			t.Fatal(err)
		}
		ids := tok.Encode(tc.text)
		back := tok.Decode(ids)
		if tc.lossless && back != tc.text {
			t.Errorf("%s: decode(encode(%q)) = %q", tc.name, tc.text, back)
		}
		if !tc.lossless && back != "the cat, the hat. 42!" {
			t.Errorf("%s: decode = %q", tc.name, back)
		}
		if got, want := tok.Tokenize(tc.text), tc.tokenize(tok, ids); !slices.Equal(got, want) {
			t.Errorf("%s: Tokenize = %v, want %v", tc.name, got, want)
		}
	}
}

// special2 returns the id of an added token (test helper).
func (t *HuggingFace) special2(s string) int {
	for id, tok := range t.idToTok {
		if tok == s {
			return id
		}
	}
	return -1
}

// TestHuggingFaceConfigSpecials: tokenizer_config.json beside
// tokenizer.json names eos (EOD) and bos.
func TestHuggingFaceConfigSpecials(t *testing.T) {
	fx := hfFixtures(t)
	for _, tc := range []struct {
		config   string
		eod, bos int
	}{
		{`{"eos_token": "<|endoftext|>", "bos_token": {"content": "<|endoftext|>"}}`, 50256, 50256},
		{`{"eos_token": "<|missing|>"}`, -1, -1}, // named but absent: no eos; no known bos name
		{``, 50256, -1},                          // no config: well-known names
	} {
		var cfg []byte
		if tc.config != "" {
			cfg = []byte(tc.config)
		}
		tok, err := ParseHuggingFace(fx["gpt2"], cfg)
		if err != nil {
			t.Fatal(err)
		}
		bos, _ := tok.BOS()
		if tok.EOD() != tc.eod || bos != tc.bos {
			t.Errorf("config %s: EOD %d BOS %d, want %d %d", tc.config, tok.EOD(), bos, tc.eod, tc.bos)
		}
	}
}

// TestHuggingFaceAddedTokenFlags: lstrip/rstrip take the surrounding
// whitespace into the token; single_word skips matches inside words.
func TestHuggingFaceAddedTokenFlags(t *testing.T) {
	cfg := `{"added_tokens":[
		{"id":10,"content":"<m>","special":true,"lstrip":true,"rstrip":false,"single_word":false},
		{"id":11,"content":"<r>","special":true,"lstrip":false,"rstrip":true,"single_word":false},
		{"id":12,"content":"ab","special":false,"lstrip":false,"rstrip":false,"single_word":true}],
		"pre_tokenizer":{"type":"WhitespaceSplit"},
		"model":{"type":"WordPiece","unk_token":"[UNK]","vocab":{"[UNK]":0,"x":1,"y":2,"ab":3,"##ab":4,"xab":5}}}`
	tok, err := ParseHuggingFace([]byte(cfg), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		text string
		want []int
	}{
		{"x  <m> y", []int{1, 10, 2}},
		{"x <r>   y", []int{1, 11, 2}},
		{"x ab y", []int{1, 12, 2}},
		// "ab" inside a word is text, as the Rust library's single_word;
		// tokenizers.js 0.2.0 ignores single_word and gives [1 12 2].
		{"xab y", []int{5, 2}},
	} {
		if got := tok.Encode(tc.text); !slices.Equal(got, tc.want) {
			t.Errorf("Encode(%q) = %v, want %v", tc.text, got, tc.want)
		}
	}
}

// TestHuggingFaceLlamaConfig: for Llama tokenizer classes,
// tokenizer_config.json's add_bos_token/add_eos_token decide Tokenize's
// special tokens, as transformers' LlamaTokenizerFast.
func TestHuggingFaceLlamaConfig(t *testing.T) {
	fx := hfFixtures(t)
	for _, tc := range []struct {
		config      string
		first, last int // -1: none added
	}{
		{`{"tokenizer_class": "LlamaTokenizer"}`, 1, -1},
		{`{"tokenizer_class": "LlamaTokenizer", "add_bos_token": false, "add_eos_token": true}`, -1, 2},
		{`{"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": false}`, 1, -1}, // tokenizer.json's template
	} {
		tok, err := ParseHuggingFace(fx["llama2"], []byte(tc.config))
		if err != nil {
			t.Fatal(err)
		}
		enc, got := tok.Encode("hi"), tok.Tokenize("hi")
		want := slices.Clone(enc)
		if tc.first >= 0 {
			want = append([]int{tc.first}, want...)
		}
		if tc.last >= 0 {
			want = append(want, tc.last)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: Tokenize = %v, want %v", tc.config, got, want)
		}
	}
}
