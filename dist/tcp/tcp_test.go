package tcp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gotron/gotron/dist"
	"github.com/gotron/gotron/dist/disttest"
	"github.com/gotron/gotron/dist/tcp"
)

// Worker processes are this test binary re-executed with workerEnv set to
// a scenario name; they join over loopback and report on stdout.
const workerEnv = "GOTRON_TCP_TEST_WORKER"

func TestMain(m *testing.M) {
	if s := os.Getenv(workerEnv); s != "" {
		os.Exit(worker(s))
	}
	os.Exit(m.Run())
}

func worker(scenario string) int {
	cfg, err := tcp.ConfigFromEnv(os.Getenv)
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	cfg.Timeout, cfg.JoinTimeout = 2*time.Second, time.Minute
	if v := os.Getenv("TIMEOUT"); v != "" { // slow runs (-race on a busy machine)
		cfg.Timeout, _ = time.ParseDuration(v)
	}
	if v := os.Getenv("SMALL_BYTES"); v != "" {
		cfg.SmallBytes, _ = strconv.Atoi(v)
		cfg.ChunkBytes = 2048
	}
	ctx := context.Background()
	g, err := tcp.Join(ctx, cfg)
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	defer g.Close()
	switch scenario {
	case "conformance":
		if err := disttest.Conformance(ctx, g); err != nil {
			fmt.Println("ERROR", err)
			return 1
		}
		if err := g.Barrier(ctx); err != nil {
			fmt.Println("ERROR", err)
			return 1
		}
		fmt.Println("OK")
		return 0
	case "concurrent":
		if err := disttest.ConcurrentGroups(ctx, g, 10); err != nil {
			fmt.Println("ERROR", err)
			return 1
		}
		if err := g.Barrier(ctx); err != nil {
			fmt.Println("ERROR", err)
			return 1
		}
		fmt.Println("OK")
		return 0
	case "loop": // all-reduce until something fails
		buf := dist.MakeBuffer(dist.Float32, 1<<18)
		for i := 0; ; i++ {
			err := g.AllReduce(ctx, buf, dist.Sum)
			if i == 0 {
				fmt.Println("READY")
			}
			if err != nil {
				var re *dist.RankError
				if errors.As(err, &re) {
					fmt.Printf("FAILED blamed=%d op=%s lost=%v timeout=%v: %v\n", re.Rank, re.Op,
						errors.Is(err, dist.ErrPeerLost), errors.Is(err, dist.ErrTimeout), err)
				} else {
					fmt.Println("ERROR", err)
				}
				return 1
			}
		}
	case "mismatch": // 2 ranks disagree on a receive size, then on the collective
		blamed := func(err error) string {
			var re *dist.RankError
			if errors.As(err, &re) && errors.Is(err, dist.ErrMismatch) {
				return strconv.Itoa(re.Rank)
			}
			return fmt.Sprintf("(%v)", err)
		}
		buf := dist.MakeBuffer(dist.Float32, 4)
		p2p, coll := "-", ""
		if g.Rank() == 0 {
			if err := errors.Join(g.Send(ctx, buf, 1), g.Send(ctx, buf, 1), g.Broadcast(ctx, buf, 0)); err != nil {
				fmt.Println("ERROR", err)
				return 1
			}
			coll = blamed(g.AllReduce(ctx, buf, dist.Sum))
		} else {
			if err := g.Recv(ctx, buf, 0); err != nil {
				fmt.Println("ERROR", err)
				return 1
			}
			p2p = blamed(g.Recv(ctx, dist.MakeBuffer(dist.Float32, 8), 0))
			coll = blamed(g.AllReduce(ctx, buf, dist.Sum))
		}
		fmt.Printf("MISMATCH p2p=%s coll=%s\n", p2p, coll)
		return 0
	}
	fmt.Println("ERROR unknown scenario", scenario)
	return 2
}

func freePort(t *testing.T) int { return freePortAny(t) }

