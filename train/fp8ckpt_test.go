package train

import (
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/internal/fp8"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/ddp"
)

// TestFP8DelayedResume: a delayed-FP8 run stopped at iteration 3 and
// resumed logs the uninterrupted run's losses bit for bit — the
// checkpoint keeps every linear layer's amax histories and scales (group
// "fp8") — in one process, at DP=2 with the distributed optimizer, at
// TP=2 and on PP=2 with two virtual stages a rank. Resuming on another layout reads
// the same histories (one copy, the amax reduction made them equal). A
// checkpoint whose histories have another length is refused naming the
// flag; one without them starts them afresh, saying so. gotron ckpt
// reshard carries them.
func TestFP8DelayedResume(t *testing.T) {
	train, valid := dpDataset(t, 16)
	m := dpModels()["gpt2"]
	m.NumLayers = 4
	cfg := dpConfig(m)
	cfg.TrainIters, cfg.EvalInterval, cfg.MicroBatchSize = 6, 0, 2
	cfg.BF16 = true
	cfg.FP8 = &gpt.FP8Config{Recipe: fp8.Recipe{Kind: fp8.Delayed, Hybrid: true, AmaxHistoryLen: 3, AmaxAlgo: fp8.MaxOfHistory}}
	type layout struct {
		name string
		run  func(c Config) []dpRun
	}
	dist := ddp.Config{DistributedOptimizer: true}
	layouts := []layout{
		{"one process", func(c Config) []dpRun { return runDP(t, c, 0, ddp.Config{}, train, valid) }},
		{"DP=2", func(c Config) []dpRun { return runDP(t, c, 2, dist, train, valid) }},
		{"TP=2", func(c Config) []dpRun { return runPP(t, c, ppLayout{tp: 2, pp: 1, dp: 1}, train, valid) }},
		{"PP=2 VPP=2", func(c Config) []dpRun {
			return runPP(t, c, ppLayout{tp: 1, pp: 2, dp: 1, split: gpt.PipelineSplit{PP: 2, VPP: 2}}, train, valid)
		}},
	}
	var saved string // the one-process checkpoint, for the checks after the loop
	for _, l := range layouts {
		straight := l.run(cfg)[0].res.Losses
		dir := t.TempDir()
		first := cfg
		first.Save, first.ExitInterval = dir, 3
		a := l.run(first)[0]
		second := cfg
		second.Load = dir
		for r, b := range l.run(second) {
			got := append(slices.Clone(a.res.Losses), b.res.Losses...)
			for i := range straight {
				if got[i] != straight[i] {
					t.Fatalf("%s rank %d iteration %d: lm loss %.9g after the resume, %.9g uninterrupted", l.name, r, i+1, got[i], straight[i])
				}
			}
		}
		if saved == "" {
			saved = dir
		}
	}
	// The one process's checkpoint resumed at DP=2: the same histories
	// (the first step after the resume matches the uninterrupted DP=2
	// run within float tolerance, not bit for bit: the reduction order
	// differs from one process's).
	second := cfg
	second.Load = saved
	straight := layouts[1].run(cfg)[0].res.Losses
	for r, b := range layouts[1].run(second) {
		for i, l := range b.res.Losses {
			if !relClose(l, straight[3+i], 1e-3) {
				t.Errorf("one process's checkpoint at DP=2, rank %d iteration %d: %.7g, uninterrupted DP=2 %.7g", r, 4+i, l, straight[3+i])
			}
		}
	}
	// Another history length: refused, naming the flag.
	other := cfg
	other.Load = saved
	other.FP8 = &gpt.FP8Config{Recipe: fp8.Recipe{Kind: fp8.Delayed, Hybrid: true, AmaxHistoryLen: 5, AmaxAlgo: fp8.MaxOfHistory}}
	tr, err := New(other, train, valid)
	if err == nil {
		_, err = tr.Run(t.Context())
	}
	if err == nil || !strings.Contains(err.Error(), "--fp8-amax-history-len 5") {
		t.Errorf("history length 3 loaded into 5: %v, want an error naming --fp8-amax-history-len", err)
	}
	// Without the group (a checkpoint from before it was kept): afresh.
	r, err := ckpt.Open(saved, -1)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(r.Tensors(groupFP8)); n != 4*m.NumLayers {
		t.Errorf("the checkpoint keeps %d FP8 states, want 4 linear layers × %d layers", n, m.NumLayers)
	}
	before := map[string][]float32{}
	for name := range r.Tensors(groupFP8) {
		if before[name], _, err = r.ReadWhole(groupFP8, name); err != nil {
			t.Fatal(err)
		}
	}
	r.Close()
	// Offline resharding carries them: PP=2 × TP=2 ranks each write
	// their layers' (TP rank 0's), the same vectors.
	out := t.TempDir()
	if _, err := Reshard(t.Context(), saved, out, ReshardLayout{TP: 2, PP: 2}); err != nil {
		t.Fatal(err)
	}
	if r, err = ckpt.Open(out, -1); err != nil {
		t.Fatal(err)
	}
	after := r.Tensors(groupFP8)
	if len(after) != len(before) {
		t.Errorf("resharded to TP=2 × PP=2: %d FP8 states, the source %d", len(after), len(before))
	}
	for name, want := range before {
		got, _, err := r.ReadWhole(groupFP8, name)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("resharded FP8 state of %s: %v (%v), the source's %v", name, got, err, want)
		}
	}
	r.Close()
	var log strings.Builder
	noFP8 := cfg
	noFP8.Save, noFP8.ExitInterval = t.TempDir(), 3
	noFP8.FP8 = nil
	runDP(t, noFP8, 0, ddp.Config{}, train, valid)
	again := cfg
	again.Load, again.Out = noFP8.Save, &log
	runDP(t, again, 0, ddp.Config{}, train, valid)
	if !strings.Contains(log.String(), "keeps no amax histories: they start afresh") {
		t.Errorf("a checkpoint without FP8 state: log %q, want the line saying the histories start afresh", log.String())
	}
}
