package optim

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// testParams returns seeded params: a weight, a bias, a 1-D norm weight and
// (if big) a matrix larger than the kernels' parallel grain, with grads.
func testParams(seed uint64, big bool) []*Param {
	r := rand.New(rand.NewPCG(seed, 7))
	mk := func(name string, shape ...int) *Param {
		n := 1
		for _, d := range shape {
			n *= d
		}
		p := &Param{Name: name, Data: tensor.Zeros(shape...), Grad: tensor.Zeros(shape...)}
		for i := range p.Data.Float32s() {
			p.Data.Float32s()[i] = float32(r.NormFloat64())
		}
		p.NoWeightDecay = DefaultNoWeightDecay(name, shape)
		return p
	}
	ps := []*Param{mk("layer.weight", 7, 5), mk("layer.bias", 5), mk("norm.weight", 11)}
	if big {
		ps = append(ps, mk("big.weight", 129, 301))
	}
	return ps
}

// fillGrads writes seeded gradients of varied magnitude (some exact zeros).
func fillGrads(ps []*Param, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 11))
	for _, p := range ps {
		for i := range p.Grad.Float32s() {
			g := r.NormFloat64() * math.Pow(10, r.Float64()*3-2)
			if r.IntN(17) == 0 {
				g = 0
			}
			p.Grad.Float32s()[i] = float32(g)
		}
	}
}

// clone deep-copies params.
func clone(ps []*Param) []*Param {
	out := make([]*Param, len(ps))
	for i, p := range ps {
		q := *p
		q.Data = p.Data.Clone()
		q.Grad = p.Grad.Clone()
		out[i] = &q
	}
	return out
}

// refAdamW is an independent float64 AdamW written from torch's documentation
// (decoupled decay p ← p(1−lr·wd), then the Adam step).
type refAdamW struct {
	b1, b2, eps float64
	p, m, v     [][]float64
	t           int
}

func newRefAdamW(ps []*Param, b1, b2, eps float64) *refAdamW {
	r := &refAdamW{b1: b1, b2: b2, eps: eps}
	for _, p := range ps {
		d := make([]float64, len(p.Data.Float32s()))
		for i, x := range p.Data.Float32s() {
			d[i] = float64(x)
		}
		r.p = append(r.p, d)
		r.m = append(r.m, make([]float64, len(d)))
		r.v = append(r.v, make([]float64, len(d)))
	}
	return r
}

func (r *refAdamW) step(ps []*Param, lr func(*Param) float64, wd func(*Param) float64) {
	r.t++
	bc1 := 1 - math.Pow(r.b1, float64(r.t))
	bc2 := 1 - math.Pow(r.b2, float64(r.t))
	for k, p := range ps {
		for i := range r.p[k] {
			g := float64(p.Grad.Float32s()[i])
			r.p[k][i] *= 1 - lr(p)*wd(p)
			r.m[k][i] = r.b1*r.m[k][i] + (1-r.b1)*g
			r.v[k][i] = r.b2*r.v[k][i] + (1-r.b2)*g*g
			r.p[k][i] -= lr(p) * (r.m[k][i] / bc1) / (math.Sqrt(r.v[k][i]/bc2) + r.eps)
		}
	}
}

// closeF32 reports |got−want| <= tol·max(|want|, floor). Parameters are O(1)
// and their float32 rounding is absolute, so they use floor 1.
func closeF32(got float32, want, tol, floor float64) bool {
	return math.Abs(float64(got)-want) <= tol*math.Max(math.Abs(want), floor)
}

