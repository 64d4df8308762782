package launch

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestMain turns the test binary into a worker when LAUNCH_TEST_WORKER is set,
// so Run can be tested with real processes.
func TestMain(m *testing.M) {
	if mode := os.Getenv("LAUNCH_TEST_WORKER"); mode != "" {
		os.Exit(testWorker(mode))
	}
	os.Exit(m.Run())
}

// testWorker is the worker program: it reads its Env like a real worker and
// then behaves as mode says.
func testWorker(mode string) int {
	e, err := DetectEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	waitSignal := func() int {
		fmt.Println("ready")
		s := <-sigs
		fmt.Printf("rank %d got %v\n", e.Rank, s)
		return 3
	}
	switch {
	case mode == "env":
		fmt.Printf("rank=%d local=%d world=%d localworld=%d node=%d nnodes=%d master=%s:%d restart=%d source=%s\n",
			e.Rank, e.LocalRank, e.WorldSize, e.LocalWorldSize, e.NodeRank, e.NNodes, e.MasterAddr, e.MasterPort, e.RestartCount, e.Source)
		fmt.Fprintf(os.Stderr, "to stderr from %d", e.Rank) // no newline: the launcher adds one
		return 0
	case strings.HasPrefix(mode, "fail:"): // fail:RANK:CODE; the others wait for a signal
		parts := strings.Split(mode, ":")
		r, _ := strconv.Atoi(parts[1])
		code, _ := strconv.Atoi(parts[2])
		if e.Rank == r {
			fmt.Printf("rank %d failing with %d\n", r, code)
			return code
		}
		return waitSignal()
	case mode == "ignore-term": // rank 0 fails; the others ignore SIGTERM
		if e.Rank == 0 {
			return 1
		}
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ready")
		select {}
	case mode == "restart": // rank 1 fails until the second restart
		fmt.Printf("attempt %d\n", e.RestartCount)
		if e.Rank == 1 && e.RestartCount < 2 {
			return 5
		}
		return 0
	case mode == "lines":
		w := bufio.NewWriterSize(os.Stdout, 7) // many small writes, lines split across them
		for i := range 200 {
			fmt.Fprintf(w, "line %d of rank %d %s\n", i, e.Rank, strings.Repeat("x", i%13))
		}
		w.Flush()
		return 0
	case mode == "wait":
		return waitSignal()
	case mode == "pid": // print the pid, then block
		fmt.Printf("pid %d\n", os.Getpid())
		select {}
	case mode == "launcher": // a launcher of two "pid" workers, for the kill -9 test
		cfg := testConfig("pid", 2)
		cfg.Stdout = os.Stdout
		return map[bool]int{true: 1, false: 0}[Run(context.Background(), cfg) != nil]
	}
	if f, ok := extraWorkers[mode]; ok {
		return f(e)
	}
	return 9
}

// extraWorkers holds worker modes registered by other test files.
var extraWorkers = map[string]func(Env) int{}

func testConfig(mode string, nproc int) Config {
	return Config{
		NProcPerNode: nproc,
		Command:      []string{os.Args[0]},
		Environ:      append(os.Environ(), "LAUNCH_TEST_WORKER="+mode),
		GracePeriod:  10 * time.Second,
	}
}

func sortedLines(s string) []string {
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	sort.Strings(lines)
	return lines
}

