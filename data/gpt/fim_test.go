package gpt

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/data/indexed"
	"github.com/gotron/gotron/internal/assets/gpt2"
)

// fimGolden is testdata/fim_golden.json, written by testdata/fim_ref.py from
// Megatron's own fim_dataset.py (see the script for the command).
type fimGolden struct {
	Samples [][]int32 `json:"samples"`
	Cases   []struct {
		Name         string            `json:"name"`
		Seed         uint32            `json:"seed"`
		Rate         float64           `json:"rate"`
		SPMRate      float64           `json:"spm_rate"`
		Tokens       map[string]string `json:"tokens"`
		SplitSample  string            `json:"split_sample"`
		FragmentRate float64           `json:"fragment_rate"`
		NoPrefix     *string           `json:"no_prefix"`
		Want         [][]int32         `json:"want"`
	} `json:"cases"`
}

// TestFIMMatchesMegatron transforms the golden's raw samples in order on one
// stream per case (PSM and SPM, fragments split on a token, --fim-no-prefix,
// samples that cut documents and multi-byte characters, runs of EODs) and
// compares them token for token with Megatron's GPTFIMDataset.
func TestFIMMatchesMegatron(t *testing.T) {
	raw, err := os.ReadFile("testdata/fim_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g fimGolden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	tok, err := gpt2.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) < 6 || len(g.Samples) < 10 {
		t.Fatalf("golden has %d cases, %d samples", len(g.Cases), len(g.Samples))
	}
	for _, c := range g.Cases {
		t.Run(c.Name, func(t *testing.T) {
			cfg := FIMConfig{Rate: c.Rate, SPMRate: c.SPMRate, SplitSample: c.SplitSample, FragmentRate: c.FragmentRate,
				NoPrefix: c.NoPrefix, Prefix: c.Tokens["prefix"], Middle: c.Tokens["middle"], Suffix: c.Tokens["suffix"],
				Pad: c.Tokens["pad"], EOD: c.Tokens["eod"], Tokenizer: tok}
			p, err := cfg.resolve()
			if err != nil {
				t.Fatal(err)
			}
			f := newFIMStream(p, c.Seed)
			changed := 0
			for i, s := range g.Samples {
				got := f.apply(slices.Clone(s), 0)
				if !slices.Equal(got, c.Want[i]) {
					t.Fatalf("sample %d:\n got  %v\n want %v", i, got, c.Want[i])
				}
				if !slices.Equal(got, s) {
					changed++
				}
			}
			if changed == 0 {
				t.Fatal("no sample was transformed: the case checks nothing")
			}
		})
	}
}

