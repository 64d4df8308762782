package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// HuggingFace is Megatron's HuggingFaceTokenizer over a tokenizer.json (the
// Hugging Face tokenizers library's format): added/special tokens, then per
// remaining segment the normalizer, the pre-tokenizer and the model (BPE,
// byte-level or with byte fallback; WordPiece), and the decoder.
//
// Supported components: normalizers Sequence, Prepend, Replace (string or
// regex), Lowercase, Strip, NFC, NFD, NFKC, NFKD (tables from Unicode
// 14.0), BertNormalizer;
// pre-tokenizers Sequence, ByteLevel, Split (GPT-2 and Llama-3/cl100k
// patterns hand-written, others through regexp2), Metaspace,
// BertPreTokenizer, Whitespace, WhitespaceSplit, Digits, Punctuation;
// post-processors TemplateProcessing, BertProcessing, RobertaProcessing,
// ByteLevel; decoders ByteLevel, Metaspace, Replace, ByteFallback, Fuse,
// Strip, WordPiece, Sequence. Others (Unigram models, BPE subword prefixes
// and suffixes, Split with invert) are rejected by LoadHuggingFace with an
// error. Added tokens match the text before normalization, with their
// lstrip, rstrip and single_word flags; the normalized flag is not applied
// (a normalized=true token is not searched for in the normalized text).
type HuggingFace struct {
	added     *addedTokens
	norm      []hfNormalizer
	pre       []hfPreTok
	byteLevel bool // pieces are mapped to the byte-level alphabet
	model     hfModel
	decoders  []hfDecoder
	idToTok   []string // id → token string (model vocabulary and added tokens)
	special   map[int]bool
	n         int
	eod       int
	bos, eos  int
	pad       int
	template  []hfTemplatePart // post-processor for a single sequence
}

var _ Tokenizer = (*HuggingFace)(nil)

// hfModel encodes one pre-tokenized piece.
type hfModel interface {
	appendPiece(ids []int, piece string) []int
}

// LoadHuggingFace reads tokenizer.json (--tokenizer-model: the file or the
// directory holding it). A tokenizer_config.json beside it supplies the
// bos/eos/pad tokens (without one, well-known names are tried) and, for
// Llama and Gemma tokenizer classes, add_bos_token/add_eos_token.
func LoadHuggingFace(path string) (*HuggingFace, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "tokenizer.json")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: --tokenizer-model: %w", err)
	}
	var cfg []byte
	if c, err := os.ReadFile(filepath.Join(filepath.Dir(path), "tokenizer_config.json")); err == nil {
		cfg = c
	}
	t, err := ParseHuggingFace(b, cfg)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	return t, nil
}

type hfFile struct {
	AddedTokens []struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		Special    bool   `json:"special"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		SingleWord bool   `json:"single_word"`
	} `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         json.RawMessage `json:"model"`
}

// ParseHuggingFace builds the tokenizer from tokenizer.json's contents and,
// optionally (nil), tokenizer_config.json's.
func ParseHuggingFace(tokenizerJSON, configJSON []byte) (*HuggingFace, error) {
	var f hfFile
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, fmt.Errorf("not a tokenizer.json: %w", err)
	}
	t := &HuggingFace{special: map[int]bool{}, eod: -1, bos: -1, eos: -1, pad: -1}
	var err error
	if t.norm, err = parseHFNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	if t.pre, err = parseHFPreTok(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	for _, p := range t.pre {
		if p.byteLevel {
			t.byteLevel = true
		}
	}
	if t.decoders, err = parseHFDecoder(f.Decoder); err != nil {
		return nil, fmt.Errorf("decoder: %w", err)
	}
	vocab, err := t.parseModel(f.Model)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	var added []addedToken
	for _, a := range f.AddedTokens {
		if a.ID < 0 || a.ID >= maxVocabID {
			return nil, fmt.Errorf("added token %q has id %d, want 0 ≤ id < %d", a.Content, a.ID, maxVocabID)
		}
		added = append(added, addedToken{text: a.Content, id: a.ID, lstrip: a.LStrip, rstrip: a.RStrip, singleWord: a.SingleWord})
		vocab[a.Content] = a.ID
		if a.Special {
			t.special[a.ID] = true
		}
	}
	t.added = newAddedTokens(added)
	for tok, id := range vocab {
		if id < 0 {
			return nil, fmt.Errorf("token %q has negative id %d", tok, id)
		}
		t.n = max(t.n, id+1)
	}
	t.idToTok = make([]string, t.n)
	for tok, id := range vocab {
		t.idToTok[id] = tok
	}
	if t.template, err = parseHFPostProcessor(f.PostProcessor, vocab); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	t.findSpecials(vocab, configJSON)
	t.llamaTemplate(configJSON)
	return t, nil
}

