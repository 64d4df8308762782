package train

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt"
)

// TestSaveNeverMovesTrackerBack: a run that would save iterations below
// the --save directory's tracker (a fresh run into another run's
// directory) is refused before it trains, naming the tracker; resuming
// from the directory is not.
func TestSaveNeverMovesTrackerBack(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.EvalInterval, cfg.TrainIters = 0, 6
	dir := t.TempDir()
	first := cfg
	first.Save, first.SaveInterval, first.ExitInterval = dir, 2, 4
	runTrainer(t, first)
	if it, err := ckpt.Latest(dir); err != nil || it != 4 {
		t.Fatalf("tracker %d, %v", it, err)
	}
	again := first
	src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
	if _, err := New(again, src, nil); err == nil || !strings.Contains(err.Error(), "holds checkpoints up to iteration 4") ||
		!strings.Contains(err.Error(), ckpt.TrackerFile) {
		t.Fatalf("fresh run into a directory at iteration 4: %v", err)
	}
	if it, _ := ckpt.Latest(dir); it != 4 {
		t.Fatalf("tracker moved to %d", it)
	}
	if _, err := os.Stat(filepath.Join(dir, ckpt.LockFile)); !os.IsNotExist(err) {
		t.Fatalf("a refused New left its lock: %v", err)
	}
	resume := first
	resume.Load, resume.ExitInterval = dir, 0
	if res := runTrainer(t, resume); res.Iteration != 6 {
		t.Fatalf("resumed run ended at %d", res.Iteration)
	}
	if it, _ := ckpt.Latest(dir); it != 6 {
		t.Fatalf("tracker %d after resuming, want 6", it)
	}
}

// TestLoadRefusesImpossiblePosition: a checkpoint whose sample counters
// are negative or beyond what the run trains is refused, naming the field.
func TestLoadRefusesImpossiblePosition(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.EvalInterval, cfg.TrainIters = 0, 4
	dir := t.TempDir()
	first := cfg
	first.Save, first.SaveInterval, first.ExitInterval = dir, 2, 2
	runTrainer(t, first)
	meta := filepath.Join(dir, ckpt.IterDirName(2), ckpt.MetaFile)
	orig, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ field, value, want string }{
		{"consumed_train_samples", "-16", "consumed_train_samples: -16 is out of range: must be between 0 and 16 (this run trains 4 iterations of at most 4 samples"},
		{"consumed_train_samples", "1000000000000000000", "consumed_train_samples: 1000000000000000000 is out of range"},
		{"consumed_valid_samples", "-1", "consumed_valid_samples: -1 is out of range"},
		{"skipped_train_samples", "9", "skipped_train_samples: 9 is out of range: must be between 0 and 8"},
	} {
		re := regexp.MustCompile(`"` + tt.field + `": -?[0-9]+`)
		if !re.Match(orig) {
			t.Fatalf("%s has no %s", meta, tt.field)
		}
		edited := re.ReplaceAll(orig, []byte(`"`+tt.field+`": `+tt.value))
		if err := os.WriteFile(meta, edited, 0o644); err != nil {
			t.Fatal(err)
		}
		resume := cfg
		resume.Load = dir
		src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
		_, err := New(resume, src, nil)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), ckpt.MetaFile) {
			t.Errorf("%s %s: %v, want %q", tt.field, tt.value, err, tt.want)
		}
	}
}

// TestTrainerHoldsSaveLock: New takes --save's lock, naming this process;
// Run releases it when it returns (as Close does for a Trainer never run).
func TestTrainerHoldsSaveLock(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.EvalInterval, cfg.TrainIters = 0, 4
	cfg.Save, cfg.SaveInterval = t.TempDir(), 2
	lock := filepath.Join(cfg.Save, ckpt.LockFile)
	src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
	tr, err := New(cfg, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(lock)
	if err != nil || !strings.Contains(string(raw), fmt.Sprintf(`"pid":%d`, os.Getpid())) {
		t.Fatalf("lock while the Trainer lives: %s, %v", raw, err)
	}
	if _, err := tr.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(lock); !os.IsNotExist(err) {
		t.Fatalf("lock after Run: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatalf("Close after Run: %v", err)
	}
}
