package safetensors

import (
	"bytes"
	"os"
	"slices"
	"testing"
)

// checkParsed asserts the invariants of a successfully parsed file: every
// view has dtype×shape bytes within buf, and re-encoding is canonical
// (encode → parse → encode gives the same bytes and the same tensors).
func checkParsed(t *testing.T, f *File, buf []byte) {
	t.Helper()
	tensors := f.Tensors()
	for name, tn := range tensors {
		if err := tn.Validate(); err != nil {
			t.Fatalf("tensor %q: %v", name, err)
		}
	}
	var enc bytes.Buffer
	if _, err := Encode(&enc, tensors, f.Metadata()); err != nil {
		if len(buf) > 8+MaxHeaderBytes/2 {
			return // re-encoding may grow a huge header past the limit
		}
		t.Fatalf("re-encode: %v", err)
	}
	g, err := Parse("re-encoded", enc.Bytes())
	if err != nil {
		t.Fatalf("parse of re-encoded file: %v", err)
	}
	again := g.Tensors()
	if len(again) != len(tensors) {
		t.Fatalf("re-encoded %d tensors, had %d", len(again), len(tensors))
	}
	for name, tn := range tensors {
		a := again[name]
		if a.DType != tn.DType || !slices.Equal(a.Shape, tn.Shape) || !bytes.Equal(a.Data, tn.Data) {
			t.Fatalf("tensor %q changed on re-encode", name)
		}
	}
	var enc2 bytes.Buffer
	if _, err := Encode(&enc2, again, g.Metadata()); err != nil || !bytes.Equal(enc.Bytes(), enc2.Bytes()) {
		t.Fatalf("encoding not canonical (err %v)", err)
	}
}

// FuzzHeader feeds arbitrary bytes to Parse: it must never panic, and what
// it accepts must satisfy checkParsed. Seeds: f.Add below plus
// testdata/fuzz/FuzzHeader. Run: go test -fuzz FuzzHeader ./ckpt/safetensors
func FuzzHeader(f *testing.F) {
	fixture, err := os.ReadFile("testdata/fixture.safetensors")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(fixture)
	f.Add(st(`{}`, 0))
	f.Add(st(`{"__metadata__":{"a":"b"},`+okA+`,`+okB+`}`, 12))
	f.Add(st(`{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}`, 1))
	f.Add(st(`{"x":{"dtype":"I32","shape":[2,0],"data_offsets":[0,0]}}`, 0))
	f.Fuzz(func(t *testing.T, buf []byte) {
		file, err := Parse("fuzz", buf)
		if err != nil {
			if _, ok := err.(*FormatError); !ok {
				t.Fatalf("error %T is not *FormatError: %v", err, err)
			}
			return
		}
		checkParsed(t, file, buf)
	})
}
