package megatron

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gotron/gotron/tokenizer"
)

// CopyTokenizer copies the tokenizer files the checkpoint's args name
// (paths on the machine that trained it) into dst, under the names gotron
// looks for beside a checkpoint: GPT2BPETokenizer's vocab_file and
// merge_file as vocab.json and merges.txt; the tokenizer_model of the
// SentencePiece tokenizers as tokenizer.model; a HuggingFaceTokenizer's
// tokenizer_model directory's tokenizer.json (and companions). It returns
// the names copied and the files named but not found here (nothing is
// copied for a tokenizer whose files are incomplete). Other tokenizer
// types, and hub names, copy nothing.
func CopyTokenizer(info Info, dst string) (copied, missing []string, err error) {
	type file struct{ src, name string }
	var files []file
	switch info.TokenizerType {
	case tokenizer.TypeGPT2BPE:
		files = []file{{info.VocabFile, "vocab.json"}, {info.MergeFile, "merges.txt"}}
	case tokenizer.TypeLlama2, tokenizer.TypeSentencePiece, tokenizer.TypeGPTSentencePiece:
		files = []file{{info.TokenizerModel, "tokenizer.model"}}
	case tokenizer.TypeHuggingFace:
		dir := info.TokenizerModel
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			if dir != "" {
				missing = append(missing, dir)
			}
			return nil, missing, nil
		}
		for _, name := range []string{"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt"} {
			if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
				files = append(files, file{filepath.Join(dir, name), name})
			}
		}
		if len(files) == 0 {
			return nil, []string{filepath.Join(dir, "tokenizer.json")}, nil
		}
	default:
		return nil, nil, nil
	}
	for _, f := range files {
		if f.src == "" {
			continue
		}
		if st, err := os.Stat(f.src); err != nil || st.IsDir() {
			missing = append(missing, f.src)
		}
	}
	if len(missing) > 0 {
		return nil, missing, nil
	}
	for _, f := range files {
		if f.src == "" {
			continue
		}
		if err := copyFile(f.src, filepath.Join(dst, f.name)); err != nil {
			return copied, nil, err
		}
		copied = append(copied, f.name)
	}
	return copied, nil, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("megatron: tokenizer file %w", err)
	}
	if err != nil {
		return fmt.Errorf("megatron: %w", err)
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("megatron: %w", err)
	}
	out, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("megatron: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("megatron: copy %s to %s: %w", src, dst, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("megatron: %w", err)
	}
	return nil
}
