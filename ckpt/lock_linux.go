//go:build linux

package ckpt

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// processState reports whether pid is a running process (a zombie, dead
// but not yet reaped, is not) and its start time in clock ticks since boot
// (/proc/PID/stat field 22), "" if unknown.
func processState(pid int) (alive bool, start string) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		// No /proc entry: gone, unless /proc is not mounted.
		return killable(pid), ""
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses,
	// so the fields are counted from the last ')'.
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return killable(pid), ""
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return killable(pid), ""
	}
	// f[0] is field 3 (state), so field 22 is f[19].
	return f[0] != "Z" && f[0] != "X", f[19]
}

func killable(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func bootID() string {
	raw, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(raw))
}
