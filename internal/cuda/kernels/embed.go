// Package kernels holds gotron's CUDA kernels: one CUDA C file per family
// (<family>.cu, extern "C" __global__ kernels named <family>_<what>_<dtype>),
// compiled ahead of time to PTX for sm_80 and sm_90 (see gen.go) and
// embedded here, so that a CGO_ENABLED=0 gotron binary carries them and the
// CUDA driver JIT-compiles them for the GPU it finds. Package tensor loads
// every family's module when it opens a GPU (tensor.OpenCUDA) and finds a
// kernel by name in any of them.
//
// Adding a family: write <family>.cu here (kernel names prefixed
// <family>_, unique across families; include only CUDA's own headers, the
// files compile one by one), run go generate ./internal/cuda/kernels, and
// commit the .cu with both ptx/sm_80/<family>.ptx and ptx/sm_90/<family>.ptx.
// The tests check that every family has both, that its kernels are
// prefixed, that the PTX is what nvcc makes of the .cu now, and that no
// kernel spills registers (where nvcc and ptxas are installed). Helpers
// that must match Go bit for bit (dtype conversions, the Philox stream)
// are __host__ __device__ and are compared with the Go code on the host
// (hostcheck_test.go).
package kernels

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
)

//go:embed ptx
var ptxFS embed.FS

// archFor returns the PTX folder for a GPU of compute capability
// major.minor: sm_90 for Hopper and newer, sm_80 for Ampere/Ada.
func archFor(major, minor int) (string, error) {
	switch {
	case major >= 9:
		return "sm_90", nil
	case major == 8:
		return "sm_80", nil
	}
	return "", fmt.Errorf("compute capability %d.%d is older than the sm_80 PTX gotron ships (it needs an Ampere or newer GPU)", major, minor)
}

// PTX returns every kernel family's PTX (family name → PTX text) for a
// GPU of compute capability major.minor.
func PTX(major, minor int) (map[string][]byte, error) {
	arch, err := archFor(major, minor)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, fam := range Families() {
		b, err := ptxFS.ReadFile(path.Join("ptx", arch, fam+".ptx"))
		if err != nil {
			return nil, fmt.Errorf("kernels: the %s PTX of family %s is missing (run go generate ./internal/cuda/kernels): %w", arch, fam, err)
		}
		out[fam] = b
	}
	return out, nil
}

// Families returns the kernel families' names, sorted: the .ptx files
// embedded for sm_90 (gen writes every family for every architecture).
func Families() []string {
	ents, err := fs.ReadDir(ptxFS, "ptx/sm_90")
	if err != nil {
		return nil
	}
	var fams []string
	for _, e := range ents {
		if name, ok := strings.CutSuffix(e.Name(), ".ptx"); ok && !e.IsDir() {
			fams = append(fams, name)
		}
	}
	sort.Strings(fams)
	return fams
}
