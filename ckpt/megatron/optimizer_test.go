package megatron

import (
	"archive/zip"
	"bytes"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/ckpt/torchpt"
	"github.com/gotron/gotron/model/gpt"
)

// expectedOptimizer is a fixture's optimizer.safetensors: the whole
// tensors tools/golden/megatron_ckpt.py built the rank files' optimizer
// state from, keyed "<kind>/<param>" ("main_params/<param>": the fp32 main
// params), and its kind and step count.
type expectedOptimizer struct {
	tensors map[string][]float32
	shapes  map[string][]int
	meta    map[string]string
}

func readExpectedOptimizer(t *testing.T, name string) expectedOptimizer {
	t.Helper()
	f, err := safetensors.ReadFile(filepath.Join("testdata", name, "optimizer.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	e := expectedOptimizer{tensors: map[string][]float32{}, shapes: map[string][]int{}, meta: f.Metadata()}
	for k, ts := range f.Tensors() {
		v := make([]float32, len(ts.Data)/4)
		if err := ts.DecodeFloat32(v); err != nil {
			t.Fatal(err)
		}
		e.tensors[k], e.shapes[k] = v, ts.Shape
	}
	return e
}

// maxAbsDiff is the largest |a − b| (+Inf on a length mismatch).
func maxAbsDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}

// TestImportOptimizerMatchesPyTorch: every fixture's optimizer state
// (llama_tp2_pp2: bf16 Float16OptimizerWithFloat16Params over Adam with the
// step in its param groups, groups in Megatron HEAD's order;
// gpt_tp2_pp2_vp2: FP32Optimizer over torch's Adam with per-parameter
// steps, older Megatron's group order, which differs between pipeline
// stages, and the tied embeddings' copy on the last stage; gpt_tp2: fp16
// with SGD momentum and a dynamic loss scaler) imports to exactly the whole
// tensors the script wrote, and the fp32 main params become the weights.
func TestImportOptimizerMatchesPyTorch(t *testing.T) {
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			m, st, info, err := Import(filepath.Join("testdata", name), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if st == nil {
				t.Fatalf("no optimizer state imported; warnings %q", info.Warnings)
			}
			for _, w := range info.Warnings {
				if strings.Contains(w, "optimizer") || strings.Contains(w, "tied") {
					t.Errorf("warning %q", w)
				}
			}
			e := readExpectedOptimizer(t, name)
			if st.Kind != e.meta["kind"] || strconv.FormatInt(st.Steps, 10) != e.meta["steps"] {
				t.Errorf("kind %q steps %d, want %q %s", st.Kind, st.Steps, e.meta["kind"], e.meta["steps"])
			}
			weights := map[string][]float32{}
			for _, p := range m.Params() {
				weights[p.Name] = p.Float32s()
			}
			var keys []string
			for k := range e.tensors {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			worst := map[string]float64{}
			mains := 0
			for _, k := range keys {
				kind, pname, _ := strings.Cut(k, "/")
				got, ok := st.Buffers[k]
				if kind == "main_params" {
					got, ok = weights[pname], true
					mains++
				}
				if !ok {
					t.Errorf("%s: not imported", k)
					continue
				}
				d := maxAbsDiff(got, e.tensors[k])
				worst[kind] = math.Max(worst[kind], d)
				if d != 0 {
					t.Errorf("%s: max |difference| %g", k, d)
				}
			}
			if want := len(keys) - mains; len(st.Buffers) != want {
				t.Errorf("%d buffers imported, want %d", len(st.Buffers), want)
			}
			if st.MainParams != (mains > 0) || (mains > 0 && mains != len(weights)) {
				t.Errorf("MainParams %v with %d main params for %d weights", st.MainParams, mains, len(weights))
			}
			if ls := e.meta["loss_scale"]; ls != "" {
				if st.LossScaler == nil || strconv.FormatFloat(float64(st.LossScaler.Scale), 'g', -1, 32) != ls ||
					strconv.Itoa(st.LossScaler.GrowthTracker) != e.meta["growth_tracker"] || strconv.Itoa(st.LossScaler.HysteresisTracker) != e.meta["hysteresis_tracker"] {
					t.Errorf("loss scaler %+v, want scale %s", st.LossScaler, ls)
				}
			} else if st.LossScaler != nil {
				t.Errorf("loss scaler %+v, want none", st.LossScaler)
			}
			sc := st.Scheduler
			if sc.MaxLR != 3e-4 || sc.MinLR != 3e-5 || sc.NumSteps != info.Iteration*8 || sc.LRDecayStyle != "cosine" || sc.LRWarmupSteps != 800 || sc.LRDecaySteps != 80000 || sc.WDIncrStyle != "constant" {
				t.Errorf("scheduler %+v", sc)
			}
			if st.ConsumedTrainSamples != info.Iteration*8 || st.ConsumedValidSamples != 80 || st.FLOPs != 123456789 || st.Seed != 1234 {
				t.Errorf("consumed %d/%d, FLOPs %g, seed %d", st.ConsumedTrainSamples, st.ConsumedValidSamples, st.FLOPs, st.Seed)
			}
			t.Logf("%s: max |difference| per kind %v (%d tensors)", st.Source, worst, len(keys))
		})
	}
}

