package megatron

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/tensor"
)

type exportCase struct {
	name       string
	cfg        gpt.Config
	tp, pp, vp int
	decoupled  float64
	ranges     [][][2]int // by pipeline rank: an uneven split
}

var exportCases = []exportCase{
	{"gpt_tp2_pp2_vp2_tied", gpt.Config{NumLayers: 4, HiddenSize: 16, NumAttentionHeads: 4, VocabSize: 64, MaxPositionEmbeddings: 32}, 2, 2, 2, 0, nil},
	{"llama_tp2_pp1_untied_decoupled", gpt.Config{NumLayers: 2, HiddenSize: 16, NumAttentionHeads: 4, NumQueryGroups: 2, FFNHiddenSize: 24, VocabSize: 64, MaxPositionEmbeddings: 32,
		PositionEmbeddingType: gpt.RoPE, Normalization: gpt.RMSNorm, Activation: gpt.SwiGLU, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true}, 2, 1, 1, 1e-3, nil},
	{"gpt_tp1_pp4_vp1", gpt.Config{NumLayers: 4, HiddenSize: 8, NumAttentionHeads: 2, VocabSize: 32, MaxPositionEmbeddings: 16}, 1, 4, 1, 5e-4, nil},
	{"mla_tp2_pp2_qlora_yarn", gpt.Config{NumLayers: 2, HiddenSize: 16, NumAttentionHeads: 4, VocabSize: 64, MaxPositionEmbeddings: 32, PositionEmbeddingType: gpt.RoPE,
		MLA: gpt.MLAConfig{Enabled: true, QLoraRank: 6, KVLoraRank: 6, QKHeadDim: 3, QKPosEmbHeadDim: 4, VHeadDim: 5, ScalingFactor: 4, Mscale: 0.9, MscaleAllDim: 0.7,
			OriginalMaxPositions: 8, BetaFast: 32, BetaSlow: 1}}, 2, 2, 1, 0, nil},
	{"mla_tp2_qproj_rope_rmsnorm", gpt.Config{NumLayers: 2, HiddenSize: 16, NumAttentionHeads: 2, FFNHiddenSize: 24, VocabSize: 64, MaxPositionEmbeddings: 32,
		PositionEmbeddingType: gpt.RoPE, Normalization: gpt.RMSNorm, Activation: gpt.SwiGLU, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true,
		MLA: gpt.MLAConfig{Enabled: true, KVLoraRank: 4, QKHeadDim: 2, QKPosEmbHeadDim: 2, VHeadDim: 3, Rope: gpt.PlainRoPE, ScalingFactor: 1, Mscale: 1,
			OriginalMaxPositions: 4096, BetaFast: 32, BetaSlow: 1}}, 2, 1, 1, 0, nil},
	{"gpt_pp2_uneven", gpt.Config{NumLayers: 5, HiddenSize: 8, NumAttentionHeads: 2, VocabSize: 32, MaxPositionEmbeddings: 16}, 1, 2, 1, 0, [][][2]int{{{0, 3}}, {{3, 5}}}},
}

func (c exportCase) layerRanges() func(int) ([][2]int, error) {
	if c.ranges == nil {
		return nil
	}
	return func(p int) ([][2]int, error) { return c.ranges[p], nil }
}

