package train

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/parallel/ddp"
	"github.com/gotron/gotron/tensor"
)

// muPGroupsGolden is the optimizer part of model/gpt/testdata/mup_golden.json
// (tools/golden/mup.py: Megatron's get_mup_config_overrides applied to
// gotron's parameter names and shapes).
type muPGroupsGolden struct {
	Cases []struct {
		Name   string
		Config struct {
			NumLayers         int     `json:"num_layers"`
			HiddenSize        int     `json:"hidden_size"`
			NumAttentionHeads int     `json:"num_attention_heads"`
			Untie             bool    `json:"untie"`
			BaseHiddenSize    int     `json:"mup_base_hidden_size"`
			Vocab             int     `json:"vocab"`
			MaxPositions      int     `json:"max_position_embeddings"`
			BaseHeadDim       float64 `json:"mup_base_head_dim"`
		}
		Optimizer struct {
			Optimizer   string   `json:"optimizer"`
			LR          float64  `json:"lr"`
			MinLR       float64  `json:"min_lr"`
			AdamEps     float64  `json:"adam_eps"`
			DecoupledLR *float64 `json:"decoupled_lr"`
		}
		Params map[string]struct {
			MaxLR *float64 `json:"max_lr"`
			MinLR *float64 `json:"min_lr"`
			Eps   *float64 `json:"eps"`
		}
	}
}

// TestMuPGroupsGolden: every parameter's peak and floor learning rate and
// Adam ε under muP equal Megatron's (get_mup_config_overrides, run out of
// tree), for Adam, Adam with --decoupled-lr and SGD, tied and untied, and
// the functional test gpt3_mcore_te_tp1_pp1_mup's sizes (built narrower
// with the same width multiplier: the groups depend on the names, the
// shapes' ranks and m only).
func TestMuPGroupsGolden(t *testing.T) {
	raw, err := os.ReadFile("../model/gpt/testdata/mup_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g muPGroupsGolden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	for _, gc := range g.Cases {
		c, o := gc.Config, gc.Optimizer
		h, base, heads := c.HiddenSize, c.BaseHiddenSize, c.NumAttentionHeads
		if h > 128 { // same m, narrower
			h, base, heads = 32*h/base, 32, 4
		}
		mc := gpt.Config{NumLayers: c.NumLayers, HiddenSize: h, NumAttentionHeads: heads, VocabSize: 64, MaxPositionEmbeddings: 16,
			UntieEmbeddingsAndOutputWeights: c.Untie, MuP: gpt.MuPConfig{Enabled: true, BaseHiddenSize: base}}
		m, err := gpt.New(mc, tensor.NewRNG(1))
		if err != nil {
			t.Fatal(err)
		}
		opt := Adam
		if o.Optimizer == "sgd" {
			opt = SGD
		}
		groups := optim.DefaultGroups(optimParams(m.Params()))
		if o.DecoupledLR != nil {
			groups = decoupledGroups(groups, *o.DecoupledLR, 0, o.MinLR)
		}
		groups = muPGroups(groups, m.Config.WidthMult(), opt, o.LR, o.MinLR, o.AdamEps)
		var names []string
		for _, gr := range groups {
			for _, p := range gr.Params {
				names = append(names, p.Name)
				want, ok := gc.Params[p.Name]
				if !ok {
					t.Fatalf("%s: %s not in the golden", gc.Name, p.Name)
				}
				maxLR, minLR, eps := o.LR, o.MinLR, 0.0 // the scheduler's; eps 0: AdamW's --adam-eps
				if o.DecoupledLR != nil && (p.Name == "embedding.word_embeddings.weight" || p.Name == "output_layer.weight") {
					maxLR = *o.DecoupledLR // Megatron's decoupled override, not muP's
				}
				if want.MaxLR != nil {
					maxLR, minLR = *want.MaxLR, *want.MinLR
				}
				if want.Eps != nil {
					eps = *want.Eps
				}
				gotMax, gotMin := o.LR, o.MinLR
				if gr.OverrideLR {
					gotMax, gotMin = gr.MaxLR, gr.MinLR
				}
				if gotMax != maxLR || gotMin != minLR || gr.Eps != eps {
					t.Errorf("%s: %s in group %s: lr %v..%v eps %v; Megatron lr %v..%v eps %v (0: --adam-eps)",
						gc.Name, p.Name, gr.Name, gotMax, gotMin, gr.Eps, maxLR, minLR, eps)
				}
			}
		}
		if len(names) != len(gc.Params) {
			t.Errorf("%s: %d parameters, the golden %d", gc.Name, len(names), len(gc.Params))
		}
	}
}

