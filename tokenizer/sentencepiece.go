package tokenizer

import (
	"fmt"
	"os"
	"strings"
	"unicode/utf8"
)

// spSpace is SentencePiece's whitespace symbol "▁" (U+2581).
const spSpace = "\u2581"

// SentencePiece encodes like the sentencepiece library (spm_encode,
// SentencePieceProcessor.encode_as_ids) for BPE and unigram models: the
// precompiled normalization map (nmt_nfkc, nfkc, ...) or identity,
// whitespace handling (add_dummy_prefix, remove_extra_whitespaces,
// escape_whitespaces, treat_whitespace_as_suffix), user-defined symbols,
// byte fallback and merging of unknown runs. It is Megatron's
// GPTSentencePieceTokenizer: EOD is the model's eos id.
type SentencePiece struct {
	m        *spModel
	cmap     *charsmap
	ids      map[string]int // NORMAL, USER_DEFINED and UNUSED pieces
	reserved map[string]int // UNKNOWN, CONTROL and BYTE pieces
	user     *addedTokens   // user-defined symbols, matched before normalization rules
	byteID   [256]int
	// BPE: words, when no piece joins a non-space to a following space, so
	// that merges never cross the start of a word and words can be cached.
	words bool
	cache *wordCache
	// unigram
	trie     spTrie
	minScore float32 // of NORMAL pieces
	maxScore float32
}

var _ Tokenizer = (*SentencePiece)(nil)

// LoadSentencePiece reads a SentencePiece .model file (--tokenizer-model).
func LoadSentencePiece(path string) (*SentencePiece, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: --tokenizer-model: %w", err)
	}
	sp, err := ParseSentencePiece(b)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	return sp, nil
}

// ParseSentencePiece builds the tokenizer from a serialized ModelProto.
func ParseSentencePiece(model []byte) (*SentencePiece, error) {
	m, err := parseSPModel(model)
	if err != nil {
		return nil, err
	}
	if m.modelType != spBPE && m.modelType != spUnigram {
		return nil, fmt.Errorf("model_type %d: only UNIGRAM (1) and BPE (2) are supported", m.modelType)
	}
	cm, err := parseCharsmap(m.charsmap)
	if err != nil {
		return nil, err
	}
	sp := &SentencePiece{m: m, cmap: cm, ids: map[string]int{}, reserved: map[string]int{}}
	unk := -1
	var user []addedToken
	for i := range sp.byteID {
		sp.byteID[i] = -1
	}
	for i, p := range m.pieces {
		switch p.typ {
		case spNormal, spUserDefined, spUnused:
			sp.ids[p.piece] = i
		default:
			sp.reserved[p.piece] = i
		}
		switch p.typ {
		case spUnknown:
			unk = i
		case spUserDefined:
			user = append(user, addedToken{text: p.piece, id: i})
		case spByte:
			var b int
			if _, err := fmt.Sscanf(p.piece, "<0x%02X>", &b); err != nil || b > 255 {
				return nil, fmt.Errorf("byte piece %d is %q, want <0xXX>", i, p.piece)
			}
			sp.byteID[b] = i
		}
	}
	if unk < 0 {
		return nil, fmt.Errorf("no UNKNOWN piece")
	}
	m.unkID = unk
	for _, id := range []*int{&m.bosID, &m.eosID, &m.padID} {
		if *id >= len(m.pieces) {
			*id = -1 // an id past the pieces is no token
		}
	}
	sp.user = newAddedTokens(user)
	if m.modelType == spUnigram {
		sp.initUnigram()
	} else {
		sp.initWords()
	}
	return sp, nil
}

// normalize is sentencepiece's Normalizer::Normalize.
func (sp *SentencePiece) normalize(s string) string {
	m := sp.m
	ws := " "
	if m.escapeWS {
		ws = spSpace
	}
	var out strings.Builder
	out.Grow(len(s) + 8)
	if m.removeExtraWS { // skip leading spaces
		for len(s) > 0 {
			p, n := sp.normalizePrefix(s)
			if p != " " {
				break
			}
			s = s[n:]
		}
	}
	if len(s) == 0 {
		return ""
	}
	if m.addDummyPrefix && !m.treatWSAsSuf {
		out.WriteString(ws)
	}
	prevSpace := m.removeExtraWS
	for len(s) > 0 {
		p, n := sp.normalizePrefix(s)
		s = s[n:]
		for prevSpace && strings.HasPrefix(p, " ") {
			p = p[1:]
		}
		if p != "" {
			if m.escapeWS {
				p = strings.ReplaceAll(p, " ", spSpace)
			}
			out.WriteString(p)
			prevSpace = strings.HasSuffix(p, ws)
		}
		if !m.removeExtraWS {
			prevSpace = false
		}
	}
	res := out.String()
	if m.removeExtraWS {
		for strings.HasSuffix(res, ws) {
			res = res[:len(res)-len(ws)]
		}
	}
	if m.addDummyPrefix && m.treatWSAsSuf {
		res += ws
	}
	return res
}

