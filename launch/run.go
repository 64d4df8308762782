package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// DefaultGracePeriod is how long stopped workers get between SIGTERM and
// SIGKILL, as in torchrun.
const DefaultGracePeriod = 30 * time.Second

// Config describes the workers of one node. The zero value of every field
// but NProcPerNode and Command is usable.
type Config struct {
	// NProcPerNode is the number of workers on this node; it must be ≥ 1.
	NProcPerNode int
	// NNodes is the number of nodes (0 means 1); NodeRank is this node's
	// index. Worker i of node n gets rank n·NProcPerNode + i.
	NNodes, NodeRank int
	// MasterAddr and MasterPort locate rank 0's rendezvous; "" means
	// 127.0.0.1 and 0 means 29500.
	MasterAddr string
	MasterPort int
	// MaxRestarts is how many times a failed group is restarted as a whole.
	MaxRestarts int
	// GracePeriod is the time between SIGTERM and SIGKILL when workers are
	// stopped; 0 means DefaultGracePeriod.
	GracePeriod time.Duration
	// RunID becomes TORCHELASTIC_RUN_ID ("" means "none").
	RunID string
	// Command is the worker program and its arguments (Run only).
	Command []string
	// Environ is the workers' base environment (nil means os.Environ()); the
	// rank variables are added to it (Run only).
	Environ []string
	// Stdout and Stderr receive the workers' output, every line prefixed with
	// "[rankN]: "; nil discards it. Launcher notices go to Stderr unprefixed.
	Stdout, Stderr io.Writer
	// Signals, when not nil, delivers signals to forward to every worker
	// (SIGINT, SIGTERM), so that they can save before exiting. A group stopped
	// by a signal is not restarted.
	Signals <-chan os.Signal
	// HeartbeatTimeout is how long a worker that sends heartbeats (see
	// StartReporter) may fall silent before the launcher declares it dead,
	// SIGKILLs it and stops the group; 0 means DefaultHeartbeatTimeout,
	// negative means no heartbeats (Run only).
	HeartbeatTimeout time.Duration
}

// WorkerError reports the worker whose failure stopped the group: the root
// cause, as torchrun calls it. It is the first worker whose end was not
// caused by the launcher or by another rank's failure, in this order: a
// worker the launcher declared dead for missing heartbeats; one killed by a
// signal the launcher did not send (kill -9, the OOM killer); one the other
// workers blamed when they failed; one that exited with an error of its
// own. Workers that failed because of another rank (they said so through
// the heartbeat pipe) or that the launcher stopped come after it, in
// Others.
type WorkerError struct {
	Rank, LocalRank int
	Host            string // the launcher's host, when known
	PID             int    // 0 for an in-process worker
	ExitCode        int    // -1 when killed by a signal
	Signal          string // the signal that killed it, if any
	Err             error  // the underlying error (in-process: the worker's error)
	// Silent, when not zero, is how long the worker had sent no heartbeat
	// when the launcher declared it dead and killed it.
	Silent time.Duration
	// Blaming reports that the worker said it failed because world rank
	// Blamed failed.
	Blaming bool
	Blamed  int
	// Stopped reports that the launcher had signalled the worker (to stop
	// the group) before it ended.
	Stopped bool
	// Others are the workers that failed afterwards (at most maxOthers are
	// listed in Error).
	Others []*WorkerError
}

// Error names the worker and how it ended.
func (e *WorkerError) Error() string {
	who := fmt.Sprintf("worker rank %d (local rank %d", e.Rank, e.LocalRank)
	if e.Host != "" {
		who += ", host " + e.Host
	}
	if e.PID != 0 {
		who += fmt.Sprintf(", pid %d", e.PID)
	}
	who += ")"
	msg := "launch: " + who + " " + e.how()
	for i, o := range e.Others {
		if i == maxOthers {
			msg += fmt.Sprintf(" and %d more", len(e.Others)-maxOthers)
			break
		}
		if i == 0 {
			msg += "; then"
		} else {
			msg += ","
		}
		msg += fmt.Sprintf(" rank %d %s", o.Rank, o.how())
	}
	return msg
}

