//go:build unix

package safetensors

import (
	"os"

	"golang.org/x/sys/unix"
)

// mapFile maps path read-only. It returns a nil buffer (and no error) for an
// empty file, which cannot be mapped; the caller then reads it instead.
func mapFile(path string) ([]byte, func() error, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer fd.Close() // the mapping outlives the descriptor
	st, err := fd.Stat()
	if err != nil {
		return nil, nil, err
	}
	size := st.Size()
	if size == 0 || !st.Mode().IsRegular() {
		return nil, nil, nil
	}
	if int64(int(size)) != size {
		return nil, nil, unix.EFBIG
	}
	buf, err := unix.Mmap(int(fd.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, nil // e.g. a filesystem without mmap: read instead
	}
	return buf, func() error { return unix.Munmap(buf) }, nil
}
