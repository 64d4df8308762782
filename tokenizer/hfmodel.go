package tokenizer

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// parseModel sets t.model from tokenizer.json's "model" and returns a copy
// of its vocabulary.
func (t *HuggingFace) parseModel(raw json.RawMessage) (map[string]int, error) {
	c, err := parseComponent(raw)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, fmt.Errorf("missing")
	}
	vocab := map[string]int{}
	if err := json.Unmarshal(c["vocab"], &vocab); err != nil {
		return nil, fmt.Errorf("%s vocab: want an object of token → id: %w", c.typ(), err)
	}
	for tok, id := range vocab {
		if id < 0 || id >= maxVocabID {
			return nil, fmt.Errorf("token %q has id %d, want 0 ≤ id < %d", tok, id, maxVocabID)
		}
	}
	unk := -1
	if u := c.str("unk_token"); u != "" {
		id, ok := vocab[u]
		if !ok {
			return nil, fmt.Errorf("unk_token %q is not in the vocabulary", u)
		}
		unk = id
	}
	switch c.typ() {
	case "BPE", "":
		if c.str("continuing_subword_prefix") != "" || c.str("end_of_word_suffix") != "" {
			return nil, fmt.Errorf("BPE with continuing_subword_prefix or end_of_word_suffix is not supported")
		}
		merges, err := parseHFMerges(c["merges"])
		if err != nil {
			return nil, err
		}
		ignoreMerges := c.boolean("ignore_merges", false)
		if t.byteLevel {
			m := newByteBPE(vocab, merges, nil, unk)
			m.ignoreMerges = ignoreMerges
			t.model = m
		} else {
			t.model = newCharBPE(vocab, merges, unk, c.boolean("byte_fallback", false), c.boolean("fuse_unk", false), ignoreMerges)
		}
	case "WordPiece":
		if unk < 0 {
			return nil, fmt.Errorf("WordPiece needs unk_token")
		}
		w := &wordPiece{vocab: vocab, unk: unk, prefix: "##", maxChars: 100}
		if _, ok := c["continuing_subword_prefix"]; ok {
			w.prefix = c.str("continuing_subword_prefix")
		}
		if raw, ok := c["max_input_chars_per_word"]; ok {
			_ = json.Unmarshal(raw, &w.maxChars)
		}
		t.model = w
	default:
		return nil, fmt.Errorf("model type %q is not supported (BPE and WordPiece are)", c.typ())
	}
	return vocab, nil
}

// maxVocabID bounds token ids read from files (2^26, far above any real
// vocabulary), so that a corrupt file cannot ask for a huge table.
const maxVocabID = 1 << 26

// parseHFMerges reads merges as ["a b", ...] or [["a", "b"], ...].
func parseHFMerges(raw json.RawMessage) ([][2]string, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("merges: want a list: %w", err)
	}
	merges := make([][2]string, len(items))
	for i, it := range items {
		var s string
		var p []string
		switch {
		case json.Unmarshal(it, &s) == nil:
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return nil, fmt.Errorf("merge %d %q: want two space-separated tokens", i, s)
			}
			merges[i] = [2]string{a, b}
		case json.Unmarshal(it, &p) == nil && len(p) == 2:
			merges[i] = [2]string{p[0], p[1]}
		default:
			return nil, fmt.Errorf("merge %d: want \"a b\" or [\"a\", \"b\"]", i)
		}
	}
	return merges, nil
}

// charBPE is Hugging Face's BPE model on characters (SentencePiece-style
// tokenizers such as Llama-2's): each character is a vocabulary token, or
// its UTF-8 bytes as "<0xXX>" tokens with byte_fallback, or unk.
type charBPE struct {
	vocab        map[string]int
	merges       mergeTable
	unk          int
	byteFallback bool
	fuseUnk      bool
	ignoreMerges bool
	byteTok      [256]int
	cache        *wordCache
}

func newCharBPE(vocab map[string]int, merges [][2]string, unk int, byteFallback, fuseUnk, ignoreMerges bool) *charBPE {
	m := &charBPE{vocab: vocab, merges: make(mergeTable, len(merges)), unk: unk,
		byteFallback: byteFallback, fuseUnk: fuseUnk, ignoreMerges: ignoreMerges, cache: newWordCache()}
	for rank, p := range merges {
		a, okA := vocab[p[0]]
		b, okB := vocab[p[1]]
		c, okC := vocab[p[0]+p[1]]
		if okA && okB && okC {
			m.merges.add(int32(a), int32(b), int32(rank), int32(c))
		}
	}
	for b := range 256 {
		id, ok := vocab[fmt.Sprintf("<0x%02X>", b)]
		if !ok {
			id = -1
		}
		m.byteTok[b] = id
	}
	return m
}

func (m *charBPE) appendPiece(ids []int, piece string) []int {
	syms, ok := m.cache.get(piece)
	if !ok {
		syms = m.word(piece)
		m.cache.put(piece, syms)
	}
	for _, s := range syms {
		ids = append(ids, int(s))
	}
	return ids
}

func (m *charBPE) word(piece string) []int32 {
	if m.ignoreMerges {
		if id, ok := m.vocab[piece]; ok {
			return []int32{int32(id)}
		}
	}
	var word []int32
	prevUnk := false
	for i, r := range piece {
		n := utf8.RuneLen(r)
		if r == utf8.RuneError {
			_, n = utf8.DecodeRuneInString(piece[i:])
		}
		ch := piece[i : i+n]
		if id, ok := m.vocab[ch]; ok {
			word = append(word, int32(id))
			prevUnk = false
			continue
		}
		if m.byteFallback {
			all := true
			for k := 0; k < len(ch); k++ {
				all = all && m.byteTok[ch[k]] >= 0
			}
			if all {
				for k := 0; k < len(ch); k++ {
					word = append(word, int32(m.byteTok[ch[k]]))
				}
				prevUnk = false
				continue
			}
		}
		if m.unk >= 0 && !(m.fuseUnk && prevUnk) {
			word = append(word, int32(m.unk))
		}
		prevUnk = true
	}
	return slices.Clip(bpeMerge(word, m.merges))
}

// wordPiece is the WordPiece model (BERT): greedy longest-match-first
// subwords, continuations prefixed with "##"; a word with an unmatched rest
// or more than max_input_chars_per_word characters is one unk.
type wordPiece struct {
	vocab    map[string]int
	unk      int
	prefix   string
	maxChars int
}

func (w *wordPiece) appendPiece(ids []int, word string) []int {
	if utf8.RuneCountInString(word) > w.maxChars {
		return append(ids, w.unk)
	}
	start := len(ids)
	for pos := 0; pos < len(word); {
		end, id := len(word), -1
		for ; end > pos; end-- {
			if end < len(word) && !utf8.RuneStart(word[end]) {
				continue
			}
			sub := word[pos:end]
			if pos > 0 {
				sub = w.prefix + sub
			}
			if v, ok := w.vocab[sub]; ok {
				id = v
				break
			}
		}
		if id < 0 {
			return append(ids[:start], w.unk)
		}
		ids = append(ids, id)
		pos = end
	}
	return ids
}
