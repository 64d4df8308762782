package tokenizer

import (
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// Reference patterns, run by regexp2 (which has lookahead) as the oracle for
// the hand-written pre-tokenizers.
const (
	patternGPT2   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// Megatron's v1 without its possessive quantifiers (regexp2 lacks them).
	patternTikTokenV1 = `[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+`
)

var pretokCases = []string{
	"", " ", "  ", "\n", " \n", "\n ", "a  b", "a \tb", "a\t b", "   x   ", "x   ", "it's", "IT'S", "It'S",
	" 's", "''s", "!'s", "a'll'd", "I'm", "you've", "don't", "we're", "12345", " 1 2  3", "1.5e-3",
	"hello world", "Hello,  World!!", "tab\there", "\r\n\r\n", "a\r\n b", " \r\n\t x", "x\u00a0y", "x\u3000y",
	"é", "e\u0301", "日本語のテキスト", "🎉🎉", "👨‍👩‍👧", "\u2028", "a\u2029b", "    def f():\n        return 1\n",
	"¼½¾", "ǅa", "٣٤", "ab\u0300cd", "(foo) [bar]", " ..\n\n", "x!\r\n\r\ny", "a/b//c\n", "\t\tif x {\n",
	"HELLOworld", "helloWORLD", "CamelCaseXMLParser", "ΣΊΣΥΦΟΣ", "\u0301abc", "(\u0301Abc", " Ab", "AB\u0301c", "ǅǅa",
	"日本ABC", "Éa\u0301B", "x/\n/y", ".//\r\n", "\u02b0A\u02b0b", "A\u0300\u0300",
}

func TestPretokenizersMatchRegexp(t *testing.T) {
	corpus := string(readTestdata(t, "multilingual.txt.gz"))
	inputs := append(append([]string{}, pretokCases...), strings.SplitAfter(corpus, "\n\n")...)
	for _, tc := range []struct {
		name    string
		pattern string
		split   splitFunc
	}{
		{"gpt2", patternGPT2, splitGPT2},
		{"llama3", patternLlama3, splitLlama3},
		{"tiktoken_v1", patternTikTokenV1, splitTikTokenV1},
		{"tiktoken_v2", patternTikTokenV2, splitTikTokenV2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Wrapped so that regexp2 interprets it: tiktoken-go registers a
			// generated matcher for the bare cl100k pattern that makes \s*
			// possessive (" \n \n" splits as " \n", " \n").
			ref := byRegexp(regexp2.MustCompile("(?:"+tc.pattern+")", regexp2.None))
			bad := 0
			for _, s := range inputs {
				var want, got []string
				ref(s, func(p string) { want = append(want, p) })
				byRule(tc.split)(s, func(p string) { got = append(got, p) })
				if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
					if bad++; bad <= 3 {
						i := 0
						for i < min(len(got), len(want)) && got[i] == want[i] {
							i++
						}
						t.Errorf("split(%.40q...) differs at piece %d: got %q want %q", s, i, got[i:min(i+3, len(got))], want[i:min(i+3, len(want))])
					}
				}
			}
		})
	}
}

// FuzzPretokenizers: the hand-written splitters agree with the reference
// patterns run by regexp2 on valid UTF-8.
func FuzzPretokenizers(f *testing.F) {
	for _, s := range pretokCases {
		f.Add(s)
	}
	type pair struct {
		ref, rule pretokenizer
	}
	var pairs []pair
	for _, p := range []struct {
		pattern string
		split   splitFunc
	}{{patternGPT2, splitGPT2}, {patternLlama3, splitLlama3}, {patternTikTokenV1, splitTikTokenV1}, {patternTikTokenV2, splitTikTokenV2}} {
		pairs = append(pairs, pair{byRegexp(regexp2.MustCompile("(?:"+p.pattern+")", regexp2.None)), byRule(p.split)})
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		for k, p := range pairs {
			var want, got []string
			p.ref(s, func(x string) { want = append(want, x) })
			p.rule(s, func(x string) { got = append(got, x) })
			if !slices.Equal(got, want) {
				t.Fatalf("pattern %d on %q: got %q want %q", k, s, got, want)
			}
		}
	})
}
