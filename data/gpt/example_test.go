package gpt_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/data/indexed"
)

// Build the toy dataset of Megatron's reference values, then read the first
// training sample exactly as Megatron's GPTDataset would.
func Example() {
	dir, _ := os.MkdirTemp("", "gpt-example")
	defer os.RemoveAll(dir)
	prefix := filepath.Join(dir, "toy")
	b, _ := indexed.NewBuilder(prefix, indexed.BuilderConfig{DType: indexed.OptimalDType(100)})
	tok := 0
	for _, l := range []int{5, 3, 8, 2, 6, 4, 7, 1, 9, 5} {
		var d []int32
		for i := 0; i < l-1; i++ {
			d = append(d, int32((tok+i)%99))
		}
		d = append(d, 99)
		tok += l
		_ = b.AddDocument(d, []int{l}, nil)
	}
	_ = b.Finalize()

	ds, err := gpt.Build(context.Background(), gpt.Config{
		SeqLength:  8,
		Seed:       1234,
		Split:      "80,20,0",
		Blend:      gpt.Blend{Prefixes: []string{prefix}},
		NumSamples: [3]int64{20, 3, 0},
		EOD:        99,
		CachePath:  filepath.Join(dir, "cache"),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ds.Close()
	s, _ := ds.Train.Sample(0)
	fmt.Println(ds.Train.Len(), s.Tokens, s.Labels)
	// Output: 22 [18 19 20 21 22 99 99 18] [19 20 21 22 99 99 18 19]
}