// llamaTemplate applies transformers' LlamaTokenizerFast and
// GemmaTokenizerFast rule: their post-processor is rebuilt from
// tokenizer_config.json's add_bos_token (default true) and add_eos_token
// (default false), whatever tokenizer.json says.
func (t *HuggingFace) llamaTemplate(configJSON []byte) {
	var cfg struct {
		Class  string `json:"tokenizer_class"`
		AddBOS *bool  `json:"add_bos_token"`
		AddEOS *bool  `json:"add_eos_token"`
	}
	if configJSON == nil || json.Unmarshal(configJSON, &cfg) != nil {
		return
	}
	switch strings.TrimSuffix(cfg.Class, "Fast") {
	case "LlamaTokenizer", "CodeLlamaTokenizer", "GemmaTokenizer":
	default:
		return
	}
	t.template = []hfTemplatePart{{sequence: true}}
	if (cfg.AddBOS == nil || *cfg.AddBOS) && t.bos >= 0 {
		t.template = append([]hfTemplatePart{{id: t.bos}}, t.template...)
	}
	if cfg.AddEOS != nil && *cfg.AddEOS && t.eos >= 0 {
		t.template = append(t.template, hfTemplatePart{id: t.eos})
	}
}

// findSpecials sets bos/eos/pad from tokenizer_config.json or, without one,
// from well-known token names. EOD is eos, as Megatron's
// _HuggingFaceTokenizer.eod.
func (t *HuggingFace) findSpecials(vocab map[string]int, configJSON []byte) {
	var cfg map[string]json.RawMessage
	if configJSON != nil {
		_ = json.Unmarshal(configJSON, &cfg) // a broken config leaves the defaults below
	}
	pick := func(key string, names ...string) int {
		if raw, ok := cfg[key]; ok {
			var s string
			var obj struct {
				Content string `json:"content"`
			}
			if json.Unmarshal(raw, &s) == nil {
				if id, ok := vocab[s]; ok {
					return id
				}
			} else if json.Unmarshal(raw, &obj) == nil {
				if id, ok := vocab[obj.Content]; ok {
					return id
				}
			}
			if cfg != nil {
				return -1
			}
		}
		for _, n := range names {
			if id, ok := vocab[n]; ok {
				return id
			}
		}
		return -1
	}
	t.bos = pick("bos_token", "<s>", "<|begin_of_text|>", "<bos>", "[CLS]")
	t.eos = pick("eos_token", "</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[SEP]")
	t.pad = pick("pad_token", "<pad>", "[PAD]")
	t.eod = t.eos
}

// Encode returns the ids of text without the post-processor's special
// tokens (add_special_tokens=False).
func (t *HuggingFace) Encode(text string) []int {
	ids := make([]int, 0, len(text)/3+1)
	first := true
	t.added.each(text, func(seg string) {
		for _, n := range t.norm {
			seg = n(seg, first)
		}
		pieces := []string{seg}
		for _, p := range t.pre {
			pieces = p.apply(pieces, first)
		}
		for _, piece := range pieces {
			if piece != "" {
				ids = t.model.appendPiece(ids, piece)
			}
		}
		first = false
	}, func(id int) {
		ids = append(ids, id)
		first = false
	})
	return ids
}

// Tokenize is Megatron's HuggingFaceTokenizer.tokenize: Encode with the
// post-processor's special tokens (for example Llama's BOS), as
// tokenizer(text).input_ids.
func (t *HuggingFace) Tokenize(text string) []int {
	ids := t.Encode(text)
	if len(t.template) == 0 {
		return ids
	}
	out := make([]int, 0, len(ids)+len(t.template))
	for _, p := range t.template {
		if p.sequence {
			out = append(out, ids...)
		} else {
			out = append(out, p.id)
		}
	}
	return out
}

// Decode runs the decoder over the ids' token strings, special tokens
// included (skip_special_tokens=False).
func (t *HuggingFace) Decode(ids []int) string {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		if id >= 0 && id < len(t.idToTok) {
			toks = append(toks, t.idToTok[id])
		}
	}
	if len(t.decoders) == 0 {
		return strings.Join(toks, " ")
	}
	for _, d := range t.decoders {
		toks = d(toks)
	}
	return strings.Join(toks, "")
}

// VocabSize is the largest id plus one, added tokens included.
func (t *HuggingFace) VocabSize() int { return t.n }

// EOD is the eos token's id, or -1 when none was found.
func (t *HuggingFace) EOD() int { return t.eod }

// BOS is the bos token's id.
func (t *HuggingFace) BOS() (int, bool) { return t.bos, t.bos >= 0 }

// EOS is the eos token's id.
func (t *HuggingFace) EOS() (int, bool) { return t.eos, t.eos >= 0 }

// Pad is the pad token's id.
func (t *HuggingFace) Pad() (int, bool) { return t.pad, t.pad >= 0 }
