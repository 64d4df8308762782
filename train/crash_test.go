package train

import (
	"context"

	"github.com/gotron/gotron/ckpt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

const childEnv = "GOTRON_TRAIN_CRASH_CHILD"

// TestMain lets the test binary act as a training process that the crash
// test kills.
func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		cfg := tinyConfig(nil)
		cfg.Model.HiddenSize, cfg.Model.NumLayers, cfg.Model.VocabSize = 128, 4, 4096 // ~5 MB checkpoints
		cfg.TrainIters, cfg.SaveInterval, cfg.Save, cfg.EvalInterval = 1000, 1, dir, 0
		if _, err := ckpt.Latest(dir); err == nil {
			cfg.Load = dir
		}
		tr, err := New(cfg, MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}, nil)
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(3)
		}
		if _, err := tr.Run(context.Background()); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(4)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestKillDuringSave kills a real training process with SIGKILL at seeded
// random moments while it checkpoints every iteration; after each kill the
// latest checkpoint must load completely, and the next run resumes from it.
func TestKillDuringSave(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	rng := rand.New(rand.NewSource(7))
	last := int64(-1)
	for round := range 4 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+dir)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Wait for at least one new checkpoint, then kill at a random moment.
		deadline := time.Now().Add(60 * time.Second)
		for {
			if it, err := ckpt.Latest(dir); err == nil && int64(it) > last {
				break
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatalf("round %d: no checkpoint within 60 s", round)
			}
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(time.Duration(rng.Intn(80)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()

		latest, err := ckpt.Latest(dir)
		if err != nil {
			t.Fatalf("round %d: tracker unreadable after kill: %v", round, err)
		}
		it := int64(latest)
		c, err := ckpt.Load(dir, -1)
		if err != nil {
			t.Fatalf("round %d: latest checkpoint (iteration %d) unreadable: %v", round, it, err)
		}
		if int64(c.Meta.Iteration) != it {
			t.Fatalf("round %d: tracker says %d, metadata says %d", round, it, c.Meta.Iteration)
		}
		c.Close()
		cfg := tinyConfig(t)
		cfg.Model.HiddenSize, cfg.Model.NumLayers, cfg.Model.VocabSize = 128, 4, 4096
		cfg.TrainIters, cfg.Load = 1000, dir
		if _, err := New(cfg, MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}, nil); err != nil {
			t.Fatalf("round %d: loading iteration %d after kill: %v", round, it, err)
		}
		// Every iteration directory is complete: a kill leaves only
		// temporary directories, named ".tmp-iter_…" (or ".del-iter_…"),
		// which this pattern does not match.
		dirs, _ := filepath.Glob(filepath.Join(dir, "iter_*"))
		for _, d := range dirs {
			if _, err := os.Stat(filepath.Join(d, "checkpoint.json")); err != nil {
				t.Fatalf("round %d: %s is incomplete: %v", round, d, err)
			}
		}
		if it < last {
			t.Fatalf("round %d: latest went back from %d to %d", round, last, it)
		}
		last = it
	}
}
