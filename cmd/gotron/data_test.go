package main

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func preprocessToy(t *testing.T) (dir, prefix string) {
	t.Helper()
	dir = t.TempDir()
	in := specJSONL(t, dir)
	if code, _, errs := runGotronLocal(t, "preprocess", "--input", in, "--output-prefix", filepath.Join(dir, "toy"),
		"--tokenizer-type", "NullTokenizer", "--vocab-size", "100"); code != 0 {
		t.Fatalf("preprocess: %s", errs)
	}
	return dir, filepath.Join(dir, "toy_text_document")
}

// TestDataSamplesSpec prints train item 0 and valid item 0 of Megatron's
// reference values (computed by its GPTDataset).
func TestDataSamplesSpec(t *testing.T) {
	dir, prefix := preprocessToy(t)
	cases := []struct {
		split string
		want  []int32
	}{
		{"train", []int32{18, 19, 20, 21, 22, 99, 99, 18}},
		{"valid", []int32{99, 45, 46, 47, 48, 99, 36, 37}},
	}
	for _, c := range cases {
		code, out, errs := runGotronLocal(t, "data", "samples", "--data-path", prefix, "--split", "80,20,0", "--seq-length", "8",
			"--num-samples", "20,3,0", "--split-name", c.split, "--first", "1", "--data-cache-path", filepath.Join(dir, "cache"),
			"--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--eod-mask-loss", "--reset-position-ids")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		var s sampleJSON
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatalf("%q: %v", out, err)
		}
		if s.Split != c.split || s.Index != 0 || !slices.Equal(s.Tokens, c.want) {
			t.Errorf("%s: %+v, want tokens %v", c.split, s, c.want)
		}
		for i, tok := range s.Tokens {
			if (tok == 99) != (s.LossMask[i] == 0) {
				t.Errorf("%s: loss mask %v with --eod-mask-loss", c.split, s.LossMask)
			}
		}
		if c.split == "train" && !slices.Equal(s.PositionIDs, []int32{0, 1, 2, 3, 4, 5, 0, 0}) {
			t.Errorf("position ids %v with --reset-position-ids", s.PositionIDs)
		}
	}
}

func TestDataSamplesAllAndErrors(t *testing.T) {
	_, prefix := preprocessToy(t)
	code, out, errs := runGotronLocal(t, "data", "samples", "--data-path", prefix, "--split", "80,20,0", "--seq-length", "8",
		"--num-samples", "20", "--first", "0", "--eod-id", "99")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if n := strings.Count(out, "\n"); n != 22 {
		t.Errorf("%d samples printed, want all 22", n)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"samples", "--data-path", prefix, "--seq-length", "1"}, "--seq-length"},
		{[]string{"samples", "--data-path", prefix, "--seq-length", "8", "--split-name", "dev"}, "--split-name"},
		{[]string{"samples", "--data-path", prefix, "--seq-length", "8", "--num-samples", "a,b"}, "--num-samples"},
		{[]string{"samples", "--data-path", prefix, "--seq-length", "8", "--split", "80,20,0", "--split-name", "test"}, "test split is empty"},
		{[]string{"samples", "--data-path", prefix, "--seq-length", "8", "--eod-mask-loss"}, "EOD id"},
		{[]string{"samples", "--data-path", prefix + "x", "--seq-length", "8"}, "toy_text_documentx.idx"},
		{[]string{"sample"}, "did you mean \"samples\""},
		{[]string{"inspect"}, "want one dataset prefix"},
	}
	for _, c := range cases {
		code, _, errs := runGotronLocal(t, append([]string{"data"}, c.args...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want mention of %q", c.args, code, errs, c.want)
		}
	}
}

func TestDataInspect(t *testing.T) {
	_, prefix := preprocessToy(t)
	code, out, errs := runGotronLocal(t, "data", "inspect", prefix)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"dtype      uint16 (code 8)", "documents  10 (0 empty)", "sequences  10", "tokens     50",
		"min 1, mean 5.0, max 9", "1 – 1          1", "8 – 15         2"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
}
