package gpt

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/data/indexed"
)

// testdata/ref.json is written by testdata/ref.py: Megatron's index code with
// numpy's RandomState and helpers.cpp transliterated, on cases beyond
// Megatron's reference values (multi-epoch, separate final epochs, int32 tokens, masks, a blend of
// three datasets).

type refItem struct {
	Tokens      []int32   `json:"tokens"`
	Labels      []int32   `json:"labels"`
	LossMask    []float32 `json:"loss_mask"`
	PositionIDs []int32   `json:"position_ids"`
	Mask        []string  `json:"mask"`
}

type refSplit struct {
	Doc      []int32    `json:"doc"`
	Smp      [][2]int64 `json:"smp"`
	Shf      []int64    `json:"shf"`
	Epochs   int        `json:"epochs"`
	Separate bool       `json:"separate"`
	Desc     string     `json:"desc"`
	Items    []refItem  `json:"items"`
	// blends
	MidLengths         []int   `json:"mid_lengths"`
	DatasetIndex       []int16 `json:"dataset_index"`
	DatasetSampleIndex []int64 `json:"dataset_sample_index"`
}

type refCase struct {
	Case struct {
		Split      string    `json:"split"`
		L          int       `json:"L"`
		Seed       int64     `json:"seed"`
		NumSamples []*int64  `json:"num_samples"`
		Vocab      int       `json:"vocab"`
		EOD        int32     `json:"eod"`
		ResetPos   bool      `json:"reset_pos"`
		ResetAtt   bool      `json:"reset_att"`
		EODMask    bool      `json:"eod_mask"`
		Items      []int     `json:"items"`
		Weights    []float64 `json:"weights"`
	} `json:"case"`
	Sizes  json.RawMessage     `json:"sizes"`
	Splits map[string]refSplit `json:"splits"`
}