// TestMuPTrainingStep: one Adam step (constant lr, no weight decay or
// clipping) moves each weight by ≈ its group's lr (Adam's first update is
// lr·g/(|g|+ε)): hidden matrices by --lr/m under --use-mup, everything else
// by --lr; without muP everything by --lr. The losses differ from the
// run without muP; a resume keeps muP (and refuses to drop it).
func TestMuPTrainingStep(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters, cfg.ClipGrad = 1, 0
	cfg.Schedule.LRWarmupIters, cfg.Schedule.LRDecayStyle, cfg.Schedule.WeightDecay = 0, optim.DecayConstant, 0
	cfg.Schedule.MinLR = 0
	lr := cfg.Schedule.LR
	hidden := func(name string) bool {
		return !strings.HasPrefix(name, "embedding.") && name != "output_layer.weight" &&
			(strings.HasSuffix(name, "linear_qkv.weight") || strings.HasSuffix(name, "linear_proj.weight") || strings.HasSuffix(name, "fc1.weight") || strings.HasSuffix(name, "fc2.weight"))
	}
	step := func(cfg Config) (map[string]float64, []float64) {
		src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
		tr, err := New(cfg, src, nil)
		if err != nil {
			t.Fatal(err)
		}
		before := map[string][]float32{}
		for _, p := range tr.Model.Params() {
			before[p.Name] = slices.Clone(p.Float32s())
		}
		res, err := tr.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		moved := map[string]float64{} // the 90th percentile of |Δw| over the weights that moved (≈ lr: a key bias's gradient is ≈ 0, its steps smaller)
		for _, p := range tr.Model.Params() {
			var d []float64
			for i, v := range p.Float32s() {
				if x := math.Abs(float64(v - before[p.Name][i])); x > 0 {
					d = append(d, x)
				}
			}
			slices.Sort(d)
			moved[p.Name] = d[len(d)*9/10]
		}
		return moved, res.Losses
	}
	plain, plainLoss := step(cfg)
	mup := cfg
	mup.Model.MuP = gpt.MuPConfig{Enabled: true, BaseHiddenSize: 8} // m = 32/8 = 4
	got, mupLoss := step(mup)
	for name, d := range got {
		want := lr
		if hidden(name) {
			want = lr / 4
		}
		if math.Abs(d-want) > 0.02*want {
			t.Errorf("muP: %s moved by %v (90th percentile), want ≈ %v", name, d, want)
		}
		if p := plain[name]; math.Abs(p-lr) > 0.02*lr {
			t.Errorf("without muP: %s moved by %v (90th percentile), want ≈ %v", name, p, lr)
		}
	}
	// The distributed optimizer's pieces ("name[lo:hi]", over 2 data-
	// parallel ranks) are grouped as their whole parameters.
	two := mup
	two.TrainIters, two.Model.HiddenDropout, two.Model.AttentionDropout = 2, 0, 0 // the masks depend on the layout
	src0 := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
	valid := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize, Samples: 64}
	ref := runDP(t, two, 0, ddp.Config{}, src0, valid)[0]
	checkSameRun(t, "muP, distributed optimizer", ref, runDP(t, two, 2, ddp.Config{DistributedOptimizer: true}, src0, valid))
	if mupLoss[0] == plainLoss[0] {
		t.Errorf("the first loss is %v with and without muP", mupLoss[0])
	}

	// A checkpoint records muP: resuming without it is refused; with it,
	// the groups are muP's again.
	dir := t.TempDir()
	saved := mup
	saved.Save, saved.TrainIters, saved.ExitInterval = dir, 2, 1
	step(saved)
	resume := cfg
	resume.Load, resume.TrainIters = dir, 2
	src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
	if tr, err := New(resume, src, nil); err == nil {
		if _, err = tr.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "--use-mup") {
			t.Fatalf("resuming a muP checkpoint without --use-mup: %v", err)
		}
	} else if !strings.Contains(err.Error(), "--use-mup") {
		t.Fatalf("resuming a muP checkpoint without --use-mup: %v", err)
	}
	resume.Model.MuP = mup.Model.MuP
	tr, err := New(resume, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if tr.Iteration != 2 {
		t.Fatalf("resumed run ended at iteration %d, want 2", tr.Iteration)
	}
	hiddenGroups := 0
	for _, g := range tr.stepper.opt.Groups() {
		if strings.HasSuffix(g.Name, "_mup_hidden") && len(g.Params) > 0 {
			hiddenGroups++
			if g.MaxLR != lr/4 || g.Eps != 1e-8/4 || g.LR != lr/4 {
				t.Errorf("resumed group %s: max lr %v, lr %v, eps %v; want %v, %v, %v", g.Name, g.MaxLR, g.LR, g.Eps, lr/4, lr/4, 1e-8/4)
			}
		}
	}
	if hiddenGroups != 1 {
		t.Fatalf("%d non-empty muP hidden groups after resume, want 1", hiddenGroups)
	}
}
