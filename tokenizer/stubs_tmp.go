package tokenizer

import "errors"

var errNotYet = errors.New("tokenizer: not implemented yet")

// LoadHuggingFace is in progress.
func LoadHuggingFace(path string) (Tokenizer, error) { return nil, errNotYet }