// optSection returns rank (t, p)'s optimizer section and the torch
// optimizer state dict inside it (the same dict for FP32Optimizer).
func optSection(t *testing.T, c *Checkpoint, tp, pp int) (outer, inner *torchpt.Dict) {
	t.Helper()
	sd, _ := stateDict(c.files[tp][pp])
	v, _ := sd.Get("optimizer")
	outer = v.(*torchpt.Dict)
	inner = outer
	if x, ok := outer.Get("optimizer"); ok {
		inner = x.(*torchpt.Dict)
	}
	return outer, inner
}

func without(d *torchpt.Dict, key any) *torchpt.Dict {
	n := torchpt.NewDict()
	for i, k := range d.Keys() {
		if k != key {
			n.Set(k, d.Values()[i])
		}
	}
	return n
}

func items(v any) []any { return v.(*torchpt.List).Items }

func get(d *torchpt.Dict, k any) any { v, _ := d.Get(k); return v }

// TestImportOptimizerBadInput: what gotron's optimizers cannot take imports
// the weights alone with a warning naming the file; a malformed optimizer
// section is an *OptimizerError naming the file; the param groups' order
// does not matter; nothing panics.
func TestImportOptimizerBadInput(t *testing.T) {
	const (
		ok      = iota
		warning // weights only, a warning
		failure // an *OptimizerError
	)
	cases := []struct {
		name, fixture string
		mutate        func(t *testing.T, c *Checkpoint)
		outcome       int
		wants         []string // substrings of the warning or error; {rank} is the mutated file
	}{
		{"param groups in the other order", "llama_tp2_pp2", func(t *testing.T, c *Checkpoint) {
			outer, inner := optSection(t, c, 0, 1)
			g := items(get(inner, "param_groups"))
			inner.Set("param_groups", &torchpt.List{Items: []any{g[1], g[0]}})
			m := items(get(outer, "fp32_from_fp16_params"))
			outer.Set("fp32_from_fp16_params", &torchpt.List{Items: []any{m[1], m[0]}})
		}, ok, nil},
		{"--decoupled-lr: embedding and output layer in a group of their own", "llama_tp2_pp2", func(t *testing.T, c *Checkpoint) {
			for tp := range 2 {
				for pp := range 2 {
					outer, inner := optSection(t, c, tp, pp)
					groups := items(get(inner, "param_groups"))
					g0 := groups[0].(*torchpt.Dict)
					idx, mains := get(g0, "params").(*torchpt.List), items(get(outer, "fp32_from_fp16_params"))
					m0 := mains[0].(*torchpt.List)
					at := 0 // the embedding comes first on the first stage, the output layer last on the last
					if pp == 1 {
						at = len(idx.Items) - 1
					}
					dg := torchpt.NewDict()
					for i, k := range g0.Keys() {
						dg.Set(k, g0.Values()[i])
					}
					dg.Set("is_decoupled_lr", true)
					dg.Set("max_lr", 1e-3)
					dg.Set("params", &torchpt.List{Items: []any{idx.Items[at]}})
					dm := &torchpt.List{Items: []any{m0.Items[at]}}
					idx.Items = append(idx.Items[:at:at], idx.Items[at+1:]...)
					m0.Items = append(m0.Items[:at:at], m0.Items[at+1:]...)
					inner.Set("param_groups", &torchpt.List{Items: append(groups, dg)})
					outer.Set("fp32_from_fp16_params", &torchpt.List{Items: append(mains, dm)})
				}
			}
		}, ok, nil},
		{"two groups alike", "llama_tp2_pp2", func(t *testing.T, c *Checkpoint) {
			_, inner := optSection(t, c, 0, 0)
			items(get(inner, "param_groups"))[1].(*torchpt.Dict).Set("wd_mult", 1.0)
		}, warning, []string{"{rank}: optimizer param_groups[0] and [1] are both weight-decay: which parameters each holds cannot be derived"}},
		{"indices of parameters of other shapes swapped", "llama_tp2_pp2", func(t *testing.T, c *Checkpoint) {
			_, inner := optSection(t, c, 1, 0)
			p := items(get(items(get(inner, "param_groups"))[0].(*torchpt.Dict), "params"))
			p[0], p[1] = p[1], p[0]
		}, failure, []string{"{rank}: optimizer state[1] (model.embedding.word_embeddings.weight, param group 0): exp_avg has shape [16 8], but the parameter the param groups give this index, model.embedding.word_embeddings.weight, has shape [64 16]"}},
		{"main params of alike parameters swapped", "llama_tp2_pp2", func(t *testing.T, c *Checkpoint) {
			outer, _ := optSection(t, c, 1, 1)
			m := items(items(get(outer, "fp32_from_fp16_params"))[1])
			m[0], m[1] = m[1], m[0]
		}, failure, []string{"{rank}: optimizer fp32_from_fp16_params[1][0] (model.decoder.layers.0.self_attention.linear_qkv.layer_norm_weight → decoder.layers.2.input_layernorm.weight): element 0 is", "the main params do not belong to the parameters the param groups give them"}},
		{"no fp32 main params", "llama_tp2_pp2", func(t *testing.T, c *Checkpoint) {
			sd, _ := stateDict(c.files[1][1])
			outer, _ := optSection(t, c, 1, 1)
			sd.Set("optimizer", without(outer, "fp32_from_fp16_params"))
		}, failure, []string{"{rank}: the optimizer section (Float16OptimizerWithFloat16Params) has no fp32_from_fp16_params"}},
		{"main params of a group missing", "llama_tp2_pp2", func(t *testing.T, c *Checkpoint) {
			outer, _ := optSection(t, c, 0, 0)
			g := get(outer, "fp32_from_fp16_params").(*torchpt.List)
			g.Items[1] = &torchpt.List{Items: items(g.Items[1])[1:]}
		}, failure, []string{"{rank}: optimizer fp32_from_fp16_params[1] holds 3 tensors, param group 1 has 4 16-bit parameters"}},
		{"step counts differ", "llama_tp2_pp2", func(t *testing.T, c *Checkpoint) {
			_, inner := optSection(t, c, 1, 1)
			items(get(inner, "param_groups"))[0].(*torchpt.Dict).Set("step", int64(7))
		}, warning, []string{"the step counts differ: 1190 (", "7 ({rank} param_groups[0])"}},
		{"state of a parameter missing", "gpt_tp2_pp2_vp2", func(t *testing.T, c *Checkpoint) {
			_, inner := optSection(t, c, 1, 1)
			inner.Set("state", without(get(inner, "state").(*torchpt.Dict), int64(3)))
		}, warning, []string{"{rank}: no optimizer state for parameter 3 (model0.decoder.layers.0.self_attention.linear_proj.bias → decoder.layers.1.self_attention.linear_proj.bias)"}},
		{"no state at all", "gpt_tp2_pp2_vp2", func(t *testing.T, c *Checkpoint) {
			_, inner := optSection(t, c, 0, 0)
			inner.Set("state", torchpt.NewDict())
		}, warning, []string{"{rank}: the optimizer holds no per-parameter state (saved before its first step)"}},
		{"exp_avg not a tensor", "gpt_tp2_pp2_vp2", func(t *testing.T, c *Checkpoint) {
			_, inner := optSection(t, c, 0, 1)
			get(get(inner, "state").(*torchpt.Dict), int64(0)).(*torchpt.Dict).Set("exp_avg", "zeros")
		}, failure, []string{"{rank}: optimizer state[0] (model0.decoder.layers.0.input_layernorm.weight → decoder.layers.1.input_layernorm.weight, param group 0): exp_avg is a string, not a tensor"}},
		{"state not a dict", "gpt_tp2_pp2_vp2", func(t *testing.T, c *Checkpoint) {
			_, inner := optSection(t, c, 1, 0)
			inner.Set("state", &torchpt.List{})
		}, failure, []string{"{rank}: optimizer state is a *torchpt.List, not a dict"}},
		{"a state the optimizer does not keep", "gpt_tp2", func(t *testing.T, c *Checkpoint) {
			_, inner := optSection(t, c, 0, 0)
			s := get(get(inner, "state").(*torchpt.Dict), int64(2)).(*torchpt.Dict)
			s.Set("max_exp_avg_sq", get(s, "momentum_buffer"))
		}, warning, []string{"{rank}: optimizer state[2]", "holds max_exp_avg_sq, which gotron's sgd does not keep"}},
		{"param groups without params (distributed optimizer)", "gpt_tp2", func(t *testing.T, c *Checkpoint) {
			_, inner := optSection(t, c, 1, 0)
			g := items(get(inner, "param_groups"))
			g[0] = without(g[0].(*torchpt.Dict), "params")
		}, warning, []string{"{rank}: optimizer param_groups[0] lists no params: the distributed optimizer's state"}},
		{"chained optimizers", "gpt_tp2", func(t *testing.T, c *Checkpoint) {
			sd, _ := stateDict(c.files[0][0])
			outer, _ := optSection(t, c, 0, 0)
			sd.Set("optimizer", &torchpt.List{Items: []any{outer, outer}})
		}, warning, []string{"{rank}: the optimizer section is a list of 2 state dicts (Megatron's ChainedOptimizer): not supported"}},
		{"optimizer section of another type", "gpt_tp2", func(t *testing.T, c *Checkpoint) {
			sd, _ := stateDict(c.files[1][0])
			sd.Set("optimizer", "adam")
		}, failure, []string{"{rank}: the optimizer section is a string, not a Megatron optimizer state dict"}},
		{"another optimizer", "gpt_tp2", func(t *testing.T, c *Checkpoint) {
			c.args.d.Set("optimizer", "lion")
		}, warning, []string{`args.optimizer="lion": gotron's optimizers are Adam (AdamW) and SGD`}},
		{"distributed optimizer", "llama_tp2_pp2", func(t *testing.T, c *Checkpoint) {
			c.args.d.Set("use_distributed_optimizer", true)
		}, warning, []string{"{rank}: args.use_distributed_optimizer=True, but the optimizer section is the non-distributed optimizer's (it holds fp32_from_fp16_params)"}},
		{"scheduler incomplete", "llama_tp2_pp2", func(t *testing.T, c *Checkpoint) {
			sd, _ := stateDict(c.files[0][0])
			sd.Set("opt_param_scheduler", without(get(sd, "opt_param_scheduler").(*torchpt.Dict), "max_lr"))
		}, failure, []string{"{rank}: opt_param_scheduler has no max_lr"}},
		{"release checkpoint", "llama_tp2_pp2", func(t *testing.T, c *Checkpoint) {
			c.Release = true
		}, warning, []string{"is a release checkpoint, whose optimizer state Megatron does not load either"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ck, err := Open(filepath.Join("testdata", c.fixture))
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			c.mutate(t, ck)
			m, st, info, err := ck.Import(Options{})
			var msg string
			switch c.outcome {
			case ok:
				if err != nil || st == nil {
					t.Fatalf("err %v, state %v, warnings %q", err, st, info.Warnings)
				}
				e := readExpectedOptimizer(t, c.fixture)
				for k, want := range e.tensors {
					got := st.Buffers[k]
					if strings.HasPrefix(k, "main_params/") {
						for _, p := range m.Params() {
							if p.Name == strings.TrimPrefix(k, "main_params/") {
								got = p.Float32s()
							}
						}
					}
					if d := maxAbsDiff(got, want); d != 0 {
						t.Errorf("%s: max |difference| %g", k, d)
					}
				}
				return
			case warning, failure:
				msg = notImportedMessage(t, c.outcome == warning, m, st, info, err)
			}
			for _, w := range c.wants {
				for tp := range ck.TP {
					for pp := range ck.PP {
						if strings.Contains(msg, ck.files[tp][pp].Path) {
							w = strings.ReplaceAll(w, "{rank}", ck.files[tp][pp].Path)
						}
					}
				}
				if !strings.Contains(msg, w) {
					t.Errorf("%s\nwant it to mention %q", msg, w)
				}
			}
		})
	}
}

