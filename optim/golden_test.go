package optim

import (
	"encoding/json"
	"github.com/gotron/gotron/tensor"
	"math"
	"os"
	"testing"
)

// torchGolden is optim/testdata/torch_adamw.json, written by
// tools/golden/optim.py (torch.optim.AdamW + clip_grad_norm_ + LambdaLR, and
// torch.optim.SGD).
type torchGolden struct {
	TorchVersion string    `json:"torch_version"`
	Betas        []float64 `json:"betas"`
	Eps          float64   `json:"eps"`
	WeightDecay  float64   `json:"weight_decay"`
	ClipGrad     float64   `json:"clip_grad"`
	Schedule     struct {
		InitLR float64 `json:"lr_warmup_init"`
		LR     float64 `json:"lr"`
		MinLR  float64 `json:"min_lr"`
		Warmup float64 `json:"warmup_steps"`
		Decay  int64   `json:"decay_steps"`
		Style  string  `json:"style"`
	} `json:"schedule"`
	SGDLR       float64 `json:"sgd_lr"`
	SGDMomentum float64 `json:"sgd_momentum"`
	Params      []struct {
		Name          string    `json:"name"`
		Shape         []int     `json:"shape"`
		NoWeightDecay bool      `json:"no_weight_decay"`
		Data          []float32 `json:"data"`
	} `json:"params"`
	Steps []struct {
		Grads map[string][]float32 `json:"grads"`
		Norm  float64              `json:"norm"`
		LR    float64              `json:"lr"`
		AdamW map[string][]float32 `json:"adamw"`
		SGD   map[string][]float32 `json:"sgd"`
	} `json:"steps"`
	ExpAvg         map[string][]float32 `json:"exp_avg"`
	ExpAvgSq       map[string][]float32 `json:"exp_avg_sq"`
	MomentumBuffer map[string][]float32 `json:"momentum_buffer"`
}

// relClose reports |got−want| <= rel·max(|want|, floor) (plus a tiny absolute
// slack for exact zeros). floor is the magnitude of the operands a value was
// computed from: p − lr·u can cancel to near 0, leaving float32 rounding of
// the operands, not of the result, so relative error is measured against
// them (0: plain relative error).
func relClose(got, want float32, rel, floor float64) bool {
	return math.Abs(float64(got)-float64(want)) <= rel*math.Max(math.Abs(float64(want)), floor)+1e-30
}

// TestMatchesTorch replays the PyTorch fixture: 3 iterations of
// clip_grad_norm_(1.0) → AdamW (decay and no-decay groups) under a
// Megatron-formula cosine warmup schedule, and SGD with momentum; every
// norm, LR, parameter and state value within 1e-6 relative.
func TestMatchesTorch(t *testing.T) {
	raw, err := os.ReadFile("testdata/torch_adamw.json")
	if err != nil {
		t.Fatal(err)
	}
	var g torchGolden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Steps) != 3 || len(g.Params) != 3 {
		t.Fatalf("fixture has %d steps, %d params", len(g.Steps), len(g.Params))
	}
	mk := func() []*Param {
		var ps []*Param
		for _, p := range g.Params {
			q := &Param{Name: p.Name, Data: tensor.FromFloat32(append([]float32(nil), p.Data...), p.Shape...), Grad: tensor.Zeros(p.Shape...)}
			q.NoWeightDecay = DefaultNoWeightDecay(q.Name, p.Shape)
			if q.NoWeightDecay != p.NoWeightDecay {
				t.Fatalf("%s: DefaultNoWeightDecay %v, fixture %v", q.Name, q.NoWeightDecay, p.NoWeightDecay)
			}
			ps = append(ps, q)
		}
		return ps
	}
	ps, sps := mk(), mk()
	adam, err := NewAdamW(DefaultGroups(ps), AdamWConfig{Beta1: g.Betas[0], Beta2: g.Betas[1], Eps: g.Eps})
	if err != nil {
		t.Fatal(err)
	}
	sgd, err := NewSGD(DefaultGroups(sps), SGDConfig{Momentum: g.SGDMomentum})
	if err != nil {
		t.Fatal(err)
	}
	grads, _ := NewGrads(ps)
	sc := g.Schedule
	sched, err := NewScheduler(SchedulerConfig{InitLR: sc.InitLR, MaxLR: sc.LR, MinLR: sc.MinLR, WarmupSteps: sc.Warmup,
		DecaySteps: sc.Decay, DecayStyle: DecayStyle(sc.Style), StartWD: g.WeightDecay, EndWD: g.WeightDecay})
	if err != nil {
		t.Fatal(err)
	}
	clipped := 0
	for k, st := range g.Steps {
		for _, p := range ps {
			copy(p.Grad.Float32s(), st.Grads[p.Name])
		}
		for _, p := range sps {
			copy(p.Grad.Float32s(), st.Grads[p.Name])
		}
		prev := map[string][]float32{}
		for _, p := range ps {
			prev["adamw/"+p.Name] = append([]float32(nil), p.Data.Float32s()...)
		}
		for _, p := range sps {
			prev["sgd/"+p.Name] = append([]float32(nil), p.Data.Float32s()...)
		}
		norm := grads.ClipGradNorm(g.ClipGrad)
		if !near(norm, st.Norm, 1e-6) {
			t.Errorf("step %d: grad norm %.9g, torch %.9g", k, norm, st.Norm)
		}
		if norm > g.ClipGrad {
			clipped++
		}
		sched.Apply(adam.Groups())
		if lr := adam.Groups()[0].LR; !near(lr, st.LR, 1e-12) {
			t.Errorf("step %d: lr %.17g, torch LambdaLR %.17g", k, lr, st.LR)
		}
		adam.Step()
		sched.Step(1)
		for i := range sgd.Groups() {
			sgd.Groups()[i].LR, sgd.Groups()[i].WD = g.SGDLR, g.WeightDecay*sgd.Groups()[i].WDMult
		}
		sgd.Step()
		for _, p := range ps {
			for i, w := range st.AdamW[p.Name] {
				if !relClose(p.Data.Float32s()[i], w, 1e-6, math.Abs(float64(prev["adamw/"+p.Name][i]))) {
					t.Errorf("step %d: adamw %s[%d] = %.9g, torch %.9g", k, p.Name, i, p.Data.Float32s()[i], w)
				}
			}
		}
		for _, p := range sps {
			for i, w := range st.SGD[p.Name] {
				if !relClose(p.Data.Float32s()[i], w, 1e-6, math.Abs(float64(prev["sgd/"+p.Name][i]))) {
					t.Errorf("step %d: sgd %s[%d] = %.9g, torch %.9g", k, p.Name, i, p.Data.Float32s()[i], w)
				}
			}
		}
	}
	if clipped != 2 {
		t.Errorf("%d of 3 steps clipped, fixture is built for 2", clipped)
	}
	as, ss := adam.State(), sgd.State()
	for name, want := range map[string]map[string][]float32{"exp_avg": g.ExpAvg, "exp_avg_sq": g.ExpAvgSq} {
		for p, w := range want {
			for i := range w {
				if got := as.Buffers[name+"/"+p][i]; !relClose(got, w[i], 1e-6, 0) {
					t.Errorf("%s/%s[%d] = %.9g, torch %.9g", name, p, i, got, w[i])
				}
			}
		}
	}
	for p, w := range g.MomentumBuffer {
		for i := range w {
			if got := ss.Buffers["momentum_buffer/"+p][i]; !relClose(got, w[i], 1e-6, 0) {
				t.Errorf("momentum_buffer/%s[%d] = %.9g, torch %.9g", p, i, got, w[i])
			}
		}
	}
}
