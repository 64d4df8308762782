package launch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
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
	signal.Ignore(syscall.SIGTERM)
	ctx := context.Background()
	g, err := tcp.Join(ctx, tcp.Config{Rank: e.Rank, WorldSize: e.WorldSize, MasterAddr: e.MasterAddr,
		MasterPort: e.MasterPort, Timeout: 60 * time.Second})
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

// TestKillWorkerMidAllReduce: four workers all-reduce over comm/tcp; rank 2
// is killed with SIGKILL while they do. Every survivor's all-reduce fails with
// ErrPeerLost naming rank 2 (not ErrTimeout: the loss is seen at once, not
// after the 60 s timeout) and exits 1, and Run's error names rank 2 as killed
// and the others as failed after it.
func TestKillWorkerMidAllReduce(t *testing.T) {
	out := &lineWatcher{re: regexp.MustCompile(`^\[rank(\d)\]: (pid \d+|iterating)$`), lines: make(chan []string, 64)}
	cfg := testConfig("allreduce", 4)
	cfg.MasterPort, cfg.Stdout = freePort(t), out
	var errb strings.Builder
	cfg.Stderr = &errb
	done := make(chan error, 1)
	go func() { done <- Run(context.Background(), cfg) }()

	pids, iterating := map[string]int{}, 0
	for iterating < 4 || pids["2"] == 0 {
		select {
		case m := <-out.lines:
			if m[2] == "iterating" {
				iterating++
			} else {
				pids[m[1]], _ = strconv.Atoi(strings.TrimPrefix(m[2], "pid "))
			}
		case err := <-done:
			t.Fatalf("Run returned early: %v\nstdout:\n%s\nstderr:\n%s", err, out, errb.String())
		}
	}
	if err := syscall.Kill(pids["2"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	err := <-done
	if d := time.Since(killedAt); d > 30*time.Second {
		t.Errorf("the group took %v to stop after rank 2 died; comm/tcp's timeout is 60 s", d)
	}
	var we *WorkerError
	if !errors.As(err, &we) {
		t.Fatalf("Run: %v, want a *WorkerError", err)
	}
	how := map[int]string{}
	for _, w := range append([]*WorkerError{we}, we.Others...) {
		how[w.Rank] = w.how()
	}
	want := map[int]string{0: "exited with status 1", 1: "exited with status 1", 2: "was killed by signal killed", 3: "exited with status 1"}
	if !reflect.DeepEqual(how, want) || !strings.Contains(err.Error(), "rank 2") {
		t.Errorf("Run: %v\nwant rank 2 killed and the others exiting with status 1", err)
	}
	for _, r := range []int{0, 1, 3} {
		if want := fmt.Sprintf("[rank%d]: blamed rank 2: ", r); !strings.Contains(out.String(), want) {
			t.Errorf("rank %d did not report losing rank 2\nstdout:\n%s\nstderr:\n%s", r, out, errb.String())
		}
	}
}
