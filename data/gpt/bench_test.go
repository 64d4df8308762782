package gpt

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/gotron/gotron/data/indexed"
	"github.com/gotron/gotron/internal/nprand"
)

// syntheticIdx writes an .idx of about tokens tokens in one-sequence
// documents of 1..2000 tokens, and a sparse .bin of the matching size.
func syntheticIdx(b *testing.B, dir string, tokens int64) string {
	b.Helper()
	prefix := filepath.Join(dir, "synthetic")
	r := nprand.New(7)
	var lengths []int32
	var docs []int64
	docs = append(docs, 0)
	var total int64
	for total < tokens {
		l := int32(r.Interval(1999)) + 1
		lengths = append(lengths, l)
		docs = append(docs, int64(len(lengths)))
		total += int64(l)
	}
	f, err := os.Create(prefix + ".idx")
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	if err := indexed.WriteIndex(w, indexed.UInt16, lengths, docs, nil); err != nil {
		b.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	f.Close()
	if err := os.WriteFile(prefix+".bin", nil, 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.Truncate(prefix+".bin", total*2); err != nil {
		b.Fatal(err)
	}
	return prefix
}

// BenchmarkBuildIndices builds train/valid/test indices over 10⁹ tokens
// (about 10⁶ documents) at --seq-length 2048, 2 epochs of training samples,
// without the cache: the cost of a cold start.
func BenchmarkBuildIndices(b *testing.B) {
	prefix := syntheticIdx(b, b.TempDir(), 1_000_000_000)
	cfg := Config{SeqLength: 2048, Seed: 1234, Split: "969,30,1", Blend: Blend{Prefixes: []string{prefix}},
		NumSamples: [3]int64{1_000_000, 10_000, 1_000}, NoCache: true}
	b.ReportAllocs()
	for b.Loop() {
		ds, err := Build(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		ds.Close()
	}
}
