package indexed

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestBuilderReplacesOnlyOnFinalize: a dataset at the prefix is untouched
// until Finalize, survives Abort, and no temporary files remain.
func TestBuilderReplacesOnlyOnFinalize(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "d")
	write := func(tokens []int32, finalize bool) {
		b, err := NewBuilder(prefix, BuilderConfig{DType: UInt16})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.AddDocument(tokens, []int{len(tokens)}, nil); err != nil {
			t.Fatal(err)
		}
		if finalize {
			if err := b.Finalize(); err != nil {
				t.Fatal(err)
			}
		} else {
			b.Abort()
		}
	}
	read := func() []byte {
		bin, err := os.ReadFile(prefix + ".bin")
		if err != nil {
			t.Fatal(err)
		}
		idx, err := os.ReadFile(prefix + ".idx")
		if err != nil {
			t.Fatal(err)
		}
		return append(bin, idx...)
	}
	write([]int32{1, 2, 3}, true)
	first := read()
	write([]int32{4, 5}, false)
	if !bytes.Equal(read(), first) {
		t.Fatal("an aborted builder changed the dataset")
	}
	write([]int32{4, 5}, true)
	if bytes.Equal(read(), first) {
		t.Fatal("Finalize did not replace the dataset")
	}
	for _, ext := range []string{".bin", ".idx"} {
		if _, err := os.Stat(prefix + ext + TempSuffix); !os.IsNotExist(err) {
			t.Errorf("%s%s%s remains: %v", prefix, ext, TempSuffix, err)
		}
	}
}