// TestImportOptimizerTruncatedAndDistributed: a rank file whose optimizer
// tensor's record is cut short is refused naming it; a distrib_optim.pt
// beside a rank file whose args do not say --use-distributed-optimizer
// imports the weights alone, with a warning.
func TestImportOptimizerTruncatedAndDistributed(t *testing.T) {
	dir := copyFixture(t, "llama_tp2_pp2")
	path := filepath.Join(dir, "iter_0001200", "mp_rank_01_001", FileName)
	f, err := torchpt.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	sd, _ := stateDict(f)
	st := get(get(get(sd, "optimizer").(*torchpt.Dict), "optimizer").(*torchpt.Dict), "state").(*torchpt.Dict)
	key := "data/" + get(get(st, int64(4)).(*torchpt.Dict), "exp_avg_sq").(*torchpt.Tensor).Storage.Key
	f.Close()
	rewriteZip(t, path, func(name string, b []byte) []byte {
		if strings.HasSuffix(name, "/"+key) {
			return b[:len(b)/2]
		}
		return b
	})
	_, _, _, err = Import(dir, Options{})
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("err = %v", err)
	}
	t.Logf("truncated optimizer record: %v", err)

	dir = copyFixture(t, "gpt_tp2")
	os.WriteFile(filepath.Join(dir, "iter_0000030", "mp_rank_01", "distrib_optim.pt"), nil, 0o644)
	_, ost, info, err := Import(dir, Options{})
	if err != nil || ost != nil || !strings.Contains(strings.Join(info.Warnings, "\n"), filepath.Join(dir, "iter_0000030", "mp_rank_01", FileName)+" has a distrib_optim.pt beside it") {
		t.Fatalf("err %v, state %v, warnings %q", err, ost != nil, info.Warnings)
	}
}

