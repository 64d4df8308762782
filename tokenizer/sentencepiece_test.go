package tokenizer

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestSentencePieceSpmEncode: ids equal spm_encode's (sentencepiece 0.1.97)
// line by line on the multilingual corpus, for BPE and unigram models with
// and without byte fallback, nmt_nfkc and identity normalisation.
func TestSentencePieceSpmEncode(t *testing.T) {
	lines := strings.Split(strings.TrimSuffix(string(readTestdata(t, "multilingual.txt.gz")), "\n"), "\n")
	for _, name := range []string{"llama2_bpe", "unigram_nfkc", "bpe_nfkc", "unigram_bytes"} {
		t.Run(name, func(t *testing.T) {
			sp, err := LoadSentencePiece(filepath.Join("testdata", "spm", name+".model"))
			if err != nil {
				t.Fatal(err)
			}
			want := strings.Split(strings.TrimSuffix(string(readTestdata(t, "spm/"+name+".ids.gz")), "\n"), "\n")
			if len(want) != len(lines) {
				t.Fatalf("%d reference lines for %d corpus lines", len(want), len(lines))
			}
			total, bad := 0, 0
			for i, line := range lines {
				w := parseIDs(t, want[i])
				total += len(w)
				got := sp.Encode(line)
				if j := firstDiff(got, w); j >= 0 {
					if bad++; bad <= 3 {
						t.Errorf("line %d %q: ids differ at %d: got %v want %v", i+1, line, j, window(got, j), window(w, j))
					}
				}
			}
			if bad > 0 {
				t.Fatalf("%d of %d lines differ", bad, len(lines))
			}
			if total < 50000 {
				t.Fatalf("only %d reference tokens, want ≥ 50000", total)
			}
			t.Logf("%d lines, %d tokens equal", len(lines), total)
		})
	}
}

// TestMegatronSentencePiece: Megatron's SentencePieceTokenizer splits its
// special tokens out of the text and appends missing ones after the pieces.
func TestMegatronSentencePiece(t *testing.T) {
	sp, err := LoadSentencePiece(filepath.Join("testdata", "spm", "llama2_bpe.model"))
	if err != nil {
		t.Fatal(err)
	}
	m := NewMegatronSentencePiece(sp, 2)
	a, b := sp.Encode("a"), sp.Encode("b")
	want := append(append(append(append([]int{}, a...), 1002), b...), 1, 1006)
	if got := m.Encode("a<EOD>b<s><extra_id_1>"); !slices.Equal(got, want) {
		t.Fatalf("Encode = %v, want %v", got, want)
	}
	if got := m.Decode(want); got != "a <EOD> b <s>  <extra_id_1> " {
		t.Fatalf("Decode = %q", got)
	}
	if m.VocabSize() != 1007 || m.EOD() != 1002 {
		t.Fatalf("VocabSize %d EOD %d", m.VocabSize(), m.EOD())
	}
	if pad, _ := m.Pad(); pad != 1004 {
		t.Fatalf("Pad %d, want 1004 (<PAD> appended: the model has no pad id)", pad)
	}
}

// TestSentencePieceWordSplit: for BPE models whose pieces allow it, the
// cached word-by-word merge equals merging the whole normalized text.
func TestSentencePieceWordSplit(t *testing.T) {
	corpus := string(readTestdata(t, "multilingual.txt.gz"))
	for _, name := range []string{"llama2_bpe", "bpe_nfkc"} {
		sp, err := LoadSentencePiece(filepath.Join("testdata", "spm", name+".model"))
		if err != nil {
			t.Fatal(err)
		}
		if !sp.words {
			t.Fatalf("%s: word splitting not enabled", name)
		}
		for _, text := range []string{corpus[:20000], corpus[50000:90000], "  a  b  ", "x\u2581\u2581y"} {
			norm := sp.normalize(text)
			whole, words := sp.encodeBPE(norm), sp.encodeBPEWords(norm)
			if !slices.Equal(whole, words) {
				t.Fatalf("%s: word-by-word BPE differs from whole-text BPE on %.40q", name, text)
			}
		}
	}
}
