package train

import (
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/internal/fp8"
	"github.com/gotron/gotron/model/gpt"
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
		{func(c *Config) {
			c.FP8 = &gpt.FP8Config{Recipe: delayed}
			c.Recompute = gpt.Recompute{Full: true, Method: "uniform", NumLayers: 1}
		}, "recompute"},
		{func(c *Config) { c.FP8 = &gpt.FP8Config{Recipe: delayed, BF16LayersAtStart: 1} }, "Delayed scaling does not support first / last layer in BF16"},
		{func(c *Config) { c.FP8 = &gpt.FP8Config{Recipe: fp8.Recipe{Kind: fp8.Tensorwise, NoWgradFP8: true}} }, "--no-fp8-wgrad"},
		{func(c *Config) { c.FP8 = &gpt.FP8Config{Recipe: fp8.Recipe{Kind: fp8.Delayed}} }, "--fp8-amax-history-len 0"},
		{func(c *Config) { c.FP8 = &gpt.FP8Config{Recipe: delayed}; c.FP16 = true }, "--fp16"},
		{func(c *Config) { c.FP8 = &gpt.FP8Config{Recipe: delayed}; c.Device = tensor.CUDA }, "cuda"},
	} {
		cfg := tinyConfig(t)
		c.edit(&cfg)
		_, err := New(cfg, MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error naming %q, got %v", c.want, err)
		}
	}
}