// rewriteZip rewrites a torch.save zip, passing every record through edit.
func rewriteZip(t *testing.T, path string, edit func(name string, b []byte) []byte) {
	t.Helper()
	zr, err := zip.OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, zf := range zr.File {
		rc, _ := zf.Open()
		b, _ := io.ReadAll(rc)
		rc.Close()
		w, _ := zw.CreateHeader(&zip.FileHeader{Name: zf.Name, Method: zip.Store})
		w.Write(edit(zf.Name, b))
	}
	zr.Close()
	zw.Close()
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// notImportedMessage checks an Import that took no optimizer state: with
// warned, the weights and a warning saying so; else an *OptimizerError. It
// returns the warnings or the error's text.
func notImportedMessage(t *testing.T, warned bool, m *gpt.Model, st *OptimizerState, info Info, err error) string {
	t.Helper()
	if !warned {
		var oe *OptimizerError
		if !errors.As(err, &oe) {
			t.Fatalf("err = %v (%T), want an *OptimizerError", err, err)
		}
		return err.Error()
	}
	if err != nil || st != nil {
		t.Fatalf("err %v, state %v: want weights and a warning", err, st != nil)
	}
	if m == nil || len(m.Params()) == 0 {
		t.Fatal("no model")
	}
	msg := strings.Join(info.Warnings, "\n")
	if !strings.Contains(msg, "optimizer state not imported: ") {
		t.Errorf("warnings %q", info.Warnings)
	}
	return msg
}
