package gpt

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/tensor"
)

// gdnGoldenConfig is tools/golden/gdn.py's C: gated delta nets at layers 0
// and 2, output-gated full attention at 1 and 3.
func gdnGoldenConfig() Config {
	return Config{NumLayers: 4, HiddenSize: 32, NumAttentionHeads: 4, NumQueryGroups: 2, KVChannels: 8, FFNHiddenSize: 24,
		VocabSize: 64, MaxPositionEmbeddings: 10, PositionEmbeddingType: RoPE, RotaryPercent: 0.5,
		Normalization: LayerNorm, LayerNorm1P: true, Activation: SwiGLU, DisableBiasLinear: true,
		UntieEmbeddingsAndOutputWeights: true, AttentionOutputGate: true,
		GDN: GDNConfig{Enabled: true, LinearAttentionFreq: "2", ConvKernel: 4, KeyHeadDim: 4, ValueHeadDim: 6,
			NumKeyHeads: 2, NumValueHeads: 4}}
}

// TestGDNGolden: the hybrid model's logits, loss and every parameter's
// gradient against tools/golden/gdn.py's float64 PyTorch model (written
// from Megatron's GatedDeltaNet and gated attention; its recurrent delta
// rule checked there against Megatron's chunked one).
func TestGDNGolden(t *testing.T) {
	g := golden{}
	var err error
	g.f, err = safetensors.ReadFile(filepath.Join("testdata", "gdn.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(gdnGoldenConfig(), tensor.NewRNG(0))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(m.Params()), countPrefix(g.f, "grad/"); got != want {
		t.Fatalf("model has %d parameters, golden has %d", got, want)
	}
	for i, l := range m.Layers {
		if (l.GDN != nil) != (i%2 == 0) {
			t.Fatalf("layer %d: gated delta net %v, want layers 0 and 2 (--linear-attention-freq 2)", i, l.GDN != nil)
		}
	}
	if got := float64(m.NumParams()); got != m.Config.ParamCount() {
		t.Fatalf("NumParams %v, Config.ParamCount %v", got, m.Config.ParamCount())
	}
	for _, p := range m.Params() {
		copy(p.Float32s(), g.f32(t, "init/"+p.Name))
	}
	const b, T = 2, 10
	bt := Batch{Tokens: g.i32(t, "tokens", b, T), Labels: g.i32(t, "labels", b, T),
		LossMask: tensor.FromFloat32(g.f32(t, "loss_mask"), b, T)}
	tp := tensor.NewTape()
	logits := m.Forward(tp, bt, nil, true)
	loss := m.Loss(tp, logits, bt)
	closeTo(t, "logits", logits.Float32s(), g.f32(t, "logits"), 1e-4)
	closeTo(t, "loss", loss.Float32s(), g.f32(t, "loss"), 1e-5)
	if err := tp.Backward(loss); err != nil {
		t.Fatal(err)
	}
	// The model's float32 rounding against the float64 golden is large
	// here (a tiny model, large weights): the gradients are within 2e-4,
	// the worst 1.4e-4 with the chunked delta rule (the model's), 9e-5
	// with the recurrent one (the reference), which agree to 1e-12 in
	// float64 (internal/cpu).
	for _, p := range m.Params() {
		closeTo(t, "grad of "+p.Name, p.Grad.Float32s(), g.f32(t, "grad/"+p.Name), 2e-4)
	}
}

// TestGDNConfig: Megatron's defaults and checks of the variant's flags.
func TestGDNConfig(t *testing.T) {
	c := gdnGoldenConfig()
	c.GDN = GDNConfig{Enabled: true, LinearAttentionFreq: "([1]*3+[0]*1)"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if g := c.GDN; g.ConvKernel != 4 || g.KeyHeadDim != 128 || g.ValueHeadDim != 128 || g.NumKeyHeads != 16 || g.NumValueHeads != 32 {
		t.Fatalf("defaults %+v, want Megatron's 4, 128, 128, 16, 32", g)
	}
	if p, _ := c.GDN.Pattern(4); !p[0] || !p[1] || !p[2] || p[3] {
		t.Fatalf("pattern %v", p)
	}
	if p, _ := (&GDNConfig{LinearAttentionFreq: "3"}).Pattern(6); !p[0] || !p[1] || p[2] || !p[3] || !p[4] || p[5] {
		t.Fatalf("--linear-attention-freq 3 over 6 layers: %v, want full attention at layers 2 and 5", p)
	}
	for _, bad := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.GDN.LinearAttentionFreq = "" }, "needs --linear-attention-freq"},
		{func(c *Config) { c.GDN.LinearAttentionFreq = "0" }, "--linear-attention-freq=0"},
		{func(c *Config) { c.GDN.LinearAttentionFreq = "[1,0]" }, "2 entries for --num-layers=4"},
		{func(c *Config) { c.GDN.NumKeyHeads, c.GDN.NumValueHeads = 3, 4 }, "multiple of --linear-num-key-heads=3"},
		{func(c *Config) { c.GDN.KeyHeadDim = -1 }, "--linear-key-head-dim=-1"},
		{func(c *Config) { c.GDN.KeyHeadDim, c.GDN.NumKeyHeads = 1<<30, 1<<30 }, "want each product at most"},
		{func(c *Config) { c.Activation = GELU }, "needs --swiglu"},
	} {
		c := gdnGoldenConfig()
		bad.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("got %v, want an error containing %q", err, bad.want)
		}
	}
	c = gdnGoldenConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckTP(2, true, 10); err != nil {
		t.Fatalf("CheckTP(2): %v", err)
	}
	one := gdnGoldenConfig()
	one.GDN.NumKeyHeads = 1
	if err := one.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := one.CheckTP(2, false, 0); err == nil || !strings.Contains(err.Error(), "--linear-num-key-heads=1 is not divisible by --tensor-model-parallel-size=2") {
		t.Fatalf("CheckTP(2) with one key head: %v", err)
	}
	if err := c.CheckDeviceEnv(tensor.CUDA, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "GOTRON_CUDA_UNVERIFIED=gdn") {
		t.Fatalf("CheckDevice(cuda): %v", err)
	}
}

