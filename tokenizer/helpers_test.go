package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// readTestdata reads testdata/name, gunzipping *.gz.
func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	path := filepath.Join("testdata", name)
	if strings.HasPrefix(name, "gpt2/vocab.json") || strings.HasPrefix(name, "gpt2/merges.txt") {
		// GPT-2's files live once in the repository, embedded for the quickstart.
		path = filepath.Join("..", "internal", "assets", name)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(name, ".gz") {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if b, err = io.ReadAll(zr); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return b
}

// parseIDs parses whitespace-separated ids.
func parseIDs(t testing.TB, s string) []int {
	t.Helper()
	f := strings.Fields(s)
	ids := make([]int, len(f))
	for i, x := range f {
		v, err := strconv.Atoi(x)
		if err != nil {
			t.Fatalf("bad id %q", x)
		}
		ids[i] = v
	}
	return ids
}

var gpt2Once struct {
	sync.Once
	tok *GPT2
	err error
}

// gpt2Fixture loads GPT-2's vocab.json/merges.txt from testdata (once).
func gpt2Fixture(t testing.TB) *GPT2 {
	t.Helper()
	gpt2Once.Do(func() {
		vocab := readTestdata(t, "gpt2/vocab.json.gz")
		merges := readTestdata(t, "gpt2/merges.txt.gz")
		gpt2Once.tok, gpt2Once.err = ParseGPT2(vocab, merges, "vocab.json", "merges.txt")
	})
	if gpt2Once.err != nil {
		t.Fatal(gpt2Once.err)
	}
	return gpt2Once.tok
}

// firstDiff returns the first index where a and b differ, or -1.
func firstDiff(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// window returns ids[i-3:i+5] for error messages.
func window(ids []int, i int) []int {
	return ids[max(0, i-3):min(len(ids), i+5)]
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