func (e *WorkerError) how() string {
	switch {
	case e.PID == 0:
		return fmt.Sprintf("failed: %v", e.Err)
	case e.Silent > 0:
		return fmt.Sprintf("sent no heartbeat for %v (stopped or frozen) and was killed by the launcher", e.Silent.Round(100*time.Millisecond))
	case e.Blaming:
		if e.Signal != "" {
			return fmt.Sprintf("was killed by signal %s after rank %d failed", e.Signal, e.Blamed)
		}
		return fmt.Sprintf("exited with status %d after rank %d failed", e.ExitCode, e.Blamed)
	case e.Signal != "" && e.Stopped:
		return "was stopped by the launcher (signal " + e.Signal + ")"
	case e.Signal != "":
		return "was killed by signal " + e.Signal
	case e.Stopped:
		return fmt.Sprintf("exited with status %d after the launcher stopped it", e.ExitCode)
	default:
		return fmt.Sprintf("exited with status %d", e.ExitCode)
	}
}

// rootCause orders failures (in the order the launcher saw them) by how
// likely each is to be the cause of the others, and returns the first with
// the rest as its Others. blamedBy counts, per world rank, the workers that
// said they failed because of it.
func rootCause(failures []*WorkerError, blamedBy map[int]int) *WorkerError {
	if len(failures) == 0 {
		return nil
	}
	class := func(e *WorkerError) int {
		switch {
		case e.Silent > 0:
			return 0 // declared dead by the launcher
		case e.Signal != "" && !e.Stopped:
			return 1 // killed from outside
		case blamedBy[e.Rank] > 0:
			return 2 // the other ranks name it
		case !e.Blaming && !e.Stopped:
			return 3 // failed by itself
		case e.Blaming:
			return 4 // failed because of another rank
		default:
			return 5 // stopped by the launcher
		}
	}
	order := slices.Clone(failures)
	slices.SortStableFunc(order, func(a, b *WorkerError) int {
		if ca, cb := class(a), class(b); ca != cb {
			return ca - cb
		}
		if class(a) == 2 {
			return blamedBy[b.Rank] - blamedBy[a.Rank]
		}
		return 0
	})
	root := order[0]
	root.Others = append(root.Others[:0], order[1:]...)
	return root
}

// Unwrap returns the underlying error.
func (e *WorkerError) Unwrap() error { return e.Err }

// maxOthers bounds how many later failures WorkerError.Error lists.
const maxOthers = 8

// ErrInterrupted is returned (wrapped) when the workers were stopped by a
// forwarded signal or a cancelled context.
var ErrInterrupted = errors.New("launch: interrupted")

