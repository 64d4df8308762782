package preprocess

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/gotron/gotron/tokenizer"
)

func gunzipFile(b *testing.B, src, dst string) {
	b.Helper()
	f, err := os.Open(src)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		b.Fatal(err)
	}
	out, err := os.Create(dst)
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	if _, err := io.Copy(out, z); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRunGPT2 preprocesses about 8 MB of JSONL (one document per .go
// file of $GOROOT/src) with the GPT-2 tokenizer and GOMAXPROCS workers;
// b.SetBytes makes `go test -bench` report MB/s.
func BenchmarkRunGPT2(b *testing.B) {
	dir := b.TempDir()
	vocab, merges := filepath.Join(dir, "vocab.json"), filepath.Join(dir, "merges.txt")
	gunzipFile(b, "../../internal/assets/gpt2/vocab.json.gz", vocab)
	gunzipFile(b, "../../internal/assets/gpt2/merges.txt.gz", merges)
	tok, err := tokenizer.New(tokenizer.Config{Type: tokenizer.TypeGPT2BPE, VocabFile: vocab, MergeFile: merges})
	if err != nil {
		b.Fatal(err)
	}
	var sb strings.Builder
	// go test puts its own toolchain first on PATH, so this is the GOROOT
	// of the go command running the benchmark.
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		b.Fatalf("go env GOROOT: %v", err)
	}
	root := filepath.Join(strings.TrimSpace(string(out)), "src")
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || sb.Len() > 8<<20 || d.IsDir() || !strings.HasSuffix(p, ".go") {
			return nil
		}
		text, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		line, _ := json.Marshal(map[string]string{"text": string(text)})
		sb.Write(line)
		sb.WriteByte('\n')
		return nil
	})
	input := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(input, []byte(sb.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(sb.Len()))
	for b.Loop() {
		if _, err := Run(context.Background(), Config{Input: input, OutputPrefix: filepath.Join(dir, "out"), Tokenizer: tok,
			AppendEOD: true, Workers: runtime.GOMAXPROCS(0)}); err != nil {
			b.Fatal(err)
		}
	}
}
