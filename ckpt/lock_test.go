package ckpt

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// writeLock writes a lock file as another job would have.
func writeLock(t *testing.T, dir string, o LockOwner) {
	t.Helper()
	raw, _ := json.Marshal(o)
	if err := os.WriteFile(filepath.Join(dir, LockFile), raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLockDirOwners takes a directory's lock over locks left by owners in
// every state: a live process (a real child, sleep), a pid that no longer
// runs, a live pid whose start time is not the lock's (reused), another
// host, another boot, a file that is not a lock.
func TestLockDirOwners(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("process start times are read from /proc")
	}
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Skip("no sleep command:", err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Skip("no true command:", err)
	}
	me, err := thisProcess("test")
	if err != nil {
		t.Fatal(err)
	}
	_, sleepStart := processState(sleep.Process.Pid)
	if sleepStart == "" {
		t.Fatal("no start time for a running child")
	}
	live := LockOwner{Host: me.Host, PID: sleep.Process.Pid, ProcStart: sleepStart, BootID: me.BootID, Started: "2026-01-01T00:00:00Z", Command: "gotron train --save x"}
	tests := []struct {
		name  string
		owner *LockOwner // nil: raw below
		raw   string
		want  string // refusal text; "" means taken over
	}{
		{"live", &live, "", fmt.Sprintf("host %s, pid %d, started 2026-01-01T00:00:00Z: gotron train --save x", me.Host, live.PID)},
		{"dead pid", &LockOwner{Host: me.Host, PID: dead.Process.Pid, ProcStart: "1", BootID: me.BootID, Started: "x"}, "", ""},
		{"reused pid", &LockOwner{Host: me.Host, PID: live.PID, ProcStart: "1", BootID: me.BootID, Started: "x"}, "", ""},
		{"rebooted", &LockOwner{Host: me.Host, PID: live.PID, ProcStart: sleepStart, BootID: "another-boot", Started: "x"}, "", ""},
		{"other host", &LockOwner{Host: me.Host + "-elsewhere", PID: live.PID, ProcStart: sleepStart, Started: "x"}, "", "another host"},
		{"not a lock", nil, "hello", "not a gotron lock"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.owner != nil {
				writeLock(t, dir, *tt.owner)
			} else {
				os.WriteFile(filepath.Join(dir, LockFile), []byte(tt.raw), 0o644)
			}
			var warned []string
			l, err := LockDir(dir, "me", func(f string, a ...any) { warned = append(warned, fmt.Sprintf(f, a...)) })
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("err %v, want one with %q", err, tt.want)
				}
				if tt.owner != nil && tt.owner.Host == me.Host && !errors.Is(err, ErrLocked) {
					t.Errorf("err %v is not ErrLocked", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(warned) != 1 || !strings.Contains(warned[0], "taking over") {
				t.Errorf("warnings %q, want one about taking over", warned)
			}
			raw, _ := os.ReadFile(filepath.Join(dir, LockFile))
			var got LockOwner
			if err := json.Unmarshal(raw, &got); err != nil || got.PID != os.Getpid() || got.Command != "me" {
				t.Errorf("lock now %s (%v)", raw, err)
			}
			if err := l.Release(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(dir, LockFile)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("lock left after Release: %v", err)
			}
			matches, _ := filepath.Glob(filepath.Join(dir, LockFile+"*"))
			if len(matches) != 0 {
				t.Errorf("files left: %v", matches)
			}
		})
	}
}

// TestLockReleaseKeepsOthersLock: Release removes the lock only while it
// is still this job's.
func TestLockReleaseKeepsOthersLock(t *testing.T) {
	dir := t.TempDir()
	l, err := LockDir(dir, "a", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	writeLock(t, dir, LockOwner{Host: "elsewhere", PID: 1, Started: "x"})
	if err := l.Release(); err == nil || !strings.Contains(err.Error(), "another job") {
		t.Fatalf("release of a replaced lock: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, LockFile)); err != nil {
		t.Fatalf("the other job's lock was removed: %v", err)
	}
}
