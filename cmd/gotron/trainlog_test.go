package main

import (
	"regexp"
	"strings"
	"testing"
)

// TestTrainLogLineAsMegatron: a real --fp16 run prints Megatron's
// training_log lines: the microsecond timestamp first, no throughput
// without --log-throughput, and for an iteration skipped by a gradient
// overflow no lm loss and no grad norm (gotron printed NaN for both).
func TestTrainLogLineAsMegatron(t *testing.T) {
	out, errs, code := runCLI(t, with(tinyTrain, "--train-iters", "2", "--fp16", "--hysteresis", "1", "--loss-scale-window", "100", "--no-progress")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	line := regexp.MustCompile(`(?m)^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\] iteration +(\d+)/ +2 \| consumed samples: +\d+ \| elapsed time per iteration \(ms\): [0-9.]+ \| learning rate: [0-9.]+E[-+]\d\d \| global batch size: +4 \|(.*)$`)
	lines := line.FindAllStringSubmatch(out, -1)
	if len(lines) != 2 {
		t.Fatalf("%d Megatron log lines, want 2:\n%s", len(lines), out)
	}
	skipped := lines[0][2] // from 2^32 the first iteration overflows
	if !strings.HasPrefix(skipped, " loss scale: 2147483648.0 | number of skipped iterations:   1 | number of nan iterations:   0 | tokens/s: ") {
		t.Errorf("skipped iteration's line: %q", lines[0][0])
	}
	for _, l := range lines {
		if strings.Contains(strings.ToLower(l[0]), "nan |") || strings.Contains(l[0], "throughput per GPU") {
			t.Errorf("line %q: NaN or throughput without --log-throughput", l[0])
		}
	}
	// A scale that does not overflow: every line has the loss and the grad
	// norm; --log-throughput and --log-params-norm add theirs in Megatron's
	// places.
	out, errs, code = runCLI(t, with(tinyTrain, "--train-iters", "2", "--fp16", "--initial-loss-scale", "64", "--log-throughput", "--log-params-norm", "--no-progress")...)
	want := regexp.MustCompile(`(?m)^ \[[-0-9 :.]{26}\] iteration +[12]/ +2 \| consumed samples: +\d+ \| elapsed time per iteration \(ms\): [0-9.]+ \| throughput per GPU \(TFLOP/s/GPU\): [0-9]+\.\d \| learning rate: [0-9.]+E[-+]\d\d \| global batch size: +4 \| lm loss: [0-9.]+E\+00 \| loss scale: 64\.0 \| grad norm: [0-9]+\.\d{3} \| params norm: [0-9]+\.\d{3} \| number of skipped iterations:   0 \| number of nan iterations:   0 \| tokens/s: [0-9.]+ \| MFU: [0-9.]+% \|$`)
	if code != 0 || len(want.FindAllString(out, -1)) != 2 {
		t.Errorf("--log-throughput --log-params-norm: exit %d, %s\n%s", code, errs, out)
	}
}
