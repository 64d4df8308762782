package tokenizer

import (
	"slices"
	"strings"
	"sync"
	"testing"

	tiktoken "github.com/tiktoken-go/tokenizer"
)

// TestGPT2Multilingual: ids equal the reference JS gpt-3-encoder (OpenAI's
// encoder.py port) on the ~110k-token multilingual corpus.
func TestGPT2Multilingual(t *testing.T) {
	tok := gpt2Fixture(t)
	text := string(readTestdata(t, "multilingual.txt.gz"))
	want := parseIDs(t, string(readTestdata(t, "gpt2/multilingual.ids.gz")))
	if len(want) < 50000 {
		t.Fatalf("fixture has %d tokens, want ≥ 50000", len(want))
	}
	got := tok.Encode(text)
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("ids differ at %d of %d/%d: got %v want %v", i, len(got), len(want), window(got, i), window(want, i))
	}
	if back := tok.Decode(got); back != text {
		t.Fatal("decode(encode(corpus)) != corpus")
	}
}

// TestGPT2Tiktoken: ids equal tiktoken's r50k_base (GPT-2's ranks) on
// edge cases of the pre-tokenizer.
func TestGPT2Tiktoken(t *testing.T) {
	tok := gpt2Fixture(t)
	oracle, err := tiktoken.Get(tiktoken.R50kBase)
	if err != nil {
		t.Fatal(err)
	}
	cases := []string{
		"", " ", "  ", "\n", " \n", "\n ", "a  b", "a \tb", "a\t b", "   x   ", "x   ", "it's", "IT'S",
		" 's", "''s", "!'s", "a'll'd", "I'm", "you've", "don't", "we're", "12345", " 1 2  3", "1.5e-3",
		"hello world", "Hello,  World!!", "tab\there", "\r\n\r\n", "x\u00a0y", "x\u3000y", "é", "e\u0301",
		"日本語のテキスト", "🎉🎉", "👨‍👩‍👧", "\u2028", "a\u2029b", "    def f():\n        return 1\n",
		"\x00\x01", "¼½¾", "ǅ", "٣٤", "ab\u0300cd",
	}
	for _, s := range cases {
		ids, _, err := oracle.Encode(s)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]int, len(ids))
		for i, v := range ids {
			want[i] = int(v)
		}
		if got := tok.Encode(s); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want %v", s, got, want)
		}
	}
}

// TestGPT2Special: "<|endoftext|>" in text is the EOD id, as in Hugging
// Face's GPT2Tokenizer.
func TestGPT2Special(t *testing.T) {
	tok := gpt2Fixture(t)
	if tok.EOD() != 50256 || tok.VocabSize() != 50257 {
		t.Fatalf("EOD %d VocabSize %d, want 50256 50257", tok.EOD(), tok.VocabSize())
	}
	got := tok.Encode("a<|endoftext|>b")
	// tiktoken-go drops DEL (0x7f); GPT-2 maps it to "ġ" (221).
	if got := tok.Encode("\x7f"); !slices.Equal(got, []int{221}) {
		t.Fatalf("Encode(DEL) = %v, want [221]", got)
	}
	want := []int{64, 50256, 65}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v want %v", got, want)
	}
	if s := tok.Decode(got); s != "a<|endoftext|>b" {
		t.Fatalf("decode %q", s)
	}
}

// TestConcurrentEncode: tokenizers (and their word caches) are safe for
// concurrent use and give the sequential ids.
func TestConcurrentEncode(t *testing.T) {
	lines := strings.Split(string(readTestdata(t, "multilingual.txt.gz")), "\n")[:400]
	tok := gpt2Fixture(t)
	tok.bpe.cache = newWordCache()
	want := make([][]int, len(lines))
	for i, l := range lines {
		want[i] = tok.Encode(l)
	}
	tok.bpe.cache = newWordCache()
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range lines {
				i := (k + g*97) % len(lines)
				if got := tok.Encode(lines[i]); !slices.Equal(got, want[i]) {
					errs <- lines[i]
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for l := range errs {
		t.Errorf("concurrent Encode(%q) differs", l)
	}
}
