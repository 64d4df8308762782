package ckpt

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Environment of the re-executed test binary acting as the saving child.
const (
	envChildDir   = "GOTRON_CKPT_CRASH_DIR"   // save directory
	envChildStop  = "GOTRON_CKPT_CRASH_STOP"  // "substring:n": park at the n-th event containing substring; "" runs free
	envChildBytes = "GOTRON_CKPT_CRASH_BYTES" // size of the large model tensor
	childKeep     = 3                         // the child prunes to this many iterations
	childMaxIters = 500                       // bound in case the parent vanished
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(envChildDir); dir != "" {
		if err := crashChild(dir); err != nil {
			fmt.Println("error:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// crashChild saves checkpoints in a loop, continuing after the latest one,
// printing "saved N" after each save and prune. With a stop condition it
// prints "stop <event>" at that event and parks (reading stdin, which the
// parent keeps open) until it is killed.
func crashChild(dir string) error {
	size, err := strconv.Atoi(os.Getenv(envChildBytes))
	if err != nil {
		return err
	}
	stopSub, stopN := "", -1
	if s := os.Getenv(envChildStop); s != "" {
		i := strings.LastIndexByte(s, ':')
		stopSub = s[:i]
		if stopN, err = strconv.Atoi(s[i+1:]); err != nil {
			return err
		}
	}
	seen := 0
	sv := saver{chunkBytes: 64 << 10, event: func(ev string) {
		if stopN < 0 || !strings.Contains(ev, stopSub) {
			return
		}
		if seen++; seen == stopN {
			fmt.Printf("stop %s\n", ev)
			io.Copy(io.Discard, os.Stdin) // park until SIGKILL
			os.Exit(3)                    // the parent closed stdin without killing
		}
	}}
	it := 1
	if last, err := Latest(dir); err == nil {
		it = last + 1
	} else if !errors.Is(err, ErrNoCheckpoint) {
		return err
	}
	for end := it + childMaxIters; it < end; it++ {
		if err := sv.save(context.Background(), dir, it, sample(it, size)); err != nil {
			return err
		}
		if err := sv.prune(dir, childKeep); err != nil {
			return err
		}
		fmt.Printf("saved %d\n", it)
	}
	return nil
}

// TestKillDuringSave re-executes the test binary as a child that saves
// multi-megabyte checkpoints in a loop, SIGKILLs it at seeded moments, and
// after each kill checks that the latest checkpoint loads completely with
// the right contents and that every iteration directory present (at least
// the last childKeep) loads intact too. Moments are of two kinds: the child
// parks at the n-th save event (every chunk write, fsync, rename, tracker
// and prune step), or it runs free and is killed right after reporting k saves.
func TestKillDuringSave(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const size = 3 << 20 // two 3 MiB F32 tensors per checkpoint, ~6 MiB
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(2026, 11))
	stops := []string{
		"rename:1", // the very first save, before anything exists
		"free:2",
		"rename:1", "tracker :1", "tracker renamed:1", "fsync iter_:3", "write iter_:1",
		"prune rename:1", "prune remove:1",
	}
	for range 6 {
		stops = append(stops, fmt.Sprintf(":%d", 1+r.IntN(150))) // any event
	}
	for range 3 {
		stops = append(stops, fmt.Sprintf("free:%d", 1+r.IntN(3)))
	}
	lastSaved := 0
	for round, stop := range stops {
		cmd := exec.Command(exe, "-test.run=^$")
		env := append(os.Environ(), envChildDir+"="+dir, envChildBytes+"="+strconv.Itoa(size))
		if !strings.HasPrefix(stop, "free:") {
			env = append(env, envChildStop+"="+stop)
		}
		cmd.Env = env
		stdin, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		want := -1 // free run: kill after this many saves
		if n, ok := strings.CutPrefix(stop, "free:"); ok {
			want, _ = strconv.Atoi(n)
		}
		sc := bufio.NewScanner(out)
		event, saves := "", 0
		for sc.Scan() {
			line := sc.Text()
			if n, ok := strings.CutPrefix(line, "saved "); ok {
				lastSaved, _ = strconv.Atoi(n)
				if saves++; saves == want {
					break
				}
				continue
			}
			if ev, ok := strings.CutPrefix(line, "stop "); ok {
				event = ev
				break
			}
			t.Fatalf("round %d: child said %q", round, line)
		}
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		stdin.Close()
		if event == "" && saves != want {
			t.Fatalf("round %d (%s): child ended before the kill point", round, stop)
		}
		t.Logf("round %d: killed at %q (stop %s), last reported save %d", round, event, stop, lastSaved)
		lastSaved = checkAfterCrash(t, dir, lastSaved, size)
	}
}

// checkAfterCrash verifies the save directory after a kill and returns the
// latest iteration.
func checkAfterCrash(t *testing.T, dir string, lastSaved, size int) int {
	t.Helper()
	latest, err := Latest(dir)
	if errors.Is(err, ErrNoCheckpoint) && lastSaved == 0 {
		latest = 0 // killed during the first save: nothing is current yet
	} else if err != nil {
		t.Fatalf("Latest after kill: %v", err)
	}
	// The child may have been killed after the tracker moved but before it
	// printed "saved".
	if latest != lastSaved && latest != lastSaved+1 {
		t.Fatalf("Latest = %d after the child reported %d", latest, lastSaved)
	}
	if latest > 0 {
		c, err := Load(dir, -1)
		if err != nil {
			t.Fatalf("Load latest (%d) after kill: %v", latest, err)
		}
		want := sample(latest, size)
		want.Meta.Iteration = latest
		if err := sameCheckpoint(c, want); err != nil {
			t.Fatalf("latest checkpoint %d: %v", latest, err)
		}
		c.Close()
	}
	its, err := List(dir)
	if err != nil {
		t.Fatal(err)
	}
	for it := max(1, latest-childKeep+1); it <= latest; it++ {
		if !containsInt(its, it) {
			t.Fatalf("iteration %d missing after kill (have %v, latest %d)", it, its, latest)
		}
	}
	for _, it := range its {
		if it > latest+1 {
			t.Fatalf("iteration %d present beyond latest %d", it, latest)
		}
		c, err := Load(dir, it)
		if err != nil {
			t.Fatalf("iteration %d (latest %d) does not load: %v", it, latest, err)
		}
		want := sample(it, size)
		want.Meta.Iteration = it
		if err := sameCheckpoint(c, want); err != nil {
			t.Fatalf("iteration %d: %v", it, err)
		}
		c.Close()
	}
	return latest
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
