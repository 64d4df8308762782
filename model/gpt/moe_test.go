package gpt

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotron/gotron/tensor"
)

func moeTestConfig() Config {
	return Config{NumLayers: 2, HiddenSize: 16, NumAttentionHeads: 2, FFNHiddenSize: 24, VocabSize: 40,
		MaxPositionEmbeddings: 8, PositionEmbeddingType: RoPE, Normalization: RMSNorm, Activation: SwiGLU,
		DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true,
		MoE: MoEConfig{NumExperts: 4, TopK: 2, FFNHiddenSize: 12, AuxLossCoeff: 0.01, ZLossCoeff: 1e-3}}
}

func moeBatch(b, t, vocab int) Batch {
	ids := make([]int32, b*t)
	labels := make([]int32, b*t)
	for i := range ids {
		ids[i] = int32((i*7 + 3) % vocab)
		labels[i] = int32((i*5 + 1) % vocab)
	}
	return Batch{Tokens: tensor.FromInt32(ids, b, t), Labels: tensor.FromInt32(labels, b, t)}
}

// lossAndGrads runs one training micro-batch (aux-loss scale 1) and returns
// the lm loss and every parameter's gradient by name.
func lossAndGrads(t *testing.T, m *Model, bt Batch) (float64, map[string][]float32) {
	t.Helper()
	for _, p := range m.Params() {
		p.Grad = nil
	}
	tp := tensor.NewTape()
	loss := m.Loss(tp, m.Forward(tp, bt, tensor.NewRNG(1), true), bt)
	l := float64(loss.Float32s()[0])
	if err := tp.Backward(loss); err != nil {
		t.Fatal(err)
	}
	g := map[string][]float32{}
	for _, p := range m.Params() {
		if p.Grad != nil {
			g[p.Name] = append([]float32(nil), p.Grad.Float32s()...)
		}
	}
	return l, g
}

// TestMoEOneExpertIsDenseMLP: with one expert and top-1 the router's
// probability is 1, so an MoE model is the dense model with the expert's
// weights: the same loss and gradients.
func TestMoEOneExpertIsDenseMLP(t *testing.T) {
	cfg := moeTestConfig()
	cfg.MoE = MoEConfig{NumExperts: 1, TopK: 1}
	moe, err := New(cfg, tensor.NewRNG(3))
	if err != nil {
		t.Fatal(err)
	}
	dcfg := cfg
	dcfg.MoE, dcfg.FFNHiddenSize = MoEConfig{}, moe.Config.MoE.FFNHiddenSize
	dense, err := New(dcfg, tensor.NewRNG(3))
	if err != nil {
		t.Fatal(err)
	}
	for i := range dense.Layers {
		tensor.Copy(dense.Layers[i].FC1, moe.Layers[i].MoE.FC1[0])
		tensor.Copy(dense.Layers[i].FC2, moe.Layers[i].MoE.FC2[0])
	}
	bt := moeBatch(2, 6, cfg.VocabSize)
	lm, gm := lossAndGrads(t, moe, bt)
	ld, gd := lossAndGrads(t, dense, bt)
	if math.Abs(lm-ld) > 1e-6 {
		t.Fatalf("MoE loss %v, dense %v", lm, ld)
	}
	for name, g := range gd {
		mname := strings.Replace(name, "mlp.linear_fc", "mlp.experts.local_experts.0.linear_fc", 1)
		for i := range g {
			if d := math.Abs(float64(g[i] - gm[mname][i])); d > 1e-6*math.Max(1, math.Abs(float64(g[i]))) {
				t.Fatalf("%s[%d]: dense grad %g, MoE %g", name, i, g[i], gm[mname][i])
			}
		}
	}
	if r := gm["decoder.layers.0.mlp.router.weight"]; r == nil {
		t.Fatal("no router gradient")
	}
}

