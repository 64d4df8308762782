package train

import (
	"context"
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// TestLoadRefusesDifferentArchitecture saves a model and loads it into runs
// whose architecture differs; the load must fail listing every differing
// flag (Megatron's check_checkpoint_args). --num-attention-heads 8 instead
// of 4 keeps every tensor's shape, so only the recorded args can catch it.
func TestLoadRefusesDifferentArchitecture(t *testing.T) {
	base := tinyConfig(t)
	mc := base.Model
	m, err := gpt.New(mc, tensor.NewRNG(1))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := SaveModel(context.Background(), dir, 0, m, base.SeqLength, nil); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		mutate func(*gpt.Config)
		want   []string // substrings of the error; nil means the load succeeds
	}{
		{"same", func(*gpt.Config) {}, nil},
		{"dropout may change", func(c *gpt.Config) { c.HiddenDropout = 0 }, nil},
		{"heads", func(c *gpt.Config) { c.NumAttentionHeads = 8 },
			[]string{"--num-attention-heads: checkpoint 4, this run 8", "--kv-channels: checkpoint 8, this run 4"}},
		{"norm and eps", func(c *gpt.Config) { c.Normalization = gpt.RMSNorm; c.NormEpsilon = 1e-6 },
			[]string{"--normalization: checkpoint LayerNorm, this run RMSNorm", "--norm-epsilon: checkpoint 1e-05, this run 1e-06"}},
		{"layers", func(c *gpt.Config) { c.NumLayers = 3 }, []string{"--num-layers: checkpoint 2, this run 3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tinyConfig(t)
			tt.mutate(&cfg.Model)
			cfg.Load = dir
			src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
			_, err := New(cfg, src, src)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("load refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("load accepted a checkpoint of another architecture")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestCheckCheckpointArgsOlderCheckpoints: fields a checkpoint does not
// record, or args without a model, are not compared.
func TestCheckCheckpointArgsOlderCheckpoints(t *testing.T) {
	have := gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4}
	for _, args := range []string{"", `{}`, `{"seq_length": 16}`, `{"model": {"NumLayers": 2}}`} {
		if err := checkCheckpointArgs("dir", have, []byte(args)); err != nil {
			t.Errorf("args %s: %v", args, err)
		}
	}
	if err := checkCheckpointArgs("dir", have, []byte(`{"model": {"NumLayers": 3}}`)); err == nil || !strings.Contains(err.Error(), "--num-layers: checkpoint 3, this run 2") {
		t.Errorf("NumLayers 3 vs 2: %v", err)
	}
	if err := checkCheckpointArgs("dir", have, []byte(`{"model": 5}`)); err == nil || !strings.Contains(err.Error(), "--load dir") {
		t.Errorf("malformed args: %v", err)
	}
}

// TestFinetuneWarnsOnDifferentArchitecture: --finetune skips the
// architecture check, as Megatron's load_checkpoint skips
// check_checkpoint_args under args.finetune, but prints every difference.
func TestFinetuneWarnsOnDifferentArchitecture(t *testing.T) {
	base := tinyConfig(t)
	m, err := gpt.New(base.Model, tensor.NewRNG(1))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := SaveModel(context.Background(), dir, 0, m, base.SeqLength, nil); err != nil {
		t.Fatal(err)
	}
	cfg := tinyConfig(t)
	cfg.Model.NumAttentionHeads = 8 // same shapes, another meaning
	cfg.Load, cfg.Finetune = dir, true
	var out strings.Builder
	cfg.Out = &out
	src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
	if _, err := New(cfg, src, src); err != nil {
		t.Fatalf("--finetune refused: %v", err)
	}
	if !strings.Contains(out.String(), "WARNING: --finetune loads the weights anyway") || !strings.Contains(out.String(), "--num-attention-heads: checkpoint 4, this run 8") {
		t.Fatalf("no warning naming the difference:\n%s", out.String())
	}
}
