// Package checked validates integers that arrive from outside the program —
// request fields, flags, config keys, file headers — before any arithmetic
// is done with them. One place for these checks keeps the error messages
// uniform ("max_tokens: 9223372036854775807 is out of range: must be at
// most 1024 (the model's positions minus the prompt's 5 tokens)") and stops
// the classic failure where a sum of two user integers wraps negative and
// slips past a "< limit" test.
package checked

import (
	"fmt"
	"math"
)

// RangeError reports an integer outside the range its meaning allows.
type RangeError struct {
	Name     string // what the value is: a flag ("--max-new-tokens"), a field ("max_tokens"), "file.idx: sizes[3]"
	Value    int64
	Min, Max int64  // inclusive bounds; math.MinInt64 / math.MaxInt64 mean unbounded
	Why      string // optional: where the bound comes from ("the model's 1024 positions")
}

func (e *RangeError) Error() string {
	var want string
	switch {
	case e.Min == math.MinInt64 && e.Max == math.MaxInt64:
		want = "any integer" // not produced by this package's checks
	case e.Min == math.MinInt64:
		want = fmt.Sprintf("at most %d", e.Max)
	case e.Max == math.MaxInt64:
		want = fmt.Sprintf("at least %d", e.Min)
	case e.Min == e.Max:
		want = fmt.Sprintf("exactly %d", e.Min)
	default:
		want = fmt.Sprintf("between %d and %d", e.Min, e.Max)
	}
	s := fmt.Sprintf("%s: %d is out of range: must be %s", e.Name, e.Value, want)
	if e.Why != "" {
		s += " (" + e.Why + ")"
	}
	return s
}

// Range returns a *RangeError unless min <= v <= max.
func Range(name string, v, min, max int64) error {
	if v < min || v > max {
		return &RangeError{Name: name, Value: v, Min: min, Max: max}
	}
	return nil
}

// RangeWhy is Range with the bound's origin spelled out in the error.
func RangeWhy(name string, v, min, max int64, why string) error {
	if v < min || v > max {
		return &RangeError{Name: name, Value: v, Min: min, Max: max, Why: why}
	}
	return nil
}

// NonNegative returns a *RangeError when v < 0.
func NonNegative(name string, v int64) error { return Range(name, v, 0, math.MaxInt64) }

// Positive returns a *RangeError when v < 1.
func Positive(name string, v int64) error { return Range(name, v, 1, math.MaxInt64) }

// AtMost returns a *RangeError when v > max (negative values are allowed;
// combine with NonNegative where they are not).
func AtMost(name string, v, max int64) error { return Range(name, v, math.MinInt64, max) }

// Add returns a+b and whether the sum fits in an int64 without wrapping.
func Add(a, b int64) (int64, bool) {
	s := a + b
	// Overflow happened iff a and b have the same sign and s has the other.
	if (a >= 0) == (b >= 0) && (s >= 0) != (a >= 0) {
		return 0, false
	}
	return s, true
}

// Mul returns a*b and whether the product fits in an int64 without wrapping.
func Mul(a, b int64) (int64, bool) {
	if a == 0 || b == 0 {
		return 0, true
	}
	p := a * b
	if p/b != a || (a == -1 && b == math.MinInt64) || (b == -1 && a == math.MinInt64) {
		return 0, false
	}
	return p, true
}

// AddInt is Add for int, the type lengths and counts have in Go.
func AddInt(a, b int) (int, bool) {
	s, ok := Add(int64(a), int64(b))
	if !ok || int64(int(s)) != s {
		return 0, false
	}
	return int(s), true
}

// MulInt is Mul for int.
func MulInt(a, b int) (int, bool) {
	p, ok := Mul(int64(a), int64(b))
	if !ok || int64(int(p)) != p {
		return 0, false
	}
	return int(p), true
}
