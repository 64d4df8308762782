package hf

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/hf/hftest"
	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

func fixtureDir(name string) string { return filepath.Join("testdata", name) }

func forward(m *gpt.Model, ids []int32) []float32 {
	tp := tensor.NewTape()
	return m.Forward(tp, gpt.Batch{Tokens: tensor.FromInt32(ids, 1, len(ids))}, nil, false).Float32s()
}

// TestImportMatchesPyTorch: logits of the imported model equal those of the
// PyTorch HF-layout reference, and the padded vocabulary rows are zero.
func TestImportMatchesPyTorch(t *testing.T) {
	for _, fx := range hftest.Fixtures() {
		t.Run(fx.Name, func(t *testing.T) {
			dir := fixtureDir(fx.Name)
			m, info, err := LoadModel(dir)
			if err != nil {
				t.Fatal(err)
			}
			ids, want := hftest.Golden(t, dir)
			V, Vp := info.VocabSize, m.Config.VocabSize
			if Vp%128 != 0 || Vp < V || len(want) != len(ids)*V {
				t.Fatalf("vocab %d padded %d, golden %d values for %d tokens", V, Vp, len(want), len(ids))
			}
			emb := m.WordEmb.Float32s()
			for i, x := range emb[V*m.Config.HiddenSize:] {
				if x != 0 {
					t.Fatalf("padded embedding value %d = %g, want 0", i, x)
				}
			}
			got := forward(m, ids)
			worst := 0.0
			for p := range ids {
				for v := range V {
					g, w := float64(got[p*Vp+v]), float64(want[p*V+v])
					e := math.Abs(g-w) / math.Max(1, math.Abs(w))
					worst = math.Max(worst, e)
					if e > fx.Tol {
						t.Fatalf("logit[%d][%d] = %g, want %g (rel err %.3g > %g)", p, v, g, w, e, fx.Tol)
					}
				}
			}
			t.Logf("%s: max relative logit error %.3g (tolerance %g)", fx.Name, worst, fx.Tol)
		})
	}
}

