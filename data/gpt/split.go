package gpt

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
)

// Split names one of the three dataset splits.
type Split int

// The splits, in Megatron's order.
const (
	Train Split = iota
	Valid
	Test
)

// String returns Megatron's split name ("train", "valid", "test").
func (s Split) String() string {
	switch s {
	case Train:
		return "train"
	case Valid:
		return "valid"
	case Test:
		return "test"
	}
	return fmt.Sprintf("Split(%d)", int(s))
}

// Bookend is one split's [Start, End) fraction of a dataset's sequences. The
// start of the first split is Python's integer 0 in Megatron, which only
// matters for the cache description (see describe.go).
type Bookend struct{ Start, End float64 }

// ParseSplit parses a --split string like "969,30,1" as Megatron's
// parse_and_normalize_split: up to three proportions, missing entries 0,
// the vector divided by its sum. Megatron takes every match of [.0-9]+ as
// a number, so "-1,2,3" silently becomes 1,2,3 and "1e400,1,1" four
// numbers; gotron reads the comma- (or space-) separated fields as numbers
// and refuses a negative, non-finite or malformed one, naming it. One pair
// of quotes around the whole value is read through, as Megatron's matching
// does: a launch script's array element "--split '99,1,0'", expanded
// unquoted, reaches the program as '99,1,0' with its quotes
// (examples/llama/train_llama3_8b_h100_fp8.sh).
func ParseSplit(s string) ([3]float64, error) {
	var v [3]float64
	body := s
	if n := len(body); n >= 2 && (body[0] == '\'' || body[0] == '"') && body[n-1] == body[0] {
		body = body[1 : n-1]
	}
	fields := strings.FieldsFunc(body, func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
	if len(fields) > 3 {
		return v, fmt.Errorf("gpt: --split %q: want at most 3 proportions (train,valid,test), got %d", s, len(fields))
	}
	for i, n := range fields {
		f, err := strconv.ParseFloat(n, 64)
		switch {
		case (err != nil && !errors.Is(err, strconv.ErrRange)) || math.IsNaN(f):
			return v, fmt.Errorf("gpt: --split %q: %q is not a proportion (a non-negative number)", s, n)
		case strings.HasPrefix(n, "-"):
			return v, fmt.Errorf("gpt: --split %q: %s is negative: proportions are ≥ 0", s, n)
		case math.IsInf(f, 0):
			return v, fmt.Errorf("gpt: --split %q: %s is not finite (beyond float64's range)", s, n)
		}
		v[i] = f
	}
	sum := v[0] + v[1] + v[2]
	if !(sum > 0) || math.IsInf(sum, 0) {
		return v, fmt.Errorf("gpt: --split %q: the proportions must sum to a positive finite number", s)
	}
	for i := range v {
		v[i] /= sum
	}
	return v, nil
}

// SplitMatrix turns a normalized split vector into book-ends
// (convert_split_vector_to_split_matrix): running sums from 0; a split whose
// book-ends coincide is nil.
func SplitMatrix(v [3]float64) [3]*Bookend {
	var m [3]*Bookend
	start := 0.0
	for i, f := range v {
		end := start + f
		if end > start {
			m[i] = &Bookend{start, end}
		}
		start = end
	}
	return m
}

// SplitRange returns the sequence ids [beg, end) of a split of n sequences:
// Python's round (half to even) of the book-ends times n.
func SplitRange(b Bookend, n int) (beg, end int) {
	return int(math.RoundToEven(b.Start * float64(n))), int(math.RoundToEven(b.End * float64(n)))
}