// TestRunEnv checks the variables every worker gets and the rank prefixes.
func TestRunEnv(t *testing.T) {
	var out, errb bytes.Buffer
	cfg := testConfig("env", 3)
	cfg.NNodes, cfg.NodeRank, cfg.MasterAddr, cfg.MasterPort = 2, 1, "head", 4242
	cfg.Stdout, cfg.Stderr = &out, &errb
	if err := Run(context.Background(), cfg); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	want := []string{
		"[rank3]: rank=3 local=0 world=6 localworld=3 node=1 nnodes=2 master=head:4242 restart=0 source=torchrun",
		"[rank4]: rank=4 local=1 world=6 localworld=3 node=1 nnodes=2 master=head:4242 restart=0 source=torchrun",
		"[rank5]: rank=5 local=2 world=6 localworld=3 node=1 nnodes=2 master=head:4242 restart=0 source=torchrun",
	}
	if got := sortedLines(out.String()); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("stdout:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	wantErr := []string{"[rank3]: to stderr from 3", "[rank4]: to stderr from 4", "[rank5]: to stderr from 5"}
	if got := sortedLines(errb.String()); strings.Join(got, "\n") != strings.Join(wantErr, "\n") {
		t.Errorf("stderr:\n%s", errb.String())
	}
}

// TestRunFailureStopsOthers: rank 2 exits 7; the others get SIGTERM and the
// error names rank 2.
func TestRunFailureStopsOthers(t *testing.T) {
	var out bytes.Buffer
	cfg := testConfig("fail:2:7", 4)
	cfg.Stdout = &out
	err := Run(context.Background(), cfg)
	var we *WorkerError
	if !errors.As(err, &we) || we.Rank != 2 || we.ExitCode != 7 {
		t.Fatalf("got %v, want rank 2 exiting with 7", err)
	}
	if !strings.Contains(err.Error(), "worker rank 2") || !strings.Contains(err.Error(), "status 7") {
		t.Errorf("error %q does not name rank 2 and status 7", err)
	}
	for _, o := range we.Others { // ranks that handled SIGTERM and exited 3, or died of it
		if o.Rank == 2 || !o.Stopped || (o.ExitCode != 3 && o.Signal != "terminated") {
			t.Errorf("unexpected later failure %+v", o)
		}
	}
	// Every other rank either got SIGTERM or had not reached its signal
	// handler yet (then SIGTERM killed it); none may be left running, which
	// Run returning proves.
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if !regexp.MustCompile(`^\[rank[0-3]\]: (ready|rank [0-3] got terminated|rank 2 failing with 7)$`).MatchString(line) {
			t.Errorf("unexpected line %q", line)
		}
	}
}

// TestRunKillsAfterGrace: workers that ignore SIGTERM are killed once the
// grace period ends.
func TestRunKillsAfterGrace(t *testing.T) {
	cfg := testConfig("ignore-term", 3)
	cfg.GracePeriod = 300 * time.Millisecond
	err := Run(context.Background(), cfg)
	var we *WorkerError
	if !errors.As(err, &we) || we.Rank != 0 || we.ExitCode != 1 {
		t.Fatalf("got %v, want rank 0 exiting with 1", err)
	}
}

// TestRunRestarts: rank 1 fails twice; with two restarts the group succeeds,
// with one it fails, and TORCHELASTIC_RESTART_COUNT counts the rounds.
func TestRunRestarts(t *testing.T) {
	for _, c := range []struct {
		max     int
		wantErr bool
	}{{2, false}, {1, true}, {0, true}} {
		var out, errb bytes.Buffer
		cfg := testConfig("restart", 2)
		cfg.MaxRestarts, cfg.Stdout, cfg.Stderr = c.max, &out, &errb
		err := Run(context.Background(), cfg)
		if (err != nil) != c.wantErr {
			t.Errorf("max restarts %d: err = %v", c.max, err)
		}
		if n := strings.Count(out.String(), "[rank1]: attempt"); n != min(c.max, 2)+1 {
			t.Errorf("max restarts %d: rank 1 ran %d times:\n%s", c.max, n, out.String())
		}
		if n := strings.Count(errb.String(), "restarting the group"); n != min(c.max, 2) {
			t.Errorf("max restarts %d: %d restart notices:\n%s", c.max, n, errb.String())
		}
	}
}

