package train

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/internal/fp8"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/parallel/ddp"
	"github.com/gotron/gotron/tensor"
)

// TestFP8TracksBF16: 30 iterations of the tiny model under --bf16 with FP8
// linear layers — hybrid/tensorwise, e4m3/tensorwise, hybrid/delayed
// (history 4, max) — stay within 1% of the bf16 run's losses at every
// iteration and fall as clearly; their losses differ from bf16's (the
// products were quantized) and from each other's.
func TestFP8TracksBF16(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters, cfg.EvalInterval = 30, 0
	cfg.Model.HiddenDropout, cfg.Model.AttentionDropout = 0, 0
	cfg.BF16 = true
	ref := runTrainer(t, cfg)
	var prev []float64
	for _, r := range []fp8.Recipe{
		{Kind: fp8.Tensorwise, Hybrid: true},
		{Kind: fp8.Tensorwise},
		{Kind: fp8.Delayed, Hybrid: true, AmaxHistoryLen: 4, AmaxAlgo: fp8.MaxOfHistory},
	} {
		c := cfg
		c.FP8 = &gpt.FP8Config{Recipe: r}
		got := runTrainer(t, c)
		differ := false
		for i, l := range got.Losses {
			if d := math.Abs(l - ref.Losses[i]); d > 0.01*ref.Losses[i] {
				t.Errorf("%v: iteration %d: loss %.5f, bf16 %.5f: more than 1%% apart", r, i+1, l, ref.Losses[i])
			}
			differ = differ || l != ref.Losses[i]
		}
		if !differ {
			t.Errorf("%v: losses equal bf16's bit for bit: nothing was quantized", r)
		}
		if first, last := got.Losses[0], got.Losses[len(got.Losses)-1]; !(last < first-0.5) {
			t.Errorf("%v: loss went from %.3f to %.3f; expected a clear fall", r, first, last)
		}
		if prev != nil && prev[len(prev)-1] == got.Losses[len(got.Losses)-1] {
			t.Errorf("%v: the same final loss as the previous recipe", r)
		}
		prev = got.Losses
		t.Logf("%v: loss %.5f → %.5f (bf16 %.5f → %.5f)", r, got.Losses[0], got.Losses[len(got.Losses)-1], ref.Losses[0], ref.Losses[len(ref.Losses)-1])
	}
}

// TestFP8ParamGather: --fp8-param-gather quantizes weights from the
// float32 parameters; under --bf16 that differs from quantizing the
// bfloat16 weight (other losses), in float32 runs it is the same numbers
// bit for bit. --first-last-layers-bf16 over every layer gives the run
// without FP8 exactly.
func TestFP8ParamGather(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters, cfg.EvalInterval = 3, 0
	tw := fp8.Recipe{Kind: fp8.Tensorwise, Hybrid: true}
	run := func(bf16, gather bool, start, end int) []float64 {
		c := cfg
		c.BF16 = bf16
		c.FP8 = &gpt.FP8Config{Recipe: tw, ParamGather: gather, BF16LayersAtStart: start, BF16LayersAtEnd: end}
		return runTrainer(t, c).Losses
	}
	if a, b := run(true, false, 0, 0), run(true, true, 0, 0); a[len(a)-1] == b[len(b)-1] {
		t.Errorf("--bf16: --fp8-param-gather changed nothing (%v): the weights were not quantized from float32", a)
	}
	a, b := run(false, false, 0, 0), run(false, true, 0, 0)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("float32 run: iteration %d: loss %v with --fp8-param-gather, %v without (must be the same numbers)", i+1, b[i], a[i])
		}
	}
	plain := runTrainer(t, cfg).Losses
	kept := run(false, false, 1, 1) // 2 layers: both kept out of FP8
	for i := range plain {
		if kept[i] != plain[i] {
			t.Fatalf("every layer in bf16: iteration %d: loss %v, without FP8 %v", i+1, kept[i], plain[i])
		}
	}
	if one := run(false, false, 1, 0); one[len(one)-1] == plain[len(plain)-1] || one[len(one)-1] == a[len(a)-1] {
		t.Errorf("first layer in bf16: final loss %v equals the plain (%v) or all-FP8 (%v) run's", one[len(one)-1], plain[len(plain)-1], a[len(a)-1])
	}
}

