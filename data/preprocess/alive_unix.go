//go:build unix

package preprocess

import (
	"errors"
	"syscall"
)

// processAlive reports whether process pid exists on this host (signal 0
// checks without sending; EPERM means it exists under another user).
func processAlive(pid int) bool {
	if pid <= 0 {
		return true // not a process id: never treat its files as stale
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
