package gpt

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// mupGolden is model/gpt/testdata/mup_golden.json, written by
// tools/golden/mup.py from Megatron's own muP code.
type mupGolden struct {
	Cases []struct {
		Name   string
		Config struct {
			NumLayers             int      `json:"num_layers"`
			HiddenSize            int      `json:"hidden_size"`
			NumAttentionHeads     int      `json:"num_attention_heads"`
			KVChannels            int      `json:"kv_channels"`
			Vocab                 int      `json:"vocab"`
			MaxPositionEmbeddings int      `json:"max_position_embeddings"`
			Untie                 bool     `json:"untie"`
			BaseHiddenSize        int      `json:"mup_base_hidden_size"`
			BaseHeadDim           float64  `json:"mup_base_head_dim"`
			AttnScalePower        float64  `json:"mup_attn_scale_power"`
			OutputMult            float64  `json:"mup_output_mult"`
			EmbeddingMult         float64  `json:"mup_embedding_mult"`
			InitMethodStd         *float64 `json:"init_method_std"`
		}
		WidthMult        float64 `json:"width_mult"`
		SoftmaxScale     float64 `json:"softmax_scale"`
		MuPOutputMult    float64 `json:"mup_output_mult"`
		MuPEmbeddingMult float64 `json:"mup_embedding_mult"`
		InitStd          struct {
			Embedding   float64  `json:"embedding"`
			Hidden      float64  `json:"hidden"`
			OutputProj  float64  `json:"output_proj"`
			OutputLayer *float64 `json:"output_layer"`
		} `json:"init_std"`
	}
}

func readMuPGolden(t *testing.T) mupGolden {
	t.Helper()
	raw, err := os.ReadFile("testdata/mup_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g mupGolden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) == 0 {
		t.Fatal("no cases")
	}
	return g
}

func relClose(got, want, tol float64) bool { return math.Abs(got-want) <= tol*math.Abs(want) }

// TestMuPGolden: the width multiplier, softmax scale, logit and embedding
// multipliers and every init std equal Megatron's (its
// TransformerConfig.__post_init__ muP block run out of tree), including
// the functional test gpt3_mcore_te_tp1_pp1_mup's sizes. The stds differ
// from Python's only by --init-method-std being a float32 here.
func TestMuPGolden(t *testing.T) {
	for _, gc := range readMuPGolden(t).Cases {
		c := gc.Config
		cfg := Config{NumLayers: c.NumLayers, HiddenSize: c.HiddenSize, NumAttentionHeads: c.NumAttentionHeads,
			VocabSize: c.Vocab, MaxPositionEmbeddings: c.MaxPositionEmbeddings, UntieEmbeddingsAndOutputWeights: c.Untie,
			MuP: MuPConfig{Enabled: true, BaseHiddenSize: c.BaseHiddenSize, BaseHeadDim: c.BaseHeadDim,
				AttnScalePower: c.AttnScalePower, OutputMult: c.OutputMult, EmbeddingMult: c.EmbeddingMult}}
		if c.InitMethodStd != nil {
			cfg.InitMethodStd = float32(*c.InitMethodStd)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%s: %v", gc.Name, err)
		}
		if cfg.KVChannels != c.KVChannels {
			t.Fatalf("%s: kv channels %d, golden %d", gc.Name, cfg.KVChannels, c.KVChannels)
		}
		if got := cfg.WidthMult(); got != gc.WidthMult {
			t.Errorf("%s: width mult %v, Megatron %v", gc.Name, got, gc.WidthMult)
		}
		if got := cfg.SoftmaxScale(); got != float32(gc.SoftmaxScale) {
			t.Errorf("%s: softmax scale %v, Megatron %v", gc.Name, got, gc.SoftmaxScale)
		}
		if got := cfg.LogitMult(); got != gc.MuPOutputMult {
			t.Errorf("%s: logit mult %v, Megatron %v", gc.Name, got, gc.MuPOutputMult)
		}
		if got := cfg.EmbeddingMult(); got != gc.MuPEmbeddingMult {
			t.Errorf("%s: embedding mult %v, Megatron %v", gc.Name, got, gc.MuPEmbeddingMult)
		}
		s := cfg.InitStds()
		for _, f := range []struct {
			what      string
			got, want float64
		}{{"embedding", s.Embedding, gc.InitStd.Embedding}, {"hidden", s.Hidden, gc.InitStd.Hidden}, {"output projection", s.Output, gc.InitStd.OutputProj}} {
			if !relClose(f.got, f.want, 1e-7) {
				t.Errorf("%s: %s init std %v, Megatron %v", gc.Name, f.what, f.got, f.want)
			}
		}
		if c.Untie && !relClose(s.OutputLayer, *gc.InitStd.OutputLayer, 1e-7) {
			t.Errorf("%s: output layer init std %v, Megatron %v", gc.Name, s.OutputLayer, *gc.InitStd.OutputLayer)
		}
		if c.NumLayers*c.HiddenSize > 1000 {
			continue // the functional test's model is too big to draw here
		}
		// New draws each parameter with its std: the sample stds agree.
		m, err := New(cfg, tensor.NewRNG(7))
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]float64{"embedding.word_embeddings.weight": s.Embedding, "embedding.position_embeddings.weight": s.Embedding,
			"self_attention.linear_qkv.weight": s.Hidden, "mlp.linear_fc1.weight": s.Hidden,
			"self_attention.linear_proj.weight": s.Output, "mlp.linear_fc2.weight": s.Output, "output_layer.weight": s.OutputLayer}
		for _, p := range m.Params() {
			for suffix, w := range want {
				if !strings.HasSuffix(p.Name, suffix) {
					continue
				}
				var sq float64
				for _, v := range p.Float32s() {
					sq += float64(v) * float64(v)
				}
				got := math.Sqrt(sq / float64(p.Numel()))
				if !relClose(got, w, 0.06) {
					t.Errorf("%s: %s sample std %.5f, want %.5f", gc.Name, p.Name, got, w)
				}
			}
		}
	}
}

