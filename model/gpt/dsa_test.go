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

// dsaGoldenConfig mirrors tools/golden/dsa.py's CONFIGS entries.
type dsaGoldenConfig struct {
	mlaGoldenConfig
	IndexHeads   int      `json:"index_heads"`
	IndexHeadDim int      `json:"index_head_dim"`
	TopK         int      `json:"topk"`
	LossCoeff    float64  `json:"loss_coeff"`
	SparseLoss   bool     `json:"sparse_loss"`
	ReLU         bool     `json:"relu"`
	Rotate       bool     `json:"rotate"`
	KNormEps     *float64 `json:"k_norm_eps"`
}

// newDSAGoldenModel builds tools/golden/dsa.py's model name with the
// golden's initial values and its batch.
func newDSAGoldenModel(t *testing.T, name string) (*Model, Batch, golden) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var fix struct{ Config dsaGoldenConfig }
	if err := json.Unmarshal(raw, &fix); err != nil {
		t.Fatalf("%s.json: %v", name, err)
	}
	c := fix.Config
	cfg := c.model(t)
	cfg.QKLayerNorm = true // tools/golden/dsa.py's layers have the latent norms (Megatron's DSA spec with --qk-layernorm)
	cfg.DSA = DSAConfig{Enabled: true, IndexerHeads: c.IndexHeads, IndexerHeadDim: c.IndexHeadDim, TopK: c.TopK,
		LossCoeff: c.LossCoeff, SparseLoss: c.SparseLoss, NoScoringReLU: !c.ReLU, NoRotateActivation: !c.Rotate}
	if c.KNormEps != nil {
		cfg.DSA.KNormEpsilon = *c.KNormEps
	}
	g := loadGolden(t, name)
	m, err := New(cfg, tensor.NewRNG(0))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(m.Params()), countPrefix(g.f, "grad/"); got != want {
		t.Fatalf("model has %d parameters, golden has %d", got, want)
	}
	for _, p := range m.Params() {
		copy(p.Float32s(), g.f32(t, "init/"+p.Name))
	}
	if got, want := float64(m.NumParams()), m.Config.ParamCount(); got != want {
		t.Errorf("NumParams %v, Config.ParamCount %v", got, want)
	}
	b, T := c.Batch, c.Seq
	bt := Batch{Tokens: g.i32(t, "tokens", b, T), Labels: g.i32(t, "labels", b, T),
		LossMask: tensor.FromFloat32(g.f32(t, "loss_mask"), b, T)}
	return m, bt, g
}

// dsaStep runs one training forward and backward (the indexer loss needs
// training: a dropout stream, all dropouts zero) and returns the lm loss.
func dsaStep(t *testing.T, m *Model, bt Batch) (logits, loss *tensor.Tensor) {
	t.Helper()
	tp := tensor.NewTape()
	logits = m.Forward(tp, bt, tensor.NewRNG(7), true)
	loss = m.Loss(tp, logits, bt)
	if err := tp.Backward(loss); err != nil {
		t.Fatal(err)
	}
	return logits, loss
}

// TestDSAGoldenForwardBackward checks DeepSeek sparse attention against
// tools/golden/dsa.py, which runs Megatron's own DSA functions (the
// indexer's scores and top-k, FusedDSAIndexerLoss with its hand-written
// backward, the absorbed sparse attention, the loss auto-scaler): logits,
// lm loss, each layer's indexer loss and every parameter's gradient (the
// indexer's from its loss alone), with the dense loss, ReLU scores and the
// Hadamard rotation under YaRN, and with the sparse loss, linear scores,
// no rotation and no --q-lora-rank.
func TestDSAGoldenForwardBackward(t *testing.T) {
	for _, name := range []string{"dsa_dense_loss", "dsa_sparse_loss"} {
		t.Run(name, func(t *testing.T) {
			m, bt, g := newDSAGoldenModel(t, name)
			logits, loss := dsaStep(t, m, bt)
			closeTo(t, "logits", logits.Float32s(), g.f32(t, "logits"), 1e-4)
			closeTo(t, "loss", loss.Float32s(), g.f32(t, "loss"), 1e-5)
			for i, l := range m.dsa.losses {
				closeTo(t, fmt.Sprintf("layer %d indexer loss", i), []float32{float32(l)}, g.f32(t, fmt.Sprintf("indexer_loss/%d", i)), 1e-5)
			}
			for _, p := range m.Params() {
				closeTo(t, "grad of "+p.Name, p.Grad.Float32s(), g.f32(t, "grad/"+p.Name), 1e-4)
			}
			il, ok := m.IndexerLoss(1)
			want := (m.dsa.lossesOr(g, t)[0] + m.dsa.lossesOr(g, t)[1]) / 2
			if !ok || math.Abs(il-want) > 1e-5 {
				t.Errorf("IndexerLoss(1) = %g, %v; want the layers' mean %g", il, ok, want)
			}
		})
	}
}