// TestMoEGroupedGEMMMatchesLoop: --moe-grouped-gemm and the per-expert loop
// give the same loss and gradients (shared expert with gate, dropping, aux
// and z losses on; the second layer dense by --moe-layer-freq).
func TestMoEGroupedGEMMMatchesLoop(t *testing.T) {
	var losses [2]float64
	var grads [2]map[string][]float32
	var loop *Model
	for i, grouped := range []bool{false, true} {
		cfg := moeTestConfig()
		cfg.MoE.GroupedGEMM = grouped
		cfg.MoE.LayerFreq = "[1,0]"
		cfg.MoE.SharedExpertFFN, cfg.MoE.SharedExpertGate = 8, true
		cfg.MoE.CapacityFactor = 1
		m, err := New(cfg, tensor.NewRNG(4))
		if err != nil {
			t.Fatal(err)
		}
		if m.Layers[1].MoE != nil || m.Layers[0].MoE == nil {
			t.Fatal("--moe-layer-freq [1,0]: want layer 0 MoE, layer 1 dense")
		}
		if !grouped {
			loop = m
		} else { // the names differ, and so do the streams they are drawn from
			for e := range cfg.MoE.NumExperts {
				tensor.Copy(m.Layers[0].MoE.FC1[e], loop.Layers[0].MoE.FC1[e])
				tensor.Copy(m.Layers[0].MoE.FC2[e], loop.Layers[0].MoE.FC2[e])
			}
		}
		losses[i], grads[i] = lossAndGrads(t, m, moeBatch(2, 8, cfg.VocabSize))
		// one name space: the grouped layout's names are the loop's
		for name, g := range grads[i] {
			if grouped && strings.Contains(name, "mlp.experts.linear_fc") {
				delete(grads[i], name)
				e := name[len(name)-1:]
				fc := "linear_fc1"
				if strings.Contains(name, "linear_fc2") {
					fc = "linear_fc2"
				}
				grads[i][strings.SplitAfter(name, "mlp.experts.")[0]+"local_experts."+e+"."+fc+".weight"] = g
			}
		}
	}
	if math.Abs(losses[0]-losses[1]) > 1e-6 {
		t.Fatalf("loss: loop %v, grouped %v", losses[0], losses[1])
	}
	if len(grads[0]) != len(grads[1]) {
		t.Fatalf("%d gradients with the loop, %d grouped", len(grads[0]), len(grads[1]))
	}
	for name, g := range grads[0] {
		h := grads[1][name]
		if h == nil {
			t.Fatalf("%s: no grouped gradient", name)
		}
		for j := range g {
			if d := math.Abs(float64(g[j] - h[j])); d > 1e-5*math.Max(1, math.Abs(float64(g[j]))) {
				t.Fatalf("%s[%d]: loop %g, grouped %g", name, j, g[j], h[j])
			}
		}
	}
}

// TestMoEMetricsAndExpertBias: the logged losses follow Megatron's tracker
// (mean over micro-batches and MoE layers), and the expert bias moves by
// the update rate against each expert's load once per iteration.
func TestMoEMetricsAndExpertBias(t *testing.T) {
	cfg := moeTestConfig()
	cfg.MoE.Score, cfg.MoE.ExpertBias = ScoreSigmoid, true
	m, err := New(cfg, tensor.NewRNG(5))
	if err != nil {
		t.Fatal(err)
	}
	m.SetAuxLossScale(0.5)
	for range 2 {
		lossAndGrads(t, m, moeBatch(2, 8, cfg.VocabSize))
	}
	met := m.MoEMetrics(2)
	if v := met["load_balancing_loss"]; !(v > 0.5 && v < 4) {
		t.Fatalf("load_balancing_loss %v: want about 1 (balanced) for random routing", v)
	}
	if v := met["z_loss"]; !(v > 0) {
		t.Fatalf("z_loss %v", v)
	}
	counts := append([]float64(nil), m.MoE.biasCounts[0]...)
	var total float64
	for _, c := range counts {
		total += c
	}
	if total != 2*2*8*2 { // micro-batches × tokens × top-k
		t.Fatalf("expert-bias counts %v: want %d routed tokens", counts, 2*2*8*2)
	}
	m.FinishMoEIteration()
	for e, c := range counts {
		want := float32(0)
		switch {
		case c < total/4:
			want = 1e-3
		case c > total/4:
			want = -1e-3
		}
		if got := m.Layers[0].MoE.ExpertBias[e]; got != want {
			t.Fatalf("expert %d with %v tokens: bias %v, want %v", e, c, got, want)
		}
	}
	if met2 := m.MoEMetrics(2); met2["load_balancing_loss"] != 0 {
		t.Fatalf("metrics not reset: %v", met2)
	}
}

func TestMoEConfigErrors(t *testing.T) {
	for _, c := range []struct {
		mod  func(*MoEConfig)
		want string
	}{
		{func(c *MoEConfig) { c.TopK = 5 }, "--moe-router-topk=5"},
		{func(c *MoEConfig) { c.CapacityFactor = -1 }, "--moe-expert-capacity-factor"},
		{func(c *MoEConfig) { c.ExpertBias = true }, "--moe-router-enable-expert-bias"},
		{func(c *MoEConfig) { c.LayerFreq = "[1,0,1]" }, "--moe-layer-freq"},
		{func(c *MoEConfig) { c.NumGroups, c.GroupTopK = 3, 1 }, "--moe-router-num-groups"},
		{func(c *MoEConfig) { c.DropByPosition = true }, "--moe-expert-capacity-factor"},
	} {
		cfg := moeTestConfig()
		c.mod(&cfg.MoE)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v", c.want, err)
		}
	}
}

