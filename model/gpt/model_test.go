package gpt

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/tensor"
)

// goldenConfig mirrors tools/golden/gpt.py's CONFIGS entries.
type goldenConfig struct {
	Config struct {
		Layers, Hidden, Heads, Groups, FFN, Vocab, Seq, Batch int
		Pos                                                   PositionEmbeddingType
		Norm                                                  Normalization
		Act                                                   Activation
		Bias, Tied                                            bool
		Eps                                                   float32
	} `json:"config"`
	Optimizer struct {
		LR, Beta1, Beta2, Eps float64
		WarmupIters           int `json:"warmup_iters"`
		DecayIters            int `json:"decay_iters"`
		Steps                 int
		MinLR                 float64 `json:"min_lr"`
		WeightDecay           float64 `json:"weight_decay"`
		ClipGrad              float64 `json:"clip_grad"`
	} `json:"optimizer"`
}

func (g goldenConfig) model() Config {
	c := g.Config
	return Config{NumLayers: c.Layers, HiddenSize: c.Hidden, NumAttentionHeads: c.Heads, NumQueryGroups: c.Groups,
		FFNHiddenSize: c.FFN, VocabSize: c.Vocab, MaxPositionEmbeddings: c.Seq, PositionEmbeddingType: c.Pos,
		Normalization: c.Norm, NormEpsilon: c.Eps, Activation: c.Act, DisableBiasLinear: !c.Bias,
		UntieEmbeddingsAndOutputWeights: !c.Tied}
}

type golden struct {
	cfg goldenConfig
	f   *safetensors.File
}

