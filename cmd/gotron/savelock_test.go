package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gotron/gotron/ckpt"
)

// TestOneJobPerSaveDir runs real gotron train processes on one --save
// directory: a second job is refused, naming the first's host and pid,
// while the first runs; after the first is killed with SIGKILL (its lock
// left behind) the next job takes the lock over with a warning; a job
// stopped with SIGTERM releases its lock as it exits.
func TestOneJobPerSaveDir(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	if runtime.GOOS != "linux" {
		t.Skip("stale locks are recognised from /proc")
	}
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "ck")
	lock := filepath.Join(dir, ckpt.LockFile)
	trainArgs := func(iters string) []string {
		return []string{"train", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
			"--micro-batch-size", "1", "--global-batch-size", "1", "--lr", "1e-3", "--mock-data", "--vocab-size", "128",
			"--train-iters", iters, "--lr-decay-iters", "1000", "--save", dir, "--save-interval", "1000000", "--eval-iters", "0", "--log-interval", "1000", "--no-progress"}
	}
	// start starts a long job and returns once it holds the lock, with a
	// channel that yields its exit.
	start := func(extra ...string) (*exec.Cmd, *bytes.Buffer, chan error) {
		cmd := exec.Command(bin, append(trainArgs("100000000"), extra...)...)
		cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		deadline := time.After(60 * time.Second)
		for {
			raw, _ := os.ReadFile(lock)
			var o ckpt.LockOwner
			if json.Unmarshal(raw, &o) == nil && o.PID == cmd.Process.Pid {
				return cmd, &out, done
			}
			select {
			case err := <-done:
				t.Fatalf("the job exited (%v) without taking the lock:\n%s", err, out.String())
			case <-deadline:
				cmd.Process.Kill()
				<-done
				t.Fatalf("the job took no lock in 60 s:\n%s", out.String())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	run := func(iters string) (string, error) {
		cmd := exec.Command(bin, trainArgs(iters)...)
		cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	host, _ := os.Hostname()

	first, firstOut, firstDone := start()
	out, err := run("2")
	if err == nil || !strings.Contains(out, "in use by another job") || !strings.Contains(out, fmt.Sprintf("host %s, pid %d", host, first.Process.Pid)) {
		t.Errorf("second job while the first runs: %v\n%s", err, out)
	}
	select {
	case err := <-firstDone:
		t.Fatalf("the first job exited (%v):\n%s", err, firstOut)
	default:
	}
	first.Process.Signal(syscall.SIGKILL)
	<-firstDone
	if _, err := os.Stat(lock); err != nil {
		t.Fatalf("SIGKILL removed the lock? %v", err)
	}
	out, err = run("2")
	if err != nil || !strings.Contains(out, "taking over the lock") || !strings.Contains(out, fmt.Sprintf("pid %d is not running", first.Process.Pid)) {
		t.Errorf("job after the first was killed: %v\n%s", err, out)
	}
	if _, err := os.Stat(lock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a finished job left its lock: %v", err)
	}

	// The finished job saved iteration 2; the next resumes from it and is
	// stopped by SIGTERM, which saves and releases the lock.
	third, thirdOut, thirdDone := start("--load", dir, "--override-opt_param-scheduler")
	third.Process.Signal(syscall.SIGTERM)
	if err := <-thirdDone; err != nil {
		t.Errorf("SIGTERM: %v\n%s", err, thirdOut)
	}
	if _, err := os.Stat(lock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a job stopped by SIGTERM left its lock: %v\n%s", err, thirdOut)
	}
}