// TestGDNInit: the gated delta net's parameters start as Megatron's
// GatedDeltaNet.reset_parameters leaves them.
func TestGDNInit(t *testing.T) {
	c := gdnGoldenConfig()
	c.LayerNorm1P = false
	m, err := New(c, tensor.NewRNG(3))
	if err != nil {
		t.Fatal(err)
	}
	l := m.Layers[0].GDN
	for _, v := range l.DtBias.Float32s() {
		if v != 1 {
			t.Fatalf("dt_bias %v, want ones", l.DtBias.Float32s())
		}
	}
	for _, v := range l.ALog.Float32s() {
		if !(v >= 0 && v < 2.7726) { // log(uniform(1, 16))
			t.Fatalf("A_log %v, want log of [1, 16)", l.ALog.Float32s())
		}
	}
	for _, v := range append(append(l.ConvQ.Float32s(), l.ConvK.Float32s()...), l.ConvV.Float32s()...) {
		if !(v >= -0.5 && v < 0.5) { // PyTorch's Conv1d default, ±1/sqrt(K) with K = 4
			t.Fatalf("conv1d weight %v, want uniform(±0.5)", v)
		}
	}
	for _, v := range l.OutNorm.Float32s() {
		if v != 1 {
			t.Fatalf("out_norm weight %v, want ones", l.OutNorm.Float32s())
		}
	}
	for _, w := range []struct {
		p    *tensor.Tensor
		rows int
	}{{l.InQ, 8}, {l.InK, 8}, {l.InV, 24}, {l.InZ, 24}, {l.InBeta, 4}, {l.InAlpha, 4}} {
		if got := w.p.Shape(); got[0] != w.rows || got[1] != 32 {
			t.Fatalf("%s: %v, want (%d, 32)", w.p.Name, got, w.rows)
		}
	}
}

// TestOutputGateDecode: an output-gated attention model (the golden's
// attention layers, no gated delta nets) decodes with its KV cache to the
// logits of the full forward.
func TestOutputGateDecode(t *testing.T) {
	c := gdnGoldenConfig()
	c.GDN = GDNConfig{}
	m, err := New(c, tensor.NewRNG(5))
	if err != nil {
		t.Fatal(err)
	}
	tokens := []int32{3, 9, 27, 1, 50, 7, 7, 12}
	kv := m.NewKVCache(8)
	got, err := m.Decode(kv, tokens[:5])
	if err != nil {
		t.Fatal(err)
	}
	for i := 5; i < 8; i++ {
		if got, err = m.Decode(kv, tokens[i:i+1]); err != nil {
			t.Fatal(err)
		}
	}
	full := m.Forward(nil, Batch{Tokens: tensor.FromInt32(append([]int32(nil), tokens...), 1, 8)}, nil, false)
	closeTo(t, "last token's logits", got, full.Float32s()[7*c.VocabSize:], 1e-4)
}