// TestAdamWMatchesFloat64Reference runs 6 AdamW steps with a scheduled LR,
// decay and no-decay groups and non-default betas against refAdamW, on 1
// and 3 threads (which must agree bit for bit).
func TestAdamWMatchesFloat64Reference(t *testing.T) {
	defer tensor.SetCPUThreads(tensor.SetCPUThreads(1))
	var first []*Param
	for _, threads := range []int{1, 3} {
		tensor.SetCPUThreads(threads)
		ps := testParams(1, true)
		ref := newRefAdamW(ps, 0.9, 0.95, 1e-8)
		opt, err := NewAdamW(DefaultGroups(ps), AdamWConfig{Beta2: 0.95})
		if err != nil {
			t.Fatal(err)
		}
		sched, err := NewScheduler(SchedulerConfig{InitLR: 1e-4, MaxLR: 1e-2, MinLR: 1e-3, WarmupSteps: 2, DecaySteps: 6,
			DecayStyle: DecayCosine, StartWD: 0.1, EndWD: 0.1})
		if err != nil {
			t.Fatal(err)
		}
		for step := 0; step < 6; step++ {
			fillGrads(ps, uint64(100+step))
			sched.Apply(opt.Groups())
			lr := sched.LR()
			opt.Step()
			ref.step(ps, func(*Param) float64 { return lr }, func(p *Param) float64 {
				if p.NoWeightDecay {
					return 0
				}
				return 0.1
			})
			sched.Step(1)
		}
		for k, p := range ps {
			for i := range p.Data.Float32s() {
				if !closeF32(p.Data.Float32s()[i], ref.p[k][i], 1e-6, 1) {
					t.Fatalf("threads %d: %s[%d] = %v, float64 reference %v", threads, p.Name, i, p.Data.Float32s()[i], ref.p[k][i])
				}
			}
		}
		st := opt.State()
		for k, p := range ps {
			for i := range p.Data.Float32s() {
				if !closeF32(st.Buffers["exp_avg/"+p.Name][i], ref.m[k][i], 1e-6, math.Sqrt(ref.v[k][i])) /* m cancels: scale by the grads' size */ ||
					!closeF32(st.Buffers["exp_avg_sq/"+p.Name][i], ref.v[k][i], 1e-6, 0) {
					t.Fatalf("%s[%d]: state m %v v %v, reference %v %v", p.Name, i,
						st.Buffers["exp_avg/"+p.Name][i], st.Buffers["exp_avg_sq/"+p.Name][i], ref.m[k][i], ref.v[k][i])
				}
			}
		}
		if first == nil {
			first = ps
			continue
		}
		for k := range ps {
			for i := range ps[k].Data.Float32s() {
				if math.Float32bits(ps[k].Data.Float32s()[i]) != math.Float32bits(first[k].Data.Float32s()[i]) {
					t.Fatalf("%s[%d]: 3 threads %v, 1 thread %v", ps[k].Name, i, ps[k].Data.Float32s()[i], first[k].Data.Float32s()[i])
				}
			}
		}
	}
}

// refSGD is torch.optim.SGD's documented algorithm in float64.
func refSGDRun(ps []*Param, cfg SGDConfig, lr, wd float64, grads func(step int), steps int) [][]float64 {
	p := make([][]float64, len(ps))
	buf := make([][]float64, len(ps))
	for k := range ps {
		for _, x := range ps[k].Data.Float32s() {
			p[k] = append(p[k], float64(x))
		}
		buf[k] = make([]float64, len(p[k]))
	}
	for s := 0; s < steps; s++ {
		grads(s)
		for k, q := range ps {
			w := wd
			if q.NoWeightDecay {
				w = 0
			}
			for i := range p[k] {
				d := float64(q.Grad.Float32s()[i]) + w*p[k][i]
				if cfg.Momentum != 0 {
					if s == 0 {
						buf[k][i] = d
					} else {
						buf[k][i] = cfg.Momentum*buf[k][i] + (1-cfg.Dampening)*d
					}
					if cfg.Nesterov {
						d += cfg.Momentum * buf[k][i]
					} else {
						d = buf[k][i]
					}
				}
				p[k][i] -= lr * d
			}
		}
	}
	return p
}

// TestSGDMatchesFloat64Reference covers plain SGD, momentum (Megatron's
// 0.9), dampening and Nesterov, with coupled weight decay on the decay group.
func TestSGDMatchesFloat64Reference(t *testing.T) {
	for _, cfg := range []SGDConfig{{}, {Momentum: 0.9}, {Momentum: 0.5, Dampening: 0.3}, {Momentum: 0.9, Nesterov: true}} {
		ps := testParams(2, true)
		init := clone(ps)
		want := refSGDRun(init, cfg, 0.05, 0.1, func(s int) { fillGrads(init, uint64(200+s)) }, 4)
		opt, err := NewSGD(DefaultGroups(ps), cfg)
		if err != nil {
			t.Fatal(err)
		}
		for s := 0; s < 4; s++ {
			fillGrads(ps, uint64(200+s))
			for i := range opt.Groups() {
				g := &opt.Groups()[i]
				g.LR, g.WD = 0.05, 0.1*g.WDMult
			}
			opt.Step()
		}
		for k, p := range ps {
			for i := range p.Data.Float32s() {
				if !closeF32(p.Data.Float32s()[i], want[k][i], 1e-6, 1) {
					t.Fatalf("%+v: %s[%d] = %v, float64 reference %v", cfg, p.Name, i, p.Data.Float32s()[i], want[k][i])
				}
			}
		}
		if opt.Steps() != 4 {
			t.Errorf("Steps() = %d", opt.Steps())
		}
	}
}

