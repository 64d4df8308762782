package gpt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"testing"
)

func TestSamplerSingle(t *testing.T) {
	cases := []struct {
		total int
		cfg   SamplerConfig
		want  string
	}{
		// 10 samples, mbs 2, dp 2: chunks [0..3] [4..7]; the partial [8,9] is dropped.
		{10, SamplerConfig{MicroBatchSize: 2, DataParallelSize: 2, DataParallelRank: 0}, "[[0 1] [4 5]]"},
		{10, SamplerConfig{MicroBatchSize: 2, DataParallelSize: 2, DataParallelRank: 1}, "[[2 3] [6 7]]"},
		// Resume after 3 consumed samples.
		{10, SamplerConfig{ConsumedSamples: 3, MicroBatchSize: 2, DataParallelSize: 2, DataParallelRank: 1}, "[[5 6]]"},
		{7, SamplerConfig{MicroBatchSize: 3}, "[[0 1 2] [3 4 5]]"},
		{7, SamplerConfig{MicroBatchSize: 3, KeepLast: true}, "[[0 1 2] [3 4 5] [6]]"},
		{5, SamplerConfig{MicroBatchSize: 2, DataParallelSize: 2, DataParallelRank: 1, KeepLast: true}, "[[2 3] []]"},
	}
	for _, c := range cases {
		s, err := NewSampler(c.total, c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		var got [][]int64
		for ids, ok := s.Next(); ok; ids, ok = s.Next() {
			got = append(got, ids)
		}
		if g := fmt.Sprint(got); g != c.want {
			t.Errorf("total %d %+v: %s, want %s", c.total, c.cfg, g, c.want)
		}
	}
	for _, bad := range []SamplerConfig{{ConsumedSamples: 10, MicroBatchSize: 1}, {MicroBatchSize: 0}, {MicroBatchSize: 1, DataParallelSize: 2, DataParallelRank: 2}} {
		if _, err := NewSampler(10, bad); err == nil {
			t.Errorf("NewSampler(10, %+v) succeeded", bad)
		}
	}
}

func TestBatches(t *testing.T) {
	dir := t.TempDir()
	prefix := writeToy(t, dir)
	ds, err := Build(context.Background(), Config{SeqLength: 8, Seed: 1234, Split: "80,20,0", Blend: Blend{Prefixes: []string{prefix}},
		NumSamples: [3]int64{20, 3, 0}, EOD: 99, CachePath: filepath.Join(dir, "c"), Masks: MaskOptions{ResetAttentionMask: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	it, err := NewBatches(ds.Train, SamplerConfig{ConsumedSamples: 4, MicroBatchSize: 3, DataParallelSize: 2, DataParallelRank: 1})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		b, err := it.Next(context.Background())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if b.B != 3 || b.SeqLength != 8 || len(b.Tokens) != 24 || len(b.DocIDs) != 24 {
			t.Fatalf("batch shape B=%d L=%d tokens=%d docids=%d", b.B, b.SeqLength, len(b.Tokens), len(b.DocIDs))
		}
		want, _ := ds.Train.Sample(int(b.Indices[1]))
		for i, v := range want.Tokens {
			if b.Tokens[8+i] != v {
				t.Fatalf("row 1 differs from Sample(%d)", b.Indices[1])
			}
		}
		n++
	}
	// 22 samples from 4: chunks of 6 at 4, 10, 16; 22−22 leaves none.
	if n != 3 || it.Consumed() != 22 {
		t.Errorf("%d batches, consumed %d; want 3, 22", n, it.Consumed())
	}
}
