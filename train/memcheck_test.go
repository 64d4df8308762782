package train

import (
	"strings"
	"testing"

	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/internal/meminfo"
	"github.com/gotron/gotron/parallel"
)

// TestCheckMemory: runs whose theoretical footprint exceeds the machine's
// available memory are refused with the estimate and what the machine has;
// those that fit, and configs New will reject anyway, pass.
func TestCheckMemory(t *testing.T) {
	machine := meminfo.Info{TotalBytes: 32e9, AvailableBytes: 24e9}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string // "" means accepted
	}{
		{"tiny fits", func(*Config) {}, ""},
		{"100000 layers of 100000", func(c *Config) { c.Model.NumLayers, c.Model.HiddenSize = 100000, 100000 }, "billion parameters"},
		{"seq 300000", func(c *Config) { c.SeqLength, c.Model.MaxPositionEmbeddings, c.Model.VocabSize = 300000, 300000, 50304 }, "activation"},
		{"invalid config left to New", func(c *Config) { c.Model.NumLayers = -1 }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tinyConfig(t)
			tt.mutate(&cfg)
			err := checkMemory(cfg, machine)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range []string{tt.want, "24.0 GB available of 32.0 GB (/proc/meminfo)", "needs an estimated"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestCheckMemoryUsesTheLayout: with tensor parallelism the estimate is of
// one rank's shard, so a model that fits only when split over 2 ranks
// passes with TP = 2 and is refused on one process.
func TestCheckMemoryUsesTheLayout(t *testing.T) {
	world, err := inproc.NewWorld(2)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := parallel.NewGroups(world[0], parallel.Config{TP: 2})
	if err != nil {
		t.Fatal(err)
	}
	cfg := tinyConfig(t)
	cfg.Model.NumLayers, cfg.Model.HiddenSize, cfg.Model.NumAttentionHeads = 32, 4096, 32 // 6.4e9 parameters
	cfg.Model.VocabSize, cfg.SeqLength, cfg.Model.MaxPositionEmbeddings, cfg.MicroBatchSize = 50304, 16, 16, 1
	r, err := TheoreticalMemory(MemoryConfig{Model: cfg.Model, SeqLength: 16, MicroBatchSize: 1, WorldSize: 2, TensorParallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	half := r.WeightAndOptimizerBytes + r.ActivationBytes // one TP rank's share
	machine := meminfo.Info{TotalBytes: int64(2 * half), AvailableBytes: int64(1.2 * half)}
	if err := checkMemory(cfg, machine); err == nil {
		t.Fatal("one process: accepted a model that needs two ranks' memory")
	}
	cfg.Parallel = groups
	if err := checkMemory(cfg, machine); err != nil {
		t.Fatalf("TP = 2: %v", err)
	}
}
