package gpt

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/gotron/gotron/internal/nprand"
	"github.com/gotron/gotron/tokenizer"
)

// FIM tokens' defaults, Megatron's --fim-*-token defaults.
const (
	DefaultFIMPrefix = "<fim_prefix>"
	DefaultFIMMiddle = "<fim_middle>"
	DefaultFIMSuffix = "<fim_suffix>"
	DefaultFIMPad    = "<fim_pad>"
	DefaultFIMEOD    = "<|endoftext|>"
)

// FIMConfig is Megatron's fill-in-the-middle data (--fim-data,
// GPTFIMDataset in megatron/training/datasets/fim_dataset.py). Each
// EOD-separated segment of a sample becomes, with probability Rate,
// prefix/middle/suffix cut at two uniform character positions of its text
// and re-tokenized, in SPM order (probability SPMRate) or PSM order; the
// sample keeps its length (cut, or padded with the pad token).
type FIMConfig struct {
	// Rate is --fim-rate and SPMRate --fim-spm-rate, both in (0, 1]
	// (Megatron asserts they are non-zero).
	Rate, SPMRate float64
	// SplitSample is --fim-split-sample: a vocabulary token (a token string,
	// as convert_tokens_to_ids takes it) on which a segment is split into
	// fragments, each permuted with probability FragmentRate
	// (--fim-fragment-rate, required with it). Empty: no splitting.
	SplitSample  string
	FragmentRate float64
	// NoPrefix is --fim-no-prefix: a segment or fragment whose text starts
	// with it is left alone. Nil: none.
	NoPrefix *string
	// Prefix, Middle, Suffix, Pad and EOD are the --fim-*-token vocabulary
	// tokens; empty means Megatron's defaults (DefaultFIM*). EOD separates
	// the segments.
	Prefix, Middle, Suffix, Pad, EOD string
	// Tokenizer decodes a segment to text and re-encodes the pieces; it must
	// implement tokenizer.TokenLookup (GPT2BPETokenizer, HuggingFaceTokenizer).
	Tokenizer tokenizer.Tokenizer
	// MissingAsUnknown gives a sentinel token the vocabulary lacks the
	// tokenizer's unknown-token id, as Megatron's lookup
	// (convert_tokens_to_ids) does: GPT-2's unknown token is
	// "<|endoftext|>", so each missing sentinel becomes the EOD — Megatron's
	// FIM configs with GPT-2's tokenizer train on exactly that. False: a
	// missing sentinel is refused. MissingTokens lists them, for a warning.
	MissingAsUnknown bool
}

// unknownIDer is a tokenizer with an unknown token (GPT-2's).
type unknownIDer interface{ UnknownID() (int, bool) }

// MissingTokens lists the sentinel tokens (with their flags) that c's
// tokenizer's vocabulary lacks.
func (c *FIMConfig) MissingTokens() []string {
	lk, ok := c.Tokenizer.(tokenizer.TokenLookup)
	if !ok {
		return nil
	}
	var out []string
	for _, t := range c.sentinels() {
		if id, ok := lk.TokenID(t.tok); !ok || id < 0 || id > math.MaxInt32 {
			out = append(out, fmt.Sprintf("%s %q", t.flag, t.tok))
		}
	}
	return out
}

// sentinels are the configured sentinel tokens (defaults filled in), in
// Megatron's order, with their flags.
func (c *FIMConfig) sentinels() []struct{ flag, tok string } {
	var out []struct{ flag, tok string }
	for _, t := range []struct{ flag, tok, def string }{
		{"--fim-prefix-token", c.Prefix, DefaultFIMPrefix},
		{"--fim-middle-token", c.Middle, DefaultFIMMiddle},
		{"--fim-suffix-token", c.Suffix, DefaultFIMSuffix},
		{"--fim-pad-token", c.Pad, DefaultFIMPad},
		{"--fim-eod-token", c.EOD, DefaultFIMEOD},
		{"--fim-split-sample", c.SplitSample, ""},
	} {
		s := t.tok
		if s == "" {
			s = t.def
		}
		if s != "" {
			out = append(out, struct{ flag, tok string }{t.flag, s})
		}
	}
	return out
}

// fimParams are FIMConfig's resolved ids, shared by the datasets of a build.
type fimParams struct {
	rate, spmRate, fragmentRate float64
	split                       int32 // -1: no --fim-split-sample
	noPrefix                    *string
	prefix, middle, suffix, pad int32
	eod                         int32
	lookup                      tokenizer.TokenLookup
	tok                         tokenizer.Tokenizer
}

