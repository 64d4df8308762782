//go:build linux

package ckpt

import "golang.org/x/sys/unix"

// exchangeDirs atomically swaps two existing paths (renameat2
// RENAME_EXCHANGE). It fails on filesystems without support.
func exchangeDirs(a, b string) error {
	return unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
}