func loadRef(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	raw, err := os.ReadFile("testdata/ref.json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// refCaseOf decodes the case name of ref.json into c and its document
// sizes into sizes (one dataset's []int, or [][]int for blends).
func refCaseOf(t *testing.T, ref map[string]json.RawMessage, name string, sizes any) refCase {
	t.Helper()
	var c refCase
	if err := json.Unmarshal(ref[name], &c); err != nil {
		t.Fatalf("ref.json %s: %v", name, err)
	}
	if err := json.Unmarshal(c.Sizes, sizes); err != nil {
		t.Fatalf("ref.json %s sizes: %v", name, err)
	}
	return c
}

// checkBlendedSplits compares the train and valid splits of ds, blends of
// the datasets at dir/<stem>0, dir/<stem>1, ..., with Megatron's: the
// mid-level datasets' lengths, the blending indices and the description
// (the paths as ref.py's @PATHj@); every sample builds.
func checkBlendedSplits(t *testing.T, ds *Datasets, c refCase, dir, stem string, n int) {
	t.Helper()
	for si, sname := range []string{"train", "valid"} {
		want := c.Splits[sname]
		b := ds.Split(Split(si)).(*Blended)
		var mids []int
		for _, d := range b.Datasets {
			mids = append(mids, d.Len())
		}
		if !slices.Equal(mids, want.MidLengths) {
			t.Errorf("%s: mid-level lengths %v, want %v", sname, mids, want.MidLengths)
		}
		if !slices.Equal(b.DatasetIndex, want.DatasetIndex) || !slices.Equal(b.DatasetSampleIndex, want.DatasetSampleIndex) {
			t.Errorf("%s: blending indices %v / %v\nwant %v / %v", sname, b.DatasetIndex, b.DatasetSampleIndex, want.DatasetIndex, want.DatasetSampleIndex)
		}
		got := b.Description
		for j := range n {
			got = strings.ReplaceAll(got, filepath.Join(dir, fmt.Sprintf("%s%d", stem, j)), fmt.Sprintf("@PATH%d@", j))
		}
		if got != want.Desc {
			t.Errorf("%s: description\n%s\nwant\n%s", sname, got, want.Desc)
		}
		for i := 0; i < b.Len(); i++ {
			if _, err := b.Sample(i); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// docTokens matches doc_tokens in ref.py.
func docTokens(vocab int, eod int32, k, length int) []int32 {
	out := make([]int32, 0, length)
	for i := 0; i < length-1; i++ {
		out = append(out, int32((k*1009+i*31)%(vocab-1)))
	}
	return append(out, eod)
}

func writeRefDataset(t *testing.T, prefix string, vocab int, eod int32, sizes []int) {
	t.Helper()
	docs := make([][]int32, len(sizes))
	for k, l := range sizes {
		docs[k] = docTokens(vocab, eod, k, l)
	}
	writeDocs(t, prefix, indexed.OptimalDType(vocab), docs)
}

func (c *refCase) config(t *testing.T, dir string) Config {
	var ns [3]int64
	for i, p := range c.Case.NumSamples {
		ns[i] = AllSamples
		if p != nil {
			ns[i] = *p
		}
	}
	return Config{SeqLength: c.Case.L, Seed: c.Case.Seed, Split: c.Case.Split, NumSamples: ns, EOD: c.Case.EOD,
		Masks:                MaskOptions{ResetPositionIDs: c.Case.ResetPos, ResetAttentionMask: c.Case.ResetAtt, EODMaskLoss: c.Case.EODMask},
		TokenizerIdentifiers: []Field{{"class", "RefTok"}, {"vocab_size", c.Case.Vocab}}, CachePath: filepath.Join(dir, "cache")}
}

func TestReferenceSingle(t *testing.T) {
	ref := loadRef(t)
	for _, name := range []string{"multi_epoch_int32_masks", "separate_final_epoch"} {
		t.Run(name, func(t *testing.T) {
			var sizes []int
			c := refCaseOf(t, ref, name, &sizes)
			dir := t.TempDir()
			prefix := filepath.Join(dir, "ref")
			writeRefDataset(t, prefix, c.Case.Vocab, c.Case.EOD, sizes)
			cfg := c.config(t, dir)
			cfg.Blend = Blend{Prefixes: []string{prefix}}
			ds, err := Build(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer ds.Close()
			for si, sname := range []string{"train", "valid", "test"} {
				want, ok := c.Splits[sname]
				src := ds.Split(Split(si))
				if !ok {
					if src != nil {
						t.Errorf("%s: built, Megatron builds none", sname)
					}
					continue
				}
				d := src.(*Dataset)
				x := d.Indices
				if x.Epochs != want.Epochs || x.SeparateFinalEpoch != want.Separate {
					t.Errorf("%s: epochs %d separate %v, want %d %v", sname, x.Epochs, x.SeparateFinalEpoch, want.Epochs, want.Separate)
				}
				if !slices.Equal(x.DocumentIndex, want.Doc) {
					t.Errorf("%s: document_index differs", sname)
				}
				var flat []int64
				for _, r := range want.Smp {
					flat = append(flat, r[0], r[1])
				}
				if !slices.Equal(x.SampleIndex, flat) {
					t.Errorf("%s: sample_index differs", sname)
				}
				if !slices.Equal(x.ShuffleIndex, want.Shf) {
					t.Errorf("%s: shuffle_index differs", sname)
				}
				if got := strings.ReplaceAll(d.Description, prefix, "@PATH@"); got != want.Desc {
					t.Errorf("%s: description\n%s\nwant\n%s", sname, got, want.Desc)
				}
				for k, it := range want.Items {
					s, err := d.Sample(c.Case.Items[k])
					if err != nil {
						t.Fatal(err)
					}
					checkItem(t, fmt.Sprintf("%s item %d", sname, c.Case.Items[k]), s, it, c.Case.ResetAtt)
				}
			}
		})
	}
}

func checkItem(t *testing.T, name string, s Sample, want refItem, resetAtt bool) {
	t.Helper()
	if !slices.Equal(s.Tokens, want.Tokens) || !slices.Equal(s.Labels, want.Labels) {
		t.Errorf("%s: tokens/labels %v %v\nwant %v %v", name, s.Tokens, s.Labels, want.Tokens, want.Labels)
	}
	if !slices.Equal(s.LossMask, want.LossMask) {
		t.Errorf("%s: loss_mask %v\nwant %v", name, s.LossMask, want.LossMask)
	}
	if !slices.Equal(s.PositionIDs, want.PositionIDs) {
		t.Errorf("%s: position_ids %v\nwant %v", name, s.PositionIDs, want.PositionIDs)
	}
	if resetAtt != (s.DocIDs != nil) {
		t.Fatalf("%s: DocIDs set = %v with reset-attention-mask %v", name, s.DocIDs != nil, resetAtt)
	}
	for q, row := range want.Mask {
		for k := range row {
			allowed := k <= q && (s.DocIDs == nil || s.DocIDs[k] == s.DocIDs[q])
			if allowed != (row[k] == '1') {
				t.Fatalf("%s: attention q=%d k=%d: DocIDs %v allow=%v, Megatron mask row %s", name, q, k, s.DocIDs, allowed, row)
			}
		}
	}
}

func TestReferenceBlend3(t *testing.T) {
	var sizes [][]int
	c := refCaseOf(t, loadRef(t), "blend3", &sizes)
	dir := t.TempDir()
	cfg := c.config(t, dir)
	cfg.Blend.Weights = c.Case.Weights
	for j, s := range sizes {
		p := filepath.Join(dir, fmt.Sprintf("m%d", j))
		writeRefDataset(t, p, c.Case.Vocab, c.Case.EOD, s)
		cfg.Blend.Prefixes = append(cfg.Blend.Prefixes, p)
	}
	ds, err := Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	checkBlendedSplits(t, ds, c, dir, "m", len(sizes))
	if ds.Test != nil {
		t.Error("test split built for split 98,2,0")
	}
}

func TestPythonJSON(t *testing.T) {
	var want []string
	if err := json.Unmarshal(loadRef(t)["describe"], &want); err != nil {
		t.Fatal(err)
	}
	tenth, fifth := 0.1, 0.2 // variables: Go constant arithmetic would be exact
	got := pyJSON([]Field{{"class", "X"}, {"path", "/tmp/é\u2028\U0001F600\"\\\t\x01\x7f"},
		{"f", []any{1e-05, 1e16, 123456789.0, tenth + fifth, 2.5, negZero(), 1.0}},
		{"empty", []any{}}, {"obj", []Field{}}, {"none", nil}, {"t", true}, {"n", -7}})
	if got != want[0] {
		t.Errorf("pyJSON:\n%s\nwant\n%s", got, want[0])
	}
}

func negZero() float64 {
	z := 0.0
	return -z
}

// TestReferenceUnweightedBlend: --data-path a b c without weights; the train
// split is sized min(N, Σ lengths), the valid split (N None) is exhaustive.
func TestReferenceUnweightedBlend(t *testing.T) {
	var sizes [][]int
	c := refCaseOf(t, loadRef(t), "unweighted", &sizes)
	dir := t.TempDir()
	cfg := c.config(t, dir)
	for j, s := range sizes {
		p := filepath.Join(dir, fmt.Sprintf("u%d", j))
		writeRefDataset(t, p, c.Case.Vocab, c.Case.EOD, s)
		cfg.Blend.Prefixes = append(cfg.Blend.Prefixes, p)
	}
	ds, err := Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	checkBlendedSplits(t, ds, c, dir, "u", len(sizes))
}

// TestReferencePerSplit: --train-data-path a --valid-data-path b.
func TestReferencePerSplit(t *testing.T) {
	var sizes [][]int
	c := refCaseOf(t, loadRef(t), "per_split", &sizes)
	dir := t.TempDir()
	cfg := c.config(t, dir)
	cfg.Split = ""
	for j, s := range sizes {
		p := filepath.Join(dir, fmt.Sprintf("s%d", j))
		writeRefDataset(t, p, c.Case.Vocab, c.Case.EOD, s)
		cfg.SplitBlends[j] = Blend{Prefixes: []string{p}}
	}
	ds, err := Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	if ds.Test != nil {
		t.Error("test split built without --test-data-path")
	}
	for si, sname := range []string{"train", "valid"} {
		want := c.Splits[sname]
		d := ds.Split(Split(si)).(*Dataset)
		var flat []int64
		for _, r := range want.Smp {
			flat = append(flat, r[0], r[1])
		}
		if !slices.Equal(d.Indices.DocumentIndex, want.Doc) || !slices.Equal(d.Indices.SampleIndex, flat) || !slices.Equal(d.Indices.ShuffleIndex, want.Shf) {
			t.Errorf("%s: indices differ", sname)
		}
		if got := strings.ReplaceAll(d.Description, filepath.Join(dir, fmt.Sprintf("s%d", si)), fmt.Sprintf("@PATH%d@", si)); got != want.Desc {
			t.Errorf("%s: description\n%s\nwant\n%s", sname, got, want.Desc)
		}
	}
}