func readJSONObject(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := decodeJSONObject(b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestRoundTripInMemory: Import then Export reproduces every tensor byte
// for byte and config.json key for key.
func TestRoundTripInMemory(t *testing.T) {
	for _, fx := range hftest.Fixtures() {
		t.Run(fx.Name, func(t *testing.T) {
			dir := fixtureDir(fx.Name)
			m, info, err := LoadModel(dir)
			if err != nil {
				t.Fatal(err)
			}
			out := t.TempDir()
			if err := Export(context.Background(), out, m, info, ExportOptions{}); err != nil {
				t.Fatal(err)
			}
			CompareHFDirs(t, dir, out)
		})
	}
}

// CompareHFDirs fails unless got holds exactly want's tensors (names, dtypes,
// shapes, bytes) and an equal config.json.
func CompareHFDirs(t *testing.T, want, got string) {
	t.Helper()
	w, g := hftest.Tensors(t, want), hftest.Tensors(t, got)
	if !slices.Equal(sortedKeys(w), sortedKeys(g)) {
		t.Fatalf("tensor names differ:\nwant %v\ngot  %v", sortedKeys(w), sortedKeys(g))
	}
	for n, wt := range w {
		gt := g[n]
		if wt.DType != gt.DType || !reflect.DeepEqual(wt.Shape, gt.Shape) || !bytes.Equal(wt.Data, gt.Data) {
			t.Fatalf("tensor %s: got %s %v, want %s %v (bytes equal: %v)", n, gt.DType, gt.Shape, wt.DType, wt.Shape, bytes.Equal(wt.Data, gt.Data))
		}
	}
	wc, gc := readJSONObject(t, filepath.Join(want, "config.json")), readJSONObject(t, filepath.Join(got, "config.json"))
	if !reflect.DeepEqual(wc, gc) {
		for k := range wc {
			if !reflect.DeepEqual(wc[k], gc[k]) {
				t.Errorf("config.json %s: got %v, want %v", k, gc[k], wc[k])
			}
		}
		for k := range gc {
			if _, ok := wc[k]; !ok {
				t.Errorf("config.json: extra key %s", k)
			}
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for n := range m {
		k = append(k, n)
	}
	slices.Sort(k)
	return k
}

// TestExportWithoutInfo: a model never imported (random init) exports with
// an inferred architecture and a config.json that imports back to the same
// model, for both architectures and every dtype.
func TestExportWithoutInfo(t *testing.T) {
	gpt2 := gpt.Config{NumLayers: 1, HiddenSize: 16, NumAttentionHeads: 2, VocabSize: 128, MaxPositionEmbeddings: 8, Activation: gpt.GELUTanh}
	llama := gpt.Config{NumLayers: 1, HiddenSize: 16, NumAttentionHeads: 4, NumQueryGroups: 2, FFNHiddenSize: 24, VocabSize: 128,
		MaxPositionEmbeddings: 8, PositionEmbeddingType: gpt.RoPE, Normalization: gpt.RMSNorm, Activation: gpt.SwiGLU,
		DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true, RotaryBase: 500000}
	for _, c := range []gpt.Config{gpt2, llama} {
		for _, dt := range []string{"F32", "BF16", "F16"} {
			m, err := gpt.New(c, tensor.NewRNG(7))
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			if err := Export(context.Background(), dir, m, Info{}, ExportOptions{DType: dt}); err != nil {
				t.Fatal(err)
			}
			back, info, err := LoadModel(dir)
			if err != nil {
				t.Fatal(err)
			}
			if info.DType != dt || !sameArch(back.Config, m.Config) {
				t.Fatalf("%s %s: back dtype %s config %+v, want %+v", c.Activation, dt, info.DType, back.Config, m.Config)
			}
			for i, p := range m.Params() {
				q := back.Params()[i]
				for j, x := range p.Float32s() {
					want := roundTo(dt, x)
					if q.Float32s()[j] != want {
						t.Fatalf("%s %s: %s[%d] = %g, want %g", c.Activation, dt, p.Name, j, q.Float32s()[j], want)
					}
				}
			}
		}
	}
}

func roundTo(dt string, x float32) float32 {
	d, _ := safetensors.ParseDType(dt)
	st, _ := safetensors.FromFloat32(d, []int{1}, []float32{x})
	out := make([]float32, 1)
	_ = st.DecodeFloat32(out)
	return out[0]
}

// TestQKVLayout spells out the fused layouts on tiny matrices.
func TestQKVLayout(t *testing.T) {
	// Llama, a=4 heads, g=2 groups (r=2), d=1, h=1: q rows q0..q3, k rows
	// k0,k1, v rows v0,v1 → [q0 q1 k0 v0 | q2 q3 k1 v1].
	q, k, v := []float32{10, 11, 12, 13}, []float32{20, 21}, []float32{30, 31}
	got := make([]float32, 8)
	opLlamaQKV.toGotron(dims{h: 1, a: 4, g: 2, d: 1}, got, [][]float32{q, k, v}, nil)
	if want := []float32{10, 11, 20, 30, 12, 13, 21, 31}; !slices.Equal(got, want) {
		t.Fatalf("llama qkv = %v, want %v", got, want)
	}
	// GPT-2, a=2 heads, d=1, h=2: c_attn (h=2, 3ad=6) columns [q0 q1 k0 k1
	// v0 v1], row i holds input i. gotron rows per head: [q0; k0; v0; q1; k1; v1],
	// each row (h=2) = the column of c_attn.
	cAttn := []float32{
		1, 2, 3, 4, 5, 6, // input 0
		7, 8, 9, 10, 11, 12, // input 1
	}
	got = make([]float32, 12)
	opGPT2QKV.toGotron(dims{h: 2, a: 2, g: 2, d: 1}, got, [][]float32{cAttn}, [][]int{{2, 6}})
	if want := []float32{1, 7, 3, 9, 5, 11, 2, 8, 4, 10, 6, 12}; !slices.Equal(got, want) {
		t.Fatalf("gpt2 qkv = %v, want %v", got, want)
	}
	back := [][]float32{make([]float32, 12)}
	opGPT2QKV.toHF(dims{h: 2, a: 2, g: 2, d: 1}, back, got, [][]int{{2, 6}})
	if !slices.Equal(back[0], cAttn) {
		t.Fatalf("gpt2 qkv back = %v, want %v", back[0], cAttn)
	}
	bias := make([]float32, 6)
	opGPT2QKVBias.toGotron(dims{h: 2, a: 2, g: 2, d: 1}, bias, [][]float32{{1, 2, 3, 4, 5, 6}}, nil)
	if want := []float32{1, 3, 5, 2, 4, 6}; !slices.Equal(bias, want) {
		t.Fatalf("gpt2 qkv bias = %v, want %v", bias, want)
	}
	// SwiGLU: [gate; up].
	fc1 := make([]float32, 4)
	opSwiGLU.toGotron(dims{}, fc1, [][]float32{{1, 2}, {3, 4}}, nil)
	if want := []float32{1, 2, 3, 4}; !slices.Equal(fc1, want) {
		t.Fatalf("fc1 = %v, want %v", fc1, want)
	}
}

// copyFixture copies a fixture directory so a test can damage it.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	dst := t.TempDir()
	ents, err := os.ReadDir(fixtureDir(name))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(fixtureDir(name), e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// editConfig replaces in dir's config.json each old of the old, new pairs
// (the first place it stands, in turn); an old that is not there fails the
// test, since the edit would then test nothing.
func editConfig(t *testing.T, dir string, oldNew ...string) {
	t.Helper()
	if len(oldNew)%2 != 0 {
		t.Fatalf("editConfig: %d strings, want old, new pairs", len(oldNew))
	}
	p := filepath.Join(dir, "config.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(oldNew); i += 2 {
		old, new := []byte(oldNew[i]), []byte(oldNew[i+1])
		if !bytes.Contains(b, old) {
			t.Fatalf("config.json lacks %q", old)
		}
		b = bytes.Replace(b, old, new, 1)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// wantImportError: LoadModel(dir) fails with an error that mentions want.
func wantImportError(t *testing.T, dir, want string) {
	t.Helper()
	_, _, err := LoadModel(dir)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want it to mention %q", err, want)
	}
}

// exportRoundTrip exports m, a model never imported (Info{}: the
// architecture inferred), and imports it back: ArchOf and the import say
// arch, and the config is m's (sameArch and, if not nil, same, the
// architecture's own fields); a second export of the import is
// byte-identical to the first. It returns the imported model.
func exportRoundTrip(t *testing.T, m *gpt.Model, arch string, same func(a, b gpt.Config) bool) *gpt.Model {
	t.Helper()
	if a, err := ArchOf(m.Config); err != nil || a != arch {
		t.Fatalf("ArchOf = %q, %v; want %s", a, err, arch)
	}
	dir := t.TempDir()
	if err := Export(context.Background(), dir, m, Info{}, ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	back, info, err := LoadModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	if info.Arch != arch || !sameArch(back.Config, m.Config) || (same != nil && !same(back.Config, m.Config)) {
		t.Fatalf("back %s %+v, want %s %+v", info.Arch, back.Config, arch, m.Config)
	}
	again := t.TempDir()
	if err := Export(context.Background(), again, back, info, ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	CompareHFDirs(t, dir, again)
	return back
}

// sameWeights: got's parameters and buffers are want's, in order, value
// for value, and named the same where names is true (an MoE model's
// experts are named by their layout, grouped or not, which the import may
// choose differently); and the two models' logits on a few tokens are the
// same.
func sameWeights(t *testing.T, want, got *gpt.Model, names bool) {
	t.Helper()
	w, g := append(want.Params(), want.Buffers()...), append(got.Params(), got.Buffers()...)
	if len(w) != len(g) {
		t.Fatalf("%d parameters and buffers back, want %d", len(g), len(w))
	}
	for i, p := range w {
		q := g[i]
		if (names && q.Name != p.Name) || q.Numel() != p.Numel() {
			t.Fatalf("param %d: %s (%d values) vs %s (%d)", i, q.Name, q.Numel(), p.Name, p.Numel())
		}
		for j, x := range p.Float32s() {
			if q.Float32s()[j] != x {
				t.Fatalf("%s[%d] = %g, want %g", p.Name, j, q.Float32s()[j], x)
			}
		}
	}
	ids := []int32{3, 1, 4, 1, 5, 9, 2, 6}
	a, b := forward(want, ids), forward(got, ids)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("logit %d: %g after the round trip, %g before", i, b[i], a[i])
		}
	}
}

// archRefusal is a config ArchOf must refuse: edit of a base it accepts,
// and what the error must mention.
type archRefusal struct {
	edit func(c *gpt.Config)
	want string
}

// wantArchOfRefusals checks each refusal on a copy of base.
func wantArchOfRefusals(t *testing.T, base gpt.Config, refusals []archRefusal) {
	t.Helper()
	for _, r := range refusals {
		c := base
		r.edit(&c)
		if _, err := ArchOf(c); err == nil || !strings.Contains(err.Error(), r.want) {
			t.Errorf("ArchOf: err = %v, want it to mention %q", err, r.want)
		}
	}
}

// TestImportErrors: bad directories are errors naming the file and the
// problem, never panics.
func TestImportErrors(t *testing.T) {
	edit := func(oldNew ...string) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) { editConfig(t, dir, oldNew...) }
	}
	rewriteTensors := func(edit func(map[string]safetensors.Tensor)) func(t *testing.T, dir string) {
		return func(t *testing.T, dir string) {
			f, err := safetensors.ReadFile(filepath.Join(dir, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			ts := f.Tensors()
			edit(ts)
			if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := []struct {
		name, fixture string
		edit          func(t *testing.T, dir string)
		want          string
	}{
		{"rope scaling", "llama_gqa_untied_f32", edit(`"rope_scaling": null`, `"rope_scaling": {"type": "linear", "factor": 2.0}`), "rope_scaling"},
		{"activation", "llama_gqa_untied_f32", edit(`"hidden_act": "silu"`, `"hidden_act": "relu"`), "hidden_act"},
		{"gpt2 activation", "gpt2_tied_f32", edit(`"activation_function": "gelu_new"`, `"activation_function": "relu"`), "activation_function"},
		{"heads", "llama_gqa_untied_f32", edit(`"num_key_value_heads": 2`, `"num_key_value_heads": 3`), "num-query-groups"},
		{"model type", "gpt2_tied_f32", edit(`"model_type": "gpt2"`, `"model_type": "bert"`, `"GPT2LMHeadModel"`, `"BertModel"`), "model_type"},
		// model_type wins over architectures: a BERT config beside GPT-2
		// tensors is not imported as GPT-2.
		{"model type bert, gpt2 tensors", "gpt2_tied_f32", edit(`"model_type": "gpt2"`, `"model_type": "bert"`),
			`config.json: model_type "bert" is not supported: want gpt2 (GPT2LMHeadModel), llama`},
		{"model type deepseek, llama keys", "llama_gqa_untied_f32", edit(`"model_type": "llama"`, `"model_type": "deepseek_v3"`),
			`model_type "deepseek_v3" contradicts architectures ["LlamaForCausalLM"]`},
		{"model type contradicts class", "gpt2_tied_f32", edit(`"model_type": "gpt2"`, `"model_type": "llama"`), `model_type "llama" contradicts architectures`},
		{"rope theta 0", "llama_gqa_untied_f32", edit(`"rope_theta": 10000.0`, `"rope_theta": 0`), "config.json: rope_theta: 0: want a positive finite number"},
		{"rope theta negative", "llama_gqa_untied_f32", edit(`"rope_theta": 10000.0`, `"rope_theta": -5`), "rope_theta: -5"},
		{"rms eps 0 in float32", "llama_gqa_untied_f32", edit(`"rms_norm_eps": 1e-06`, `"rms_norm_eps": 1e-50`), "rms_norm_eps: 1e-50: want a positive finite number (as float32)"},
		{"zero layers", "llama_gqa_untied_f32", edit(`"num_hidden_layers": 2`, `"num_hidden_layers": 0`), "num_hidden_layers: 0 is out of range: must be between 1 and"},
		{"huge hidden", "gpt2_tied_f32", edit(`"n_layer": 2`, `"n_layer": 2, "n_embd": 4611686018427387904`), "n_embd: 4611686018427387904 is out of range"},
		{"negative vocab", "gpt2_tied_f32", edit(`"vocab_size": 260`, `"vocab_size": -3`), "vocab_size: -3"},
		{"bad json", "gpt2_tied_f32", edit(`{`, `[`), "config.json"},
		{"layers", "gpt2_tied_f32", edit(`"n_layer": 2`, `"n_layer": 3`), "missing tensor transformer.h.2."},
		{"shape", "gpt2_tied_f32", edit(`"n_inner": null`, `"n_inner": 64`), "mlp.c_fc.weight has shape [32 128], config.json implies [32 64]"},
		{"unexpected", "gpt2_tied_f32", rewriteTensors(func(m map[string]safetensors.Tensor) {
			m["transformer.extra.weight"] = m["transformer.ln_f.weight"]
		}), "unexpected tensor transformer.extra.weight"},
		{"int dtype", "gpt2_tied_f32", rewriteTensors(func(m map[string]safetensors.Tensor) {
			x := m["transformer.ln_f.bias"]
			m["transformer.ln_f.bias"] = safetensors.Tensor{DType: safetensors.I32, Shape: x.Shape, Data: x.Data}
		}), "dtype I32"},
		{"bin only", "gpt2_tied_f32", func(t *testing.T, dir string) {
			os.Rename(filepath.Join(dir, "model.safetensors"), filepath.Join(dir, "pytorch_model.bin"))
		}, ".bin checkpoints are not supported"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyFixture(t, c.fixture)
			c.edit(t, dir)
			wantImportError(t, dir, c.want)
		})
	}
}

// TestIgnoredBuffersAndNoPrefix: old GPT-2 files (saved from GPT2Model: no
// "transformer." prefix, attn.bias causal-mask buffers, a tied lm_head copy)
// import to the same model.
func TestIgnoredBuffersAndNoPrefix(t *testing.T) {
	dir := copyFixture(t, "gpt2_tied_f32")
	f, err := safetensors.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	ts := map[string]safetensors.Tensor{}
	for n, x := range f.Tensors() {
		ts[strings.TrimPrefix(n, "transformer.")] = x
	}
	ts["h.0.attn.bias"] = safetensors.Tensor{DType: safetensors.F32, Shape: []int{1}, Data: make([]byte, 4)}
	ts["lm_head.weight"] = ts["wte.weight"]
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	a, _, err := LoadModel(fixtureDir("gpt2_tied_f32"))
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := LoadModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range a.Params() {
		if !slices.Equal(p.Float32s(), b.Params()[i].Float32s()) {
			t.Fatalf("%s differs", p.Name)
		}
	}
}

// TestExportShardedAndDType: --max-shard-size splits the files; a different
// --dtype rounds each value and says so in config.json.
func TestExportShardedAndDType(t *testing.T) {
	m, info, err := LoadModel(fixtureDir("llama_gqa_untied_f32"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := Export(context.Background(), dir, m, info, ExportOptions{DType: "BF16", MaxShardBytes: 20000}); err != nil {
		t.Fatal(err)
	}
	idx, err := safetensors.ReadIndex(filepath.Join(dir, "model.safetensors.index.json"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]bool{}
	for _, f := range idx.WeightMap {
		files[f] = true
	}
	if len(files) < 2 {
		t.Fatalf("%d shard files, want several", len(files))
	}
	cfg := readJSONObject(t, filepath.Join(dir, "config.json"))
	if cfg["torch_dtype"] != "bfloat16" {
		t.Fatalf("torch_dtype = %v, want bfloat16", cfg["torch_dtype"])
	}
	back, binfo, err := LoadModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	if binfo.DType != "BF16" {
		t.Fatalf("dtype %s, want BF16", binfo.DType)
	}
	for i, p := range m.Params() {
		for j, x := range p.Float32s() {
			if got, want := back.Params()[i].Float32s()[j], roundTo("BF16", x); got != want {
				t.Fatalf("%s[%d] = %g, want %g", p.Name, j, got, want)
			}
		}
	}
}

// TestInfoFile: WriteInfo/ReadInfo round trip; a foreign file is an error.
func TestInfoFile(t *testing.T) {
	dir := t.TempDir()
	if _, ok, err := ReadInfo(dir); ok || err != nil {
		t.Fatalf("empty dir: ok %v err %v", ok, err)
	}
	in := Info{Arch: ArchLlama, DType: "BF16", VocabSize: 100, Config: []byte(`{"a":1}`)}
	if err := WriteInfo(dir, in); err != nil {
		t.Fatal(err)
	}
	out, ok, err := ReadInfo(dir)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if out.Arch != in.Arch || out.DType != in.DType || out.VocabSize != in.VocabSize || !jsonEqual(t, out.Config, in.Config) {
		t.Fatalf("got %+v, want %+v", out, in)
	}
	os.WriteFile(filepath.Join(dir, InfoFile), []byte(`{"format":"other","version":1}`), 0o644)
	if _, _, err := ReadInfo(dir); err == nil || !strings.Contains(err.Error(), InfoFile) {
		t.Fatalf("foreign file: err %v", err)
	}
	// Fields are checked before anything uses them (a negative vocab_size
	// used to reach score's slicing).
	for field, want := range map[string]string{`"vocab_size":-5`: "vocab_size: -5 is out of range", `"arch":"bert"`: `arch "bert"`} {
		os.WriteFile(filepath.Join(dir, InfoFile), []byte(`{"format":"`+infoFormat+`","version":`+strconv.Itoa(infoVersion)+`,`+field+`}`), 0o644)
		if _, _, err := ReadInfo(dir); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), InfoFile) {
			t.Errorf("%s: err %v, want %q", field, err, want)
		}
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y bytes.Buffer
	if err := json.Compact(&x, a); err != nil {
		t.Fatal(err)
	}
	if err := json.Compact(&y, b); err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(x.Bytes(), y.Bytes())
}

// TestMistral: model_type mistral uses the Llama table; sliding_window
// gives a warning; export keeps model_type and architectures.
func TestMistral(t *testing.T) {
	dir := copyFixture(t, "llama_gqa_untied_f32")
	editConfig(t, dir, `"model_type": "llama"`, `"model_type": "mistral", "sliding_window": 4`, `"LlamaForCausalLM"`, `"MistralForCausalLM"`)
	m, info, err := LoadModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	if info.Arch != ArchLlama || len(info.Warnings) != 1 || !strings.Contains(info.Warnings[0], "sliding_window=4") {
		t.Fatalf("arch %s warnings %q", info.Arch, info.Warnings)
	}
	out := t.TempDir()
	if err := Export(context.Background(), out, m, info, ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	CompareHFDirs(t, dir, out)
}
