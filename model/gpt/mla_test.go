package gpt

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// mlaGoldenConfig mirrors tools/golden/mla.py's CONFIGS entries.
type mlaGoldenConfig struct {
	Layers, Hidden, Heads, FFN, Vocab, Seq, Batch int
	Pos                                           string
	Norm                                          Normalization
	Act                                           Activation
	Bias, Tied                                    bool
	Eps                                           float32
	QLoraRank                                     *int    `json:"q_lora_rank"`
	KVLoraRank                                    int     `json:"kv_lora_rank"`
	QKHeadDim                                     int     `json:"qk_head_dim"`
	QKPosEmbHeadDim                               int     `json:"qk_pos_emb_head_dim"`
	VHeadDim                                      int     `json:"v_head_dim"`
	RotaryBase                                    float64 `json:"rotary_base"`
	ScalingFactor                                 float64 `json:"rotary_scaling_factor"`
	OriginalMaxPositions                          int     `json:"original_max_position_embeddings"`
	BetaFast                                      float64 `json:"beta_fast"`
	BetaSlow                                      float64 `json:"beta_slow"`
	Mscale                                        float64
	MscaleAllDim                                  float64 `json:"mscale_all_dim"`
	QKLayerNorm                                   bool    `json:"qk_layernorm"`
}

func (c mlaGoldenConfig) model(t *testing.T) Config {
	t.Helper()
	pos := NoPositionEmbedding
	if c.Pos == "learned_absolute" {
		pos = LearnedAbsolute
	}
	mla := MLAConfig{Enabled: true, KVLoraRank: c.KVLoraRank, QKHeadDim: c.QKHeadDim, QKPosEmbHeadDim: c.QKPosEmbHeadDim,
		VHeadDim: c.VHeadDim, ScalingFactor: c.ScalingFactor, Mscale: c.Mscale, MscaleAllDim: c.MscaleAllDim,
		OriginalMaxPositions: c.OriginalMaxPositions, BetaFast: c.BetaFast, BetaSlow: c.BetaSlow}
	if c.QLoraRank != nil {
		mla.QLoraRank = *c.QLoraRank
	}
	return Config{NumLayers: c.Layers, HiddenSize: c.Hidden, NumAttentionHeads: c.Heads, FFNHiddenSize: c.FFN,
		VocabSize: c.Vocab, MaxPositionEmbeddings: c.Seq, PositionEmbeddingType: pos, Normalization: c.Norm,
		NormEpsilon: c.Eps, Activation: c.Act, DisableBiasLinear: !c.Bias, UntieEmbeddingsAndOutputWeights: !c.Tied,
		RotaryBase: c.RotaryBase, QKLayerNorm: c.QKLayerNorm, MLA: mla}
}

// newMLAGoldenModel builds tools/golden/mla.py's model name with the
// golden's initial values and its batch.
func newMLAGoldenModel(t *testing.T, name string) (*Model, Batch, golden) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var fix struct{ Config mlaGoldenConfig }
	if err := json.Unmarshal(raw, &fix); err != nil {
		t.Fatalf("%s.json: %v", name, err)
	}
	g := loadGolden(t, name)
	cfg := fix.Config.model(t)
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
	b, T := fix.Config.Batch, fix.Config.Seq
	bt := Batch{Tokens: g.i32(t, "tokens", b, T), Labels: g.i32(t, "labels", b, T),
		LossMask: tensor.FromFloat32(g.f32(t, "loss_mask"), b, T)}
	return m, bt, g
}