func loadGolden(t *testing.T, name string) golden {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	dec := json.NewDecoder(bytesReader(raw))
	if err := dec.Decode(&g.cfg); err != nil {
		t.Fatalf("%s.json: %v", name, err)
	}
	g.f, err = safetensors.ReadFile(filepath.Join("testdata", name+".safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func (g golden) f32(t *testing.T, name string) []float32 {
	t.Helper()
	x, err := g.f.Tensor(name)
	if err != nil {
		t.Fatalf("golden tensor %s: %v", name, err)
	}
	out := make([]float32, x.NumElements())
	if err := x.DecodeFloat32(out); err != nil {
		t.Fatal(err)
	}
	return out
}

func (g golden) i32(t *testing.T, name string, shape ...int) *tensor.Tensor {
	t.Helper()
	x, err := g.f.Tensor(name)
	if err != nil {
		t.Fatal(err)
	}
	v := make([]int32, x.NumElements())
	for i := range v {
		v[i] = int32(uint32(x.Data[4*i]) | uint32(x.Data[4*i+1])<<8 | uint32(x.Data[4*i+2])<<16 | uint32(x.Data[4*i+3])<<24)
	}
	return tensor.FromInt32(v, shape...)
}

// closeTo checks |got-want|∞ ≤ tol·max(|want|∞, 1e-3) for a whole tensor:
// relative to the tensor's scale, so tiny entries of a large gradient are
// not held to a relative bound float32 cannot meet.
func closeTo(t testing.TB, what string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	var scale, worst float64
	at := 0
	for i := range want {
		scale = math.Max(scale, math.Abs(float64(want[i])))
		if d := math.Abs(float64(got[i] - want[i])); d > worst {
			worst, at = d, i
		}
	}
	if worst > tol*math.Max(scale, 1e-3) {
		t.Errorf("%s: max error %.3g at %d (got %v, want %v), scale %.3g, tolerance %.1g relative", what, worst, at, got[at], want[at], scale, tol)
	}
}

func newGoldenModel(t *testing.T, g golden) (*Model, Batch) {
	t.Helper()
	m, err := New(g.cfg.model(), tensor.NewRNG(0))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Params() {
		copy(p.Float32s(), g.f32(t, "init/"+p.Name))
	}
	b, T := g.cfg.Config.Batch, g.cfg.Config.Seq
	bt := Batch{Tokens: g.i32(t, "tokens", b, T), Labels: g.i32(t, "labels", b, T),
		LossMask: tensor.FromFloat32(g.f32(t, "loss_mask"), b, T)}
	return m, bt
}

func TestGoldenForwardBackward(t *testing.T) {
	for _, name := range []string{"gpt2", "llama"} {
		t.Run(name, func(t *testing.T) {
			g := loadGolden(t, name)
			m, bt := newGoldenModel(t, g)
			if got, want := len(m.Params()), countPrefix(g.f, "grad/"); got != want {
				t.Fatalf("model has %d parameters, golden has %d", got, want)
			}
			tp := tensor.NewTape()
			logits := m.Forward(tp, bt, nil, true)
			loss := m.Loss(tp, logits, bt)
			closeTo(t, "logits", logits.Float32s(), g.f32(t, "logits"), 1e-4)
			closeTo(t, "loss", loss.Float32s(), g.f32(t, "loss"), 1e-5)
			if err := tp.Backward(loss); err != nil {
				t.Fatal(err)
			}
			for _, p := range m.Params() {
				closeTo(t, "grad of "+p.Name, p.Grad.Float32s(), g.f32(t, "grad/"+p.Name), 1e-4)
			}
		})
	}
}

// optimParams exposes the model's parameters to package optim.
func optimParams(m *Model) []*optim.Param {
	var ps []*optim.Param
	for _, p := range m.Params() {
		if p.Grad == nil {
			p.Grad = tensor.Zeros(p.Shape()...)
		}
		ps = append(ps, &optim.Param{Name: p.Name, Data: p, Grad: p.Grad,
			NoWeightDecay: optim.DefaultNoWeightDecay(p.Name, p.Shape())})
	}
	return ps
}

func TestGoldenAdamWSteps(t *testing.T) {
	for _, name := range []string{"gpt2", "llama"} {
		t.Run(name, func(t *testing.T) {
			g := loadGolden(t, name)
			o := g.cfg.Optimizer
			m, bt := newGoldenModel(t, g)
			ps := optimParams(m)
			groups := optim.DefaultGroups(ps)
			adam, err := optim.NewAdamW(groups, optim.AdamWConfig{Beta1: o.Beta1, Beta2: o.Beta2, Eps: o.Eps})
			if err != nil {
				t.Fatal(err)
			}
			gbs := int64(g.cfg.Config.Batch)
			sched, err := optim.NewScheduler(optim.SchedulerConfig{MaxLR: o.LR, MinLR: o.MinLR, WarmupSteps: float64(int64(o.WarmupIters) * gbs),
				DecaySteps: int64(o.DecayIters) * gbs, DecayStyle: optim.DecayCosine, StartWD: o.WeightDecay, EndWD: o.WeightDecay,
				WDIncrSteps: int64(o.DecayIters) * gbs})
			if err != nil {
				t.Fatal(err)
			}
			grads, err := optim.NewGrads(ps)
			if err != nil {
				t.Fatal(err)
			}
			wantLR, wantNorm := g.f32(t, "step_lr"), g.f32(t, "step_grad_norm")
			tp := tensor.NewTape()
			for step := range o.Steps {
				tensor.ZeroGrad(m.Params())
				loss := m.Loss(tp, m.Forward(tp, bt, nil, true), bt)
				if err := tp.Backward(loss); err != nil {
					t.Fatal(err)
				}
				tp.Reset()
				zeroKeyBiasGrads(m) // as tools/golden/gpt.py: their true gradient is 0
				norm := grads.ClipGradNorm(o.ClipGrad)
				if math.Abs(norm-float64(wantNorm[step])) > 1e-4*float64(wantNorm[step]) {
					t.Fatalf("step %d: grad norm %v, want %v", step, norm, wantNorm[step])
				}
				sched.Apply(adam.Groups())
				if lr := sched.LR(); math.Abs(lr-float64(wantLR[step])) > 1e-7 {
					t.Fatalf("step %d: lr %v, want %v", step, lr, wantLR[step])
				}
				adam.Step()
				sched.Step(gbs)
			}
			for _, p := range m.Params() {
				closeTo(t, "after 3 steps "+p.Name, p.Float32s(), g.f32(t, "step3/"+p.Name), 1e-4)
			}
		})
	}
}

// zeroKeyBiasGrads clears the key rows of every QKV bias gradient: adding a
// constant to all scores of a softmax row changes nothing, so the true
// gradient is exactly zero and what backward computes is rounding noise that
// Adam would amplify into lr-sized steps.
func zeroKeyBiasGrads(m *Model) {
	c := m.Config
	d, r := c.KVChannels, c.NumAttentionHeads/c.NumQueryGroups
	for _, l := range m.Layers {
		if l.QKVBias == nil {
			continue
		}
		g := l.QKVBias.Grad.Float32s()
		for j := range c.NumQueryGroups {
			start := j*(r+2)*d + r*d
			clear(g[start : start+d])
		}
	}
}

func countPrefix(f *safetensors.File, prefix string) int {
	n := 0
	for _, in := range f.Infos() {
		if len(in.Name) > len(prefix) && in.Name[:len(prefix)] == prefix {
			n++
		}
	}
	return n
}
