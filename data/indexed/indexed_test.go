package indexed

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// specDocs builds the toy dataset of Megatron's reference values: 10
// one-sequence documents with lengths
// 5,3,8,2,6,4,7,1,9,5, contents [(t+i) mod 99 for i < len−1] + [99].
func specDocs() [][]int32 {
	var docs [][]int32
	t := 0
	for _, l := range []int{5, 3, 8, 2, 6, 4, 7, 1, 9, 5} {
		d := make([]int32, 0, l)
		for i := 0; i < l-1; i++ {
			d = append(d, int32((t+i)%99))
		}
		d = append(d, 99)
		docs = append(docs, d)
		t += l
	}
	return docs
}

// specIdxHex is the .idx Megatron's IndexedDatasetBuilder
// (megatron/core/datasets/indexed_dataset.py) wrote for specDocs.
const specIdxHex = "4d4d49444944580000" + "0100000000000000" + "08" + "0a00000000000000" + "0b00000000000000" +
	"05000000030000000800000002000000060000000400000007000000010000000900000005000000" +
	"0000000000000000" + "0a00000000000000" + "1000000000000000" + "2000000000000000" + "2400000000000000" +
	"3000000000000000" + "3800000000000000" + "4600000000000000" + "4800000000000000" + "5a00000000000000" +
	"0000000000000000" + "0100000000000000" + "0200000000000000" + "0300000000000000" + "0400000000000000" +
	"0500000000000000" + "0600000000000000" + "0700000000000000" + "0800000000000000" + "0900000000000000" +
	"0a00000000000000"