// TestMLAGoldenForwardBackward checks multi-latent attention against
// tools/golden/mla.py's PyTorch model written after Megatron's
// MLASelfAttention: logits, loss and every parameter's gradient, with and
// without --q-lora-rank, YaRN on, v narrower and wider than the q/k heads,
// and without --qk-layernorm (mla_no_qk_norm: no latent norms, Megatron's
// IdentityOp).
func TestMLAGoldenForwardBackward(t *testing.T) {
	for _, name := range []string{"mla_qlora", "mla_plain_q", "mla_no_qk_norm"} {
		t.Run(name, func(t *testing.T) {
			m, bt, g := newMLAGoldenModel(t, name)
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

// TestMLARecompute: selective recomputation (the attention core) and full
// recomputation (whole layers) of MLA layers give the golden's loss and
// gradients.
func TestMLARecompute(t *testing.T) {
	for _, r := range []Recompute{{Selective: true}, {Full: true, Method: "uniform", NumLayers: 2}} {
		m, bt, g := newMLAGoldenModel(t, "mla_qlora")
		m.Recompute = r
		tp := tensor.NewTape()
		loss := m.Loss(tp, m.Forward(tp, bt, nil, true), bt)
		closeTo(t, fmt.Sprintf("%+v loss", r), loss.Float32s(), g.f32(t, "loss"), 1e-5)
		if err := tp.Backward(loss); err != nil {
			t.Fatal(err)
		}
		for _, p := range m.Params() {
			closeTo(t, fmt.Sprintf("%+v grad of %s", r, p.Name), p.Grad.Float32s(), g.f32(t, "grad/"+p.Name), 1e-4)
		}
	}
}

func TestMLAConfigErrors(t *testing.T) {
	base := func() Config {
		c := Config{NumLayers: 1, HiddenSize: 16, NumAttentionHeads: 2, VocabSize: 8, MaxPositionEmbeddings: 8, MLA: DefaultMLA()}
		c.MLA.QKHeadDim, c.MLA.QKPosEmbHeadDim, c.MLA.VHeadDim, c.MLA.KVLoraRank = 4, 2, 4, 4
		return c
	}
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.MLA.QLoraRank = -1 }, "--q-lora-rank=-1"},
		{func(c *Config) { c.MLA.KVLoraRank = 0 }, "--kv-lora-rank=0"},
		{func(c *Config) { c.MLA.QKPosEmbHeadDim = 3 }, "--qk-pos-emb-head-dim=3"},
		{func(c *Config) { c.MLA.VHeadDim = 0 }, "--v-head-dim=0"},
		{func(c *Config) { c.MLA.ScalingFactor = 0 }, "--rotary-scaling-factor=0"},
		{func(c *Config) { c.MLA.Rope = 9 }, "--rope-type"},
		{func(c *Config) { c.NumQueryGroups = 1 }, "--group-query-attention"},
		{func(c *Config) { c.RotaryInterleaved = true }, "--rotary-interleaved"},
		{func(c *Config) { c.RotaryPercent = 0.5 }, "--rotary-percent=0.5"},
		{func(c *Config) { c.MLA.Enabled = false }, "without --multi-latent-attention"},
		{func(c *Config) { c.AttentionOutputGate = true }, "--attention-output-gate"},
	} {
		c := base()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate: %v, want an error naming %q", err, tc.want)
		}
	}
	c := base()
	if err := c.Validate(); err != nil {
		t.Fatalf("valid MLA config: %v", err)
	}
}

// TestMLADecodeMatchesFullForward: an MLA model decodes with its per-head
// keys (the shared rotary key in each) and values in the KV cache, or with
// its latents cached (CacheMLALatents: the up-projection absorbed): the
// logits of every step — a prefill of 3 tokens, then one token at a time,
// and DecodeBatch's chunks of several rows — equal the full forward's at
// the same positions within float32 rounding, with --q-lora-rank (v
// narrower than the heads, YaRN factor 40, mscale_all_dim in the scale) and
// without (v wider, padded q and k).
func TestMLADecodeMatchesFullForward(t *testing.T) {
	for _, tc := range []struct {
		name    string
		latents bool
	}{{"mla_qlora", false}, {"mla_plain_q", false}, {"mla_qlora", true}, {"mla_plain_q", true}} {
		t.Run(fmt.Sprintf("%s/latents=%v", tc.name, tc.latents), func(t *testing.T) {
			m, bt, _ := newMLAGoldenModel(t, tc.name)
			m.CacheMLALatents = tc.latents
			V, T := m.Config.VocabSize, bt.Tokens.Dim(1)
			tokens := bt.Tokens.Int32s()[:T]
			full := m.Forward(nil, Batch{Tokens: tensor.FromInt32(slices.Clone(tokens), 1, T)}, nil, false).Float32s()
			close := func(what string, pos int, got []float32) {
				t.Helper()
				want := full[pos*V : (pos+1)*V]
				for i := range want {
					if math.Abs(float64(got[i]-want[i])) > 1e-4*math.Max(1, math.Abs(float64(want[i]))) {
						t.Fatalf("%s: position %d logit %d: decode %v, full forward %v", what, pos, i, got[i], want[i])
					}
				}
			}
			kv := m.NewKVCache(T)
			got, err := m.Decode(kv, tokens[:3])
			if err != nil {
				t.Fatal(err)
			}
			close("prefill", 2, got)
			for p := 3; p < T; p++ {
				if got, err = m.Decode(kv, tokens[p:p+1]); err != nil {
					t.Fatal(err)
				}
				close("decode", p, got)
			}
			// DecodeBatch: chunks asking for every row's logits
			batched := m.NewKVCache(T)
			var buf DecodeBuffers
			p := 0
			for _, n := range []int{2, 1, 3, 2} {
				pos, rows := make([]int32, n), make([]int, n)
				for i := range n {
					pos[i], rows[i] = int32(p+i), i
				}
				lg, err := m.DecodeBatch(&buf, tokens[p:p+n], pos, &cacheAttender{kv: batched, p0: p}, rows, nil)
				if err != nil {
					t.Fatal(err)
				}
				batched.Len += n
				for i := range n {
					close(fmt.Sprintf("chunk of %d row %d", n, i), p+i, lg.Float32s()[i*V:(i+1)*V])
				}
				p += n
			}
			if _, err := m.Decode(kv, tokens[:1]); err == nil {
				t.Fatal("decode past the cache size did not fail")
			}
			c := m.Config.MLA
			want := int64(2 * m.Config.NumLayers * m.Config.NumAttentionHeads * max(c.QHeadDim(), c.VHeadDim) * 4)
			if tc.latents {
				want = int64(m.Config.NumLayers * (c.KVLoraRank + c.QKPosEmbHeadDim) * 4)
			}
			if got := m.KVBytesPerToken(); got != want {
				t.Errorf("KVBytesPerToken = %d, want %d", got, want)
			}
		})
	}
	m, _, _ := newMLAGoldenModel(t, "mla_qlora")
	if err := m.Config.CheckDeviceEnv(tensor.CUDA, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "not run on a GPU") ||
		!strings.Contains(err.Error(), "GOTRON_CUDA_UNVERIFIED=mla") {
		t.Fatalf("CheckDevice(cuda): %v, want a refusal", err)
	}
}

