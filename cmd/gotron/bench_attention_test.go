package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func runBenchAttention(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	env := &cli{stdout: &out, stderr: &out, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
	err := benchAttention(context.Background(), env, args)
	return out.String(), err
}

func TestBenchAttentionReports(t *testing.T) {
	out, err := runBenchAttention(t, "--batch", "1", "--seq", "96", "--heads", "4", "--kv-heads", "2",
		"--head-dim", "16", "--iters", "1", "--memory-seqs", "64,128,256")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"heads 4 (kv 2), head-dim 16, causal", "forward", "backward", "fwd+bwd", "GFLOP/s", "4·b·h·t²·d/2 (causal)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// one memory line per T; allocation must not grow like T² (T=256 would
	// need a 1 MiB score matrix per (b, head) if materialised).
	re := regexp.MustCompile(`T=(\d+)\s+first call\s+(\d+) B`)
	m := re.FindAllStringSubmatch(out, -1)
	if len(m) != 3 {
		t.Fatalf("want 3 memory lines, got %d:\n%s", len(m), out)
	}
	for _, l := range m {
		b, _ := strconv.Atoi(l[2])
		if b > 256<<10 {
			t.Errorf("T=%s allocated %d bytes, want < 256 KiB (no T×T buffer)", l[1], b)
		}
	}
}

func TestBenchAttentionFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--heads", "3", "--kv-heads", "2"}, "--heads 3 is not a multiple of --kv-heads 2"},
		{[]string{"--seq", "0"}, "--seq 0: want a positive number"},
		{[]string{"--memory-seqs", "512,x"}, `"x" is not a positive integer`},
		{[]string{"--head-dims", "64"}, "did you mean --head-dim"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		_, err := runBenchAttention(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want it to contain %q", tc.args, err, tc.want)
		}
	}
	if _, err := runBenchAttention(t, "--help"); !errors.Is(err, errHelp) {
		t.Errorf("--help: error %v, want errHelp", err)
	}
}
