package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"

	datagpt "github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/tokenizer"
)

// addTokenizerFlags defines Megatron's tokenizer flags for commands that
// need a tokenizer but no dataset flags (gotron preprocess). The dataset
// commands get the same names from addDataArgs.
func addTokenizerFlags(fs *flag.FlagSet, t *tokenizer.Config) {
	fs.StringVar(&t.Type, "tokenizer-type", "", "GPT2BPETokenizer, SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, HuggingFaceTokenizer, TikTokenizer, NullTokenizer")
	fs.StringVar(&t.VocabFile, "vocab-file", "", "vocabulary file (GPT-2 vocab.json)")
	fs.StringVar(&t.MergeFile, "merge-file", "", "BPE merges file (GPT-2 merges.txt)")
	fs.StringVar(&t.Model, "tokenizer-model", "", "SentencePiece .model, tokenizer.json (or its directory), or TikToken vocabulary")
	fs.IntVar(&t.VocabSize, "vocab-size", 0, "vocabulary size (NullTokenizer; TikTokenizer total)")
	fs.IntVar(&t.VocabExtraIDs, "vocab-extra-ids", 0, "extra <extra_id_i> tokens (SentencePieceTokenizer)")
	fs.StringVar(&t.TikTokenPattern, "tiktoken-pattern", "", "TikTokenizer pre-tokenizer pattern: v1 or v2")
	fs.IntVar(&t.TikTokenNumSpecialTokens, "tiktoken-num-special-tokens", 0, "ids reserved for TikTokenizer special tokens (default 1000)")
}

// tokenizerIdentifiers is the "tokenizer" entry of gotron's index-cache
// descriptions: the tokenizer type and the files and sizes that define it,
// in a fixed order, so runs with the same tokenizer share caches. Megatron
// writes its tokenizer's Python class path here, so caches are shared with
// gotron runs, not with Megatron runs.
func tokenizerIdentifiers(t tokenizer.Config) []datagpt.Field {
	out := []datagpt.Field{{Key: "class", Value: t.Type}}
	add := func(k, v string) {
		if v != "" {
			out = append(out, datagpt.Field{Key: k, Value: v})
		}
	}
	add("vocab_file", t.VocabFile)
	add("merge_file", t.MergeFile)
	add("tokenizer_model", t.Model)
	if t.VocabSize != 0 {
		out = append(out, datagpt.Field{Key: "vocab_size", Value: t.VocabSize})
	}
	if t.VocabExtraIDs != 0 {
		out = append(out, datagpt.Field{Key: "vocab_extra_ids", Value: t.VocabExtraIDs})
	}
	return out
}

// gptConfig turns the dataset flags into a data/gpt Config. numSamples are
// the requested train/valid/test samples (datagpt.AllSamples for none); eod
// is the tokenizer's end-of-document id. The training command can build its
// datasets with it too.
func (d *dataArgs) gptConfig(seqLength int, seed int64, numSamples [3]int64, eod int32) (datagpt.Config, error) {
	c := datagpt.Config{SeqLength: seqLength, Seed: seed, Split: d.split, CachePath: d.cachePath, Masks: d.masks,
		NumSamples: numSamples, EOD: eod, TokenizerIdentifiers: tokenizerIdentifiers(d.tok)}
	blends := []struct {
		flag string
		l    listFlag
		dst  *datagpt.Blend
	}{
		{"--data-path", d.dataPath, &c.Blend},
		{"--train-data-path", d.trainPath, &c.SplitBlends[0]},
		{"--valid-data-path", d.validPath, &c.SplitBlends[1]},
		{"--test-data-path", d.testPath, &c.SplitBlends[2]},
	}
	for _, b := range blends {
		if len(b.l.values) == 0 {
			continue
		}
		v, err := datagpt.ParseBlend(b.flag, b.l.values)
		if err != nil {
			return c, err
		}
		*b.dst = v
	}
	return c, c.Validate()
}

// parseNumSamples parses --num-samples "TRAIN,VALID,TEST": integers, with
// "None" (or an empty field) meaning Megatron's None (one epoch).
func parseNumSamples(s string) ([3]int64, error) {
	out := [3]int64{datagpt.AllSamples, datagpt.AllSamples, datagpt.AllSamples}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > 3 {
		return out, fmt.Errorf("--num-samples %q: want TRAIN,VALID,TEST", s)
	}
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" || p == "None" {
			continue
		}
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n < 0 {
			return out, fmt.Errorf("--num-samples %q: %q is not a sample count (a non-negative integer or None)", s, p)
		}
		out[i] = n
	}
	return out, nil
}

