package gpt

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// writeNpy must produce numpy.save's exact bytes (testdata/npy_golden.py),
// and readNpy must read them back.
func TestNpyMatchesNumpy(t *testing.T) {
	cases := []struct {
		file, descr string
		shape       []int
		data        []int64
	}{
		{"golden_i4.npy", "<i4", []int{3}, []int64{0, -1, 7}},
		{"golden_i4_2d.npy", "<i4", []int{4, 2}, []int64{0, 0, 2, 2, 4, 0, 6, 1}},
		{"golden_u4.npy", "<u4", []int{4}, []int64{2, 3, 8, 4294967295}},
		{"golden_i2.npy", "<i2", []int{3}, []int64{0, 1, -2}},
		{"golden_i8.npy", "<i8", []int{3}, []int64{12345678901, 12345678902, 12345678903}},
	}
	dir := t.TempDir()
	for _, c := range cases {
		want, err := os.ReadFile(filepath.Join("testdata", c.file))
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, c.file)
		if err := writeNpy(out, c.descr, c.shape, c.data); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(out)
		if !bytes.Equal(got, want) {
			t.Errorf("%s: writeNpy bytes differ from numpy.save:\n got %q\nwant %q", c.file, got, want)
		}
		a, err := readNpy(filepath.Join("testdata", c.file))
		if err != nil {
			t.Fatal(err)
		}
		if a.descr != c.descr || !slices.Equal(a.shape, c.shape) || !slices.Equal(a.data, c.data) {
			t.Errorf("%s: readNpy = %+v", c.file, a)
		}
	}
	if _, err := readNpy(filepath.Join(dir, "missing.npy")); err == nil {
		t.Error("readNpy of a missing file succeeded")
	}
}
