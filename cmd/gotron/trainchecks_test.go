package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryNumericTrainFlagHasARule: each integer and float flag of gotron
// train has a range in trainNumberRules, each rule names a flag, and the
// defaults are in range.
func TestEveryNumericTrainFlagHasARule(t *testing.T) {
	fs, _ := newTrainFlags()
	fs.VisitAll(func(fl *flag.Flag) {
		g, ok := fl.Value.(flag.Getter)
		if !ok {
			return
		}
		switch g.Get().(type) {
		case int, int64, uint, uint64, float64:
			if _, ok := trainNumberRules[fl.Name]; !ok {
				t.Errorf("numeric flag --%s has no rule in trainNumberRules", fl.Name)
			}
		}
	})
	for name := range trainNumberRules {
		if fs.Lookup(name) == nil {
			t.Errorf("trainNumberRules names --%s, which gotron train does not define", name)
		}
	}
	if err := checkNumbers(trainNumberRules, flagText(fs)); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

// TestTrainRefusesNumbersOutsideTheirMeaning: flags whose value makes no
// sense are refused before the run starts, naming the flag and the range
// (they used to run: a negative --clip-grad switched clipping off, a zero
// --log-interval logged every iteration, a negative --save-interval saved
// at multiples of it).
func TestTrainRefusesNumbersOutsideTheirMeaning(t *testing.T) {
	for _, c := range []struct {
		flag, value, want string
	}{
		{"--log-interval", "-5", "--log-interval: -5 is out of range: must be at least 1"},
		{"--log-interval", "0", "--log-interval: 0 is out of range: must be at least 1"},
		{"--eval-interval", "0", "--eval-interval: 0 is out of range: must be at least 1 (iterations between evaluations; --eval-iters 0 turns evaluation off)"},
		{"--save-interval", "-2", "--save-interval: -2 is out of range: must be at least 0"},
		{"--exit-interval", "-1", "--exit-interval: -1 is out of range: must be at least 0"},
		{"--exit-duration-in-mins", "-3", "--exit-duration-in-mins: -3 is out of range: must be at least 0"},
		{"--exit-duration-in-mins", "1e300", "--exit-duration-in-mins: 1e+300 is out of range: must be at least 0 and at most 1e+08"},
		{"--clip-grad", "-1", "--clip-grad: -1 is out of range: must be at least 0 (the global gradient L2 norm to clip to; 0 turns clipping off)"},
		{"--clip-grad", "NaN", `--clip-grad: "NaN" is not a finite number`},
		{"--tensorboard-log-interval", "0", "--tensorboard-log-interval: 0 is out of range"},
		{"--train-iters", "-1", "--train-iters: -1 is out of range: must be between 0 and 1099511627776"},
		{"--seed", "-7", "--seed: -7 is out of range: must be between 0 and 4294967295"},
		{"--distributed-timeout-minutes", "-1", "--distributed-timeout-minutes: -1 is out of range"},
		{"--seq-length", "4294967296", "--seq-length: 4294967296 is out of range: must be between 0 and 2147483647"},
		{"--attention-dropout", "1", "--attention-dropout: 1 is out of range: must be at least 0 and at most 0.999999"},
	} {
		t.Run(c.flag+"="+c.value, func(t *testing.T) {
			args := append(append([]string{}, tinyTrain...), "--train-iters", "2", c.flag, c.value)
			out, errs, code := runCLI(t, args...)
			if code != 1 || !strings.Contains(errs, c.want) {
				t.Fatalf("exit %d, stderr %q, want %q\n%s", code, errs, c.want, out)
			}
			if strings.Contains(out, "iteration ") {
				t.Fatalf("trained before refusing:\n%s", out)
			}
		})
	}
}

// TestTrainSampleCountsDoNotWrap: iterations × global batch beyond 2^63
// is refused (it used to wrap negative).
func TestTrainSampleCountsDoNotWrap(t *testing.T) {
	if _, err := trainValidTestSamples(1<<40, 1<<30, 1<<30, 1, 1); err == nil || !strings.Contains(err.Error(), "more than 2^63 samples") {
		t.Fatalf("err = %v", err)
	}
	num, err := trainValidTestSamples(10, 4, 4, 5, 2)
	if err != nil || num != [3]int64{40, (10/5 + 1) * 2 * 4, 8} {
		t.Fatalf("num = %v, %v", num, err)
	}
	// --eval-global-batch-size sizes the validation and test splits, as
	// Megatron's get_train_valid_test_num_samples.
	num, err = trainValidTestSamples(10, 4, 6, 5, 2)
	if err != nil || num != [3]int64{40, (10/5 + 1) * 2 * 6, 12} {
		t.Fatalf("num with an evaluation batch of 6 = %v, %v", num, err)
	}
}

// TestTrainListsMissingFlags: gotron train with flags that are not enough
// for a run says it is not the quickstart and names every missing flag at
// once (it used to name one per attempt).
func TestTrainListsMissingFlags(t *testing.T) {
	_, errs, code := runCLI(t, "train", "--lr", "1e-3", "--hidden-size", "64")
	want := "not the quickstart (gotron train with no flags, or only --quickstart-dir, runs that); missing required flags: " +
		"--num-layers, --num-attention-heads (or --model PRESET); --seq-length; --micro-batch-size; --train-iters or --train-samples; " +
		"--data-path (or --train-data-path ...) or --mock-data"
	if code != 1 || !strings.Contains(errs, want) {
		t.Fatalf("exit %d, stderr %q\nwant %q", code, errs, want)
	}
	_, errs, code = runCLI(t, "train", "--model", "tiny", "--mock-data", "--seq-length", "16", "--micro-batch-size", "1", "--train-iters", "1")
	if code != 1 || !strings.HasSuffix(strings.TrimSpace(errs), "missing required flags: --lr") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}

// TestConfigFileListForScalarFlag: a YAML list where a flag takes one value
// is refused naming the key (save: [a, b] used to save into "a b"); list
// flags still take lists.
func TestConfigFileListForScalarFlag(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(p, []byte("save: [a, b]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errs, code := runCLI(t, append(append([]string{}, tinyTrain...), "--train-iters", "1", "--config", p)...)
	want := `key "save": value [a b] is a YAML list; flag --save takes a single value`
	if code != 1 || !strings.Contains(errs, want) {
		t.Fatalf("exit %d, stderr %q, want %q", code, errs, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "a b")); err == nil {
		t.Fatal(`a directory "a b" was made`)
	}
}

// TestTrainRefusesIDsBeyondTheTokenizer: a dataset holding ids inside the
// padded vocabulary (128) but beyond the tokenizer's (50) is refused,
// naming the data file and the id, as serve refuses such ids (train used
// to accept them).
func TestTrainRefusesIDsBeyondTheTokenizer(t *testing.T) {
	_, prefix := preprocessToy(t) // ids 0..99
	out, errs, code := runCLI(t, "train", "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
		"--seq-length", "4", "--micro-batch-size", "1", "--lr", "1e-3", "--train-iters", "3", "--eval-iters", "0",
		"--data-path", prefix, "--split", "100,0,0", "--tokenizer-type", "NullTokenizer", "--vocab-size", "50",
		"--make-vocab-size-divisible-by", "128", "--no-progress")
	want := "toy_text_document.bin: sequence "
	if code != 1 || !strings.Contains(errs, want) || !strings.Contains(errs, "is outside the tokenizer's vocabulary of 50 (0 to 49)") {
		t.Fatalf("exit %d, stderr %q, want %q\n%s", code, errs, want, out)
	}
}

// TestDataCommandsRefuseNumbersOutsideTheirMeaning: gotron preprocess and
// gotron data samples check their numeric flags with the same rules (a zero
// --partitions or --log-interval used to become 1 or 1000 silently).
func TestDataCommandsRefuseNumbersOutsideTheirMeaning(t *testing.T) {
	dir := t.TempDir()
	in := specJSONL(t, dir)
	pre := []string{"preprocess", "--input", in, "--output-prefix", filepath.Join(dir, "x"), "--tokenizer-type", "NullTokenizer", "--vocab-size", "100"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(append([]string{}, pre...), "--partitions", "0"), "--partitions: 0 is out of range: must be between 1 and 4096"},
		{append(append([]string{}, pre...), "--workers", "0"), "--workers: 0 is out of range: must be between 1 and 65536"},
		{append(append([]string{}, pre...), "--log-interval", "0"), "--log-interval: 0 is out of range: must be at least 1"},
		{append(append([]string{}, pre...), "--vocab-size", "-3"), "--vocab-size: -3 is out of range"},
		{[]string{"data", "samples", "--data-path", "x", "--seq-length", "8", "--first", "-1"}, "--first: -1 is out of range"},
		{[]string{"data", "samples", "--data-path", "x", "--seq-length", "8", "--seed", "-1"}, "--seed: -1 is out of range"},
	} {
		code, out, errs := runGotronLocal(t, c.args...)
		if code != 1 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q\n%s", c.args, code, errs, c.want, out)
		}
	}
}

// TestMemoryChecksTrainNumbers: gotron memory takes train's flags and
// checks them with train's rules.
func TestMemoryChecksTrainNumbers(t *testing.T) {
	code, out, errs := runGotronLocal(t, "memory", "--world-size", "1", "--model", "tiny", "--seq-length", "16",
		"--micro-batch-size", "1", "--tensor-model-parallel-size", "-2")
	if want := "--tensor-model-parallel-size: -2 is out of range: must be between 1 and 16777216"; code != 1 || !strings.Contains(errs, want) {
		t.Fatalf("exit %d, stderr %q, want %q\n%s", code, errs, want, out)
	}
}