func TestParseMoELayerFreq(t *testing.T) {
	for s, want := range map[string]string{"2": "1010", "([0]*1+[1]*3)": "0111", "[1,0,0,1]": "1001"} {
		p, err := ParseMoELayerFreq(s, 4)
		if err != nil {
			t.Fatal(err)
		}
		var got strings.Builder
		for _, on := range p {
			if on {
				got.WriteByte('1')
			} else {
				got.WriteByte('0')
			}
		}
		if got.String() != want {
			t.Errorf("%s: %s, want %s", s, got.String(), want)
		}
	}
}

// TestMoELayerGolden runs one MoE MLP (SwiGLU experts, a gated shared
// expert, capacity dropping, aux and z losses) against a float64 PyTorch run
// of Megatron's routing, permute and unpermute with SequentialMLP's experts
// (tools/golden/moe.py): the output and the gradients of every weight and
// of the input, the losses' gradients included (scale 1).
func TestMoELayerGolden(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "moe_layer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		S, B, H, E, K, F, Shared               int
		AuxCoeff                               float64 `json:"aux_coeff"`
		ZCoeff                                 float64 `json:"z_coeff"`
		CapacityFactor                         float64 `json:"capacity_factor"`
		Dropped                                int
		X, Dout, Out, DX                       []float32
		Aux, Z                                 float64
		Router, SharedFC1, SharedFC2, Gate     []float32
		FC1, FC2                               [][]float32
		DRouter, DSharedFC1, DSharedFC2, DGate []float32
		DFC1, DFC2                             [][]float32
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	var names struct {
		SharedFC1  []float32   `json:"shared_fc1"`
		SharedFC2  []float32   `json:"shared_fc2"`
		DRouter    []float32   `json:"d_router"`
		DSharedFC1 []float32   `json:"d_shared_fc1"`
		DSharedFC2 []float32   `json:"d_shared_fc2"`
		DGate      []float32   `json:"d_gate"`
		DFC1       [][]float32 `json:"d_fc1"`
		DFC2       [][]float32 `json:"d_fc2"`
	}
	if err := json.Unmarshal(raw, &names); err != nil {
		t.Fatal(err)
	}
	if g.Dropped == 0 {
		t.Fatal("the fixture drops no token: regenerate it with dropping")
	}
	cfg := Config{NumLayers: 1, HiddenSize: g.H, NumAttentionHeads: 2, VocabSize: 16, MaxPositionEmbeddings: g.S,
		Activation: SwiGLU, DisableBiasLinear: true,
		MoE: MoEConfig{NumExperts: g.E, TopK: g.K, FFNHiddenSize: g.F, SharedExpertFFN: g.Shared, SharedExpertGate: true,
			CapacityFactor: g.CapacityFactor, AuxLossCoeff: g.AuxCoeff, ZLossCoeff: g.ZCoeff}}
	m, err := New(cfg, tensor.NewRNG(1))
	if err != nil {
		t.Fatal(err)
	}
	l := m.Layers[0].MoE
	set := func(p *tensor.Tensor, v []float32) { copy(p.Float32s(), v) }
	set(l.Router, g.Router)
	set(l.SharedFC1, names.SharedFC1)
	set(l.SharedFC2, names.SharedFC2)
	set(l.Gate, g.Gate)
	for e := range g.E {
		set(l.FC1[e], g.FC1[e])
		set(l.FC2[e], g.FC2[e])
	}
	x := tensor.Param("x", g.B, g.S, g.H)
	set(x, g.X)
	m.SetAuxLossScale(1)
	tp := tensor.NewTape()
	out := m.moe(tp, l, 0, x, &pass{lin: tapeLinear{}, rng: tensor.NewRNG(2)})
	loss := tp.Sum(tp.Mul(out, tensor.FromFloat32(g.Dout, g.B, g.S, g.H)))
	if err := tp.Backward(loss); err != nil {
		t.Fatal(err)
	}
	check := func(name string, got, want []float32) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
		}
		for i := range want {
			if d := math.Abs(float64(got[i] - want[i])); d > 2e-5*math.Max(1, math.Abs(float64(want[i]))) {
				t.Fatalf("%s[%d] = %g, PyTorch float64 %g", name, i, got[i], want[i])
			}
		}
	}
	check("out", out.Float32s(), g.Out)
	check("dx", x.Grad.Float32s(), g.DX)
	check("router grad", l.Router.Grad.Float32s(), names.DRouter)
	check("shared fc1 grad", l.SharedFC1.Grad.Float32s(), names.DSharedFC1)
	check("shared fc2 grad", l.SharedFC2.Grad.Float32s(), names.DSharedFC2)
	check("gate grad", l.Gate.Grad.Float32s(), names.DGate)
	for e := range g.E {
		check(fmt.Sprintf("expert %d fc1 grad", e), l.FC1[e].Grad.Float32s(), names.DFC1[e])
		check(fmt.Sprintf("expert %d fc2 grad", e), l.FC2[e].Grad.Float32s(), names.DFC2[e])
	}
	met := m.MoEMetrics(1)
	if math.Abs(met["load_balancing_loss"]-g.Aux/g.AuxCoeff) > 1e-5 || math.Abs(met["z_loss"]-g.Z/g.ZCoeff) > 1e-5 {
		t.Fatalf("logged losses %v; PyTorch aux/coeff %g, z/coeff %g", met, g.Aux/g.AuxCoeff, g.Z/g.ZCoeff)
	}
}