// validate checks the config and fills defaults.
func (c Config) validate() (Config, error) {
	if c.NNodes == 0 {
		c.NNodes = 1
	}
	if c.MasterAddr == "" {
		c.MasterAddr = DefaultMasterAddr
	}
	if c.MasterPort == 0 {
		c.MasterPort = DefaultMasterPort
	}
	if c.GracePeriod == 0 {
		c.GracePeriod = DefaultGracePeriod
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if c.RunID == "" {
		c.RunID = "none"
	}
	if c.Stdout == nil {
		c.Stdout = io.Discard
	}
	if c.Stderr == nil {
		c.Stderr = io.Discard
	}
	switch {
	case c.NProcPerNode < 1:
		return c, fmt.Errorf("launch: --nproc-per-node %d: want at least 1 worker", c.NProcPerNode)
	case c.NNodes < 1:
		return c, fmt.Errorf("launch: --nnodes %d: want at least 1 node", c.NNodes)
	case c.NodeRank < 0 || c.NodeRank >= c.NNodes:
		return c, fmt.Errorf("launch: --node-rank %d: want 0..%d for --nnodes %d", c.NodeRank, c.NNodes-1, c.NNodes)
	case c.MasterPort < 1 || c.MasterPort > 65535:
		return c, fmt.Errorf("launch: --master-port %d: want 1..65535", c.MasterPort)
	case c.MaxRestarts < 0:
		return c, fmt.Errorf("launch: --max-restarts %d: must not be negative", c.MaxRestarts)
	case c.GracePeriod < 0:
		return c, fmt.Errorf("launch: grace period %v: must not be negative", c.GracePeriod)
	}
	return c, nil
}

// workerEnv is local worker i's Env in the given restart round.
func (c Config) workerEnv(i, restart int) Env {
	return Env{
		Rank: c.NodeRank*c.NProcPerNode + i, LocalRank: i,
		WorldSize: c.NNodes * c.NProcPerNode, LocalWorldSize: c.NProcPerNode,
		NodeRank: c.NodeRank, NNodes: c.NNodes,
		MasterAddr: c.MasterAddr, MasterPort: c.MasterPort,
		RestartCount: restart, Source: "torchrun",
	}
}

// Run starts NProcPerNode copies of Command with torchrun's variables and
// waits for them. When one fails it stops the others (SIGTERM, then SIGKILL
// after GracePeriod) and, while restarts remain, starts the whole group again
// with TORCHELASTIC_RESTART_COUNT incremented; otherwise it returns a
// *WorkerError naming the first failed worker. Signals from cfg.Signals are
// forwarded to the workers; cancelling ctx stops them with SIGTERM. Either way
// Run then returns an error wrapping ErrInterrupted once all workers exited.
func Run(ctx context.Context, cfg Config) error {
	c, err := cfg.validate()
	if err != nil {
		return err
	}
	if len(c.Command) == 0 {
		return errors.New("launch: no worker command given")
	}
	if c.Environ == nil {
		c.Environ = os.Environ()
	}
	return c.rounds(func(restart int) (bool, error) { return c.runGroup(ctx, restart) })
}

// rounds runs the group until it succeeds, is interrupted, or runs out of
// restarts.
func (c Config) rounds(group func(restart int) (retry bool, err error)) error {
	for restart := 0; ; restart++ {
		retry, err := group(restart)
		if err == nil || !retry || restart >= c.MaxRestarts {
			return err
		}
		fmt.Fprintf(c.Stderr, "gotron launch: %v; restarting the group (restart %d of %d)\n", err, restart+1, c.MaxRestarts)
	}
}

type proc struct {
	env  Env
	cmd  *exec.Cmd
	out  *PrefixWriter
	errw *PrefixWriter
	hb   *watcher // nil without heartbeats
	done bool
	// sent names the signals the launcher sent the worker.
	sent []string
	// silent is how long the worker had been silent when the launcher
	// declared it dead (0: it was not).
	silent time.Duration
}

type exit struct {
	i   int
	err error
}

// runGroup runs one round. retry reports whether a failure may be retried
// (it may not after a signal or a cancelled context).
func (c Config) runGroup(ctx context.Context, restart int) (retry bool, err error) {
	stdout, stderr := &LockedWriter{W: c.Stdout}, &LockedWriter{W: c.Stderr}
	procs := make([]*proc, c.NProcPerNode)
	exits := make(chan exit, c.NProcPerNode)
	for i := range procs {
		e := c.workerEnv(i, restart)
		p := &proc{env: e}
		prefix := fmt.Sprintf("[rank%d]: ", e.Rank)
		p.out, p.errw = NewPrefixWriter(stdout, prefix), NewPrefixWriter(stderr, prefix)
		p.cmd = exec.Command(c.Command[0], c.Command[1:]...)
		p.cmd.Env = mergeEnv(c.Environ, e.Variables(c.MaxRestarts, c.RunID))
		p.cmd.Stdout, p.cmd.Stderr = p.out, p.errw
		p.cmd.WaitDelay = c.GracePeriod
		ownProcessGroup(p.cmd)
		var hbw *os.File
		if c.HeartbeatTimeout > 0 {
			r, w, err := os.Pipe()
			if err != nil {
				c.stop(procs[:i], exits, i)
				return false, fmt.Errorf("launch: heartbeat pipe for worker rank %d: %w", e.Rank, err)
			}
			hbw = w
			p.cmd.ExtraFiles = []*os.File{w} // descriptor 3
			p.cmd.Env = append(p.cmd.Env, HeartbeatFDEnv+"=3",
				HeartbeatIntervalEnv+"="+heartbeatInterval(c.HeartbeatTimeout).String(),
				HeartbeatTimeoutEnv+"="+c.HeartbeatTimeout.String())
			p.hb = watch(r)
		}
		err := p.cmd.Start()
		if hbw != nil {
			hbw.Close() // the worker holds the write end now; EOF when it exits
		}
		if err != nil {
			c.stop(procs[:i], exits, i)
			return false, fmt.Errorf("launch: start worker rank %d: %w", e.Rank, err)
		}
		procs[i] = p
		go func() { exits <- exit{i, p.cmd.Wait()} }()
	}
	return c.wait(ctx, procs, exits)
}

// wait collects the workers' exits, stopping the group on the first failure,
// a signal or ctx, and returns the root cause of a failure.
func (c Config) wait(ctx context.Context, procs []*proc, exits chan exit) (retry bool, err error) {
	var failures []*WorkerError
	var stopped error // set when a signal or ctx stopped the group
	var kill <-chan time.Time
	done := ctx.Done()
	startStop := func(sig os.Signal) {
		for _, p := range procs {
			if !p.done {
				signalProcess(p.cmd, sig)
				p.sent = append(p.sent, sig.String())
			}
		}
		if kill == nil {
			kill = time.After(c.GracePeriod)
		}
	}
	var tick <-chan time.Time
	if c.HeartbeatTimeout > 0 {
		t := time.NewTicker(min(c.HeartbeatTimeout/4, 250*time.Millisecond))
		defer t.Stop()
		tick = t.C
	}
	frozen := 2 * heartbeatInterval(c.HeartbeatTimeout)
	for left := len(procs); left > 0; {
		select {
		case x := <-exits:
			left--
			if errors.Is(x.err, exec.ErrWaitDelay) {
				x.err = nil // exited 0; a process it started still held the output open
			}
			p := procs[x.i]
			p.done = true
			p.out.Flush()
			p.errw.Flush()
			if p.hb != nil {
				select { // the blame report, written just before the exit
				case <-p.hb.drained:
				case <-time.After(100 * time.Millisecond):
				}
			}
			if x.err == nil && p.silent == 0 {
				break
			}
			if x.err == nil {
				x.err = errors.New("exited after the launcher declared it dead")
			}
			failures = append(failures, workerError(p, x.err))
			if stopped == nil && kill == nil {
				startStop(sigTerm)
			}
		case now := <-tick:
			for _, p := range procs {
				if p.done || p.hb == nil || p.silent > 0 {
					continue
				}
				// Silent past the timeout: dead. Silent for a few beats
				// while the group stops: frozen, and a SIGTERM would only
				// wait for the grace period.
				if s := p.hb.silentFor(now); s > c.HeartbeatTimeout || (kill != nil && s > frozen) {
					p.silent = s
					killProcess(p.cmd)
					p.sent = append(p.sent, sigKill.String())
					host, _ := os.Hostname()
					fmt.Fprintf(c.Stderr, "gotron launch: worker rank %d (host %s, pid %d) sent no heartbeat for %v; killed it\n",
						p.env.Rank, host, p.cmd.Process.Pid, s.Round(100*time.Millisecond))
					if stopped == nil && kill == nil {
						startStop(sigTerm)
					}
				}
			}
		case sig := <-c.Signals:
			if stopped == nil {
				stopped = fmt.Errorf("%w by signal %v", ErrInterrupted, sig)
			}
			startStop(sig)
		case <-done:
			done = nil
			sig := os.Signal(sigTerm)
			select { // a signal that also cancelled ctx is forwarded as itself
			case s := <-c.Signals:
				sig = s
			default:
			}
			if stopped == nil {
				stopped = fmt.Errorf("%w (%v): stopped the workers with %v", ErrInterrupted, context.Cause(ctx), sig)
			}
			startStop(sig)
		case <-kill:
			for _, p := range procs {
				if !p.done {
					killProcess(p.cmd)
					p.sent = append(p.sent, sigKill.String())
				}
			}
		}
	}
	if stopped != nil {
		return false, stopped
	}
	blamedBy := map[int]int{}
	for _, f := range failures {
		if f.Blaming && f.Blamed != f.Rank {
			blamedBy[f.Blamed]++
		}
	}
	if root := rootCause(failures, blamedBy); root != nil {
		return true, root
	}
	return false, nil
}

// stop kills the n workers already started after a start failure and waits
// for them.
func (c Config) stop(procs []*proc, exits chan exit, n int) {
	for _, p := range procs {
		killProcess(p.cmd)
	}
	for range n {
		<-exits
	}
}

func workerError(p *proc, err error) *WorkerError {
	we := &WorkerError{Rank: p.env.Rank, LocalRank: p.env.LocalRank, ExitCode: -1, Err: err, Silent: p.silent}
	if host, herr := os.Hostname(); herr == nil {
		we.Host = host
	}
	if p.hb != nil {
		if b := p.hb.blame(); b >= 0 && b != p.env.Rank {
			we.Blaming, we.Blamed = true, b
		}
	}
	if p.cmd.Process != nil {
		we.PID = p.cmd.Process.Pid
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		we.ExitCode = ee.ExitCode()
		we.Signal = exitSignal(ee)
	}
	// A signal the launcher sent, or an exit after one, was the launcher's
	// doing; a signal it did not send (kill -9 from outside) was not, even
	// if the launcher had meanwhile asked the worker to stop.
	if we.Signal != "" {
		we.Stopped = slices.Contains(p.sent, we.Signal)
	} else {
		we.Stopped = len(p.sent) > 0
	}
	return we
}

// mergeEnv returns base with the variables of over replacing any of the same
// name.
func mergeEnv(base, over []string) []string {
	set := map[string]bool{}
	for _, kv := range over {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}
	out := make([]string, 0, len(base)+len(over))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if !set[k] {
			out = append(out, kv)
		}
	}
	return append(out, over...)
}
