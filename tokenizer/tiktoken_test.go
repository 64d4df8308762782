package tokenizer

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	tiktoken "github.com/tiktoken-go/tokenizer"
)

// cl100kMegatronVocab writes cl100k_base (from tiktoken-go) as a Megatron
// TikToken JSON vocabulary: single bytes 0..255 first, then the multi-byte
// tokens in cl100k rank order. It returns the path and the map from cl100k
// rank to Megatron rank. BPE priorities are unchanged: merges only compare
// multi-byte tokens.
func cl100kMegatronVocab(t *testing.T) (string, map[int]int) {
	t.Helper()
	codec, err := tiktoken.Get(tiktoken.Cl100kBase)
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		Rank       int    `json:"rank"`
		TokenBytes string `json:"token_bytes"`
		TokenStr   string `json:"token_str"`
	}
	entries := make([]entry, 256)
	remap := map[int]int{}
	for r := 0; r < 100256; r++ {
		s, err := codec.Decode([]uint{uint(r)})
		if err != nil {
			t.Fatal(err)
		}
		if len(s) == 1 {
			remap[r] = int(s[0])
			continue
		}
		remap[r] = len(entries)
		entries = append(entries, entry{Rank: len(entries), TokenBytes: base64.StdEncoding.EncodeToString([]byte(s))})
	}
	if len(entries) != 100256 {
		t.Fatalf("%d entries", len(entries))
	}
	for b := range 256 {
		entries[b] = entry{Rank: b, TokenBytes: base64.StdEncoding.EncodeToString([]byte{byte(b)})}
	}
	b, err := json.Marshal(entries)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "cl100k.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, remap
}

// TestTikTokenBPEMatchesTiktoken: with cl100k's ranks and cl100k's
// pre-tokenizer, TikToken's BPE gives tiktoken's ids (via tiktoken-go) on
// the multilingual corpus line by line (tiktoken-go's generated cl100k
// matcher splits whitespace runs holding newlines unlike the regex, see
// TestPretokenizersMatchRegexp).
func TestTikTokenBPEMatchesTiktoken(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 100k-token vocabulary")
	}
	path, remap := cl100kMegatronVocab(t)
	const nspecial = 1000
	tok, err := LoadTikToken(path, TikTokenOptions{Pattern: "v1", VocabSize: 100256 + nspecial})
	if err != nil {
		t.Fatal(err)
	}
	tok.split = byRule(splitLlama3)
	codec, _ := tiktoken.Get(tiktoken.Cl100kBase)
	corpus := string(readTestdata(t, "multilingual.txt.gz"))
	total := 0
	for _, line := range strings.Split(corpus, "\n") {
		ids, _, err := codec.Encode(line)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]int, len(ids))
		for i, r := range ids {
			want[i] = remap[int(r)] + nspecial
		}
		got := tok.Encode(line)
		if i := firstDiff(got, want); i >= 0 {
			t.Fatalf("line %q: ids differ at %d: got %v want %v", line, i, window(got, i), window(want, i))
		}
		if back := tok.Decode(got); back != line {
			t.Fatalf("decode(encode(%q)) = %q", line, back)
		}
		total += len(got)
	}
	if total < 50000 {
		t.Fatalf("%d tokens compared, want ≥ 50000", total)
	}
}

func writeTikTokenVocab(t *testing.T, tokens ...string) string {
	t.Helper()
	var entries []map[string]any
	for i := range 256 {
		entries = append(entries, map[string]any{"rank": i, "token_bytes": base64.StdEncoding.EncodeToString([]byte{byte(i)}), "token_str": ""})
	}
	for _, s := range tokens {
		entries = append(entries, map[string]any{"rank": len(entries), "token_bytes": base64.StdEncoding.EncodeToString([]byte(s)), "token_str": s})
	}
	b, _ := json.Marshal(entries)
	path := filepath.Join(t.TempDir(), "vocab.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTikTokenSpecials: Megatron's id layout (specials first, "<SPECIAL_i>"
// fillers, EOD = "</s>") and the v1/v2 patterns on a tiny vocabulary.
func TestTikTokenSpecials(t *testing.T) {
	path := writeTikTokenVocab(t, "he", "ll", "hell", "hello", " w", "or", " wor", " world", "Hel", "Hello")
	for _, tc := range []struct {
		pattern string
		text    string
		want    []int
	}{
		// ids = 10 specials + rank
		{"v1", "hello world", []int{10 + 259, 10 + 263}},
		{"v1", "Hello 42", []int{10 + 265, 10 + ' ', 10 + '4', 10 + '2'}},
		{"v2", "Hello 42", []int{10 + 265, 10 + ' ', 10 + '4', 10 + '2'}},
		{"v2", "HELLOworld", []int{10 + 'H', 10 + 'E', 10 + 'L', 10 + 'L', 10 + 'O', 10 + 'w', 10 + 261, 10 + 'l', 10 + 'd'}},
		{"v1", "<s>", []int{10 + '<', 10 + 's', 10 + '>'}}, // encode_ordinary: specials are text
	} {
		tok, err := LoadTikToken(path, TikTokenOptions{Pattern: tc.pattern, VocabSize: 10 + 266, NumSpecialTokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		if got := tok.Encode(tc.text); !slices.Equal(got, tc.want) {
			t.Errorf("%s Encode(%q) = %v, want %v", tc.pattern, tc.text, got, tc.want)
		}
		if back := tok.Decode(tok.Encode(tc.text)); back != tc.text {
			t.Errorf("%s decode(encode(%q)) = %q", tc.pattern, tc.text, back)
		}
		if tok.EOD() != 2 || tok.VocabSize() != 276 || tok.Decode([]int{1, 5}) != "<s><SPECIAL_5>" {
			t.Errorf("EOD %d VocabSize %d Decode %q", tok.EOD(), tok.VocabSize(), tok.Decode([]int{1, 5}))
		}
	}
	for _, o := range []TikTokenOptions{
		{Pattern: "v3", VocabSize: 276, NumSpecialTokens: 10},
		{Pattern: "v1", VocabSize: 300, NumSpecialTokens: 10}, // file too short
		{Pattern: "v1", VocabSize: 276, NumSpecialTokens: 10, SpecialTokens: []string{"<s>", "</s>"}},
		{Pattern: "v1", VocabSize: 276, NumSpecialTokens: 2},
	} {
		if _, err := LoadTikToken(path, o); err == nil {
			t.Errorf("LoadTikToken(%+v) succeeded, want an error", o)
		}
	}
}
