package train

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

// TestLogLineGolden: the log line is Megatron's training_log line byte for
// byte (timestamp with microseconds, throughput only with --log-throughput,
// params norm before the skipped count, no lm loss and no grad norm for a
// skipped iteration, Python's rounding and inf/nan spellings), followed by
// gotron's tokens/s and MFU. The goldens come from training_log's own
// formatting statements (tools/golden/training_log.py).
func TestLogLineGolden(t *testing.T) {
	raw, err := os.ReadFile("testdata/training_log_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Cases []map[string]any
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) < 5 {
		t.Fatalf("%d cases", len(g.Cases))
	}
	now := time.Date(2026, 11, 28, 5, 40, 1, 234567000, time.Local)
	num := func(c map[string]any, k string) float64 {
		switch v := c[k].(type) {
		case nil:
			return math.NaN() // Python's None
		case float64:
			return v
		case string:
			switch v {
			case "nan":
				return math.NaN()
			case "inf":
				return math.Inf(1)
			case "-inf":
				return math.Inf(-1)
			}
		}
		t.Fatalf("%s: %v", k, c[k])
		return 0
	}
	for _, c := range g.Cases {
		l := logLine{Time: now, Iteration: int64(num(c, "iteration")), TrainIters: int64(num(c, "train_iters")),
			ConsumedSamples: int64(num(c, "consumed")), ElapsedMS: num(c, "elapsed_ms") / 1000 * 1000,
			LogThroughput: c["log_throughput"].(bool), Throughput: num(c, "throughput"), LearningRate: num(c, "lr"),
			GlobalBatchSize: int(num(c, "batch")), LMLoss: num(c, "loss"), LossScale: num(c, "loss_scale"),
			GradNorm: num(c, "grad_norm"), ParamsNorm: num(c, "params_norm"),
			SkippedIterations: int64(num(c, "skipped")), NaNIterations: int64(num(c, "nan")),
			TokensPerSecond: 10509.66, MFU: 0.1234}
		got, want := l.String(), c["line"].(string)
		if rest, ok := strings.CutPrefix(got, want); !ok || rest != " tokens/s: 10509.7 | MFU: 12.3% |" {
			t.Errorf("%s:\n got %q\nwant %q + gotron's tokens/s and MFU", c["name"], got, want)
		}
	}
}

// TestFirstIterationLogLine: as Megatron (d98e8a6), a run's first
// iteration is logged too, without resetting the interval: at
// --log-interval 3 over 6 iterations the lines are 1, 3 and 6, the line of
// iteration 3 averages the loss of iterations 1–3 over its time since the
// start, and the metrics file keeps one record per --log-interval line.
func TestFirstIterationLogLine(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters, cfg.LogInterval, cfg.EvalIters = 6, 3, 0
	var out strings.Builder
	cfg.Out = &out
	cfg.MetricsFile = t.TempDir() + "/m.jsonl"
	t0 := time.Date(2026, 11, 28, 6, 0, 0, 0, time.UTC)
	tick := 0
	cfg.Now = func() time.Time { tick++; return t0.Add(time.Duration(tick) * 10 * time.Millisecond) }
	res := runTrainer(t, cfg)
	var its []string
	for _, l := range strings.Split(out.String(), "\n") {
		if i := strings.Index(l, "] iteration "); i > 0 {
			its = append(its, strings.Fields(l[i+len("] iteration "):])[0])
			if strings.Contains(l, "iteration        3/") {
				want := (res.Losses[0] + res.Losses[1] + res.Losses[2]) / 3
				if !strings.Contains(l, fmt.Sprintf("lm loss: %.6E |", want)) {
					t.Errorf("iteration 3 should average iterations 1-3 (%.6E): %s", want, l)
				}
			}
			if strings.Contains(l, "iteration        1/") && !strings.Contains(l, fmt.Sprintf("lm loss: %.6E |", res.Losses[0])) {
				t.Errorf("iteration 1's line: %s", l)
			}
		}
	}
	if fmt.Sprint(its) != "[1/ 3/ 6/]" {
		t.Fatalf("log lines of iterations %v, want 1, 3, 6:\n%s", its, out.String())
	}
	if n := strings.Count(out.String(), "Theoretical memory footprints"); n != 1 {
		t.Errorf("%d theoretical memory reports, want 1", n)
	}
	b, err := os.ReadFile(cfg.MetricsFile)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(string(b)), "\n"); len(lines) != 2 || !strings.Contains(lines[0], `"iteration":3`) {
		t.Errorf("metrics records:\n%s", b)
	}
}
