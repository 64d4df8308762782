package cuda

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLibrarySearchErrorNamesEverything(t *testing.T) {
	empty := t.TempDir()
	other := t.TempDir()
	s := libSearch{what: "the NVIDIA driver library", names: []string{"libcuda.so.1"}, dirs: []string{empty, other}}
	_, _, err := s.open()
	if err == nil {
		t.Fatal("found a library in empty directories")
	}
	for _, want := range []string{"libcuda.so.1", "the NVIDIA driver library", empty, other} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	// A file that exists but is not a library is reported with the loader's reason.
	bad := filepath.Join(other, "libcuda.so.1")
	if err := os.WriteFile(bad, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = s.open()
	if err == nil || !strings.Contains(err.Error(), "found but failed to load: "+bad) {
		t.Errorf("error %v does not report the unloadable %s", err, bad)
	}
}

func TestDefaultSearchPaths(t *testing.T) {
	t.Setenv("CUDA_HOME", "/opt/mycuda")
	t.Setenv("LD_LIBRARY_PATH", "/opt/a:/opt/b")
	d := driverSearch()
	joined := strings.Join(d.dirs, " ")
	for _, want := range []string{"/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/opt/mycuda/lib64", "/opt/a", "/opt/b"} {
		if !strings.Contains(joined, want) {
			t.Errorf("driver search %q lacks %s", joined, want)
		}
	}
	b := cublasSearch()
	joined = strings.Join(b.dirs, " ")
	for _, want := range []string{"/opt/mycuda/lib64", "/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu", "/opt/a"} {
		if !strings.Contains(joined, want) {
			t.Errorf("cuBLAS search %q lacks %s", joined, want)
		}
	}
	if b.names[0] != "libcublas.so.13" {
		t.Errorf("cuBLAS names %v: want the newest first", b.names)
	}
}

func TestMarshalArgs(t *testing.T) {
	vals := make([]uint64, 8)
	err := marshalArgs(vals, []any{Ptr(0x1000), uintptr(0x2000), int32(-1), uint32(7), int64(-2), uint64(9), float32(1.5), float64(-0.5)})
	if err != nil {
		t.Fatal(err)
	}
	want := []uint64{0x1000, 0x2000, 0xffffffff, 7, 0xfffffffffffffffe, 9, 0x3fc00000, 0xbfe0000000000000}
	for i := range want {
		if vals[i] != want[i] {
			t.Errorf("arg %d: %#x, want %#x", i, vals[i], want[i])
		}
	}
	for _, bad := range []any{int(3), complex64(1), "x", []float32{1}, nil, true, int16(2)} {
		err := marshalArgs(vals, []any{Ptr(1), bad})
		if err == nil || !strings.Contains(err.Error(), "argument 1") {
			t.Errorf("argument %T(%v): err %v, want a rejection naming argument 1", bad, bad, err)
		}
	}
	if err := marshalArgs(vals, make([]any, 9)); err == nil {
		t.Errorf("too many arguments accepted")
	}
}

func TestGemmParamsCheck(t *testing.T) {
	ok := GemmParams{M: 4, N: 3, K: 2, A: 1, B: 1, C: 1, LDA: 4, LDB: 2, LDC: 4}
	if err := ok.check(); err != nil {
		t.Fatal(err)
	}
	tr := ok
	tr.TransA, tr.LDA = true, 2
	if err := tr.check(); err != nil {
		t.Errorf("transposed A with LDA=K: %v", err)
	}
	bad := ok
	bad.LDA = 3
	if err := bad.check(); err == nil || !strings.Contains(err.Error(), "LDA 3") {
		t.Errorf("LDA < M accepted: %v", err)
	}
	bad = ok
	bad.K = 0
	if err := bad.check(); err == nil {
		t.Errorf("K = 0 accepted")
	}
}

func TestErrorString(t *testing.T) {
	e := &Error{Op: "cuMemAlloc_v2", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY"}
	if got := e.Error(); got != "cuda: cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2)" {
		t.Errorf("Error() = %q", got)
	}
}
