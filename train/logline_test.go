package train

import (
	"encoding/json"
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
