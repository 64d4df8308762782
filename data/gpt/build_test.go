package gpt

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/data/indexed"
)

// writeToy writes the toy dataset of Megatron's reference values (10
// one-sequence documents of lengths 5,3,8,2,6,4,7,1,9,5; uint16, eod 99)
// under dir.
func writeToy(t testing.TB, dir string) string {
	t.Helper()
	prefix := filepath.Join(dir, "toy")
	b, err := indexed.NewBuilder(prefix, indexed.BuilderConfig{DType: indexed.UInt16})
	if err != nil {
		t.Fatal(err)
	}
	tok := 0
	for _, l := range specSizes {
		d := make([]int32, 0, l)
		for i := 0; i < int(l)-1; i++ {
			d = append(d, int32((tok+i)%99))
		}
		d = append(d, 99)
		tok += int(l)
		if err := b.AddDocument(d, []int{len(d)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Finalize(); err != nil {
		t.Fatal(err)
	}
	return prefix
}

// writeDocs writes one single-sequence document per entry of docs.
func writeDocs(t testing.TB, prefix string, dtype indexed.DType, docs [][]int32) string {
	t.Helper()
	b, err := indexed.NewBuilder(prefix, indexed.BuilderConfig{DType: dtype})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if err := b.AddDocument(d, []int{len(d)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Finalize(); err != nil {
		t.Fatal(err)
	}
	return prefix
}

var specTok = []Field{{"class", "Tok"}, {"vocab_size", 100}}

func TestBuildSpecDataset(t *testing.T) {
	dir := t.TempDir()
	prefix := writeToy(t, dir)
	cfg := Config{SeqLength: 8, Seed: 1234, Split: "80,20,0", Blend: Blend{Prefixes: []string{prefix}},
		NumSamples: [3]int64{20, 3, 0}, EOD: 99, TokenizerIdentifiers: specTok, CachePath: filepath.Join(dir, "cache")}
	for round := range 2 { // build, then load from the cache
		ds, err := Build(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if ds.Test != nil {
			t.Errorf("test split built for --split 80,20,0")
		}
		tr := ds.Train.(*Dataset)
		if got := pairs(tr.Indices.SampleIndex); !strings.HasPrefix(got, "[[0,0],[2,2],[4,0],[6,1]") || tr.Len() != 22 {
			t.Errorf("round %d: train sample_index %s, len %d", round, got, tr.Len())
		}
		s, err := ds.Train.Sample(0)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(s.Tokens, []int32{18, 19, 20, 21, 22, 99, 99, 18}) || !slices.Equal(s.Labels, []int32{19, 20, 21, 22, 99, 99, 18, 19}) {
			t.Errorf("round %d: train item 0 = %v / %v", round, s.Tokens, s.Labels)
		}
		v, err := ds.Valid.Sample(0)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(v.Tokens, []int32{99, 45, 46, 47, 48, 99, 36, 37}) {
			t.Errorf("round %d: valid item 0 = %v", round, v.Tokens)
		}
		if _, err := ds.Train.Sample(22); err == nil {
			t.Error("Sample(Len()) succeeded")
		}
		ds.Close()
	}
	matches, _ := filepath.Glob(filepath.Join(dir, "cache", "*-GPTDataset-train-*"))
	if len(matches) != 4 {
		t.Errorf("cache files %v, want 4", matches)
	}
}

// Megatron's reference blend (computed by its BlendedMegatronDatasetBuilder):
// toy (w .7) and toy2 (6 docs × 4 tokens, w .3), L=4, N=10, split
// "100,0,0".
func TestBuildSpecBlend(t *testing.T) {
	dir := t.TempDir()
	toy := writeToy(t, dir)
	var docs [][]int32
	for i := range 6 {
		docs = append(docs, []int32{int32(i), 1, 2, 99})
	}
	toy2 := writeDocs(t, filepath.Join(dir, "toy2"), indexed.UInt16, docs)
	cfg := Config{SeqLength: 4, Seed: 1234, Split: "100,0,0", Blend: Blend{Prefixes: []string{toy, toy2}, Weights: []float64{0.7, 0.3}},
		NumSamples: [3]int64{10, 0, 0}, EOD: 99, CachePath: filepath.Join(dir, "cache")}
	for round := range 2 {
		ds, err := Build(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		b := ds.Train.(*Blended)
		if b.Datasets[0].Len() != 12 || b.Datasets[1].Len() != 5 {
			t.Errorf("mid-level lengths %d, %d; want 12, 5", b.Datasets[0].Len(), b.Datasets[1].Len())
		}
		if got := list(b.DatasetIndex); got != "[0,1,0,0,1,0,0,1,0,0]" {
			t.Errorf("round %d: dataset_index %s", round, got)
		}
		if got := list(b.DatasetSampleIndex); got != "[0,0,1,2,1,3,4,2,5,6]" {
			t.Errorf("round %d: dataset_sample_index %s", round, got)
		}
		s, err := b.Sample(1)
		if err != nil || s.DatasetID != 1 || len(s.Tokens) != 4 {
			t.Errorf("blended sample 1: %+v %v", s, err)
		}
		ds.Close()
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "cache", "*-BlendedDataset-train-*")); len(m) != 3 {
		t.Errorf("blend cache files %v", m)
	}
}

func TestBlendingIndicesSpec(t *testing.T) {
	di, dsi := BuildBlendingIndices([]float64{.3, .5, .2}, 10)
	if list(di) != "[1,0,2,1,0,1,2,1,0,1]" || list(dsi) != "[0,0,0,1,1,2,1,3,2,4]" {
		t.Errorf("build_blending_indices = %v / %v", di, dsi)
	}
	di, dsi, err := BuildExhaustiveBlendingIndices([]int64{1, 2, 3})
	if err != nil || list(di) != "[2,1,0,2,1,2]" || list(dsi) != "[0,0,0,1,1,2]" {
		t.Errorf("build_exhaustive_blending_indices = %v / %v (%v)", di, dsi, err)
	}
	if _, _, err := BuildExhaustiveBlendingIndices([]int64{3, 0}); err == nil {
		t.Error("exhaustive blend with an empty dataset succeeded")
	}
}

func TestConfigErrors(t *testing.T) {
	good := Config{SeqLength: 8, Blend: Blend{Prefixes: []string{"x"}}}
	cases := []struct {
		mod  func(c *Config)
		want string
	}{
		{func(c *Config) { c.SeqLength = 1 }, "--seq-length"},
		{func(c *Config) { c.Seed = -1 }, "--seed"},
		{func(c *Config) { c.Blend = Blend{} }, "--data-path"},
		{func(c *Config) { c.Split = "1,2,3,4" }, "--split"},
		{func(c *Config) { c.SplitBlends[0] = Blend{Prefixes: []string{"y"}} }, "mutually exclusive"},
		{func(c *Config) { c.Blend = Blend{Prefixes: []string{"a"}, Weights: []float64{-1}} }, "--data-path"},
		{func(c *Config) { c.NumSamples[1] = -5 }, "valid"},
	}
	for _, c := range cases {
		cfg := good
		c.mod(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want error mentioning %q, got %v", c.want, err)
		}
	}
	if err := good.Validate(); err != nil {
		t.Errorf("good config: %v", err)
	}
	_, err := Build(context.Background(), Config{SeqLength: 8, Blend: Blend{Prefixes: []string{filepath.Join(t.TempDir(), "nope")}}})
	if err == nil || !strings.Contains(err.Error(), "nope.idx") {
		t.Errorf("missing dataset: %v", err)
	}
}

func TestParseBlend(t *testing.T) {
	cases := []struct {
		in       []string
		prefixes []string
		weights  []float64
	}{
		{[]string{"30", "a", "70", "b"}, []string{"a", "b"}, []float64{30, 70}},
		{[]string{"30 a 70 b"}, []string{"a", "b"}, []float64{30, 70}},
		{[]string{"a"}, []string{"a"}, nil},
		{[]string{"a", "b"}, []string{"a", "b"}, nil},
		{[]string{"1", "a", "b"}, []string{"1", "a", "b"}, nil},
	}
	for _, c := range cases {
		b, err := ParseBlend("--data-path", c.in)
		if err != nil || !slices.Equal(b.Prefixes, c.prefixes) || !slices.Equal(b.Weights, c.weights) {
			t.Errorf("ParseBlend(%q) = %+v, %v", c.in, b, err)
		}
	}
}

func TestCacheIsNeverStale(t *testing.T) {
	dir := t.TempDir()
	prefix := writeToy(t, dir)
	cfg := Config{SeqLength: 8, Seed: 1234, Split: "80,20,0", Blend: Blend{Prefixes: []string{prefix}}, NumSamples: [3]int64{20, 3, 0}, EOD: 99}
	ds, err := Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := ds.Train.(*Dataset).Indices
	ds.Close()
	// Megatron's default cache directory is under a directory named like the prefix.
	shuffles, _ := filepath.Glob(filepath.Join(prefix, "cache", "GPTDataset_indices", "*-train-shuffle_index.npy"))
	if len(shuffles) != 1 {
		t.Fatalf("default cache: %v", shuffles)
	}
	// A truncated cache array is ignored and rewritten.
	if err := os.WriteFile(shuffles[0], []byte("\x93NUMPY junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err = Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := ds.Train.(*Dataset).Indices; !slices.Equal(got.ShuffleIndex, want.ShuffleIndex) {
		t.Errorf("rebuilt shuffle %v, want %v", got.ShuffleIndex, want.ShuffleIndex)
	}
	ds.Close()
	if a, err := readNpy(shuffles[0]); err != nil || len(a.data) != 22 {
		t.Errorf("cache not rewritten: %v", err)
	}
}

// With KeepLastPartialValidation the valid split of the toy dataset (14
// tokens, L=8, x=1) has ceil(13/8) = 2 samples; the partial one is padded
// with token 0 and loss mask 0.
func TestKeepLastPartialValidation(t *testing.T) {
	dir := t.TempDir()
	prefix := writeToy(t, dir)
	ds, err := Build(context.Background(), Config{SeqLength: 8, Seed: 1234, Split: "80,20,0", Blend: Blend{Prefixes: []string{prefix}},
		NumSamples: [3]int64{3, AllSamples, 0}, EOD: 99, NoCache: true, KeepLastPartialValidation: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	if ds.Valid.Len() != 2 {
		t.Fatalf("valid length %d, want 2", ds.Valid.Len())
	}
	var padded int
	for i := range 2 {
		s, err := ds.Valid.Sample(i)
		if err != nil {
			t.Fatal(err)
		}
		for j, m := range s.LossMask {
			if m == 0 {
				padded++
				if s.Labels[j] != 0 {
					t.Errorf("padded label %d", s.Labels[j])
				}
			}
		}
	}
	// 13 tokens are inputs in total; 16 − 13 = 3 label positions are padding.
	if padded != 3 {
		t.Errorf("%d padded positions, want 3", padded)
	}
}

// A cache whose sample index runs backwards (possible only if corrupted or
// written for other data) is rejected and rebuilt, never read out of bounds.
func TestCorruptSampleIndexCache(t *testing.T) {
	dir := t.TempDir()
	prefix := writeToy(t, dir)
	cfg := Config{SeqLength: 8, Seed: 1234, Split: "80,20,0", Blend: Blend{Prefixes: []string{prefix}}, NumSamples: [3]int64{20, 3, 0}, EOD: 99}
	ds, err := Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := ds.Train.(*Dataset).Indices.SampleIndex
	ds.Close()
	files, _ := filepath.Glob(filepath.Join(prefix, "cache", "GPTDataset_indices", "*-train-sample_index.npy"))
	if len(files) != 1 {
		t.Fatal(files)
	}
	bad := slices.Clone(want)
	// Row 1 = (0, 5): in bounds of sequence 0 (5 tokens), but sample 0 would
	// then need tokens [0, 6) of it.
	bad[2], bad[3] = 0, 5
	if err := writeNpy(files[0], "<i4", []int{len(bad) / 2, 2}, bad); err != nil {
		t.Fatal(err)
	}
	ds, err = Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	if got := ds.Train.(*Dataset).Indices.SampleIndex; !slices.Equal(got, want) {
		t.Errorf("corrupt cache was used: %v", got[:6])
	}
	for i := 0; i < ds.Train.Len(); i++ {
		if _, err := ds.Train.Sample(i); err != nil {
			t.Fatal(err)
		}
	}
}

// Several ranks building the same cache at once all succeed, agree, and
// leave no temporary files behind.
func TestConcurrentCacheBuild(t *testing.T) {
	dir := t.TempDir()
	prefix := writeToy(t, dir)
	cfg := Config{SeqLength: 8, Seed: 1234, Split: "80,20,0", Blend: Blend{Prefixes: []string{prefix}},
		NumSamples: [3]int64{20, 3, 0}, EOD: 99, CachePath: filepath.Join(dir, "cache")}
	const ranks = 4
	shuffles := make([][]int64, ranks)
	errs := make(chan error, ranks)
	for r := range ranks {
		go func() {
			ds, err := Build(context.Background(), cfg)
			if err == nil {
				shuffles[r] = ds.Train.(*Dataset).Indices.ShuffleIndex
				err = ds.Close()
			}
			errs <- err
		}()
	}
	for range ranks {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for r := 1; r < ranks; r++ {
		if !slices.Equal(shuffles[r], shuffles[0]) {
			t.Errorf("rank %d shuffle differs", r)
		}
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, "cache", "*.tmp*")); len(tmp) != 0 {
		t.Errorf("temporary files left: %v", tmp)
	}
}

// TestTokenIDsOutsideVocabulary: with Config.VocabSize, a sample holding an
// id the tokenizer cannot produce is an error naming the file, the
// sequence, the position and the id (it used to train silently).
func TestTokenIDsOutsideVocabulary(t *testing.T) {
	prefix := writeDocs(t, filepath.Join(t.TempDir(), "ids"), indexed.UInt16, [][]int32{
		{1, 2, 3, 4, 5, 6, 7, 9}, {1, 120, 3, 4, 5, 6, 7, 9}, {1, 2, 3, 4, 5, 6, 7, 9}})
	cfg := Config{SeqLength: 4, Seed: 1, Split: "1", Blend: Blend{Prefixes: []string{prefix}}, EOD: 9,
		NumSamples: [3]int64{AllSamples, AllSamples, AllSamples}, NoCache: true, TokenizerIdentifiers: specTok}
	for _, vocab := range []int{0, 121} {
		cfg.VocabSize = vocab
		ds, err := Build(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range ds.Train.Len() {
			if _, err := ds.Train.Sample(i); err != nil {
				t.Fatalf("vocabulary %d: sample %d: %v", vocab, i, err)
			}
		}
		ds.Close()
	}
	cfg.VocabSize = 100
	ds, err := Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	var bad error
	for i := range ds.Train.Len() {
		if _, err := ds.Train.Sample(i); err != nil {
			bad = err
			break
		}
	}
	want := prefix + ".bin: sequence 1, token 1: id 120 is outside the tokenizer's vocabulary of 100 (0 to 99)"
	if bad == nil || !strings.Contains(bad.Error(), want) {
		t.Fatalf("err = %v, want %q", bad, want)
	}
}
