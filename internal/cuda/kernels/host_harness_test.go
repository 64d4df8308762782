package kernels_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// hostHarness is a program in testdata that #includes a kernel source and
// runs its kernels (or their scalar helpers) on the host, so that tests
// compare them with the Go code without a GPU. It is built once per test
// binary, into a folder TestMain removes.
type hostHarness struct {
	compiler string   // "g++" or "nvcc"; without it on PATH the tests skip
	src      string   // the harness, under testdata
	includes []string // the files src #includes: kernel sources, testdata/host_harness.h
	flags    []string // before -o
	purpose  string   // what building it is for, for the skip message

	once      sync.Once
	dir, path string
	err       error
}

// The harnesses the tests run. The g++ ones build without fused
// multiply-adds where the kernels' results are compared bit for bit.
var (
	hostcheck = &hostHarness{compiler: "nvcc", src: "hostcheck.cu", includes: []string{"elem.cu", "dropout.cu", "gdn.cu", "dsa.cu"},
		flags: []string{"-std=c++14", "-O2"}, purpose: "check the kernels' conversions and Philox stream"}
	attntcHost = &hostHarness{compiler: "g++", src: "attntc_host.cc", includes: []string{"attntc.cu", "testdata/host_harness.h"},
		flags: []string{"-std=c++17", "-O2", "-pthread", "-fno-strict-aliasing"}, purpose: "run attntc.cu's kernels on the host"}
	fusedHost = &hostHarness{compiler: "g++", src: "fused_host.cc", includes: []string{"fused.cu", "testdata/host_harness.h"},
		flags: []string{"-std=c++17", "-O2", "-pthread", "-ffp-contract=off"}, purpose: "run fused.cu's kernel on the host"}
	moeHost = &hostHarness{compiler: "g++", src: "moe_host.cc", includes: []string{"moe.cu", "testdata/host_harness.h"},
		flags: []string{"-std=c++17", "-O2", "-ffp-contract=off"}, purpose: "run moe.cu's kernels on the host"}
	fp8Host = &hostHarness{compiler: "g++", src: "fp8_host.cc", includes: []string{"fp8.cu"},
		flags: []string{"-std=c++17", "-O2", "-ffp-contract=off"}, purpose: "run fp8.cu's cast and scale functions on the host"}

	hostHarnesses = []*hostHarness{hostcheck, attntcHost, fusedHost, moeHost, fp8Host}
)

// name is the harness's program name: its source's without the extension.
func (h *hostHarness) name() string {
	return strings.TrimSuffix(h.src, filepath.Ext(h.src))
}

// bin builds the harness (once) and returns the program's path. It skips
// the test when the compiler is not on PATH.
func (h *hostHarness) bin(t *testing.T) string {
	t.Helper()
	cxx, err := exec.LookPath(h.compiler)
	if err != nil {
		t.Skipf("%s not on PATH: cannot build testdata/%s to %s", h.compiler, h.src, h.purpose)
	}
	// The compiler reads the sources, not the test binary: read them here
	// too, so that go test's cache notices when they change.
	for _, src := range append([]string{filepath.Join("testdata", h.src)}, h.includes...) {
		if _, err := os.ReadFile(src); err != nil {
			t.Fatal(err)
		}
	}
	h.once.Do(func() {
		dir, err := os.MkdirTemp("", "gotron-"+strings.ReplaceAll(h.name(), "_", "-")+"-")
		if err != nil {
			h.err = err
			return
		}
		h.dir = dir
		out := filepath.Join(dir, h.name())
		args := append(append([]string(nil), h.flags...), "-o", out, filepath.Join("testdata", h.src))
		msg, err := exec.Command(cxx, args...).CombinedOutput()
		if err != nil {
			h.err = fmt.Errorf("%s testdata/%s: %v\n%s", h.compiler, h.src, err, msg)
			return
		}
		h.path = out
	})
	if h.err != nil {
		t.Fatal(h.err)
	}
	return h.path
}

// run builds the harness if need be and runs it (runHostBin).
func (h *hostHarness) run(t *testing.T, stdin []byte, args ...any) []byte {
	t.Helper()
	return runHostBin(t, h.bin(t), stdin, args...)
}

// runHostBin runs the harness program bin with args (each printed with
// fmt.Sprint) and stdin, returning its standard output; it fails the
// test, with the harness's standard error, when the harness fails.
func runHostBin(t *testing.T, bin string, stdin []byte, args ...any) []byte {
	t.Helper()
	sargs := make([]string, len(args))
	for i, a := range args {
		sargs[i] = fmt.Sprint(a)
	}
	cmd := exec.Command(bin, sargs...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", filepath.Base(bin), sargs, err, stderr.Bytes())
	}
	return out
}

// TestMain removes the harnesses' build folders after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	for _, h := range hostHarnesses {
		if h.dir != "" {
			os.RemoveAll(h.dir)
		}
	}
	os.Exit(code)
}

// b2i is a harness argument for a flag: 1 or 0.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sameBitsF32 fails the test at the first value whose bits differ.
func sameBitsF32(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %v, the CPU's %v", what, i, got[i], want[i])
		}
	}
}

// leBytes is x in little-endian bytes, as the harnesses read their inputs.
func leBytes[T int32 | float32 | float64](x []T) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, x)
	return b.Bytes()
}

// fromLE is b, little-endian values a harness wrote, as a slice (whole
// values: a trailing part of one is left out).
func fromLE[T int32 | float32 | float64](b []byte) []T {
	var zero T
	x := make([]T, len(b)/binary.Size(zero))
	binary.Read(bytes.NewReader(b), binary.LittleEndian, x)
	return x
}
