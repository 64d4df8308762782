package train

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gotron/gotron/ckpt"
)

// TestSaveRetainInterval: with --save-interval 2 and --save-retain-interval
// 4 over 10 iterations, Megatron's rule (each new latest deletes the
// previous latest unless it is a multiple of 4) leaves iterations 4, 8 and
// the latest, 10, on disk; a resumed run goes on deleting, and a symbolic
// link is never deleted.
func TestSaveRetainInterval(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.EvalInterval, cfg.TrainIters = 0, 14
	dir := t.TempDir()
	var out bytes.Buffer
	run := cfg
	run.Save, run.SaveInterval, run.SaveRetainInterval, run.Out, run.ExitInterval = dir, 2, 4, &out, 10
	res := runTrainer(t, run)
	if want := []int64{2, 4, 6, 8, 10}; !slices.Equal(res.SavedAt, want) {
		t.Fatalf("saved at %v, want %v", res.SavedAt, want)
	}
	if its, err := ckpt.List(dir); err != nil || !slices.Equal(its, []int{4, 8, 10}) {
		t.Fatalf("checkpoints on disk %v (%v), want [4 8 10]", its, err)
	}
	for _, it := range []int{2, 6} {
		if !strings.Contains(out.String(), fmt.Sprintf("successfully deleted checkpoint from iteration %7d at %s", it, dir)) {
			t.Errorf("no deletion line for iteration %d in:\n%s", it, out.String())
		}
	}
	if it, _ := ckpt.Latest(dir); it != 10 {
		t.Fatalf("tracker %d, want 10", it)
	}

	// A resumed run (to 14) deletes 10 once 12 is saved; 12, a multiple
	// of 4, stays when 14 is saved.
	resume := run
	resume.Load, resume.ExitInterval = dir, 0
	out.Reset()
	runTrainer(t, resume)
	if its, _ := ckpt.List(dir); !slices.Equal(its, []int{4, 8, 12, 14}) {
		t.Fatalf("after resuming, checkpoints %v, want [4 8 12 14]", its)
	}

	// The symbolic-link rule, on its own: a latest that is a link stays.
	link := t.TempDir()
	target := filepath.Join(link, "elsewhere")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(link, ckpt.IterDirName(6))); err != nil {
		t.Fatal(err)
	}
	var lines []string
	printf := func(f string, a ...any) { lines = append(lines, f) }
	if got, err := retainCheckpoints(link, 6, 8, 4, printf); err != nil || got != 0 {
		t.Fatalf("deleted %d (%v) through a symbolic link", got, err)
	}
	if _, err := os.Stat(target); err != nil || len(lines) != 1 || !strings.Contains(lines[0], "symbolic link") {
		t.Fatalf("link target %v, lines %q", err, lines)
	}
	// Never the checkpoint just written, never iteration 0, never a multiple.
	for _, c := range [][3]int64{{8, 8, 4}, {0, 2, 4}, {4, 6, 4}} {
		if got, _ := retainCheckpoints(link, c[0], c[1], c[2], printf); got != 0 {
			t.Errorf("prev %d, it %d, interval %d: deleted %d", c[0], c[1], c[2], got)
		}
	}
}

// TestSaveRetainIntervalRules: Megatron's asserts (> 0, a multiple of
// --save-interval, with --save) are errors naming the flags.
func TestSaveRetainIntervalRules(t *testing.T) {
	cfg := tinyConfig(t)
	src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
	for _, c := range []struct {
		save           string
		every, retain  int64
		progress, want string
	}{
		{t.TempDir(), 2, 3, "", "want a multiple of --save-interval=2"},
		{"", 0, 4, "", "needs --save and --save-interval"},
		{t.TempDir(), 2, -4, "", "want > 0"},
		{"", 0, 0, "on", "--log-progress writes progress.txt in --save"},
	} {
		bad := cfg
		bad.Save, bad.SaveInterval, bad.SaveRetainInterval, bad.LogProgress = c.save, c.every, c.retain, c.progress != ""
		if _, err := New(bad, src, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("save %q every %d retain %d: %v, want %q", c.save, c.every, c.retain, err, c.want)
		}
	}
}

