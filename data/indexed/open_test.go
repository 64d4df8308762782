package indexed

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpenReportsWhatItFound: a truncated .bin reports its real size (it
// used to say 0: the map was closed before the message was built), and a
// directory where a file belongs is named as such (it used to say "mmap:
// no such device").
func TestOpenReportsWhatItFound(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "toy")
	build(t, prefix, BuilderConfig{DType: UInt16}, specDocs())
	must(t, os.Truncate(prefix+".bin", 99))
	_, err := Open(prefix)
	var fe *FormatError
	if !errors.As(err, &fe) || fe.Offset != 99 || !strings.Contains(err.Error(), "got 99") {
		t.Errorf("truncated .bin: err = %v", err)
	}

	for _, ext := range []string{".bin", ".idx"} {
		dir := t.TempDir()
		p := filepath.Join(dir, "d")
		build(t, p, BuilderConfig{DType: UInt16}, specDocs())
		must(t, os.Remove(p+ext))
		must(t, os.Mkdir(p+ext, 0o755))
		_, err := Open(p)
		if err == nil || !strings.Contains(err.Error(), p+ext+" is a directory, not a file") {
			t.Errorf("directory %s: err = %v", ext, err)
		}
	}
}