// lossesOr is the golden's per-layer indexer losses (a test helper).
func (s *DSAState) lossesOr(g golden, t *testing.T) []float64 {
	return []float64{float64(g.f32(t, "indexer_loss/0")[0]), float64(g.f32(t, "indexer_loss/1")[0])}
}

// TestDSAIndexerOnlyLearnsFromItsLoss: without the indexer loss the
// indexer's parameters get no gradient (x and qr are detached; the top-k
// selection is not differentiated), and the rest of the model's gradients
// are unchanged by the loss (its gradient stops at the detach points).
func TestDSAIndexerOnlyLearnsFromItsLoss(t *testing.T) {
	with, bt, _ := newDSAGoldenModel(t, "dsa_dense_loss")
	without, _, _ := newDSAGoldenModel(t, "dsa_dense_loss")
	without.Config.DSA.LossCoeff = 0
	dsaStep(t, with, bt)
	dsaStep(t, without, bt)
	if _, ok := without.IndexerLoss(1); ok {
		t.Errorf("IndexerLoss without --dsa-indexer-loss-coeff: ok")
	}
	for i, p := range without.Params() {
		q := with.Params()[i]
		indexer := strings.Contains(p.Name, dsaIndexerPrefix)
		if p.Grad == nil {
			if !indexer {
				t.Fatalf("%s: no gradient", p.Name)
			}
			continue
		}
		for j, v := range p.Grad.Float32s() {
			if indexer && v != 0 {
				t.Fatalf("%s: gradient %g without the indexer loss", p.Name, v)
			}
			if !indexer && v != q.Grad.Float32s()[j] {
				t.Fatalf("%s[%d]: gradient %g without the indexer loss, %g with it", p.Name, j, v, q.Grad.Float32s()[j])
			}
		}
	}
}

// TestDSARecompute: selective recomputation (the attention core) and full
// recomputation (whole layers) give the golden's loss, indexer losses
// (recorded once, by the recomputation) and gradients.
func TestDSARecompute(t *testing.T) {
	for _, r := range []Recompute{{Selective: true}, {Full: true, Method: "uniform", NumLayers: 2}} {
		m, bt, g := newDSAGoldenModel(t, "dsa_dense_loss")
		m.Recompute = r
		_, loss := dsaStep(t, m, bt)
		closeTo(t, fmt.Sprintf("%+v loss", r), loss.Float32s(), g.f32(t, "loss"), 1e-5)
		for i, l := range m.dsa.losses {
			closeTo(t, fmt.Sprintf("%+v layer %d indexer loss", r, i), []float32{float32(l)}, g.f32(t, fmt.Sprintf("indexer_loss/%d", i)), 1e-5)
		}
		for _, p := range m.Params() {
			closeTo(t, fmt.Sprintf("%+v grad of %s", r, p.Name), p.Grad.Float32s(), g.f32(t, "grad/"+p.Name), 1e-4)
		}
	}
}

// TestDSAEvaluationHasNoIndexerLoss: an evaluation forward computes the
// sparse attention (the same logits) but no indexer loss.
func TestDSAEvaluationHasNoIndexerLoss(t *testing.T) {
	m, bt, g := newDSAGoldenModel(t, "dsa_sparse_loss")
	logits := m.Forward(nil, bt, nil, false)
	closeTo(t, "logits", logits.Float32s(), g.f32(t, "logits"), 1e-4)
	if l, _ := m.IndexerLoss(1); l != 0 {
		t.Errorf("indexer loss %g after an evaluation forward, want 0", l)
	}
}

