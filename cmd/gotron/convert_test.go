package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/hf"
	"github.com/gotron/gotron/ckpt/hf/hftest"
	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/train"
)

func hfFixture(name string) string { return filepath.Join("..", "..", "ckpt", "hf", "testdata", name) }

// gotronHF runs one gotron command in-process.
func gotronHF(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	env := &cli{stdout: &out, stderr: &errb, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
	code = run(context.Background(), env, args)
	return out.String(), errb.String(), code
}

func mustGotron(t *testing.T, args ...string) string {
	t.Helper()
	out, errs, code := gotronHF(t, args...)
	if code != 0 {
		t.Fatalf("gotron %s: exit %d: %s", strings.Join(args, " "), code, errs)
	}
	return out
}

func jsonFile(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

// TestConvertRoundTrip: HF → gotron checkpoint → HF gives byte-identical
// tensors (F32, BF16, F16, single and sharded input), the same config.json
// and the same tokenizer files.
func TestConvertRoundTrip(t *testing.T) {
	for _, fx := range hftest.Fixtures() {
		t.Run(fx.Name, func(t *testing.T) {
			src, tmp := hfFixture(fx.Name), t.TempDir()
			g, out := filepath.Join(tmp, "gotron"), filepath.Join(tmp, "hf")
			mustGotron(t, "convert", "--from", "hf", "--load", src, "--save", g)
			if _, err := os.Stat(filepath.Join(g, "latest_checkpointed_iteration.txt")); err != nil {
				t.Fatalf("import wrote no gotron checkpoint: %v", err)
			}
			if hf.IsHFDir(g) {
				t.Fatalf("gotron checkpoint %s taken for an HF directory", g)
			}
			mustGotron(t, "convert", "--to", "hf", "--load", g, "--save", out)
			want, got := hftest.Tensors(t, src), hftest.Tensors(t, out)
			if !slices.Equal(sortedNames(want), sortedNames(got)) {
				t.Fatalf("tensors:\nwant %v\ngot  %v", sortedNames(want), sortedNames(got))
			}
			for n, w := range want {
				x := got[n]
				if w.DType != x.DType || !reflect.DeepEqual(w.Shape, x.Shape) || !bytes.Equal(w.Data, x.Data) {
					t.Fatalf("%s: got %s %v, want %s %v, bytes equal %v", n, x.DType, x.Shape, w.DType, w.Shape, bytes.Equal(w.Data, x.Data))
				}
			}
			if wc, gc := jsonFile(t, filepath.Join(src, "config.json")), jsonFile(t, filepath.Join(out, "config.json")); !reflect.DeepEqual(wc, gc) {
				t.Fatalf("config.json:\nwant %v\ngot  %v", wc, gc)
			}
			for _, name := range hf.TokenizerFileNames() {
				a, errA := os.ReadFile(filepath.Join(src, name))
				b, errB := os.ReadFile(filepath.Join(out, name))
				if name == hf.GenerationConfigFile && errA != nil && errB == nil {
					// Written by the export when the source has none: config.json's ids.
					gc, c := jsonFile(t, filepath.Join(out, name)), jsonFile(t, filepath.Join(src, "config.json"))
					if gc["bos_token_id"] != c["bos_token_id"] || gc["eos_token_id"] != c["eos_token_id"] {
						t.Fatalf("generation_config.json %v, config.json ids %v %v", gc, c["bos_token_id"], c["eos_token_id"])
					}
					continue
				}
				if (errA == nil) != (errB == nil) || !bytes.Equal(a, b) {
					t.Fatalf("tokenizer file %s not carried: source err %v, exported err %v", name, errA, errB)
				}
			}
		})
	}
}

func sortedNames(m map[string]safetensors.Tensor) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	slices.Sort(k)
	return k
}

// TestConvertDTypeAndShards: --dtype and --max-shard-size on export.
func TestConvertDTypeAndShards(t *testing.T) {
	tmp := t.TempDir()
	g, out := filepath.Join(tmp, "g"), filepath.Join(tmp, "hf")
	mustGotron(t, "convert", "--from", "hf", "--load", hfFixture("gpt2_tied_f32"), "--save", g)
	mustGotron(t, "convert", "--to", "hf", "--load", g, "--save", out, "--dtype", "float16", "--max-shard-size", "40KB")
	if _, err := os.Stat(filepath.Join(out, "model.safetensors.index.json")); err != nil {
		t.Fatalf("no shard index: %v", err)
	}
	for n, x := range hftest.Tensors(t, out) {
		if x.DType != safetensors.F16 {
			t.Fatalf("%s is %s, want F16", n, x.DType)
		}
	}
	if c := jsonFile(t, filepath.Join(out, "config.json")); c["torch_dtype"] != "float16" {
		t.Fatalf("torch_dtype %v", c["torch_dtype"])
	}
}

// TestConvertErrors: bad flags and directories are errors that say what is
// wrong.
func TestConvertErrors(t *testing.T) {
	tmp := t.TempDir()
	g := filepath.Join(tmp, "g")
	mustGotron(t, "convert", "--from", "hf", "--load", hfFixture("llama_gqa_tied_bf16"), "--save", g)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--from", "hf", "--save", "x"}, "--load and --save are required"},
		{[]string{"--from", "hf", "--to", "hf", "--load", "a", "--save", "b"}, "exactly one of --from (hf or megatron) and --to hf"},
		{[]string{"--from", "nemo", "--load", "a", "--save", "b"}, `--from="nemo": want hf or megatron`},
		{[]string{"--from", "hf", "--load", g, "--save", filepath.Join(tmp, "x")}, "is not a Hugging Face model directory"},
		{[]string{"--to", "hf", "--load", g, "--save", filepath.Join(tmp, "y"), "--dtype", "int8"}, "--dtype"},
		{[]string{"--to", "hf", "--load", g, "--save", filepath.Join(tmp, "y"), "--max-shard-size", "lots"}, "--max-shard-size"},
		{[]string{"--to", "hf", "--load", g, "--save", filepath.Join(tmp, "y"), "--vocab-size", "1000"}, "--vocab-size=1000"},
		{[]string{"--to", "hf", "--load", filepath.Join(tmp, "none"), "--save", filepath.Join(tmp, "y")}, "no checkpoint"},
		{[]string{"--from", "hf", "--load", hfFixture("gpt2_tied_f32"), "--save", filepath.Join(tmp, "z"), "--seq-length", "17"}, "--seq-length=17"},
		{[]string{"--from", "hf", "--load", hfFixture("gpt2_tied_f32"), "--save", "s", "--dtyp", "x"}, "did you mean --dtype"},
	}
	for _, c := range cases {
		_, errs, code := gotronHF(t, append([]string{"convert"}, c.args...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("convert %v: exit %d, stderr %q, want it to mention %q", c.args, code, errs, c.want)
		}
	}
	if got, err := parseByteSize("5GB"); err != nil || got != 5e9 {
		t.Errorf("5GB = %d, %v", got, err)
	}
	if got, err := parseByteSize("2GiB"); err != nil || got != 2<<30 {
		t.Errorf("2GiB = %d, %v", got, err)
	}
}

// TestTrainResumesFromImportAndExportLoadsBack: package train starts from an
// imported checkpoint (its model equals the HF weights), trains a few
// iterations and saves; exporting that checkpoint and importing the export
// gives the trained weights back exactly (padding rows aside) and the same
// logits.
func TestTrainResumesFromImportAndExportLoadsBack(t *testing.T) {
	tmp := t.TempDir()
	src := hfFixture("llama_gqa_untied_f32")
	g, s, out := filepath.Join(tmp, "imported"), filepath.Join(tmp, "trained"), filepath.Join(tmp, "exported")
	mustGotron(t, "convert", "--from", "hf", "--load", src, "--save", g)
	ref, info, err := hf.LoadModel(src)
	if err != nil {
		t.Fatal(err)
	}
	imported, ra, err := train.LoadModel(g)
	if err != nil {
		t.Fatal(err)
	}
	cfg := train.Config{Model: ra.Model, SeqLength: 16, MicroBatchSize: 2, TrainIters: 3, Seed: 1234, Load: g, Save: s,
		SaveInterval: 3, LogInterval: 1}
	cfg.Schedule.LR = 1e-3
	mock := train.MockSource{SeqLength: 16, VocabSize: info.VocabSize}
	tr, err := train.New(cfg, mock, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range tr.Model.Params() {
		if !slices.Equal(p.Float32s(), ref.Params()[i].Float32s()) || !slices.Equal(p.Float32s(), imported.Params()[i].Float32s()) {
			t.Fatalf("trainer starts with %s different from the HF weights", p.Name)
		}
	}
	res, err := tr.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Iteration != 3 || len(res.Losses) != 3 || math.IsNaN(res.Losses[2]) {
		t.Fatalf("ran to %d with losses %v", res.Iteration, res.Losses)
	}
	trained := tr.Model
	changed := false
	for i, p := range trained.Params() {
		changed = changed || !slices.Equal(p.Float32s(), ref.Params()[i].Float32s())
	}
	if !changed {
		t.Fatal("training did not change the weights")
	}
	mustGotron(t, "convert", "--to", "hf", "--load", s, "--save", out, "--vocab-size", "100")
	back, _, err := hf.LoadModel(out)
	if err != nil {
		t.Fatal(err)
	}
	h, V := trained.Config.HiddenSize, info.VocabSize
	for i, p := range trained.Params() {
		want, got := p.Float32s(), back.Params()[i].Float32s()
		if p.Dim(0) == trained.Config.VocabSize { // embedding, output layer: padding is dropped
			if !slices.Equal(got[:V*h], want[:V*h]) || slices.ContainsFunc(got[V*h:], func(x float32) bool { return x != 0 }) {
				t.Fatalf("%s: exported rows differ or padding not zero", p.Name)
			}
			continue
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s differs after export and import", p.Name)
		}
	}
	ids := []int32{3, 17, 42, 99, 5, 5, 64, 1}
	a, b := scoreLogits(trained, ids, V), scoreLogits(back, ids, V)
	if !slices.Equal(a, b) {
		t.Fatal("logits of the trained model and of its export differ")
	}
}
