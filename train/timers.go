package train

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/parallel"
)

// Timing options (--timing-log-option): how Timers.log reports a timer
// over the ranks.
const (
	TimingMax    = "max"
	TimingMinMax = "minmax" // Megatron's default
	TimingAll    = "all"
)

// Timer names and levels, as Megatron's (megatron/training/training.py,
// megatron/core/pipeline_parallel/schedules.py, .../optimizer/optimizer.py,
// .../distributed/finalize_model_grads.py, pretrain_gpt.py).
const (
	timerModelSetup     = "model-and-optimizer-setup"
	timerDataSetup      = "train/valid/test-data-iterators-setup"
	timerLoadCheckpoint = "load-checkpoint"
	timerSaveCheckpoint = "save-checkpoint"
	timerEvaluate       = "evaluate"

	timerForwardBackward = "forward-backward"
	timerAllGradsSync    = "all-grads-sync"
	timerNonTPGrads      = "non-tensor-parallel-grads-all-reduce"
	timerEmbeddingGrads  = "embedding-grads-all-reduce"
	timerParamsGather    = "params-all-gather"
	timerUnscale         = "optimizer-unscale-and-check-inf"
	timerClipMainGrad    = "optimizer-clip-main-grad"
	timerCountZeros      = "optimizer-count-zeros"
	timerInnerStep       = "optimizer-inner-step"
	timerOptimizer       = "optimizer"

	timerBatchGenerator  = "batch-generator"
	timerForwardCompute  = "forward-compute"
	timerBackwardCompute = "backward-compute"
)

// timersToLog is training_log's timers_to_log: the level-1 names, then
// the level-2 names, in Megatron's order. gotron measures the ones its
// training step has (see docs/megatron-compat.md); a name no rank measured
// is left out of the report, as Megatron leaves out a timer with no time.
var timersToLog = [3][]string{
	1: {timerForwardBackward, "layernorm-grads-all-reduce", timerEmbeddingGrads, timerAllGradsSync, timerParamsGather,
		"optimizer-copy-to-main-grad", timerUnscale, timerClipMainGrad, timerCountZeros, timerInnerStep,
		"optimizer-copy-main-to-model-params", timerOptimizer},
	2: {timerBatchGenerator, timerForwardCompute, timerBackwardCompute, "forward-recv", "forward-send", "backward-recv",
		"backward-send", "forward-send-forward-recv", "forward-send-backward-recv", "backward-send-forward-recv",
		"backward-send-backward-recv", "forward-backward-send-forward-backward-recv"},
}

// logNames returns training_log's timers_to_log at level.
func logNames(level int) []string {
	var names []string
	for l := 1; l <= level && l < len(timersToLog); l++ {
		names = append(names, timersToLog[l]...)
	}
	return names
}

// timers are Megatron's Timers (megatron/core/timers.py) for one rank: a
// timer whose level is above --timing-log-level is not kept (Megatron's
// DummyTimer); a kept one accumulates wall time between start and stop
// until a log resets it. log gathers every rank's times and formats them as
// Megatron's timers.log does; the logging rank prints the block.
type timers struct {
	level  int
	option string
	now    func() time.Time
	on     map[string]*timer
}

type timer struct {
	elapsed time.Duration
	started time.Time
	running bool
}

func newTimers(level int, option string, now func() time.Time) *timers {
	if option == "" {
		option = TimingMinMax
	}
	return &timers{level: level, option: option, now: now, on: map[string]*timer{}}
}

// start starts timer name of the given level (a no-op above the run's
// level, or on a nil *timers).
func (ts *timers) start(name string, level int) {
	if ts == nil || level > ts.level {
		return
	}
	t := ts.on[name]
	if t == nil {
		t = &timer{}
		ts.on[name] = t
	}
	if !t.running {
		t.started, t.running = ts.now(), true
	}
}

// stop stops timer name, adding the time since its start; stopping a
// timer that is not running does nothing (the error paths of a step stop
// what may not have started).
func (ts *timers) stop(name string) {
	if ts == nil {
		return
	}
	if t := ts.on[name]; t != nil && t.running {
		t.elapsed += ts.now().Sub(t.started)
		t.running = false
	}
}

// add adds d to timer name of the given level (a phase measured by its
// own code, e.g. the pipeline executor's passes and exchanges).
func (ts *timers) add(name string, level int, d time.Duration) {
	if ts == nil || level > ts.level {
		return
	}
	t := ts.on[name]
	if t == nil {
		t = &timer{}
		ts.on[name] = t
	}
	t.elapsed += d
}

// set records d as timer name's time (Megatron's set_elapsed: a phase
// measured outside the timers).
func (ts *timers) set(name string, level int, d time.Duration) {
	if ts == nil || level > ts.level {
		return
	}
	ts.on[name] = &timer{elapsed: d}
}

