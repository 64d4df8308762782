package indexed_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/gotron/gotron/data/indexed"
)

// Write a dataset with a two-sentence document and an empty one, then read
// it back through the memory map.
func Example() {
	dir, _ := os.MkdirTemp("", "indexed-example")
	defer os.RemoveAll(dir)
	prefix := filepath.Join(dir, "corpus_text_sentence")
	b, _ := indexed.NewBuilder(prefix, indexed.BuilderConfig{DType: indexed.OptimalDType(50257)})
	_ = b.AddDocument([]int32{15496, 13, 50256}, []int{2, 1}, nil)
	_ = b.AddDocument(nil, nil, nil)
	_ = b.Finalize()

	ds, err := indexed.Open(prefix)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ds.Close()
	fmt.Println(ds.DType, ds.NumDocuments(), ds.NumSequences(), ds.AppendTokens(nil, 1, 0, 1))
	// Output: uint16 2 2 [50256]
}