// TestOptimizerStateRoundTrip checks that saving after 3 steps and loading
// into a fresh optimizer over copies of the params continues bit-identically.
func TestOptimizerStateRoundTrip(t *testing.T) {
	build := map[string]func([]Group) (Optimizer, error){
		"adamw": func(g []Group) (Optimizer, error) { return NewAdamW(g, AdamWConfig{}) },
		"sgd":   func(g []Group) (Optimizer, error) { return NewSGD(g, SGDConfig{Momentum: 0.9}) },
	}
	for name, mk := range build {
		ps := testParams(3, false)
		a, _ := mk(DefaultGroups(ps))
		setHyper := func(o Optimizer) {
			for i := range o.Groups() {
				o.Groups()[i].LR, o.Groups()[i].WD = 1e-2, 0.1*o.Groups()[i].WDMult
			}
		}
		for s := 0; s < 3; s++ {
			fillGrads(ps, uint64(s))
			setHyper(a)
			a.Step()
		}
		st := a.State()
		if st.Kind != name || st.Steps != 3 {
			t.Fatalf("%s: state kind %q steps %d", name, st.Kind, st.Steps)
		}
		qs := clone(ps)
		b, _ := mk(DefaultGroups(qs))
		if err := b.LoadState(st); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// The saved state is a copy: stepping a must not change st.
		before := append([]float32(nil), st.Buffers[st.BufferNames()[0]]...)
		fillGrads(ps, 9)
		fillGrads(qs, 9)
		setHyper(a)
		setHyper(b)
		a.Step()
		b.Step()
		for k := range ps {
			for i := range ps[k].Data.Float32s() {
				if math.Float32bits(ps[k].Data.Float32s()[i]) != math.Float32bits(qs[k].Data.Float32s()[i]) {
					t.Fatalf("%s: after reload %s[%d] = %v, uninterrupted %v", name, ps[k].Name, i, qs[k].Data.Float32s()[i], ps[k].Data.Float32s()[i])
				}
			}
		}
		if after := st.Buffers[st.BufferNames()[0]]; after[0] != before[0] {
			t.Errorf("%s: State() aliases the live buffers", name)
		}
	}
}

// TestOptimizerLoadStateErrors checks that bad states are rejected naming
// the buffer or parameter, and leave the optimizer unchanged.
func TestOptimizerLoadStateErrors(t *testing.T) {
	ps := testParams(4, false)
	opt, _ := NewAdamW(DefaultGroups(ps), AdamWConfig{})
	good := opt.State()
	mod := func(f func(*State)) State {
		s := State{Kind: good.Kind, Steps: good.Steps, Buffers: map[string][]float32{}}
		for k, v := range good.Buffers {
			s.Buffers[k] = v
		}
		f(&s)
		return s
	}
	for _, c := range []struct {
		st   State
		want string
	}{
		{mod(func(s *State) { s.Kind = "sgd" }), `state is for optimizer "sgd"`},
		{mod(func(s *State) { s.Steps = -1 }), "negative step count"},
		{mod(func(s *State) { delete(s.Buffers, "exp_avg_sq/layer.bias") }), `missing buffer "exp_avg_sq/layer.bias"`},
		{mod(func(s *State) { s.Buffers["exp_avg/norm.weight"] = make([]float32, 3) }), `buffer "exp_avg/norm.weight" has 3 values, parameter "norm.weight" (shape [11]) has 11`},
		{mod(func(s *State) { s.Buffers["exp_avg/ghost"] = nil }), `buffer "exp_avg/ghost" matches no parameter`},
	} {
		err := opt.LoadState(c.st)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("LoadState error %v, want one containing %q", err, c.want)
		}
	}
	sgd, _ := NewSGD(DefaultGroups(ps), SGDConfig{Momentum: 0.9})
	if err := sgd.LoadState(good); err == nil || !strings.Contains(err.Error(), `"adamw", want "sgd"`) {
		t.Errorf("sgd.LoadState(adamw state) = %v", err)
	}
}

