package tokenizer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// GPT2EndOfText is GPT-2's end-of-text token, the EOD of GPT2BPETokenizer.
const GPT2EndOfText = "<|endoftext|>"

// GPT2 is Megatron's GPT2BPETokenizer: byte-level BPE over a vocab.json and
// a merges.txt, GPT-2's pre-tokenizer, and "<|endoftext|>" as EOD. Like the
// Hugging Face GPT2Tokenizer Megatron wraps, the literal text
// "<|endoftext|>" encodes to its special id.
type GPT2 struct {
	bpe   *byteBPE
	vocab map[string]int // token string → id, for TokenID
	eod   int
	n     int
}

var _ Tokenizer = (*GPT2)(nil)

// LoadGPT2 reads vocab.json (--vocab-file) and merges.txt (--merge-file).
func LoadGPT2(vocabFile, mergeFile string) (*GPT2, error) {
	vocab, err := os.ReadFile(vocabFile)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: --vocab-file: %w", err)
	}
	merges, err := os.ReadFile(mergeFile)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: --merge-file: %w", err)
	}
	return ParseGPT2(vocab, merges, vocabFile, mergeFile)
}

// ParseGPT2 builds the tokenizer from the contents of vocab.json and
// merges.txt; the names are used in errors.
func ParseGPT2(vocabJSON, mergesTxt []byte, vocabName, mergesName string) (*GPT2, error) {
	vocab := map[string]int{}
	if err := json.Unmarshal(vocabJSON, &vocab); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: want a JSON object of token → id (GPT-2 vocab.json): %w", vocabName, err)
	}
	if err := checkDenseVocab(vocab); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", vocabName, err)
	}
	merges, err := parseMerges(mergesTxt, mergesName)
	if err != nil {
		return nil, err
	}
	eod, ok := vocab[GPT2EndOfText]
	if !ok {
		return nil, fmt.Errorf("tokenizer: %s: no %q token (GPT2BPETokenizer's EOD)", vocabName, GPT2EndOfText)
	}
	m := newByteBPE(vocab, merges, byRule(splitGPT2), eod) // GPT-2's unk_token is <|endoftext|>
	m.added = newAddedTokens([]addedToken{{text: GPT2EndOfText, id: eod}})
	return &GPT2{bpe: m, vocab: vocab, eod: eod, n: len(vocab)}, nil
}

// checkDenseVocab requires ids 0..len-1, each once.
func checkDenseVocab(vocab map[string]int) error {
	seen := make([]bool, len(vocab))
	for tok, id := range vocab {
		if id < 0 || id >= len(vocab) || seen[id] {
			return fmt.Errorf("token %q has id %d: want distinct ids 0..%d", tok, id, len(vocab)-1)
		}
		seen[id] = true
	}
	return nil
}

// parseMerges reads a merges.txt: an optional "#version" first line, then
// one "left right" pair per line; blank lines are skipped.
func parseMerges(txt []byte, name string) ([][2]string, error) {
	var merges [][2]string
	sc := bufio.NewScanner(bytes.NewReader(txt))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || (line == 1 && strings.HasPrefix(s, "#version")) {
			continue
		}
		f := strings.Fields(s)
		if len(f) != 2 {
			return nil, fmt.Errorf("tokenizer: %s:%d: want two space-separated tokens, got %q", name, line, s)
		}
		merges = append(merges, [2]string{f[0], f[1]})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", name, err)
	}
	return merges, nil
}

// Encode returns the BPE ids of text.
func (t *GPT2) Encode(text string) []int { return t.bpe.encode(text) }

// Decode returns the bytes of ids as a string (not necessarily valid UTF-8
// when ids cut a character); unknown ids are skipped.
func (t *GPT2) Decode(ids []int) string { return t.bpe.decode(ids) }

// VocabSize is the number of entries in vocab.json (50257 for GPT-2).
func (t *GPT2) VocabSize() int { return t.n }

// EOD is the id of "<|endoftext|>" (50256 for GPT-2).
func (t *GPT2) EOD() int { return t.eod }

// BOS is "<|endoftext|>", as GPT-2's bos_token.
func (t *GPT2) BOS() (int, bool) { return t.eod, true }

// EOS is "<|endoftext|>".
func (t *GPT2) EOS() (int, bool) { return t.eod, true }

// Pad reports no pad token.
func (t *GPT2) Pad() (int, bool) { return -1, false }
