package tensor

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// cpuKernels is the import path of the CPU kernels, which only the CPU
// backend may call: everything else reaches arithmetic through Backend, so
// that a device backend receives device buffers.
const cpuKernels = "github.com/gotron/gotron/internal/cpu"

// pendingCPUImports lists the files outside the allowed places that still
// import internal/cpu: being converted; must be empty. A file leaves the
// list when it stops importing it (the test fails until it does), so the
// list can only shrink.
var pendingCPUImports = []string{}

// cpuImportAllowed reports whether the file at rel (slash-separated, from
// the repository root) may import internal/cpu: package tensor itself (its
// CPU backend), internal/..., and cmd/gotron's kernel benchmarks.
func cpuImportAllowed(rel string) bool {
	dir, file := path.Split(rel)
	switch {
	case dir == "tensor/":
		return true
	case strings.HasPrefix(rel, "internal/"):
		return true
	case dir == "cmd/gotron/" && strings.HasPrefix(file, "bench_"):
		return true
	}
	return false
}

// TestCPUKernelImportBoundary walks the repository's Go files (imports
// only) and fails naming each file outside the allowed places that imports
// internal/cpu, except those pending conversion, and each pending file that
// no longer does.
func TestCPUKernelImportBoundary(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var importers []string
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			// The go tool ignores these directories too.
			if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if s, err := strconv.Unquote(imp.Path.Value); err == nil && s == cpuKernels {
				rel, err := filepath.Rel(root, p)
				if err != nil {
					return err
				}
				importers = append(importers, filepath.ToSlash(rel))
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", root, err)
	}
	if !slices.Contains(importers, "tensor/cpu_backend.go") {
		t.Fatalf("the walk found no import of %s in tensor/cpu_backend.go: it is not seeing the repository (found %v)", cpuKernels, importers)
	}
	for _, rel := range importers {
		if !cpuImportAllowed(rel) && !slices.Contains(pendingCPUImports, rel) {
			t.Errorf("%s imports %s: outside package tensor, internal/ and cmd/gotron/bench_*.go, reach kernels through tensor.Backend", rel, cpuKernels)
		}
	}
	for _, rel := range pendingCPUImports {
		if !slices.Contains(importers, rel) {
			t.Errorf("%s no longer imports %s: remove it from pendingCPUImports", rel, cpuKernels)
		}
	}
}
