package tokenizer

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"slices"
)

// TikTokenOptions are Megatron's TikTokenizer flags.
type TikTokenOptions struct {
	// Pattern is --tiktoken-pattern: "v1" or "v2" (required).
	Pattern string
	// VocabSize is --vocab-size: special tokens plus the first
	// VocabSize-NumSpecialTokens entries of the file. Zero means 2^17.
	VocabSize int
	// NumSpecialTokens is --tiktoken-num-special-tokens; zero means 1000.
	NumSpecialTokens int
	// SpecialTokens is --tiktoken-special-tokens; nil means
	// ["<unk>", "<s>", "</s>"]. The rest up to NumSpecialTokens are
	// "<SPECIAL_i>" fillers.
	SpecialTokens []string
}

// TikToken is Megatron's TikTokenizer (CustomTikTokenizer): tiktoken's
// byte-level BPE over a JSON list of {rank, token_bytes, token_str} whose
// ids are shifted up by NumSpecialTokens, the special tokens first. Encode
// is tiktoken's encode_ordinary (special-token text is plain text); EOD is
// "</s>".
type TikToken struct {
	split    pretokenizer
	syms     *symbolTable // token bytes; symbol = rank
	ranks    []int32
	nspecial int
	specials []string
	n        int
	unk, bos int
	eos      int
	cache    *wordCache
}

var _ Tokenizer = (*TikToken)(nil)

// LoadTikToken reads a Megatron TikToken JSON vocabulary (--tokenizer-model).
func LoadTikToken(path string, o TikTokenOptions) (*TikToken, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: --tokenizer-model: %w", err)
	}
	t, err := ParseTikToken(b, o)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	return t, nil
}

// ParseTikToken builds the tokenizer from the JSON vocabulary's contents.
func ParseTikToken(vocabJSON []byte, o TikTokenOptions) (*TikToken, error) {
	t := &TikToken{cache: newWordCache(), n: o.VocabSize, nspecial: o.NumSpecialTokens}
	switch o.Pattern {
	case "v1":
		t.split = byRule(splitTikTokenV1)
	case "v2":
		t.split = byRule(splitTikTokenV2)
	default:
		return nil, configErr("--tiktoken-pattern %q: want v1 or v2", o.Pattern)
	}
	if t.n == 0 {
		t.n = 1 << 17
	}
	if t.nspecial == 0 {
		t.nspecial = 1000
	}
	specials := o.SpecialTokens
	if specials == nil {
		specials = []string{"<unk>", "<s>", "</s>"}
	}
	for _, want := range []string{"<unk>", "<s>", "</s>"} {
		if !slices.Contains(specials, want) {
			return nil, configErr("--tiktoken-special-tokens %q must include %q", specials, want)
		}
	}
	if len(specials) > t.nspecial || t.nspecial >= t.n {
		return nil, configErr("want len(--tiktoken-special-tokens)=%d ≤ --tiktoken-num-special-tokens=%d < --vocab-size=%d",
			len(specials), t.nspecial, t.n)
	}
	t.specials = slices.Clone(specials)
	for i := len(specials); i < t.nspecial; i++ {
		t.specials = append(t.specials, fmt.Sprintf("<SPECIAL_%d>", i))
	}
	seen := map[string]bool{}
	for i, s := range t.specials {
		if seen[s] {
			return nil, configErr("special token %q repeated", s)
		}
		seen[s] = true
		switch s {
		case "<unk>":
			t.unk = i
		case "<s>":
			t.bos = i
		case "</s>":
			t.eos = i
		}
	}
	var entries []struct {
		Rank       *int    `json:"rank"`
		TokenBytes *string `json:"token_bytes"`
		TokenStr   *string `json:"token_str"`
	}
	if err := json.Unmarshal(vocabJSON, &entries); err != nil {
		return nil, fmt.Errorf("want a JSON list of {rank, token_bytes, token_str}: %w", err)
	}
	inner := t.n - t.nspecial
	if len(entries) < inner {
		return nil, configErr("%d tokens, fewer than --vocab-size %d - %d special tokens", len(entries), t.n, t.nspecial)
	}
	t.syms = &symbolTable{ids: make(map[string]int32, inner)}
	t.ranks = make([]int32, inner)
	for i, e := range entries[:inner] {
		if e.Rank == nil || e.TokenBytes == nil || e.TokenStr == nil {
			return nil, fmt.Errorf("entry %d: want keys rank, token_bytes, token_str", i)
		}
		if *e.Rank != i {
			return nil, fmt.Errorf("entry %d has rank %d, want %d", i, *e.Rank, i)
		}
		raw, err := base64.StdEncoding.DecodeString(*e.TokenBytes)
		if err != nil {
			return nil, fmt.Errorf("entry %d: token_bytes: %w", i, err)
		}
		if i < 256 && (len(raw) != 1 || raw[0] != byte(i)) {
			return nil, fmt.Errorf("entry %d: the first 256 tokens must be the single bytes 0..255", i)
		}
		if int(t.syms.intern(string(raw))) != i {
			return nil, fmt.Errorf("entry %d: token bytes %q repeated", i, raw)
		}
		t.ranks[i] = int32(i)
	}
	return t, nil
}

// Encode is tiktoken's encode_ordinary with ids shifted past the specials.
func (t *TikToken) Encode(text string) []int {
	ids := make([]int, 0, len(text)/3+1)
	r := concatRanker{syms: t.syms, ranks: t.ranks}
	t.split(text, func(piece string) {
		syms, ok := t.cache.get(piece)
		if !ok {
			if id, whole := t.syms.ids[piece]; whole {
				syms = []int32{id}
			} else {
				word := make([]int32, len(piece))
				for k := 0; k < len(piece); k++ {
					word[k] = int32(piece[k])
				}
				syms = slices.Clip(bpeMerge(word, r))
			}
			t.cache.put(piece, syms)
		}
		for _, s := range syms {
			ids = append(ids, int(s)+t.nspecial)
		}
	})
	return ids
}

// Decode concatenates the bytes of ids; special ids decode to their text.
func (t *TikToken) Decode(ids []int) string {
	var out []byte
	for _, id := range ids {
		switch {
		case id >= 0 && id < t.nspecial:
			out = append(out, t.specials[id]...)
		case id >= t.nspecial && id < t.n:
			out = append(out, t.syms.bytes[id-t.nspecial]...)
		}
	}
	return string(out)
}

// VocabSize is --vocab-size.
func (t *TikToken) VocabSize() int { return t.n }

// EOD is the id of "</s>".
func (t *TikToken) EOD() int { return t.eos }

// BOS is the id of "<s>".
func (t *TikToken) BOS() (int, bool) { return t.bos, true }

// EOS is the id of "</s>".
func (t *TikToken) EOS() (int, bool) { return t.eos, true }

// Pad reports no pad token.
func (t *TikToken) Pad() (int, bool) { return -1, false }
