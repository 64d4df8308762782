package ckpt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// LockFile is the file in a --save directory that names the job writing
// checkpoints there: one job per checkpoint directory. Two jobs saving into
// one directory replace each other's iterations and move the tracker
// backwards, or fail at their first save on each other's temporary files.
const LockFile = "gotron.lock"

// LockOwner is what the lock file records of the job holding it.
type LockOwner struct {
	Host string `json:"host"`
	PID  int    `json:"pid"`
	// ProcStart is the process's start time as the kernel counts it
	// (/proc/PID/stat field 22, clock ticks since boot) and BootID the
	// boot it belongs to (/proc/sys/kernel/random/boot_id): together with
	// the pid they tell a live owner from a reused pid. Empty where the
	// system does not give them.
	ProcStart string `json:"proc_start,omitempty"`
	BootID    string `json:"boot_id,omitempty"`
	Started   string `json:"started"` // wall clock, RFC 3339, for people
	Command   string `json:"command,omitempty"`
}

func (o LockOwner) String() string {
	s := fmt.Sprintf("host %s, pid %d, started %s", o.Host, o.PID, o.Started)
	if o.Command != "" {
		s += ": " + o.Command
	}
	return s
}

// DirLock is a held lock on a checkpoint directory.
type DirLock struct {
	path  string
	owner []byte // the contents written, to release only our own lock
}

// ErrLocked is returned (wrapped) by LockDir when a live job holds the
// directory.
var ErrLocked = errors.New("checkpoint directory in use")

// LockDir takes dir's lock for this process, creating dir if need be. A
// lock whose owner is gone (same host, and the pid is not running, is a
// zombie, or is a newer process with the same pid, or the machine has
// rebooted since) is taken over with a warning through warnf; a lock held
// by a live job, or by a job on another host (whose liveness this host
// cannot see), is refused with an error naming it. command is recorded
// for the message another job would print.
func LockDir(dir, command string, warnf func(format string, args ...any)) (*DirLock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("ckpt: %w", err)
	}
	me, err := thisProcess(command)
	if err != nil {
		return nil, err
	}
	mine, err := json.Marshal(me)
	if err != nil {
		return nil, err
	}
	mine = append(mine, '\n')
	path := filepath.Join(dir, LockFile)
	for range 5 { // a takeover that races another job's starts again
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			_, werr := f.Write(mine)
			if serr := f.Sync(); werr == nil {
				werr = serr
			}
			if cerr := f.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil {
				os.Remove(path)
				return nil, fmt.Errorf("ckpt: %s: %w", path, werr)
			}
			return &DirLock{path: path, owner: mine}, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("ckpt: %w", err)
		}
		raw, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue // released meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("ckpt: %w", err)
		}
		var held LockOwner
		if err := json.Unmarshal(raw, &held); err != nil || held.PID <= 0 || held.Host == "" {
			// A lock being written this very moment reads empty; anything
			// else is not a lock gotron wrote.
			if len(bytes.TrimSpace(raw)) == 0 {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return nil, fmt.Errorf("ckpt: %s exists but is not a gotron lock (%q): remove it if no job uses %s", path, truncate(raw, 80), dir)
		}
		why, stale := staleness(held, me)
		if !stale {
			return nil, fmt.Errorf("ckpt: %s: %w by another job (%s)%s; wait for it to end or choose another --save directory",
				dir, ErrLocked, held, why)
		}
		if err := takeOver(path, raw); err != nil {
			if errors.Is(err, errRaced) {
				continue
			}
			return nil, err
		}
		warnf("WARNING: taking over the lock of %s from a job that is gone (%s; %s)", dir, held, why)
	}
	return nil, fmt.Errorf("ckpt: %s: could not take the lock (other jobs keep taking it)", path)
}

// Release removes the lock, if it is still this job's.
func (l *DirLock) Release() error {
	if l == nil || l.path == "" {
		return nil
	}
	path := l.path
	l.path = ""
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("ckpt: releasing %s: %w", path, err)
	}
	if !bytes.Equal(raw, l.owner) {
		return fmt.Errorf("ckpt: releasing %s: it now names another job (%s); left in place", path, strings.TrimSpace(string(raw)))
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("ckpt: %w", err)
	}
	return nil
}

var errRaced = errors.New("lock changed while taking it over")

// takeOver moves a stale lock (whose contents were stale) out of the way.
// Rename, unlike remove, lets it check what it moved: had another job
// replaced the stale lock with its own meanwhile, that one is put back and
// the caller starts again (and is refused by it).
func takeOver(path string, stale []byte) error {
	aside := fmt.Sprintf("%s.stale-%d-%d", path, os.Getpid(), time.Now().UnixNano())
	if err := os.Rename(path, aside); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errRaced
		}
		return fmt.Errorf("ckpt: taking over %s: %w", path, err)
	}
	moved, err := os.ReadFile(aside)
	if err == nil && !bytes.Equal(moved, stale) {
		os.Link(aside, path) // fails only if a third job holds it now: it wins
		os.Remove(aside)
		return errRaced
	}
	os.Remove(aside)
	return nil
}

// staleness tells whether a lock's owner is gone, and why (or why it is
// taken to be alive).
func staleness(held, me LockOwner) (string, bool) {
	if held.Host != me.Host {
		return fmt.Sprintf(": it runs on another host, whose processes this one cannot see; if it is gone, remove %s", LockFile), false
	}
	if held.BootID != "" && me.BootID != "" && held.BootID != me.BootID {
		return "the machine has rebooted since", true
	}
	if held.PID == me.PID && held.ProcStart == me.ProcStart {
		return "left by this process, by an earlier run that did not release it", true
	}
	switch alive, start := processState(held.PID); {
	case !alive:
		return fmt.Sprintf("pid %d is not running", held.PID), true
	case held.ProcStart != "" && start != "" && start != held.ProcStart:
		return fmt.Sprintf("pid %d is now another process (started at tick %s, the lock's at %s)", held.PID, start, held.ProcStart), true
	}
	return "", false
}

func thisProcess(command string) (LockOwner, error) {
	host, err := os.Hostname()
	if err != nil {
		return LockOwner{}, fmt.Errorf("ckpt: lock: %w", err)
	}
	_, start := processState(os.Getpid())
	return LockOwner{Host: host, PID: os.Getpid(), ProcStart: start, BootID: bootID(),
		Started: time.Now().UTC().Format(time.RFC3339), Command: command}, nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