// TestLogProgress: --log-progress writes Megatron's progress.txt lines
// (append_to_progress_log's "time\tJob ID: ...\t# GPUs: N\tevent"): the
// job start, each save with the job's and the cumulative throughput, the
// floating-point operations and tokens so far, and --save-retain-interval's
// deletions; a resumed job appends its own start, and its cumulative
// throughput counts from the first job's start.
func TestLogProgress(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.EvalInterval, cfg.TrainIters = 0, 6
	dir := t.TempDir()
	// A clock that advances a second a reading: throughputs are finite.
	clock := time.Date(2026, 11, 28, 9, 0, 0, 0, time.Local)
	cfg.Now = func() time.Time { clock = clock.Add(time.Second); return clock }
	run := cfg
	run.Save, run.SaveInterval, run.SaveRetainInterval, run.LogProgress, run.JobID, run.ExitInterval = dir, 1, 2, true, "4242", 4
	runTrainer(t, run)
	resume := run
	resume.Load, resume.ExitInterval = dir, 0
	runTrainer(t, resume)

	raw, err := os.ReadFile(filepath.Join(dir, ProgressFile))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
	head := `^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\tJob ID: 4242\t# GPUs: 1\t`
	saved := func(it string) string {
		return head + `Saved checkpoint\tIteration: ` + it + `\tJob throughput: \d+\.\d TFLOP/s/GPU\tCumulative throughput: \d+\.\d TFLOP/s/GPU\tFloating-point operations: \d\.\d\de[+-]\d\d\tTokens \(in billions\): 0\.00$`
	}
	want := []string{
		head + `Starting job$`,
		// Iteration 1 is deleted once 2 is saved, 3 once 4 is, 5 once 6 is.
		saved("1"), saved("2"), head + `Deleted checkpoint\tIteration: 1$`, saved("3"), saved("4"), head + `Deleted checkpoint\tIteration: 3$`,
		head + `Starting job$`,
		saved("5"), saved("6"), head + `Deleted checkpoint\tIteration: 5$`,
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), raw)
	}
	for i, w := range want {
		if !regexp.MustCompile(w).MatchString(lines[i]) {
			t.Errorf("line %d: %q\nwant %s", i+1, lines[i], w)
		}
	}
	// The operations field is the run's count so far (FLOPsSoFar): 4× at
	// iteration 4 what it is at 1 (to the 3 digits printed), 6× at 6 after
	// the resume.
	ops := func(line string) float64 {
		v, err := strconv.ParseFloat(progressField(strings.Split(line, "\t")[7]), 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		return v
	}
	if one := ops(lines[1]); math.Abs(ops(lines[5])/one-4) > 0.02 || math.Abs(ops(lines[9])/one-6) > 0.02 {
		t.Errorf("operations %g, %g, %g at iterations 1, 4, 6", one, ops(lines[5]), ops(lines[9]))
	}
	// The cumulative throughput of the resumed job counts from the first
	// job's start and its operations from 0.
	pl := &progressLog{path: filepath.Join(dir, ProgressFile), world: 1}
	start, flops, err := pl.firstStart()
	if err != nil || flops != 0 || start.Format("15:04:05") != lines[0][11:19] {
		t.Fatalf("first start %v, %g operations (%v); want %s and 0", start, flops, err, lines[0][:19])
	}
	// A job of another world size starts the search again.
	pl.world = 8
	if _, _, err := pl.firstStart(); err == nil || !strings.Contains(err.Error(), "no 'Starting job' line of a 8-rank job") {
		t.Fatalf("8 ranks: %v", err)
	}
}

// TestLogProgressAsyncSave: with --async-save a save appends Megatron's
// "Saving async checkpoint" line (with the throughputs) when it starts and
// "Saved async checkpoint" when it is finalised; --save-retain-interval
// deletes the previous latest only then, once the new one is in place.
func TestLogProgressAsyncSave(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.EvalInterval, cfg.TrainIters = 0, 4
	dir := t.TempDir()
	run := cfg
	run.Save, run.SaveInterval, run.SaveRetainInterval, run.LogProgress, run.AsyncSave = dir, 1, 4, true, true
	runTrainer(t, run)
	raw, err := os.ReadFile(filepath.Join(dir, ProgressFile))
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	for _, l := range strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n") {
		f := strings.Split(l, "\t")
		if len(f) < 4 {
			t.Fatalf("line %q", l)
		}
		ev := f[3]
		if len(f) > 4 {
			ev += " " + f[4]
		}
		if f[3] == "Saving async checkpoint" && (len(f) != 9 || !strings.HasPrefix(f[5], "Job throughput: ")) {
			t.Errorf("line %q: want Megatron's 9 fields with the throughputs", l)
		}
		events = append(events, ev)
	}
	// Iterations 1 to 3 are saved in the background (each finalised before
	// the next starts, at most one in flight); 4, the last, synchronously.
	want := []string{"Starting job",
		"Saving async checkpoint Iteration: 1", "Saved async checkpoint Iteration: 1",
		"Saving async checkpoint Iteration: 2", "Saved async checkpoint Iteration: 2", "Deleted checkpoint Iteration: 1",
		"Saving async checkpoint Iteration: 3", "Saved async checkpoint Iteration: 3", "Deleted checkpoint Iteration: 2",
		"Saved checkpoint Iteration: 4", "Deleted checkpoint Iteration: 3"}
	if strings.Join(events, " | ") != strings.Join(want, " | ") {
		t.Fatalf("events\n%q\nwant\n%q", events, want)
	}
	if its, _ := ckpt.List(dir); !slices.Equal(its, []int{4}) {
		t.Fatalf("checkpoints %v, want [4]", its)
	}
}