// TestMLASimDeviceMatchesCPU: an MLA model's training step (dropout,
// document masks, recomputation) on the simulated device gives the CPU's
// loss and gradients bit for bit: its padded heads, shared rotary key and
// YaRN tables run on device storage the model code cannot read.
func TestMLASimDeviceMatchesCPU(t *testing.T) {
	c := gpt2Tiny()
	c.MLA = DefaultMLA()
	c.MLA.QLoraRank, c.MLA.KVLoraRank, c.MLA.QKHeadDim, c.MLA.QKPosEmbHeadDim, c.MLA.VHeadDim = 12, 10, 6, 4, 5
	c.MLA.ScalingFactor, c.MLA.Mscale, c.MLA.MscaleAllDim = 40, 0.707, 0.3
	c, bt := deviceCase(c)
	for _, rc := range deviceRecomputes {
		cl, cg := deviceStep(t, c, bt, tensor.CPU, rc)
		sl, sg := deviceStep(t, c, bt, tensor.Sim, rc)
		sameBits(t, fmt.Sprintf("%+v loss", rc), []float32{sl}, []float32{cl})
		for i := range cg {
			sameBits(t, fmt.Sprintf("%+v gradient %d", rc, i), sg[i], cg[i])
		}
	}
}

// TestMLAPlainRope: --rope-type rope is Megatron's RotaryEmbedding over the
// rope channels (no YaRN blend, no concentration), while the softmax scale
// still takes mscale(--rotary-scaling-factor, --mscale-all-dim) as
// Megatron's MLA does for both rope types. With --mscale-all-dim 0 that
// scale is 1/sqrt(q head dim), and plain rope at factor 40 equals YaRN at
// factor 1 (where YaRN is the plain rotation).
func TestMLAPlainRope(t *testing.T) {
	logits := func(rope RopeType, factor, mscale, mscaleAll float64) []float32 {
		c := gpt2Tiny()
		c.MLA = DefaultMLA()
		c.MLA.QLoraRank, c.MLA.KVLoraRank, c.MLA.QKHeadDim, c.MLA.QKPosEmbHeadDim, c.MLA.VHeadDim = 12, 10, 6, 4, 5
		c.MLA.Rope, c.MLA.ScalingFactor, c.MLA.Mscale, c.MLA.MscaleAllDim = rope, factor, mscale, mscaleAll
		m := stageModel(t, c)
		bt := batches(c, 0, 1)[0]
		return m.Forward(nil, bt, nil, false).Float32s()
	}
	plain := logits(PlainRoPE, 40, 0.707, 0)
	sameBits(t, "plain rope at factor 40 vs YaRN at factor 1", plain, logits(Yarn, 1, 0.707, 0))
	yarn := logits(Yarn, 40, 0.707, 0)
	if slices.Equal(plain, yarn) {
		t.Fatal("YaRN at factor 40 gives plain rope's logits: the blend and concentration did nothing")
	}
	// mscale_all_dim enters the softmax scale for plain rope too
	if slices.Equal(plain, logits(PlainRoPE, 40, 0.707, 0.707)) {
		t.Fatal("--mscale-all-dim did not change plain rope's softmax scale")
	}
}
