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
