package tokenizer

import (
	"fmt"
	"strconv"
	"strings"
)

// Null is Megatron's NullTokenizer: text is whitespace-separated integer ids
// (used with mock data and benchmarks). EOD is VocabSize-1, as Megatron HEAD
// (older releases used VocabSize and reported VocabSize+1).
type Null struct {
	n int
}

var _ Tokenizer = (*Null)(nil)

// NewNull returns the null tokenizer over ids 0..vocabSize-1 (--vocab-size).
func NewNull(vocabSize int) (*Null, error) {
	if vocabSize < 1 {
		return nil, configErr("%s needs --vocab-size ≥ 1, got %d", TypeNull, vocabSize)
	}
	return &Null{n: vocabSize}, nil
}

// Encode parses the whitespace-separated integers of text. Fields that are
// not integers are skipped (Megatron would raise; Encode has no error).
// Use Parse to see them.
func (t *Null) Encode(text string) []int {
	ids, _ := t.Parse(text)
	return ids
}

// Parse is Encode that reports the first field that is not an integer.
func (t *Null) Parse(text string) ([]int, error) {
	f := strings.Fields(text)
	ids := make([]int, 0, len(f))
	var first error
	for _, s := range f {
		v, err := strconv.Atoi(s)
		if err != nil {
			if first == nil {
				first = fmt.Errorf("tokenizer: NullTokenizer: %q is not an integer id", s)
			}
			continue
		}
		ids = append(ids, v)
	}
	return ids, first
}

// Decode joins ids with single spaces.
func (t *Null) Decode(ids []int) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.Itoa(id))
	}
	return b.String()
}

// VocabSize is --vocab-size.
func (t *Null) VocabSize() int { return t.n }

// EOD is VocabSize-1.
func (t *Null) EOD() int { return t.n - 1 }

// BOS reports no BOS token.
func (t *Null) BOS() (int, bool) { return -1, false }

// EOS is EOD.
func (t *Null) EOS() (int, bool) { return t.n - 1, true }

// Pad is -1, as Megatron's NullTokenizer.
func (t *Null) Pad() (int, bool) { return -1, true }