func freePortAny(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

type proc struct {
	cmd   *exec.Cmd
	lines chan string // stdout lines; closed at EOF
}

// spawn starts n workers running scenario over loopback.
func spawn(t *testing.T, n int, scenario string, extra ...string) []*proc {
	t.Helper()
	port := freePort(t)
	procs := make([]*proc, n)
	for r := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), workerEnv+"="+scenario, "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
		cmd.Env = append(cmd.Env, extra...)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p := &proc{cmd: cmd, lines: make(chan string, 16)}
		go func() {
			defer close(p.lines)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				p.lines <- sc.Text()
			}
		}()
		procs[r] = p
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	return procs
}

// last returns the worker's last stdout line and waits for it to exit.
func (p *proc) last() string {
	var l string
	for s := range p.lines {
		l = s
	}
	p.cmd.Wait()
	return l
}

func TestConformanceProcesses(t *testing.T) {
	type tc struct {
		n     int
		small string // "" = defaults (direct for the suite's sizes); else ring everywhere
	}
	var cases []tc
	for n := 1; n <= 8; n++ {
		cases = append(cases, tc{n, "16"})
	}
	cases = append(cases, tc{3, ""}, tc{8, ""})
	for _, c := range cases {
		name := fmt.Sprintf("n=%d/ring", c.n)
		var extra []string
		if c.small == "" {
			name = fmt.Sprintf("n=%d/default", c.n)
		} else {
			extra = append(extra, "SMALL_BYTES="+c.small)
		}
		t.Run(name, func(t *testing.T) {
			for r, p := range spawn(t, c.n, "conformance", append(extra, "TIMEOUT=30s")...) {
				if l := p.last(); l != "OK" {
					t.Errorf("rank %d: %s", r, l)
				}
			}
		})
	}
}

// TestConcurrentGroupsProcesses: three groups sharing the connections run
// at once from three goroutines per process.
func TestConcurrentGroupsProcesses(t *testing.T) {
	for _, n := range []int{2, 5} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			for r, p := range spawn(t, n, "concurrent", "TIMEOUT=30s") {
				if l := p.last(); l != "OK" {
					t.Errorf("rank %d: %s", r, l)
				}
			}
		})
	}
}

// TestMismatchProcesses: ranks that disagree on a receive's size or on
// which collective comes next get ErrMismatch naming the other rank, not
// each other's data.
func TestMismatchProcesses(t *testing.T) {
	want := []string{"MISMATCH p2p=- coll=1", "MISMATCH p2p=0 coll=0"}
	for r, p := range spawn(t, 2, "mismatch") {
		if l := p.last(); l != want[r] {
			t.Errorf("rank %d: %q, want %q", r, l, want[r])
		}
	}
}

// TestKill9 kills one worker process mid all-reduce: every other worker
// must fail with a RankError naming it, well within the 2 s timeout.
func TestKill9(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			const victim = 2
			procs := spawn(t, n, "loop", "TIMEOUT=60s") // detection must not wait for the timeout
			for r, p := range procs {
				if l := <-p.lines; l != "READY" {
					t.Fatalf("rank %d: %q, want READY", r, l)
				}
			}
			start := time.Now()
			procs[victim].cmd.Process.Signal(syscall.SIGKILL)
			var wg sync.WaitGroup
			for r, p := range procs {
				if r == victim {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					l := p.last()
					want := fmt.Sprintf("FAILED blamed=%d op=all_reduce lost=true", victim)
					if !strings.HasPrefix(l, want) {
						t.Errorf("rank %d: %q, want prefix %q", r, l, want)
					}
				}()
			}
			wg.Wait()
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("survivors took %v to fail; a dead process must be noticed at once, not after the 60s timeout", d)
			}
		})
	}
}

// TestStoppedPeerTimesOut stops (SIGSTOP) a worker: the others must give
// up after the timeout, naming it.
func TestStoppedPeerTimesOut(t *testing.T) {
	const n, victim = 3, 1
	procs := spawn(t, n, "loop", "SMALL_BYTES=1048576000")
	for r, p := range procs {
		if l := <-p.lines; l != "READY" {
			t.Fatalf("rank %d: %q, want READY", r, l)
		}
	}
	procs[victim].cmd.Process.Signal(syscall.SIGSTOP)
	defer procs[victim].cmd.Process.Signal(syscall.SIGCONT)
	for r, p := range procs {
		if r == victim {
			continue
		}
		want := fmt.Sprintf("FAILED blamed=%d op=all_reduce lost=false timeout=true", victim)
		if l := p.last(); !strings.HasPrefix(l, want) {
			t.Errorf("rank %d: %q, want prefix %q", r, l, want)
		}
	}
}

