package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/launch"
	"github.com/gotron/gotron/tensor"
)

const launchSynopsis = "launch --nproc-per-node N [--nnodes N] [--node-rank R] [--master-addr HOST] " +
	"[--master-port PORT] [--max-restarts N] [--standalone] [--inproc | --no-python] -- <command> [flags]"

// launchFlags are torchrun's flags (hyphen or underscore spellings) plus
// --inproc and --grace-period.
type launchFlags struct {
	nproc, nnodes, nodeRank, masterPort, maxRestarts int
	masterAddr, rdzvEndpoint, rdzvBackend, runID     string
	nnodesSpec, nprocSpec                            string
	standalone, noPython, inproc                     bool
	grace, heartbeat                                 time.Duration
}

// cmdLaunch starts the ranks of one node, torchrun-compatible: N copies of
// gotron running the given subcommand (or, with --no-python, any program),
// each with RANK, LOCAL_RANK, WORLD_SIZE, ... set. With --inproc the ranks are
// goroutines of this process instead.
func cmdLaunch(ctx context.Context, env *cli, args []string) error {
	lf, command, err := parseLaunchFlags(env, args)
	if err != nil {
		return err
	}
	cfg := launch.Config{
		NProcPerNode: lf.nproc, NNodes: lf.nnodes, NodeRank: lf.nodeRank,
		MasterAddr: lf.masterAddr, MasterPort: lf.masterPort, MaxRestarts: lf.maxRestarts,
		GracePeriod: lf.grace, RunID: lf.runID, Stdout: env.stdout, Stderr: env.stderr,
		HeartbeatTimeout: lf.heartbeat,
	}
	if lf.heartbeat == 0 {
		cfg.HeartbeatTimeout = -1 // none
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	cfg.Signals = sigs
	if lf.inproc {
		restore := shareThreads(env, lf.nproc)
		err = launch.RunInProcess(ctx, cfg, inprocWorker(env, command, lf))
		restore()
	} else {
		if !lf.noPython {
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find the gotron executable to start workers: %w", err)
			}
			command = append([]string{self}, command...)
		}
		cfg.Command = command
		cfg.Environ = workerEnviron(env, lf.nproc, runtime.NumCPU())
		err = launch.Run(ctx, cfg)
	}
	if err != nil {
		return trimmed{err}
	}
	return nil
}

// workerEnviron is the workers' base environment: the launcher's, plus, like
// torchrun's OMP_NUM_THREADS=1, GOTRON_NUM_THREADS = CPUs/nproc when several
// workers share the node and neither GOTRON_NUM_THREADS nor GOMAXPROCS is set,
// so that the workers' kernels do not oversubscribe the cores.
func workerEnviron(env *cli, nproc, cpus int) []string {
	environ := os.Environ()
	if nproc > 1 && env.getenv("GOTRON_NUM_THREADS") == "" && env.getenv("GOMAXPROCS") == "" {
		n := max(1, cpus/nproc)
		fmt.Fprintf(env.stderr, "gotron launch: setting GOTRON_NUM_THREADS=%d for each of %d workers (%d CPUs); "+
			"set it yourself to choose otherwise\n", n, nproc, cpus)
		environ = append(environ, fmt.Sprintf("GOTRON_NUM_THREADS=%d", n))
	}
	return environ
}

// shareThreads divides the process's kernel threads (tensor.CPUThreads:
// GOTRON_NUM_THREADS, or GOMAXPROCS) among the nproc goroutine ranks of
// --inproc, which call kernels concurrently: each rank's kernels then split
// their work over Threads/nproc goroutines (at least 1), as nproc processes
// of GOTRON_NUM_THREADS = CPUs/nproc each would, instead of every rank
// splitting over all of them and nproc× oversubscribing the cores. It says
// so on stderr and returns a function that restores the previous count.
func shareThreads(env *cli, nproc int) (restore func()) {
	total := tensor.CPUThreads()
	per := max(1, total/nproc)
	if nproc <= 1 || per == total {
		return func() {}
	}
	prev := tensor.SetCPUThreads(per)
	fmt.Fprintf(env.stderr, "gotron launch: --inproc: the %d ranks share the process's %d kernel threads: %d per rank\n", nproc, total, per)
	return func() { tensor.SetCPUThreads(prev) }
}

