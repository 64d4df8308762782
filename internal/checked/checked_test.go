package checked

import (
	"errors"
	"math"
	"testing"
)

func TestAddMul(t *testing.T) {
	for _, c := range []struct {
		a, b   int64
		sum    int64
		sumOK  bool
		prod   int64
		prodOK bool
	}{
		{2, 3, 5, true, 6, true},
		{math.MaxInt64, 1, 0, false, math.MaxInt64, true},
		{5, math.MaxInt64, 0, false, 0, false},
		{math.MinInt64, -1, 0, false, 0, false},
		{math.MinInt64, 1, math.MinInt64 + 1, true, math.MinInt64, true},
		{-1, math.MinInt64, 0, false, 0, false},
		{1 << 32, 1 << 31, 1<<32 + 1<<31, true, 0, false},
		{-(1 << 31), 1 << 32, 1 << 31, true, math.MinInt64, true},
		{0, math.MinInt64, math.MinInt64, true, 0, true},
	} {
		s, ok := Add(c.a, c.b)
		if ok != c.sumOK || (ok && s != c.sum) {
			t.Errorf("Add(%d, %d) = %d, %v; want %d, %v", c.a, c.b, s, ok, c.sum, c.sumOK)
		}
		p, ok := Mul(c.a, c.b)
		if ok != c.prodOK || (ok && p != c.prod) {
			t.Errorf("Mul(%d, %d) = %d, %v; want %d, %v", c.a, c.b, p, ok, c.prod, c.prodOK)
		}
	}
	if _, ok := AddInt(math.MaxInt, 1); ok {
		t.Error("AddInt(MaxInt, 1) reported no overflow")
	}
	if _, ok := MulInt(math.MaxInt/2+1, 2); ok {
		t.Error("MulInt(MaxInt/2+1, 2) reported no overflow")
	}
}

func TestRangeErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{Positive("--micro-batch-size", 0), "--micro-batch-size: 0 is out of range: must be at least 1"},
		{NonNegative("--log-interval", -3), "--log-interval: -3 is out of range: must be at least 0"},
		{AtMost("top_k", 70000, 50257), "top_k: 70000 is out of range: must be at most 50257"},
		{Range("rank", 4, 0, 3), "rank: 4 is out of range: must be between 0 and 3"},
		{RangeWhy("max_tokens", math.MaxInt64, 1, 1019, "the model's 1024 positions minus the prompt's 5 tokens"),
			"max_tokens: 9223372036854775807 is out of range: must be between 1 and 1019 (the model's 1024 positions minus the prompt's 5 tokens)"},
	} {
		if c.err == nil || c.err.Error() != c.want {
			t.Errorf("got %v\nwant %s", c.err, c.want)
		}
		var re *RangeError
		if !errors.As(c.err, &re) {
			t.Errorf("%v is not a *RangeError", c.err)
		}
	}
	if err := Range("x", 3, 3, 3); err != nil {
		t.Errorf("Range(3, 3..3) = %v", err)
	}
}