func build(t *testing.T, prefix string, cfg BuilderConfig, docs [][]int32) {
	t.Helper()
	b, err := NewBuilder(prefix, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if err := b.AddDocument(d, []int{len(d)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Finalize(); err != nil {
		t.Fatal(err)
	}
}

func TestSpecExampleBytes(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "toy")
	build(t, prefix, BuilderConfig{DType: OptimalDType(100)}, specDocs())
	idx, _ := os.ReadFile(prefix + ".idx")
	want, _ := hex.DecodeString(specIdxHex)
	if len(want) != 242 || !bytes.Equal(idx, want) {
		t.Fatalf(".idx differs from Megatron's:\n got %x\nwant %x", idx, want)
	}
	bin, _ := os.ReadFile(prefix + ".bin")
	if len(bin) != 100 {
		t.Fatalf(".bin is %d bytes, want 100", len(bin))
	}
	ds, err := Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	for i, d := range specDocs() {
		if got := ds.AppendTokens(nil, i, 0, len(d)); !slices.Equal(got, d) {
			t.Errorf("sequence %d = %v, want %v", i, got, d)
		}
	}
	if got := ds.AppendTokens(nil, 2, 3, 4); !slices.Equal(got, []int32{11, 12, 13, 14}) {
		t.Errorf("sequence 2 [3:7] = %v", got)
	}
}

// Every dtype round-trips, including negative ids where the dtype is signed.
func TestDTypesRoundTrip(t *testing.T) {
	for d := UInt8; d <= UInt16; d++ {
		t.Run(d.String(), func(t *testing.T) {
			toks := []int32{0, 1, 100, 127}
			switch d {
			case Int8, Int16, Int32, Int64, Float32, Float64:
				toks = append(toks, -5)
			}
			if d.Size() >= 2 {
				toks = append(toks, 30000)
			}
			if d == UInt16 {
				toks = append(toks, 65535)
			}
			if d == Int32 || d == Int64 || d == Float64 {
				toks = append(toks, 1<<31-1, -1<<31)
			}
			prefix := filepath.Join(t.TempDir(), "x")
			build(t, prefix, BuilderConfig{DType: d}, [][]int32{toks, {}, toks[:2]})
			ds, err := Open(prefix)
			if err != nil {
				t.Fatal(err)
			}
			defer ds.Close()
			if ds.DType != d || ds.NumSequences() != 3 || ds.NumDocuments() != 3 {
				t.Fatalf("dtype %v, %d sequences, %d documents", ds.DType, ds.NumSequences(), ds.NumDocuments())
			}
			if got := ds.AppendTokens(nil, 0, 0, len(toks)); !slices.Equal(got, toks) {
				t.Errorf("got %v, want %v", got, toks)
			}
			if len(ds.SequenceBytes(0)) != len(toks)*d.Size() {
				t.Errorf("SequenceBytes has %d bytes", len(ds.SequenceBytes(0)))
			}
		})
	}
}

func TestTokenOutOfRange(t *testing.T) {
	b, err := NewBuilder(filepath.Join(t.TempDir(), "x"), BuilderConfig{DType: UInt16})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.AddItem([]int32{1, 70000}, 0); err == nil || !strings.Contains(err.Error(), "70000") {
		t.Fatalf("AddItem(70000) into uint16: err = %v", err)
	}
}

// Multi-sequence documents, empty documents, modes and add_index.
func TestMultimodalSentencesAndAddIndex(t *testing.T) {
	dir := t.TempDir()
	a, b, out := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "out")
	cfg := BuilderConfig{DType: Int32, Multimodal: true}
	ba, _ := NewBuilder(a, cfg)
	must(t, ba.AddDocument([]int32{1, 2, 3, 4, 5}, []int{2, 3}, []int8{1, 2}))
	must(t, ba.AddDocument(nil, nil, nil)) // empty document
	must(t, ba.AddItem([]int32{6}, 3))
	must(t, ba.AddItem([]int32{7, 8}, 0))
	ba.EndDocument()
	must(t, ba.Finalize())
	bb, _ := NewBuilder(b, cfg)
	must(t, bb.AddDocument([]int32{9}, []int{1}, nil))
	must(t, bb.Finalize())

	bo, _ := NewBuilder(out, cfg)
	must(t, bo.AddIndex(a))
	must(t, bo.AddIndex(b))
	must(t, bo.AddDocument([]int32{10, 11}, []int{2}, []int8{4}))
	must(t, bo.Finalize())

	ds, err := Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	if !ds.Multimodal {
		t.Fatal("not multimodal")
	}
	var lens, docs, modes []int64
	for i := 0; i < ds.NumSequences(); i++ {
		lens = append(lens, int64(ds.SequenceLength(i)))
		modes = append(modes, int64(ds.SequenceMode(i)))
	}
	for k := 0; k <= ds.NumDocuments(); k++ {
		docs = append(docs, ds.DocumentIndex(k))
	}
	check := func(name string, got, want []int64) {
		if !slices.Equal(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("lengths", lens, []int64{2, 3, 1, 2, 1, 2})
	check("document_indices", docs, []int64{0, 2, 2, 4, 5, 6})
	check("modes", modes, []int64{1, 2, 3, 0, 0, 4})
	var all []int32
	for i := 0; i < ds.NumSequences(); i++ {
		all = ds.AppendTokens(all, i, 0, int(ds.SequenceLength(i)))
	}
	if !slices.Equal(all, []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}) {
		t.Errorf("tokens = %v", all)
	}
	bu, _ := NewBuilder(filepath.Join(dir, "u"), BuilderConfig{DType: UInt16})
	if err := bu.AddIndex(a); err == nil {
		t.Error("AddIndex of an int32 dataset into a uint16 builder succeeded")
	}
}

func TestCorruptFiles(t *testing.T) {
	want, _ := hex.DecodeString(specIdxHex)
	mod := func(f func(b []byte) []byte) []byte { return f(slices.Clone(want)) }
	cases := []struct {
		name   string
		idx    []byte
		offset int64
		want   string
	}{
		{"empty", nil, 0, "header"},
		{"truncated header", want[:20], 20, "header"},
		{"bad magic", mod(func(b []byte) []byte { b[0] = 'X'; return b }), 0, "magic"},
		{"bad version", mod(func(b []byte) []byte { b[9] = 2; return b }), 9, "version"},
		{"bad dtype", mod(func(b []byte) []byte { b[17] = 9; return b }), 17, "dtype"},
		{"truncated arrays", want[:241], 241, "file size"},
		{"huge N", mod(func(b []byte) []byte { b[25] = 0x7f; return b }), 18, "sequence count"},
		{"zero D", mod(func(b []byte) []byte { b[26] = 0; return b }), 26, "document_indices count"},
		{"negative length", mod(func(b []byte) []byte { b[37] = 0xff; return b }), 34, "≥ 0"},
		{"bad pointer", mod(func(b []byte) []byte { b[74+8] = 9; return b }), 82, "sequence_pointers[1]"},
		{"bad last doc", mod(func(b []byte) []byte { b[234] = 9; return b }), 234, "document_indices"},
	}
	for _, c := range cases {
		_, err := ParseIndex("toy.idx", c.idx)
		var fe *FormatError
		if !errors.As(err, &fe) {
			t.Errorf("%s: err = %v, want *FormatError", c.name, err)
			continue
		}
		if fe.File != "toy.idx" || fe.Offset != c.offset || !strings.Contains(fe.Want, c.want) {
			t.Errorf("%s: got %v (offset %d), want offset %d mentioning %q", c.name, err, fe.Offset, c.offset, c.want)
		}
	}
	// A .bin shorter than the index says.
	prefix := filepath.Join(t.TempDir(), "toy")
	build(t, prefix, BuilderConfig{DType: UInt16}, specDocs())
	must(t, os.Truncate(prefix+".bin", 99))
	_, err := Open(prefix)
	var fe *FormatError
	if !errors.As(err, &fe) || fe.File != prefix+".bin" {
		t.Errorf("truncated .bin: err = %v", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "missing.idx") {
		t.Errorf("missing file: err = %v", err)
	}
}

// FuzzIndex: ParseIndex never panics, and whatever it accepts is consistent
// and re-serialises to the same bytes.
func FuzzIndex(f *testing.F) {
	want, _ := hex.DecodeString(specIdxHex)
	f.Add(want)
	f.Add(want[:40])
	f.Add([]byte(Magic))
	var mm bytes.Buffer
	_ = WriteIndex(&mm, Int32, []int32{2, 0}, []int64{0, 1, 1, 2}, []int8{1, 2})
	f.Add(mm.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		x, err := ParseIndex("f.idx", b)
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is not a *FormatError", err)
			}
			return
		}
		lens := x.SequenceLengths()
		docs := make([]int64, x.NumDocuments()+1)
		for k := range docs {
			docs[k] = x.DocumentIndex(k)
		}
		var modes []int8
		if x.Multimodal {
			for i := range lens {
				modes = append(modes, x.SequenceMode(i))
			}
		}
		var out bytes.Buffer
		if err := WriteIndex(&out, x.DType, lens, docs, modes); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), b) {
			t.Fatalf("accepted index does not re-serialise to itself")
		}
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
