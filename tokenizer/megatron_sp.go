package tokenizer

import (
	"fmt"
	"strings"
)

// Llama2 is Megatron's Llama2Tokenizer (_Llama2Tokenizer): the SentencePiece
// model with BOS/EOS from the model (1 and 2 for Llama-2), EOD = EOS, and a
// Tokenize that prepends BOS as Megatron's tokenize(s, bos=True, eos=False).
// Encode and Decode are the plain sentencepiece ones.
type Llama2 struct {
	*SentencePiece
}

// NewLlama2 wraps a SentencePiece model; it needs bos and eos ids.
func NewLlama2(sp *SentencePiece) (*Llama2, error) {
	if _, ok := sp.BOS(); !ok {
		return nil, fmt.Errorf("tokenizer: %s: the model has no bos id", TypeLlama2)
	}
	if _, ok := sp.EOS(); !ok {
		return nil, fmt.Errorf("tokenizer: %s: the model has no eos id", TypeLlama2)
	}
	return &Llama2{sp}, nil
}

// Tokenize is BOS followed by Encode(text).
func (t *Llama2) Tokenize(text string) []int {
	bos, _ := t.BOS()
	return append([]int{bos}, t.Encode(text)...)
}

// MegatronSentencePiece is Megatron's SentencePieceTokenizer
// (_SentencePieceTokenizer): the model's pieces followed by special tokens
// it lacks — "<CLS>", "<SEP>", "<EOD>", "<MASK>", the pad piece (or
// "<PAD>"), the bos piece (or "<BOS>"), the eos piece (or "<EOS>") and
// "<extra_id_0>".. — in that order. Their text in the input encodes to their
// ids (the earliest occurrence first, ties to the earlier special), the rest
// goes through sentencepiece. EOD is "<EOD>".
type MegatronSentencePiece struct {
	sp       *SentencePiece
	special  []addedToken // in Megatron's order
	bySpecID map[int]string
	n        int
	eod, bos int
	eos, pad int
}

// NewMegatronSentencePiece adds Megatron's special tokens to sp, with
// extraIDs "<extra_id_i>" tokens (--vocab-extra-ids).
func NewMegatronSentencePiece(sp *SentencePiece, extraIDs int) *MegatronSentencePiece {
	t := &MegatronSentencePiece{sp: sp, bySpecID: map[int]string{}, n: sp.VocabSize()}
	vocab := make(map[string]int, t.n)
	for i := range t.n { // later duplicates win, as Megatron's dict
		vocab[sp.Piece(i)] = i
	}
	add := func(tok string) int {
		id, ok := vocab[tok]
		if !ok {
			id = t.n
			t.n++
			vocab[tok] = id
		}
		if _, dup := t.bySpecID[id]; !dup {
			t.special = append(t.special, addedToken{text: tok, id: id})
		}
		t.bySpecID[id] = tok
		return id
	}
	pieceOr := func(id int, def string) string {
		if id >= 0 && id < sp.VocabSize() {
			return sp.Piece(id)
		}
		return def
	}
	add("<CLS>")
	add("<SEP>")
	t.eod = add("<EOD>")
	add("<MASK>")
	t.pad = add(pieceOr(sp.m.padID, "<PAD>"))
	t.bos = add(pieceOr(sp.m.bosID, "<BOS>"))
	t.eos = add(pieceOr(sp.m.eosID, "<EOS>"))
	for i := range extraIDs {
		add(fmt.Sprintf("<extra_id_%d>", i))
	}
	return t
}

// Encode splits text at special tokens and encodes the rest with
// sentencepiece, as Megatron's tokenize.
func (t *MegatronSentencePiece) Encode(text string) []int {
	ids := []int{}
	for {
		at, which := -1, -1
		for k, s := range t.special {
			if s.text == "" { // an empty piece (corrupt model) would never advance
				continue
			}
			if i := strings.Index(text, s.text); i >= 0 && (at < 0 || i < at) {
				at, which = i, k
			}
		}
		if at < 0 {
			break
		}
		ids = append(ids, t.sp.Encode(text[:at])...)
		ids = append(ids, t.special[which].id)
		text = text[at+len(t.special[which].text):]
	}
	return append(ids, t.sp.Encode(text)...)
}

// Decode is Megatron's detokenize: sentencepiece runs joined with special
// tokens, each followed by a space.
func (t *MegatronSentencePiece) Decode(ids []int) string {
	var b strings.Builder
	last := 0
	for i, id := range ids {
		if s, ok := t.bySpecID[id]; ok {
			b.WriteString(t.sp.Decode(ids[last:i]))
			b.WriteString(" ")
			b.WriteString(s)
			b.WriteString(" ")
			last = i + 1
		}
	}
	b.WriteString(t.sp.Decode(ids[last:]))
	return b.String()
}

// VocabSize counts the model's pieces and the added special tokens.
func (t *MegatronSentencePiece) VocabSize() int { return t.n }

// EOD is the id of "<EOD>".
func (t *MegatronSentencePiece) EOD() int { return t.eod }

// BOS is the bos piece's id (or "<BOS>"'s).
func (t *MegatronSentencePiece) BOS() (int, bool) { return t.bos, true }

// EOS is the eos piece's id (or "<EOS>"'s).
func (t *MegatronSentencePiece) EOS() (int, bool) { return t.eos, true }

// Pad is the pad piece's id (or "<PAD>"'s).
func (t *MegatronSentencePiece) Pad() (int, bool) { return t.pad, true }
