package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/commbench"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/comm/tcp"
)

const benchCommSynopsis = "bench comm [--backend inproc|tcp] [--nproc N] [--ops all_reduce,...|all] " +
	"[--min-bytes 8] [--max-bytes 256M] [--time-per-size 0.2] [--memcpy-bytes 64M] [--loopback-bytes 1G]"

// benchCommOpts are the parsed flags of "gotron bench comm".
type benchCommOpts struct {
	backend          string
	nproc            int
	cfg              commbench.Config
	memcpyBytes      int
	loopbackBytes    int
	timeout          time.Duration
	chunkBytes       int
	smallBytes       int
	shmSlotBytes     int
	masterAddr       string
	masterPort       int
	ratioTargetBytes int
}

// parseBytes reads a size such as 8, 64K, 256M, 1G (powers of 1024; a
// trailing B or iB is allowed).
func parseBytes(flag, s string) (int, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B"), "I")
	mult := 1
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	v, err := strconv.Atoi(t)
	if err != nil || v < 1 {
		return 0, fmt.Errorf("--%s %q: want a positive size such as 8, 64K, 256M or 1G", flag, s)
	}
	return v * mult, nil
}

func parseBenchComm(env *cli, args []string) (*benchCommOpts, error) {
	fs := newFlags("bench comm", benchCommSynopsis)
	o := &benchCommOpts{}
	fs.StringVar(&o.backend, "backend", "inproc", "inproc (ranks are goroutines) or tcp (ranks are processes)")
	fs.IntVar(&o.nproc, "nproc", 2, "number of ranks to start (ignored under a launcher, which sets WORLD_SIZE)")
	ops := fs.String("ops", "all_reduce", "comma-separated collectives, or all: "+strings.Join(commbench.Ops, ","))
	minB := fs.String("min-bytes", "8", "smallest buffer (sizes double up to --max-bytes)")
	maxB := fs.String("max-bytes", "256M", "largest buffer")
	per := fs.Float64("time-per-size", 0.2, "seconds of timed iterations to aim for per size (at least 3 iterations)")
	memB := fs.String("memcpy-bytes", "64M", "buffer size of the memcpy bandwidth measurement")
	loopB := fs.String("loopback-bytes", "1G", "bytes sent for the single-stream loopback measurement (tcp)")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "tcp: how long a rank waits for a peer before failing")
	fs.IntVar(&o.chunkBytes, "chunk-bytes", tcp.DefaultChunkBytes, "tcp: pipelining chunk of ring steps")
	fs.IntVar(&o.smallBytes, "small-bytes", tcp.DefaultSmallBytes, "tcp: largest message using direct (non-ring) algorithms")
	fs.IntVar(&o.shmSlotBytes, "shm-slot-bytes", 0, "tcp: slot of the shared region same-host groups use for large collectives (0: 8M/(2·nproc), -1: rings instead)")
	fs.StringVar(&o.masterAddr, "master-addr", "127.0.0.1", "tcp: rendezvous host for the ranks this command starts")
	fs.IntVar(&o.masterPort, "master-port", 0, "tcp: rendezvous port for the ranks this command starts (0: a free port)")
	fs.String("config", "", "YAML file with flag values")
	if err := parseFlags(fs, args, env.stdout, benchCommSynopsis); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if o.cfg.MinBytes, err = parseBytes("min-bytes", *minB); err != nil {
		return nil, err
	}
	if o.cfg.MaxBytes, err = parseBytes("max-bytes", *maxB); err != nil {
		return nil, err
	}
	if o.memcpyBytes, err = parseBytes("memcpy-bytes", *memB); err != nil {
		return nil, err
	}
	if o.loopbackBytes, err = parseBytes("loopback-bytes", *loopB); err != nil {
		return nil, err
	}
	if *ops == "all" {
		o.cfg.Ops = commbench.Ops
	} else {
		for _, op := range strings.Split(*ops, ",") {
			o.cfg.Ops = append(o.cfg.Ops, strings.TrimSpace(op))
		}
	}
	switch {
	case o.backend != "inproc" && o.backend != "tcp":
		return nil, fmt.Errorf("--backend %q: want inproc or tcp", o.backend)
	case o.nproc < 1 || o.nproc > 256:
		return nil, fmt.Errorf("--nproc %d: want 1..256", o.nproc)
	case o.cfg.MinBytes > o.cfg.MaxBytes:
		return nil, fmt.Errorf("--min-bytes %d is larger than --max-bytes %d", o.cfg.MinBytes, o.cfg.MaxBytes)
	case !(*per > 0):
		return nil, fmt.Errorf("--time-per-size %g: want a positive number of seconds", *per)
	case o.timeout <= 0:
		return nil, fmt.Errorf("--timeout %v: want a positive duration", o.timeout)
	case o.chunkBytes < 1:
		return nil, fmt.Errorf("--chunk-bytes %d: want at least 1", o.chunkBytes)
	}
	if err := o.cfg.Validate(); err != nil {
		return nil, fmt.Errorf("--ops: %w", err)
	}
	o.cfg.Budget = time.Duration(*per * float64(time.Second))
	o.ratioTargetBytes = 64 << 20
	return o, nil
}