// TestMuPForwardIsAReparametrisation checks the muP forward against an
// independent computation: a plain model (no muP) whose query rows are
// scaled by muP's softmax scale·√d, output layer by the logit multiplier
// and embedding tables by the embedding multiplier computes the same loss.
// The muP model's loss differs from the same weights without muP.
func TestMuPForwardIsAReparametrisation(t *testing.T) {
	mup := Config{NumLayers: 2, HiddenSize: 48, NumAttentionHeads: 4, VocabSize: 64, MaxPositionEmbeddings: 16,
		UntieEmbeddingsAndOutputWeights: true, Activation: GELUTanh, InitMethodStd: 0.8, // scores far from uniform
		MuP: MuPConfig{Enabled: true, BaseHiddenSize: 16, BaseHeadDim: 4, AttnScalePower: 0.75, EmbeddingMult: 2.5}}
	m, err := New(mup, tensor.NewRNG(3))
	if err != nil {
		t.Fatal(err)
	}
	plainCfg := m.Config
	plainCfg.MuP = MuPConfig{}
	plain, err := New(plainCfg, tensor.NewRNG(99))
	if err != nil {
		t.Fatal(err)
	}
	c := &m.Config
	d := c.KVChannels
	qMult := float32(float64(c.SoftmaxScale()) * math.Sqrt(float64(d)))
	for i, p := range m.Params() {
		q := plain.Params()[i]
		dst, src := q.Float32s(), p.Float32s()
		copy(dst, src)
		mult := func(lo, hi int, f float32) {
			for j := lo; j < hi; j++ {
				dst[j] = src[j] * f
			}
		}
		switch {
		case strings.HasSuffix(p.Name, "linear_qkv.weight"), strings.HasSuffix(p.Name, "linear_qkv.bias"):
			cols := p.Numel() / p.Dim(0)
			for g := 0; g < c.NumQueryGroups; g++ { // per group [q (r·d); k (d); v (d)]
				r := c.NumAttentionHeads / c.NumQueryGroups
				row := g * (r + 2) * d
				mult(row*cols, (row+r*d)*cols, qMult)
			}
		case p.Name == "output_layer.weight":
			mult(0, len(src), float32(c.LogitMult()))
		case strings.HasPrefix(p.Name, "embedding."):
			mult(0, len(src), float32(c.EmbeddingMult()))
		}
	}
	toks, labels := make([]int32, 2*16), make([]int32, 2*16)
	mask := make([]float32, 2*16)
	for i := range toks {
		toks[i], labels[i], mask[i] = int32((i*7+3)%64), int32((i*5+1)%64), 1
	}
	bt := Batch{Tokens: tensor.FromInt32(toks, 2, 16), Labels: tensor.FromInt32(labels, 2, 16), LossMask: tensor.FromFloat32(mask, 2, 16)}
	loss := func(m *Model) float64 {
		tp := tensor.NewTape()
		return float64(m.Loss(tp, m.Forward(tp, bt, nil, false), bt).Float32s()[0])
	}
	got, want := loss(m), loss(plain)
	t.Logf("muP loss %.6f, reparametrised plain model %.6f", got, want)
	if !relClose(got, want, 2e-6) {
		t.Fatalf("muP loss %v, the reparametrised plain model's %v", got, want)
	}
	for i, p := range m.Params() { // the same weights without muP
		copy(plain.Params()[i].Float32s(), p.Float32s())
	}
	if off := loss(plain); relClose(off, got, 1e-3) {
		t.Fatalf("loss without muP %v equals muP's %v: muP changed nothing", off, got)
	}
}

// TestMuPRefusals: what muP does not cover here is refused, naming the flag.
func TestMuPRefusals(t *testing.T) {
	base := Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, VocabSize: 64, MaxPositionEmbeddings: 16}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.MuP.OutputMult = 0.5 }, "--mup-output-mult=0.5 without --use-mup"},
		{func(c *Config) { c.MuP.BaseHiddenSize = 16 }, "without --use-mup"},
		{func(c *Config) { c.MuP = MuPConfig{Enabled: true, BaseHiddenSize: -1} }, "--mup-base-hidden-size=-1"},
		{func(c *Config) { c.MuP.Enabled = true; c.MoE = MoEConfig{NumExperts: 2, TopK: 1} }, "--use-mup with MoE"},
	} {
		c := base
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", c.MuP, err, tc.want)
		}
	}
	c := base
	c.MuP.Enabled = true
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckDecode(); err == nil || !strings.Contains(err.Error(), "--use-mup") {
		t.Fatalf("decoding a muP model: %v", err)
	}
}
