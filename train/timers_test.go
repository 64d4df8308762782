package train

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/parallel"
)

// The inputs of tools/golden/megatron_timers.py: timer names and each
// rank's seconds (0: the rank did not run the timer).
var (
	timerGoldenNames = []string{"forward-backward", "layernorm-grads-all-reduce", "embedding-grads-all-reduce", "all-grads-sync",
		"optimizer-inner-step", "optimizer", "a-name-longer-than-the-forty-eight-columns-of-dots"}
	timerGoldenTimes = [][]float32{{1.2345678, 0.0, 0.0, 0.0123456, 0.5, 0.75, 2.0},
		{1.3, 0.0, 0.004321, 0.0125, 0.49999, 0.8125, 0.0}}
)

// TestTimersGolden: the timers block for each --timing-log-option and
// normaliser is byte for byte what Megatron's own Timers.log prints to
// stdout (megatron/core/timers.py run by tools/golden/megatron_timers.py
// under training.py's logging set-up), "INFO:megatron.core.timers:" first;
// with nothing timed nothing is printed.
func TestTimersGolden(t *testing.T) {
	raw, err := os.ReadFile("testdata/megatron_timers.golden")
	if err != nil {
		t.Fatal(err)
	}
	cases := strings.Split(string(raw), "### ")[1:]
	if len(cases) != 7 {
		t.Fatalf("%d cases in the golden file, want 7", len(cases))
	}
	for _, c := range cases {
		head, want, _ := strings.Cut(c, "\n")
		var option string
		var norm float64
		if f := strings.Fields(head); len(f) == 2 {
			option = f[0]
			norm, err = strconv.ParseFloat(f[1], 64)
		}
		if option == "" || err != nil {
			t.Fatalf("case header %q", head)
		}
		names, times := timerGoldenNames, timerGoldenTimes
		if option == "minmax-empty" {
			option, names, times = TimingMinMax, []string{"forward-backward", "optimizer"}, [][]float32{{0, 0}, {0, 0}}
		}
		ts := newTimers(2, option, time.Now)
		got := ts.format(names, times, norm)
		if got != "" {
			got = timersLogPrefix + got + "\n"
		}
		if got != want {
			t.Errorf("%s: got\n%s\nMegatron prints\n%s", head, got, want)
		}
	}
}

// fakeClock advances by step at every reading.
type fakeClock struct {
	mu   sync.Mutex
	t    time.Time
	step time.Duration
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(c.step)
	return c.t
}

// TestTimersLevels: a timer above --timing-log-level is not kept (Megatron's
// DummyTimer), one at or below is; training_log's list grows with the
// level; a timer accumulates until a reset.
func TestTimersLevels(t *testing.T) {
	for level := 0; level <= 2; level++ {
		clk := &fakeClock{step: time.Millisecond}
		ts := newTimers(level, TimingMinMax, clk.now)
		for l, name := range []string{"setup", "phase", "detail"} {
			ts.start(name, l)
			ts.stop(name)
			ts.start(name, l)
			ts.stop(name)
		}
		times, err := ts.allRanks(context.Background(), nil, []string{"setup", "phase", "detail"}, true)
		if err != nil {
			t.Fatal(err)
		}
		for l, got := range times[0] {
			want := float32(0)
			if l <= level {
				want = 0.002 // two 1 ms starts/stops
			}
			if got != want {
				t.Errorf("level %d: timer of level %d holds %g s, want %g", level, l, got, want)
			}
		}
		if again, _ := ts.allRanks(context.Background(), nil, []string{"setup"}, false); again[0][0] != 0 {
			t.Errorf("level %d: %g s after a reset", level, again[0][0])
		}
	}
	if n := len(logNames(0)); n != 0 {
		t.Errorf("level 0 logs %d timers after the log line, want none", n)
	}
	if l1, l2 := logNames(1), logNames(2); len(l1) != 12 || len(l2) != 24 || l1[0] != "forward-backward" || l2[12] != "batch-generator" {
		t.Errorf("levels 1 and 2: %v, %v", l1, l2)
	}
}

