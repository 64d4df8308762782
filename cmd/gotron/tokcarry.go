package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/gotron/gotron/ckpt/hf"
	"github.com/gotron/gotron/internal/assets/gpt2"
	"github.com/gotron/gotron/tokenizer"
)

// A checkpoint carries its tokenizer in <save>/tokenizer/ (hf.TokenizerDir):
// the files (vocab.json and merges.txt, tokenizer.json, tokenizer.model, a
// TikToken vocabulary) and tokenizerManifest, which records how they are
// read (Megatron's --tokenizer-type and its options: a tokenizer.model may
// be a SentencePieceTokenizer, a GPTSentencePieceTokenizer or a
// Llama2Tokenizer, and they encode differently). gotron train writes it,
// as the quickstart and convert --from hf do, so that generate, serve and
// score need no tokenizer flags. Directories without a manifest (HF
// imports, older checkpoints) are read by their file names.

// tokenizerManifest is the manifest's file name in the tokenizer directory.
const tokenizerManifest = "gotron_tokenizer.json"

// carriedTokenizer is the manifest: the tokenizer.Config the run used, its
// file paths replaced by names inside the tokenizer directory.
type carriedTokenizer struct {
	Format string           `json:"format"` // "gotron-tokenizer"
	Config tokenizer.Config `json:"config"`
}

// carryRunTokenizer copies the files of the tokenizer tc into save's tokenizer
// directory with a manifest. A directory that already carries a tokenizer
// (a resumed run) must carry the same one: other files would pair the
// checkpoint with the wrong vocabulary, and are refused.
func carryRunTokenizer(save string, tc tokenizer.Config) error {
	dir := filepath.Join(save, hf.TokenizerDir)
	files := map[string][]byte{} // name in dir → contents
	add := func(flag, src, name string) error {
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("carrying the tokenizer into --save %s: %s: %w", save, flag, err)
		}
		files[name] = b
		return nil
	}
	carried := tc
	var err error
	switch tc.Type {
	case tokenizer.TypeGPT2BPE:
		carried.VocabFile, carried.MergeFile = "vocab.json", "merges.txt"
		err = errors.Join(add("--vocab-file", tc.VocabFile, "vocab.json"), add("--merge-file", tc.MergeFile, "merges.txt"))
	case tokenizer.TypeSentencePiece, tokenizer.TypeGPTSentencePiece, tokenizer.TypeLlama2:
		carried.Model = "tokenizer.model"
		err = add("--tokenizer-model", tc.Model, "tokenizer.model")
	case tokenizer.TypeTikToken:
		carried.Model = "tiktoken.json"
		err = add("--tokenizer-model", tc.Model, "tiktoken.json")
	case tokenizer.TypeHuggingFace:
		// A tokenizer.json, or a directory holding one, with the files
		// beside it that the server reads (tokenizer_config.json's chat
		// template and special tokens).
		src := tc.Model
		if st, serr := os.Stat(src); serr == nil && !st.IsDir() {
			src = filepath.Dir(src)
			err = add("--tokenizer-model", tc.Model, "tokenizer.json")
		}
		for _, n := range hf.TokenizerFileNames() {
			if _, ok := files[n]; ok {
				continue
			}
			if b, rerr := os.ReadFile(filepath.Join(src, n)); rerr == nil {
				files[n] = b
			}
		}
		if _, ok := files["tokenizer.json"]; !ok && err == nil {
			err = fmt.Errorf("carrying the tokenizer into --save %s: --tokenizer-model %s holds no tokenizer.json", save, tc.Model)
		}
		carried.Model = "tokenizer.json"
	case tokenizer.TypeNull:
		// No files: the vocabulary size is all there is.
	default:
		return fmt.Errorf("carrying the tokenizer into --save %s: tokenizer type %q has no carried form", save, tc.Type)
	}
	if err != nil {
		return err
	}
	man, err := json.MarshalIndent(carriedTokenizer{Format: "gotron-tokenizer", Config: carried}, "", "  ")
	if err != nil {
		return err
	}
	files[tokenizerManifest] = append(man, '\n')
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("carrying the tokenizer: %w", err)
	}
	for name, b := range files {
		have, err := os.ReadFile(filepath.Join(dir, name))
		if err == nil && !bytes.Equal(have, b) {
			return fmt.Errorf("--save %s carries another tokenizer than this run's (%s differs): resume with the tokenizer it was trained with, or choose another --save directory",
				save, filepath.Join(dir, name))
		}
	}
	for name, b := range files {
		if err := writeFileAtomic(filepath.Join(dir, name), b); err != nil {
			return fmt.Errorf("carrying the tokenizer: %w", err)
		}
	}
	return nil
}

