package gpt

import (
	"fmt"
	"strings"
	"testing"
)

// specSizes are the sequence lengths of the toy dataset of Megatron's
// reference values.
var specSizes = []int32{5, 3, 8, 2, 6, 4, 7, 1, 9, 5}

func span(lo, hi int32) []int32 {
	var out []int32
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}

func pairs(flat []int64) string {
	s := "["
	for j := 0; j < len(flat); j += 2 {
		if j > 0 {
			s += ","
		}
		s += fmt.Sprintf("[%d,%d]", flat[j], flat[j+1])
	}
	return s + "]"
}

func list[T any](x []T) string {
	s := "["
	for i, v := range x {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprint(v)
	}
	return s + "]"
}

// TestSpecIndexVectors checks Megatron's reference values (computed by its
// GPTDataset, megatron/core/datasets/gpt_dataset.py): L=8, x=1, seed 1234,
// split "80,20,0".
func TestSpecIndexVectors(t *testing.T) {
	cases := []struct {
		name        string
		indices     []int32
		n           int64
		epochs      int
		separate    bool
		doc, sample string
		shuffle     string
	}{
		{"train n=20", span(0, 8), 20, 5, false,
			"[0,7,6,1,4,7,4,1,5,5,0,7,3,2,6,2,2,5,3,2,3,1,1,5,0,4,6,1,4,5,0,3,6,2,7,7,0,4,6,3]",
			"[[0,0],[2,2],[4,0],[6,1],[8,0],[10,0],[13,0],[14,0],[15,1],[16,1],[17,1],[19,3],[21,1],[23,3],[25,2],[26,4],[28,2],[30,0],[32,1],[33,2],[36,0],[37,3],[38,5]]",
			"[2,3,8,17,6,15,9,13,18,16,5,0,4,20,1,12,21,11,10,7,19,14]"},
		{"valid n=3", span(8, 10), 3, 2, false, "[8,9,8,9]", "[[0,0],[0,8],[2,2],[3,1]]", "[1,2,0]"},
		{"train n=5 separate final epoch", span(0, 8), 5, 2, true,
			"[2,1,6,0,4,5,3,7,5,0,3,4,2,6,1,7]", "[[0,0],[1,0],[2,5],[4,1],[5,3],[9,0],[11,1],[12,3],[13,3]]", "[1,3,2,0,5,7,4,6]"},
		{"train n=3", span(0, 8), 3, 1, false, "[2,1,6,0,4,5,3,7]", "[[0,0],[1,0],[2,5],[4,1],[5,3]]", "[0,2,1,3]"},
		{"valid all", span(8, 10), AllSamples, 1, false, "[8,9]", "[[0,0],[0,8]]", "[0]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x, err := BuildIndices(specSizes, c.indices, IndexParams{NumSamples: c.n, SeqLength: 8, ExtraToken: 1, Seed: 1234, DropLast: true})
			if err != nil {
				t.Fatal(err)
			}
			if x.Epochs != c.epochs || x.SeparateFinalEpoch != c.separate {
				t.Errorf("epochs %d separate %v, want %d %v", x.Epochs, x.SeparateFinalEpoch, c.epochs, c.separate)
			}
			if got := list(x.DocumentIndex); got != c.doc {
				t.Errorf("document_index %s\nwant %s", got, c.doc)
			}
			if got := pairs(x.SampleIndex); got != c.sample {
				t.Errorf("sample_index %s\nwant %s", got, c.sample)
			}
			if got := list(x.ShuffleIndex); got != c.shuffle {
				t.Errorf("shuffle_index %s\nwant %s", got, c.shuffle)
			}
		})
	}
}