// TestMoEInputJitter: --moe-input-jitter-eps changes the router's input
// (the loss moves) in training only, and full recomputation draws the same
// noise again (the same loss and gradients as without recomputation).
func TestMoEInputJitter(t *testing.T) {
	cfg := moeTestConfig()
	bt := moeBatch(2, 8, cfg.VocabSize)
	plain, err := New(cfg, tensor.NewRNG(8))
	if err != nil {
		t.Fatal(err)
	}
	l0, _ := lossAndGrads(t, plain, bt)
	cfg.MoE.InputJitterEps = 0.3
	var losses [2]float64
	var grads [2]map[string][]float32
	for i, full := range []bool{false, true} {
		m, err := New(cfg, tensor.NewRNG(8))
		if err != nil {
			t.Fatal(err)
		}
		if full {
			m.Recompute = Recompute{Full: true, Method: "uniform", NumLayers: 1}
		}
		losses[i], grads[i] = lossAndGrads(t, m, bt)
	}
	if losses[0] == l0 {
		t.Fatalf("jitter left the loss at %v", l0)
	}
	if losses[0] != losses[1] {
		t.Fatalf("loss %v without recomputation, %v with", losses[0], losses[1])
	}
	for name, g := range grads[0] {
		if !slicesEqual(g, grads[1][name]) {
			t.Fatalf("%s: gradients differ under recomputation", name)
		}
	}
	// evaluation (no RNG) does not jitter
	m, _ := New(cfg, tensor.NewRNG(8))
	e1 := m.Loss(nil, m.Forward(nil, bt, nil, false), bt).Float32s()[0]
	e0 := plain.Loss(nil, plain.Forward(nil, bt, nil, false), bt).Float32s()[0]
	if e1 != e0 {
		t.Fatalf("evaluation loss %v with jitter, %v without", e1, e0)
	}
}

func slicesEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestMoERouterFP64: --moe-router-dtype fp64 trains (its router gets a
// gradient) and stays within float32 noise of the fp32 router on ordinary
// inputs (tensor's TestRouteFP64Golden checks it against Megatron).
func TestMoERouterFP64(t *testing.T) {
	cfg := moeTestConfig()
	bt := moeBatch(2, 8, cfg.VocabSize)
	m32, _ := New(cfg, tensor.NewRNG(9))
	l32, g32 := lossAndGrads(t, m32, bt)
	cfg.MoE.RouterFP64 = true
	m64, err := New(cfg, tensor.NewRNG(9))
	if err != nil {
		t.Fatal(err)
	}
	l64, g64 := lossAndGrads(t, m64, bt)
	if math.Abs(l64-l32) > 1e-5 {
		t.Fatalf("loss fp64 router %v, fp32 %v", l64, l32)
	}
	r64, r32 := g64["decoder.layers.0.mlp.router.weight"], g32["decoder.layers.0.mlp.router.weight"]
	for i := range r32 {
		if math.Abs(float64(r64[i]-r32[i])) > 1e-4*math.Max(1e-2, math.Abs(float64(r32[i]))) {
			t.Fatalf("router grad[%d]: fp64 %g, fp32 %g", i, r64[i], r32[i])
		}
	}
}
