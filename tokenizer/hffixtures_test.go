package tokenizer

import (
	"cmp"
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// -hf-out regenerates the Hugging Face fixtures: it writes the
// tokenizer.json files to a directory, for tools/tokfixtures/generate.sh to
// run the reference (tokenizers.js) on, and records their SHA-256 digests in
// testdata/hf/fixtures.sha256.
var hfOut = flag.String("hf-out", "", "regenerate: write the Hugging Face tokenizer.json fixtures to this directory and their digests to testdata/hf/fixtures.sha256")

// hfDigestFile binds the tokenizer.json fixtures (built in memory by
// hfFixtures) to the reference ids in testdata/hf/*.ids.gz that
// tokenizers.js computed from them.
const hfDigestFile = "testdata/hf/fixtures.sha256"

// TestHFFixturesMatchReference checks that hfFixtures builds byte for byte
// the tokenizer.json files the committed reference ids were computed from
// (their digests in hfDigestFile): a change to the fixture builder must come
// with regenerated ids (tools/tokfixtures/generate.sh). With -hf-out it
// writes the fixtures and the digests instead.
func TestHFFixturesMatchReference(t *testing.T) {
	fx := hfFixtures(t)
	names := slices.Sorted(maps.Keys(fx))
	var digests strings.Builder
	for _, name := range names {
		fmt.Fprintf(&digests, "%x  %s.json\n", sha256.Sum256(fx[name]), name)
	}
	if *hfOut != "" {
		for _, name := range names {
			if err := os.WriteFile(filepath.Join(*hfOut, name+".json"), fx[name], 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(hfDigestFile, []byte(digests.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(hfDigestFile)
	if err != nil {
		t.Fatal(err)
	}
	if got := digests.String(); got != string(want) {
		t.Fatalf("the tokenizer.json fixtures differ from those %s records:\n got %s\nwant %s"+
			"regenerate the reference ids with tools/tokfixtures/generate.sh (it runs this test with -hf-out)", hfDigestFile, got, want)
	}
}

// hfFixtures builds tokenizer.json files from the committed fixtures:
// GPT-2 (ByteLevel), Llama-3 style (Split + ByteLevel, ignore_merges, over
// GPT-2's vocabulary), Llama-2 style (converted from llama2_bpe.model as
// transformers' LlamaConverter does) and BERT (WordPiece, lowercase).
func hfFixtures(t testing.TB) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	vocab := map[string]int{}
	if err := json.Unmarshal(readTestdata(t, "gpt2/vocab.json.gz"), &vocab); err != nil {
		t.Fatal(err)
	}
	merges, err := parseMerges(readTestdata(t, "gpt2/merges.txt.gz"), "merges.txt")
	if err != nil {
		t.Fatal(err)
	}
	mergeStrs := make([]string, len(merges))
	for i, m := range merges {
		mergeStrs[i] = m[0] + " " + m[1]
	}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
	gpt2Added := []any{map[string]any{"id": 50256, "content": "<|endoftext|>", "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": true}}
	out["gpt2"] = mustJSON(t, map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil,
		"added_tokens": gpt2Added, "normalizer": nil, "pre_tokenizer": byteLevel,
		"post_processor": byteLevel, "decoder": byteLevel,
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": mergeStrs},
	})
	out["llama3"] = mustJSON(t, map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil,
		"added_tokens": gpt2Added, "normalizer": nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patternLlama3}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"post_processor": byteLevel, "decoder": byteLevel,
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": true,
			"vocab": vocab, "merges": mergeStrs},
	})
	// NFKC before a Llama-3 split: exercises the normalization tables.
	out["nfkc_llama3"] = mustJSON(t, map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil,
		"added_tokens": gpt2Added, "normalizer": map[string]any{"type": "NFKC"},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patternLlama3}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"post_processor": byteLevel, "decoder": byteLevel,
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": mergeStrs},
	})
	out["llama2"] = hfLlama2Fixture(t)
	var bert []string
	if err := json.Unmarshal(readTestdata(t, "hf/bert_vocab.json.gz"), &bert); err != nil {
		t.Fatal(err)
	}
	bv := map[string]int{}
	for i, tok := range bert {
		bv[tok] = i
	}
	var bertAdded []any
	for _, s := range []string{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"} {
		bertAdded = append(bertAdded, map[string]any{"id": bv[s], "content": s, "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false})
	}
	for name, strip := range map[string]any{"bert": false, "bert_uncased": nil} {
		out[name] = bertFixture(t, bv, bertAdded, strip)
	}
	return out
}

// bertFixture is a BERT WordPiece tokenizer.json; stripAccents is false or
// nil (BERT uncased: strip accents because lowercase is set).
func bertFixture(t testing.TB, bv map[string]int, bertAdded []any, stripAccents any) []byte {
	return mustJSON(t, map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": bertAdded,
		"normalizer":    map[string]any{"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": stripAccents, "lowercase": true},
		"pre_tokenizer": map[string]any{"type": "BertPreTokenizer"},
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "[CLS]", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}, map[string]any{"SpecialToken": map[string]any{"id": "[SEP]", "type_id": 0}}},
			"pair":           []any{},
			"special_tokens": map[string]any{"[CLS]": map[string]any{"id": "[CLS]", "ids": []int{bv["[CLS]"]}, "tokens": []string{"[CLS]"}}, "[SEP]": map[string]any{"id": "[SEP]", "ids": []int{bv["[SEP]"]}, "tokens": []string{"[SEP]"}}}},
		"decoder": map[string]any{"type": "WordPiece", "prefix": "##", "cleanup": true},
		"model":   map[string]any{"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100, "vocab": bv},
	})
}

// hfLlama2Fixture converts llama2_bpe.model like transformers' LlamaConverter
// (SentencePieceExtractor merges, Prepend/Replace normaliser, byte fallback).
func hfLlama2Fixture(t testing.TB) []byte {
	sp, err := LoadSentencePiece(filepath.Join("testdata", "spm", "llama2_bpe.model"))
	if err != nil {
		t.Fatal(err)
	}
	vocab := map[string]int{}
	for i, p := range sp.m.pieces {
		vocab[p.piece] = i
	}
	type merge struct {
		l, r  string
		score float32
	}
	var merges []merge
	for _, p := range sp.m.pieces {
		var local []merge
		for i := range p.piece {
			if i == 0 || !utf8.RuneStart(p.piece[i]) {
				continue
			}
			l, r := p.piece[:i], p.piece[i:]
			if _, ok := vocab[l]; ok {
				if _, ok := vocab[r]; ok {
					local = append(local, merge{l, r, p.score})
				}
			}
		}
		slices.SortStableFunc(local, func(a, b merge) int {
			return cmp.Or(cmp.Compare(vocab[a.l], vocab[b.l]), cmp.Compare(vocab[a.r], vocab[b.r]))
		})
		merges = append(merges, local...)
	}
	slices.SortStableFunc(merges, func(a, b merge) int { return cmp.Compare(b.score, a.score) })
	ms := make([][]string, len(merges))
	for i, m := range merges {
		ms[i] = []string{m.l, m.r}
	}
	var added []any
	for i, p := range sp.m.pieces {
		if p.typ == spControl || p.typ == spUnknown {
			added = append(added, map[string]any{"id": i, "content": p.piece, "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false})
		}
	}
	return mustJSON(t, map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": added,
		"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "▁"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"},
		}},
		"pre_tokenizer": nil,
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"pair":           []any{},
			"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []int{1}, "tokens": []string{"<s>"}}}},
		"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "ByteFallback"},
			map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0},
		}},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": "<unk>", "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": ms},
	})
}

func mustJSON(t testing.TB, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