func TestSplitParsing(t *testing.T) {
	cases := []struct {
		split  string
		n      int
		ranges [3][2]int // -1,-1 = nil split
	}{
		{"80,20,0", 10, [3][2]int{{0, 8}, {8, 10}, {-1, -1}}},
		{"969, 30, 1", 1000, [3][2]int{{0, 969}, {969, 999}, {999, 1000}}},
		{"1", 7, [3][2]int{{0, 7}, {-1, -1}, {-1, -1}}},
		// 0.5·5 = 2.5 rounds half to even → 2; 0.75·10=7.5 → 8.
		{"50,50", 5, [3][2]int{{0, 2}, {2, 5}, {-1, -1}}},
		{"75,25", 10, [3][2]int{{0, 8}, {8, 10}, {-1, -1}}},
		{"1,1,1", 10, [3][2]int{{0, 3}, {3, 7}, {7, 10}}},
		// a shell-word-split "--split '99,1,0'" keeps its quotes
		{"'99,1,0'", 100, [3][2]int{{0, 99}, {99, 100}, {-1, -1}}},
		{`"99,1,0"`, 100, [3][2]int{{0, 99}, {99, 100}, {-1, -1}}},
	}
	for _, c := range cases {
		v, err := ParseSplit(c.split)
		if err != nil {
			t.Fatal(err)
		}
		m := SplitMatrix(v)
		for i := range m {
			want := c.ranges[i]
			if m[i] == nil {
				if want[0] != -1 {
					t.Errorf("%q: split %d is empty, want %v", c.split, i, want)
				}
				continue
			}
			b, e := SplitRange(*m[i], c.n)
			if b != want[0] || e != want[1] {
				t.Errorf("%q n=%d: split %d = [%d,%d), want %v", c.split, c.n, i, b, e, want)
			}
		}
	}
	for _, bad := range []struct{ split, want string }{
		{"", "sum to a positive"},
		{"0,0,0", "sum to a positive"},
		{"1,2,3,4", "at most 3 proportions (train,valid,test), got 4"},
		// Megatron's [.0-9]+ took these as 1,2,3 and as four numbers.
		{"-1,2,3", `"-1,2,3": -1 is negative`},
		{"1e400,1,1", `"1e400,1,1": 1e400 is not finite`},
		{"1,x,1", `"x" is not a proportion`},
		{"NaN,1", `"NaN" is not a proportion`},
		{"1e308,1e308", "sum to a positive finite number"},
		{`'99,1,0"`, `"'99" is not a proportion`}, // quotes that do not pair
	} {
		_, err := ParseSplit(bad.split)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseSplit(%q) = %v, want an error with %q", bad.split, err, bad.want)
		}
	}
	// Exponents and spaces are numbers, not separators.
	if v, err := ParseSplit("9e2 1e1, 0"); err != nil || v[0] != 900.0/910 {
		t.Errorf("ParseSplit(\"9e2 1e1, 0\") = %v, %v", v, err)
	}
}

// x = 0 and a kept last partial validation sample: tpe = 14 (sequences 8, 9
// of lengths 9 and 5), L = 4 → ceil(14/4) = 4 samples, the last with 2 real
// tokens and 2 pads.
func TestNoExtraTokenAndPartialValidation(t *testing.T) {
	x, err := BuildIndices(specSizes, span(8, 10), IndexParams{NumSamples: AllSamples, SeqLength: 4, Seed: 1, DropLast: false})
	if err != nil {
		t.Fatal(err)
	}
	if got := pairs(x.SampleIndex); got != "[[0,0],[0,4],[0,8],[1,3],[1,5]]" {
		t.Errorf("sample_index %s", got)
	}
	if x.NumSamples() != 4 || len(x.ShuffleIndex) != 4 {
		t.Fatalf("S = %d, shuffle %v", x.NumSamples(), x.ShuffleIndex)
	}
}

func TestMakeSample(t *testing.T) {
	const eod = 9
	text := []int32{1, 2, eod, 3, eod, 4, PadID, PadID, PadID}
	s := makeSample(text, 8, 1, eod, MaskOptions{ResetPositionIDs: true, ResetAttentionMask: true, EODMaskLoss: true})
	check := func(name string, got, want any) {
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("tokens", s.Tokens, []int32{1, 2, eod, 3, eod, 4, 0, 0})
	check("labels", s.Labels, []int32{2, eod, 3, eod, 4, 0, 0, 0})
	check("loss_mask", s.LossMask, []float32{1, 1, 0, 1, 0, 0, 0, 0})
	check("position_ids", s.PositionIDs, []int32{0, 1, 2, 0, 1, 0, 1, 2})
	check("doc_ids", s.DocIDs, []int32{0, 0, 0, 1, 1, 2, 2, 2})
	// x = 0: labels are the tokens rolled by one, the last label is padding.
	s = makeSample([]int32{5, 6, 7, 8}, 4, 0, eod, MaskOptions{})
	check("x=0 labels", s.Labels, []int32{6, 7, 8, 0})
	check("x=0 loss_mask", s.LossMask, []float32{1, 1, 1, 0})
	check("x=0 position_ids", s.PositionIDs, []int32{0, 1, 2, 3})
	if s.DocIDs != nil {
		t.Error("DocIDs set without --reset-attention-mask")
	}
}

func TestNumEpochs(t *testing.T) {
	cases := []struct {
		tpe, n     int64
		L, x, want int
	}{
		{36, 20, 8, 1, 5}, // 5·36 = 180 ≥ 161
		{36, 4, 8, 1, 1},  // 36 ≥ 33
		{36, 35, 1, 1, 1}, // 36 ≥ 36
		{36, 36, 1, 1, 2}, // 36 < 37
		{14, AllSamples, 8, 1, 1},
		{10, 0, 8, 1, 1},
	}
	for _, c := range cases {
		if got := NumEpochs(c.tpe, c.n, c.L, c.x); got != c.want {
			t.Errorf("NumEpochs(%d, %d, %d, %d) = %d, want %d", c.tpe, c.n, c.L, c.x, got, c.want)
		}
	}
	// A tiny split asked for a huge number of samples is an error, not a hang.
	if _, err := BuildIndices(specSizes, []int32{7, 3}, IndexParams{NumSamples: 1 << 40, SeqLength: 2048, ExtraToken: 1, DropLast: true}); err == nil {
		t.Error("BuildIndices accepted 2^40 samples of a 3-token split")
	}
}