func TestDSAConfigErrors(t *testing.T) {
	base := func() Config {
		c := Config{NumLayers: 1, HiddenSize: 16, NumAttentionHeads: 2, VocabSize: 8, MaxPositionEmbeddings: 8, MLA: DefaultMLA(), DisableBiasLinear: true}
		c.MLA.QKHeadDim, c.MLA.QKPosEmbHeadDim, c.MLA.VHeadDim, c.MLA.KVLoraRank = 4, 2, 4, 4
		c.DSA = DSAConfig{Enabled: true, IndexerHeads: 2, IndexerHeadDim: 4, TopK: 4}
		return c
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.MLA = MLAConfig{} }, "needs --multi-latent-attention"},
		{func(c *Config) { c.DSA.IndexerHeads = 0 }, "--dsa-indexer-n-heads=0"},
		{func(c *Config) { c.DSA.IndexerHeadDim = 0 }, "--dsa-indexer-head-dim=0"},
		{func(c *Config) { c.DSA.TopK = -1 }, "--dsa-indexer-topk=-1"},
		{func(c *Config) { c.DSA.IndexerHeadDim = 1 }, "at least --qk-pos-emb-head-dim=2"},
		{func(c *Config) { c.DSA.IndexerHeadDim = 6 }, "power of two"},
		{func(c *Config) { c.DSA.LossCoeff = math.NaN() }, "--dsa-indexer-loss-coeff"},
		{func(c *Config) { c.DSA.KNormEpsilon = -1 }, "--dsa-indexer-k-norm-epsilon"},
		{func(c *Config) { c.DisableBiasLinear = false }, "--disable-bias-linear"},
		{func(c *Config) { c.DSA.Enabled = false }, "without --experimental-attention-variant dsa"},
	} {
		c := base()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate: %v, want an error naming %q", err, tc.want)
		}
	}
	c := base()
	if err := c.Validate(); err != nil {
		t.Fatalf("valid DSA config: %v", err)
	}
	c.DSA.IndexerHeadDim, c.DSA.NoRotateActivation = 6, true // no Hadamard: any width
	if err := c.Validate(); err != nil {
		t.Fatalf("DSA without the rotation, head dim 6: %v", err)
	}
	c = base()
	if err := c.CheckDevice(tensor.CUDA); err == nil || !strings.Contains(err.Error(), "dsa") {
		t.Errorf("CheckDevice(cuda): %v, want a refusal naming dsa", err)
	}
	if err := c.CheckDecode(); err == nil || !strings.Contains(err.Error(), "dsa") {
		t.Errorf("CheckDecode: %v, want a refusal naming dsa", err)
	}
}

// TestDSAPerTokenLoss: with --calculate-per-token-loss the indexer loss is
// its rows' sum (Megatron's reduce_indexer_kl_sum), so each layer's loss
// and the indexer's gradients are b·t times the golden's mean; the rest of
// the model's gradients are unchanged.
func TestDSAPerTokenLoss(t *testing.T) {
	m, bt, g := newDSAGoldenModel(t, "dsa_dense_loss")
	m.SetPerTokenLoss(true)
	dsaStep(t, m, bt)
	rows := float32(bt.Tokens.Numel())
	scaled := func(name string) []float32 {
		v := append([]float32(nil), g.f32(t, name)...)
		for i := range v {
			v[i] *= rows
		}
		return v
	}
	for i, l := range m.dsa.losses {
		closeTo(t, fmt.Sprintf("layer %d indexer loss", i), []float32{float32(l)}, scaled(fmt.Sprintf("indexer_loss/%d", i)), 1e-5)
	}
	for _, p := range m.Params() {
		want := g.f32(t, "grad/"+p.Name)
		if IsDSAIndexer(p.Name) {
			want = scaled("grad/" + p.Name)
		}
		closeTo(t, "grad of "+p.Name, p.Grad.Float32s(), want, 1e-4)
	}
}