// resolve validates c and looks its tokens up; errors name the flag.
func (c *FIMConfig) resolve() (*fimParams, error) {
	for _, r := range []struct {
		flag string
		v    float64
	}{{"--fim-rate", c.Rate}, {"--fim-spm-rate", c.SPMRate}} {
		if !(r.v > 0 && r.v <= 1) {
			return nil, fmt.Errorf("gpt: %s %v: want a probability in (0, 1] (Megatron asserts it is non-zero)", r.flag, r.v)
		}
	}
	if c.SplitSample != "" && !(c.FragmentRate >= 0 && c.FragmentRate <= 1) {
		return nil, fmt.Errorf("gpt: --fim-fragment-rate %v: want a probability in [0, 1] with --fim-split-sample", c.FragmentRate)
	}
	if c.Tokenizer == nil {
		return nil, fmt.Errorf("gpt: --fim-data needs a tokenizer")
	}
	lk, ok := c.Tokenizer.(tokenizer.TokenLookup)
	if !ok {
		return nil, fmt.Errorf("gpt: --fim-data needs GPT2BPETokenizer or HuggingFaceTokenizer: this tokenizer (%T) cannot look up the FIM tokens", c.Tokenizer)
	}
	p := &fimParams{rate: c.Rate, spmRate: c.SPMRate, fragmentRate: c.FragmentRate, split: -1, noPrefix: c.NoPrefix, lookup: lk, tok: c.Tokenizer}
	dst := map[string]*int32{"--fim-prefix-token": &p.prefix, "--fim-middle-token": &p.middle, "--fim-suffix-token": &p.suffix,
		"--fim-pad-token": &p.pad, "--fim-eod-token": &p.eod, "--fim-split-sample": &p.split}
	var missing, names []string
	for _, t := range c.sentinels() {
		s := t.tok
		id, ok := lk.TokenID(s)
		if u, can := c.Tokenizer.(unknownIDer); !ok && c.MissingAsUnknown && can {
			id, ok = u.UnknownID()
		}
		if !ok || id < 0 || id > math.MaxInt32 {
			missing = append(missing, fmt.Sprintf("%s %q", t.flag, s))
			names = append(names, s)
			continue
		}
		*dst[t.flag] = int32(id)
	}
	if len(missing) > 0 {
		// The first line is the refusal (docs/megatron-compat.md shows it).
		return nil, fmt.Errorf("gpt: --fim-data: needs a tokenizer holding the FIM tokens %s\n"+
			"the tokenizer's vocabulary has no %s; Megatron's Hugging Face lookup would map each to the unknown token "+
			"(GPT-2's is <|endoftext|>, so every sentinel would be the EOD): give a tokenizer with these tokens, or name tokens it has with the --fim-*-token flags",
			strings.Join(names, ", "), strings.Join(missing, ", "))
	}
	return p, nil
}

// fimStream is the random stream of a GPTFIMDataset:
// numpy.random.RandomState(seed), drawn in the order samples are read. Each
// of Megatron's data-loader worker processes holds its own copy of the
// dataset, so each worker draws its own stream from the seed; rngs[w] is
// worker w's, created when first used.
type fimStream struct {
	p    *fimParams
	seed uint32
	mu   sync.Mutex
	rngs []*nprand.MT19937
	rng  *nprand.MT19937 // the worker's stream apply is drawing from
}

func newFIMStream(p *fimParams, seed uint32) *fimStream {
	return &fimStream{p: p, seed: seed}
}

// bernoulli is np_rng.binomial(1, rate) (rates are validated).
func (f *fimStream) bernoulli(rate float64) bool {
	x, _ := f.rng.Binomial(1, rate)
	return x == 1
}

// apply is GPTFIMDataset._query_document_sample_shuffle_indices after the
// sample's tokens are read, in data-loader worker worker's copy of the
// dataset (0 ≤ worker < MaxWorkers): permute every EOD-separated segment,
// then cut or pad (with the FIM pad token) to the sample's length.
func (f *fimStream) apply(sample []int32, worker int) []int32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.rngs) <= worker {
		f.rngs = append(f.rngs, nil)
	}
	if f.rngs[worker] == nil {
		f.rngs[worker] = nprand.New(f.seed)
	}
	f.rng = f.rngs[worker]
	p := f.p
	n := len(sample)
	var out []int32
	if !slices.Contains(sample, p.eod) {
		out = f.splitAndPermute(sample)
	} else {
		start := 0
		for loc, id := range sample {
			if id != p.eod {
				continue
			}
			// An empty segment is dropped with its EOD, as Megatron does.
			if loc-start > 0 {
				out = append(out, f.splitAndPermute(sample[start:loc])...)
				out = append(out, p.eod)
			}
			start = loc + 1
		}
		out = append(out, f.splitAndPermute(sample[start:])...)
	}
	if len(out) > n {
		out = out[:n]
	}
	for len(out) < n {
		out = append(out, p.pad)
	}
	return out
}