// TestTimersMinMaxAcrossRanks: two in-process ranks time the same phase
// for 3 and 5 ms; the block rank 1 prints has (3.00, 5.00), the max
// option 5.00, and the all option both ranks.
func TestTimersMinMaxAcrossRanks(t *testing.T) {
	for _, c := range []struct{ option, want string }{
		{TimingMinMax, "forward-backward ...............................: (3.00, 5.00)"},
		{TimingMax, "forward-backward ...............................: 5.00"},
		{TimingAll, "  forward-backward:\n     rank  0: 3.00\n     rank  1: 5.00\n  optimizer:\n     rank  1: 1.00"},
	} {
		var mu sync.Mutex
		blocks := map[int]string{}
		err := inproc.Run(context.Background(), 2, func(ctx context.Context, pg comm.ProcessGroup) error {
			r := pg.Rank()
			clk := &fakeClock{step: time.Duration(3+2*r) * time.Millisecond}
			ts := newTimers(1, c.option, clk.now)
			ts.start(timerForwardBackward, 1)
			ts.stop(timerForwardBackward)
			if r == 1 {
				clk.step = time.Millisecond
				ts.start(timerOptimizer, 1)
				ts.stop(timerOptimizer)
			}
			times, err := ts.allRanks(ctx, pg, []string{timerForwardBackward, timerOptimizer}, true)
			if err != nil {
				return err
			}
			mu.Lock()
			blocks[r] = ts.format([]string{timerForwardBackward, timerOptimizer}, times, 1)
			mu.Unlock()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(blocks[1], c.want) || blocks[0] != blocks[1] {
			t.Errorf("%s: rank 1 formats\n%s\nwant %q (rank 0 the same:\n%s)", c.option, blocks[1], c.want, blocks[0])
		}
	}
}

// TestTimersInTrainingLog: a run at --timing-log-level 2 prints the level-0
// set-up block before training, after each log line the measured level-1
// and level-2 timers of gotron's step (not the phases it does not have),
// and the evaluate and save-checkpoint blocks; at level 0 only the
// level-0 blocks; at -1 none.
func TestTimersInTrainingLog(t *testing.T) {
	block := regexp.MustCompile(`(?m)^INFO:megatron\.core\.timers:\(min, max\) time across ranks \(ms\):\n((?:    .*\n)+)`)
	run := func(level int) []string {
		cfg := tinyConfig(t)
		cfg.TrainIters, cfg.EvalInterval, cfg.LogInterval, cfg.Schedule.LRWarmupIters = 2, 2, 2, 0
		cfg.Save, cfg.SaveInterval = t.TempDir(), 2
		cfg.TimingLogLevel, cfg.DataSetupTime = level, 5*time.Millisecond
		var out bytes.Buffer
		cfg.Out = &out
		runTrainer(t, cfg)
		var names []string
		for _, m := range block.FindAllStringSubmatch(out.String(), -1) {
			var ns []string
			for _, l := range strings.Split(strings.TrimSpace(m[1]), "\n") {
				ns = append(ns, strings.TrimRight(strings.Fields(l)[0], " ."))
			}
			names = append(names, strings.Join(ns, ","))
		}
		return names
	}
	step1 := "forward-backward,all-grads-sync,optimizer-clip-main-grad,optimizer-inner-step,optimizer"
	step2 := step1 + ",batch-generator,forward-compute,backward-compute"
	setup := "model-and-optimizer-setup,train/valid/test-data-iterators-setup"
	for level, want := range map[int][]string{
		-1: nil,
		0:  {setup, "evaluate", "save-checkpoint", "evaluate"},
		1:  {setup, step1, step1, "evaluate", "save-checkpoint", "evaluate"},
		2:  {setup, step2, step2, "evaluate", "save-checkpoint", "evaluate"},
	} {
		got := run(level)
		if strings.Join(got, " | ") != strings.Join(want, " | ") {
			t.Errorf("level %d: timer blocks\n%q\nwant\n%q", level, got, want)
		}
	}
}

// TestTimersPipeline: under pipeline parallelism (1F1B over 2 stages, 4
// micro-batches) level 2 reports the executor's forward and backward
// compute and its exchanges under Megatron's p2p timer names, each on the
// ranks that make that call in Megatron's schedule: the first stage sends
// forward, sends forward while receiving backward, and receives backward;
// the last receives forward, sends backward while receiving forward, and
// sends backward.
func TestTimersPipeline(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters, cfg.EvalInterval, cfg.LogInterval, cfg.Schedule.LRWarmupIters = 2, 0, 2, 0
	cfg.MicroBatchSize, cfg.GlobalBatchSize = 1, 4
	cfg.TimingLogLevel, cfg.TimingLogOption = 2, TimingAll
	var last bytes.Buffer
	err := inproc.Run(context.Background(), 2, func(ctx context.Context, pg comm.ProcessGroup) error {
		g, err := parallel.NewGroups(pg, parallel.Config{TP: 1, PP: 2})
		if err != nil {
			return err
		}
		c := cfg
		c.Parallel = g
		if pg.Rank() == 1 {
			c.Out = &last
		}
		tr, err := New(c, MockSource{SeqLength: c.SeqLength, VocabSize: c.Model.VocabSize}, nil)
		if err != nil {
			return err
		}
		_, err = tr.Run(ctx)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	out := last.String()
	_, block, _ := strings.Cut(out, "iteration        2/")
	for _, want := range []string{
		"  forward-compute:\n     rank  0: ", "  backward-compute:\n     rank  0: ",
		"  forward-recv:\n     rank  1: ", "  forward-send:\n     rank  0: ", "  backward-recv:\n     rank  0: ",
		"  backward-send:\n     rank  1: ", "  forward-send-backward-recv:\n     rank  0: ", "  backward-send-forward-recv:\n     rank  1: ",
		"  embedding-grads-all-reduce:\n     rank  0: ",
	} {
		if !strings.Contains(block, want) {
			t.Errorf("no %q after iteration 2's line:\n%s", want, block)
		}
	}
	for _, absent := range []string{"forward-recv:\n     rank  0", "forward-send-forward-recv", "backward-send-backward-recv"} {
		if strings.Contains(block, absent) {
			t.Errorf("%q: the 1F1B schedule over 2 stages makes no such call", absent)
		}
	}
}