// normalizePrefix returns the normalized form of s's first unit and its
// length: a user-defined symbol as is, else the longest charsmap rule, else
// one UTF-8 character (an invalid byte becomes U+FFFD).
func (sp *SentencePiece) normalizePrefix(s string) (string, int) {
	if n := sp.userPrefix(s); n > 0 {
		return s[:n], n
	}
	if sp.cmap != nil {
		if repl, n := sp.cmap.longest(s); n > 0 {
			return repl, n
		}
	}
	r, n := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError && n <= 1 {
		return "\uFFFD", 1
	}
	return s[:n], n
}

// userPrefix returns the length of the longest user-defined symbol at the
// start of s, or 0.
func (sp *SentencePiece) userPrefix(s string) int {
	if sp.user == nil || !sp.user.any || len(s) == 0 {
		return 0
	}
	for _, t := range sp.user.byFirst[s[0]] {
		if strings.HasPrefix(s, t.text) {
			return len(t.text)
		}
	}
	return 0
}

// charLen is the length of the symbol at the start of normalized text: a
// user-defined symbol or one UTF-8 character.
func (sp *SentencePiece) charLen(s string) int {
	if n := sp.userPrefix(s); n > 0 {
		return n
	}
	_, n := utf8.DecodeRuneInString(s)
	return max(n, 1)
}

// pieceID is sentencepiece's PieceToId.
func (sp *SentencePiece) pieceID(p string) int {
	if id, ok := sp.reserved[p]; ok {
		return id
	}
	if id, ok := sp.ids[p]; ok {
		return id
	}
	return sp.m.unkID
}

// Encode returns the ids spm_encode prints for text.
func (sp *SentencePiece) Encode(text string) []int {
	norm := sp.normalize(text)
	if norm == "" {
		return []int{}
	}
	var pieces []spSpan
	if sp.m.modelType == spBPE {
		pieces = sp.encodeBPEWords(norm)
	} else {
		pieces = sp.encodeUnigram(norm)
	}
	ids := make([]int, 0, len(pieces))
	prevUnk := false
	for _, p := range pieces {
		isUnk := p.id == sp.m.unkID
		switch {
		case isUnk && sp.m.byteFallback:
			for i := 0; i < len(p.text); i++ {
				if id := sp.byteID[p.text[i]]; id >= 0 {
					ids = append(ids, id)
				} else {
					ids = append(ids, sp.m.unkID)
				}
			}
		case isUnk && prevUnk: // a run of unknowns is one <unk>
		default:
			ids = append(ids, p.id)
		}
		prevUnk = isUnk
	}
	return ids
}

// spSpan is one piece of the segmentation of the normalized text.
type spSpan struct {
	text string
	id   int
}

// Decode is sentencepiece's DecodeIds: control ids vanish, runs of byte
// pieces are decoded as UTF-8 (U+FFFD per invalid byte), "▁" becomes a space
// and the dummy-prefix space of the first piece is dropped.
func (sp *SentencePiece) Decode(ids []int) string {
	var out strings.Builder
	var pending []byte
	flush := func() {
		for len(pending) > 0 {
			r, n := utf8.DecodeRune(pending)
			if r == utf8.RuneError && n <= 1 {
				out.WriteString("\uFFFD")
				n = 1
			} else {
				out.Write(pending[:n])
			}
			pending = pending[n:]
		}
	}
	first := true
	for _, id := range ids {
		if id < 0 || id >= len(sp.m.pieces) {
			continue
		}
		p := sp.m.pieces[id]
		var surface string
		switch p.typ {
		case spControl:
			continue
		case spByte:
			var b int
			fmt.Sscanf(p.piece, "<0x%02X>", &b)
			pending = append(pending, byte(b))
			first = false
			continue
		case spUnknown:
			surface = sp.m.unkSurface
		default:
			surface = p.piece
			if first && (sp.m.addDummyPrefix || sp.m.removeExtraWS) && !sp.m.treatWSAsSuf {
				surface = strings.TrimPrefix(surface, spSpace)
			}
			surface = strings.ReplaceAll(surface, spSpace, " ")
		}
		flush()
		out.WriteString(surface)
		first = false
	}
	flush()
	res := out.String()
	if sp.m.treatWSAsSuf && (sp.m.addDummyPrefix || sp.m.removeExtraWS) {
		res = strings.TrimSuffix(res, " ")
	}
	return res
}

// VocabSize is the number of pieces.
func (sp *SentencePiece) VocabSize() int { return len(sp.m.pieces) }

// EOD is the eos id (GPTSentencePieceTokenizer); -1 when the model has none.
func (sp *SentencePiece) EOD() int { return sp.m.eosID }

// BOS is the model's bos id.
func (sp *SentencePiece) BOS() (int, bool) { return sp.m.bosID, sp.m.bosID >= 0 }

// EOS is the model's eos id.
func (sp *SentencePiece) EOS() (int, bool) { return sp.m.eosID, sp.m.eosID >= 0 }

// Pad is the model's pad id.
func (sp *SentencePiece) Pad() (int, bool) { return sp.m.padID, sp.m.padID >= 0 }

// Piece returns the text of piece id, or "" when out of range.
func (sp *SentencePiece) Piece(id int) string {
	if id < 0 || id >= len(sp.m.pieces) {
		return ""
	}
	return sp.m.pieces[id].piece
}
