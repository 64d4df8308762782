//go:build !linux

package ckpt

import (
	"errors"
	"os"
)

// setDirect reports that direct I/O is not used here: shard files are
// written through the page cache.
func setDirect(f *os.File, on bool) error {
	if on {
		return errors.ErrUnsupported
	}
	return nil
}