// splitAndPermute is _fim_split_and_permute_sequence.
func (f *fimStream) splitAndPermute(seq []int32) []int32 {
	p := f.p
	if p.split < 0 || !slices.Contains(seq, p.split) {
		return f.permute(seq, p.rate)
	}
	if !f.bernoulli(p.rate) {
		return seq
	}
	var out []int32
	start := 0
	for loc, id := range seq {
		if id != p.split {
			continue
		}
		if loc-start > 0 {
			out = append(out, f.permute(seq[start:loc], p.fragmentRate)...)
			out = append(out, p.split)
		}
		start = loc + 1
	}
	return append(out, f.permute(seq[start:], p.fragmentRate)...)
}

// permute is _permute with truncate_or_pad=False.
func (f *fimStream) permute(seq []int32, rate float64) []int32 {
	p := f.p
	if !f.bernoulli(rate) {
		return seq
	}
	ids := make([]int, len(seq))
	for i, id := range seq {
		ids[i] = int(id)
	}
	// Python's str of the bytes: invalid UTF-8 (a sample cuts a character)
	// becomes U+FFFD per maximal subpart, and positions count code points.
	contents := lossyRunes(p.lookup.DecodeSkippingSpecials(ids))
	if p.noPrefix != nil && strings.HasPrefix(string(contents), *p.noPrefix) {
		return seq
	}
	b0 := int(f.rng.Interval(uint64(len(contents))))
	b1 := int(f.rng.Interval(uint64(len(contents))))
	if b1 < b0 {
		b0, b1 = b1, b0
	}
	prefix := f.encode(contents[:b0])
	middle := f.encode(contents[b0:b1])
	suffix := f.encode(contents[b1:])
	out := make([]int32, 0, len(prefix)+len(middle)+len(suffix)+3)
	if f.bernoulli(p.spmRate) { // SPM
		out = append(out, p.prefix, p.suffix)
		out = append(out, suffix...)
		out = append(out, p.middle)
		out = append(out, prefix...)
		return append(out, middle...)
	}
	out = append(out, p.prefix) // PSM
	out = append(out, prefix...)
	out = append(out, p.suffix)
	out = append(out, suffix...)
	out = append(out, p.middle)
	return append(out, middle...)
}

// encode is text_to_ids: tokenizer(text).input_ids, the post-processor's
// special tokens included (tokenizer.Tokenize).
func (f *fimStream) encode(r []rune) []int32 {
	ids := tokenizer.Tokenize(f.p.tok, string(r))
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

// lossyRunes decodes s as Python's bytes.decode("utf-8", errors="replace")
// (and Rust's from_utf8_lossy) do: each maximal subpart of an ill-formed
// sequence becomes one U+FFFD (Go's []rune(s) gives one per byte).
func lossyRunes(s string) []rune {
	out := make([]rune, 0, len(s))
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r != utf8.RuneError || size != 1 {
			out = append(out, r)
			i += size
			continue
		}
		out = append(out, utf8.RuneError)
		i += maximalSubpart(s[i:])
	}
	return out
}

// maximalSubpart is the length of the ill-formed prefix of s to replace by
// one U+FFFD: the lead byte and the continuation bytes that could still
// complete it (Unicode's "maximal subpart" rule, Table 3-7 ranges).
func maximalSubpart(s string) int {
	b := s[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case b >= 0xC2 && b <= 0xDF:
		need = 1
	case b == 0xE0:
		need, lo = 2, 0xA0
	case b == 0xED:
		need, hi = 2, 0x9F
	case b >= 0xE1 && b <= 0xEF:
		need = 2
	case b == 0xF0:
		need, lo = 3, 0x90
	case b == 0xF4:
		need, hi = 3, 0x8F
	case b >= 0xF1 && b <= 0xF3:
		need = 3
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(s); k++ {
		c := s[n]
		if k > 0 {
			lo, hi = 0x80, 0xBF
		}
		if c < lo || c > hi {
			break
		}
		n++
	}
	return n
}