// exportFixture builds a random model and Adam state and saves them in
// Megatron's layout under dir.
func exportFixture(t *testing.T, dir string, c exportCase) (*gpt.Model, *OptimizerState) {
	t.Helper()
	m, err := gpt.New(c.cfg, tensor.NewRNG(7))
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(1))
	st := &OptimizerState{Kind: "adamw", Steps: 123456789, Buffers: map[string][]float32{},
		Scheduler:            optim.SchedulerState{MaxLR: 3e-4, LRWarmupSteps: 10, NumSteps: 640, LRDecayStyle: "cosine", LRDecaySteps: 1000, MinLR: 3e-5, StartWD: 0.1, EndWD: 0.1, WDIncrStyle: "constant"},
		ConsumedTrainSamples: 640, SkippedTrainSamples: 0, ConsumedValidSamples: 96, FLOPs: 1.5e12, Seed: 1234}
	params := map[string][]float32{}
	for _, p := range m.Params() {
		v := p.Float32s()
		for i := range v {
			v[i] = float32(r.NormFloat64()) // norms and biases too: every value distinct
		}
		params[p.Name] = v
		for _, k := range []string{"exp_avg", "exp_avg_sq"} {
			b := make([]float32, len(v))
			for i := range b {
				b[i] = float32(r.NormFloat64())
			}
			st.Buffers[k+"/"+p.Name] = b
		}
	}
	err = Save(dir, Export{Model: m.Config, SeqLength: 16, TP: c.tp, PP: c.pp, VP: c.vp, LayerRanges: c.layerRanges(), Optimizer: st, Iteration: 20,
		LR: 3e-4, DecoupledLR: c.decoupled, WeightDecay: 0.1, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8,
		Args: map[string]any{"micro_batch_size": int64(2)}, Resume: []byte(`{"x":1}`),
		Param: func(name string, shape []int) ([]float32, error) {
			v, ok := params[name]
			if !ok {
				return nil, fmt.Errorf("no parameter %s", name)
			}
			return v, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	return m, st
}

// TestExportImportRoundTrip saves a model and its Adam state in
// Megatron's layout and imports them back: every weight and moment
// bit for bit, the step, scheduler and counters.
func TestExportImportRoundTrip(t *testing.T) {
	for _, c := range exportCases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			m, st := exportFixture(t, dir, c)
			if b, err := os.ReadFile(filepath.Join(dir, TrackerFile)); err != nil || string(b) != "20" {
				t.Fatalf("tracker: %q %v", b, err)
			}
			got, gst, info, err := Import(dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(info.Warnings) > 0 || gst == nil {
				t.Fatalf("warnings %v, optimizer %v", info.Warnings, gst)
			}
			if info.TP != c.tp || info.PP != c.pp || max(info.VP, 1) != c.vp || info.Iteration != 20 {
				t.Errorf("layout TP=%d PP=%d VP=%d iteration %d", info.TP, info.PP, info.VP, info.Iteration)
			}
			want := m.Config
			if err := want.Validate(); err != nil {
				t.Fatal(err)
			}
			if g := got.Config; fmt.Sprint(g) != fmt.Sprint(want) {
				t.Errorf("config\n got %+v\nwant %+v", g, want)
			}
			for i, p := range m.Params() {
				q := got.Params()[i]
				if q.Name != p.Name || !slices.Equal(q.Float32s(), p.Float32s()) {
					t.Errorf("parameter %s (got %s) differs", p.Name, q.Name)
				}
			}
			if len(gst.Buffers) != len(st.Buffers) {
				t.Errorf("%d buffers, want %d", len(gst.Buffers), len(st.Buffers))
			}
			for k, v := range st.Buffers {
				if !slices.Equal(gst.Buffers[k], v) {
					t.Errorf("buffer %s differs", k)
				}
			}
			if gst.Steps != st.Steps || gst.Scheduler != st.Scheduler || gst.ConsumedTrainSamples != 640 || gst.ConsumedValidSamples != 96 || gst.FLOPs != 1.5e12 || gst.Seed != 1234 {
				t.Errorf("state %+v", gst)
			}
		})
	}
}

func TestExportRefusals(t *testing.T) {
	base := exportCases[0].cfg
	for _, tc := range []struct {
		edit       func(*gpt.Config)
		tp, pp, vp int
		ranges     func(int) ([][2]int, error)
		want       string
	}{
		{func(*gpt.Config) {}, 1, 3, 1, nil, "not a multiple of pipeline"},
		{func(*gpt.Config) {}, 3, 1, 1, nil, "not a multiple of the tensor-parallel size"},
		{func(c *gpt.Config) { c.QKLayerNorm = true }, 1, 1, 1, nil, "--qk-layernorm"},
		{func(c *gpt.Config) { c.AttentionOutputGate = true }, 1, 1, 1, nil, "--attention-output-gate models are not written"},
		{func(c *gpt.Config) { c.MLA = exportCases[3].cfg.MLA; c.MLA.KVLoraRank = 5 }, 2, 1, 1, nil, "--kv-lora-rank + --qk-pos-emb-head-dim (9) must be multiples of the tensor-parallel size 2"},
		{func(*gpt.Config) {}, 1, 2, 1, func(p int) ([][2]int, error) { return [][][2]int{{{0, 1}}, {{2, 4}}}[p], nil }, "pipeline rank 1 chunk 0 holds layers [2, 4), want them to start at 1"},
		{func(*gpt.Config) {}, 1, 2, 1, func(p int) ([][2]int, error) { return [][][2]int{{{0, 1}}, {{1, 3}}}[p], nil }, "the pipeline chunks hold 3 layers, the model 4"},
	} {
		cfg := base
		tc.edit(&cfg)
		err := Save(t.TempDir(), Export{Model: cfg, TP: tc.tp, PP: tc.pp, VP: tc.vp, LayerRanges: tc.ranges, Param: func(string, []int) ([]float32, error) { return nil, nil }})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("TP=%d PP=%d: %v, want %q", tc.tp, tc.pp, err, tc.want)
		}
	}
}