// allRanks returns every rank's time of each name in seconds, [rank][name],
// as float32 (Megatron gathers a float tensor): every rank of the world must
// call it with the same names. reset zeroes the timers read.
func (ts *timers) allRanks(ctx context.Context, world comm.ProcessGroup, names []string, reset bool) ([][]float32, error) {
	size, rank := 1, 0
	if world != nil {
		size, rank = world.Size(), world.Rank()
	}
	flat := make([]float32, size*len(names))
	for i, name := range names {
		if t := ts.on[name]; t != nil {
			e := t.elapsed
			if t.running { // Megatron's elapsed: stop, read, start again
				now := ts.now()
				e += now.Sub(t.started)
				if reset {
					t.started = now
				}
			}
			flat[rank*len(names)+i] = float32(e.Seconds())
			if reset {
				t.elapsed = 0
			}
		}
	}
	if size > 1 {
		// An all-gather as a sum: each rank fills its own row.
		if err := world.AllReduce(ctx, comm.Float32s(flat), comm.Sum); err != nil {
			return nil, fmt.Errorf("train: gathering the timers: %w", err)
		}
	}
	out := make([][]float32, size)
	for r := range out {
		out[r] = flat[r*len(names) : (r+1)*len(names)]
	}
	return out, nil
}

// minMax is _get_global_min_max_time: per name, the min and max over the
// ranks that timed it (> 0), divided by normalizer; names no rank timed
// are left out.
func minMax(names []string, times [][]float32, normalizer float64) (kept []string, mins, maxs []float64) {
	for i, name := range names {
		lo, hi, any := math.Inf(1), math.Inf(-1), false
		for _, row := range times {
			if v := float64(row[i]); v > 0 {
				lo, hi, any = math.Min(lo, v), math.Max(hi, v), true
			}
		}
		if any {
			kept, mins, maxs = append(kept, name), append(mins, lo/normalizer), append(maxs, hi/normalizer)
		}
	}
	return kept, mins, maxs
}

// format is Megatron's get_all_timers_string for the run's option: times
// in seconds per rank, divided by normalizer, printed in ms; "" when no
// rank timed any of names (Megatron then prints nothing).
func (ts *timers) format(names []string, times [][]float32, normalizer float64) string {
	ms := normalizer / 1000
	var b strings.Builder
	switch ts.option {
	case TimingAll:
		b.WriteString("times across ranks (ms):")
		reported := false
		for i, name := range names {
			found := false
			for r, row := range times {
				if row[i] > 0 {
					reported = true
					if !found {
						found = true
						fmt.Fprintf(&b, "\n  %s:", name)
					}
					// Megatron divides the float32 tensor element: a
					// float32 quotient.
					fmt.Fprintf(&b, "\n     rank %2d: %s", r, pyFixed(float64(row[i]/float32(ms)), 2))
				}
			}
		}
		if !reported {
			return ""
		}
	default:
		kept, mins, maxs := minMax(names, times, ms)
		if len(kept) == 0 {
			return ""
		}
		if ts.option == TimingMax {
			b.WriteString("max time across ranks (ms):")
		} else {
			b.WriteString("(min, max) time across ranks (ms):")
		}
		for i, name := range kept {
			label := ljust(name+" ", 48, '.')
			if ts.option == TimingMax {
				fmt.Fprintf(&b, "\n    %s: %s", label, pyFixed(maxs[i], 2))
			} else {
				fmt.Fprintf(&b, "\n    %s: (%s, %s)", label, pyFixed(mins[i], 2), pyFixed(maxs[i], 2))
			}
		}
	}
	return b.String()
}

// timersLogPrefix is what Megatron's logging prints before a timers block:
// training.py's logging.basicConfig(handlers=[CustomHandler()]) keeps
// logging's default format, "%(levelname)s:%(name)s:%(message)s", and
// timers.log calls logger.info in megatron.core.timers.
const timersLogPrefix = "INFO:megatron.core.timers:"

// log is Megatron's timers.log(names, normalizer, reset): every rank takes
// part; it returns the block the logging rank prints ("" for none).
func (ts *timers) log(ctx context.Context, par *parallel.Groups, names []string, normalizer float64, reset bool) (string, error) {
	if ts == nil || len(names) == 0 {
		return "", nil
	}
	var world comm.ProcessGroup
	if par != nil {
		world = par.World
	}
	times, err := ts.allRanks(ctx, world, names, reset)
	if err != nil {
		return "", err
	}
	s := ts.format(names, times, normalizer)
	if s == "" {
		return "", nil
	}
	return timersLogPrefix + s, nil
}

// ljust is Python's str.ljust(width, fill) (width in characters).
func ljust(s string, width int, fill rune) string {
	if n := len([]rune(s)); n < width {
		return s + strings.Repeat(string(fill), width-n)
	}
	return s
}
