package launch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/tcp"
)

func init() { extraWorkers["allreduce"] = allReduceWorker }

// allReduceWorker joins the job through comm/tcp with the Env the launcher
// gave it and all-reduces 4 MiB buffers (the ring path) until a peer is lost;
// it then reports the rank blamed and exits 1. Like a training worker that
// saves on SIGTERM, it does not die of the launcher's SIGTERM, which would
// race with its report.
func allReduceWorker(e Env) int {
	if e.Rank == 2 && os.Getenv("LAUNCH_TEST_CHILD") != "" {
		// A child that inherits stdout: the launcher hears of this
		// worker's death only when the child exits too (at the
		// launcher's SIGTERM, which it does not ignore).
		child := exec.Command("sleep", "60")
		child.Stdout = os.Stdout
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	signal.Ignore(syscall.SIGTERM)
	rep, err := StartReporter(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer rep.Close()
	ctx := context.Background()
	hb, _ := time.ParseDuration(os.Getenv(HeartbeatTimeoutEnv))
	g, err := tcp.Join(ctx, tcp.Config{Rank: e.Rank, WorldSize: e.WorldSize, MasterAddr: e.MasterAddr,
		MasterPort: e.MasterPort, Timeout: 60 * time.Second, HeartbeatTimeout: hb})
	if err != nil {
		fmt.Fprintln(os.Stderr, "join:", err)
		return 2
	}
	defer g.Close()
	fmt.Printf("pid %d\n", os.Getpid())
	buf := make([]float32, 1<<20)
	for it := 0; ; it++ {
		for i := range buf {
			buf[i] = float32(e.Rank)
		}
		if err := g.AllReduce(ctx, comm.Float32s(buf), comm.Sum); err != nil {
			var re *comm.RankError
			if errors.As(err, &re) && errors.Is(err, comm.ErrPeerLost) {
				rep.Blame(re.Rank)
				fmt.Printf("blamed rank %d: %v\n", re.Rank, err)
			} else {
				fmt.Printf("unexpected error: %v\n", err)
			}
			return 1
		}
		if want := float32(e.WorldSize * (e.WorldSize - 1) / 2); buf[0] != want || buf[len(buf)-1] != want {
			fmt.Printf("wrong sum %v, want %v\n", buf[0], want)
			return 3
		}
		if it == 2 {
			fmt.Println("iterating")
		}
	}
}

// lineWatcher records output and reports lines matching re on a channel.
type lineWatcher struct {
	mu    sync.Mutex
	buf   strings.Builder
	re    *regexp.Regexp
	lines chan []string
}

func (w *lineWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for _, l := range strings.Split(string(p), "\n") {
		if m := w.re.FindStringSubmatch(l); m != nil {
			w.lines <- m
		}
	}
	return len(p), nil
}

func (w *lineWatcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startAllReduce runs four allreduce workers under Run and returns, once
// they all iterate, their pids by rank, the output and Run's result.
func startAllReduce(t *testing.T, cfg Config) (pids map[int]int, out *lineWatcher, errb *strings.Builder, done chan error) {
	out = &lineWatcher{re: regexp.MustCompile(`^\[rank(\d)\]: (pid \d+|iterating)$`), lines: make(chan []string, 64)}
	cfg.MasterPort, cfg.Stdout = freePort(t), out
	errb = &strings.Builder{}
	cfg.Stderr = &lockedBuilder{b: errb}
	done = make(chan error, 1)
	go func() { done <- Run(context.Background(), cfg) }()
	pids = map[int]int{}
	for iterating := 0; iterating < cfg.NProcPerNode || len(pids) < cfg.NProcPerNode; {
		select {
		case m := <-out.lines:
			r, _ := strconv.Atoi(m[1])
			if m[2] == "iterating" {
				iterating++
			} else {
				pids[r], _ = strconv.Atoi(strings.TrimPrefix(m[2], "pid "))
			}
		case err := <-done:
			t.Fatalf("Run returned early: %v\nstdout:\n%s\nstderr:\n%s", err, out, errb.String())
		}
	}
	return pids, out, errb, done
}

type lockedBuilder struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// TestKillWorkerMidAllReduce: four workers all-reduce over comm/tcp; rank 2
// is killed with SIGKILL while they do. Every survivor's all-reduce fails with
// ErrPeerLost naming rank 2 (not ErrTimeout: the loss is seen at once, not
// after the 60 s timeout) and exits 1, and Run's error names rank 2 as the
// root cause and the others as failed after it. With child, rank 2 has a
// child process holding its stdout, so the launcher hears of rank 2's death
// only after the survivors' exits: a launcher that blames the first exit to
// arrive names a survivor (issue 31, finding 5).
func TestKillWorkerMidAllReduce(t *testing.T) {
	for _, child := range []bool{false, true} {
		t.Run(fmt.Sprintf("child=%v", child), func(t *testing.T) {
			cfg := testConfig("allreduce", 4)
			if child {
				cfg.Environ = append(cfg.Environ, "LAUNCH_TEST_CHILD=1")
			}
			pids, out, errb, done := startAllReduce(t, cfg)
			if err := syscall.Kill(pids[2], syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killedAt := time.Now()
			err := <-done
			if d := time.Since(killedAt); d > 5*time.Second {
				t.Errorf("the group took %v to stop after rank 2 died", d)
			}
			var we *WorkerError
			if !errors.As(err, &we) {
				t.Fatalf("Run: %v, want a *WorkerError", err)
			}
			how := map[int]string{}
			for _, w := range append([]*WorkerError{we}, we.Others...) {
				how[w.Rank] = w.how()
			}
			after := "exited with status 1 after rank 2 failed"
			want := map[int]string{0: after, 1: after, 2: "was killed by signal killed", 3: after}
			if we.Rank != 2 || !reflect.DeepEqual(how, want) || !strings.HasPrefix(err.Error(), fmt.Sprintf("launch: worker rank 2 (local rank 2, host %s, pid %d) was killed by signal killed; then", hostname(t), pids[2])) {
				t.Errorf("Run: %v\nwant rank 2 killed first and the others exiting with status 1 after it", err)
			}
			for _, r := range []int{0, 1, 3} {
				if want := fmt.Sprintf("[rank%d]: blamed rank 2: ", r); !strings.Contains(out.String(), want) {
					t.Errorf("rank %d did not report losing rank 2\nstdout:\n%s\nstderr:\n%s", r, out, errb.String())
				}
			}
		})
	}
}

// TestStoppedWorkerKilledAtOnce: rank 1 of four is stopped (SIGSTOP). With
// 1 s heartbeat timeouts (the launcher's, and comm/tcp's through
// HeartbeatTimeoutEnv) and a 60 s collective timeout, the survivors fail
// naming rank 1 and the launcher SIGKILLs it, within seconds; Run's error
// names rank 1 as the root cause. Before heartbeats the survivors waited
// for their collective timeout and the stopped rank for the launcher's
// grace period, and the launcher blamed a survivor (issue 31, findings 3
// and 5).
func TestStoppedWorkerKilledAtOnce(t *testing.T) {
	cfg := testConfig("allreduce", 4)
	cfg.HeartbeatTimeout = time.Second
	pids, out, errb, done := startAllReduce(t, cfg)
	if err := syscall.Kill(pids[1], syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pids[1], syscall.SIGCONT)
	stoppedAt := time.Now()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("Run still running 30s after rank 1 was stopped\nstdout:\n%s\nstderr:\n%s", out, errb.String())
	}
	if d := time.Since(stoppedAt); d > 8*time.Second {
		t.Errorf("the group took %v to stop with 1s heartbeat timeouts", d)
	}
	var we *WorkerError
	if !errors.As(err, &we) || we.Rank != 1 || we.Silent < time.Second || we.Signal != "killed" {
		t.Fatalf("Run: %v\nwant rank 1 declared dead for its heartbeats and killed\nstderr:\n%s", err, errb.String())
	}
	if !strings.Contains(err.Error(), "sent no heartbeat for") {
		t.Errorf("Run: %v: no word of the heartbeats", err)
	}
	for _, o := range we.Others {
		if o.Rank == 1 || o.Signal != "" || o.ExitCode != 1 || !o.Blaming || o.Blamed != 1 {
			t.Errorf("later failure %s, want an exit with status 1 after rank 1 failed", o.how())
		}
	}
}

func hostname(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}
