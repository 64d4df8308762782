package train

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/parallel/ddp"
)

// TestQKLayerNormTensorParallel: --qk-layernorm (with --apply-layernorm-1p,
// so the norms' γ moves from 0) under tensor parallelism, with and without
// sequence parallelism (RMSNorm, GQA), reproduces the single-process run. Each TP rank
// normalises only its heads, so the q/k norm gradients are partial sums that
// must be all-reduced over the TP group (Megatron's finalize_model_grads):
// without that the replicated norm weights drift apart and this fails.
func TestQKLayerNormTensorParallel(t *testing.T) {
	train, valid := dpDataset(t, 16)
	for name, m := range dpModels() {
		if name != "llama" {
			// With LayerNorm the key norm's bias adds q·β to every score of a
			// query, which the softmax cancels: its gradient is exactly zero
			// and Adam turns float32 noise (different sums under TP) into
			// ±lr steps, so only the RMSNorm model compares parameters.
			continue
		}
		m.QKLayerNorm, m.LayerNorm1P = true, true
		cfg := dpConfig(m)
		cfg.MicroBatchSize = 2
		ref := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0]
		for _, sp := range []bool{false, true} {
			checkSameRun(t, fmt.Sprintf("%s qk-layernorm TP=2 SP=%v", name, sp), ref, runTP(t, cfg, 2, 1, sp, ddp.Config{}, train, valid))
		}
	}
}

// TestApplyWDToQKLayerNorm: Megatron's default rule exempts the 1-D q/k
// layer norm weights from weight decay; --apply-wd-to-qk-layernorm moves
// them (and only them) into the decay group, so one AdamW step moves them
// by an extra -lr·wd·w (decoupled decay) and leaves every other parameter
// where the run without the flag puts it.
func TestApplyWDToQKLayerNorm(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.Model.QKLayerNorm = true
	cfg.Model.HiddenDropout, cfg.Model.AttentionDropout = 0, 0
	cfg.TrainIters, cfg.EvalInterval, cfg.Schedule.LRWarmupIters = 1, 0, 0
	cfg.Schedule.WeightDecay = 0.5 // large, so the decay term is far above float32 noise
	run := func(apply bool) (*Trainer, map[string][]float32) {
		c := cfg
		c.ApplyWDToQKLayerNorm = apply
		src := MockSource{SeqLength: c.SeqLength, VocabSize: c.Model.VocabSize}
		tr, err := New(c, src, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tr.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
		after := map[string][]float32{}
		for _, p := range tr.stepper.model.Params() {
			after[p.Name] = append([]float32(nil), p.Float32s()...)
		}
		return tr, after
	}
	groupOf := func(tr *Trainer) map[string]string {
		g := map[string]string{}
		for _, grp := range tr.stepper.opt.Groups() {
			for _, p := range grp.Params {
				g[p.Name] = grp.Name
			}
		}
		return g
	}
	plain, plainW := run(false)
	qk, qkW := run(true)
	pg, qg := groupOf(plain), groupOf(qk)
	moved := 0
	for name, before := range pg {
		isQK := strings.Contains(name, "q_layernorm.") || strings.Contains(name, "k_layernorm.")
		want := before
		if isQK {
			if before != "no_decay" {
				t.Errorf("%s: in %q without the flag; Megatron's default exempts 1-D parameters", name, before)
			}
			want, moved = "decay", moved+1
		}
		if qg[name] != want {
			t.Errorf("%s: in %q with --apply-wd-to-qk-layernorm, want %q", name, qg[name], want)
		}
	}
	if moved != 4*cfg.Model.NumLayers {
		t.Fatalf("%d q/k norm parameters, want %d (LayerNorm weight and bias of q and k per layer)", moved, 4*cfg.Model.NumLayers)
	}
	var lr, wd float64
	for _, g := range qk.stepper.opt.Groups() {
		if g.Name == "decay" {
			lr, wd = g.LR, g.WD
		}
	}
	if lr <= 0 || wd != 0.5 {
		t.Fatalf("decay group's lr %g, wd %g", lr, wd)
	}
	for name, w := range qkW {
		p := plainW[name]
		isQK := strings.Contains(name, "q_layernorm.") || strings.Contains(name, "k_layernorm.")
		for i := range w {
			diff := float64(w[i]) - float64(p[i])
			want := 0.0
			if isQK && strings.HasSuffix(name, ".weight") {
				// One step from w0 = 1 (the norms' initial scale): the
				// extra decoupled decay is -lr·wd·w0 (0 for the biases,
				// which start at 0).
				want = -lr * wd * 1
			}
			if math.Abs(diff-want) > 1e-6 {
				t.Fatalf("%s[%d]: differs by %g with the flag, want %g", name, i, diff, want)
			}
		}
	}
}