func TestFIMRefusesMissingTokens(t *testing.T) {
	tok, err := gpt2.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	cfg := FIMConfig{Rate: 0.5, SPMRate: 0.5, Tokenizer: tok}
	_, err = cfg.resolve()
	if err == nil {
		t.Fatal("GPT-2 has no <fim_prefix>: want an error")
	}
	for _, want := range []string{`--fim-prefix-token "<fim_prefix>"`, `--fim-middle-token "<fim_middle>"`, `--fim-suffix-token "<fim_suffix>"`, `--fim-pad-token "<fim_pad>"`, "needs a tokenizer"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if strings.Contains(err.Error(), "--fim-eod-token") {
		t.Errorf("error %q names <|endoftext|>, which GPT-2 has", err)
	}
	// With MissingAsUnknown (Megatron's convert_tokens_to_ids), each
	// missing sentinel is GPT-2's unknown token, <|endoftext|>.
	cfg.MissingAsUnknown = true
	p, err := cfg.resolve()
	if err != nil {
		t.Fatal(err)
	}
	eod := int32(tok.EOD())
	if p.prefix != eod || p.middle != eod || p.suffix != eod || p.pad != eod || p.eod != eod {
		t.Errorf("sentinels %d %d %d %d, eod %d: want each the EOD %d", p.prefix, p.middle, p.suffix, p.pad, p.eod, eod)
	}
	if m := cfg.MissingTokens(); len(m) != 4 {
		t.Errorf("MissingTokens %q: want the four FIM sentinels", m)
	}
	for _, bad := range []FIMConfig{
		{Rate: 0, SPMRate: 0.5, Tokenizer: tok},
		{Rate: 0.5, SPMRate: 1.5, Tokenizer: tok},
		{Rate: 0.5, SPMRate: 0.5, SplitSample: "ĊĊ", FragmentRate: -1, Tokenizer: tok},
	} {
		if _, err := bad.resolve(); err == nil || !strings.Contains(err.Error(), "--fim-") {
			t.Errorf("%+v: got %v, want an error naming the flag", bad, err)
		}
	}
}

// TestLossyRunes checks U+FFFD per maximal subpart, as Python's
// b.decode("utf-8", errors="replace") gives.
func TestLossyRunes(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
	}{
		{"a\xe2\x82A", "a\uFFFDA"},             // python: 'a\ufffdA'
		{"\xf0\x9f\x9a", "\uFFFD"},             // truncated emoji: one
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"}, // surrogate: three
		{"\xc0\xaf", "\uFFFD\uFFFD"},
		{"\x9a\xf0\x9f\x9a\x80x", "\uFFFD🚀x"},
		{"\xf4\x90\x80\x80", "\uFFFD\uFFFD\uFFFD\uFFFD"},
	} {
		if got := string(lossyRunes(c.in)); got != c.want {
			t.Errorf("lossyRunes(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestFIMDataset builds the same dataset with and without FIM: the FIM
// samples are the plain ones transformed in reading order by a stream seeded
// with --seed, the cache is GPTFIMDataset's.
func TestFIMDataset(t *testing.T) {
	tok, err := gpt2.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{"def f(x):\n    return x * 2\n", "Hello there, general Kenobi.", "🚀 rockets go brrr and then some more words", "x = 1\n\nprint(x)\n"}
	var docs [][]int32
	for k := range 12 {
		var d []int32
		for _, id := range tok.Encode(texts[k%len(texts)]) {
			d = append(d, int32(id))
		}
		docs = append(docs, append(d, int32(tok.EOD())))
	}
	dir := t.TempDir()
	prefix := writeDocs(t, filepath.Join(dir, "fim"), indexed.UInt16, docs)
	cfg := Config{SeqLength: 16, Seed: 5, Split: "100,0,0", Blend: Blend{Prefixes: []string{prefix}},
		NumSamples: [3]int64{20, 0, 0}, EOD: int32(tok.EOD()), CachePath: filepath.Join(dir, "cache")}
	plain, err := Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	cfg.FIM = &FIMConfig{Rate: 0.9, SPMRate: 0.5, Prefix: "@@", Middle: "##", Suffix: "$$", Pad: "~~", Tokenizer: tok}
	fimDS, err := Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer fimDS.Close()
	d := fimDS.Train.(*Dataset)
	if !strings.Contains(d.Description, `"class": "GPTFIMDataset"`) {
		t.Fatalf("description %s: want class GPTFIMDataset", d.Description)
	}
	p, err := cfg.FIM.resolve()
	if err != nil {
		t.Fatal(err)
	}
	ref := newFIMStream(p, 5)
	changed := 0
	for i := range fimDS.Train.Len() {
		a, err := plain.Train.Sample(i)
		if err != nil {
			t.Fatal(err)
		}
		text := append(slices.Clone(a.Tokens), a.Labels[len(a.Labels)-1])
		want := ref.apply(text, 0)
		b, err := fimDS.Train.Sample(i)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(b.Tokens, want[:16]) || !slices.Equal(b.Labels, want[1:]) {
			t.Fatalf("sample %d: tokens %v labels %v, want the FIM of %v: %v", i, b.Tokens, b.Labels, text, want)
		}
		if !slices.Equal(b.Tokens, a.Tokens) {
			changed++
		}
	}
	if changed == 0 {
		t.Fatal("FIM changed no sample")
	}
}

// TestFIMWorkers: Megatron's DataLoader forks --num-workers processes, each
// with a copy of the dataset (and of its FIM stream, at the seed), and hands
// micro-batch k to worker k mod W. So each worker's samples are those a
// fresh stream gives reading only that worker's micro-batches.
func TestFIMWorkers(t *testing.T) {
	raw, err := os.ReadFile("testdata/fim_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g fimGolden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	tok, err := gpt2.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	c := g.Cases[0]
	cfg := FIMConfig{Rate: c.Rate, SPMRate: c.SPMRate, Prefix: c.Tokens["prefix"], Middle: c.Tokens["middle"],
		Suffix: c.Tokens["suffix"], Pad: c.Tokens["pad"], EOD: c.Tokens["eod"], Tokenizer: tok}
	p, err := cfg.resolve()
	if err != nil {
		t.Fatal(err)
	}
	const W, mbs = 2, 3
	shared := newFIMStream(p, c.Seed)
	var got [W][][]int32
	for i, s := range g.Samples {
		w := (i / mbs) % W
		got[w] = append(got[w], shared.apply(slices.Clone(s), w))
	}
	differs := false
	for w := range W {
		alone := newFIMStream(p, c.Seed)
		n := 0
		for i, s := range g.Samples {
			if (i/mbs)%W != w {
				continue
			}
			want := alone.apply(slices.Clone(s), 0)
			if !slices.Equal(got[w][n], want) {
				t.Fatalf("worker %d, sample %d: %v, want %v", w, i, got[w][n], want)
			}
			if !slices.Equal(want, c.Want[i]) {
				differs = true
			}
			n++
		}
	}
	if !differs {
		t.Fatal("two workers gave the one-stream samples: the test checks nothing")
	}
}