// inprocWorker runs one rank's gotron subcommand in this process, its
// environment being env's with the rank's torchrun variables on top.
//
// The ranks of one round share an inproc world: a command that communicates
// (gotron train) finds its world group in cli.world. A rank that fails is
// killed in that world, so the others' collectives end naming it instead of
// waiting for their timeout.
func inprocWorker(env *cli, command []string, lf launchFlags) launch.Worker {
	var (
		mu     sync.Mutex // protects worlds
		worlds = map[int]*inproc.World{}
	)
	world := func(e launch.Env) (*inproc.World, error) {
		mu.Lock()
		defer mu.Unlock()
		if w, ok := worlds[e.RestartCount]; ok {
			return w, nil
		}
		w, err := inproc.New(inproc.Config{Size: e.WorldSize, Timeout: inprocTimeout(env)})
		if err != nil {
			return nil, err
		}
		worlds[e.RestartCount] = w
		return w, nil
	}
	return func(ctx context.Context, e launch.Env, stdout, stderr io.Writer) error {
		w, err := world(e)
		if err != nil {
			return err
		}
		vars := map[string]string{}
		for _, kv := range e.Variables(lf.maxRestarts, lf.runID) {
			k, v, _ := strings.Cut(kv, "=")
			vars[k] = v
		}
		rankEnv := &cli{stdout: stdout, stderr: stderr, stdin: strings.NewReader(""), getenv: func(k string) string {
			if v, ok := vars[k]; ok {
				return v
			}
			return env.getenv(k)
		}, world: w.Group(e.Rank)}
		if code := run(ctx, rankEnv, command); code != 0 {
			w.Kill(e.Rank)
			return fmt.Errorf("gotron %s exited with status %d", command[0], code)
		}
		return nil
	}
}

// inprocTimeout is the inproc world's wait bound: GOTRON_COMM_TIMEOUT (a Go
// duration) or 60 s, so that a hung rank stops the job within a minute.
func inprocTimeout(env *cli) time.Duration {
	if d, err := time.ParseDuration(env.getenv("GOTRON_COMM_TIMEOUT")); err == nil && d > 0 {
		return d
	}
	return defaultCommTimeout
}

// workerReport is a worker's heartbeat pipe to gotron launch, when it has
// one.
type workerReport struct {
	r    *launch.Reporter
	rank string
}

// startReporter starts heartbeats to the launcher that started this process
// (see launch.StartReporter), from a goroutine of their own so that they
// say the process is alive whatever its command is doing. In-process ranks
// (env.world set) share the launcher's process and send none.
func startReporter(env *cli) *workerReport {
	if env.world != nil {
		return nil
	}
	r, err := launch.StartReporter(env.getenv)
	if err != nil {
		fmt.Fprintf(env.stderr, "gotron: %v; sending no heartbeats to the launcher\n", err)
		return nil
	}
	if r == nil {
		return nil
	}
	return &workerReport{r: r, rank: env.getenv("RANK")}
}

// finish tells the launcher, when err blames another rank, which one (so
// that the launcher reports that rank as the root cause, not this one),
// and stops the heartbeats.
func (w *workerReport) finish(err error) {
	if w == nil {
		return
	}
	var re *comm.RankError
	if errors.As(err, &re) && strconv.Itoa(re.Rank) != w.rank {
		w.r.Blame(re.Rank)
	}
	w.r.Close()
}

// trimmed drops the "launch: " prefix, which "gotron launch: " replaces.
type trimmed struct{ err error }

func (t trimmed) Error() string { return strings.TrimPrefix(t.err.Error(), "launch: ") }
func (t trimmed) Unwrap() error { return t.err }

