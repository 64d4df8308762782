package main

import (
	"bytes"
	"math"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestBenchMoE runs the real binary's bench moe on a tiny model: each
// variant is a real gotron train run (EP=2 two tcp processes under gotron
// launch), and the report has every variant's step time, tokens/s, MFU and
// ratio to grouped EP=1, the tokens/s and MFU following from the step time,
// the tokens and FLOPs a step, and the measured peak.
func TestBenchMoE(t *testing.T) {
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), bin, "bench", "moe", "--rounds", "2", "--iters", "2", "--untimed-iters", "1",
		"--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4", "--moe-ffn-hidden-size", "24",
		"--seq-length", "16", "--vocab-size", "64", "--global-batch-size", "4", "--peak-seconds", "0.05")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	s := out.String()
	head := regexp.MustCompile(`(\d+) tokens a step .*; ([0-9.]+) GFLOP a step`).FindStringSubmatch(s)
	peakM := regexp.MustCompile(`median ([0-9.]+) GFLOP/s`).FindStringSubmatch(s)
	if head == nil || peakM == nil || strings.Count(s, "\nround ") != 2 {
		t.Fatalf("no header, peak or two rounds in:\n%s", s)
	}
	tokens, _ := strconv.ParseFloat(head[1], 64)
	gflop, _ := strconv.ParseFloat(head[2], 64)
	peak, _ := strconv.ParseFloat(peakM[1], 64)
	if tokens != 4*16 || !(gflop > 0) || !(peak > 0) {
		t.Fatalf("tokens %g, GFLOP %g, peak %g in:\n%s", tokens, gflop, peak, s)
	}
	for _, label := range []string{"EP=1, grouped GEMM", "EP=1, per-expert loop", "EP=2 over tcp, 2 processes"} {
		m := regexp.MustCompile(regexp.QuoteMeta(label) + `.*?\s+([0-9.]+)\s+([0-9]+)\s+([0-9.]+)%\s+([0-9.]+)\n`).FindStringSubmatch(s)
		if m == nil {
			t.Fatalf("no row for %q in:\n%s", label, s)
		}
		var v [4]float64
		for i := range v {
			v[i], _ = strconv.ParseFloat(m[i+1], 64)
		}
		stepMS, tps, mfu := v[0], v[1], v[2]
		if !(stepMS > 0) || !near(tps, tokens/(stepMS/1e3), 0.5) || !near(mfu, 100*gflop/(stepMS/1e3)/peak, 0.05) || !(v[3] > 0) {
			t.Errorf("%s: step %g ms, %g tokens/s, MFU %g%%, ratio %g: inconsistent with %g tokens, %g GFLOP, peak %g GFLOP/s", label, stepMS, tps, mfu, v[3], tokens, gflop, peak)
		}
	}
}

// near: a, printed rounded to 2·half, is b computed from the printed step
// time (to 0.01 ms: within 0.5%) and the other printed numbers.
func near(a, b, half float64) bool {
	return math.Abs(a-b) <= 5e-3*math.Abs(b)+half*1.001
}

// TestBenchMoEBadFlags: bad flags are refused before any run, naming the flag.
func TestBenchMoEBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--variants", "grouped,fast"}, `--variants: "fast": want grouped, loop or ep2`},
		{[]string{"--variants", "loop,loop"}, `--variants: "loop" twice`},
		{[]string{"--moe-router-topk", "9"}, "--moe-router-topk"},
		{[]string{"--rounds", "0"}, "--rounds"},
		{[]string{"--global-batch-size", "6"}, "--global-batch-size=6 must be a multiple of 2 × --micro-batch-size=2"},
		{[]string{"--peak-seconds", "0"}, "--peak-seconds 0"},
		{[]string{"--hidden-size", "100"}, "hidden"},
	} {
		_, errs, code := runCLI(t, append([]string{"bench", "moe"}, c.args...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("bench moe %v: exit %d, stderr %q; want an error naming %q", c.args, code, errs, c.want)
		}
	}
}