// benchComm times collectives like nccl-tests (time, algbw, busbw per op and
// size) and compares all_reduce's busbw with the backend's ceiling: memcpy
// bandwidth for inproc, single-stream loopback TCP for tcp. With --backend
// tcp it starts --nproc copies of itself as ranks, unless it already runs
// under a launcher (WORLD_SIZE set), in which case this process is one rank
// and rank 0 prints the report.
func benchComm(ctx context.Context, env *cli, args []string) error {
	o, err := parseBenchComm(env, args)
	if err != nil {
		return err
	}
	if ws := env.getenv("WORLD_SIZE"); ws != "" {
		if o.backend == "tcp" {
			return benchCommRank(ctx, env, o)
		}
		if ws != "1" {
			return fmt.Errorf("--backend inproc starts its own --nproc ranks; under a launcher (WORLD_SIZE=%s) use --backend tcp", ws)
		}
	}
	if o.backend == "tcp" {
		return benchCommSpawn(ctx, env, o, args)
	}
	w, err := inproc.New(inproc.Config{Size: o.nproc})
	if err != nil {
		return err
	}
	defer w.Close()
	memcpy := measureMemcpy(o)
	results := make([][]commbench.Result, o.nproc)
	errs := make([]error, o.nproc)
	var wg sync.WaitGroup
	for r := range o.nproc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[r], errs[r] = commbench.Run(ctx, w.Group(r), o.cfg)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	report(env.stdout, o, o.nproc, results[0], memcpy, 0)
	return nil
}

// benchCommRank is one tcp rank (under gotron launch, torchrun, or started
// by benchCommSpawn).
func benchCommRank(ctx context.Context, env *cli, o *benchCommOpts) error {
	cfg, err := tcp.ConfigFromEnv(env.getenv)
	if err != nil {
		return err
	}
	cfg.Timeout, cfg.ChunkBytes, cfg.SmallBytes, cfg.ShmSlotBytes = o.timeout, o.chunkBytes, o.smallBytes, o.shmSlotBytes
	g, err := tcp.Join(ctx, cfg)
	if err != nil {
		return err
	}
	defer g.Close()
	var memcpy memcpyRates
	var loop float64
	if g.Rank() == 0 { // the ceilings, measured while the other ranks wait
		memcpy = measureMemcpy(o)
		if loop, err = commbench.Loopback(ctx, o.loopbackBytes, 4<<20, time.Now); err != nil {
			return err
		}
	}
	results, err := commbench.Run(ctx, g, o.cfg)
	if err != nil {
		return fmt.Errorf("rank %d: %w", g.Rank(), err)
	}
	if err := g.Barrier(ctx); err != nil {
		return err
	}
	if g.Rank() == 0 {
		report(env.stdout, o, g.Size(), results, memcpy, loop)
	}
	return nil
}