func TestJoinTimesOutWithoutPeers(t *testing.T) {
	start := time.Now()
	_, err := tcp.Join(t.Context(), tcp.Config{Rank: 0, WorldSize: 2, MasterPort: freePort(t), Timeout: time.Hour, JoinTimeout: 200 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "rank 0 of 2") {
		t.Errorf("got %v, want a join error naming rank 0 of 2", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("join took %v with a 200ms timeout", d)
	}
}

func TestConfigFromEnv(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	cfg, err := tcp.ConfigFromEnv(env(map[string]string{"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "node1", "MASTER_PORT": "1234"}))
	if err != nil || cfg.Rank != 3 || cfg.WorldSize != 4 || cfg.MasterAddr != "node1" || cfg.MasterPort != 1234 {
		t.Errorf("got %+v, %v", cfg, err)
	}
	if cfg, err := tcp.ConfigFromEnv(env(nil)); err != nil || cfg.WorldSize != 1 || cfg.Rank != 0 {
		t.Errorf("empty env: %+v, %v", cfg, err)
	}
	for _, bad := range []map[string]string{
		{"RANK": "x", "WORLD_SIZE": "2"},
		{"RANK": "2", "WORLD_SIZE": "2"},
		{"RANK": "0", "WORLD_SIZE": "0"},
		{"MASTER_PORT": "99999"},
	} {
		if _, err := tcp.ConfigFromEnv(env(bad)); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

// joinLocal joins n ranks as goroutines of this process.
func joinLocal(t *testing.T, n int, timeout time.Duration) []*tcp.Group {
	t.Helper()
	port := freePort(t)
	groups := make([]*tcp.Group, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := tcp.Join(t.Context(), tcp.Config{Rank: r, WorldSize: n, MasterPort: port, Timeout: timeout})
			if err != nil {
				t.Error(err)
				return
			}
			groups[r] = g
			t.Cleanup(func() { g.Close() })
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return groups
}

// TestContextCancel: rank 0 abandons a Recv (its ctx ends); it gets the
// context error and rank 1, blocked receiving from rank 0, is told at once
// (not after its 1-minute timeout) and blames rank 0.
func TestContextCancel(t *testing.T) {
	g := joinLocal(t, 2, time.Minute)
	ctx, cancel := context.WithCancel(t.Context())
	e0, e1 := make(chan error, 1), make(chan error, 1)
	go func() { e0 <- g[0].Recv(ctx, dist.MakeBuffer(dist.Float32, 4), 1) }()
	go func() { e1 <- g[1].Recv(t.Context(), dist.MakeBuffer(dist.Float32, 4), 0) }()
	cancel()
	if err := <-e0; !errors.Is(err, context.Canceled) {
		t.Errorf("rank 0: got %v, want context.Canceled", err)
	}
	var re *dist.RankError
	if err := <-e1; !errors.As(err, &re) || re.Rank != 0 || !errors.Is(err, dist.ErrPeerLost) {
		t.Errorf("rank 1: got %v, want a RankError naming rank 0 wrapping ErrPeerLost", err)
	}
}

// TestCloseUnblocks: a rank blocked in Recv returns ErrClosed when its
// world is closed.
func TestCloseUnblocks(t *testing.T) {
	g := joinLocal(t, 2, 10*time.Second)
	done := make(chan error, 1)
	go func() { done <- g[0].Recv(t.Context(), dist.MakeBuffer(dist.Float32, 4), 1) }()
	g[0].Close()
	if err := <-done; !errors.Is(err, dist.ErrClosed) {
		t.Errorf("got %v, want ErrClosed", err)
	}
}
