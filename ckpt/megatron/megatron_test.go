package megatron

import (
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/torchpt"
	"github.com/gotron/gotron/internal/meminfo"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// The fixtures are tools/golden/megatron_ckpt.py's: Megatron-layout
// checkpoints and the logits of a float64 PyTorch forward written from the
// unsharded weights.
var fixtures = []string{"llama_tp2_pp2", "gpt_tp2_pp2_vp2", "gpt_tp2", "gpt_tp2_pp2_distopt"}

// mlaFixtures are tools/golden/megatron_mla_ckpt.py's: multi-latent
// attention models (weights only, no optimizer state) and the logits of
// tools/golden/mla.py's float64 forward.
var mlaFixtures = []string{"mla_tp2_pp2_te", "mla_tp2_local"}

// logitTol bounds |gotron − reference| / max(1, |reference|) per logit.
const logitTol = 1e-5

type golden struct {
	Tokens   []int32     `json:"tokens"`
	Padded   int         `json:"padded_vocab_size"`
	Logits   [][]float64 `json:"logits"`
	LogProbs []float64   `json:"logprobs"`
}

func readGolden(t *testing.T, name string) golden {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name, "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

func logits(m *gpt.Model, ids []int32) []float32 {
	return m.Forward(tensor.NewTape(), gpt.Batch{Tokens: tensor.FromInt32(ids, 1, len(ids))}, nil, false).Float32s()
}

// worstError is the largest relative logit error against the reference.
func worstError(got []float32, g golden) float64 {
	worst := 0.0
	for i, row := range g.Logits {
		for j, want := range row {
			e := math.Abs(float64(got[i*g.Padded+j])-want) / math.Max(1, math.Abs(want))
			worst = math.Max(worst, e)
		}
	}
	return worst
}

func TestImportMatchesPyTorch(t *testing.T) {
	for _, name := range append(slices.Clip(fixtures), mlaFixtures...) {
		t.Run(name, func(t *testing.T) {
			m, info, err := Load(filepath.Join("testdata", name), Options{})
			if err != nil {
				t.Fatal(err)
			}
			g := readGolden(t, name)
			if m.Config.VocabSize != g.Padded {
				t.Fatalf("vocab %d, want the padded %d", m.Config.VocabSize, g.Padded)
			}
			got := logits(m, g.Tokens)
			if w := worstError(got, g); w > logitTol {
				t.Errorf("max relative logit error %.3g > %g", w, logitTol)
			} else {
				t.Logf("max relative logit error %.3g (TP=%d PP=%d VP=%d, %s weights)", w, info.TP, info.PP, info.VP, info.DType)
			}
			// Per-token log-probabilities over the padded vocabulary (float64 log-softmax).
			V := g.Padded
			for i, want := range g.LogProbs {
				row := got[i*V : (i+1)*V]
				mx := math.Inf(-1)
				for _, x := range row {
					mx = math.Max(mx, float64(x))
				}
				s := 0.0
				for _, x := range row {
					s += math.Exp(float64(x) - mx)
				}
				lp := float64(row[g.Tokens[i+1]]) - mx - math.Log(s)
				if math.Abs(lp-want) > logitTol*math.Max(1, math.Abs(want)) {
					t.Errorf("log p(token %d) = %.8f, want %.8f", i+1, lp, want)
				}
			}
		})
	}
	// The GPT weights saved at TP=2 PP=2 VP=2 and at TP=2 alone import to
	// the same model.
	a, _, err := Load("testdata/gpt_tp2_pp2_vp2", Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := Load("testdata/gpt_tp2", Options{})
	if err != nil {
		t.Fatal(err)
	}
	pb := map[string][]float32{}
	for _, p := range b.Params() {
		pb[p.Name] = p.Float32s()
	}
	for _, p := range a.Params() {
		q := pb[p.Name]
		for i, x := range p.Float32s() {
			if q[i] != x {
				t.Fatalf("%s[%d]: %g (TP2 PP2 VP2) != %g (TP2)", p.Name, i, x, q[i])
			}
		}
	}
}

// TestWrongMergesAreCaught: the logit comparison fails when the shards are
// merged the ways converters get wrong (so it does check the merge).
func TestWrongMergesAreCaught(t *testing.T) {
	cases := []struct {
		fixture, name string
		mutate        func(s *source) bool
	}{
		{"llama_tp2_pp2", "SwiGLU fc1 ranks concatenated as they are ([gate_0; up_0; gate_1; up_1])", func(s *source) bool {
			if s.how == glu {
				s.how = rows
				return true
			}
			return false
		}},
		{"llama_tp2_pp2", "QKV query groups in the wrong rank order", func(s *source) bool {
			if strings.HasSuffix(s.name, "linear_qkv.weight") {
				s.slices[0], s.slices[1] = s.slices[1], s.slices[0]
				return true
			}
			return false
		}},
		{"llama_tp2_pp2", "input and pre-MLP norms swapped (TE fused names)", func(s *source) bool {
			switch {
			case strings.HasSuffix(s.name, "input_layernorm.weight"):
				s.name = strings.Replace(s.name, "input_layernorm", "pre_mlp_layernorm", 1)
			case strings.HasSuffix(s.name, "pre_mlp_layernorm.weight"):
				s.name = strings.Replace(s.name, "pre_mlp_layernorm", "input_layernorm", 1)
			default:
				return false
			}
			return true
		}},
		{"gpt_tp2_pp2_vp2", "layers in pipeline-major order (ignoring virtual stages)", func(s *source) bool {
			// Megatron's order puts chunk (v=0,p=1) second: layer 1. Swap layers 1 and 2.
			for _, pair := range [][2]string{{"decoder.layers.1.", "decoder.layers.2."}, {"decoder.layers.2.", "decoder.layers.1."}} {
				if strings.HasPrefix(s.name, pair[0]) {
					s.name = pair[1] + strings.TrimPrefix(s.name, pair[0])
					return true
				}
			}
			return false
		}},
		{"gpt_tp2", "row-parallel linear_proj column blocks in the wrong rank order", func(s *source) bool {
			if strings.HasSuffix(s.name, "linear_proj.weight") {
				s.slices[0], s.slices[1] = s.slices[1], s.slices[0]
				return true
			}
			return false
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ck, err := Open(filepath.Join("testdata", c.fixture))
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			cfg, dv, err := ck.args.config()
			if err != nil {
				t.Fatal(err)
			}
			plan, _, err := ck.plan(cfg, dv)
			if err != nil {
				t.Fatal(err)
			}
			changed := 0
			for _, s := range plan {
				if c.mutate(s) {
					changed++
				}
			}
			if changed == 0 {
				t.Fatal("the mutation changed nothing")
			}
			m, err := gpt.New(cfg, tensor.NewRNG(0))
			if err != nil {
				t.Fatal(err)
			}
			params := map[string]*tensor.Tensor{}
			for _, p := range m.Params() {
				params[p.Name] = p
			}
			for _, s := range plan {
				if err := s.fill(params[s.name]); err != nil {
					t.Fatal(err)
				}
			}
			g := readGolden(t, c.fixture)
			w := worstError(logits(m, g.Tokens), g)
			if w < 100*logitTol {
				t.Fatalf("a wrong merge gives logits within %.3g of the reference: the test would not notice it", w)
			}
			t.Logf("wrong merge: max relative logit error %.3g", w)
		})
	}
}

// copyFixture copies a fixture directory into a temporary one.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), name)
	src := filepath.Join("testdata", name)
	err := filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if fi.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(filepath.Join(dst, rel))
		if err != nil {
			return err
		}
		_, err = io.Copy(out, in)
		out.Close()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestLayoutErrors(t *testing.T) {
	rank := func(dir, r string) string {
		return filepath.Join(dir, "iter_0001200", r, FileName)
	}
	cases := []struct {
		name  string
		edit  func(t *testing.T, dir string) (load string)
		wants []string // substrings of the error; "{dir}" is replaced by the copy's path
	}{
		{"missing rank directory", func(t *testing.T, dir string) string {
			os.RemoveAll(filepath.Join(dir, "iter_0001200", "mp_rank_01_000"))
			return dir
		}, []string{"{dir}/iter_0001200/mp_rank_01_000/model_optim_rng.pt is missing", "tensor_model_parallel_size=2, pipeline_model_parallel_size=2"}},
		{"extra rank directory", func(t *testing.T, dir string) string {
			os.MkdirAll(filepath.Join(dir, "iter_0001200", "mp_rank_02_000"), 0o755)
			return dir
		}, []string{"unexpected rank directory mp_rank_02_000"}},
		{"truncated file", func(t *testing.T, dir string) string {
			p := rank(dir, "mp_rank_01_001")
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b[:len(b)/3], 0o644)
			return dir
		}, []string{"{dir}/iter_0001200/mp_rank_01_001/model_optim_rng.pt", "not a valid zip archive"}},
		{"not a zip file", func(t *testing.T, dir string) string {
			os.WriteFile(rank(dir, "mp_rank_00_001"), []byte("not a checkpoint\n"), 0o644)
			return dir
		}, []string{"{dir}/iter_0001200/mp_rank_00_001/model_optim_rng.pt", "not a PyTorch checkpoint"}},
		{"tracker names a missing iteration", func(t *testing.T, dir string) string {
			os.WriteFile(filepath.Join(dir, TrackerFile), []byte("7"), 0o644)
			return dir
		}, []string{"iter_0000007"}},
		{"garbage tracker", func(t *testing.T, dir string) string {
			os.WriteFile(filepath.Join(dir, TrackerFile), []byte("latest"), 0o644)
			return dir
		}, []string{"want an iteration number or release"}},
		{"no tracker", func(t *testing.T, dir string) string {
			os.Remove(filepath.Join(dir, TrackerFile))
			return dir
		}, []string{"has no latest_checkpointed_iteration.txt (iterations iter_0001200)"}},
		{"iteration directory as --load", func(t *testing.T, dir string) string {
			return filepath.Join(dir, "iter_0001200") // accepted: checked below
		}, nil},
		{"distributed checkpoint", func(t *testing.T, dir string) string {
			os.WriteFile(filepath.Join(dir, "iter_0001200", ".metadata"), nil, 0o644)
			return dir
		}, []string{"distributed checkpoint", "--ckpt-convert-format torch"}},
		{"not a checkpoint", func(t *testing.T, dir string) string {
			return t.TempDir()
		}, []string{"not a Megatron checkpoint"}},
		{"files of different saves", func(t *testing.T, dir string) string {
			other := copyFixture(t, "gpt_tp2_pp2_vp2")
			b, _ := os.ReadFile(filepath.Join(other, "iter_0000030", "mp_rank_01_001", FileName))
			os.WriteFile(rank(dir, "mp_rank_01_001"), b, 0o644)
			return dir
		}, []string{"{dir}/iter_0001200/mp_rank_01_001/model_optim_rng.pt is at iteration 30"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyFixture(t, "llama_tp2_pp2")
			load := c.edit(t, dir)
			_, _, err := Load(load, Options{})
			if c.wants == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("Load succeeded")
			}
			for _, w := range c.wants {
				if w = strings.ReplaceAll(w, "{dir}", dir); !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v\nwant it to mention %q", err, w)
				}
			}
		})
	}
}