// benchCommSpawn starts o.nproc ranks as processes of this executable with
// torchrun's environment, relays rank 0's report, and waits for all.
func benchCommSpawn(ctx context.Context, env *cli, o *benchCommOpts, args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable to start ranks: %w", err)
	}
	port := o.masterPort
	if port == 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort(o.masterAddr, "0"))
		if err != nil {
			return fmt.Errorf("pick a free port on --master-addr %s: %w", o.masterAddr, err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, o.nproc)
	var ranks sync.WaitGroup
	stdout, stderr := &lockedWriter{w: env.stdout}, &lockedWriter{w: env.stderr}
	for r := range o.nproc {
		cmd := exec.CommandContext(ctx, exe, append([]string{"bench", "comm"}, args...)...)
		cmd.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "LOCAL_RANK="+strconv.Itoa(r),
			"WORLD_SIZE="+strconv.Itoa(o.nproc), "LOCAL_WORLD_SIZE="+strconv.Itoa(o.nproc),
			"MASTER_ADDR="+o.masterAddr, "MASTER_PORT="+strconv.Itoa(port))
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		errOut, err := cmd.StderrPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			cancel()
			ranks.Wait()
			return fmt.Errorf("start rank %d (%s): %w", r, exe, err)
		}
		ranks.Add(1)
		go func() {
			defer ranks.Done()
			var copiers sync.WaitGroup
			copiers.Add(2)
			go func() { defer copiers.Done(); io.Copy(stdout, out) }()
			go func() { defer copiers.Done(); prefixLines(stderr, errOut, fmt.Sprintf("[rank %d] ", r)) }()
			copiers.Wait() // Wait closes the pipes: read them to the end first
			if err := cmd.Wait(); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				cancel() // the others would wait for this rank until their timeout
			}
		}()
	}
	ranks.Wait()
	return errors.Join(errs...)
}

// lockedWriter serialises writes from the ranks' output copiers.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func prefixLines(w io.Writer, r io.Reader, prefix string) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fmt.Fprintf(w, "%s%s\n", prefix, sc.Text())
	}
}

// memcpyRates is the memcpy ceiling on one goroutine (what the inproc
// target is stated against) and on GOMAXPROCS goroutines (the machine's
// aggregate, reported beside it).
type memcpyRates struct {
	one, all float64
	threads  int
}

func measureMemcpy(o *benchCommOpts) memcpyRates {
	m := memcpyRates{threads: runtime.GOMAXPROCS(0)}
	m.one = commbench.Memcpy(o.memcpyBytes, 5, time.Now)
	m.all = commbench.MemcpyThreads(o.memcpyBytes, m.threads, 5, time.Now)
	return m
}

// report prints the header, the tables and the ceiling ratios.
func report(w io.Writer, o *benchCommOpts, n int, results []commbench.Result, memcpy memcpyRates, loop float64) {
	fmt.Fprintf(w, "# gotron bench comm: backend %s, %d ranks, float32, ops %s, %d..%d bytes\n",
		o.backend, n, strings.Join(o.cfg.Ops, ","), o.cfg.MinBytes, o.cfg.MaxBytes)
	fmt.Fprintln(w, "# time: mean per op on the slowest rank; algbw = size/time; busbw = algbw·f with f = 2(n-1)/n for all_reduce,")
	fmt.Fprintln(w, "#   (n-1)/n for reduce_scatter, all_gather and all_to_all, 1 for broadcast, reduce and sendrecv (nccl-tests)")
	fmt.Fprintf(w, "# memcpy: %.2f GB/s on 1 goroutine, %.2f GB/s on %d (GOMAXPROCS) (%d-byte buffers, median of 5)\n",
		memcpy.one/1e9, memcpy.all/1e9, memcpy.threads, o.memcpyBytes)
	if loop > 0 {
		fmt.Fprintf(w, "# loopback TCP, one stream: %.2f GB/s (%d bytes in 4 MiB writes)\n", loop/1e9, o.loopbackBytes)
	}
	commbench.Format(w, results)
	// The all_reduce row nearest 64 MiB (from below) against the ceiling.
	var best *commbench.Result
	for i := range results {
		r := &results[i]
		if r.Op == "all_reduce" && r.Bytes <= o.ratioTargetBytes && (best == nil || r.Bytes > best.Bytes) {
			best = r
		}
	}
	if best == nil {
		return
	}
	fmt.Fprintln(w)
	if o.backend == "tcp" {
		fmt.Fprintf(w, "# all_reduce busbw at %d bytes: %.2f GB/s = %.0f%% of loopback TCP (target ≥ 70%% at 64 MiB)\n",
			best.Bytes, best.BusBW/1e9, 100*best.BusBW/loop)
	} else {
		fmt.Fprintf(w, "# all_reduce busbw at %d bytes: %.2f GB/s = %.0f%% of memcpy on 1 goroutine (target ≥ 50%% at 64 MiB), %.0f%% of memcpy on %d\n",
			best.Bytes, best.BusBW/1e9, 100*best.BusBW/memcpy.one, 100*best.BusBW/memcpy.all, memcpy.threads)
	}
}

var _ comm.ProcessGroup = (*tcp.Group)(nil)
