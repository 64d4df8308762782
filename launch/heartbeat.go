package launch

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Heartbeats between a worker process and the launcher. Run gives every
// worker the write end of a pipe as file descriptor 3 and says so in
// HeartbeatFDEnv; a worker that uses it (every gotron subcommand does, see
// StartReporter) writes "alive" every HeartbeatIntervalEnv from a goroutine
// of its own, and, when it fails because of another rank, "blame N" before
// it exits. The launcher declares a worker that has sent heartbeats dead
// when it falls silent for Config.HeartbeatTimeout (a SIGSTOP, a frozen
// machine), SIGKILLs it at once and stops the others; and it uses the blame
// reports to tell the root cause from the failures it caused. A worker that
// never writes (any program under --no-python) is only watched for its exit.
const (
	HeartbeatFDEnv       = "GOTRON_HEARTBEAT_FD"
	HeartbeatIntervalEnv = "GOTRON_HEARTBEAT_INTERVAL"
	// HeartbeatTimeoutEnv carries the launcher's --heartbeat-timeout to the
	// workers, as the default of their own (gotron train's, for the
	// rendezvous-store heartbeats of comm/tcp).
	HeartbeatTimeoutEnv = "GOTRON_HEARTBEAT_TIMEOUT"
)

// DefaultHeartbeatTimeout is how long a worker may be silent before the
// launcher declares it dead.
const DefaultHeartbeatTimeout = 20 * time.Second

// heartbeatInterval is the workers' heartbeat period for a timeout.
func heartbeatInterval(timeout time.Duration) time.Duration {
	return max(min(timeout/8, 5*time.Second), time.Millisecond)
}

// Reporter is a worker's side of the heartbeat pipe.
type Reporter struct {
	mu   sync.Mutex // serialises writes to f
	f    *os.File
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// StartReporter starts heartbeats to the launcher when getenv names a pipe
// (HeartbeatFDEnv); it returns nil, nil when it does not. Close stops them.
func StartReporter(getenv func(string) string) (*Reporter, error) {
	v := getenv(HeartbeatFDEnv)
	if v == "" {
		return nil, nil
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("launch: %s=%q: want a file descriptor number of 3 or more", HeartbeatFDEnv, v)
	}
	interval, err := time.ParseDuration(getenv(HeartbeatIntervalEnv))
	if err != nil || interval <= 0 {
		return nil, fmt.Errorf("launch: %s=%q: want a positive duration", HeartbeatIntervalEnv, getenv(HeartbeatIntervalEnv))
	}
	closeOnExec(fd) // the worker's own children are not the worker
	r := &Reporter{f: os.NewFile(uintptr(fd), "heartbeat"), stop: make(chan struct{}), done: make(chan struct{})}
	go r.beat(interval)
	return r, nil
}

func (r *Reporter) beat(interval time.Duration) {
	defer close(r.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if r.write("alive") != nil {
			return // the launcher is gone
		}
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
	}
}

func (r *Reporter) write(line string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err := io.WriteString(r.f, line+"\n")
	return err
}

// Blame tells the launcher that this worker fails because world rank rank
// failed (it died, hung or disagreed), so that the launcher does not take
// this worker's exit for the root cause.
func (r *Reporter) Blame(rank int) {
	if r != nil {
		r.write("blame " + strconv.Itoa(rank))
	}
}

// Close stops the heartbeats and closes the pipe.
func (r *Reporter) Close() {
	if r == nil {
		return
	}
	r.once.Do(func() {
		close(r.stop)
		<-r.done
		r.f.Close()
	})
}

// watcher is the launcher's side of one worker's heartbeat pipe.
type watcher struct {
	last    atomic.Int64 // unix nanoseconds of the last heartbeat; 0: none yet
	blamed  atomic.Int64 // world rank the worker blamed + 1; 0: none
	drained chan struct{}
}

// watch reads heartbeats and blame reports from r until EOF.
func watch(r io.ReadCloser) *watcher {
	w := &watcher{drained: make(chan struct{})}
	go func() {
		defer close(w.drained)
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "alive":
				w.last.Store(time.Now().UnixNano())
			case strings.HasPrefix(line, "blame "):
				if n, err := strconv.Atoi(strings.TrimPrefix(line, "blame ")); err == nil && n >= 0 {
					w.blamed.Store(int64(n) + 1)
				}
			}
		}
	}()
	return w
}

// silentFor is how long the worker has not sent a heartbeat; 0 if it never
// sent one (it is not watched).
func (w *watcher) silentFor(now time.Time) time.Duration {
	last := w.last.Load()
	if last == 0 {
		return 0
	}
	return now.Sub(time.Unix(0, last))
}

// blame returns the rank the worker blamed, or -1.
func (w *watcher) blame() int { return int(w.blamed.Load()) - 1 }
