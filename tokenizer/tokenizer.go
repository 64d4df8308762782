package tokenizer

import (
	"errors"
	"fmt"
	"strings"
)

// Tokenizer encodes text to ids and decodes ids to text.
//
// All tokenizers returned by New are safe for concurrent use by multiple
// goroutines.
type Tokenizer interface {
	// Encode returns the ids of text, without special tokens (no BOS/EOD).
	Encode(text string) []int
	// Decode returns the text of ids.
	Decode(ids []int) string
	// VocabSize is the number of ids the tokenizer can produce (before
	// Megatron's padding, see PaddedVocabSize).
	VocabSize() int
	// EOD is the end-of-document id appended by preprocessing (--append-eod).
	EOD() int
}

// Specials is implemented by tokenizers that know more special ids than EOD.
// Each method reports ok=false when the tokenizer has no such token. Callers
// find it by type assertion:
//
//	if s, ok := tok.(tokenizer.Specials); ok { bos, hasBOS := s.BOS() ... }
type Specials interface {
	// BOS is the beginning-of-sequence id.
	BOS() (id int, ok bool)
	// EOS is the end-of-sequence id (often equal to EOD).
	EOS() (id int, ok bool)
	// Pad is the padding id.
	Pad() (id int, ok bool)
}

// Tokenize returns the ids Megatron's tokenizer.tokenize(text) returns, which
// tools/preprocess_data.py writes: t.Encode(text), except for tokenizers
// whose Megatron tokenize adds special tokens (Llama2Tokenizer prepends BOS),
// which implement Tokenize themselves.
func Tokenize(t Tokenizer, text string) []int {
	if m, ok := t.(interface{ Tokenize(string) []int }); ok {
		return m.Tokenize(text)
	}
	return t.Encode(text)
}

// Megatron's --tokenizer-type names accepted by New.
const (
	TypeGPT2BPE       = "GPT2BPETokenizer"
	TypeSentencePiece = "SentencePieceTokenizer"
	// TypeGPTSentencePiece is Megatron's GPTSentencePieceTokenizer: the
	// SentencePiece model with EOD = eos.
	TypeGPTSentencePiece = "GPTSentencePieceTokenizer"
	TypeLlama2           = "Llama2Tokenizer"
	TypeHuggingFace      = "HuggingFaceTokenizer"
	TypeTikToken         = "TikTokenizer"
	TypeNull             = "NullTokenizer"
)

// Config selects and locates a tokenizer. Field names follow Megatron's flags.
// The zero value is invalid: Type is required.
type Config struct {
	// Type is --tokenizer-type, one of the Type* constants.
	Type string
	// VocabFile is --vocab-file: GPT-2's vocab.json (GPT2BPETokenizer).
	VocabFile string
	// MergeFile is --merge-file: GPT-2's merges.txt (GPT2BPETokenizer).
	MergeFile string
	// Model is --tokenizer-model: a SentencePiece .model file
	// (SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer),
	// a tokenizer.json file or a directory holding one (HuggingFaceTokenizer),
	// or a Megatron TikToken JSON vocabulary (TikTokenizer).
	Model string
	// VocabExtraIDs is --vocab-extra-ids: the number of "<extra_id_i>"
	// tokens SentencePieceTokenizer appends. Zero means none.
	VocabExtraIDs int
	// VocabSize is --vocab-size. NullTokenizer: ids are 0..VocabSize-1 and
	// EOD is VocabSize-1, as Megatron's HEAD NullTokenizer (required).
	// TikTokenizer: the total vocabulary, special tokens included; zero
	// means 2^17 (131072).
	VocabSize int
	// TikTokenPattern is --tiktoken-pattern: "v1" or "v2" (required for
	// TikTokenizer, as in Megatron).
	TikTokenPattern string
	// TikTokenNumSpecialTokens is --tiktoken-num-special-tokens: the number of
	// ids reserved for special tokens before the vocabulary. Zero means 1000,
	// Megatron's default.
	TikTokenNumSpecialTokens int
	// TikTokenSpecialTokens is --tiktoken-special-tokens. Nil means
	// Megatron's default ["<unk>", "<s>", "</s>"]; it must hold "<unk>",
	// "<s>" and "</s>" when set.
	TikTokenSpecialTokens []string
}

// ErrConfig is wrapped by every error New returns for a bad Config.
var ErrConfig = errors.New("tokenizer: bad config")

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
}

// New builds the tokenizer cfg describes, reading its files.
func New(cfg Config) (Tokenizer, error) {
	switch cfg.Type {
	case TypeGPT2BPE:
		if cfg.VocabFile == "" || cfg.MergeFile == "" {
			return nil, configErr("%s needs --vocab-file (vocab.json) and --merge-file (merges.txt)", cfg.Type)
		}
		return LoadGPT2(cfg.VocabFile, cfg.MergeFile)
	case TypeSentencePiece, TypeGPTSentencePiece, TypeLlama2:
		if cfg.Model == "" {
			return nil, configErr("%s needs --tokenizer-model (a SentencePiece .model file)", cfg.Type)
		}
		sp, err := LoadSentencePiece(cfg.Model)
		if err != nil {
			return nil, err
		}
		switch cfg.Type {
		case TypeLlama2:
			return NewLlama2(sp)
		case TypeSentencePiece:
			return NewMegatronSentencePiece(sp, cfg.VocabExtraIDs), nil
		}
		return sp, nil
	case TypeHuggingFace:
		if cfg.Model == "" {
			return nil, configErr("%s needs --tokenizer-model (tokenizer.json or its directory)", cfg.Type)
		}
		return LoadHuggingFace(cfg.Model)
	case TypeTikToken:
		if cfg.Model == "" {
			return nil, configErr("%s needs --tokenizer-model (a TikToken JSON vocabulary)", cfg.Type)
		}
		return LoadTikToken(cfg.Model, TikTokenOptions{
			Pattern:          cfg.TikTokenPattern,
			VocabSize:        cfg.VocabSize,
			NumSpecialTokens: cfg.TikTokenNumSpecialTokens,
			SpecialTokens:    cfg.TikTokenSpecialTokens,
		})
	case TypeNull:
		return NewNull(cfg.VocabSize)
	case "":
		return nil, configErr("--tokenizer-type is required (one of %s)", strings.Join(types(), ", "))
	default:
		return nil, configErr("unknown --tokenizer-type %q (want one of %s)", cfg.Type, strings.Join(types(), ", "))
	}
}

func types() []string {
	return []string{TypeGPT2BPE, TypeSentencePiece, TypeGPTSentencePiece, TypeLlama2, TypeHuggingFace, TypeTikToken, TypeNull}
}

// PaddedVocabSize is Megatron's _vocab_size_with_padding: orig rounded up to a
// multiple of makeDivisibleBy·tensorParallel (--make-vocab-size-divisible-by,
// default 128, and --tensor-model-parallel-size). Values below 1 count as 1.
// GPT-2's 50257 becomes 50304 at TP=1 and 51200 at TP=8.
func PaddedVocabSize(orig, makeDivisibleBy, tensorParallel int) int {
	m := max(makeDivisibleBy, 1) * max(tensorParallel, 1)
	return (orig + m - 1) / m * m
}
