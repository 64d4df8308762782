package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/internal/meminfo"
)

// TestTrainProbeFlagErrors runs the bad model flags that used to panic (a
// negative size reached tensor shapes) or were accepted silently, and wants
// exit status 1 with an error naming the flag.
func TestTrainProbeFlagErrors(t *testing.T) {
	cases := []struct {
		extra []string
		want  string
	}{
		{[]string{"--ffn-hidden-size", "-1"}, "--ffn-hidden-size: -1 is out of range"},
		{[]string{"--kv-channels", "-1"}, "--kv-channels: -1 is out of range"},
		{[]string{"--group-query-attention", "--num-query-groups", "-1"}, "--num-query-groups: -1 is out of range"},
		{[]string{"--norm-epsilon", "-1"}, "--norm-epsilon: -1 is out of range"},
		{[]string{"--max-nan-iterations", "-1"}, "--max-nan-iterations: -1 is out of range"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.extra, " "), func(t *testing.T) {
			args := append(append(append([]string{}, tinyTrain...), "--train-iters", "1"), c.extra...)
			_, errs, code := runCLI(t, args...)
			if code != 1 || !strings.Contains(errs, c.want) {
				t.Fatalf("exit %d, stderr %q: want exit 1 naming %q", code, errs, c.want)
			}
		})
	}
}

// TestTrainRefusesWhatCannotFit: sizes that used to end in a fatal
// out-of-memory abort are refused before allocating, with the estimate and
// the machine's memory.
func TestTrainRefusesWhatCannotFit(t *testing.T) {
	if _, ok := meminfo.Read(); !ok {
		t.Skip("no /proc/meminfo: train.CheckMemory cannot know the machine's memory here")
	}
	for _, extra := range [][]string{
		{"--num-layers", "100000", "--hidden-size", "100000"},
		{"--seq-length", "300000", "--micro-batch-size", "64", "--global-batch-size", "64"},
	} {
		t.Run(strings.Join(extra, " "), func(t *testing.T) {
			args := append(append(append([]string{}, tinyTrain...), "--train-iters", "1"), extra...)
			_, errs, code := runCLI(t, args...)
			if code != 1 || !strings.Contains(errs, "needs an estimated") || !strings.Contains(errs, "/proc/meminfo") {
				t.Fatalf("exit %d, stderr %q", code, errs)
			}
		})
	}
}

// TestPreprocessInvalidUTF8 checks --replace-invalid-utf8: without it a line
// with invalid UTF-8 stops the run at FILE:LINE (it used to be replaced
// silently).
func TestPreprocessInvalidUTF8(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(in, []byte("{\"text\": \"1 2 3\"}\n{\"text\": \"4 5\", \"note\": \"\xff\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"preprocess", "--input", in, "--output-prefix", filepath.Join(dir, "out"),
		"--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--workers", "1"}
	_, errs, code := runCLI(t, args...)
	if code != 1 || !strings.Contains(errs, in+":2: invalid UTF-8 byte 0xff") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	out, errs, code := runCLI(t, append(args, "--replace-invalid-utf8")...)
	if code != 0 || !strings.Contains(out, "2 documents, 5 tokens") {
		t.Fatalf("--replace-invalid-utf8: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestDataSamplesLongerThanData: a --seq-length longer than the split's data
// is an error (it used to print nothing and exit 0).
func TestDataSamplesLongerThanData(t *testing.T) {
	_, prefix := preprocessToy(t) // 50 tokens
	code, out, errs := runGotronLocal(t, "data", "samples", "--data-path", prefix, "--seq-length", "4096", "--eod-id", "99", "--split", "100,0,0")
	if code != 1 || !strings.Contains(errs, "the train split has no samples of --seq-length 4096") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestConfigFileTypeErrors: a --config value of the wrong type names the
// key, the value, its YAML type and what the flag wants (it used to say
// only "parse error").
func TestConfigFileTypeErrors(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{"num_layers: two\n", `key "num_layers": value "two" (YAML string) is not an integer (flag --num-layers)`},
		{"lr: fast\n", `key "lr": value "fast" (YAML string) is not a number (flag --lr)`},
		{"num_layers: 2.5\n", `key "num_layers": value 2.5 (YAML float) is not an integer (flag --num-layers)`},
		{"mock_data: 3\n", `key "mock_data": value 3 (YAML integer) is not a boolean (true or false) (flag --mock-data)`},
		{"num_layers: [1, 2]\n", `key "num_layers": value [1 2] is a YAML list; flag --num-layers takes a single value`},
		{"num_layers: {a: 1}\n", `key "num_layers": a mapping, want a value for flag --num-layers`},
	}
	for _, c := range cases {
		t.Run(c.yaml, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(p, []byte(c.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			_, errs, code := runCLI(t, "train", "--config", p)
			if code != 1 || !strings.Contains(errs, c.want) {
				t.Fatalf("exit %d, stderr %q, want %q", code, errs, c.want)
			}
		})
	}
}

// TestNonFiniteWeightsWarn: NaN and Inf weights import, convert and score
// with a warning naming the tensor (they used to pass without a word).
func TestNonFiniteWeightsWarn(t *testing.T) {
	src := t.TempDir()
	ents, err := os.ReadDir(hfFixture("gpt2_tied_f32"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(hfFixture("gpt2_tied_f32"), e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st := filepath.Join(src, "model.safetensors")
	f, err := safetensors.ReadFile(st)
	if err != nil {
		t.Fatal(err)
	}
	ts := f.Tensors()
	x := ts["transformer.ln_f.weight"]
	vals := make([]float32, x.NumElements())
	if err := x.DecodeFloat32(vals); err != nil {
		t.Fatal(err)
	}
	vals[0], vals[1], vals[2] = float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))
	if ts["transformer.ln_f.weight"], err = safetensors.FromFloat32(safetensors.F32, x.Shape, vals); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.WriteFile(st, ts, nil); err != nil {
		t.Fatal(err)
	}
	f.Close()
	const want = "tensor decoder.final_layernorm.weight has 1 NaN and 2 infinite values (of 32)"
	dst := filepath.Join(t.TempDir(), "g")
	ids := filepath.Join(t.TempDir(), "ids.json")
	os.WriteFile(ids, []byte("[1, 2]"), 0o644)
	for _, args := range [][]string{
		{"convert", "--from", "hf", "--load", src, "--save", dst},
		{"score", "--load", dst, "--tokens-file", ids},
		{"convert", "--to", "hf", "--load", dst, "--save", filepath.Join(t.TempDir(), "hf")},
	} {
		_, errs, code := gotronHF(t, args...)
		if code != 0 || !strings.Contains(errs, want) {
			t.Errorf("gotron %s: exit %d, stderr %q", strings.Join(args, " "), code, errs)
		}
	}
}