// TestArgs: the configuration follows the args, and what gotron cannot
// represent is refused naming the argument.
func TestArgs(t *testing.T) {
	open := func(t *testing.T, name string) *Checkpoint {
		c, err := Open(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	refused := []struct {
		arg  string
		val  any
		want string
	}{
		// MoE args over a dense model's files: the files do not match
		{"num_experts", int64(8), "decoder.layers.0.mlp.linear_fc1.weight is not part of the model the args describe (RMSNorm, swiglu, rope positions, biases false, tied output false, 8 experts in 4 of 4 layers)"},
		{"multi_latent_attention", true, "--group-query-attention (--num-query-groups=2) with --multi-latent-attention"},
		{"qk_layernorm", true, "args.qk_layernorm=true: QK layer norm"},
		{"use_rope_scaling", true, "args.use_rope_scaling=true"},
		{"rotary_seq_len_interpolation_factor", int64(4), "args.rotary_seq_len_interpolation_factor=4"},
		{"window_size", nil, ""}, // None: fine
		{"squared_relu", true, "args.squared_relu=true with args.swiglu=true"},
		{"normalization", "LayerNorm1P", `args.normalization=LayerNorm1P: want LayerNorm or RMSNorm`},
		{"position_embedding_type", "yarn", "args.position_embedding_type=yarn"},
		{"apply_residual_connection_post_layernorm", true, "post-norm"},
		{"softmax_scale", 0.125, "args.softmax_scale=0.125: gotron scales attention by 1/sqrt(kv_channels) = 0.5"},
		{"softmax_scale", 0.5, ""}, // 1/sqrt(4): the same
		{"expert_model_parallel_size", int64(2), "args.expert_model_parallel_size=2"},
		{"num_layers", "four", "args.num_layers=four is a string, want an int"},
		{"hidden_size", nil, "args has no hidden_size"},
		{"num_query_groups", int64(3), "not divisible"},
		{"swiglu", false, "do not form decoder.layers.0.mlp.linear_fc1.weight [32 16]"},
		{"add_bias_linear", true, "needs decoder.layers.0.mlp.linear_fc1.bias"},
		{"num_layers", int64(6), "args.num_layers=6, but the rank files hold 4 layers"},
		{"padded_vocab_size", int64(256), "do not form embedding.word_embeddings.weight [256 16]"},
	}
	for _, r := range refused {
		t.Run(r.arg, func(t *testing.T) {
			c := open(t, "llama_tp2_pp2")
			if err := c.args.d.Set(r.arg, r.val); err != nil {
				t.Fatal(err)
			}
			_, _, err := c.Model(Options{})
			if r.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), r.want) {
				t.Fatalf("err = %v\nwant it to mention %q", err, r.want)
			}
			if !strings.Contains(err.Error(), "mp_rank_00_000/model_optim_rng.pt") {
				t.Errorf("err = %v: does not name the file", err)
			}
		})
	}

	// Multi-latent attention: what gotron's MLA cannot represent is refused
	// naming the argument or the tensor.
	mla := []struct {
		arg  string
		val  any
		want string
	}{
		// without --qk-layernorm Megatron's MLA has no latent norms: the
		// checkpoint's are tensors the args do not describe
		{"qk_layernorm", false, "linear_q_up_proj.layer_norm_weight is not part of the model the args describe"},
		{"mla_down_proj_fusion", true, "args.mla_down_proj_fusion=true: the fused query/key-value down-projection"},
		{"rope_type", "ntk", `args.rope_type="ntk"`},
		{"q_lora_rank", nil, "linear_q_down_proj.weight is not part of the model the args describe (LayerNorm, gelu_tanh, learned_absolute positions, biases true, tied output true, no experts, multi-latent attention (q_lora_rank 0, kv_lora_rank 10))"},
		{"kv_lora_rank", int64(9), "do not form decoder.layers.0.self_attention.linear_kv_down_proj.weight [13 32]"},
		{"q_lora_rank", int64(-1), "args.q_lora_rank=-1: want a positive size"},
		{"rotary_scaling_factor", "big", "args.rotary_scaling_factor=big is a string, want a number"},
		{"experimental_attention_variant", "dsa", "args.experimental_attention_variant=dsa"},
	}
	for _, r := range mla {
		t.Run("mla "+r.arg, func(t *testing.T) {
			c := open(t, "mla_tp2_pp2_te")
			if err := c.args.d.Set(r.arg, r.val); err != nil {
				t.Fatal(err)
			}
			_, _, err := c.Model(Options{})
			if err == nil || !strings.Contains(err.Error(), r.want) {
				t.Fatalf("err = %v\nwant it to mention %q", err, r.want)
			}
			if !strings.Contains(err.Error(), "mp_rank_00_000/model_optim_rng.pt") {
				t.Errorf("err = %v: does not name the file", err)
			}
		})
	}
	t.Run("mla config", func(t *testing.T) {
		m, _, err := open(t, "mla_tp2_pp2_te").Model(Options{})
		if err != nil {
			t.Fatal(err)
		}
		want := gpt.MLAConfig{Enabled: true, QLoraRank: 12, KVLoraRank: 10, QKHeadDim: 6, QKPosEmbHeadDim: 4, VHeadDim: 5,
			ScalingFactor: 40, Mscale: 0.707, MscaleAllDim: 0.707, OriginalMaxPositions: 4096, BetaFast: 32, BetaSlow: 1}
		if m.Config.MLA != want || !m.Config.QKLayerNorm {
			t.Errorf("MLA %+v (qk layer norm %v), want %+v", m.Config.MLA, m.Config.QKLayerNorm, want)
		}
	})

	// Tied weights: a pipeline-parallel checkpoint's last stage holds a copy
	// of the embeddings as output_layer.weight; one that differs is
	// reported. Without pipeline parallelism a tied model has no output
	// layer, and untied one needs it.
	t.Run("tied copy", func(t *testing.T) {
		c := open(t, "llama_tp2_pp2")
		c.args.d.Set("untie_embeddings_and_output_weights", false)
		_, info, err := c.Model(Options{})
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Warnings) != 1 || !strings.Contains(info.Warnings[0], "output_layer.weight differs from the word embeddings") {
			t.Errorf("warnings %q", info.Warnings)
		}
		_, info, err = Load("testdata/gpt_tp2_pp2_vp2", Options{}) // a true copy
		if err != nil || strings.Contains(strings.Join(info.Warnings, ""), "tied") {
			t.Errorf("%v, warnings %q", err, info.Warnings)
		}
		c = open(t, "gpt_tp2")
		c.args.d.Set("untie_embeddings_and_output_weights", true)
		if _, _, err := c.Model(Options{}); err == nil || !strings.Contains(err.Error(), "needs output_layer.weight") || !strings.Contains(err.Error(), "mp_rank_00/model_optim_rng.pt") {
			t.Errorf("untied without an output layer: %v", err)
		}
	})

	// --squared-relu: the MLP's weights are a GELU MLP's; only the
	// activation changes.
	t.Run("squared_relu", func(t *testing.T) {
		c := open(t, "gpt_tp2")
		c.args.d.Set("squared_relu", true)
		m, _, err := c.Model(Options{})
		if err != nil {
			t.Fatal(err)
		}
		if m.Config.Activation != gpt.SquaredReLU {
			t.Fatalf("activation %v, want squared_relu", m.Config.Activation)
		}
	})

	// Older and newer names of renamed flags.
	t.Run("disable_bias_linear", func(t *testing.T) {
		c := open(t, "llama_tp2_pp2")
		c.args.d.Set("add_bias_linear", nil)
		c.args.d.Set("disable_bias_linear", true)
		if _, _, err := c.Model(Options{}); err != nil {
			t.Fatal(err)
		}
		c.args.d.Set("disable_bias_linear", false)
		if _, _, err := c.Model(Options{}); err == nil || !strings.Contains(err.Error(), "linear_proj.bias") {
			t.Fatalf("disable_bias_linear=False on a bias-free checkpoint: %v", err)
		}
	})
	t.Run("norm epsilon names", func(t *testing.T) {
		for _, name := range []string{"norm_epsilon", "layernorm_epsilon"} {
			c := open(t, "llama_tp2_pp2")
			c.args.d.Set("layernorm_epsilon", nil)
			c.args.d.Set(name, 1e-6)
			m, _, err := c.Model(Options{})
			if err != nil {
				t.Fatal(err)
			}
			if m.Config.NormEpsilon != 1e-6 {
				t.Errorf("%s: NormEpsilon %g", name, m.Config.NormEpsilon)
			}
		}
	})
	// --apply-layernorm-1p (layernorm_zero_centered_gamma): norms store w, scale by 1 + w.
	t.Run("zero-centred gamma", func(t *testing.T) {
		plain, _, err := Load("testdata/gpt_tp2", Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"apply_layernorm_1p", "layernorm_zero_centered_gamma"} {
			c := open(t, "gpt_tp2")
			c.args.d.Set(name, true)
			m, _, err := c.Model(Options{})
			if err != nil {
				t.Fatal(err)
			}
			want := map[string][]float32{}
			for _, p := range plain.Params() {
				want[p.Name] = p.Float32s()
			}
			for _, p := range m.Params() {
				norm := strings.HasSuffix(p.Name, "layernorm.weight")
				for i, x := range p.Float32s() {
					w := want[p.Name][i]
					if norm {
						w++
					}
					if x != w {
						t.Fatalf("%s: %s[%d] = %g, want %g", name, p.Name, i, x, w)
					}
				}
			}
		}
	})
	t.Run("older position flags", func(t *testing.T) {
		c := open(t, "llama_tp2_pp2")
		c.args.d.Set("position_embedding_type", nil)
		c.args.d.Set("use_rotary_position_embeddings", true)
		m, _, err := c.Model(Options{})
		if err != nil || m.Config.PositionEmbeddingType != gpt.RoPE {
			t.Fatalf("use_rotary_position_embeddings: %v %v", err, m)
		}
	})
	t.Run("group_query_attention off ignores num_query_groups", func(t *testing.T) {
		c := open(t, "gpt_tp2") // args: num_query_groups=1, group_query_attention=False
		m, _, err := c.Model(Options{})
		if err != nil || m.Config.NumQueryGroups != 4 {
			t.Fatalf("%v, groups %d", err, m.Config.NumQueryGroups)
		}
	})
	t.Run("unknown parameter", func(t *testing.T) {
		c := open(t, "llama_tp2_pp2")
		for _, row := range c.files {
			sd, _ := stateDict(row[1])
			md, _ := sd.Get("model")
			w, _ := md.(*torchpt.Dict).Get("decoder.layers.0.mlp.linear_fc2.weight")
			md.(*torchpt.Dict).Set("decoder.layers.0.mlp.router.weight", w)
		}
		_, _, err := c.Model(Options{})
		if err == nil || !strings.Contains(err.Error(), "decoder.layers.0.mlp.router.weight is not part of the model the args describe") || !strings.Contains(err.Error(), "mp_rank_00_001") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("memory", func(t *testing.T) {
		c := open(t, "llama_tp2_pp2")
		_, _, err := c.Model(Options{machine: func() (meminfo.Info, bool) {
			return meminfo.Info{TotalBytes: 1000, AvailableBytes: 1000}, true
		}})
		if err == nil || !strings.Contains(err.Error(), "needs at least") {
			t.Fatalf("err = %v", err)
		}
	})
}

// TestOptimizerReported: Info says whether optimizer state was present
// (every fixture has some); without it Import imports the weights alone,
// with no warning.
func TestOptimizerReported(t *testing.T) {
	for _, name := range fixtures {
		_, info, err := Load(filepath.Join("testdata", name), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if !info.Optimizer || info.Iteration == 0 {
			t.Errorf("%s: Optimizer %v, iteration %d", name, info.Optimizer, info.Iteration)
		}
	}
	c, err := Open("testdata/gpt_tp2")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Optimizer = false // as Open finds a checkpoint saved with --no-save-optim
	m, st, info, err := c.Import(Options{})
	if err != nil || m == nil || st != nil || strings.Contains(strings.Join(info.Warnings, "\n"), "optimizer") {
		t.Fatalf("err %v, state %v, warnings %q", err, st != nil, info.Warnings)
	}
}

func TestCopyTokenizer(t *testing.T) {
	src := t.TempDir()
	for _, n := range []string{"gpt2-vocab.json", "gpt2-merges.txt", "tok.model", "hf/tokenizer.json", "hf/tokenizer_config.json"} {
		os.MkdirAll(filepath.Dir(filepath.Join(src, n)), 0o755)
		os.WriteFile(filepath.Join(src, n), []byte(n), 0o644)
	}
	cases := []struct {
		info    Info
		copied  []string
		missing []string
	}{
		{Info{TokenizerType: "GPT2BPETokenizer", VocabFile: filepath.Join(src, "gpt2-vocab.json"), MergeFile: filepath.Join(src, "gpt2-merges.txt")}, []string{"vocab.json", "merges.txt"}, nil},
		{Info{TokenizerType: "GPT2BPETokenizer", VocabFile: filepath.Join(src, "gpt2-vocab.json"), MergeFile: "/elsewhere/merges.txt"}, nil, []string{"/elsewhere/merges.txt"}},
		{Info{TokenizerType: "Llama2Tokenizer", TokenizerModel: filepath.Join(src, "tok.model")}, []string{"tokenizer.model"}, nil},
		{Info{TokenizerType: "HuggingFaceTokenizer", TokenizerModel: filepath.Join(src, "hf")}, []string{"tokenizer.json", "tokenizer_config.json"}, nil},
		{Info{TokenizerType: "HuggingFaceTokenizer", TokenizerModel: "meta-llama/Llama-2-7b-hf"}, nil, []string{"meta-llama/Llama-2-7b-hf"}},
		{Info{TokenizerType: "NullTokenizer"}, nil, nil},
	}
	for i, c := range cases {
		dst := filepath.Join(t.TempDir(), "tokenizer")
		copied, missing, err := CopyTokenizer(c.info, dst)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(copied, ",") != strings.Join(c.copied, ",") || strings.Join(missing, ",") != strings.Join(c.missing, ",") {
			t.Errorf("case %d: copied %v missing %v, want %v %v", i, copied, missing, c.copied, c.missing)
		}
		for _, n := range copied {
			if _, err := os.Stat(filepath.Join(dst, n)); err != nil {
				t.Errorf("case %d: %v", i, err)
			}
		}
		if len(copied) == 0 {
			if _, err := os.Stat(dst); err == nil {
				t.Errorf("case %d: %s created with nothing copied", i, dst)
			}
		}
	}
}