// TestNewOptimizerErrors checks construction-time validation.
func TestNewOptimizerErrors(t *testing.T) {
	p := func(name string, nd, ng int, shape ...int) *Param {
		return &Param{Name: name, Data: tensor.Zeros(nd), Grad: tensor.Zeros(ng)}
	}
	for _, c := range []struct {
		groups []Group
		cfg    AdamWConfig
		want   string
	}{
		{[]Group{{Name: "g", Params: []*Param{p("a", 3, 2)}}}, AdamWConfig{}, `parameter "a": Grad has 2 elements, want Data's 3`},
		{[]Group{{Name: "g", Params: []*Param{{Name: "a", Data: tensor.Zeros(2)}}}}, AdamWConfig{}, `parameter "a" has no Data or no Grad tensor`},
		{[]Group{{Name: "g", Params: []*Param{{Name: "a", Data: tensor.Zeros(2), Grad: tensor.ZerosOn(tensor.Sim, 2)}}}}, AdamWConfig{}, `parameter "a": Data on the cpu device, Grad on sim`},
		{[]Group{{Name: "g", Params: []*Param{p("a", 1, 1)}}, {Name: "h", Params: []*Param{p("a", 1, 1)}}}, AdamWConfig{}, `parameter "a" appears twice`},
		{[]Group{{Name: "g", Params: []*Param{nil}}}, AdamWConfig{}, `group "g" holds a nil *Param`},
		{nil, AdamWConfig{Beta1: 1}, "--adam-beta1 1"},
		{nil, AdamWConfig{Beta2: -0.5}, "--adam-beta2 -0.5"},
		{nil, AdamWConfig{Eps: math.Inf(1)}, "--adam-eps"},
	} {
		_, err := NewAdamW(c.groups, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewAdamW error %v, want one containing %q", err, c.want)
		}
	}
	for _, c := range []struct {
		cfg  SGDConfig
		want string
	}{
		{SGDConfig{Momentum: 1}, "--sgd-momentum 1"},
		{SGDConfig{Momentum: 0.9, Dampening: 2}, "dampening 2"},
		{SGDConfig{Nesterov: true}, "Nesterov"},
	} {
		_, err := NewSGD(nil, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewSGD(%+v) error %v, want one containing %q", c.cfg, err, c.want)
		}
	}
	// An optimizer over no params is valid and Step is a no-op.
	o, err := NewAdamW(nil, AdamWConfig{})
	if err != nil {
		t.Fatal(err)
	}
	o.Step()
}

// TestDefaultNoWeightDecay checks Megatron's classic rule: 1-D params and
// "*.bias" get wd_mult 0, everything else 1.
func TestDefaultNoWeightDecay(t *testing.T) {
	for _, c := range []struct {
		name  string
		shape []int
		want  bool
	}{
		{"decoder.layers.0.self_attention.linear_qkv.weight", []int{96, 32}, false},
		{"decoder.layers.0.self_attention.linear_qkv.bias", []int{96}, true},
		{"decoder.layers.0.input_layernorm.weight", []int{32}, true},
		{"decoder.final_layernorm.weight", []int{32}, true},
		{"embedding.word_embeddings.weight", []int{50304, 32}, false},
		{"odd.bias", []int{4, 4}, true},
		{"bias_like.weight", []int{4, 4}, false},
		{"scalar", []int{1}, true},
	} {
		if got := DefaultNoWeightDecay(c.name, c.shape); got != c.want {
			t.Errorf("DefaultNoWeightDecay(%q, %v) = %v, want %v", c.name, c.shape, got, c.want)
		}
	}
	gs := DefaultGroups(testParams(5, false))
	if len(gs) != 2 || gs[0].WDMult != 1 || gs[1].WDMult != 0 || len(gs[0].Params) != 1 || len(gs[1].Params) != 2 {
		t.Errorf("DefaultGroups = %+v", gs)
	}
}

// TestAdamWGroupEps: a group's Eps (muP's per-group ε) replaces --adam-eps
// for its parameters only: Adam's first update is lr·g/(|g|+ε).
func TestAdamWGroupEps(t *testing.T) {
	mk := func(name string) *Param {
		return &Param{Name: name, Data: tensor.Zeros(2), Grad: tensor.FromFloat32([]float32{0.5, -0.25}, 2)}
	}
	a, b := mk("a"), mk("b")
	opt, err := NewAdamW([]Group{{Name: "own_eps", Params: []*Param{a}, Eps: 0.5, LR: 1}, {Name: "default", Params: []*Param{b}, LR: 1}},
		AdamWConfig{Eps: 0.25})
	if err != nil {
		t.Fatal(err)
	}
	opt.Step()
	for _, c := range []struct {
		p   *Param
		eps float64
	}{{a, 0.5}, {b, 0.25}} {
		for i, g := range []float64{0.5, -0.25} {
			want := -g / (math.Abs(g) + c.eps)
			if got := float64(c.p.Data.Float32s()[i]); math.Abs(got-want) > 1e-6 {
				t.Errorf("%s[%d]: %v after one step, want %v (eps %v)", c.p.Name, i, got, want, c.eps)
			}
		}
	}
}
