package main

import (
	"strings"
	"testing"
)

// TestTrainProbeFlagErrors runs the bad model flags that used to panic (a
// negative size reached tensor shapes) or were accepted silently, and wants
// exit status 1 with an error naming the flag.
func TestTrainProbeFlagErrors(t *testing.T) {
	cases := []struct {
		extra []string
		want  string
	}{
		{[]string{"--ffn-hidden-size", "-1"}, "--ffn-hidden-size=-1"},
		{[]string{"--kv-channels", "-1"}, "--kv-channels=-1"},
		{[]string{"--group-query-attention", "--num-query-groups", "-1"}, "--num-query-groups=-1"},
		{[]string{"--norm-epsilon", "-1"}, "--norm-epsilon=-1"},
		{[]string{"--max-nan-iterations", "-1"}, "--max-nan-iterations=-1"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.extra, " "), func(t *testing.T) {
			args := append(append(append([]string{}, tinyTrain...), "--train-iters", "1"), c.extra...)
			_, errs, code := runCLI(t, args...)
			if code != 1 || !strings.Contains(errs, c.want) {
				t.Fatalf("exit %d, stderr %q: want exit 1 naming %q", code, errs, c.want)
			}
		})
	}
}
