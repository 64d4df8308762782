package indexed

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestMegatronBuilderGoldens rebuilds the files testdata/megatron_builder.py
// wrote with Megatron's own IndexedDatasetBuilder and compares bytes.
func TestMegatronBuilderGoldens(t *testing.T) {
	type step func(b *Builder) error
	doc := func(toks []int32, lens []int, modes []int8) step {
		return func(b *Builder) error { return b.AddDocument(toks, lens, modes) }
	}
	item := func(toks []int32, mode int8) step { return func(b *Builder) error { return b.AddItem(toks, mode) } }
	end := func(b *Builder) error { b.EndDocument(); return nil }
	addIndex := func(name string) step {
		return func(b *Builder) error { return b.AddIndex(filepath.Join("testdata", name)) }
	}
	sentences := []step{doc([]int32{1, 2, 3, 4, 5}, []int{2, 3}, nil), doc(nil, nil, nil), doc([]int32{70000, 6}, []int{1, 1}, nil), item([]int32{7, 8, 9}, 0), end}
	cases := []struct {
		name  string
		cfg   BuilderConfig
		steps []step
	}{
		{"mg_sentences_int32", BuilderConfig{DType: Int32}, sentences},
		{"mg_multimodal_uint16", BuilderConfig{DType: UInt16, Multimodal: true},
			[]step{doc([]int32{1, 2, 3}, []int{1, 2}, []int8{0, 1}), item([]int32{4}, 2), end, doc([]int32{5, 6}, []int{2}, nil)}},
		{"mg_int64", BuilderConfig{DType: Int64}, []step{doc([]int32{-3, 0, 9}, []int{3}, nil)}},
		{"mg_float32", BuilderConfig{DType: Float32}, []step{doc([]int32{1, 2, 3}, []int{3}, nil)}},
		{"mg_uint8", BuilderConfig{DType: UInt8}, []step{doc([]int32{255, 0}, []int{2}, nil)}},
		{"mg_add_index_int32", BuilderConfig{DType: Int32},
			[]step{doc([]int32{10, 11}, []int{2}, nil), addIndex("mg_sentences_int32"), doc([]int32{12}, []int{1}, nil), addIndex("mg_sentences_int32")}},
	}
	dir := t.TempDir()
	for _, c := range cases {
		prefix := filepath.Join(dir, c.name)
		b, err := NewBuilder(prefix, c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range c.steps {
			if err := s(b); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		}
		if err := b.Finalize(); err != nil {
			t.Fatal(err)
		}
		for _, ext := range []string{".bin", ".idx"} {
			got, _ := os.ReadFile(prefix + ext)
			want, err := os.ReadFile(filepath.Join("testdata", c.name+ext))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s%s differs from Megatron's:\n got %x\nwant %x", c.name, ext, got, want)
			}
		}
		if _, err := Open(filepath.Join("testdata", c.name)); err != nil {
			t.Errorf("Open(Megatron's %s): %v", c.name, err)
		}
	}
}
