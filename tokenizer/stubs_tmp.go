package tokenizer

import "errors"

var errNotYet = errors.New("tokenizer: not implemented yet")

// Llama2 is Megatron's Llama2Tokenizer (in progress).
type Llama2 struct{ *SentencePiece }

// LoadHuggingFace is in progress.
func LoadHuggingFace(path string) (Tokenizer, error) { return nil, errNotYet }

// TikTokenOptions are TikTokenizer's options (in progress).
type TikTokenOptions struct {
	Pattern          string
	NumSpecialTokens int
	SpecialTokens    []string
}

// LoadTikToken is in progress.
func LoadTikToken(path string, o TikTokenOptions) (Tokenizer, error) { return nil, errNotYet }
