package train

import (
	"strings"
	"testing"

	"github.com/gotron/gotron/internal/meminfo"
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