// TestRunLinesDoNotInterleave: four workers write lines in 7-byte pieces;
// every output line is one whole line of one rank.
func TestRunLinesDoNotInterleave(t *testing.T) {
	var out bytes.Buffer
	cfg := testConfig("lines", 4)
	cfg.Stdout = &out
	if err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^\[rank(\d)\]: line (\d+) of rank (\d) (x*)$`)
	count := map[string]int{}
	for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil || m[1] != m[3] {
			t.Fatalf("mangled line %q", line)
		}
		i, _ := strconv.Atoi(m[2])
		if len(m[4]) != i%13 {
			t.Fatalf("mangled line %q", line)
		}
		count[m[1]]++
	}
	for r := range 4 {
		if count[strconv.Itoa(r)] != 200 {
			t.Errorf("rank %d: %d lines, want 200", r, count[strconv.Itoa(r)])
		}
	}
}

// readyWriter counts "ready" lines and closes ready when n have arrived.
type readyWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	n     int
	ready chan struct{}
}

func (w *readyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.n > 0 {
		w.n -= bytes.Count(p, []byte("]: ready\n"))
		if w.n <= 0 {
			close(w.ready)
		}
	}
	return len(p), nil
}

func (w *readyWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestRunForwardsSignals: SIGINT given to the launcher reaches every worker,
// and the group is not restarted.
func TestRunForwardsSignals(t *testing.T) {
	out := &readyWriter{n: 3, ready: make(chan struct{})}
	sigs := make(chan os.Signal, 1)
	cfg := testConfig("wait", 3)
	cfg.Stdout, cfg.Signals, cfg.MaxRestarts = out, sigs, 3
	go func() { <-out.ready; sigs <- syscall.SIGINT }()
	err := Run(context.Background(), cfg)
	if !errors.Is(err, ErrInterrupted) || !strings.Contains(err.Error(), "interrupt") {
		t.Fatalf("got %v, want ErrInterrupted by signal interrupt", err)
	}
	for r := range 3 {
		if want := fmt.Sprintf("[rank%d]: rank %d got interrupt\n", r, r); !strings.Contains(out.String(), want) {
			t.Errorf("missing %q in\n%s", want, out.String())
		}
	}
}

// TestRunContextCancel: cancelling ctx sends SIGTERM to every worker.
func TestRunContextCancel(t *testing.T) {
	out := &readyWriter{n: 2, ready: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	cfg := testConfig("wait", 2)
	cfg.Stdout = out
	go func() { <-out.ready; cancel() }()
	err := Run(ctx, cfg)
	if !errors.Is(err, ErrInterrupted) {
		t.Fatalf("got %v, want ErrInterrupted", err)
	}
	for r := range 2 {
		if want := fmt.Sprintf("[rank%d]: rank %d got terminated\n", r, r); !strings.Contains(out.String(), want) {
			t.Errorf("missing %q in\n%s", want, out.String())
		}
	}
}

func TestRunBadConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Command: []string{"true"}}, "--nproc-per-node 0"},
		{Config{NProcPerNode: 1, NNodes: 2, NodeRank: 2, Command: []string{"true"}}, "--node-rank 2"},
		{Config{NProcPerNode: 1, MasterPort: 70000, Command: []string{"true"}}, "--master-port 70000"},
		{Config{NProcPerNode: 1, MaxRestarts: -1, Command: []string{"true"}}, "--max-restarts -1"},
		{Config{NProcPerNode: 1}, "no worker command"},
		{Config{NProcPerNode: 2, Command: []string{"/nonexistent/gotron-worker"}}, "start worker rank 0"},
	} {
		err := Run(context.Background(), c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.cfg, err, c.want)
		}
	}
}

// TestRunInProcess runs ranks as goroutines: each sees its Env, the first
// failure cancels the others and is named, and restarts work.
func TestRunInProcess(t *testing.T) {
	var out bytes.Buffer
	cfg := Config{NProcPerNode: 4, MasterPort: 1234, Stdout: &out}
	err := RunInProcess(context.Background(), cfg, func(ctx context.Context, e Env, stdout, stderr io.Writer) error {
		fmt.Fprintf(stdout, "rank %d of %d local %d port %d\n", e.Rank, e.WorldSize, e.LocalRank, e.MasterPort)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "[rank0]: rank 0 of 4 local 0 port 1234\n[rank1]: rank 1 of 4 local 1 port 1234\n" +
		"[rank2]: rank 2 of 4 local 2 port 1234\n[rank3]: rank 3 of 4 local 3 port 1234"
	if got := strings.Join(sortedLines(out.String()), "\n"); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}

	var cancelled sync.WaitGroup
	cancelled.Add(3)
	err = RunInProcess(context.Background(), Config{NProcPerNode: 4}, func(ctx context.Context, e Env, _, _ io.Writer) error {
		if e.Rank == 1 {
			return errors.New("boom")
		}
		<-ctx.Done()
		cancelled.Done()
		return ctx.Err()
	})
	cancelled.Wait()
	var we *WorkerError
	if !errors.As(err, &we) || we.Rank != 1 || !strings.Contains(err.Error(), "worker rank 1") || !strings.Contains(err.Error(), "boom") {
		t.Errorf("got %v, want rank 1's boom", err)
	}

	err = RunInProcess(context.Background(), Config{NProcPerNode: 2, MaxRestarts: 1}, func(ctx context.Context, e Env, _, _ io.Writer) error {
		if e.Rank == 0 && e.RestartCount == 0 {
			panic("first attempt")
		}
		return nil
	})
	if err != nil {
		t.Errorf("restart after panic: %v", err)
	}
	err = RunInProcess(context.Background(), Config{NProcPerNode: 2}, func(ctx context.Context, e Env, _, _ io.Writer) error {
		if e.Rank == 1 {
			panic("always")
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "panic: always") {
		t.Errorf("panic: got %v", err)
	}
}

func TestWorkerErrorMessage(t *testing.T) {
	e := &WorkerError{Rank: 2, LocalRank: 2, PID: 77, ExitCode: -1, Signal: "killed"}
	if got, want := e.Error(), "launch: worker rank 2 (local rank 2, pid 77) was killed by signal killed"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	for r := range 10 {
		e.Others = append(e.Others, &WorkerError{Rank: r + 10, PID: 1, ExitCode: 1})
	}
	want := "launch: worker rank 2 (local rank 2, pid 77) was killed by signal killed; then rank 10 exited with status 1, " +
		"rank 11 exited with status 1, rank 12 exited with status 1, rank 13 exited with status 1, rank 14 exited with status 1, " +
		"rank 15 exited with status 1, rank 16 exited with status 1, rank 17 exited with status 1 and 2 more"
	if got := e.Error(); got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	in := &WorkerError{Rank: 1, LocalRank: 1, Err: errors.New("boom")}
	if got, want := in.Error(), "launch: worker rank 1 (local rank 1) failed: boom"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestRunInProcessInterrupted: a signal or a cancelled context cancels every
// in-process rank, and the group is not restarted.
func TestRunInProcessInterrupted(t *testing.T) {
	sigs := make(chan os.Signal, 1)
	var started sync.WaitGroup
	started.Add(3)
	go func() { started.Wait(); sigs <- syscall.SIGINT }()
	runs := 0
	var mu sync.Mutex
	err := RunInProcess(context.Background(), Config{NProcPerNode: 3, MaxRestarts: 2, Signals: sigs},
		func(ctx context.Context, e Env, _, _ io.Writer) error {
			mu.Lock()
			runs++
			mu.Unlock()
			started.Done()
			<-ctx.Done()
			return ctx.Err()
		})
	if !errors.Is(err, ErrInterrupted) || !strings.Contains(err.Error(), "interrupt") || runs != 3 {
		t.Errorf("signal: got %v after %d runs, want ErrInterrupted after 3", err, runs)
	}

	ctx, cancel := context.WithCancel(context.Background())
	started.Add(2)
	go func() { started.Wait(); cancel() }()
	err = RunInProcess(ctx, Config{NProcPerNode: 2, MaxRestarts: 2}, func(ctx context.Context, e Env, _, _ io.Writer) error {
		started.Done()
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, ErrInterrupted) {
		t.Errorf("cancel: got %v, want ErrInterrupted", err)
	}
}

// TestRootCause: the root cause is chosen by how each worker ended, not by
// the order the launcher saw the ends in.
func TestRootCause(t *testing.T) {
	survivor := func(rank, blamed int) *WorkerError {
		return &WorkerError{Rank: rank, PID: 100 + rank, ExitCode: 1, Blaming: true, Blamed: blamed}
	}
	for _, c := range []struct {
		name     string
		failures []*WorkerError
		want     int
	}{
		{"kill -9 reaped last", []*WorkerError{survivor(0, 2), survivor(1, 2),
			{Rank: 2, PID: 102, ExitCode: -1, Signal: "killed"}}, 2},
		{"stopped rank blamed, then killed by the launcher", []*WorkerError{survivor(0, 3), survivor(1, 3),
			{Rank: 2, PID: 102, ExitCode: 1, Stopped: true}, {Rank: 3, PID: 103, ExitCode: -1, Signal: "killed", Stopped: true}}, 3},
		{"declared dead by the launcher", []*WorkerError{{Rank: 0, PID: 100, ExitCode: 1},
			{Rank: 1, PID: 101, ExitCode: -1, Signal: "killed", Stopped: true, Silent: 20 * time.Second}}, 1},
		{"own failure before those it caused", []*WorkerError{survivor(1, 0), {Rank: 0, PID: 100, ExitCode: 7},
			{Rank: 2, PID: 102, ExitCode: -1, Signal: "terminated", Stopped: true}}, 0},
	} {
		blamedBy := map[int]int{}
		for _, f := range c.failures {
			if f.Blaming {
				blamedBy[f.Blamed]++
			}
		}
		root := rootCause(c.failures, blamedBy)
		if root.Rank != c.want || len(root.Others) != len(c.failures)-1 {
			t.Errorf("%s: %v; want rank %d first and the %d others after it", c.name, root, c.want, len(c.failures)-1)
		}
	}
}