// parseLaunchFlags parses the launcher's flags and returns the worker command.
// Flags not given default to torchrun's PET_* variables (as Kubeflow sets
// them), then MASTER_ADDR/MASTER_PORT, then torchrun's defaults.
func parseLaunchFlags(env *cli, args []string) (launchFlags, []string, error) {
	var lf launchFlags
	fs := newFlags("launch", launchSynopsis)
	pet := func(name, def string) string {
		if v := env.getenv("PET_" + name); v != "" {
			return v
		}
		return def
	}
	defAddr, defPort := env.getenv("MASTER_ADDR"), env.getenv("MASTER_PORT")
	if defAddr == "" {
		defAddr = launch.DefaultMasterAddr
	}
	if defPort == "" {
		defPort = strconv.Itoa(launch.DefaultMasterPort)
	}
	// Defaults come from the environment, so they are set as strings and
	// parsed by the flag package (a bad PET_ value is reported like a flag).
	fs.StringVar(&lf.nprocSpec, "nproc-per-node", "1", "workers on this node: a number, or cpu/auto for one per CPU (env PET_NPROC_PER_NODE)")
	fs.StringVar(&lf.nnodesSpec, "nnodes", "1", "number of nodes, N or N:N (env PET_NNODES)")
	fs.IntVar(&lf.nodeRank, "node-rank", 0, "this node's index (env PET_NODE_RANK)")
	fs.StringVar(&lf.masterAddr, "master-addr", defAddr, "rank 0's host (env PET_MASTER_ADDR, MASTER_ADDR)")
	fs.IntVar(&lf.masterPort, "master-port", 0, "rank 0's port (env PET_MASTER_PORT, MASTER_PORT; default 29500)")
	fs.StringVar(&lf.rdzvEndpoint, "rdzv-endpoint", "", "HOST:PORT, same as --master-addr and --master-port (env PET_RDZV_ENDPOINT)")
	fs.StringVar(&lf.rdzvBackend, "rdzv-backend", "static", "static or c10d: both rendezvous at the master address (env PET_RDZV_BACKEND)")
	fs.StringVar(&lf.runID, "rdzv-id", "none", "job id, given to workers as TORCHELASTIC_RUN_ID (env PET_RDZV_ID)")
	fs.IntVar(&lf.maxRestarts, "max-restarts", 0, "restart the whole group this many times after a failure (env PET_MAX_RESTARTS)")
	fs.BoolVar(&lf.standalone, "standalone", false, "single node on a free local port (env PET_STANDALONE)")
	fs.BoolVar(&lf.noPython, "no-python", false, "the command is any program, not a gotron subcommand")
	fs.BoolVar(&lf.inproc, "inproc", false, "run the ranks as goroutines of this process instead of processes")
	fs.DurationVar(&lf.grace, "grace-period", launch.DefaultGracePeriod, "time between SIGTERM and SIGKILL when stopping workers")
	fs.DurationVar(&lf.heartbeat, "heartbeat-timeout", launch.DefaultHeartbeatTimeout, "a worker silent this long (stopped, frozen) is declared dead, killed at once and the group stopped (0: no heartbeats); "+
		"also the default of train's --heartbeat-timeout")
	for _, p := range [][2]string{{"nproc-per-node", "NPROC_PER_NODE"}, {"nnodes", "NNODES"}, {"node-rank", "NODE_RANK"},
		{"master-addr", "MASTER_ADDR"}, {"rdzv-endpoint", "RDZV_ENDPOINT"}, {"rdzv-backend", "RDZV_BACKEND"},
		{"rdzv-id", "RDZV_ID"}, {"max-restarts", "MAX_RESTARTS"}, {"standalone", "STANDALONE"}} {
		if v := pet(p[1], ""); v != "" {
			if err := fs.Set(p[0], v); err != nil {
				return lf, nil, fmt.Errorf("PET_%s=%q: %v", p[1], v, err)
			}
		}
	}
	if err := fs.Set("master-port", pet("MASTER_PORT", defPort)); err != nil {
		return lf, nil, fmt.Errorf("MASTER_PORT/PET_MASTER_PORT=%q: want a port number", pet("MASTER_PORT", defPort))
	}
	if err := parseFlagsHelp(fs, underscoresToHyphens(args), env.stdout, helpText{synopsis: launchSynopsis, command: true}); err != nil {
		return lf, nil, err
	}
	command := fs.Args()
	if len(command) > 0 && command[0] == "--" {
		command = command[1:]
	}
	if err := lf.resolve(fs.Lookup("nnodes").Value.String()); err != nil {
		return lf, nil, err
	}
	return lf, command, checkCommand(command, lf)
}

