package tokenizer

import (
	"fmt"
	"path/filepath"
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

func ExampleSentencePiece() {
	sp, err := LoadSentencePiece("testdata/spm/llama2_bpe.model")
	if err != nil {
		fmt.Println(err)
		return
	}
	ids := sp.Encode("Hello world")
	fmt.Println(sp.Decode(ids))
	// Output: Hello world
}