// writeFileAtomic writes path through a temporary file and a rename, so a
// crash leaves the old file or the new, never half of one.
func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// carriedTokenizerConfig returns the tokenizer a checkpoint's tokenizer
// directory carries: by its manifest, else by its file names
// (tokenizer.json, vocab.json and merges.txt, tokenizer.model). ok is
// false when it carries none.
func carriedTokenizerConfig(dir string) (cfg tokenizer.Config, ok bool, err error) {
	if dir == "" {
		return tokenizer.Config{}, false, nil
	}
	path := filepath.Join(dir, tokenizerManifest)
	raw, err := os.ReadFile(path)
	if err == nil {
		var man carriedTokenizer
		if err := json.Unmarshal(raw, &man); err != nil || man.Format != "gotron-tokenizer" || man.Config.Type == "" {
			return tokenizer.Config{}, false, fmt.Errorf("%s: not a gotron tokenizer manifest (%v)", path, err)
		}
		c := man.Config
		for _, p := range []*string{&c.VocabFile, &c.MergeFile, &c.Model} {
			if *p == "" {
				continue
			}
			if filepath.Base(*p) != *p {
				return tokenizer.Config{}, false, fmt.Errorf("%s: file %q is not a name inside %s", path, *p, dir)
			}
			*p = filepath.Join(dir, *p)
		}
		return c, true, nil
	}
	exists := func(n string) bool { _, err := os.Stat(filepath.Join(dir, n)); return err == nil }
	switch {
	case exists("tokenizer.json"):
		return tokenizer.Config{Type: tokenizer.TypeHuggingFace, Model: filepath.Join(dir, "tokenizer.json")}, true, nil
	case exists("vocab.json") && exists("merges.txt"):
		return tokenizer.Config{Type: tokenizer.TypeGPT2BPE, VocabFile: filepath.Join(dir, "vocab.json"), MergeFile: filepath.Join(dir, "merges.txt")}, true, nil
	case exists("tokenizer.model"):
		return tokenizer.Config{Type: tokenizer.TypeLlama2, Model: filepath.Join(dir, "tokenizer.model")}, true, nil
	}
	return tokenizer.Config{}, false, nil
}

// checkpointTokenizer opens the tokenizer generate, serve and score use:
// the one the flags name, else the one the checkpoint carries, else, for a
// GPT-2-sized vocabulary only, the embedded GPT-2 BPE, saying so on
// stderr (a model trained on another 50257-token vocabulary would decode
// to wrong text). Any other vocabulary without a tokenizer is an error.
func checkpointTokenizer(cfg tokenizer.Config, tokDir string, vocab int, load string, stderr io.Writer) (tokenizer.Tokenizer, error) {
	if cfg.Type == "" {
		carried, ok, err := carriedTokenizerConfig(tokDir)
		if err != nil {
			return nil, fmt.Errorf("--load %s: %w", load, err)
		}
		if !ok {
			if vocab != tokenizer.PaddedVocabSize(50257, 128, 1) && vocab != 50257 {
				return nil, fmt.Errorf("--load %s carries no tokenizer (no %s) and has a vocabulary of %d: name its tokenizer with --tokenizer-type and its files",
					load, filepath.Join(load, hf.TokenizerDir), vocab)
			}
			fmt.Fprintf(stderr, "gotron: --load %s carries no tokenizer (no %s): using the built-in GPT-2 BPE, as its vocabulary of %d is GPT-2's; if it was trained with another tokenizer, name it with --tokenizer-type and its files\n",
				load, filepath.Join(load, hf.TokenizerDir), vocab)
			return gpt2.Tokenizer()
		}
		cfg = carried
	}
	tok, err := tokenizer.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return tok, nil
}
