//go:build unix

package preprocess

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// TestRemoveStaleTemps: only the temporary files of a gone process on this
// host (or of a run before hosts were named) beside the output prefix are
// removed; a live process's, another host's and other files stay.
func TestRemoveStaleTemps(t *testing.T) {
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Skipf("no true(1): %v", err)
	}
	dead, live, host := gone.ProcessState.Pid(), os.Getppid(), thisHost()
	dir := t.TempDir()
	prefix := filepath.Join(dir, "out")
	names := map[string]bool{ // name → removed
		fmt.Sprintf("out_text_document.tmp-%s-%d.bin.tmp", host, dead):   true,
		fmt.Sprintf("out_1_text_document.tmp-%s-%d.idx", host, dead):     true,
		fmt.Sprintf("out_text_document.tmp-%d.bin.tmp", dead):            true, // an earlier gotron's name
		fmt.Sprintf("out_text_document.tmp-%s-%d.bin.tmp", host, live):   false,
		fmt.Sprintf("out_text_document.tmp-other-host-%d.bin.tmp", dead): false,
		fmt.Sprintf("other_text_document.tmp-%s-%d.bin.tmp", host, dead): false,
		"out_text_document.bin": false,
	}
	for n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := removeStaleTemps(prefix)
	if err != nil {
		t.Fatal(err)
	}
	for n, want := range names {
		_, statErr := os.Stat(filepath.Join(dir, n))
		if gotRemoved := os.IsNotExist(statErr); gotRemoved != want {
			t.Errorf("%s: removed %v, want %v", n, gotRemoved, want)
		}
		if slices.Contains(removed, filepath.Join(dir, n)) != want {
			t.Errorf("%s: reported %v, want %v", n, !want, want)
		}
	}
}
