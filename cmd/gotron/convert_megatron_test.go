package main

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/ckpt/torchpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/train"
)

// The Megatron fixtures are tools/golden/megatron_ckpt.py's: legacy
// torch-format checkpoints (llama_tp2_pp2: TP=2 × PP=2, bf16, TE names;
// gpt_tp2_pp2_vp2: TP=2 × PP=2 × 2 virtual stages; gpt_tp2: TP=2) and the
// logits of a float64 PyTorch forward of the unsharded weights.
var megatronFixtures = []string{"llama_tp2_pp2", "gpt_tp2_pp2_vp2", "gpt_tp2", "gpt_tp2_pp2_distopt"}

func megatronFixture(name string) string {
	return filepath.Join("..", "..", "ckpt", "megatron", "testdata", name)
}

type megatronGolden struct {
	Tokens   []int32     `json:"tokens"`
	Padded   int         `json:"padded_vocab_size"`
	Logits   [][]float64 `json:"logits"`
	LogProbs []float64   `json:"logprobs"`
}

func readMegatronGolden(t *testing.T, name string) megatronGolden {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(megatronFixture(name), "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g megatronGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestConvertFromMegatronMatchesPyTorch: gotron convert --from megatron,
// then gotron score on the result, gives the reference logits (all padded
// vocabulary columns: a Megatron checkpoint records no unpadded size) and
// per-token log-probabilities within 1e-5; score reads the Megatron
// directory directly too.
func TestConvertFromMegatronMatchesPyTorch(t *testing.T) {
	const tol = 1e-5
	for _, name := range megatronFixtures {
		t.Run(name, func(t *testing.T) {
			src, tmp := megatronFixture(name), t.TempDir()
			g := filepath.Join(tmp, "gotron")
			// --no-load-optim: the weights of the model state dicts alone
			// (the reference's), at iteration 0.
			out := mustGotron(t, "convert", "--from", "megatron", "--load", src, "--save", g, "--no-load-optim")
			for _, want := range []string{"imported " + src, "Megatron iteration", "TP=2", "into " + g, "weights only: --no-load-optim: the optimizer state in the checkpoint is not converted",
				"gotron train --load " + g + " starts at iteration 0", "tokenizer (", "not found on this machine"} {
				if !strings.Contains(out, want) {
					t.Errorf("convert output lacks %q:\n%s", want, out)
				}
			}
			if strings.Contains(name, "vp2") && !strings.Contains(out, "VP=2") {
				t.Errorf("no VP=2 in:\n%s", out)
			}
			if strings.Contains(name, "llama") { // grouped-query attention: 4 heads, 2 groups
				if ins := mustGotron(t, "ckpt", "inspect", g); !strings.Contains(ins, "4 heads (2 query groups)") {
					t.Errorf("ckpt inspect of the converted Llama:\n%s", ins)
				}
			}
			gd := readMegatronGolden(t, name)
			tokens := filepath.Join(tmp, "tokens.json")
			js, _ := json.Marshal(gd.Tokens)
			os.WriteFile(tokens, js, 0o644)
			for _, load := range []string{g, src} {
				npy := filepath.Join(tmp, "logits.npy")
				out := mustGotron(t, "score", "--load", load, "--tokens-file", tokens, "--out", npy)
				got, rows, cols := readNPY(t, npy)
				if rows != len(gd.Tokens) || cols != gd.Padded {
					t.Fatalf("%s: logits (%d, %d), want (%d, %d)", load, rows, cols, len(gd.Tokens), gd.Padded)
				}
				worst, worstAbs := 0.0, 0.0
				for i, row := range gd.Logits {
					for j, want := range row {
						d := math.Abs(float64(got[i*cols+j]) - want)
						worstAbs = math.Max(worstAbs, d)
						worst = math.Max(worst, d/math.Max(1, math.Abs(want)))
					}
				}
				if worst > tol {
					t.Fatalf("%s: max relative logit error %.3g > %g", load, worst, tol)
				}
				for i, lp := range gd.LogProbs {
					line := fmt.Sprintf("%8d %8d ", i+1, gd.Tokens[i+1])
					j := strings.Index(out, line)
					if j < 0 {
						t.Fatalf("no line %q in:\n%s", line, out)
					}
					got, _ := strconv.ParseFloat(strings.Fields(out[j:])[2], 64)
					if math.Abs(got-lp) > tol*math.Max(1, math.Abs(lp)) {
						t.Fatalf("%s: position %d logprob %.6f, want %.8f", load, i+1, got, lp)
					}
				}
				t.Logf("%s: max logit difference %.3g (relative %.3g)", load, worstAbs, worst)
			}
		})
	}
}

// TestConvertFromMegatronThenTrainAndExport: the converted checkpoint is an
// ordinary gotron checkpoint: package train starts from its weights, and
// convert --to hf exports it (logits of the unpadded vocabulary unchanged).
func TestConvertFromMegatronThenTrainAndExport(t *testing.T) {
	tmp := t.TempDir()
	g, s, hfOut := filepath.Join(tmp, "gotron"), filepath.Join(tmp, "trained"), filepath.Join(tmp, "hf")
	mustGotron(t, "convert", "--from", "megatron", "--load", megatronFixture("llama_tp2_pp2"), "--save", g, "--no-load-optim")
	if b, err := os.ReadFile(filepath.Join(g, "latest_checkpointed_iteration.txt")); err != nil || strings.TrimSpace(string(b)) != "0" {
		t.Errorf("converted checkpoint's tracker %q (%v), want iteration 0", b, err)
	}
	imported, ra, err := train.LoadModel(g)
	if err != nil {
		t.Fatal(err)
	}
	if ra.SeqLength != 32 || ra.CLI["megatron_iteration"] != "1200" {
		t.Errorf("recorded seq_length %d, cli %v", ra.SeqLength, ra.CLI)
	}
	cfg := train.Config{Model: ra.Model, SeqLength: 16, MicroBatchSize: 2, TrainIters: 2, Seed: 1234, Load: g, Save: s,
		SaveInterval: 2, LogInterval: 1}
	cfg.Schedule.LR = 1e-3
	tr, err := train.New(cfg, train.MockSource{SeqLength: 16, VocabSize: 100}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range tr.Model.Params() {
		q := imported.Params()[i].Float32s()
		for j, x := range p.Float32s() {
			if x != q[j] {
				t.Fatalf("trainer starts with %s different from the converted weights", p.Name)
			}
		}
	}
	res, err := tr.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Iteration != 2 || math.IsNaN(res.Losses[1]) {
		t.Fatalf("ran to %d with losses %v", res.Iteration, res.Losses)
	}

	mustGotron(t, "convert", "--to", "hf", "--load", g, "--save", hfOut, "--vocab-size", "100")
	gd := readMegatronGolden(t, "llama_tp2_pp2")
	tokens := filepath.Join(tmp, "tokens.json")
	js, _ := json.Marshal(gd.Tokens)
	os.WriteFile(tokens, js, 0o644)
	npy := filepath.Join(tmp, "hf.npy")
	mustGotron(t, "score", "--load", hfOut, "--tokens-file", tokens, "--out", npy)
	got, rows, cols := readNPY(t, npy)
	if rows != len(gd.Tokens) || cols != 100 {
		t.Fatalf("HF export logits (%d, %d), want (%d, 100)", rows, cols, len(gd.Tokens))
	}
	for i := range rows {
		for j := range cols {
			if want := gd.Logits[i][j]; math.Abs(float64(got[i*cols+j])-want) > 1e-5*math.Max(1, math.Abs(want)) {
				t.Fatalf("HF export: logit (%d, %d) = %g, want %g", i, j, got[i*cols+j], want)
			}
		}
	}
}

// copyMegatronFixture copies a fixture into a temporary directory.
func copyMegatronFixture(t *testing.T, name string) string {
	t.Helper()
	src, dst := megatronFixture(name), filepath.Join(t.TempDir(), name)
	err := filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if fi.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// setArgInPickle rewrites a torch.save zip, setting the args attribute key
// (None in the file) to the pickle opcodes val.
func setArgInPickle(t *testing.T, path, key, val string) {
	t.Helper()
	zr, err := zip.OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	patched := false
	for _, zf := range zr.File {
		rc, _ := zf.Open()
		b, _ := io.ReadAll(rc)
		rc.Close()
		if strings.HasSuffix(zf.Name, "data.pkl") {
			k := fmt.Sprintf("X%c\x00\x00\x00%s", len(key), key) // BINUNICODE key
			i := bytes.Index(b, []byte(k))
			if i < 0 {
				t.Fatalf("%s: no %s in data.pkl", path, key)
			}
			j := i + len(k)
			switch b[j] { // the key's memo store
			case 'q':
				j += 2
			case 'r':
				j += 5
			}
			if b[j] != 'N' {
				t.Fatalf("%s: %s is not None (opcode %q)", path, key, b[j])
			}
			b = append(append(append([]byte{}, b[:j]...), val...), b[j+1:]...)
			patched = true
		}
		w, _ := zw.CreateHeader(&zip.FileHeader{Name: zf.Name, Method: zip.Store})
		w.Write(b)
	}
	zr.Close()
	zw.Close()
	if !patched {
		t.Fatalf("%s: no data.pkl", path)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestConvertFromMegatronErrors: bad input gives a clear error naming the
// file at fault (and no panic, which would fail the test binary).
func TestConvertFromMegatronErrors(t *testing.T) {
	rank := func(dir, r string) string { return filepath.Join(dir, "iter_0001200", r, "model_optim_rng.pt") }
	cases := []struct {
		name  string
		edit  func(t *testing.T, dir string)
		wants []string
	}{
		{"missing rank", func(t *testing.T, dir string) {
			os.RemoveAll(filepath.Join(dir, "iter_0001200", "mp_rank_01_001"))
		}, []string{"{dir}/iter_0001200/mp_rank_01_001/model_optim_rng.pt is missing (args: tensor_model_parallel_size=2, pipeline_model_parallel_size=2, so 4 rank files are expected)"}},
		{"truncated .pt", func(t *testing.T, dir string) {
			b, _ := os.ReadFile(rank(dir, "mp_rank_00_001"))
			os.WriteFile(rank(dir, "mp_rank_00_001"), b[:len(b)-1000], 0o644)
		}, []string{"{dir}/iter_0001200/mp_rank_00_001/model_optim_rng.pt", "not a valid zip archive (truncated or corrupt?)"}},
		{"not a zip file", func(t *testing.T, dir string) {
			os.WriteFile(rank(dir, "mp_rank_01_000"), []byte("<html>not found</html>"), 0o644)
		}, []string{"{dir}/iter_0001200/mp_rank_01_000/model_optim_rng.pt", "not a PyTorch checkpoint"}},
		{"MoE args", func(t *testing.T, dir string) {
			setArgInPickle(t, rank(dir, "mp_rank_00_000"), "num_experts", "K\x08")
		}, []string{"{dir}/iter_0001200/mp_rank_00_000/model_optim_rng.pt: model.decoder.layers.0.mlp.linear_fc1.weight is not part of the model the args describe", "8 experts in 4 of 4 layers"}},
		{"sliding window args", func(t *testing.T, dir string) {
			setArgInPickle(t, rank(dir, "mp_rank_00_000"), "window_size", "M\x00\x10K\x00\x86")
		}, []string{"args.window_size=[4096 0]: sliding-window attention is not supported"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyMegatronFixture(t, "llama_tp2_pp2")
			c.edit(t, dir)
			save := filepath.Join(t.TempDir(), "out")
			_, errs, code := gotronHF(t, "convert", "--from", "megatron", "--load", dir, "--save", save)
			if code == 0 {
				t.Fatal("convert succeeded")
			}
			for _, w := range c.wants {
				if w = strings.ReplaceAll(w, "{dir}", dir); !strings.Contains(errs, w) {
					t.Errorf("stderr %q\nwant it to mention %q", errs, w)
				}
			}
			if _, err := os.Stat(save); err == nil {
				t.Errorf("a failed conversion wrote %s", save)
			}
		})
	}
	_, errs, code := gotronHF(t, "convert", "--from", "megatron", "--load", megatronFixture("gpt_tp2"), "--save", filepath.Join(t.TempDir(), "x"), "--seq-length", "33")
	if code == 0 || !strings.Contains(errs, "--seq-length=33: want 1..32") {
		t.Errorf("--seq-length 33: exit %d, %q", code, errs)
	}
	_, errs, code = gotronHF(t, "convert", "--from", "megatron", "--load", hfFixture("gpt2_tied_f32"), "--save", filepath.Join(t.TempDir(), "y"))
	if code == 0 || !strings.Contains(errs, "is not a Megatron checkpoint") {
		t.Errorf("an HF directory: exit %d, %q", code, errs)
	}
}

// TestTrainLoadMegatronDirSaysConvert: --load pointed at a Megatron
// checkpoint without --ckpt-format torch says how to load or convert it
// instead of a bare format error.
func TestTrainLoadMegatronDirSaysConvert(t *testing.T) {
	dir := filepath.Join("..", "..", "ckpt", "megatron", "testdata", "llama_tp2_pp2")
	_, errs, code := runCLI(t, with(tinyTrain, "--train-iters", "1", "--load", dir)...)
	if code == 0 || !strings.Contains(errs, "is a Megatron-LM (torch format) checkpoint: resume from it with --ckpt-format torch") || !strings.Contains(errs, "or convert it first with 'gotron convert --from megatron") {
		t.Fatalf("train --load MEGATRON_DIR: exit %d: %s", code, errs)
	}
}

// megatronExpected reads a fixture's optimizer.safetensors: the whole
// optimizer tensors the import must produce ("<kind>/<param>",
// "main_params/<param>") and their metadata.
func megatronExpected(t *testing.T, name string) (map[string][]float32, map[string]string) {
	t.Helper()
	f, err := safetensors.ReadFile(filepath.Join(megatronFixture(name), "optimizer.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]float32{}
	for k, ts := range f.Tensors() {
		v := make([]float32, len(ts.Data)/4)
		if err := ts.DecodeFloat32(v); err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	return out, f.Metadata()
}

// readCheckpointTensor reads a whole tensor of a gotron checkpoint.
func readCheckpointTensor(t *testing.T, r *ckpt.Reader, group, name string) []float32 {
	t.Helper()
	v, _, err := r.ReadWhole(group, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

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

// TestConvertFromMegatronOptimizer: convert --from megatron carries the
// optimizer state: the converted checkpoint resumes at Megatron's iteration
// with exactly the script's whole optimizer tensors (the fp32 main params
// as weights with bf16/fp16), the step count, the schedule, the sample
// counts and fp16's loss scaler.
func TestConvertFromMegatronOptimizer(t *testing.T) {
	for _, name := range megatronFixtures {
		t.Run(name, func(t *testing.T) {
			g := filepath.Join(t.TempDir(), "gotron")
			out := mustGotron(t, "convert", "--from", "megatron", "--load", megatronFixture(name), "--save", g)
			want, meta := megatronExpected(t, name)
			r, err := ckpt.Open(g, -1)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			it := r.Meta.Iteration
			for _, w := range []string{"optimizer: ", fmt.Sprintf("step %s; gotron train --load %s resumes at iteration %d (consumed samples %d)", meta["steps"], g, it, it*8)} {
				if !strings.Contains(out, w) {
					t.Errorf("convert output lacks %q:\n%s", w, out)
				}
			}
			if it == 0 || r.Meta.ConsumedTrainSamples != int64(it)*8 || r.Meta.ConsumedValidSamples != 80 || r.Meta.FloatingPointOperationsSoFar != 123456789 {
				t.Errorf("meta %+v", r.Meta)
			}
			var ra train.RunArgs
			if err := json.Unmarshal(r.Meta.Args, &ra); err != nil {
				t.Fatal(err)
			}
			if ra.OptimizerKind != meta["kind"] || strconv.FormatInt(ra.OptimizerSteps, 10) != meta["steps"] || ra.SeqLength != 32 {
				t.Errorf("args: optimizer %q steps %d seq %d, want %q %s", ra.OptimizerKind, ra.OptimizerSteps, ra.SeqLength, meta["kind"], meta["steps"])
			}
			if (ra.LossScaler != nil) != (meta["loss_scale"] != "") || (ra.LossScaler != nil && (ra.LossScaler.Scale != 65536 || ra.LossScaler.GrowthTracker != 17 || ra.LossScaler.HysteresisTracker != 2)) {
				t.Errorf("loss scaler %+v, want scale %q", ra.LossScaler, meta["loss_scale"])
			}
			var sched map[string]any
			if err := json.Unmarshal(r.Meta.Scheduler, &sched); err != nil || sched["num_steps"] != float64(it*8) || sched["lr_decay_style"] != "cosine" || sched["max_lr"] != 3e-4 {
				t.Errorf("scheduler %v (%v)", sched, err)
			}
			worst := map[string]float64{}
			opt := 0
			for k, v := range want {
				kind, param, _ := strings.Cut(k, "/")
				var got []float32
				if kind == "main_params" {
					got = readCheckpointTensor(t, r, ckpt.GroupModel, param)
				} else {
					got = readCheckpointTensor(t, r, ckpt.GroupOptimizer, k)
					opt++
				}
				d := maxAbsDiff(got, v)
				worst[kind] = math.Max(worst[kind], d)
				if d != 0 {
					t.Errorf("%s: max |difference| %g", k, d)
				}
			}
			if n := len(r.Tensors(ckpt.GroupOptimizer)); n != opt {
				t.Errorf("%d optimizer tensors, want %d", n, opt)
			}
			t.Logf("max |difference| from the script's tensors, by kind: %v", worst)
		})
	}
}

// TestConvertFromMegatronResumesAdam: gotron train --load of a converted
// checkpoint takes up Megatron's Adam moments and step count: one
// iteration from them (run A) and one from fresh moments (run B,
// --no-load-optim: the same weights, data, schedule and so gradient) give
// exp_avg_A = β1·m0 + exp_avg_B and exp_avg_sq_A = β2·v0 + exp_avg_sq_B
// exactly (float32, the kernel's own roundings), with m0, v0 the imported
// moments. llama_tp2_pp2's moments come from the non-distributed
// optimizer's section of its rank files, gpt_tp2_pp2_distopt's from the
// distributed optimizer's distrib_optim.pt files.
func TestConvertFromMegatronResumesAdam(t *testing.T) {
	for _, c := range []struct {
		name      string
		iteration int
		weight    string // a weight whose update the log reports
	}{{"llama_tp2_pp2", 1200, "output_layer.weight"}, {"gpt_tp2_pp2_distopt", 500, "embedding.word_embeddings.weight"}} {
		t.Run(c.name, func(t *testing.T) { testConvertFromMegatronResumesAdam(t, c.name, c.iteration, c.weight) })
	}
}

func testConvertFromMegatronResumesAdam(t *testing.T, fixture string, it int, weight string) {
	tmp := t.TempDir()
	g := filepath.Join(tmp, "gotron")
	mustGotron(t, "convert", "--from", "megatron", "--load", megatronFixture(fixture), "--save", g)
	ra, err := train.ReadRunArgs(g)
	if err != nil {
		t.Fatal(err)
	}
	const b1, b2 = 0.9, 0.95
	run := func(save string, noLoadOptim bool) (*ckpt.Reader, train.RunArgs) {
		cfg := train.Config{Model: ra.Model, SeqLength: 32, MicroBatchSize: 2, GlobalBatchSize: 8, TrainIters: int64(it) + 1, Seed: 1234,
			Load: g, Save: save, SaveInterval: int64(it) + 1, LogInterval: 1, NoLoadOptim: noLoadOptim, ClipGrad: 1,
			Adam: optim.AdamWConfig{Beta1: b1, Beta2: b2, Eps: 1e-8}}
		cfg.Schedule = optim.DefaultSchedulerFlags()
		cfg.Schedule.LR, cfg.Schedule.MinLR, cfg.Schedule.WeightDecay = 3e-4, 3e-5, 0.1
		cfg.Schedule.UseCheckpointOptParamScheduler = true
		tr, err := train.New(cfg, train.MockSource{SeqLength: 32, VocabSize: 100}, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := tr.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if res.Iteration != int64(it)+1 || len(res.Losses) != 1 || math.IsNaN(res.Losses[0]) {
			t.Fatalf("ran to %d with losses %v", res.Iteration, res.Losses)
		}
		r, err := ckpt.Open(save, -1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		var sra train.RunArgs
		if err := json.Unmarshal(r.Meta.Args, &sra); err != nil {
			t.Fatal(err)
		}
		return r, sra
	}
	a, raA := run(filepath.Join(tmp, "a"), false)
	b, raB := run(filepath.Join(tmp, "b"), true)
	if raA.OptimizerSteps != ra.OptimizerSteps+1 || raB.OptimizerSteps != 1 {
		t.Errorf("optimizer steps after one iteration: %d from the import (%d), %d fresh", raA.OptimizerSteps, ra.OptimizerSteps, raB.OptimizerSteps)
	}
	c, err := ckpt.Open(g, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	worst, moved := 0.0, 0.0
	for name := range c.Tensors(ckpt.GroupOptimizer) {
		kind, _, _ := strings.Cut(name, "/")
		beta := float32(b1)
		if kind == "exp_avg_sq" {
			beta = float32(b2)
		}
		m0 := readCheckpointTensor(t, c, ckpt.GroupOptimizer, name)
		mA := readCheckpointTensor(t, a, ckpt.GroupOptimizer, name)
		mB := readCheckpointTensor(t, b, ckpt.GroupOptimizer, name)
		want := make([]float32, len(m0))
		for i := range m0 {
			want[i] = float32(beta*m0[i]) + mB[i]
		}
		worst = math.Max(worst, maxAbsDiff(mA, want))
		moved = math.Max(moved, maxAbsDiff(mA, mB))
	}
	if worst != 0 || moved == 0 {
		t.Fatalf("moments after one step: max |A − (β·m0 + B)| = %g, max |A − B| = %g", worst, moved)
	}
	// The command line resumes from it too.
	out, errs, code := runCLI(t, "train", "--load", g, "--use-checkpoint-args", "--seq-length", "32", "--micro-batch-size", "2",
		"--global-batch-size", "8", "--lr", "3e-4", "--min-lr", "3e-5", "--weight-decay", "0.1", "--adam-beta2", "0.95",
		"--use-checkpoint-opt_param-scheduler", "--train-iters", strconv.Itoa(it+1), "--mock-data", "--vocab-size", "100",
		"--make-vocab-size-divisible-by", "64", "--log-interval", "1", "--eval-iters", "0")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("successfully loaded checkpoint from %s [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration %d (consumed samples %d,", g, it, it*8)) || !strings.Contains(out, fmt.Sprintf("iteration %8d/%8d", it+1, it+1)) {
		t.Fatalf("gotron train --load %s: exit %d\n%s\n%s", g, code, out, errs)
	}
	wA := readCheckpointTensor(t, a, ckpt.GroupModel, weight)
	wB := readCheckpointTensor(t, b, ckpt.GroupModel, weight)
	t.Logf("one step from the imported moments: exp_avg/exp_avg_sq match β·m0 + (fresh run's) exactly; they differ from the fresh run's by up to %g, %s's update by up to %g", moved, weight, maxAbsDiff(wA, wB))
}

// TestConvertFromMegatronOptimizerErrors: a truncated optimizer tensor is
// refused naming its file (with --no-load-optim the weights still
// convert); a distrib_optim.pt beside rank files whose args do not say
// --use-distributed-optimizer is not read: a warning, and a weights-only
// checkpoint; a malformed distrib_optim.pt is refused naming it, one in
// another layout gives the weights-only checkpoint with a warning.
func TestConvertFromMegatronOptimizerErrors(t *testing.T) {
	dir := copyMegatronFixture(t, "gpt_tp2_pp2_vp2")
	path := filepath.Join(dir, "iter_0000030", "mp_rank_01_001", "model_optim_rng.pt")
	truncateOptimizerRecord(t, path)
	save := filepath.Join(t.TempDir(), "out")
	_, errs, code := gotronHF(t, "convert", "--from", "megatron", "--load", dir, "--save", save)
	if code == 0 || !strings.Contains(errs, path) || !strings.Contains(errs, "truncated") {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if _, err := os.Stat(save); err == nil {
		t.Errorf("a failed conversion wrote %s", save)
	}

	dir = copyMegatronFixture(t, "llama_tp2_pp2")
	os.WriteFile(filepath.Join(dir, "iter_0001200", "mp_rank_00_001", "distrib_optim.pt"), nil, 0o644)
	out, errs, code := gotronHF(t, "convert", "--from", "megatron", "--load", dir, "--save", save)
	if code != 0 || !strings.Contains(errs, "warning: optimizer state not imported: "+filepath.Join(dir, "iter_0001200", "mp_rank_00_001", "model_optim_rng.pt")+" has a distrib_optim.pt beside it") ||
		!strings.Contains(out, "weights only: the optimizer state in the checkpoint is not converted (see the warning)") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, out, errs)
	}
	if b, err := os.ReadFile(filepath.Join(save, "latest_checkpointed_iteration.txt")); err != nil || strings.TrimSpace(string(b)) != "0" {
		t.Errorf("tracker %q (%v), want 0", b, err)
	}

	// The distributed optimizer: a malformed distrib_optim.pt is an error
	// naming it; one in a layout gotron does not read converts the weights
	// with a warning naming it.
	for _, c := range []struct {
		file string
		ok   bool
		want string
	}{
		{"wrong_size.pt", false, ": gradient buffer 0 (bfloat16, float32): param has shape [7], want [8] (numel_unpadded)"},
		{"sharding_type.pt", true, ": param_state_sharding_type fully_reshardable: gotron reads the dp_zero_gather_scatter layout"},
	} {
		dir = copyMegatronFixture(t, "gpt_tp2_pp2_distopt")
		dist := filepath.Join(dir, "iter_0000500", "mp_rank_01_001", "distrib_optim.pt")
		b, err := os.ReadFile(filepath.Join(megatronFixture("distrib_optim_malformed"), c.file))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(dist, b, 0o644)
		save := filepath.Join(t.TempDir(), "out")
		out, errs, code := gotronHF(t, "convert", "--from", "megatron", "--load", dir, "--save", save)
		if !c.ok {
			if code == 0 || !strings.Contains(errs, dist+c.want) {
				t.Errorf("%s: exit %d\n%s", c.file, code, errs)
			}
			if _, err := os.Stat(save); err == nil {
				t.Errorf("%s: a failed conversion wrote %s", c.file, save)
			}
			continue
		}
		if code != 0 || !strings.Contains(errs, "warning: optimizer state not imported: "+dist+c.want) ||
			!strings.Contains(out, "weights only: the optimizer state in the checkpoint is not converted (see the warning)") {
			t.Errorf("%s: exit %d\nstdout %s\nstderr %s", c.file, code, out, errs)
		}
	}
}

// truncateOptimizerRecord cuts short the zip record of the first Adam
// moment in the rank file's optimizer section (as a copy interrupted
// mid-file would leave a record) and rewrites the archive.
func truncateOptimizerRecord(t *testing.T, path string) {
	t.Helper()
	f, err := torchpt.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	sd := f.Root.(*torchpt.Dict)
	o, _ := sd.Get("optimizer")
	st, _ := o.(*torchpt.Dict).Get("state")
	e, _ := st.(*torchpt.Dict).Get(int64(0))
	x, _ := e.(*torchpt.Dict).Get("exp_avg")
	key := "data/" + x.(*torchpt.Tensor).Storage.Key
	f.Close()
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
		if strings.HasSuffix(zf.Name, "/"+key) {
			b = b[:len(b)/2]
		}
		w, _ := zw.CreateHeader(&zip.FileHeader{Name: zf.Name, Method: zip.Store})
		w.Write(b)
	}
	zr.Close()
	zw.Close()
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