// TestExportLoadsInPyTorch torch.loads every rank file and checks its
// keys, shapes and values against Megatron's split of the model.
func TestExportLoadsInPyTorch(t *testing.T) {
	py := "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import torch").CombinedOutput(); err != nil {
		t.Skipf("PyTorch cross-check skipped: %s cannot import torch: %v %s", py, err, out)
	}
	c := exportCases[0] // TP=2 PP=2 VP=2, tied: the last stage's copy
	dir := t.TempDir()
	m, st := exportFixture(t, dir, c)
	script := `
import sys, json, glob, os, torch
out = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "iter_0000020", "*", "model_optim_rng.pt"))):
    d = torch.load(f, map_location="cpu")
    r = {"keys": list(d.keys()), "iteration": d["iteration"], "version": d["checkpoint_version"],
         "args": {k: getattr(d["args"], k) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size", "num_layers", "consumed_train_samples")},
         "sched": d["opt_param_scheduler"]["num_steps"], "flops": d["num_floating_point_operations_so_far"]}
    for mk in ("model0", "model1"):
        r[mk] = {k: [list(v.shape), v.flatten()[:3].tolist(), v.flatten()[-1].item()] for k, v in d[mk].items()}
    o = d["optimizer"]
    r["groups"] = [[g["params"], g["wd_mult"], g["is_decoupled_lr"], g["step"]] for g in o["param_groups"]]
    r["state0"] = o["state"][0]["exp_avg"].flatten()[:3].tolist()
    out[os.path.basename(os.path.dirname(f))] = r
print(json.dumps(out))
`
	out, err := exec.Command(py, "-c", script, dir).CombinedOutput()
	if err != nil {
		t.Fatalf("torch.load: %v\n%s", err, out)
	}
	var got map[string]map[string]any
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(got) != 4 {
		t.Fatalf("%d rank files, want mp_rank_0{0,1}_00{0,1}", len(got))
	}
	whole := map[string][]float32{}
	for _, p := range m.Params() {
		whole[p.Name] = p.Float32s()
	}
	e := &Export{Model: m.Config, TP: 2, PP: 2, VP: 2}
	if err := e.Model.Validate(); err != nil {
		t.Fatal(err)
	}
	for tr := range 2 {
		for p := range 2 {
			name := rankDir(tr, p, 2)
			r := got[name]
			if r == nil {
				t.Fatalf("no %s", name)
			}
			if want := []any{"args", "checkpoint_version", "iteration", "model0", "model1", "optimizer", "opt_param_scheduler", "num_floating_point_operations_so_far", ResumeKey}; fmt.Sprint(r["keys"]) != fmt.Sprint(want) {
				t.Errorf("%s keys %v, want %v", name, r["keys"], want)
			}
			if fmt.Sprint(r["args"]) != "map[consumed_train_samples:640 num_layers:4 pipeline_model_parallel_size:2 tensor_model_parallel_size:2 virtual_pipeline_model_parallel_size:2]" ||
				r["iteration"] != 20.0 || r["version"] != 3.0 || r["sched"] != 640.0 || r["flops"] != 1.5e12 {
				t.Errorf("%s: %v", name, r)
			}
			chunks := e.rankParams(p)
			for v, ps := range chunks {
				md := r[fmt.Sprintf("model%d", v)].(map[string]any)
				if len(md) != len(ps) {
					t.Errorf("%s model%d: %d tensors, want %d", name, v, len(md), len(ps))
				}
				for _, rp := range ps {
					x, sh := slice(whole[rp.name], rp.spec.shape, rp.spec.how, tr, 2)
					g, ok := md[rp.key].([]any)
					if !ok || !closeVals(g, sh, x) {
						t.Errorf("%s model%d %s: torch has %v, want shape %v, values %v ... %v", name, v, rp.key, md[rp.key], sh, x[:3], x[len(x)-1])
					}
				}
			}
			groups := r["groups"].([]any)
			for _, g := range groups {
				if g.([]any)[3] != float64(st.Steps) {
					t.Errorf("%s: step %v", name, g.([]any)[3])
				}
			}
		}
	}
}

// closeVals compares torch's JSON (float64 of float32 values) with x.
func closeVals(g []any, sh []int64, x []float32) bool {
	shape := g[0].([]any)
	if len(shape) != len(sh) {
		return false
	}
	for i := range sh {
		if shape[i].(float64) != float64(sh[i]) {
			return false
		}
	}
	first := g[1].([]any)
	for i := range first {
		if float32(first[i].(float64)) != x[i] {
			return false
		}
	}
	return float32(g[2].(float64)) == x[len(x)-1]
}