// resolve applies --nproc-per-node, --nnodes, --rdzv-endpoint and --standalone.
func (lf *launchFlags) resolve(nnodes string) error {
	switch lf.nprocSpec {
	case "cpu", "auto": // torchrun's "auto" is one per GPU, else one per CPU
		lf.nproc = runtime.NumCPU()
	case "gpu":
		return errors.New("--nproc-per-node gpu: gotron runs on CPUs; give a number, cpu or auto")
	default:
		n, err := strconv.Atoi(lf.nprocSpec)
		if err != nil {
			return fmt.Errorf("--nproc-per-node %q: want a number of workers, cpu or auto", lf.nprocSpec)
		}
		lf.nproc = n
	}
	lo, hi, elastic := strings.Cut(nnodes, ":")
	n, err := strconv.Atoi(lo)
	if err != nil || n < 1 {
		return fmt.Errorf("--nnodes %q: want a positive number of nodes", nnodes)
	}
	if elastic && hi != lo {
		return fmt.Errorf("--nnodes %s: elastic node counts are not supported; give one number", nnodes)
	}
	lf.nnodes = n
	if lf.rdzvBackend != "static" && lf.rdzvBackend != "c10d" {
		return fmt.Errorf("--rdzv-backend %q: want static or c10d", lf.rdzvBackend)
	}
	if lf.rdzvEndpoint != "" {
		host, port, err := net.SplitHostPort(lf.rdzvEndpoint)
		if err != nil {
			host, port = lf.rdzvEndpoint, strconv.Itoa(lf.masterPort)
		}
		p, err := strconv.Atoi(port)
		if err != nil || host == "" {
			return fmt.Errorf("--rdzv-endpoint %q: want HOST:PORT", lf.rdzvEndpoint)
		}
		lf.masterAddr, lf.masterPort = host, p
	}
	if lf.standalone {
		if lf.nnodes != 1 || lf.nodeRank != 0 {
			return fmt.Errorf("--standalone runs one node; it conflicts with --nnodes %d --node-rank %d", lf.nnodes, lf.nodeRank)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("--standalone: find a free port: %w", err)
		}
		lf.masterAddr, lf.masterPort = "127.0.0.1", l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	if lf.nproc < 1 {
		return fmt.Errorf("--nproc-per-node %d: want at least 1 worker", lf.nproc)
	}
	if lf.heartbeat < 0 {
		return fmt.Errorf("--heartbeat-timeout %v: want a positive duration such as 20s, or 0 for no heartbeats", lf.heartbeat)
	}
	return nil
}

// checkCommand rejects an empty command and, unless --no-python, anything but
// a gotron subcommand other than launch.
func checkCommand(command []string, lf launchFlags) error {
	if len(command) == 0 {
		return errors.New("no worker command: want 'gotron launch [flags] -- <command> [flags]'")
	}
	if lf.noPython {
		if lf.inproc {
			return errors.New("--inproc runs gotron subcommands; it cannot be combined with --no-python")
		}
		return nil
	}
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
		if c.name == command[0] && c.name != "launch" {
			return nil
		}
	}
	if command[0] == "launch" {
		return errors.New("a worker command cannot be 'launch' itself")
	}
	msg := fmt.Sprintf("%q is not a gotron command", command[0])
	if s := nearest(command[0], names); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	return errors.New(msg + "; use --no-python to run another program")
}

// underscoresToHyphens rewrites torchrun's underscore spellings
// (--nproc_per_node) of the launcher's own flags, stopping at the command.
func underscoresToHyphens(args []string) []string {
	out := append([]string(nil), args...)
	takesValue := map[string]bool{"nproc-per-node": true, "nnodes": true, "node-rank": true, "master-addr": true,
		"master-port": true, "rdzv-endpoint": true, "rdzv-backend": true, "rdzv-id": true, "max-restarts": true,
		"grace-period": true, "heartbeat-timeout": true}
	for i := 0; i < len(out); i++ {
		a := out[i]
		if a == "--" || !strings.HasPrefix(a, "-") {
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		name = strings.ReplaceAll(name, "_", "-")
		dashes := a[:len(a)-len(strings.TrimLeft(a, "-"))]
		out[i] = dashes + name
		if hasVal {
			out[i] += "=" + val
		} else if takesValue[name] {
			i++ // skip the value
		}
	}
	return out
}