// fimArgs are Megatron's fill-in-the-middle data flags (GPTFIMDataset).
type fimArgs struct {
	data                             bool
	rate, spmRate, fragmentRate      float64
	splitSample, noPrefix            string
	prefix, middle, suffix, pad, eod string
}

// fimFlagNames are the FIM flags other than --fim-data.
var fimFlagNames = []string{"fim-rate", "fim-spm-rate", "fim-split-sample", "fim-fragment-rate", "fim-no-prefix",
	"fim-prefix-token", "fim-middle-token", "fim-suffix-token", "fim-pad-token", "fim-eod-token"}

func addFIMFlags(fs *flag.FlagSet, f *fimArgs) {
	fs.BoolVar(&f.data, "fim-data", false, "fill-in-the-middle samples (Megatron's GPTFIMDataset): needs a tokenizer holding the FIM tokens")
	fs.Float64Var(&f.rate, "fim-rate", 0.5, "probability that a sample's segment becomes a FIM one")
	fs.Float64Var(&f.spmRate, "fim-spm-rate", 0.5, "probability that a FIM segment is in SPM rather than PSM order")
	fs.StringVar(&f.splitSample, "fim-split-sample", "", "vocabulary token on which segments are split into fragments, each FIM'd with --fim-fragment-rate")
	fs.Float64Var(&f.fragmentRate, "fim-fragment-rate", 0, "probability of FIM per fragment (required with --fim-split-sample)")
	fs.StringVar(&f.noPrefix, "fim-no-prefix", "", "leave segments and fragments whose text starts with this string alone")
	fs.StringVar(&f.prefix, "fim-prefix-token", datagpt.DefaultFIMPrefix, "FIM prefix sentinel token")
	fs.StringVar(&f.middle, "fim-middle-token", datagpt.DefaultFIMMiddle, "FIM middle sentinel token")
	fs.StringVar(&f.suffix, "fim-suffix-token", datagpt.DefaultFIMSuffix, "FIM suffix sentinel token")
	fs.StringVar(&f.pad, "fim-pad-token", datagpt.DefaultFIMPad, "FIM pad token (pads samples that FIM shortened)")
	fs.StringVar(&f.eod, "fim-eod-token", datagpt.DefaultFIMEOD, "token separating the segments FIM permutes")
}

// fimMissingWarning is the line saying which sentinels the tokenizer lacks
// and that they are its unknown token, as in Megatron ("" when none is
// missing).
func fimMissingWarning(c *datagpt.FIMConfig) string {
	if c == nil {
		return ""
	}
	m := c.MissingTokens()
	if len(m) == 0 {
		return ""
	}
	return fmt.Sprintf("--fim-data: the tokenizer's vocabulary has no %s: each is its unknown token (GPT-2's <|endoftext|>, the EOD), "+
		"as Megatron's convert_tokens_to_ids makes it, so those sentinels are indistinguishable from the EOD; "+
		"give a tokenizer with the FIM tokens, or name tokens it has with the --fim-*-token flags", strings.Join(m, ", "))
}

// fimConfig is the data/gpt FIM configuration of the flags, nil without
// --fim-data. given are the flags set on the command line: a FIM flag
// without --fim-data would be ignored, so it is an error, and so is
// --fim-split-sample without --fim-fragment-rate (Megatron fails on it
// at the first sample).
func (f *fimArgs) fimConfig(tok tokenizer.Tokenizer, given map[string]bool, mock bool) (*datagpt.FIMConfig, error) {
	if !f.data {
		for _, n := range fimFlagNames {
			if given[n] {
				return nil, fmt.Errorf("--%s has no effect without --fim-data", n)
			}
		}
		return nil, nil
	}
	switch {
	case mock:
		return nil, fmt.Errorf("--fim-data: mock data is not supported with FIM data (as Megatron asserts); give --data-path")
	case tok == nil:
		return nil, fmt.Errorf("--fim-data needs --tokenizer-type (and its files): FIM decodes and re-encodes text")
	case f.splitSample != "" && !given["fim-fragment-rate"]:
		return nil, fmt.Errorf("--fim-split-sample %q needs --fim-fragment-rate", f.splitSample)
	case f.splitSample == "" && given["fim-fragment-rate"]:
		return nil, fmt.Errorf("--fim-fragment-rate has no effect without --fim-split-sample")
	}
	c := &datagpt.FIMConfig{Rate: f.rate, SPMRate: f.spmRate, SplitSample: f.splitSample, FragmentRate: f.fragmentRate,
		Prefix: f.prefix, Middle: f.middle, Suffix: f.suffix, Pad: f.pad, EOD: f.eod, Tokenizer: tok, MissingAsUnknown: true}
	if given["fim-no-prefix"] {
		np := f.noPrefix
		c.NoPrefix = &np
	}
	return c, nil
}
