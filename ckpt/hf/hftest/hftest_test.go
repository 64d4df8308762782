package hftest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestFixturesAreTestdata: Fixtures lists every checkpoint folder in
// ckpt/hf/testdata once, and none that is not there (a checkpoint written
// but not listed would go untested by every test that ranges over the
// list); each tolerance is its weights' dtype's, and each reference reads.
func TestFixturesAreTestdata(t *testing.T) {
	ents, err := os.ReadDir(filepath.Join("..", "testdata"))
	if err != nil {
		t.Fatal(err)
	}
	var dirs, listed []string
	for _, e := range ents {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	for _, fx := range Fixtures() {
		listed = append(listed, fx.Name)
		want := 1e-4
		if !strings.Contains(fx.Name, "_f32") {
			want = 2e-2
		}
		if fx.Tol != want {
			t.Errorf("%s: tolerance %g, want %g for its weights' dtype", fx.Name, fx.Tol, want)
		}
		Golden(t, filepath.Join("..", "testdata", fx.Name))
	}
	slices.Sort(listed)
	if !slices.Equal(dirs, listed) || len(slices.Compact(slices.Clone(listed))) != len(listed) {
		t.Errorf("Fixtures lists %q; ckpt/hf/testdata holds %q", listed, dirs)
	}
}
