package infer

import (
	"strings"
	"unicode/utf8"
)

// Decoder turns ids into text.
type Decoder interface {
	Decode(ids []int) string
}

// TextStream yields the text of a growing id sequence piece by piece:
// decoding ids one at a time would drop separators (space-joined
// vocabularies) and split multi-byte UTF-8 characters across BPE tokens, so
// it decodes the whole sequence and emits what is new, holding back an
// incomplete character.
type TextStream struct {
	dec     Decoder
	ids     []int
	printed string
}

// NewTextStream starts a stream after prompt (whose text is not emitted).
func NewTextStream(dec Decoder, prompt []int) *TextStream {
	s := &TextStream{dec: dec, ids: append([]int(nil), prompt...)}
	s.printed = dec.Decode(s.ids)
	return s
}

// Add appends id and returns the text it completes (possibly "").
func (s *TextStream) Add(id int) string {
	s.ids = append(s.ids, id)
	text := s.dec.Decode(s.ids)
	if !strings.HasPrefix(text, s.printed) {
		// Decoding is not prefix-stable here (rare normalisations): emit
		// from the first difference.
		n := 0
		for n < len(text) && n < len(s.printed) && text[n] == s.printed[n] {
			n++
		}
		s.printed = s.printed[:n]
	}
	tail := text[len(s.printed):]
	for len(tail) > 0 && !utf8.ValidString(tail) {
		tail = tail[:len(tail)-1]
	}
	s.printed += tail
	return tail
}