// TestFP8Refusals: what FP8 is not built for is refused, naming it.
func TestFP8Refusals(t *testing.T) {
	delayed := fp8.Recipe{Kind: fp8.Delayed, Hybrid: true, AmaxHistoryLen: 1}
	for _, c := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.FP8 = &gpt.FP8Config{Recipe: delayed, BF16LayersAtStart: 1} }, "Delayed scaling does not support first / last layer in BF16"},
		{func(c *Config) { c.FP8 = &gpt.FP8Config{Recipe: fp8.Recipe{Kind: fp8.Tensorwise, NoWgradFP8: true}} }, "--no-fp8-wgrad"},
		{func(c *Config) { c.FP8 = &gpt.FP8Config{Recipe: fp8.Recipe{Kind: fp8.Delayed}} }, "--fp8-amax-history-len 0"},
		{func(c *Config) { c.FP8 = &gpt.FP8Config{Recipe: delayed}; c.FP16 = true }, "--fp16"},
		{func(c *Config) { c.FP8 = &gpt.FP8Config{Recipe: delayed}; c.Device = tensor.CUDA }, "set GOTRON_CUDA_UNVERIFIED=fp8"},
	} {
		cfg := tinyConfig(t)
		c.edit(&cfg)
		_, err := New(cfg, MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error naming %q, got %v", c.want, err)
		}
	}
}

// TestFP8DelayedAmaxReduction: under the delayed recipe with TP=2 × DP=2
// (sequence parallel), every rank ends with the same scales for each
// linear layer's input, weight and output gradient — the amaxes were
// reduced over the tensor × data-parallel group before each update, as TE
// reduces them over Megatron's amax reduction group — although the ranks
// hold different weight shards and data; the losses stay within 1% of the
// single process's.
func TestFP8DelayedAmaxReduction(t *testing.T) {
	train, valid := dpDataset(t, 16)
	cfg := dpConfig(dpModels()["gpt2"])
	cfg.TrainIters, cfg.EvalInterval, cfg.MicroBatchSize = 4, 0, 2
	cfg.BF16 = true
	cfg.FP8 = &gpt.FP8Config{Recipe: fp8.Recipe{Kind: fp8.Delayed, Hybrid: true, AmaxHistoryLen: 2, AmaxAlgo: fp8.MaxOfHistory}}
	single := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0].res.Losses
	const ranks = 4
	scales := make([][]float32, ranks)
	losses := make([][]float64, ranks)
	err := inproc.Run(context.Background(), ranks, func(ctx context.Context, pg comm.ProcessGroup) error {
		g, err := parallel.NewGroups(pg, parallel.Config{TP: 2})
		if err != nil {
			return err
		}
		c := cfg
		c.Parallel, c.SequenceParallel = g, true
		tr, err := New(c, train, valid)
		if err != nil {
			return err
		}
		res, err := tr.Run(ctx)
		if err != nil {
			return fmt.Errorf("rank %d: %w", pg.Rank(), err)
		}
		for _, l := range tr.Model.FP8.Linears() {
			scales[pg.Rank()] = append(scales[pg.Rank()], l.Input.Scale(), l.Weight.Scale(), l.Grad.Scale())
		}
		losses[pg.Rank()] = res.Losses
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(scales[0]) != 3*4*cfg.Model.NumLayers {
		t.Fatalf("%d scales, want input, weight and gradient of 4 linear layers × %d layers", len(scales[0]), cfg.Model.NumLayers)
	}
	for r := 1; r < ranks; r++ {
		for i, s := range scales[r] {
			if s != scales[0][i] {
				t.Fatalf("rank %d: scale %d (linear %d, %s) is %v, rank 0's %v: the amaxes were not reduced", r, i, i/3, [3]string{"input", "weight", "gradient"}[i%3], s, scales[0][i])
			}
		}
	}
	got := losses[ranks-1]
	if len(got) != len(single) {
		t.Fatalf("%d losses, single process %d", len(got), len(single))
	}
	for i := range single {
		if math.Abs(got[i]-single[i]) > 0.01*single[i] {
			t.Errorf("iteration %d: loss %.5f on TP=2 × DP=2, single process %.5f", i+1, got[i], single[i])
		}
	}
}

// TestFP8DelayedRecompute: under the delayed recipe, full and selective
// activation recomputation give the run without recomputation bit for
// bit: a recomputed layer quantizes with its forward's scales and records
// no amax (TE's fp8 meta copy for recompute).
func TestFP8DelayedRecompute(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters, cfg.EvalInterval = 4, 2
	cfg.BF16 = true
	cfg.FP8 = &gpt.FP8Config{Recipe: fp8.Recipe{Kind: fp8.Delayed, Hybrid: true, AmaxHistoryLen: 3, AmaxAlgo: fp8.MaxOfHistory}}
	ref := runTrainer(t, cfg)
	for _, r := range []gpt.Recompute{{Full: true, Method: "uniform", NumLayers: 1}, {Full: true, Method: "block", NumLayers: 1}, {Selective: true}} {
		c := cfg
		c.Recompute = r
		got := runTrainer(t, c)
		for i := range ref.Losses {
			if got.Losses[i] != ref.Losses[i] {
				t.Fatalf("%+v: iteration %d: loss %v, without recomputation %v", r, i+1, got.Losses[i], ref.Losses[i])
			}
		}
		if got.ValidLoss != ref.ValidLoss {
			t.Fatalf("%+v: validation loss %v, without recomputation %v", r, got.ValidLoss, ref.ValidLoss)
		}
	}
}
